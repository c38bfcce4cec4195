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

// How a matrix's rows lie in memory.
//   Rows: row r at data + r * row_bytes (every dtype; what files hold).
//   X8:   Q4 group 32 (GGUF Q4_0) or Q8 (GGUF Q8_0) rows interleaved by 8 at
//         load for the AVX2 and AVX-512 integer kernels (repack_x8). Group g
//         of rows 8g..8g+7 takes the same 8 * row_bytes bytes at data + 8g *
//         row_bytes; its block b is x8_block_bytes(dtype) = 8 stored blocks
//         at b * that: the 8 rows' f16 scales, then the rows' quant bytes in
//         dwords, dword k of row i at 16 + 32 k + 4 i (Q4: k = 0..3, the
//         nibble bytes 4k..4k+3; Q8: k = 0..7, values 4k..4k+3). The last
//         rows % 8 rows stay as Rows puts them.
enum class WeightLayout : uint8_t { Rows, X8 };
constexpr size_t x8_block_bytes(DType t) { return t == DType::Q8 ? 8 * 34 : 8 * 18; }

struct WeightView {
  DType dtype = DType::F32;
  uint32_t group = 0;          // quant group (Q8: 32; Q4: 32/64/128)
  int64_t rows = 0, cols = 0;  // [rows = out features, cols = in features]
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;        // dtype_row_bytes(dtype, cols, group)
  WeightLayout layout = WeightLayout::Rows;
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

// Dequantizes row r of w into dst[cols] (f32), whatever its layout.
void dequantize_row(const WeightView& w, int64_t r, float* dst);

// The X8 layout: whether w (Rows) can take it, and whether the kernels that
// run now want it for dtype t (Fast mode with the AVX2 or AVX-512 family for
// Q4 group 32: their integer kernels then keep one row per 32-bit lane, with
// no horizontal sums; the portable family gains nothing; Q8 not yet, see
// matmul.cpp). The choice is made at load, for the model's lifetime; every
// family still computes an X8 matrix, to the same bits (the layout picks the
// kernels, the cap only which of them).
bool x8_eligible(const WeightView& w);
bool x8_preferred(DType t, MatmulMode mode);
// Writes w (Rows, eligible) to dst (w.rows * w.row_bytes bytes, not
// overlapping w.data) in the X8 layout and returns the view of dst. A
// permutation of the bytes: every value and scale is kept. Rows [r0, r1)
// only, when given (r0 a multiple of 8; r1 too, or w.rows), so that threads
// can share the work.
WeightView repack_x8(const WeightView& w, uint8_t* dst, int64_t r0 = 0, int64_t r1 = -1);

}  // namespace llm::cpu
