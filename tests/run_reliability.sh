#!/usr/bin/env bash
# Reliability checks of libllm (docs/RELIABILITY.md):
#   1. ASan + UBSan build (GCC, -DLLM_SANITIZE=address) running the test suites
#      (LeakSanitizer on: any leak fails);
#   2. TSan build (-DLLM_SANITIZE=thread) running the concurrency tests;
#   3. libFuzzer build (clang, -DLLM_FUZZ=ON) running every fuzz target for a
#      fixed time, then a summary table: executions, coverage (cov: edges),
#      corpus size and crashes per target.
#
# Usage: tests/run_reliability.sh [--quick|--long] [--only asan|tsan|fuzz]...
#   --quick  (default) CI budget: 20 s per fuzz target, two at a time.
#   --long   10 minutes per fuzz target (about 45 min on 2 cores), for a
#            release or after parser changes.
# Environment:
#   JOBS            build/test parallelism (default: nproc)
#   FUZZ_SECONDS    seconds per fuzz target (overrides the mode's budget)
#   FUZZ_PARALLEL   fuzz targets run at once (default: JOBS)
#   ASAN_DIR, TSAN_DIR, FUZZ_DIR   build folders (default build-asan, build-tsan, build-fuzz)
#   ASAN_TESTS      ctest -R regex of what the ASan build runs (default: all suites)
#   ASAN_EXCLUDE    ctest -E regex of tests the ASan build skips (default: QuantQuality.Q4MDistilledReaches95,
#                   5 minutes under ASan for a figure the Release run checks; the pass it runs is
#                   covered under ASan by Distill.* and tools.convert_cli; and the long Gemma 3
#                   runs (8192 tokens, 700-900-token prompts, f32 math), whose code the tiny
#                   family models and Gemma3.SharedReferenceCases run under ASan; and
#                   MaskEquality.GemmaVocabulary, brute-force masks over 262,144 tokens, whose
#                   code the random-vocabulary MaskEquality cases run under ASan)
#   CC_FUZZ, CXX_FUZZ  clang for the fuzz build (default clang, clang++)
# Exit status: 0 if every phase passed and no fuzz target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

mode=quick
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --long) mode=long ;;
    --only) phases+=("$2"); shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ ${#phases[@]} -gt 0 ] || phases=(asan tsan fuzz)

JOBS=${JOBS:-$(nproc)}
ASAN_DIR=${ASAN_DIR:-build-asan}
TSAN_DIR=${TSAN_DIR:-build-tsan}
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
if [ "$mode" = long ]; then default_seconds=600; else default_seconds=20; fi
FUZZ_SECONDS=${FUZZ_SECONDS:-$default_seconds}
FUZZ_PARALLEL=${FUZZ_PARALLEL:-$JOBS}
# ctest -R / -E regexes for the ASan run (default: every suite that is built).
ASAN_TESTS=${ASAN_TESTS:-}
ASAN_EXCLUDE=${ASAN_EXCLUDE:-'^QuantQuality\.Q4MDistilledReaches95$|^Gemma3\.(LongContext|ExactMath|RepositoryPrompts)|^MaskEquality\.GemmaVocabulary$'}

common_cmake=(-DLLM_CUDA=OFF -DLLM_BUILD_BENCH=OFF -DLLM_BUILD_SAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
# Ninja when available, for a fresh build folder (an existing one keeps its generator).
generator() { if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null; then echo "-GNinja"; fi; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

status=0
summary=()
fuzz_rows=()
t_start=$(date +%s)
phase_time() { echo $(( $(date +%s) - $1 ))s; }
have() { for p in "${phases[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

# ---------------------------------------------------------------- 1. ASan + UBSan
if have asan; then
  t0=$(date +%s)
  echo "=== ASan+UBSan build ($ASAN_DIR)"
  cmake -S . -B "$ASAN_DIR" $(generator "$ASAN_DIR") "${common_cmake[@]}" -DLLM_SANITIZE=address >/dev/null
  # The test binaries and what ctest needs (llm-convert and llm-run for
  # tools.convert_cli); not the other tools or the bindings.
  targets=(llm_unit_tests llm_ops_tests llm_format_tests llm_tokenizer_tests llm_quant_tests llm_kv_tests
           llm_engine_tests llm_chat_tests llm_grammar_tests llm_e2e_tests llm_fuzz_replay_tests llm_fuzz_make_seeds llm_abi_runtime llm_no_output_test
           llm-convert llm-run)
  available=$(cmake --build "$ASAN_DIR" --target help 2>/dev/null | sed -n 's/^\([A-Za-z0-9_-]*\): .*/\1/p')
  existing=()
  for t in "${targets[@]}"; do
    if grep -qx "$t" <<<"$available"; then existing+=(--target "$t"); fi
  done
  cmake --build "$ASAN_DIR" -j "$JOBS" "${existing[@]}"
  # Tests of targets not built here (abi.symbols/layout/exports, packaging,
  # benchmarks, GPU, llm-server) are skipped, as are the slow suites (ASAN_EXCLUDE).
  ctest_args=(--test-dir "$ASAN_DIR" --output-on-failure -j "$JOBS" --timeout 900
              -E "_NOT_BUILT|^abi\.(symbols|layout|exports)|^packaging|^bench|^gpu|^server|${ASAN_EXCLUDE}")
  [ -n "$ASAN_TESTS" ] && ctest_args+=(-R "$ASAN_TESTS")
  if ctest "${ctest_args[@]}" > "$ASAN_DIR/ctest.log" 2>&1; then
    summary+=("asan+ubsan  PASS  $(grep -Eo '[0-9]+ tests passed|[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$ASAN_DIR/ctest.log" | tail -1)  $(phase_time $t0)")
  else
    status=1
    tail -60 "$ASAN_DIR/ctest.log"
    summary+=("asan+ubsan  FAIL  $(grep -Eo '[0-9]+% tests passed.*' "$ASAN_DIR/ctest.log" | tail -1) (log: $ASAN_DIR/ctest.log)  $(phase_time $t0)")
  fi
fi

# ---------------------------------------------------------------- 2. TSan
if have tsan; then
  t0=$(date +%s)
  echo "=== TSan build ($TSAN_DIR)"
  cmake -S . -B "$TSAN_DIR" $(generator "$TSAN_DIR") "${common_cmake[@]}" -DLLM_SANITIZE=thread >/dev/null
  cmake --build "$TSAN_DIR" -j "$JOBS" --target llm_engine_tests llm_unit_tests
  tsan_log="$TSAN_DIR/tsan.log"
  if (cd "$TSAN_DIR" && ./bin/llm_engine_tests --gtest_filter='Concurrency.*:ThreadPoolFailure.*' &&
      ./bin/llm_unit_tests --gtest_filter='*ThreadPool*') > "$tsan_log" 2>&1; then
    summary+=("tsan        PASS  $(grep -c '^\[       OK \]' "$tsan_log") concurrency tests  $(phase_time $t0)")
  else
    status=1
    tail -60 "$tsan_log"
    summary+=("tsan        FAIL  (log: $tsan_log)  $(phase_time $t0)")
  fi
fi

# ---------------------------------------------------------------- 3. fuzzing
if have fuzz; then
  t0=$(date +%s)
  echo "=== libFuzzer build ($FUZZ_DIR), ${FUZZ_SECONDS}s per target, $FUZZ_PARALLEL at a time"
  cmake -S . -B "$FUZZ_DIR" $(generator "$FUZZ_DIR") "${common_cmake[@]}" -DLLM_FUZZ=ON \
        -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" >/dev/null
  cmake --build "$FUZZ_DIR" -j "$JOBS" --target llm_fuzzers
  "$FUZZ_DIR/bin/llm_fuzz_make_seeds" "$FUZZ_DIR/fuzz-seeds" >/dev/null
  # Every libFuzzer binary the build made (tests/fuzz/CMakeLists.txt: LLM_FUZZ_TARGET_NAMES).
  targets=$(cd "$FUZZ_DIR/bin" && ls llm_fuzz_* | grep -v -e make_seeds -e replay | sed 's/^llm_fuzz_//')
  mkdir -p "$FUZZ_DIR/fuzz-logs" "$FUZZ_DIR/fuzz-artifacts"
  run_one() {
    local t=$1 dict=()
    case "$t" in
      tokenize_*|llama2c_tokenizer) dict=(-dict="$root/tests/fuzz/tokenize.dict") ;;
      gguf) dict=(-dict="$root/tests/fuzz/gguf.dict") ;;
    esac
    mkdir -p "$FUZZ_DIR/fuzz-corpus/$t" "$FUZZ_DIR/fuzz-seeds/$t"
    # Committed inputs (tests/fuzz/regressions/<target>/) seed the run too.
    local regress=()
    [ -d "$root/tests/fuzz/regressions/$t" ] && regress=("$root/tests/fuzz/regressions/$t")
    # Leak checking per input is on (libFuzzer's default with ASan). -timeout
    # makes a hang a crash; -rss_limit_mb and -malloc_limit_mb make an
    # unbounded allocation one.
    "$FUZZ_DIR/bin/llm_fuzz_$t" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -timeout=30 \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$FUZZ_DIR/fuzz-artifacts/$t-" "${dict[@]}" \
      "$FUZZ_DIR/fuzz-corpus/$t" "$FUZZ_DIR/fuzz-seeds/$t" "${regress[@]}" > "$FUZZ_DIR/fuzz-logs/$t.log" 2>&1
    echo $? > "$FUZZ_DIR/fuzz-logs/$t.rc"
  }
  export -f run_one
  export FUZZ_DIR FUZZ_SECONDS root
  rm -f "$FUZZ_DIR"/fuzz-logs/*.rc
  echo "$targets" | xargs -P "$FUZZ_PARALLEL" -I{} bash -c 'run_one {}'
  crashes_total=0
  for t in $targets; do
    log="$FUZZ_DIR/fuzz-logs/$t.log"
    rc=$(cat "$FUZZ_DIR/fuzz-logs/$t.rc" 2>/dev/null || echo 99)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    # The last status line ("#N ... cov: E ft: F corp: C/...") has the final coverage.
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    corp=$(grep -Eo 'corp: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    crashes=$(ls "$FUZZ_DIR/fuzz-artifacts/" 2>/dev/null | grep -c "^$t-" || true)
    [ "$rc" = 0 ] || crashes=$(( crashes > 0 ? crashes : 1 ))
    crashes_total=$(( crashes_total + crashes ))
    fuzz_rows+=("$(printf '%-20s %10s %8s %8s %8s %8s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${corp:-?}" "$crashes")")
    if [ "$crashes" != 0 ]; then
      echo "--- $t crashed (log: $log):"; grep -E 'ERROR|SUMMARY|invariant|Test unit written' "$log" | head -8
    fi
  done
  if [ "$crashes_total" = 0 ]; then
    summary+=("fuzz        PASS  $(echo "$targets" | wc -w) targets x ${FUZZ_SECONDS}s, no crash  $(phase_time $t0)")
  else
    status=1
    summary+=("fuzz        FAIL  $crashes_total crash(es), inputs in $FUZZ_DIR/fuzz-artifacts  $(phase_time $t0)")
  fi
fi

# ---------------------------------------------------------------- summary
echo
echo "=== reliability summary ($mode, ${FUZZ_SECONDS}s per fuzz target, $(( $(date +%s) - t_start ))s in all)"
for s in "${summary[@]}"; do echo "  $s"; done
if [ ${#fuzz_rows[@]} -gt 0 ]; then
  echo
  printf '  %-20s %10s %8s %8s %8s %8s\n' target execs exec/s "cov" corpus crashes
  for r in "${fuzz_rows[@]}"; do echo "  $r"; done
  echo "  (cov = libFuzzer's 'cov:' edge count; corpus kept in $FUZZ_DIR/fuzz-corpus)"
fi
exit $status
