// Decoders of ggml's block formats, bit-exact with ggml's scalar to_float
// (same operations in the same order, so every float matches exactly).
// Used to import GGUF tensors whose layout libllm does not run natively.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"
#include "quant/ggml_types.h"

namespace llm {

// Decodes n values of `t` from src (n / ggml_block_size(t) whole blocks) into dst.
// n must be a multiple of the type's block size. Supported: F32, F16, BF16,
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
// IQ4_NL, IQ4_XS. Throws Error(LLM_ERR_UNSUPPORTED) for another type and
// Error(LLM_ERR_INVALID_ARGUMENT) for a bad n.
void dequantize_ggml(GgmlType t, const uint8_t* src, float* dst, int64_t n);

// Values per block of `t` (1 for float types); 0 if unknown.
int64_t ggml_block_size(GgmlType t);

// The ggml type whose blocks a GGUF block DType stores (dtype_is_ggml_block).
// Throws Error(LLM_ERR_INVALID_ARGUMENT) for any other DType.
GgmlType ggml_type_of(DType t);

}  // namespace llm
