#!/bin/sh
# ctest driver of the Rust binding: run_rust.sh LIB_DIR MODELS_DIR MANIFEST TARGET_DIR
# Exits 77 (ctest skip) when cargo is not installed.
set -eu
lib_dir=$1 models_dir=$2 manifest=$3 target_dir=$4
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: skipping the Rust binding tests"
  exit 77
fi
export LLM_LIB_DIR="$lib_dir" LLM_MODELS_DIR="$models_dir"
export LD_LIBRARY_PATH="$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" # doctests get no rpath
# cargo test also builds the examples (examples/stream.rs).
exec cargo test --offline --manifest-path "$manifest" --target-dir "$target_dir" -- --test-threads=2
