// CPU matrix multiplication against stored weights.
//
//   y[n, rows] = x[n, cols] . W[rows, cols]^T      (W row-major, one row per output)
//
// n == 1 is decode (GEMV, memory-bound: stream W once); n > 1 is prefill
// (GEMM, compute-bound: block W so each loaded block serves many x rows).
// Work is split across the pool's threads by output rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"

namespace llm {
class ThreadPool;
}

namespace llm::cpu {

struct WeightView {
  DType dtype = DType::F32;
  uint32_t group = 0;          // quant group (Q8: 32; Q4: 32/64/128)
  int64_t rows = 0, cols = 0;  // [rows = out features, cols = in features]
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;        // dtype_row_bytes(dtype, cols, group)
};

enum class MatmulMode {
  Fast,       // may quantize activations (q8 blocks) for integer dot products
  Reference,  // dequantize weights to f32 and accumulate in f32: matches the reference outputs exactly
};

// x: [n, cols] f32 row-major (row stride cols); y: [n, rows] f32 (row stride rows).
// Scratch is per call-site thread (thread_local), never per-token heap growth.
void matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool,
            MatmulMode mode = MatmulMode::Fast);

// count matrices of one format and width on the same x (q, k, v; gate, up):
// ys[i] = ws[i] x, each exactly as matmul would give it, with x quantized once
// and one parallel region for all. Matrices of different formats or widths
// are done one by one.
void matmul_many(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, ThreadPool* pool,
                 MatmulMode mode = MatmulMode::Fast);

// The plain oracle: dequantize each row to f32 then dot in f32, single thread.
void matmul_ref(const WeightView& w, const float* x, int64_t n, float* y);

// Dequantizes row r of w into dst[cols] (f32).
void dequantize_row(const WeightView& w, int64_t r, float* dst);

}  // namespace llm::cpu
