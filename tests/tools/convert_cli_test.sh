#!/usr/bin/env bash
# llm-convert's calibration flags end to end on stories260K: --gptq and --qat
# (a few steps) write a model that loads and generates, whose recipe says
# what ran; misuse is a usage error (exit 2) that writes nothing.
#   convert_cli_test.sh BIN_DIR MODELS_DIR TMP_DIR
set -euo pipefail
BIN=$1; MODELS=$2; TMP=$3/convert_cli.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

CAL=$TMP/calib.txt
printf 'Once upon a time, there was a little girl named Lily. She liked to play in the park with her dog.\n' > "$CAL"
printf 'One day, Tom found a big red ball. He was very happy and ran to show his mom.\n' >> "$CAL"
M=$MODELS/stories260K.bin
TOK=$MODELS/tok512.bin

out=$("$BIN/llm-convert" "$M" --tokenizer "$TOK" -o "$TMP/q.llm" --quant q4m --embd-quant q8 \
      --gptq "$CAL" --qat "$CAL" --qat-steps 3 --threads 2) || fail "convert exited $?"
grep -q "^QAT: 3 steps over [0-9]* tokens" <<< "$out" || fail "no QAT line in: $out"
kl=$(sed -n 's/^QAT: .* -> \([0-9.e-]*\)$/\1/p' <<< "$out")
[ -n "$kl" ] || fail "no KL in the QAT line"
info=$("$BIN/llm-convert" --info "$TMP/q.llm")
grep -q "gptq; qat 3 steps" <<< "$info" || fail "recipe does not say gptq + qat: $info"
grep -q "quant.distill" <<< "$info" || fail "no quant.distill metadata"
"$BIN/llm-run" -m "$TMP/q.llm" -p "Once upon a time" -n 8 > "$TMP/run.txt" 2>/dev/null || fail "the result does not run"
[ -s "$TMP/run.txt" ] || fail "the result generated nothing"

usage() {  # usage EXPECTED_EXIT ARGS...: exit code and no output file
  local want=$1; shift
  rm -f "$TMP/bad.llm"
  set +e
  "$BIN/llm-convert" "$@" -o "$TMP/bad.llm" > /dev/null 2>&1
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || fail "exit $rc (want $want) for: $*"
  [ ! -e "$TMP/bad.llm" ] || fail "wrote output for: $*"
}
usage 2 "$M" --tokenizer "$TOK" --quant q4 --qat "$CAL" --qat-steps 0
usage 2 "$M" --tokenizer "$TOK" --quant q4 --qat "$CAL" --qat-lr 0
usage 2 "$M" --tokenizer "$TOK" --quant q4 --qat "$CAL" --qat-lr 1.5x
usage 2 "$M" --tokenizer "$TOK" --quant f16 --qat "$CAL"
usage 2 "$M" --tokenizer "$TOK" --quant q4 --gptq "$CAL" --qat "$TOK"
usage 2 --synthetic stories260K-shape --quant q4 --qat "$CAL"
usage 1 "$M" --tokenizer "$TOK" --quant q4 --qat "$TMP/missing.txt"
echo "PASS"
