#!/usr/bin/env bash
# Makes the model-family test data in tests/data/families/: the tiny random-weight
# GGUF models (make_family_models.py) and llama.cpp's reference logits for them
# (family_refgen.cpp, linked against a llama.cpp build), one <name>.json per model.
#
# usage: tests/tools/make_family_refs.sh [LLAMA_SRC [LLAMA_BUILD]]
#   LLAMA_SRC    llama.cpp source tree (for llama.h / ggml.h)   required (or $LLAMA_SRC)
#   LLAMA_BUILD  its cmake build dir (libllama.so, libggml*.so)  default $LLAMA_BUILD or LLAMA_SRC/build
# environment:
#   VOCAB    stories260K.gguf (tokenizer source)   default ../shared/models/stories260K.gguf
#   OUT      output directory                      default tests/data/families
#   ONLY     comma-separated family names          default all
#   THREADS  llama.cpp threads                     default 2
#   PYTHON   python with numpy and gguf            default python3
#   CXX      C++ compiler                          default g++
#   REF_DESC text for the "reference" field        default "llama.cpp 0.3.36 sdist vendor/llama.cpp, ..."
# Needs the llama target built, e.g.: cmake --build LLAMA_BUILD --target llama
set -euo pipefail

cd "$(dirname "$0")/../.."   # repository root; all paths below are relative to it
LLAMA_SRC=${1:-${LLAMA_SRC:?usage: make_family_refs.sh LLAMA_SRC [LLAMA_BUILD]}}
LLAMA_BUILD=${2:-${LLAMA_BUILD:-$LLAMA_SRC/build}}
VOCAB=${VOCAB:-../shared/models/stories260K.gguf}
OUT=${OUT:-tests/data/families}
THREADS=${THREADS:-2}
PYTHON=${PYTHON:-python3}
CXX=${CXX:-g++}
ALL=llama,llama3,qwen2,qwen3,gemma2,gemma3,phi3,qwen2_yarn,phi3_longrope
ONLY=${ONLY:-$ALL}
REF_DESC=${REF_DESC:-"llama.cpp 0.3.36 sdist vendor/llama.cpp, CPU, F32 weights, F32 KV cache, flash attention off"}
N_GEN=32

LIBDIR=$LLAMA_BUILD/bin
[ -e "$LIBDIR/libllama.so" ] || LIBDIR=$LLAMA_BUILD/src
[ -e "$LIBDIR/libllama.so" ] || { echo "no libllama.so under $LLAMA_BUILD/bin or /src" >&2; exit 1; }
GGML_LIBDIR=$LIBDIR
[ -e "$GGML_LIBDIR/libggml.so" ] || GGML_LIBDIR=$LLAMA_BUILD/ggml/src

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Commands are run as arrays; show() prints them with the temporary directory as $WORK.
show() { local s="$*"; printf '%s' "${s//$WORK/\$WORK}"; }
models_cmd=("$PYTHON" tests/tools/make_family_models.py --vocab "$VOCAB" --out "$OUT" --prompts "$WORK/prompts.txt" --only "$ONLY")
build_cmd=("$CXX" -std=c++17 -O2 -o "$WORK/family_refgen" tests/tools/family_refgen.cpp -I"$LLAMA_SRC/include" -I"$LLAMA_SRC/ggml/include"
           -L"$LIBDIR" -lllama -lggml -lggml-base -Wl,-rpath,"$LIBDIR")
[ "$GGML_LIBDIR" = "$LIBDIR" ] || build_cmd+=(-L"$GGML_LIBDIR" -Wl,-rpath,"$GGML_LIBDIR")
echo "+ $(show "${models_cmd[@]}")"; "${models_cmd[@]}"
echo "+ $(show "${build_cmd[@]}")"; "${build_cmd[@]}"

IFS=, read -r -a names <<< "$ONLY"
for name in "${names[@]}"; do
  ref_cmd=("$WORK/family_refgen" "$OUT/$name.gguf" "$WORK/prompts.txt" "$N_GEN" "$THREADS")
  echo "+ $(show "${ref_cmd[@]}") > $(show "$WORK/$name.raw.json")"
  "${ref_cmd[@]}" > "$WORK/$name.raw.json"
  generator="tests/tools/make_family_refs.sh $LLAMA_SRC $LLAMA_BUILD, which runs (\$WORK = a temporary directory): $(show "${models_cmd[@]}"); $(show "${build_cmd[@]}"); $(show "${ref_cmd[@]}") > $(show "$WORK/$name.raw.json"); then rewrites that output as this file (floats as %.7g)"
  "$PYTHON" - "$WORK/$name.raw.json" "$OUT/$name.json" "$name" "$generator" "$REF_DESC" <<'EOF'
import json, sys
import gguf
raw, out, name, generator, ref_desc = sys.argv[1:6]
d = json.load(open(raw))
model_file = name + ".gguf"
arch = gguf.GGUFReader(out[: -len(".json")] + ".gguf").fields["general.architecture"].contents()
f7 = lambda v: format(v, ".7g")
row = lambda r: "[" + ",".join(f7(v) for v in r) + "]"
ints = lambda r: "[" + ",".join(str(int(v)) for v in r) + "]"
parts = []
for c in d["cases"]:
    assert len(c["generated_token_ids"]) == len(c["generated_logits"])
    parts.append(
        ' {"prompt_token_ids": ' + ints(c["prompt_token_ids"]) + ',\n'
        '  "prompt_logits": [\n   ' + ",\n   ".join(row(r) for r in c["prompt_logits"]) + '],\n'
        '  "generated_token_ids": ' + ints(c["generated_token_ids"]) + ',\n'
        '  "generated_logits": [\n   ' + ",\n   ".join(row(r) for r in c["generated_logits"]) + ']}')
text = ("{\n" + '"family": ' + json.dumps(arch) + ",\n" + '"model_file": ' + json.dumps(model_file) + ",\n"
        + '"generator": ' + json.dumps(generator) + ",\n" + '"reference": ' + json.dumps(ref_desc) + ",\n"
        + '"n_vocab": ' + str(d["n_vocab"]) + ",\n" + '"cases": [\n' + ",\n".join(parts) + "\n]\n}\n")
json.loads(text)  # well-formed
open(out, "w").write(text)
print(f"wrote {out} ({len(text)} bytes)")
EOF
done
