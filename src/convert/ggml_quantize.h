// Quantizers into ggml's block formats: the inverse of the decoders in
// quant/ggml_quants.h. The bytes are ggml's layout (quant/dtype.h), so ggml
// and libllm read them alike; the choice of codes and scales is libllm's own.
// Offline code (llm-convert, AWQ/GPTQ, distillation, tests): not part of
// libllm.so, which runs these blocks but never writes them.
//
//   Q5_0, Q5_1 : ggml's reference rule (the same bytes as quantize_row_q5_0_ref
//                and quantize_row_q5_1_ref), like q4/q8 in quant.cpp.
//   Q4_K, Q5_K : per sub-block of 32 an affine fit x ~ s*q - m (s, m >= 0,
//                q in 0..15 / 0..31) that minimises the (weighted) squared
//                error over a grid of starting steps, then s and m as 6-bit
//                multiples of the super-block's fp16 d and dmin, each picked
//                among its 3 nearest values by the error after re-rounding.
//   Q6_K       : per sub-block of 16 a symmetric fit x ~ s*q (q in -32..31),
//                then s as an int8 multiple of the fp16 d, picked the same way.
#pragma once

#include <cstdint>

#include "quant/dtype.h"

namespace llm {

// True for the GGUF block types quantize_ggml_row can write.
bool ggml_quantizer_exists(DType t);

// Quantizes `cols` values (a multiple of the type's block) into t's blocks.
// importance: per-value weights of the squared error (length cols; nullptr =
// all 1), used by the fitted formats (the K types); Q5_0/Q5_1 ignore it.
// Non-finite inputs are coded as 0 and left out of the fit, so the output
// decodes to finite values. Deterministic. Throws Error(LLM_ERR_UNSUPPORTED)
// for a type without a quantizer and Error(LLM_ERR_INVALID_ARGUMENT) for a
// bad cols.
void quantize_ggml_row(DType t, const float* x, const float* importance, uint8_t* dst, int64_t cols);

// quantize_row / quantize_row_weighted (quant/quant.h) for every format that
// has a quantizer: the native ones there, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K
// here. importance (length cols; nullptr = all 1) is used by the fitted
// formats (Q4M and the K types). The other GGUF block types (read from GGUF
// files, never written) are Error(LLM_ERR_UNSUPPORTED); a bad group or cols
// is Error(LLM_ERR_INVALID_ARGUMENT).
void quantize_any_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols,
                      const float* importance = nullptr);

}  // namespace llm
