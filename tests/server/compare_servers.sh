#!/usr/bin/env bash
# llm-server against llama.cpp's llama-server on the same model, same clients,
# same run: tests/server/load_test.py at 1, 4 and 16 streaming clients against
# each server in turn (ROUNDS times, alternating which goes first). Both get
# the same thread count, 16 slots and a ChatML template.
#
# usage: tests/server/compare_servers.sh LLAMA_SERVER MODEL.gguf
# Environment: LLM_BUILD [build], THREADS [2], SLOTS [16], ROUNDS [2],
#              REQUESTS [2] (per client per level), OUT [./servers-out],
#              LLM_SERVER_ARGS [] (more llm-server options, split on spaces)
set -euo pipefail
if [[ $# -ne 2 ]]; then sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
LLAMA_SERVER=$1 MODEL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
LLM_BUILD=${LLM_BUILD:-build} THREADS=${THREADS:-2} SLOTS=${SLOTS:-16} ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-2} OUT=${OUT:-$PWD/servers-out}
mkdir -p "$OUT"
# Plain ChatML, as llama-server's built-in "chatml" renders it (no default
# system prompt), so both servers prefill the same prompt.
TEMPLATE=$OUT/chatml.jinja
cat >"$TEMPLATE" <<'JINJA'
{%- for m in messages -%}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant
{% endif -%}
JINJA
port=18181
wait_up() {  # url
  for _ in $(seq 1 300); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not come up" >&2; return 1
}
ours() {
  "$LLM_BUILD/bin/llm-server" -m "$MODEL" --port $port --threads "$THREADS" --parallel "$SLOTS" \
    --chat-template-file "$TEMPLATE" ${LLM_SERVER_ARGS:-} 2>"$OUT/ours-$1.log" &
  local pid=$!
  wait_up "http://127.0.0.1:$port"
  python3 "$HERE/load_test.py" --url "http://127.0.0.1:$port" --requests "$REQUESTS" --json "$OUT/ours-$1.json" \
    >"$OUT/ours-$1.md"
  kill $pid; wait $pid || true
}
theirs() {
  "$LLAMA_SERVER" -m "$MODEL" --port $port -t "$THREADS" -np "$SLOTS" -c $((SLOTS * 256)) --chat-template chatml \
    >"$OUT/theirs-$1.log" 2>&1 &
  local pid=$!
  wait_up "http://127.0.0.1:$port"
  python3 "$HERE/load_test.py" --url "http://127.0.0.1:$port" --requests "$REQUESTS" --json "$OUT/theirs-$1.json" \
    >"$OUT/theirs-$1.md"
  kill $pid; wait $pid || true
}
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then ours "r$r"; theirs "r$r"; else theirs "r$r"; ours "r$r"; fi
  echo "[$(date +%H:%M:%S)] round $r done" >&2
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(who):
    by = {}
    for r in range(1, rounds + 1):
        for row in json.load(open("%s/%s-r%d.json" % (out, who, r))):
            by.setdefault(row["clients"], []).append(row)
    return by
o, t = rows("ours"), rows("theirs")
med = lambda rs, k: statistics.median(x[k] for x in rs)
print("| clients | engine | lost | agg tok/s | vs 1 client | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
print("|--:|---|--:|--:|--:|--:|--:|--:|--:|")
for c in sorted(o):
    for name, by in (("libllm", o), ("llama.cpp", t)):
        rs = by[c]
        print("| %d | %s | %d | %.1f | %.2fx | %.1f | %.1f | %.2f | %.2f |" % (
            c, name, sum(x["lost"] for x in rs), med(rs, "tps"), med(rs, "tps") / med(by[1], "tps"),
            med(rs, "ttft50") * 1e3, med(rs, "ttft99") * 1e3, med(rs, "itl50") * 1e3, med(rs, "itl99") * 1e3))
print()
print("| clients | libllm / llama.cpp aggregate tok/s |")
print("|--:|--:|")
for c in sorted(o):
    print("| %d | %.2fx |" % (c, med(o[c], "tps") / med(t[c], "tps")))
PY
