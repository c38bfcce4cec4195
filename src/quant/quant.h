// Reference (scalar) quantizers and dequantizers of the native weight types.
// These are the oracle for every optimized kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace llm {

// Converts one row of `cols` floats into `t` (group as in dtype.h).
// dst must hold dtype_row_bytes(t, cols, group) bytes. The native formats
// only (F32, F16, BF16, Q8, Q4, Q4M); a GGUF block type is
// Error(LLM_ERR_UNSUPPORTED): its quantizers are offline code that only
// llm-convert links (quantize_any_row in convert/ggml_quantize.h).
void quantize_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols);

// Q4M: the (scale, minimum) of one group of g values, both already rounded
// to fp16, chosen to minimise sum_j wt[j] * (x[j] - (d * q[j] + m))^2 over
// nibbles q in 0..15 (wt == nullptr: all 1). A few starting ranges (the
// group's min/max, and shrunk ones that clip outliers) are each refined by
// alternating rounding and a 2x2 least-squares solve; the best one wins.
// Deterministic: the same input always gives the same bytes.
void q4m_fit_group(const float* x, const float* wt, int g, float* d, float* m);

// Q4M: the nibble of x in a group with scale d and minimum m (0 if d is 0).
int q4m_nibble(float x, float d, float m);

// Like quantize_row, with per-column importance weights (length cols) for
// the formats that choose parameters by a fit (Q4M); the others ignore them.
void quantize_row_weighted(DType t, uint32_t group, const float* src, const float* importance,
                           uint8_t* dst, int64_t cols);

// The value of largest magnitude in x[0..n), with its sign (0 if all are 0);
// the first of equal magnitudes wins, as in ggml's Q4_0/Q5_0 rule.
float signed_absmax(const float* x, int n);

// Converts one stored row back to floats.
void dequantize_row(DType t, uint32_t group, const uint8_t* src, float* dst, int64_t cols);

}  // namespace llm
