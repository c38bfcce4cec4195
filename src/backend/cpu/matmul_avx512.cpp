// AVX-512 (F/BW/VL/DQ/VNNI) + FMA/F16C matmul kernels. Compiled with those
// flags (src/CMakeLists.txt) and only entered after use_avx512_kernels()
// (cpu_features.h) said yes.
//
// Two families, like matmul_avx2.cpp, on register tiles of R <= 4 W rows x
// C x rows, 16 lanes along k, one horizontal sum per output (per K block):
//   * matmul_q_avx512 (Fast mode, Q8/Q4): activations quantized to int8
//     blocks of 32 (the same q and d as quantize_x_scalar) and laid out in
//     quads of 4 blocks (gemm_kernels.h). A W quad is brought into the same
//     layout as two registers of unsigned bytes, so one quad of one (row,
//     x row) pair is two vpdpbusd, one conversion, one scale product and one
//     FMA: 128 multiply-adds in 5 instructions.
//       Q4: the nibbles 0..15 are the unsigned operand as they are; the -8
//       offset is the -8 * (x sum) the x layout starts each dot from.
//       Q8: w + 128 (w XOR 0x80) is the unsigned operand; -128 * (x sum)
//       comes off the same way. Both are exact in int32.
//       decode  (n == 1): 4-row tiles (Q8: 8-row), the next tiles
//                         software-prefetched; the loop runs well above
//                         DRAM speed, so how it issues misses sets its pace;
//       prefill (n > 1):  4 W rows x 4 x rows per tile; x rows are taken in
//                         blocks that stay in L2 while every W tile (L1)
//                         passes over them.
//     Q4 group 32 and Q8 in the X8 layout (matmul.h; made at load) take
//     their own kernels instead, one row per 32-bit lane, 16 rows x 8 x rows
//     per tile, for decode and prefill alike (matmul_x8_avx512).
//   * matmul_f_avx512 (f32 accumulation of exactly dequantized weights):
//     F32, F16, BF16 in both modes, Q8/Q4 in Reference mode.
//       decode:  one row at a time (one sequential stream, prefetched), 2
//                partial sums;
//       prefill: K blocks of 1024; a 4-row tile is dequantized once into an
//                L1 buffer (the next tile's W prefetched into L2 meanwhile)
//                and 4 x rows at a time run over it, x rows in blocks of up
//                to 512 KiB (L2; each block re-reads W).
//
// Canonical summation order (batch invariance): an output never depends on
// n, on the tile it landed in or on the thread count, so every tile shape
// below follows one order per output, for this family:
//   integer: quads q = 0, 1, ... in order; per quad the exact int32 dot
//     lanes t are converted and acc = fma(float(t), dw * dx, acc) in 16
//     lanes (lane 4j + i belongs to block j of the quad; missing blocks of
//     the last quad are zero and add +0); the output is hsum16(acc).
//   f32: per K block of kFKBlock values, 16-float vector v = k / 16 goes
//     into partial sum (v / 4) % 2 (chunks of 4 vectors alternate), in
//     increasing v; the partials are added (p0 + p1) and reduced by hsum16;
//     the scalar tail k >= 16 * (len / 16) (only in the last block) is a
//     chain of FMAs from 0 added last. Block sums are added to y in K order.
//   hsum16(v): the 256-bit halves added, then 128-bit halves, then
//     ((l0 + l2) + (l1 + l3)).
// This order differs from the AVX2 family's, so results are bit-identical
// within a family, not across families. tests/ops check this bit for bit.
// GCC 12's AVX-512 headers pass _mm512_undefined_*() (a self-initialised
// variable) as the unused merge source of most intrinsics, which trips
// -Wuninitialized once inlined (GCC bug 105593, fixed in GCC 13). The
// warning points into the header, so silencing it there keeps it for this
// file's own code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm_kernels.h"
#include "quant/quant.h"

namespace llm::cpu::kern {

namespace {

// Loops over the tile's rows/columns must be fully unrolled so accumulators
// stay in registers, whatever the optimisation level (-O2 keeps them rolled).
#define LLM_UNROLL _Pragma("GCC unroll 16")

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m512i load512(const uint8_t* p) { return _mm512_loadu_si512(p); }

inline float fmadd1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hsum16(__m512 v) {
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// Prefetches the N bytes at p (a later tile, decode only).
template <int N>
inline void prefetch_span(const uint8_t* p) {
  LLM_UNROLL for (int i = 0; i < N; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Decode streams W from memory: a 4-row tile is only a few KiB, too short for
// the hardware prefetcher to ramp up on each of its row streams, so the
// kernels prefetch kPrefetchBytes ahead linearly as they go.
constexpr size_t kPrefetchBytes = 8192;

// ---------------------------------------------------------------------------
// Activation quantization into the quad layout (gemm_kernels.h). q and d are
// those of quantize_x_scalar bit for bit: same amax, same scalar d = amax /
// 127 and id = 1 / d, x * id rounded to nearest even (vcvtps2dq under the
// default MXCSR == nearbyint); |q| <= 127, so the saturating narrowing
// vpmovsdb never saturates.

void quantize_row_quads(const float* x, int64_t cols, uint8_t* out, int shift) {
  const int64_t nb = cols / 32, nq = quad_count(cols);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t q = 0; q < nq; ++q) {
    uint8_t* o = out + q * kQuadBytes;
    alignas(64) float dx[16];
    LLM_UNROLL for (int j = 0; j < 4; ++j) {
      const int64_t b = 4 * q + j;
      __m128i q0 = _mm_setzero_si128(), q1 = _mm_setzero_si128();
      float d = 0.0f;
      if (b < nb) {
        const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        d = amax / 127.0f;
        const __m512 vid = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)));
        q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid)));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * j), q0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 64 + 16 * j), q1);
      LLM_UNROLL for (int i = 0; i < 4; ++i) dx[4 * j + i] = d;
    }
    // Lane sums of exactly the bytes each int32 lane of vpdpbusd will see.
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, load512(o));
    s = _mm512_dpbusd_epi32(s, ones, load512(o + 64));
    const __m512i corr = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, unsigned(shift)));
    _mm512_storeu_si512(o + 128, corr);
    _mm512_storeu_ps(reinterpret_cast<float*>(o + 192), _mm512_load_ps(dx));
  }
}

// ---------------------------------------------------------------------------
// Integer tiles. G == 0 is Q8 (34-byte blocks of 32 int8), else Q4 group G.

template <int G>
struct QQuad {
  static constexpr int BB = G == 0 ? 34 : 2 + G / 2;  // bytes per weight group
  static constexpr int GPQ = G == 0 ? 4 : 128 / G;    // weight groups per quad
  static constexpr int QB = BB * GPQ;                 // bytes of one row's quad
  static constexpr int BPG = G == 0 ? 1 : G / 32;     // activation blocks per group
};

// The f16 scales of the 4 groups at p, BB apart, as 16-bit elements 0..3:
// vpinsrw straight from memory, 4 instructions where assembling them in a
// general-purpose register took 11 (decode is close to compute-bound).
template <int BB>
inline __m128i scales4(const uint8_t* p) {
  __m128i h = _mm_cvtsi32_si128(load_u16(p));
  h = _mm_insert_epi16(h, load_u16(p + BB), 1);
  h = _mm_insert_epi16(h, load_u16(p + 2 * BB), 2);
  return _mm_insert_epi16(h, load_u16(p + 3 * BB), 3);
}

// One row's quad at p in the x quad layout: a = the unsigned bytes meeting
// values 0..15 of blocks 0..3, b = values 16..31; dw = the 16 lane scales.
//
// Q4 g32: block j's 16 bytes hold values 0..15 (low nibbles) and 16..31
//   (high): a = the four blocks' bytes & 15, b = >> 4.
// Q4 g64: group A = blocks 0, 1 (value j low nibble of byte j, value j + 32
//   high), group B = blocks 2, 3. With V = [A0..15 | A16..31 | B0..15 |
//   B16..31] (128-bit lanes), a = [A0..15 lo | A0..15 hi | B0..15 lo |
//   B0..15 hi]: a lane shuffle, then a per-lane shift of 0 or 4.
// Q4 g128: one group of 64 bytes, value j + 64 in the high nibble of byte
//   j; blocks 0..3 = lo(0..31), lo(32..63), hi(0..31), hi(32..63), so a =
//   lanes [0, 2, 0, 2] shifted [0, 0, 4, 4], b = lanes [1, 3, 1, 3].
// Q8: 16-byte halves of the 4 blocks, XOR 0x80 (w + 128 as unsigned).
template <int G>
inline void w_quad(const uint8_t* p, __m512i& a, __m512i& b, __m512& dw) {
  constexpr int BB = QQuad<G>::BB;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m128i h4;  // the f16 scale of block j in 16-bit element j
  if constexpr (G == 0) {
    // Whole 32-byte blocks, two per register, then 64-bit lane shuffles into
    // the quad layout: 4 shuffles, against 6 for 16-byte inserts.
    const __m512i w01 = _mm512_inserti64x4(_mm512_castsi256_si512(load256(p + 2)), load256(p + BB + 2), 1);
    const __m512i w23 =
        _mm512_inserti64x4(_mm512_castsi256_si512(load256(p + 2 * BB + 2)), load256(p + 3 * BB + 2), 1);
    const __m512i lo = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);
    const __m512i hi = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    a = _mm512_xor_si512(_mm512_permutex2var_epi64(w01, lo, w23), bias);
    b = _mm512_xor_si512(_mm512_permutex2var_epi64(w01, hi, w23), bias);
    h4 = scales4<BB>(p);
  } else if constexpr (G == 32) {
    __m512i v0 = _mm512_castsi128_si512(load128(p + 2));
    v0 = _mm512_inserti32x4(v0, load128(p + BB + 2), 1);
    v0 = _mm512_inserti32x4(v0, load128(p + 2 * BB + 2), 2);
    v0 = _mm512_inserti32x4(v0, load128(p + 3 * BB + 2), 3);
    a = _mm512_and_si512(v0, m4);
    b = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
    h4 = scales4<BB>(p);
  } else if constexpr (G == 64) {
    __m512i v = _mm512_castsi256_si512(load256(p + 2));
    v = _mm512_inserti64x4(v, load256(p + BB + 2), 1);
    const __m512i sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    a = _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(v, v, 0xA0), sh), m4);
    b = _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(v, v, 0xF5), sh), m4);
    const uint64_t da = load_u16(p), db = load_u16(p + BB);
    h4 = _mm_cvtsi64_si128(int64_t(da | da << 16 | db << 32 | db << 48));
  } else {
    static_assert(G == 128, "Q4 groups are 32, 64 or 128");
    const __m512i v = load512(p + 2);
    const __m512i sh = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
    a = _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(v, v, 0x88), sh), m4);
    b = _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(v, v, 0xDD), sh), m4);
    h4 = _mm_set1_epi16(static_cast<short>(load_u16(p)));
  }
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  dw = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h4)));
}

// R W rows at w (byte stride rb) x C x rows at xq (byte stride xs) over all
// quads of the row: nqf full quads, then a last quad of tail_bytes weight
// bytes (fewer than 4 blocks; 0: none), zero-padded through a stack copy so
// that no load reads past the row. Writes y[c * ys + r].
template <int G, int R, int C>
void q_tile(const uint8_t* w, size_t rb, int64_t nqf, int tail_bytes, const uint8_t* xq,
            int64_t xs, float* y, int64_t ys, const uint8_t* pf) {
  constexpr int QB = QQuad<G>::QB;
  __m512 acc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  // Q8 decode (C == 1, pf set): the next tile's bytes for this quad step are
  // prefetched a row's share (QB) at a time, each just before that row's
  // quad, rather than all at the top of the step: a burst of prefetches per
  // step measured slower from DRAM (the loop itself runs ~3x faster than
  // DRAM from L2/L3, so how the misses are issued is what counts).
  const uint8_t* step_pf = nullptr;
  auto quad = [&](const uint8_t* const* wp, const uint8_t* xp) {
    if constexpr (C == 1) {
      // One W row at a time: its a, b, dw die after its two dpbusd, so
      // R = 8 decode tiles stay in registers.
      const __m512i xa = load512(xp), xb = load512(xp + 64);
      const __m512i corr = load512(xp + 128);
      const __m512 dx = _mm512_loadu_ps(reinterpret_cast<const float*>(xp + 192));
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        if (step_pf) prefetch_span<QB + 63>(step_pf + r * QB);
        __m512i a, b;
        __m512 dw;
        w_quad<G>(wp[r], a, b, dw);
        __m512i t = _mm512_dpbusd_epi32(corr, a, xa);
        t = _mm512_dpbusd_epi32(t, b, xb);
        acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, dx), acc[r][0]);
      }
      return;
    }
    __m512i a[R], b[R];
    __m512 dw[R];
    LLM_UNROLL for (int r = 0; r < R; ++r) w_quad<G>(wp[r], a[r], b[r], dw[r]);
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const uint8_t* xc = xp + c * xs;
      const __m512i xa = load512(xc), xb = load512(xc + 64);
      const __m512i corr = load512(xc + 128);
      const __m512 dx = _mm512_loadu_ps(reinterpret_cast<const float*>(xc + 192));
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        __m512i t = _mm512_dpbusd_epi32(corr, a[r], xa);
        t = _mm512_dpbusd_epi32(t, b[r], xb);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw[r], dx), acc[r][c]);
      }
    }
  };
  for (int64_t q = 0; q < nqf; ++q) {
    if (G == 0 && C == 1 && pf)
      step_pf = pf + q * R * QB;
    else if (pf)
      prefetch_span<R * QB + 63>(pf + q * R * QB);
    const uint8_t* wp[R];
    LLM_UNROLL for (int r = 0; r < R; ++r) wp[r] = w + r * rb + q * QB;
    quad(wp, xq + q * kQuadBytes);
  }
  if (tail_bytes > 0) {
    alignas(64) uint8_t tb[R][QB];
    const uint8_t* wp[R];
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      std::memset(tb[r], 0, QB);
      std::memcpy(tb[r], w + r * rb + nqf * QB, size_t(tail_bytes));
      wp[r] = tb[r];
    }
    step_pf = nullptr;
    quad(wp, xq + nqf * kQuadBytes);
  }
  LLM_UNROLL for (int c = 0; c < C; ++c)
    LLM_UNROLL for (int r = 0; r < R; ++r) y[c * ys + r] = hsum16(acc[r][c]);
}

// x rows per integer tile when n > 1: 16 accumulators, 8 W registers and
// the x operands as memory operands just fit the 32 zmm registers.
constexpr int kQCols = 4;

// x rows per L2 block (prefill): every 4-row W tile passes over a block of
// x rows before the next block, so x comes from L2 rather than L3.
constexpr int64_t kXBlockBytes = 384 << 10;

// Decode (n == 1): the R rows at wr, the next tiles prefetched as it goes.
template <int G, int R>
void q_gemv_rows(const WeightView& w, const uint8_t* wr, const uint8_t* xq, float* y) {
  constexpr int BB = QQuad<G>::BB, BPG = QQuad<G>::BPG;
  const int64_t nb = w.cols / 32;
  const size_t span = R * w.row_bytes;
  const size_t ahead = std::max<size_t>(1, (kPrefetchBytes + span - 1) / span) * span;
  q_tile<G, R, 1>(wr, w.row_bytes, nb / 4, int((nb % 4) / BPG) * BB, xq, 0, y, w.rows, wr + ahead);
}

// Batched decode (llm_decode_batch: a few x rows, one per session) is still
// bound by reading W from DRAM, like n == 1: up to this many x rows the
// first column tile prefetches kPrefetchBytes ahead as decode does, instead
// of just the next tile (prefill, where W tiles take long enough to compute
// that one tile ahead hides the latency). Only a hint: no output changes.
constexpr int64_t kSmallBatch = 16;

template <int G, int R>
void q_rows(const WeightView& w, const uint8_t* wr, const uint8_t* xq, int64_t xs, int64_t n,
            float* y) {
  constexpr int BB = QQuad<G>::BB, BPG = QQuad<G>::BPG;
  const int64_t nb = w.cols / 32;
  const int64_t nqf = nb / 4;
  const int tail_bytes = int((nb % 4) / BPG) * BB;
  if (n == 1) {
    q_gemv_rows<G, R>(w, wr, xq, y);
    return;
  }
  // Prefill: the first x rows' tile also prefetches the next W tile (the
  // R * row_bytes right after this one), which the later tiles of this one
  // do not need: they find W in L1.
  const size_t span = R * w.row_bytes;
  const uint8_t* pf =
      wr + (n <= kSmallBatch ? std::max<size_t>(1, (kPrefetchBytes + span - 1) / span) * span : span);
  int64_t c0 = 0;
  for (; c0 + kQCols <= n; c0 += kQCols)
    q_tile<G, R, kQCols>(wr, w.row_bytes, nqf, tail_bytes, xq + c0 * xs, xs, y + c0 * w.rows,
                         w.rows, c0 == 0 ? pf : nullptr);
  const uint8_t* rest_pf = c0 == 0 ? pf : nullptr;
  switch (n - c0) {
    case 3:
      q_tile<G, R, 3>(wr, w.row_bytes, nqf, tail_bytes, xq + c0 * xs, xs, y + c0 * w.rows, w.rows,
                      rest_pf);
      break;
    case 2:
      q_tile<G, R, 2>(wr, w.row_bytes, nqf, tail_bytes, xq + c0 * xs, xs, y + c0 * w.rows, w.rows,
                      rest_pf);
      break;
    case 1:
      q_tile<G, R, 1>(wr, w.row_bytes, nqf, tail_bytes, xq + c0 * xs, xs, y + c0 * w.rows, w.rows,
                      rest_pf);
      break;
    default: break;
  }
}

// Q8 decode takes 8 W rows per tile where it can: 8 row streams (and the
// next 8-row tile prefetched) read DRAM faster than 4 on this machine. Every
// output keeps its own accumulator and its ops, so the tile height does not
// change any result (batch invariance).
constexpr int64_t kQ8DecodeRows = 8;

template <int G>
void q_matmul(const WeightView& w, const uint8_t* xq, int64_t n, float* y, int64_t r0,
              int64_t r1) {
  if constexpr (G == 0) {
    if (n == 1)
      for (; r0 + kQ8DecodeRows <= r1; r0 += kQ8DecodeRows)
        q_gemv_rows<G, kQ8DecodeRows>(w, w.data + size_t(r0) * w.row_bytes, xq, y + r0);
  }
  const int64_t xs = quad_count(w.cols) * kQuadBytes;
  const int64_t xblock = std::max<int64_t>(kQCols, kXBlockBytes / xs / kQCols * kQCols);
  for (int64_t c0 = 0; c0 < n; c0 += xblock) {
    const int64_t nc = std::min(xblock, n - c0);
    const uint8_t* xc = xq + c0 * xs;
    float* yc = y + c0 * w.rows;
    for (int64_t r = r0; r < r1; r += kRowTile) {
      const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
      switch (std::min<int64_t>(kRowTile, r1 - r)) {
        case 4: q_rows<G, 4>(w, wr, xc, xs, nc, yc + r); break;
        case 3: q_rows<G, 3>(w, wr, xc, xs, nc, yc + r); break;
        case 2: q_rows<G, 2>(w, wr, xc, xs, nc, yc + r); break;
        default: q_rows<G, 1>(w, wr, xc, xs, nc, yc + r); break;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// f32 tiles: W rows come through a loader that turns 16 stored values at
// element k into 16 floats (exact conversions).

struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m512 load16(const uint8_t* row, int64_t k) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
  static float load1(const uint8_t* row, int64_t k) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
};

struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m512 load16(const uint8_t* row, int64_t k) { return _mm512_cvtph_ps(load256(row + 2 * k)); }
  static float load1(const uint8_t* row, int64_t k) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(row + 2 * k))));
  }
};

struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m512 load16(const uint8_t* row, int64_t k) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(row + 2 * k)), 16));
  }
  static float load1(const uint8_t* row, int64_t k) {
    const uint32_t u = uint32_t(load_u16(row + 2 * k)) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }
};

// The f32 order (top of the file): 16-float vector v of a K block goes into
// partial (v / kFChunk) % 2. Chunks of 4 vectors keep W a single sequential
// stream per row (decode) while two independent chains per output hide the
// FMA latency; every tile keeps both partials in registers, so prefill also
// walks its tile once, sequentially.
constexpr int kFChunk = 4;

// R W rows (byte stride ws, loader L) x C x rows (float stride xs), k in
// [0, len). pf_ahead > 0 (decode): prefetch that many bytes past the W
// vectors as they are read.
template <class L, int R, int C>
void f_tile(const uint8_t* w, size_t ws, const float* x, int64_t xs, int64_t len, float* y,
            int64_t ys, bool accumulate, int64_t pf_ahead = 0) {
  const int64_t nv = len / 16;
  __m512 p0[R][C], p1[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r) {
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      p0[r][c] = _mm512_setzero_ps();
      p1[r][c] = _mm512_setzero_ps();
    }
  }
  auto step = [&](int64_t v, __m512 (&acc)[R][C]) {
    const int64_t k = 16 * v;
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const __m512 wv = L::load16(w + r * ws, k);
      LLM_UNROLL for (int c = 0; c < C; ++c)
        acc[r][c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + c * xs + k), acc[r][c]);
    }
  };
  if constexpr (R * C * 2 <= 16) {
    // Decode-sized tiles: both partials in registers, one pass.
    int64_t v = 0;
    for (; v + 2 * kFChunk <= nv; v += 2 * kFChunk) {
      if (pf_ahead > 0) {
        // 2 * kFChunk vectors = 2 (f16) or 4 (f32) cache lines per row.
        LLM_UNROLL for (int r = 0; r < R; ++r)
          LLM_UNROLL for (int i = 0; i < 2 * kFChunk * 16 * L::kBytes; i += 64)
            _mm_prefetch(reinterpret_cast<const char*>(w + r * ws + 16 * v * L::kBytes + i + pf_ahead),
                         _MM_HINT_T0);
      }
      LLM_UNROLL for (int j = 0; j < kFChunk; ++j) step(v + j, p0);
      LLM_UNROLL for (int j = 0; j < kFChunk; ++j) step(v + kFChunk + j, p1);
    }
    for (; v < nv; ++v) {
      if ((v / kFChunk) % 2 == 0)
        step(v, p0);
      else
        step(v, p1);
    }
  } else {
    // Prefill tiles: no registers for two sets of accumulators; sum the
    // even chunks, then the odd ones (runs of kFChunk lines in L1).
    auto pass = [&](int64_t first, __m512 (&acc)[R][C]) {
      int64_t v0 = first;
      for (; v0 + kFChunk <= nv; v0 += 2 * kFChunk)
        LLM_UNROLL for (int j = 0; j < kFChunk; ++j) step(v0 + j, acc);
      for (int64_t v = v0; v < nv; ++v) step(v, acc);  // partial last chunk
    };
    pass(0, p0);
    pass(kFChunk, p1);
  }
  float tail[R][C] = {};
  for (int64_t k = 16 * nv; k < len; ++k) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const float wk = L::load1(w + r * ws, k);
      // Explicit FMA: left to the compiler, a*b+c may or may not be contracted
      // depending on the instantiation, which would break batch invariance.
      LLM_UNROLL for (int c = 0; c < C; ++c) tail[r][c] = fmadd1(wk, x[c * xs + k], tail[r][c]);
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c) {
    float* yc = y + c * ys;
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const float s = hsum16(_mm512_add_ps(p0[r][c], p1[r][c])) + tail[r][c];
      yc[r] = accumulate ? yc[r] + s : s;
    }
  }
}

// K block of the f32 path: a 4-row tile of dequantized W (4 x 1024 floats =
// 16 KiB) stays in L1 while the x rows stream past it. A multiple of 128 so
// quantized groups never straddle blocks, and of 16 so only the last block
// has a scalar tail.
constexpr int64_t kFKBlock = 1024;

// x rows per L2 block on the f32 path. Each block re-reads (and re-converts)
// W, but a block that fills L2 leaves no room for the W prefetches and the
// tile buffer: 512 KiB (128 rows of 1024) measured
// ahead of 384 KiB and 768 KiB on f16 pp512 (1 thread).
constexpr int64_t kFXBlockBytes = 512 << 10;

// x rows per f32 tile when n > 1: 4 x 4 accumulators (one partial at a
// time) + 4 W vectors + 1 x; measured ahead of 4 x 3 with both partials
// in registers and of 4 x 6.
constexpr int kFCols = 4;

template <class L, int R>
void f_rows(const uint8_t* w, size_t ws, const float* x, int64_t xs, int64_t n, int64_t len,
            float* y, int64_t ys, bool accumulate) {
  int64_t c0 = 0;
  for (; c0 + kFCols <= n; c0 += kFCols)
    f_tile<L, R, kFCols>(w, ws, x + c0 * xs, xs, len, y + c0 * ys, ys, accumulate);
  const float* xc = x + c0 * xs;
  float* yc = y + c0 * ys;
  static_assert(kFCols == 4, "remainder cases below");
  switch (n - c0) {
    case 3: f_tile<L, R, 3>(w, ws, xc, xs, len, yc, ys, accumulate); break;
    case 2: f_tile<L, R, 2>(w, ws, xc, xs, len, yc, ys, accumulate); break;
    case 1: f_tile<L, R, 1>(w, ws, xc, xs, len, yc, ys, accumulate); break;
    default: break;
  }
}

template <class L>
void f_rows_any(int64_t nr, const uint8_t* w, size_t ws, const float* x, int64_t xs, int64_t n,
                int64_t len, float* y, int64_t ys, bool accumulate) {
  switch (nr) {
    case 4: f_rows<L, 4>(w, ws, x, xs, n, len, y, ys, accumulate); break;
    case 3: f_rows<L, 3>(w, ws, x, xs, n, len, y, ys, accumulate); break;
    case 2: f_rows<L, 2>(w, ws, x, xs, n, len, y, ys, accumulate); break;
    case 1: f_rows<L, 1>(w, ws, x, xs, n, len, y, ys, accumulate); break;
    default: break;
  }
}

// Decode (n == 1) for F32/F16/BF16: kGemvRows rows at a time, so kGemvRows x
// kFSets independent FMA chains hide the FMA latency while W streams in few
// sequential runs, converting in registers.
constexpr int kGemvRows = 1;

// Kept out of line: inlined into matmul_f_avx512, the same decode loop ran
// about 20% slower (BM_Gemv f16 2048 x 2048: 287 against 226-230 us, the
// loop's instructions unchanged) whenever the prefill code of that function
// grew; out of line it no longer depends on it.
template <class L, int R>
__attribute__((noinline)) void f_gemv_rows(const WeightView& w, const float* x, float* y, int64_t r, int64_t ahead) {
  const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
  // Same K blocks as the prefill path (matmul_f_avx512), for batch invariance.
  for (int64_t k0 = 0; k0 < w.cols; k0 += kFKBlock) {
    f_tile<L, R, 1>(wr + k0 * L::kBytes, w.row_bytes, x + k0, w.cols,
                    std::min(kFKBlock, w.cols - k0), y + r, w.rows, k0 > 0, ahead);
  }
}

template <class L>
void f_gemv(const WeightView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t span = kGemvRows * int64_t(w.row_bytes);
  const int64_t ahead = std::max<int64_t>(1, (int64_t(kPrefetchBytes) + span - 1) / span) * span;
  int64_t r = r0;
  for (; r + kGemvRows <= r1; r += kGemvRows) f_gemv_rows<L, kGemvRows>(w, x, y, r, ahead);
  for (; r < r1; ++r) f_gemv_rows<L, 1>(w, x, y, r, ahead);
}

// Up to this many x rows. Measured (f16 5632 x 2048, 2 threads, a loaded
// machine): 2 rows 5.8-7.0 ms against 12.3 on the prefill path, 4 rows 7.3-8.0
// against 15.4, 8 rows 14.5-16.4 against 20.4; at 16 the prefill tiles (4 W
// rows share each x load) are as fast or faster.
constexpr int64_t kFSmallBatch = 8;

// Batched decode (2 <= n <= kFSmallBatch) of an unquantized type: as decode,
// one W row at a time streamed from memory (prefetched ahead) and converted
// in registers, run against kFCols x rows at a time while the row sits in
// L1. The prefill loop nest instead converts W into a buffer and prefetches
// one tile ahead, which a few rows cannot hide. f_tile gives every output
// the same order whatever its C (the canonical order above).
template <class L, int C>
void f_batch_cols(const WeightView& w, const uint8_t* wr, const float* x, float* y, int64_t pf_ahead) {
  for (int64_t k0 = 0; k0 < w.cols; k0 += kFKBlock)
    f_tile<L, 1, C>(wr + k0 * L::kBytes, w.row_bytes, x + k0, w.cols, std::min(kFKBlock, w.cols - k0), y, w.rows,
                    k0 > 0, pf_ahead);
}

template <class L>
__attribute__((noinline)) void f_gemv_batch(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                                            int64_t r1) {
  const int64_t span = int64_t(w.row_bytes);
  const int64_t ahead = std::max<int64_t>(1, (int64_t(kPrefetchBytes) + span - 1) / span) * span;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    for (int64_t c0 = 0; c0 < n; c0 += kFCols) {
      const float* xc = x + c0 * w.cols;
      float* yc = y + c0 * w.rows + r;
      const int64_t pf = c0 == 0 ? ahead : 0;  // the later groups find the row in L1
      switch (std::min<int64_t>(kFCols, n - c0)) {
        case 4: f_batch_cols<L, 4>(w, wr, xc, yc, pf); break;
        case 3: f_batch_cols<L, 3>(w, wr, xc, yc, pf); break;
        case 2: f_batch_cols<L, 2>(w, wr, xc, yc, pf); break;
        default: f_batch_cols<L, 1>(w, wr, xc, yc, pf); break;
      }
    }
  }
}

// Dequantizes values [k0, k0 + len) of one stored row into dst (exactly the
// values dequantize_row gives: d * q rounded once). For Q types k0 and len
// are multiples of the group.
void dequant_segment(const WeightView& w, const uint8_t* row, int64_t k0, int64_t len,
                     float* dst) {
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(dst, row + 4 * k0, size_t(len) * 4);
      return;
    case DType::F16:
    case DType::BF16: {
      int64_t k = 0;
      if (w.dtype == DType::F16) {
        for (; k + 16 <= len; k += 16) _mm512_storeu_ps(dst + k, LoadF16::load16(row, k0 + k));
        for (; k < len; ++k) dst[k] = LoadF16::load1(row, k0 + k);
      } else {
        for (; k + 16 <= len; k += 16) _mm512_storeu_ps(dst + k, LoadBF16::load16(row, k0 + k));
        for (; k < len; ++k) dst[k] = LoadBF16::load1(row, k0 + k);
      }
      return;
    }
    case DType::Q8: {
      for (int64_t b = k0 / 32; b < (k0 + len) / 32; ++b) {
        const uint8_t* blk = row + b * 34;
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(load_u16(blk))));
        float* out = dst + (b * 32 - k0);
        LLM_UNROLL for (int i = 0; i < 2; ++i) {
          const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load128(blk + 2 + 16 * i)));
          _mm512_storeu_ps(out + 16 * i, _mm512_mul_ps(d, q));
        }
      }
      return;
    }
    case DType::Q4: {
      const int64_t g = w.group, half = g / 2, gb = 2 + half;
      const __m512i m4 = _mm512_set1_epi32(0x0f);
      const __m512i eight = _mm512_set1_epi32(8);
      for (int64_t b = k0 / g; b < (k0 + len) / g; ++b) {
        const uint8_t* blk = row + b * gb;
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(load_u16(blk))));
        float* out = dst + (b * g - k0);
        for (int64_t j = 0; j < half; j += 16) {
          const __m512i v = _mm512_cvtepu8_epi32(load128(blk + 2 + j));
          const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(v, m4), eight);
          const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(v, 4), eight);
          _mm512_storeu_ps(out + j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
          _mm512_storeu_ps(out + half + j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
        }
      }
      return;
    }
    case DType::Q4M: {
      // Not reached today: matmul() keeps Q4M on the AVX2 family, which has
      // its integer kernels. The reference decoder itself (quant.cpp, built
      // without -mfma, so nibble * d + m stays a multiply then an add).
      const int64_t g = w.group;
      llm::dequantize_row(DType::Q4M, w.group, row + (k0 / g) * (4 + g / 2), dst, len);
      return;
    }
    default:
      // GGUF blocks (Reference mode): ggml's own decoders, bit for bit. k0
      // and len are whole blocks (kFKBlock is a multiple of 256).
      llm::dequantize_row(w.dtype, w.group, row + size_t(k0 / w.group) * ggml_block_bytes(w.dtype), dst, len);
      return;
  }
}

// X8 (matmul.h): the AVX2 kernel's lane per row (matmul_avx2.cpp) on
// 512-bit registers, two 8-row groups at a time (lanes 0-7: the group at ga,
// 8-15: the one at gb), with vpdpbusd taking the int32 dot in place of
// vpmaddubsw, the int16 sums and vpmaddwd. Each broadcast x dword meets 16
// rows; with 32 registers a tile holds 8 x rows (x in the layout of
// pack_x8_x). Two chains of 4 dot steps per x row: Q4 the low and the high
// nibbles (-8 * s_x comes off at the end); Q8 the even and the odd steps of
// w XOR 0x80 = w + 128 (vpdpbusd wants one unsigned operand; -128 * s_x
// comes off). The integer dot is the same exact number and the float steps
// the same operations, so the bits are the AVX2 kernel's and the portable
// one's.
inline __m512i load_pair(const uint8_t* pa, const uint8_t* pb) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb)), 1);
}

template <DType T, int C, bool Prefetch>
inline void x16_blocks(const uint8_t* ga, const uint8_t* gb, int64_t b0, int64_t b1, const int8_t* xq,
                       const float* xd, const float* xs, __m512 (&acc)[C]) {
  constexpr size_t kBlock = x8_block_bytes(T);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  const __m512 offset = _mm512_set1_ps(T == DType::Q4 ? 8.0f : 128.0f);
  auto xword = [](const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  };
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* pa = ga + size_t(b) * kBlock;
    const uint8_t* pb = gb + size_t(b) * kBlock;
    if constexpr (Prefetch) {
      prefetch_span<kBlock>(pa + kPrefetchBytes);
      prefetch_span<kBlock>(pb + kPrefetchBytes);
    }
    const int8_t* xb = xq + b * 32 * C;
    __m512i d0[C], d1[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) d0[c] = d1[c] = _mm512_setzero_si512();
    if constexpr (T == DType::Q4) {
      LLM_UNROLL for (int s = 0; s < 4; ++s) {
        const __m512i v = load_pair(pa + 16 + 32 * s, pb + 16 + 32 * s);
        const __m512i lo = _mm512_and_si512(v, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          d0[c] = _mm512_dpbusd_epi32(d0[c], lo, xword(xb + (s * C + c) * 4));
          d1[c] = _mm512_dpbusd_epi32(d1[c], hi, xword(xb + ((4 + s) * C + c) * 4));
        }
      }
    } else {
      LLM_UNROLL for (int k = 0; k < 8; ++k) {
        const __m512i u = _mm512_xor_si512(load_pair(pa + 16 + 32 * k, pb + 16 + 32 * k), flip);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          __m512i& d = k % 2 == 0 ? d0[c] : d1[c];
          d = _mm512_dpbusd_epi32(d, u, xword(xb + (k * C + c) * 4));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb)), 1));
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(d0[c], d1[c]));
      const __m512 v = _mm512_fnmadd_ps(_mm512_set1_ps(xs[b * C + c]), offset, sum);  // exact: integers below 2^24
      acc[c] = _mm512_fmadd_ps(v, _mm512_mul_ps(dw, _mm512_set1_ps(xd[b * C + c])), acc[c]);
    }
  }
}

// The AVX2 family's X8 loop nest on units of 16 rows: lanes outside [r0,
// r1) (a group shared with another thread, a missing second group) are
// masked off every load and store of y, where the running sums wait between
// K chunks.
template <DType T>
void x16_matmul(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  constexpr int kCols = kX8ColsAvx512;
  const int64_t nb = w.cols / 32, full = w.rows / 8 * 8;
  const int64_t kb = n >= 2 * kCols ? kX8KBlocks : nb;
  const bool tiles = x.tile == kCols;  // else every x row alone (same bits)
  for (int64_t u0 = r0 / 8 * 8; u0 < r1; u0 += 16) {
    const uint8_t* ga = w.data + size_t(u0) * w.row_bytes;
    const uint8_t* gb = u0 + 8 < full ? ga + 8 * w.row_bytes : ga;
    uint32_t bits = 0;
    for (int i = 0; i < 16; ++i) bits |= uint32_t(u0 + i >= r0 && u0 + i < r1) << i;
    const __mmask16 m = __mmask16(bits);
    for (int64_t b0 = 0; b0 < nb; b0 += kb) {
      const int64_t b1 = std::min(nb, b0 + kb);
      auto tile = [&](auto cols_tag, int64_t c0) {
        constexpr int C = decltype(cols_tag)::value;
        __m512 acc[C];
        LLM_UNROLL for (int c = 0; c < C; ++c)
          acc[c] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, y + (c0 + c) * w.rows + u0);
        const bool tiled = C > 1;
        const int8_t* xq = (tiled ? x.tq : x.q) + c0 * x.cols;
        const float* xd = (tiled ? x.td : x.d) + c0 * nb;
        const float* xs = (tiled ? x.ts : x.s) + c0 * nb;
        if (n <= kX8SmallBatch)
          x16_blocks<T, C, true>(ga, gb, b0, b1, xq, xd, xs, acc);
        else
          x16_blocks<T, C, false>(ga, gb, b0, b1, xq, xd, xs, acc);
        LLM_UNROLL for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + (c0 + c) * w.rows + u0, m, acc[c]);
      };
      int64_t c0 = 0;
      for (; tiles && c0 + kCols <= n; c0 += kCols) tile(std::integral_constant<int, kCols>{}, c0);
      for (; c0 < n; ++c0) tile(std::integral_constant<int, 1>{}, c0);
    }
  }
}

}  // namespace

void matmul_x8_avx512(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (w.dtype == DType::Q8)
    x16_matmul<DType::Q8>(w, x, n, y, r0, r1);
  else
    x16_matmul<DType::Q4>(w, x, n, y, r0, r1);
}

void quantize_x_avx512(const float* x, int64_t n, int64_t cols, uint8_t* out, bool q8) {
  const int64_t xs = quad_count(cols) * kQuadBytes;
  for (int64_t i = 0; i < n; ++i) quantize_row_quads(x + i * cols, cols, out + i * xs, q8 ? 7 : 3);
}

void matmul_q_avx512(const WeightView& w, const uint8_t* xq, int64_t n, float* y, int64_t r0,
                     int64_t r1) {
  if (w.dtype == DType::Q8) {
    q_matmul<0>(w, xq, n, y, r0, r1);
  } else if (w.group == 32) {
    q_matmul<32>(w, xq, n, y, r0, r1);
  } else if (w.group == 64) {
    q_matmul<64>(w, xq, n, y, r0, r1);
  } else {
    q_matmul<128>(w, xq, n, y, r0, r1);
  }
}

void matmul_f_avx512(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                     int64_t r1) {
  // Decode of an unquantized type: stream W once, converting in registers.
  if (n == 1 && !dtype_is_quantized(w.dtype)) {
    switch (w.dtype) {
      case DType::F16: f_gemv<LoadF16>(w, x, y, r0, r1); break;
      case DType::BF16: f_gemv<LoadBF16>(w, x, y, r0, r1); break;
      default: f_gemv<LoadF32>(w, x, y, r0, r1); break;
    }
    return;
  }
  if (n <= kFSmallBatch && !dtype_is_quantized(w.dtype)) {  // batched decode
    switch (w.dtype) {
      case DType::F16: f_gemv_batch<LoadF16>(w, x, n, y, r0, r1); break;
      case DType::BF16: f_gemv_batch<LoadBF16>(w, x, n, y, r0, r1); break;
      default: f_gemv_batch<LoadF32>(w, x, n, y, r0, r1); break;
    }
    return;
  }
  // Otherwise the shared blocked loop (gemm_kernels.h) over this family's tiles.
  f_prefill_blocked<kFKBlock, kFCols, kFXBlockBytes>(
      w, x, n, y, r0, r1,
      [&](const uint8_t* row, int64_t k0, int64_t len, float* dst) { dequant_segment(w, row, k0, len, dst); },
      [&](int64_t nr, const uint8_t* wt, size_t ws, const float* xb, int64_t nc, int64_t len, float* yb,
          bool accumulate) { f_rows_any<LoadF32>(nr, wt, ws, xb, w.cols, nc, len, yb, w.rows, accumulate); });
}

}  // namespace llm::cpu::kern

#undef LLM_UNROLL
