// The loop nest of the X8 integer kernels (layout: matmul.h), shared by the
// AVX2 family (matmul_avx2.cpp; the AVX-512 one has its own on 16-row
// units), each passing its own block kernel. Include only from files
// compiled with AVX2 + FMA + F16C (everything here is a template over that
// kernel, so each file gets its own copy under its own flags).
//
// A block kernel is a type with
//   static constexpr int kCols;  // x rows per tile
//   template <int C, bool Prefetch>
//   static void run(const uint8_t* g, int64_t b0, int64_t b1, const int8_t* xq,
//                   const float* xd, const float* xs, __m256 (&acc)[C]);
// which adds blocks [b0, b1) of the 8-row group at g, for a tile of C x rows
// in the layout of pack_x8_x (C == kCols, or 1: x's own layout), to acc
// (lane i: row i of the group), one block after the other:
//   acc_i = fma(dot_i, d_i * d_x, acc_i)
// with the exact integer dot of the block's stored values (Q4: nibble - 8).
// Every kernel doing exactly that gives the same bits, whatever the family
// (matmul_x8_scalar is the portable one).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/gemm_kernels.h"

namespace llm::cpu::kern {

// Values per K chunk of a prefill: a group's chunk (8 * 2048 / 32 * 144 bytes
// = 9 KiB) stays in L1 while every x row passes over it. The running sums
// wait in y between chunks (exact f32 round trips: the order per output is
// the same as one pass).
constexpr int64_t kX8KBlocks = 64;
// Up to this many x rows the matrix streams from memory (decode, batched
// decode): the block kernel prefetches.
constexpr int64_t kX8SmallBatch = 16;

// Rows [r0, r1) (inside the 8-row groups; r0 a multiple of 4) for n x rows.
template <class Blocks>
void x8_matmul(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  constexpr int kCols = Blocks::kCols;
  const int64_t nb = w.cols / 32;
  // Without tiles of this width every x row goes alone (same bits, slower).
  const bool tiles = x.tile == kCols;
  const int64_t kb = n >= 2 * kCols ? kX8KBlocks : nb;
  for (int64_t g0 = r0 / 8 * 8; g0 < r1; g0 += 8) {
    const uint8_t* g = w.data + size_t(g0) * w.row_bytes;
    const int lo = int(std::max(r0, g0) - g0), hi = int(std::min(r1, g0 + 8) - g0);
    // A group shared with another thread's range: one pass, and only this
    // range's lanes are written.
    const bool whole = lo == 0 && hi == 8;
    for (int64_t b0 = 0; b0 < nb; b0 += whole ? kb : nb) {
      const int64_t b1 = whole ? std::min(nb, b0 + kb) : nb;
      auto tile = [&](auto cols_tag, int64_t c0) {
        constexpr int C = decltype(cols_tag)::value;
        __m256 acc[C];
        _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c)
          acc[c] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (c0 + c) * w.rows + g0);
        const bool tiled = C > 1;  // a whole tile: the packed copy
        const int8_t* xq = (tiled ? x.tq : x.q) + c0 * x.cols;
        const float* xd = (tiled ? x.td : x.d) + c0 * nb;
        const float* xs = (tiled ? x.ts : x.s) + c0 * nb;
        if (n <= kX8SmallBatch)
          Blocks::template run<C, true>(g, b0, b1, xq, xd, xs, acc);
        else
          Blocks::template run<C, false>(g, b0, b1, xq, xd, xs, acc);
        _Pragma("GCC unroll 16") for (int c = 0; c < C; ++c) {
          float* yc = y + (c0 + c) * w.rows + g0;
          if (whole) {
            _mm256_storeu_ps(yc, acc[c]);
          } else {
            alignas(32) float t[8];
            _mm256_store_ps(t, acc[c]);
            for (int i = lo; i < hi; ++i) yc[i] = t[i];
          }
        }
      };
      int64_t c0 = 0;
      for (; tiles && c0 + kCols <= n; c0 += kCols) tile(std::integral_constant<int, kCols>{}, c0);
      for (; c0 < n; ++c0) tile(std::integral_constant<int, 1>{}, c0);
    }
  }
}

}  // namespace llm::cpu::kern
