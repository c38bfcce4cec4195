#!/usr/bin/env bash
# Batched decode side by side: libllm (llm-bench --batch) against llama.cpp
# (llama-batched-bench) on the same GGUF files, same thread count, same run,
# alternating which engine goes first. Aggregate generated tokens/s over all
# sequences for each batch size, and each engine's pp512 (the compute bound
# that a large batch approaches).
#
# usage: tests/bench/compare_batched.sh LLAMACPP_BIN_DIR MODEL.gguf [MODEL.gguf ...]
#
#   LLAMACPP_BIN_DIR  a llama.cpp build's bin/ with llama-batched-bench and llama-bench
#
# Environment (defaults in brackets):
#   LLM_BUILD [build]       libllm build with bin/llm-bench
#   THREADS [2]   BATCHES [1,2,4,8,16]   NGEN [128]   ROUNDS [2]
#   OUT [./batched-out]     raw outputs and summary.md
#
# Both engines start each sequence from a short prompt (libllm: 8 + i random
# tokens for session i; llama.cpp: -npp 8, sequences not sharing a prompt)
# and time NGEN decode steps of all sequences together (llama.cpp: its S_TG).
set -euo pipefail
if [[ $# -lt 2 ]]; then sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
LC=$(cd "$1" && pwd); shift
LLM_BUILD=${LLM_BUILD:-build}
THREADS=${THREADS:-2}
BATCHES=${BATCHES:-1,2,4,8,16}
NGEN=${NGEN:-128}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$PWD/batched-out}
mkdir -p "$OUT"
maxb=$(tr ',' '\n' <<<"$BATCHES" | sort -n | tail -1)
ctx=$(( maxb * (8 + maxb + NGEN + 16) ))
for m in "$@"; do
  name=$(basename "$m" .gguf)
  for r in $(seq 1 "$ROUNDS"); do
    ours() {
      "$LLM_BUILD/bin/llm-bench" -m "$m" -t "$THREADS" -p 512 -n "$NGEN" --batch "$BATCHES" -r 1 --device cpu --json \
        >"$OUT/ours-$name-r$r.json" 2>"$OUT/ours-$name-r$r.log"
    }
    theirs() {
      "$LC/llama-batched-bench" -m "$m" -t "$THREADS" -c "$ctx" -b 2048 -ub 512 -npp 8 -ntg "$NGEN" \
        -npl "$BATCHES" --output-format jsonl >"$OUT/theirs-$name-r$r.jsonl" 2>"$OUT/theirs-$name-r$r.log"
      "$LC/llama-bench" -m "$m" -t "$THREADS" -p 512 -n 0 -r 1 -o json >"$OUT/theirs-pp-$name-r$r.json" \
        2>>"$OUT/theirs-$name-r$r.log"
    }
    if (( r % 2 )); then ours; theirs; else theirs; ours; fi
    echo "[$(date +%H:%M:%S)] $name round $r done" >&2
  done
done
python3 - "$OUT" "$@" >"$OUT/summary.md" <<'PY'
import glob, json, os, statistics, sys
out, models = sys.argv[1], [os.path.basename(m)[:-5] for m in sys.argv[2:]]
print("| model | sessions | libllm t/s | llama.cpp t/s | ratio | libllm xB / x1 |")
print("|---|--:|--:|--:|--:|--:|")
pp_rows = []
for name in models:
    ours, theirs, ours_pp, theirs_pp = {}, {}, [], []
    for f in glob.glob(os.path.join(out, "ours-%s-r*.json" % name)):
        for t in json.load(open(f))["results"]:
            if t["test"].startswith("pp"):
                ours_pp.append(t["tps_median"])
            elif t["test"].startswith("tg"):
                ours.setdefault(int(t["sessions"]), []).append(t["tps_median"])
    for f in glob.glob(os.path.join(out, "theirs-%s-r*.jsonl" % name)):
        for line in open(f):
            line = line.strip()
            if line.startswith("{"):
                j = json.loads(line)
                theirs.setdefault(int(j["pl"]), []).append(float(j["speed_tg"]))
    for f in glob.glob(os.path.join(out, "theirs-pp-%s-r*.json" % name)):
        for t in json.load(open(f)):
            theirs_pp.append(float(t["avg_ts"]))
    one = statistics.median(ours[1]) if 1 in ours else float("nan")
    for b in sorted(set(ours) | set(theirs)):
        o = statistics.median(ours[b]) if b in ours else float("nan")
        t = statistics.median(theirs[b]) if b in theirs else float("nan")
        print("| %s | %d | %.2f | %.2f | %.2fx | %.2fx |" % (name, b, o, t, o / t, o / one))
    pp_rows.append((name, statistics.median(ours_pp) if ours_pp else float("nan"),
                    statistics.median(theirs_pp) if theirs_pp else float("nan"),
                    statistics.median(ours[max(ours)]) if ours else float("nan"), max(ours) if ours else 0))
print()
print("| model | libllm pp512 | llama.cpp pp512 | libllm largest batch t/s / its pp512 |")
print("|---|--:|--:|--:|")
for name, o, t, big, b in pp_rows:
    print("| %s | %.2f | %.2f | %.0f%% (x%d) |" % (name, o, t, 100 * big / o, b))
PY
cat "$OUT/summary.md"
