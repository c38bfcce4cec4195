// Internal interface between the matmul dispatcher (matmul.cpp) and its
// kernels: portable scalar ones (matmul.cpp), AVX2/FMA/F16C ones
// (matmul_avx2.cpp, only called when use_avx2_kernels() is true) and
// AVX-512 ones (matmul_avx512.cpp, only when use_avx512_kernels() is true).
//
// Every kernel computes rows [r0, r1) of y[n, rows] = x[n, cols] . W^T; the
// dispatcher splits rows across threads in multiples of kRowTile so a thread
// always starts on a tile boundary.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/matmul.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>  // _mm_prefetch
#endif

namespace llm::cpu::kern {

constexpr int64_t kRowTile = 4;  // W rows per register tile in every kernel
constexpr int64_t kQBlock = 32;  // activation quantization block (values)

// Activation rows quantized for integer dot products with Q8/Q4 weights:
// value[i][k] ~= d[i][k / 32] * q[i][k], q in [-127, 127].
struct QuantX {
  const int8_t* q = nullptr;  // [n, cols]
  const float* d = nullptr;   // [n, cols / 32]
  const float* s = nullptr;   // [n, cols / 32] sum of the block's q (exact)
  int64_t cols = 0;           // multiple of 32
  // For X8 matrices (x as above, plus): the first n / tile * tile rows
  // again in tiles of `tile` rows (pack_x8_x), or tile == 0.
  int tile = 0;
  const int8_t* tq = nullptr;
  const float* td = nullptr;
  const float* ts = nullptr;
};

// x rows per tile of the X8 kernels: AVX2 (16 ymm registers), AVX-512.
constexpr int kX8ColsAvx2 = 4;
constexpr int kX8ColsAvx512 = 8;
// Blocks per K chunk of an X8 prefill: a group's chunk (8 * 2048 / 32 * 144
// bytes = 9 KiB for Q4) stays in L1 while every x row passes over it; the
// running sums wait in y between chunks (exact f32 round trips: the order
// per output is that of one pass).
constexpr int64_t kX8KBlocks = 64;
// Up to this many x rows an X8 matrix streams from memory (decode, batched
// decode): its kernels prefetch.
constexpr int64_t kX8SmallBatch = 16;

// Tiles t of `tile` rows of x (rows [t * tile, (t + 1) * tile) of x.q/d/s)
// for t in [t0, t1), in the layout the X8 kernels read: tile t at q + t *
// tile * cols, its block b at + b * 32 * tile, where dword j (values 4j..4j+3)
// of row c is at + (j * tile + c) * 4; d and s at d/s + t * tile * nb, block b
// row c at + b * tile + c. With tile == 1 this is x's own layout.
void pack_x8_x(const QuantX& x, int tile, int64_t t0, int64_t t1, int8_t* q, float* d, float* s);

// Portable kernels (the fallback without AVX2, and the oracle for the SIMD path).
// quantize_x_* must agree bit for bit between the two implementations.
void quantize_x_scalar(const float* x /* [n, cols] */, int64_t n, int64_t cols,
                       int8_t* q /* [n, cols] */, float* d /* [n, cols/32] */,
                       float* s /* [n, cols/32] */);
void matmul_q_scalar(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0,
                     int64_t r1);
// Rows [r0, r1) of an X8 matrix, all inside its 8-row groups: per row, the
// blocks in order, acc = fma(dot_b, d_w,b * d_x,b, acc) with the exact
// integer dot of block b's stored values (Q4: nibble - 8, as dot of the
// nibbles - 8 * s_b) and a single f32 accumulator. The AVX2 and AVX-512
// kernels do exactly these operations per 32-bit lane: all agree bit for bit.
void matmul_x8_scalar(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1);

#if defined(__x86_64__) || defined(_M_X64)
// The prefill (n > 1) loop nest of the f32-accumulation path, shared by the
// AVX2 and AVX-512 families; each passes its own tile code. Per K block of
// KBlock values, block of x rows (up to XBlockBytes, kept in L2) and tile of
// kRowTile W rows: the tile is dequantized once into an L1 buffer (F32 is
// used in place) by dequant(row, k0, len, dst), and rows(nr, w_tile,
// w_stride, x, nc, len, y, accumulate) runs the block's x rows over it, a
// slice of 4 * Cols rows per call. Before each slice an even share of the
// next tile's W segment is prefetched into L2: the segment is too short for
// the hardware prefetcher to ramp up, and prefetched in one burst much of it
// still missed (the burst overflows the outstanding-miss queue); spread out,
// the dequantization's share of an f16 pp512 fell from 21% to 9%. Neither
// the blocking nor the prefetch changes any output's summation order.
// Dequant and Rows are lambdas of the calling kernel file, so each family
// instantiates its own copy with its own target flags.
template <int64_t KBlock, int Cols, int64_t XBlockBytes, class Dequant, class Rows>
void f_prefill_blocked(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                       int64_t r1, Dequant&& dequant, Rows&& rows) {
  const int64_t cols = w.cols;
  // The tile buffer is 64-byte aligned (each 16-float vector is one cache
  // line) and its rows are a line longer than KBlock, so they do not alias
  // each other in L1 sets.
  constexpr int64_t kBufStride = KBlock + 16;
  constexpr int64_t kSlice = 4 * Cols;
  thread_local std::vector<float> storage;
  if (storage.size() < size_t(kRowTile * kBufStride + 16)) storage.resize(size_t(kRowTile * kBufStride + 16));
  float* const buf = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64 / 4;
  for (int64_t k0 = 0; k0 < cols; k0 += KBlock) {
    const int64_t len = std::min(KBlock, cols - k0);
    const int64_t xblock = std::max<int64_t>(Cols, XBlockBytes / (len * 4) / Cols * Cols);
    // The stored bytes of values [k0, k0 + len) of a row (k0 and len are
    // multiples of the group, so this is exact for every dtype).
    const size_t seg0 = size_t(k0) * w.row_bytes / size_t(cols);
    const size_t seg_lines = (size_t(len) * w.row_bytes / size_t(cols) + 63) / 64;
    for (int64_t c0 = 0; c0 < n; c0 += xblock) {
      const int64_t nc = std::min(xblock, n - c0);
      const int64_t slices = (nc + kSlice - 1) / kSlice;
      for (int64_t r = r0; r < r1; r += kRowTile) {
        const int64_t nr = std::min<int64_t>(kRowTile, r1 - r);
        const uint8_t* wt;
        size_t ws;
        if (w.dtype == DType::F32) {
          wt = w.data + size_t(r) * w.row_bytes + size_t(k0) * 4;
          ws = w.row_bytes;
        } else {
          for (int64_t i = 0; i < nr; ++i)
            dequant(w.data + size_t(r + i) * w.row_bytes, k0, len, buf + i * kBufStride);
          wt = reinterpret_cast<const uint8_t*>(buf);
          ws = kBufStride * sizeof(float);
        }
        // Lines of the next tile's segment: line l is row r + kRowTile + l /
        // seg_lines, 64 * (l % seg_lines) bytes into the segment.
        const uint8_t* next = w.data + size_t(r + kRowTile) * w.row_bytes + seg0;
        const size_t lines = size_t(std::clamp<int64_t>(r1 - r - kRowTile, 0, kRowTile)) * seg_lines;
        const size_t per_slice = (lines + size_t(slices) - 1) / size_t(slices);
        size_t l = 0;
        for (int64_t s0 = 0; s0 < nc; s0 += kSlice) {
          for (const size_t e = std::min(lines, l + per_slice); l < e; ++l) {
            const uint8_t* p = next + (l / seg_lines) * w.row_bytes + (l % seg_lines) * 64;
            _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
          }
          rows(nr, wt, ws, x + (c0 + s0) * cols + k0, std::min(kSlice, nc - s0), len, y + (c0 + s0) * w.rows + r,
               k0 > 0);
        }
      }
    }
  }
}

// pair_layout (what matmul_q_avx2 expects for Q4 group-32 weights, see
// q_pair_layout): each pair of blocks (2k, 2k+1) is stored as
// [2k: 0..15][2k+1: 0..15][2k: 16..31][2k+1: 16..31]; an odd last block stays plain.
void quantize_x_avx2(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                     bool pair_layout);
inline bool q_pair_layout(const WeightView& w) {
  return w.dtype == DType::Q4 && w.group == 32 && w.layout == WeightLayout::Rows;
}
// Rows [r0, r1) of an X8 matrix inside its 8-row groups, x plain (and its
// tiles, pack_x8_x): the same bits as matmul_x8_scalar.
void matmul_x8_avx2(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1);
// Fast mode, Q8/Q4 weights: integer block dots against quantized activations.
void matmul_q_avx2(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0,
                   int64_t r1);
// f32 accumulation of exactly dequantized weights (every dtype; Fast mode for
// F32/F16/BF16 and Reference mode for all).
void matmul_f_avx2(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                   int64_t r1);

// AVX-512 family. Activations for the integer path come in "quads" of 4
// blocks (128 values); each quad of an x row is kQuadBytes bytes:
//   [  0.. 63] values 0..15 of blocks 0, 1, 2, 3 (16 int8 each)
//   [ 64..127] values 16..31 of blocks 0, 1, 2, 3
//   [128..191] 16 int32: -K * (sum of the 8 int8 that meet int32 lane l in
//              vpdpbusd), K = 128 for Q8 weights, 8 for Q4 (the offsets of
//              the unsigned weight encodings, see matmul_avx512.cpp)
//   [192..255] 16 floats: block scale d, lanes 4j..4j+3 = block j
// Blocks past the end of the row are zero. Rows are quad_count * kQuadBytes
// apart.
constexpr int64_t kQuadBytes = 256;
inline int64_t quad_count(int64_t cols) { return (cols / 32 + 3) / 4; }
void quantize_x_avx512(const float* x, int64_t n, int64_t cols, uint8_t* out, bool q8);
void matmul_q_avx512(const WeightView& w, const uint8_t* xq, int64_t n, float* y, int64_t r0,
                     int64_t r1);
void matmul_f_avx512(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                     int64_t r1);
// Rows [r0, r1) of an X8 matrix inside its 8-row groups, x as for
// matmul_x8_avx2: the same bits as the AVX2 and portable kernels.
void matmul_x8_avx512(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1);
#endif

}  // namespace llm::cpu::kern
