#!/usr/bin/env bash
# llm-run's chat and structured-output flags end to end: --render-chat with a
# template file alone and with a model, --json-schema and --grammar-file
# output that parses / stays in the language, --stop, --chat over stdin, and
# bad templates, grammars and schemas as clear errors (exit 1, a message).
#   llm_run_chat_test.sh BIN_DIR MODELS_DIR DATA_DIR TMP_DIR
set -euo pipefail
BIN=$1; MODELS=$2; DATA=$3; TMP=$4/llm_run_chat.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
M=$MODELS/stories260K.gguf
RUN="$BIN/llm-run"

# --render-chat: an OpenAI-style messages array through a template file, no model.
printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]' > "$TMP/msgs.json"
out=$("$RUN" --chat-template-file "$DATA/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja" --render-chat "$TMP/msgs.json")
want=$'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant'
[ "$out" = "$want" ] || fail "render-chat gave: $out"
# With a model and a template, the model's BOS text is the template's bos_token.
printf '{{ bos_token }}{%% for m in messages %%}[{{ m.role }}] {{ m.content }}\n{%% endfor %%}' > "$TMP/t.jinja"
out=$("$RUN" -m "$M" --chat-template-file "$TMP/t.jinja" --render-chat "$TMP/msgs.json")
[ "$out" = $'<s>[system] Be brief.\n[user] Hi!' ] || fail "render-chat with a model gave: $out"
# A model without a template and no file: a clear error.
if "$RUN" -m "$M" --render-chat "$TMP/msgs.json" > "$TMP/o" 2> "$TMP/e"; then fail "no template accepted"; fi
grep -q "LLM_ERR_UNSUPPORTED" "$TMP/e" || fail "no UNSUPPORTED message: $(cat "$TMP/e")"
# A malformed template: INVALID_ARGUMENT with its line.
printf 'ok\n{%% for m in messages %%}' > "$TMP/bad.jinja"
if "$RUN" --chat-template-file "$TMP/bad.jinja" --render-chat "$TMP/msgs.json" > "$TMP/o" 2> "$TMP/e"; then
  fail "bad template accepted"; fi
grep -q "line 2" "$TMP/e" || fail "no line in: $(cat "$TMP/e")"

# --json-schema: the generated text (after the echoed prompt) is JSON with the schema's keys.
printf '{"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false}' > "$TMP/s.json"
"$RUN" -m "$M" -p "Lily" -n 120 --temp 0.7 --seed 3 --json-schema "$TMP/s.json" > "$TMP/o" 2>/dev/null
python3 - "$TMP/o" <<'PY' || fail "json-schema output: $(cat "$TMP/o")"
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
assert text.startswith("Lily"), text
obj = json.loads(text[len("Lily"):])
assert set(obj) == {"name", "n"} and isinstance(obj["n"], int) and len(obj["name"]) <= 10, obj
PY
# --grammar-file: only the language's words.
printf 'root ::= ("yes" | "no") ("," ("yes" | "no")){0,3} "."\n' > "$TMP/g.gbnf"
out=$("$RUN" -m "$M" -p "Once" -n 40 --grammar-file "$TMP/g.gbnf" 2>/dev/null)
[[ "$out" =~ ^Once(yes|no)(,(yes|no)){0,3}\.$ ]] || fail "grammar output: $out"
if "$RUN" -m "$M" -p "Once" --grammar-file /dev/null > "$TMP/o" 2> "$TMP/e"; then fail "empty grammar accepted"; fi
grep -q "LLM_ERR_INVALID_ARGUMENT" "$TMP/e" || fail "empty grammar: $(cat "$TMP/e")"

# --stop: the text ends before the stop string; without it the text goes on past it.
full=$("$RUN" -m "$M" -p "Once upon a time" -n 60 2>/dev/null)
cut=$("$RUN" -m "$M" -p "Once upon a time" -n 60 --stop "little" 2>/dev/null)
[[ "$full" == *little* ]] || fail "the reference text has no 'little': $full"
[ "$cut" = "${full%%little*}" ] || fail "--stop gave: $cut"

# --chat over stdin: two turns answered through a template, the conversation kept.
printf '{%% for m in messages %%}{{ m.role }}: {{ m.content }}\n{%% endfor %%}{%% if add_generation_prompt %%}assistant:{%% endif %%}' > "$TMP/c.jinja"
printf 'Once upon a time\nThe end\n' | "$RUN" -m "$M" --chat --chat-template-file "$TMP/c.jinja" --system "Tell stories" -n 12 > "$TMP/o" 2> "$TMP/e" \
  || fail "chat exited $?: $(cat "$TMP/e")"
[ "$(grep -c '' "$TMP/o")" -ge 2 ] || fail "chat answered fewer than two turns: $(cat "$TMP/o")"
grep -q "generated 24 tokens" "$TMP/e" || grep -q "generated" "$TMP/e" || fail "no stats: $(cat "$TMP/e")"
echo "llm-run chat/grammar/stop: ok"
