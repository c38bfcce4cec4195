#!/usr/bin/env bash
# Builds libllm and runs the whole test suite (the README's test command).
#   BUILD_DIR    build folder (default: build)
#   LLM_CUDA_ARCHS  CUDA architectures to compile (default: one, enough to prove the code compiles)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DLLM_CUDA_ARCHS="${LLM_CUDA_ARCHS:-90-real}" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
# GPU tests are labelled cuda and skip themselves without a GPU.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
# Sanitizer builds (ASan+UBSan on the whole suite, TSan on the concurrency
# tests) and every fuzzer for a short budget (docs/RELIABILITY.md).
# LLM_RELIABILITY=0 skips them; tests/run_reliability.sh --long is the long run.
if [ "${LLM_RELIABILITY:-1}" != 0 ]; then
  ASAN_DIR="$BUILD_DIR-asan" TSAN_DIR="$BUILD_DIR-tsan" FUZZ_DIR="$BUILD_DIR-fuzz" JOBS="$JOBS" tests/run_reliability.sh --quick
fi
