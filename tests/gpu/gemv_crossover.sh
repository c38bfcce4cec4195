#!/usr/bin/env bash
# Where batched decode should leave GEMV passes for dequantize + cuBLASLt
# GEMMs (the defaults in src/backend/cuda/backend.cpp, default_gemv_max_rows):
# llm_gpu_bench at batch 1..32 with GEMV passes up to 64 rows and with GEMMs
# from 2 rows on (BackendOptions::gemv_max_rows / _quant), for each synthetic
# model named. Prints markdown rows (ms per step in brackets).
#
#   tests/gpu/gemv_crossover.sh BIN_DIR SCRATCH_DIR "tinyllama-1.1b:q4 llama-3-8b:q4 ..."
#
# BIN_DIR holds llm-convert and llm_gpu_bench (a CUDA build's bin/); model
# files are made in SCRATCH_DIR and deleted after use.
set -u
BIN=$1 DIR=$2
mkdir -p "$DIR"
header=--header
for spec in $3; do
  shape=${spec%%:*} q=${spec#*:} f=$DIR/${spec/:/-}.llm
  if ! "$BIN/llm-convert" --synthetic "$shape" --quant "$q" --no-zstd -o "$f" >/dev/null 2>&1; then
    echo "| $shape $q | llm-convert failed |"
    continue
  fi
  for limits in 64,64 1,1; do
    "$BIN/llm_gpu_bench" "$f" --name "$shape $q, GEMV rows up to: $limits" --pp 0 --tg 32 --reps 1 \
      --batch 1,2,4,8,16,32 --gemv-max "$limits" $header 2>/dev/null
    header=
  done
  rm -f "$f"
done
