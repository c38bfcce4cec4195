#!/usr/bin/env bash
# check_tools_symbols.sh LIBLLM_SO [NM]
#
# libllm.so must not contain the offline tools (src/convert/: the .llm writer
# and conversion, the GGUF block quantizers, K-quant mixes, AWQ, GPTQ,
# distillation); only llm-convert and the tests link them (llm_tools).
# Reads the full symbol table (internal symbols too, not only the exports),
# so the library must not be stripped.
set -euo pipefail

lib=${1:?usage: check_tools_symbols.sh LIBLLM_SO [NM]}
nm=${2:-nm}

symbols=$("$nm" -C "$lib")
# A stripped library would pass vacuously: insist on an internal symbol that
# is always there (the .llm reader).
if ! grep -q 'llm::parse_llm' <<<"$symbols"; then
  echo "check_tools_symbols.sh: $lib has no symbol table (stripped?); cannot check" >&2
  exit 2
fi
pattern='awq|gptq|distill|kquant|quantize_ggml_row|quantize_any_row|LlmWriter|write_llm|convert_to_llm|plan_llm_tensor'
if hits=$(grep -Ei "$pattern" <<<"$symbols"); then
  echo "TOOLS IN LIBLLM: $lib contains offline-tool symbols (they belong in llm_tools):"
  head -n 50 <<<"$hits"
  exit 1
fi
echo "tools symbols: none in $lib"
