#!/bin/sh
# ctest driver of the Python binding: run_python.sh LIB_FILE MODELS_DIR SOURCE_DIR
# Exits 77 (ctest skip) when python3 is not installed.
set -eu
lib_file=$1 models_dir=$2 src_dir=$3
if ! command -v python3 >/dev/null 2>&1; then
  echo "python3 not found: skipping the Python binding tests"
  exit 77
fi
export LLM_LIB="$lib_file" LLM_MODELS_DIR="$models_dir" PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$src_dir${PYTHONPATH:+:$PYTHONPATH}"
cd "$src_dir"
exec python3 -m unittest -v test_libllm
