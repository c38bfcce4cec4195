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
//   Q2_K       : Q4_K's affine fit on sub-blocks of 16 with q in 0..3, s and m
//                as 4-bit multiples of d and dmin; then (d, dmin) refitted by
//                least squares for the chosen integers while the error falls.
//   Q3_K       : Q6_K's symmetric fit on sub-blocks of 16 with q in -4..3, s
//                as a 6-bit signed multiple of d; d refitted the same way.
//   IQ4_NL     : x ~ d*t, t in the format's 16-value table, per block of 32:
//                a grid of steps putting the largest value at or beyond
//                either end of the table, each value on its nearest entry,
//                the least-squares step for those entries; the best kept.
//   IQ4_XS     : IQ4_NL's fit per sub-block of 32, the steps as 6-bit signed
//                multiples of the fp16 d, picked and refitted as in Q3_K.
#pragma once

#include <cstdint>

#include "quant/dtype.h"

namespace llm {

// True for the GGUF block types quantize_ggml_row can write (all of them).
bool ggml_quantizer_exists(DType t);

// Quantizes `cols` values (a multiple of the type's block) into t's blocks.
// importance: per-value weights of the squared error (length cols; nullptr =
// all 1), used by the fitted formats (the K and IQ4 types); Q5_0/Q5_1 ignore it.
// Non-finite inputs take the code whose value is nearest 0 (0 itself where
// the sub-block's grid has it) and are left out of the fit, so the output
// decodes to finite values. Deterministic. Throws
// Error(LLM_ERR_UNSUPPORTED) for a type that is not a GGUF block type and
// Error(LLM_ERR_INVALID_ARGUMENT) for a bad cols.
void quantize_ggml_row(DType t, const float* x, const float* importance, uint8_t* dst, int64_t cols);

// quantize_row / quantize_row_weighted (quant/quant.h) for every format: the
// native ones there, the GGUF block types (Q5_0 .. IQ4_XS) here. importance
// (length cols; nullptr = all 1) is used by the fitted formats (Q4M, the K
// and IQ4 types). A bad group or cols is Error(LLM_ERR_INVALID_ARGUMENT).
void quantize_any_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols,
                      const float* importance = nullptr);

}  // namespace llm
