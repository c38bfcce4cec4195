#!/usr/bin/env bash
# Packs what tests/gpu/device_check.sh needs to run on a GPU machine that has
# the CUDA driver and toolkit libraries but no compiler set up for this
# project (none of its dependencies installed):
#
#   tests/gpu/pack_prebuilt.sh BUILD_DIR DEST
#
# DEST gets bin/ (the check's binaries, stripped), lib/ (libllm.so and the
# shared libraries they need beside glibc, libstdc++ and CUDA's own), models/
# (the small files the CUDA tests read from LLM_MODELS_DIR) and env.sh. On
# the GPU machine, from the repository's root:
#
#   source DEST/env.sh && LLM_CHECK_PREBUILT=1 LLM_BUILD_DIR=DEST bash tests/gpu/device_check.sh
#
# env.sh links the source and models paths compiled into the tests to this
# copy of the repository (the test binaries name their data by absolute path)
# and sets LD_LIBRARY_PATH. BUILD_DIR must be a CUDA build for the target GPU
# (LLM_CUDA_ARCHS, e.g. 90-real for Hopper) of the checked-out sources.
set -eu
BUILD=$(cd "$1" && pwd -P)
DEST=$2
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
CACHE=$BUILD/CMakeCache.txt
[[ -f $CACHE ]] || { echo "pack_prebuilt: $BUILD is not a CMake build" >&2; exit 1; }
[[ -x $BUILD/bin/llm_gpu_tests ]] || { echo "pack_prebuilt: $BUILD has no CUDA tests (a build without CUDA?)" >&2; exit 1; }
MODELS=$(sed -n 's/^LLM_MODELS_DIR:PATH=//p' "$CACHE")
MODELS_REAL=$(cd "$MODELS" && pwd -P)
[[ $MODELS == /* ]] || { echo "pack_prebuilt: LLM_MODELS_DIR $MODELS is not absolute" >&2; exit 1; }

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/models/reference"
for b in llm_gpu_tests llm_gpu_cpu_tests llm_gpu_bench llm-convert llm_engine_tests llm_model_tests llm-bench; do
  [[ -x $BUILD/bin/$b ]] || { echo "pack_prebuilt: $BUILD/bin/$b is not built" >&2; exit 1; }
  strip -o "$DEST/bin/$b" "$BUILD/bin/$b"
done
cp -P "$BUILD"/lib/libllm.so* "$DEST/lib/"
strip "$DEST/lib/$(basename "$(readlink -f "$BUILD/lib/libllm.so")")"
# The project's own dependencies (mimalloc, zstd, xxhash, ...): everything the
# binaries load that is neither glibc, the C++ runtime nor CUDA.
for b in "$DEST"/bin/* "$DEST"/lib/libllm.so; do ldd "$b"; done |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcudart|libcublas[^/]*|libcuda)\.so' |
  while read -r l; do cp -L "$l" "$DEST/lib/"; done
cp "$MODELS_REAL"/stories260K*.gguf "$MODELS_REAL"/llama-2-tiny-random.gguf "$DEST/models/"
cp "$MODELS_REAL"/reference/*.json "$DEST/models/reference/" 2>/dev/null || true

cat >"$DEST/env.sh" <<ENV
# Made by tests/gpu/pack_prebuilt.sh; source from the repository's root.
_llm_dest=\$PWD/$DEST
# In this order: the models path may lead through the source path.
for _l in "$ROOT:\$PWD" "$MODELS:\$_llm_dest/models"; do
  _from=\${_l%%:*}; _to=\${_l#*:}
  if [[ \$(cd "\$_from" 2>/dev/null && pwd -P) != "\$(cd "\$_to" && pwd -P)" ]]; then
    if [[ -e \$_from ]]; then echo "env.sh: \$_from exists and is not \$_to" >&2; return 1; fi
    mkdir -p "\$(dirname "\$_from")" && ln -s "\$_to" "\$_from"
  fi
done
_cuda_libs=\$(dirname "\$(ldconfig -p | awk '/libcublasLt\.so\./ {print \$NF; exit}')" 2>/dev/null)
for _d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -e \$_d/libcublasLt.so.13 ]] && _cuda_libs=\$_cuda_libs:\$_d
done
export LD_LIBRARY_PATH=\$_llm_dest/lib:\$_cuda_libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
ENV
du -sh "$DEST"
