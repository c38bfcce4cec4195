#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf with
# their .inp/.out files, MIT licence) from the llama-cpp-python source
# distribution on PyPI, which vendors llama.cpp. Only those files are
# extracted, into a cache outside the source tree; they are never committed.
#   LLM_MODEL_CACHE  cache folder (default: $XDG_CACHE_HOME/libllm or ~/.cache/libllm)
#   LLAMA_CPP_PYTHON_VERSION  sdist to use (default 0.3.36)
# Prints the folder with the vocabularies on success (use it as
# LLM_VOCAB_DIR for llamacpp_vocab_test.cpp); exits non-zero (with a reason
# on stderr) when the package cannot be had.
set -euo pipefail
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
cache=${LLM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/libllm}
out="$cache/vocabs"
stamp="$out/.llama-cpp-python-$version"
if [ -f "$stamp" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
pip_cmd=(python3 -m pip)
"${pip_cmd[@]}" --version >/dev/null 2>&1 || pip_cmd=(pip)
"${pip_cmd[@]}" download --quiet --no-deps --no-binary :all: --disable-pip-version-check \
  -d "$work/sdist" "llama-cpp-python==$version" >&2
sdist=$(ls "$work"/sdist/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)
if [ -z "$sdist" ]; then
  echo "fetch_llamacpp_vocabs.sh: pip did not produce llama_cpp_python-$version.tar.gz" >&2
  exit 1
fi
# Extract only vendor/llama.cpp/models/ggml-vocab-*, flattened.
python3 - "$sdist" "$work/vocabs" <<'PY'
import os, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
count = 0
with tarfile.open(src, "r:gz") as tar:
    for m in tar:
        parts = m.name.split("/")
        # <top>/vendor/llama.cpp/models/ggml-vocab-NAME.gguf[.inp|.out]
        if (len(parts) != 5 or parts[1:4] != ["vendor", "llama.cpp", "models"]
                or not parts[4].startswith("ggml-vocab-") or not m.isfile()):
            continue
        f = tar.extractfile(m)
        with open(os.path.join(dst, parts[4]), "wb") as out:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                out.write(b)
        count += 1
if count == 0:
    sys.exit("no vendor/llama.cpp/models/ggml-vocab-* files in " + src)
PY
rm -rf "$out"
mv "$work/vocabs" "$out"
touch "$stamp"
echo "$out"
