#!/usr/bin/env bash
# Side-by-side CPU speed of libllm (llm-bench) and llama.cpp (llama-bench,
# llama-batched-bench) on the very same GGUF files: random weights with
# TinyLlama-1.1B's shape in F16, and Q8_0 / Q4_0 made from it by llama.cpp's
# own llama-quantize --pure (every matrix, output included, in that format;
# libllm reads these natively). Nothing of llama.cpp is kept in this repo: it
# is built out of tree from a checkout you give.
#
# usage: tests/bench/compare_llamacpp.sh LLAMACPP_SRC [LLM_BUILD_DIR]
#
#   LLAMACPP_SRC   a llama.cpp checkout (the first baseline was b4747; the
#                  current one is vendor/llama.cpp of the PyPI source package
#                  llama-cpp-python 0.3.36)
#   LLM_BUILD_DIR  libllm build with bin/llm-bench (default: build)
#
# Environment (defaults in brackets):
#   MODELS_DIR [/tmp/llm-bench-models]  where the GGUF files are made/kept
#   PYTHON [python3]        a Python with the gguf and numpy packages (model
#                           generation only; the summary needs only the stdlib)
#   LC_BUILDS ["native"]    llama.cpp builds to compare, from: native
#                           (-DGGML_NATIVE=ON, as the baseline) and avx2
#                           (-DGGML_NATIVE=OFF, AVX2/FMA/F16C only: the ISA
#                           libllm's kernels use); built in LLAMACPP_SRC/build-NAME
#   OURS_ISAS ["best"]      libllm kernel families to run: best (what the CPU
#                           has) and/or avx2 (LLM_CPU_ISA=avx2: the AVX2
#                           kernels only, the fair match for the avx2 build)
#   THREADS ["1 2"]         thread counts
#   QUANTS ["q4_0 q8_0 f16"]  also: q4_k_m q5_k_m q6_k iq4_xs (any llama-quantize type, lower case)
#   TESTS ["pp512 tg128"]   subset of pp512 / tg128
#   REPS [3]                repetitions inside each tool run
#   ROUNDS [2]              alternating rounds (ours first in odd rounds)
#   ROUND_START [1]         number of the first round: with the same OUT, a
#                           later call adds rounds (e.g. for figures that had
#                           no quiet run); the summary covers every round
#   DEPTH [2048]            context for the long-context decode test (0 = skip)
#   DEPTH_QUANT [q4_0]      model of the long-context test
#   QUIET_BUSY [30]         wait before each run until the CPUs were at most
#   QUIET_MAX_WAIT [300]    this % busy over 3 s, waiting at most this many s
#   FOREIGN_MAX [0.25]      runs during which other processes used more CPU
#                           than this (cores) are left out of a figure when
#                           it has a cleaner run (see runs.tsv)
#   NICE [0]                nice level of every benchmark run (both engines);
#                           e.g. -10 (as root) on a machine shared with builds
#   OUT [./compare-out]     raw JSON/logs, runs.tsv / runs.log (load per run), summary.md
#   SKIP_BUILD [0]          1 = use the llama.cpp builds already there
#   JOBS [2]                build parallelism
#
# Tests: pp512 and tg128 as llama-bench runs them by default (flash attention
# off, mmap on, n_batch 2048, n_ubatch 512, one warm-up run, KV f16), per
# quant and thread count; then tg128 after a DEPTH-token prompt: libllm with
# f16 and int8 KV, llama.cpp (llama-batched-bench -npp DEPTH -ntg 128 -npl 1,
# its S_TG) with f16 KV, and with q8_0 K/V + flash attention (needed for a
# quantized V cache). The summary gives medians over all samples.
set -euo pipefail

if [[ $# -lt 1 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,49p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
LLAMACPP_SRC=$(cd "$1" && pwd)
LLM_BUILD=$(cd "${2:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS_DIR=${MODELS_DIR:-/tmp/llm-bench-models}
PYTHON=${PYTHON:-python3}
LC_BUILDS=${LC_BUILDS:-native}
OURS_ISAS=${OURS_ISAS:-best}
THREADS=${THREADS:-"1 2"}
QUANTS=${QUANTS:-"q4_0 q8_0 f16"}
TESTS=${TESTS:-"pp512 tg128"}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-2}
ROUND_START=${ROUND_START:-1}
DEPTH=${DEPTH:-2048}
DEPTH_QUANT=${DEPTH_QUANT:-q4_0}
QUIET_BUSY=${QUIET_BUSY:-30}
QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-300}
FOREIGN_MAX=${FOREIGN_MAX:-0.25}
NICE=${NICE:-0}
OUT=${OUT:-$PWD/compare-out}
SKIP_BUILD=${SKIP_BUILD:-0}
JOBS=${JOBS:-2}

LLM_BENCH=$LLM_BUILD/bin/llm-bench
[[ -x $LLM_BENCH ]] || { echo "no $LLM_BENCH (build the llm-bench target)" >&2; exit 1; }
mkdir -p "$MODELS_DIR" "$OUT"
RUNLOG=$OUT/runs.log

P=0; N=0
for t in $TESTS; do
  case $t in
    pp*) P=${t#pp} ;;
    tg*) N=${t#tg} ;;
    *) echo "unknown test $t" >&2; exit 2 ;;
  esac
done

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$RUNLOG" >&2; }

# Percentage of CPU time not idle over the next $1 seconds, all CPUs.
cpu_busy() {
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep "$1"
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local total=0 idle i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $(( total > 0 ? 100 * (total - idle) / total : 0 ))
}

# Waits until the machine is quiet (or QUIET_MAX_WAIT passed); logs the level.
BUSY=0
wait_quiet() {
  local start=$SECONDS
  BUSY=$(cpu_busy 3)
  while (( BUSY > QUIET_BUSY && SECONDS - start < QUIET_MAX_WAIT )); do
    sleep 7
    BUSY=$(cpu_busy 3)
  done
}

busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
HZ=$(getconf CLK_TCK)

# Runs one benchmark (stdout to $OUT/$label.json) and records in runs.tsv the
# CPU time that other processes used meanwhile ("foreign" cores: all busy
# time minus the benchmark's own user+sys, over its wall time).
run() {  # label, then the command
  local label=$1; shift
  wait_quiet
  local j0 j1; j0=$(busy_jiffies)
  /usr/bin/time -o "$OUT/$label.time" -f "%e %U %S" nice -n "$NICE" "$@" >"$OUT/$label.json" 2>"$OUT/$label.log" ||
    log "FAILED: $label (see $OUT/$label.log)"
  j1=$(busy_jiffies)
  local foreign
  foreign=$(awk -v j="$((j1 - j0))" -v hz="$HZ" '{f = (j / hz - $2 - $3) / $1; if (f < 0) f = 0; printf "%.2f", f}' \
    "$OUT/$label.time")
  printf "%s\t%s\t%s\t%s\n" "$label" "$BUSY" "$foreign" "$(cut -d' ' -f1 "$OUT/$label.time")" >>"$OUT/runs.tsv"
  log "$label: busy before ${BUSY}%, foreign load during run ${foreign} cores, $(cut -d' ' -f1 "$OUT/$label.time") s"
}

# ---- 1. llama.cpp, CPU Release
lc_bin() { echo "$LLAMACPP_SRC/build-$1/bin"; }
for b in $LC_BUILDS; do
  case $b in
    native) flags=(-DGGML_NATIVE=ON) ;;
    avx2) flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) ;;
    *) echo "unknown llama.cpp build '$b' (native, avx2)" >&2; exit 2 ;;
  esac
  if [[ $SKIP_BUILD != 1 ]]; then
    log "building llama.cpp ($b) in $LLAMACPP_SRC/build-$b"
    cmake -S "$LLAMACPP_SRC" -B "$LLAMACPP_SRC/build-$b" "${flags[@]}" -DLLAMA_CURL=OFF \
      -DCMAKE_BUILD_TYPE=Release >"$OUT/llamacpp-$b-cmake.log"
    cmake --build "$LLAMACPP_SRC/build-$b" -j"$JOBS" --target llama-bench llama-quantize llama-batched-bench \
      >"$OUT/llamacpp-$b-build.log"
  fi
done
(cd "$LLAMACPP_SRC" && git rev-parse HEAD 2>/dev/null || echo unknown) >"$OUT/llamacpp-commit.txt"
FIRST_LC=$(lc_bin "${LC_BUILDS%% *}")

# ---- 2. the models
F16=$MODELS_DIR/tl-f16.gguf
if [[ ! -s $F16 ]]; then
  log "writing $F16"
  "$PYTHON" "$HERE/make_synthetic_gguf.py" -o "$F16"
fi
# Q8_0 / Q4_0 with --pure (every matrix in that type); K-quant and IQ4 mixes
# (q4_k_m, q5_k_m, q6_k, iq4_xs, ...) as llama-quantize makes them by default.
for q in q8_0 q4_0 $QUANTS $DEPTH_QUANT; do
  [[ $q == f16 || -s $MODELS_DIR/tl-$q.gguf ]] && continue
  pure=()
  [[ $q == q8_0 || $q == q4_0 ]] && pure=(--pure)
  log "quantizing $q ${pure[*]}"
  "$FIRST_LC/llama-quantize" "${pure[@]}" "$F16" "$MODELS_DIR/tl-$q.gguf" "${q^^}" 2 >"$OUT/quantize-$q.log" 2>&1
done
model() { echo "$MODELS_DIR/tl-$1.gguf"; }

# ---- 3. pp / tg, alternating ours and theirs
ours() {  # quant threads round
  local isa
  for isa in $OURS_ISAS; do
    case $isa in
      best) run "ours-$1-t$2-r$3" "$LLM_BENCH" -m "$(model "$1")" -t "$2" -p "$P" -n "$N" -r "$REPS" --device cpu --json ;;
      *) run "ours.$isa-$1-t$2-r$3" env LLM_CPU_ISA="$isa" "$LLM_BENCH" -m "$(model "$1")" -t "$2" -p "$P" -n "$N" \
           -r "$REPS" --device cpu --json ;;
    esac
  done
}
theirs() {  # quant threads round
  local b
  for b in $LC_BUILDS; do
    run "theirs.$b-$1-t$2-r$3" "$(lc_bin "$b")/llama-bench" -m "$(model "$1")" -t "$2" -p "$P" -n "$N" -r "$REPS" -o json
  done
}
for r in $(seq "$ROUND_START" $((ROUND_START + ROUNDS - 1))); do
  for q in $QUANTS; do
    for t in $THREADS; do
      if (( r % 2 )); then
        ours "$q" "$t" "$r"; theirs "$q" "$t" "$r"
      else
        theirs "$q" "$t" "$r"; ours "$q" "$t" "$r"
      fi
    done
  done
done

# ---- 4. long-context decode
if (( DEPTH > 0 )); then
  m=$(model "$DEPTH_QUANT")
  ctx=$((DEPTH + 256))
  for r in $(seq "$ROUND_START" $((ROUND_START + ROUNDS - 1))); do
    for t in $THREADS; do
      run "ours-depth-t$t-r$r" "$LLM_BENCH" -m "$m" -t "$t" -p 0 -n 128 --depth "$DEPTH" --kv f16,int8 -r 1 \
        --warmup 0 --device cpu --json
      for b in $LC_BUILDS; do
        lcb=$(lc_bin "$b")
        run "theirs.$b-depth-f16-t$t-r$r" "$lcb/llama-batched-bench" -m "$m" -t "$t" -c "$ctx" -b 2048 -ub 512 \
          -npp "$DEPTH" -ntg 128 -npl 1 --output-format jsonl
        run "theirs.$b-depth-q8fa-t$t-r$r" "$lcb/llama-batched-bench" -m "$m" -t "$t" -c "$ctx" -b 2048 -ub 512 \
          -npp "$DEPTH" -ntg 128 -npl 1 -fa -ctk q8_0 -ctv q8_0 --output-format jsonl
      done
    done
  done
fi

# ---- 5. summary (medians over every sample of every round)
"$PYTHON" - "$OUT" "$DEPTH" "$DEPTH_QUANT" "$LC_BUILDS" "$FOREIGN_MAX" >"$OUT/summary.md" <<'EOF'
import glob, json, os, re, statistics, sys
out, depth, depth_quant, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
foreign_max = float(sys.argv[5])

# Foreign CPU load (cores) measured during each run; runs above foreign_max
# are left out of a figure when at least one clean run of it exists.
foreign = {}
if os.path.exists(os.path.join(out, "runs.tsv")):
    for line in open(os.path.join(out, "runs.tsv")):
        f = line.rstrip("\n").split("\t")
        if len(f) >= 3:
            foreign[f[0]] = float(f[2])

class Samples:
    def __init__(self):
        self.clean, self.all = [], []
    def add(self, path, values):
        values = list(values)
        self.all.extend(values)
        label = os.path.basename(path).rsplit(".json", 1)[0]
        # Even a one-thread run suffers from a busy second core (shared
        # memory bandwidth and L3): the limit is the same for every run.
        if foreign.get(label, 0.0) <= foreign_max:
            self.clean.extend(values)

def med(v):
    if isinstance(v, Samples):
        v = v.clean or v.all
    return statistics.median(v) if v else float("nan")

def mark(v):
    return "*" if isinstance(v, Samples) and not v.clean and v.all else ""

def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None

# ours_isa["best"]: the kernels the CPU picks; ours_isa["avx2"]: LLM_CPU_ISA=avx2.
ours_isa, sol, theirs = {}, {}, {b: {} for b in builds}
for f in glob.glob(os.path.join(out, "ours*-t*-r*.json")):
    m = re.fullmatch(r"ours(?:\.(\w+))?-([a-z0-9_]+)-t\d+-r\d+\.json", os.path.basename(f))
    if m and m.group(2) == "depth":
        continue
    doc = load(f)
    if not m or not doc:
        continue
    isa = m.group(1) or "best"
    for r in doc["results"]:
        if "error" in r:
            continue
        key = (m.group(2), r["threads"], r["test"])
        ours_isa.setdefault(isa, {}).setdefault(key, Samples()).add(f, r["samples_tps"])
        if r["n_gen"]:
            sol.setdefault(key, Samples()).add(f, [r["sol_tps"]])
ours = ours_isa.get("best", {})
for b in builds:
    for f in glob.glob(os.path.join(out, "theirs.%s-*-t*-r*.json" % b)):
        m = re.fullmatch(r"theirs\.%s-([a-z0-9_]+)-t\d+-r\d+\.json" % b, os.path.basename(f))
        if m and m.group(1).startswith("depth"):
            continue
        doc = load(f)
        if not m or not doc:
            continue
        for r in doc:
            test = "pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"]
            key = (m.group(1), r["n_threads"], test)
            theirs[b].setdefault(key, Samples()).add(f, (1e9 * (r["n_prompt"] + r["n_gen"]) / ns for ns in r["samples_ns"]))

head = "| quant | threads | test | libllm t/s |"
rule = "|---|---:|---|---:|"
for b in builds:
    head += " llama.cpp %s t/s | libllm / %s |" % (b, b)
    rule += "---:|---:|"
head += " SoL t/s | libllm of SoL |" + "".join(" %s of SoL |" % b for b in builds)
rule += "---:|---:|" + "---:|" * len(builds)
print(head)
print(rule)
order = {"q4_0": 0, "q8_0": 1, "f16": 2, "q4_k_m": 3, "q5_k_m": 4, "q6_k": 5, "iq4_xs": 6}
keys = set(ours)
for b in builds:
    keys |= set(theirs[b])
for key in sorted(keys, key=lambda k: (k[2][:2] != "tg", order.get(k[0], 9), k[1])):
    a = med(ours.get(key, []))
    row = "| %s | %d | %s | %.2f%s |" % (key[0], key[1], key[2], a, mark(ours.get(key)))
    for b in builds:
        t = med(theirs[b].get(key, []))
        row += " %.2f%s | %.2f |" % (t, mark(theirs[b].get(key)), a / t if t else float("nan"))
    if key[2].startswith("tg"):
        s = med(sol.get(key, []))
        row += " %.1f | %.0f%% |" % (s, 100 * a / s)
        for b in builds:
            row += " %.0f%% |" % (100 * med(theirs[b].get(key, [])) / s)
    else:
        row += " | |" + " |" * len(builds)
    print(row)

# The same ISA on both sides: libllm capped to AVX2 against the avx2 build.
if "avx2" in ours_isa:
    print()
    print("Same ISA: libllm with LLM_CPU_ISA=avx2%s" % (" against llama.cpp's avx2 build" if "avx2" in builds else ""))
    print()
    print("| quant | threads | test | libllm AVX2 t/s |%s" % (" llama.cpp avx2 t/s | ratio |" if "avx2" in builds else ""))
    print("|---|---:|---|---:|%s" % ("---:|---:|" if "avx2" in builds else ""))
    o2 = ours_isa["avx2"]
    for key in sorted(o2, key=lambda k: (k[2][:2] != "tg", order.get(k[0], 9), k[1])):
        a = med(o2[key])
        row = "| %s | %d | %s | %.2f%s |" % (key[0], key[1], key[2], a, mark(o2[key]))
        if "avx2" in builds:
            t = med(theirs["avx2"].get(key, []))
            row += " %.2f%s | %.2f |" % (t, mark(theirs["avx2"].get(key)), a / t if t else float("nan"))
        print(row)

if depth:
    print()
    print("tg128 after a %d-token prompt (%s):" % (depth, depth_quant))
    print()
    print("| threads | engine | KV | t/s (median) | clean samples |")
    print("|---:|---|---|---:|---:|")
    rows = {}
    for f in glob.glob(os.path.join(out, "ours-depth-t*-r*.json")):
        doc = load(f)
        for r in (doc or {}).get("results", []):
            if "error" not in r:
                rows.setdefault((r["threads"], "libllm", r["kv_type"]), Samples()).add(f, r["samples_tps"])
    for f in glob.glob(os.path.join(out, "theirs.*-depth-*-t*-r*.json")):
        b, kind, t = re.search(r"theirs\.(\w+)-depth-(\w+)-t(\d+)-r\d+\.json$", f).groups()
        label = {"f16": "f16", "q8fa": "q8_0 K/V + FA"}[kind]
        for line in open(f):
            line = line.strip()
            if line.startswith("{"):
                rows.setdefault((int(t), "llama.cpp " + b, label), Samples()).add(f, [json.loads(line)["speed_tg"]])
    for k in sorted(rows):
        v = rows[k]
        print("| %d | %s | %s | %.2f%s | %d of %d |" % (k[0], k[1], k[2], med(v), mark(v), len(v.clean), len(v.all)))

if foreign:
    vals = sorted(foreign.values())
    print()
    print("Foreign CPU load during the runs (cores used by other processes): median %.2f, max %.2f; "
          "runs above %.2f are not counted where a figure has a cleaner run; "
          "'*' = no clean run." % (statistics.median(vals), vals[-1], foreign_max))
EOF
log "done: $OUT/summary.md"
cat "$OUT/summary.md"
