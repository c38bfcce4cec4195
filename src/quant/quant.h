// Reference (scalar) quantizers and dequantizers of the native weight types.
// These are the oracle for every optimized kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace llm {

// Converts one row of `cols` floats into `t` (group as in dtype.h).
// dst must hold dtype_row_bytes(t, cols, group) bytes.
void quantize_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols);

// Converts one stored row back to floats.
void dequantize_row(DType t, uint32_t group, const uint8_t* src, float* dst, int64_t cols);

}  // namespace llm
