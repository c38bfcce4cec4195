#!/usr/bin/env bash
# The one prepared check for a machine with an NVIDIA GPU (sized for < 8 min
# on an H200, 16 cores). Run from anywhere:  bash tests/gpu/device_check.sh
#
#  1. builds for the local GPU only (-DLLM_CUDA_ARCHS=native) the targets it needs,
#  2. runs the GPU tests (ctest -L cuda), the Backend contract on the device
#     (tests/engine/backend_contract_test.cpp), every model family's tiny
#     model against llama.cpp's logits on the device (tests/model/family_test.cpp)
#     and the CPU-side CUDA tests,
#  3. benchmarks synthetic tinyllama-1.1b and llama-3-8b in q4 / q8 / f16, and
#     tinyllama-1.1b in llama.cpp's Q4_K_M mix of K-quant blocks (made by
#     llm-convert --synthetic): pp512, tg128 at batch 1 / 8 / 32; each
#     TinyLlama-shape file is first checked against the CPU's exact math
#     through the backend directly (llm_gpu_bench), and, when llm-bench is
#     built and the public API runs on CUDA, llm-bench --device cuda,
#  4. prints one summary table.
# Each step has a time limit and the whole run a deadline (LLM_CHECK_BUDGET_S,
# default 450 s of work after which remaining benchmarks are reported as
# skipped), so the script always reaches the summary.
#
# Prebuilt mode (LLM_CHECK_PREBUILT=1): LLM_BUILD_DIR holds bin/ and lib/
# made elsewhere by tests/gpu/pack_prebuilt.sh (the device machine then needs
# no compiler and none of the build's dependencies); step 1 only checks that
# every binary finds its libraries.
#
# Environment: LLM_BUILD_DIR (default <repo>/build-device), LLM_BENCH_MODELS
# (default /tmp/llm-device-models; model files are deleted after use),
# JOBS (default nproc), LLM_CHECK_BUDGET_S, LLM_CUDA_ARCHS (default native),
# LLM_CHECK_SHAPES (default "tinyllama-1.1b llama-3-8b"; "stories260K-shape"
# gives a quick dry run of the whole flow).
set -u
set -o pipefail

START=$(date +%s)
BUDGET=${LLM_CHECK_BUDGET_S:-450}
DEADLINE=$((START + BUDGET))
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${LLM_BUILD_DIR:-$ROOT/build-device}
MODELS=${LLM_BENCH_MODELS:-/tmp/llm-device-models}
JOBS=${JOBS:-$(nproc)}
ARCHS=${LLM_CUDA_ARCHS:-native}
read -r -a SHAPES <<<"${LLM_CHECK_SHAPES:-tinyllama-1.1b llama-3-8b}"
LOG=$BUILD/device-check
mkdir -p "$LOG" "$MODELS"

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE - $(date +%s) )); }
say() { printf '[%4ss] %s\n' "$(elapsed)" "$*"; }

SUMMARY=()
add() { SUMMARY+=("$*"); }

say "libllm device check: repo $ROOT, build $BUILD"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/  gpu: /'
else
  say "nvidia-smi not found"
fi

# ---------------------------------------------------------------- 1. build
HAVE_LLM_BENCH=0
if [[ ${LLM_CHECK_PREBUILT:-0} == 1 ]]; then
  say "prebuilt binaries in $BUILD/bin"
  missing=$(for b in "$BUILD"/bin/*; do ldd "$b" 2>&1 | grep "not found" | sed "s|^|$(basename "$b"): |"; done)
  if [[ -n $missing ]]; then
    echo "$missing" | sort -u | head -20
    say "FAILED: prebuilt binaries miss libraries (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
    exit 1
  fi
  [[ -x $BUILD/bin/llm-bench ]] && HAVE_LLM_BENCH=1
  add "build: prebuilt ($BUILD)"
else
  say "configure (CUDA archs: $ARCHS)"
  if ! timeout 120 cmake -S "$ROOT" -B "$BUILD" -DLLM_CUDA=ON -DLLM_CUDA_ARCHS="$ARCHS" -DCMAKE_BUILD_TYPE=Release \
      -DLLM_BUILD_BENCH=OFF -DLLM_BUILD_SAMPLES=OFF >"$LOG/configure.log" 2>&1; then
    tail -20 "$LOG/configure.log"
    say "FAILED: configure (log: $LOG/configure.log)"
    exit 1
  fi
  TARGETS=(llm_gpu_tests llm_gpu_cpu_tests llm_gpu_bench llm-convert llm_engine_tests llm_model_tests)
  if [[ -f $ROOT/src/cli/llm-bench.cpp ]]; then TARGETS+=(llm-bench); HAVE_LLM_BENCH=1; fi
  say "build ${TARGETS[*]} with $JOBS jobs"
  if ! timeout 300 cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$LOG/build.log" 2>&1; then
    grep -E "error|Error" "$LOG/build.log" | head -30
    say "FAILED: build (log: $LOG/build.log)"
    exit 1
  fi
  add "build: OK ($(elapsed) s, CUDA archs $ARCHS)"
fi
mkdir -p "$BUILD/test-tmp"

# ---------------------------------------------------------------- 2. tests
# Every test in its own process, 4 at a time: a kernel fault leaves the CUDA
# context unusable, and in one process every later test would fail with it.
# The first failures of the CUDA suite run again under compute-sanitizer
# (memcheck) where the machine has it.
run_each() {
  local name=$1 bin=$2 filter=$3 dir="$LOG/$1"
  mkdir -p "$dir"
  "$bin" --gtest_list_tests --gtest_filter="$filter" 2>/dev/null |
    awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' >"$dir/list"
  # shellcheck disable=SC2016
  xargs -P 4 -I{} bash -c 'timeout 180 "$0" --gtest_filter="$1" >"$2/$(echo "$1" | tr "/" "_").log" 2>&1; echo "$? $1"' \
    "$bin" {} "$dir" <"$dir/list" >"$dir/results"
  local pass=0 skip=0 fail=0 failed=()
  while read -r rc t; do
    if [[ $rc -ne 0 ]]; then fail=$((fail + 1)); failed+=("$t (rc $rc)")
    elif grep -q "\[  SKIPPED \]" "$dir/$(echo "$t" | tr "/" "_").log"; then skip=$((skip + 1))
    else pass=$((pass + 1)); fi
  done <"$dir/results"
  add "$name: $pass passed, $fail failed, $skip skipped of $(wc -l <"$dir/list") (logs: $dir)"
  for f in "${failed[@]}"; do add "  FAILED $f"; done
  printf '%s\n' "${failed[@]}" | sed 's/ (rc .*//' | grep -v '^$' >"$dir/failed" || true
}
say "GPU tests (llm_gpu_tests, one process per test)"
run_each cuda-tests "$BUILD/bin/llm_gpu_tests" '*'
if command -v compute-sanitizer >/dev/null 2>&1 && [[ -s $LOG/cuda-tests/failed ]]; then
  say "failed CUDA tests again under compute-sanitizer (memcheck)"
  head -3 "$LOG/cuda-tests/failed" | xargs -P 3 -I{} bash -c \
    'timeout 150 compute-sanitizer --tool memcheck --print-limit 10 "$0" --gtest_filter="$1" >"$2/sanitize-$(echo "$1" | tr "/" "_").log" 2>&1' \
    "$BUILD/bin/llm_gpu_tests" {} "$LOG/cuda-tests"
  add "compute-sanitizer: $(cat "$LOG"/cuda-tests/sanitize-*.log 2>/dev/null | grep -cE "Invalid|out of bounds|misaligned") reports (logs: $LOG/cuda-tests/sanitize-*)"
fi
say "Backend contract on the device (llm_engine_tests Backends/*cuda*)"
run_each contract "$BUILD/bin/llm_engine_tests" 'Backends/BackendContract.*cuda*'
say "model families on the device (llm_model_tests LlamaCpp/FamilyOn.*_Cuda: llama.cpp's logits, eviction)"
run_each families "$BUILD/bin/llm_model_tests" 'LlamaCpp/FamilyOn.*_Cuda'
say "CPU-side CUDA tests"
timeout 60 "$BUILD/bin/llm_gpu_cpu_tests" --gtest_brief=1 >"$LOG/cpu-tests.log" 2>&1
add "cpu-side cuda tests: $(grep -E "PASSED|FAILED" "$LOG/cpu-tests.log" | head -2 | tr '\n' ' ')"

# ---------------------------------------------------------------- 3. benchmarks
BENCH_ROWS=()
API_ROWS=()
run_model() {
  local shape=$1 quant=$2 est_s=$3
  local name="$shape $quant" file="$MODELS/$shape-$quant.llm"
  if (( $(left) < est_s )); then
    BENCH_ROWS+=("| $name | skipped: $(left) s left, needs ~$est_s s |")
    return
  fi
  say "convert $name"
  if ! timeout $(( $(left) > 30 ? $(left) : 30 )) "$BUILD/bin/llm-convert" --synthetic "$shape" --quant "$quant" \
      --no-zstd -o "$file" >"$LOG/convert-$shape-$quant.log" 2>&1; then
    BENCH_ROWS+=("| $name | llm-convert failed: $(tail -1 "$LOG/convert-$shape-$quant.log") |")
    rm -f "$file"
    return
  fi
  if [[ $shape != llama-3-8b ]] && (( $(left) > 60 )); then
    say "check $name against the CPU's exact math (CudaBackend.ModelFromTheEnvironment...)"
    LLM_GPU_CHECK_MODEL="$file" timeout 90 "$BUILD/bin/llm_gpu_tests" \
      --gtest_filter='CudaBackend.ModelFromTheEnvironmentMatchesTheCpuOnItsWeights' >"$LOG/check-$shape-$quant.log" 2>&1
    add "$name on the device against the CPU: $(grep -E "device against CPU|PASSED|FAILED|SKIPPED" "$LOG/check-$shape-$quant.log" | head -2 | tr '\n' ' ')"
  fi
  say "bench $name (backend, batch 1/8/32)"
  local row
  row=$(timeout 150 "$BUILD/bin/llm_gpu_bench" "$file" --name "$name" --pp 512 --tg 128 --batch 1,8,32 --reps 3 \
        2>"$LOG/bench-$shape-$quant.err")
  [[ -z $row ]] && row="| $name | llm_gpu_bench failed: $(tail -1 "$LOG/bench-$shape-$quant.err") |"
  BENCH_ROWS+=("$row")
  if [[ $HAVE_LLM_BENCH -eq 1 && -x $BUILD/bin/llm-bench ]] && (( $(left) > 40 )); then
    say "llm-bench $name (public API, --device cuda)"
    if timeout 120 "$BUILD/bin/llm-bench" -m "$file" --device cuda -p 512 -n 128 -r 3 --bw-mib 0 \
        >"$LOG/llm-bench-$shape-$quant.md" 2>"$LOG/llm-bench-$shape-$quant.err"; then
      while IFS= read -r l; do API_ROWS+=("$l"); done < <(grep -E "^\|" "$LOG/llm-bench-$shape-$quant.md" | grep -vE "^\|[- |]*$" | tail -n +2)
    else
      API_ROWS+=("| $name | llm-bench --device cuda failed: $(tail -1 "$LOG/llm-bench-$shape-$quant.err") |")
    fi
  fi
  rm -f "$file"
}
# Rough per-run costs on an H200 host (convert + load/upload + bench); the
# largest last, so a slow disk costs llama-3-8b f16 first.
for shape in "${SHAPES[@]}"; do
  est=40
  [[ $shape == llama-3-8b ]] && est=120
  quants=(q4 q8 f16)
  # GGUF K-quant blocks as stored (llama.cpp's Q4_K_M mix: q4_K, q6_K for the
  # output and half the attn_v / ffn_down), on the smaller shape only.
  [[ $shape != llama-3-8b ]] && quants+=(q4_K_M)
  for q in "${quants[@]}"; do run_model "$shape" "$q" "$est"; done
done

# ---------------------------------------------------------------- 4. summary
echo
echo "==================== libllm device check summary ($(elapsed) s) ===================="
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/GPU: /'
for s in "${SUMMARY[@]}"; do echo "- $s"; done
echo
echo "CUDA backend (llm_gpu_bench: pp = one prefill, best of 3; tg = batched decode steps, graphs on, greedy on device)"
printf '| model | weights GiB | load+upload s | pp512 t/s | tg128 b1 t/s (ms/step) | tg128 b8 t/s (ms/step) | tg128 b32 t/s (ms/step) | b1 weight GB/s |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for r in "${BENCH_ROWS[@]}"; do echo "$r"; done
if [[ $HAVE_LLM_BENCH -eq 1 ]]; then
  echo
  echo "Public API (llm-bench --device cuda -p 512 -n 128 -r 3):"
  if [[ ${#API_ROWS[@]} -eq 0 ]]; then echo "(no rows)"; fi
  for r in "${API_ROWS[@]}"; do echo "$r"; done
else
  echo "llm-bench is not in this checkout: public-API numbers skipped"
fi
echo "logs: $LOG"
