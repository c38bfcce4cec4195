// AVX2 + FMA + F16C matmul kernels. Compiled with -mavx2 -mfma -mf16c and
// only entered after use_avx2_kernels() (cpu_features.h) said yes.
//
// Two families, both on register tiles of R <= 4 W rows x C x rows in
// dot-product form (8 lanes along k, one horizontal sum per output):
//   * matmul_q_avx2 (Fast mode, Q8/Q4): activations quantized to int8 blocks
//     of 32; each (W block, x block) pair is an integer dot (vpmaddubsw +
//     vpmaddwd), converted and FMA'd with the scale d_w * d_x.
//       decode  (n == 1): 4-row tiles, the next tiles software-prefetched
//                         (~7 vector ops per 32-value block and row);
//       prefill (n > 1):  4 W rows x 4 x rows per tile; the W tile stays in
//                         L1 while all x rows pass, so W is read once.
//     Q4 group 32 and Q8 in the X8 layout (matmul.h; made at load) take
//     their own kernels, one row per 32-bit lane, for decode and prefill
//     alike (matmul_x8_avx2).
//   * matmul_f_avx2 (f32 accumulation of exactly dequantized weights): F32,
//     F16, BF16 in both modes, Q8/Q4 in Reference mode.
//       decode:  one row at a time (one sequential stream), 4 partial sums;
//       prefill: K blocks of 1024; a 4-row tile is dequantized once into an
//                L1 buffer and 3 x rows at a time run over it.
//
// Batch invariance: an output never depends on n, on the tile it landed in or
// on the thread count (a token's logits and K/V are the same decoded alone or
// inside a prefill batch). The integer kernels give every (row, x row) pair
// the same sequence of operations in every tile shape; the f32 kernels fix
// one summation order (see f_tile). tests/ops check this bit for bit.
#include <immintrin.h>

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

// The f16 at p, converted and broadcast to 8 lanes.
inline __m256 f16_broadcast(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(p))));
}

inline float fmadd1(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Writes the R x C tile sums hsum(acc[r][c]) + tail[r][c] to y[c][r] (row
// stride ys), adding to y when accumulating. Every kernel reduces with the
// same hsum whatever the tile shape, so an output does not depend on how
// rows were grouped (batch invariance).
template <int R, int C>
inline void store_tile(__m256 (&acc)[R][C], const float (&tail)[R][C], float* y, int64_t ys,
                       bool accumulate) {
  LLM_UNROLL for (int c = 0; c < C; ++c) {
    float* yc = y + c * ys;
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const float v = hsum(acc[r][c]) + tail[r][c];
      yc[r] = accumulate ? yc[r] + v : v;
    }
  }
}

// ---------------------------------------------------------------------------
// Activation quantization. Must match quantize_x_scalar bit for bit: same
// amax, same scalar d = amax / 127 and id = 1 / d, x * id rounded to nearest
// even (vcvtps2dq under the default MXCSR == nearbyint).

void quantize_block(const float* x, int8_t* q, float* d, float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 m = _mm256_setzero_ps();
  LLM_UNROLL for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  *d = dd;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i i32[4];
  LLM_UNROLL for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
  // packs work per 128-bit lane: the bytes come out in 32-bit groups ordered
  // 0 2 4 6 1 3 5 7; one dword permute restores 0..7.
  const __m256i p01 = _mm256_packs_epi32(i32[0], i32[1]);
  const __m256i p23 = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i p = _mm256_packs_epi16(p01, p23);
  const __m256i fixed = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), fixed);
  // Sum of the 32 int8 values (exact in f32): |sum| <= 32 * 127.
  const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), fixed);
  const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
  *sum = float(_mm_cvtsi128_si32(t));
}

// ---------------------------------------------------------------------------
// Integer tiles: Q8 and Q4 weights against activations quantized to int8
// blocks of 32. W rows r = 0..R-1 at w + r * rb, x rows c = 0..C-1.
//
// Per (W row, x row, 32-value block) the inner loop does the integer dot
// (vpmaddubsw + vpmaddwd), one conversion and one FMA with the block's scale
// d_w * d_x. Those scales are made 8 blocks at a time: the 8 f16 weight
// scales are gathered in a general-purpose register (no vector work, no
// store-to-load forwarding stall), converted with one vcvtph2ps, multiplied
// by 8 activation scales and parked in a small stack array the inner loop
// broadcasts from. Decode then costs ~7 vector ops per block and row.

// Layout constants: G == 0 is Q8 (34-byte blocks of 32 int8); M: Q4M (an
// f16 minimum after the scale).
template <int G, bool M = false>
struct QLayout {
  static constexpr int J = G == 0 ? 1 : G / 32;                  // activation blocks per weight group
  static constexpr int HB = M ? 4 : 2;                           // header bytes per weight group
  static constexpr int BB = G == 0 ? 34 : HB + G / 2;            // bytes per weight group
};

// The f16 scales of the 8 activation blocks starting at the group at p (a
// Q4 group's scale repeated J times), as 8 halves.
template <int G, bool M = false>
inline __m128i gather_scales8(const uint8_t* p) {
  constexpr int J = QLayout<G, M>::J, BB = QLayout<G, M>::BB, NG = 8 / J;
  uint64_t lo = 0, hi = 0;
  LLM_UNROLL for (int i = 0; i < NG && i < 4; ++i) lo |= uint64_t(load_u16(p + i * BB)) << (16 * i);
  LLM_UNROLL for (int i = 4; i < NG; ++i) hi |= uint64_t(load_u16(p + i * BB)) << (16 * (i - 4));
  if constexpr (J == 1) {
    return _mm_set_epi64x(int64_t(hi), int64_t(lo));
  } else if constexpr (J == 2) {
    const __m128i v = _mm_cvtsi64_si128(int64_t(lo));
    return _mm_unpacklo_epi16(v, v);
  } else {
    const __m128i v = _mm_unpacklo_epi16(_mm_cvtsi32_si128(int(lo)), _mm_cvtsi32_si128(int(lo)));
    return _mm_unpacklo_epi32(v, v);
  }
}

// Same for the last, partial chunk of m < 8 activation blocks (zero padded).
template <int G, bool M = false>
inline __m128i gather_scales_tail(const uint8_t* p, int64_t m) {
  constexpr int J = QLayout<G, M>::J, BB = QLayout<G, M>::BB;
  alignas(16) uint16_t h[8] = {};
  for (int64_t i = 0; i < m; ++i) h[i] = load_u16(p + (i / J) * BB);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(h));
}

// 8 floats from p, or the first m of them zero padded.
inline __m256 load8_tail(const float* p, int64_t m) {
  if (m == 8) return _mm256_loadu_ps(p);
  alignas(32) float t[8] = {};
  for (int64_t i = 0; i < m; ++i) t[i] = p[i];
  return _mm256_load_ps(t);
}

// Q4 group G: [f16 d][G/2 bytes]; byte j = value j (low nibble) | value
// j + G/2 (high nibble); value = d * (nibble - 8). Sub-block j (32 values)
// of a group: G = 32: low nibbles then high nibbles of the 16 bytes;
// G >= 64: low nibbles of 32-byte chunk j for j < G/64, else high nibbles of
// chunk j - G/64. Returned as unsigned 0..15.
template <int G>
inline __m256i q4_decode(const uint8_t* qs, int j) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  if constexpr (G == 32) {
    (void)j;
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
  } else {
    constexpr int H = G / 64;
    if (j < H) {
      return _mm256_and_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j)), m4);
    }
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j - H)));
    return _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  }
}

// Prefetches the N bytes at p (a later tile, decode only).
template <int N>
inline void prefetch_span(const uint8_t* p) {
  LLM_UNROLL for (int i = 0; i < N; i += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Q8 (G == 0): vpmaddubsw needs one unsigned operand: |w| with w's sign moved
// onto x. Q4: the nibbles 0..15 are the unsigned operand as they are (pairs
// stay within 2 * 15 * 127); the -8 offset comes off at the end as
// -8 * sum_b d_b * sum(x_q in block b), accumulated 8 blocks at a time.
// Q4M (M): the same nibble dots, and the minimum adds
// +sum_b m_b * d_x,b * sum(x_q in block b) in place of the -8 term.
//
// xq: [C][xcols] int8, xd/xs: [C][xcols/32] scales and block sums; y: [C][ys].
// pf: where to prefetch from (the tile kPrefetchBytes ahead) or null.
template <int G, bool M, int R, int C>
void q_tile(const uint8_t* w, size_t rb, const int8_t* xq, const float* xd, const float* xs,
            int64_t xcols, float* y, int64_t ys, const uint8_t* pf) {
  constexpr int J = QLayout<G, M>::J, BB = QLayout<G, M>::BB, HB = QLayout<G, M>::HB;
  const int64_t nxb = xcols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C], cacc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r) {
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      cacc[r][c] = _mm256_setzero_ps();
    }
  }
  alignas(32) float d8[R][C][8];
  for (int64_t xb0 = 0; xb0 < nxb; xb0 += 8) {
    const int64_t m = std::min<int64_t>(8, nxb - xb0);
    __m256 dx8[C], s8[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      dx8[c] = load8_tail(xd + c * nxb + xb0, m);
      if constexpr (G != 0) s8[c] = load8_tail(xs + c * nxb + xb0, m);
    }
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const uint8_t* sp = w + r * rb + (xb0 / J) * BB;
      const __m256 dw =
          _mm256_cvtph_ps(m == 8 ? gather_scales8<G, M>(sp) : gather_scales_tail<G, M>(sp, m));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (M)
        mw = _mm256_cvtph_ps(m == 8 ? gather_scales8<G, M>(sp + 2) : gather_scales_tail<G, M>(sp + 2, m));
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 d = _mm256_mul_ps(dw, dx8[c]);
        _mm256_store_ps(d8[r][c], d);
        if constexpr (M)
          cacc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(mw, dx8[c]), s8[c], cacc[r][c]);
        else if constexpr (G != 0)
          cacc[r][c] = _mm256_fmadd_ps(d, s8[c], cacc[r][c]);
      }
    }
    for (int64_t gi = 0; gi < m / J; ++gi) {
      const int64_t g = xb0 / J + gi;
      if (pf) prefetch_span<R * BB + 63>(pf + g * R * BB);
      LLM_UNROLL for (int j = 0; j < J; ++j) {
        const int64_t xb = g * J + j;
        const int i = int(gi * J + j);  // block within the chunk
        __m256i xv[C];
        LLM_UNROLL for (int c = 0; c < C; ++c)
          xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * xcols + xb * 32));
        LLM_UNROLL for (int r = 0; r < R; ++r) {
          const uint8_t* blk = w + r * rb + g * BB + (G == 0 ? 2 : HB);
          __m256i p16[C];
          if constexpr (G == 0) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
            const __m256i aw = _mm256_sign_epi8(wv, wv);  // |w|; -128 -> 0x80 = 128 unsigned
            LLM_UNROLL for (int c = 0; c < C; ++c)
              p16[c] = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[c], wv));
          } else {
            const __m256i u = q4_decode<G>(blk, j);
            LLM_UNROLL for (int c = 0; c < C; ++c) p16[c] = _mm256_maddubs_epi16(u, xv[c]);
          }
          LLM_UNROLL for (int c = 0; c < C; ++c) {
            const __m256i p32 = _mm256_madd_epi16(p16[c], ones);
            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_broadcast_ss(&d8[r][c][i]),
                                        acc[r][c]);
          }
        }
      }
    }
  }
  float corr[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c)
      corr[r][c] = G == 0 ? 0.0f : M ? hsum(cacc[r][c]) : -8.0f * hsum(cacc[r][c]);
  store_tile<R, C>(acc, corr, y, ys, false);
}

// Q4 with group 32 (GGUF Q4_0), two blocks per step. The 16 nibble bytes of
// blocks b and b+1 go into one register (low lane b, high lane b+1); the low
// nibbles are then values 0..15 of both blocks and the high nibbles values
// 16..31, which is why x comes in the pair layout (quantize_x_avx2). The two
// blocks' dots stay apart in the 128-bit lanes and meet the scale vector
// [d_b x 4 | d_b+1 x 4]: one vpmaddwd, conversion and FMA per pair, ~5
// vector ops per block and row instead of 7. An odd last block uses the
// one-block path (its x block is in the plain layout).
template <int R, int C>
void q4p_tile(const uint8_t* w, size_t rb, const int8_t* xq, const float* xd, const float* xs,
              int64_t xcols, float* y, int64_t ys, const uint8_t* pf) {
  constexpr int BB = 18;
  const int64_t nxb = xcols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc[R][C], cacc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r) {
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      cacc[r][c] = _mm256_setzero_ps();
    }
  }
  alignas(32) float dp[R][C][4][8];  // pair k of the chunk: [d_2k x 4 | d_2k+1 x 4]
  alignas(32) float d8[R][C][8];
  for (int64_t xb0 = 0; xb0 < nxb; xb0 += 8) {
    const int64_t m = std::min<int64_t>(8, nxb - xb0);
    __m256 dx8[C], s8[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      dx8[c] = load8_tail(xd + c * nxb + xb0, m);
      s8[c] = load8_tail(xs + c * nxb + xb0, m);
    }
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const uint8_t* sp = w + r * rb + xb0 * BB;
      const __m256 dw =
          _mm256_cvtph_ps(m == 8 ? gather_scales8<32>(sp) : gather_scales_tail<32>(sp, m));
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        const __m256 d = _mm256_mul_ps(dw, dx8[c]);
        cacc[r][c] = _mm256_fmadd_ps(d, s8[c], cacc[r][c]);
        _mm256_store_ps(d8[r][c], d);
        LLM_UNROLL for (int k = 0; k < 4; ++k) {
          const __m256i idx = _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                                2 * k + 1, 2 * k + 1);
          _mm256_store_ps(dp[r][c][k], _mm256_permutevar8x32_ps(d, idx));
        }
      }
    }
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
      const int64_t xb = xb0 + i;
      if (pf) prefetch_span<R * 2 * BB + 63>(pf + xb * R * BB);
      __m256i xlo[C], xhi[C];
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        xlo[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * xcols + xb * 32));
        xhi[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * xcols + xb * 32 + 32));
      }
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        const uint8_t* blk = w + r * rb + xb * BB + 2;
        const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(blk + BB),
                                              reinterpret_cast<const __m128i*>(blk));
        const __m256i lo = _mm256_and_si256(v, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          // int16 lanes: two products of at most 15 * 127 each, twice: < 7700.
          const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[c]),
                                               _mm256_maddubs_epi16(hi, xhi[c]));
          const __m256i p32 = _mm256_madd_epi16(p16, ones);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_load_ps(dp[r][c][i / 2]),
                                      acc[r][c]);
        }
      }
    }
    if (i < m) {  // odd last block
      const int64_t xb = xb0 + i;
      __m256i xv[C];
      LLM_UNROLL for (int c = 0; c < C; ++c)
        xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * xcols + xb * 32));
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        const __m256i u = q4_decode<32>(w + r * rb + xb * BB + 2, 0);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv[c]), ones);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p32), _mm256_broadcast_ss(&d8[r][c][i]),
                                      acc[r][c]);
        }
      }
    }
  }
  float corr[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c) corr[r][c] = -8.0f * hsum(cacc[r][c]);
  store_tile<R, C>(acc, corr, y, ys, false);
}

// x rows per integer tile when n > 1. The W-side work (loads, |w|, nibble
// decode) is shared by the C x rows; 4 x 4 tiles measured ~70 GMAC/s per core
// (above the 2 FMA/cycle f32 peak), against 64 at C = 2 and 53 at C = 1,
// even though 16 accumulators make the compiler spill a little.
constexpr int kQCols = 4;

// Decode streams W from memory: a 4-row tile is only a few KiB, too short for
// the hardware prefetcher to ramp up on each of its 4 row streams, so the
// kernel prefetches the tiles kPrefetchBytes ahead linearly as it goes.
constexpr size_t kPrefetchBytes = 8192;
// Up to this many x rows a matmul is batched decode (llm_decode_batch), not prefill.
constexpr int64_t kSmallBatch = 16;

// Pair: x of Q4 group 32 comes in the pair layout (q4p_tile); else plain.
template <int G, bool M, int R, bool Pair>
void q_rows(const WeightView& w, const uint8_t* wr, const QuantX& x, int64_t n, float* y) {
  const int64_t xnb = x.cols / 32;
  auto tile = [&](auto cols_tag, int64_t c0, const uint8_t* pf) {
    constexpr int C = decltype(cols_tag)::value;
    if constexpr (G == 32 && !M && Pair) {
      q4p_tile<R, C>(wr, w.row_bytes, x.q + c0 * x.cols, x.d + c0 * xnb, x.s + c0 * xnb, x.cols,
                     y + c0 * w.rows, w.rows, pf);
    } else {
      q_tile<G, M, R, C>(wr, w.row_bytes, x.q + c0 * x.cols, x.d + c0 * xnb, x.s + c0 * xnb, x.cols,
                      y + c0 * w.rows, w.rows, pf);
    }
  };
  using One = std::integral_constant<int, 1>;
  const size_t span = R * w.row_bytes;
  const size_t ahead = std::max<size_t>(1, (kPrefetchBytes + span - 1) / span) * span;
  if (n == 1) {
    tile(One{}, 0, wr + ahead);
    return;
  }
  // Batched decode (a few x rows, one per session) still streams W from
  // DRAM: the first tile prefetches as decode does. Only a hint.
  const uint8_t* pf = n <= kSmallBatch ? wr + ahead : nullptr;
  int64_t c0 = 0;
  for (; c0 + kQCols <= n; c0 += kQCols) tile(std::integral_constant<int, kQCols>{}, c0, c0 == 0 ? pf : nullptr);
  for (; c0 < n; ++c0) tile(One{}, c0, c0 == 0 ? pf : nullptr);
}

template <int G, bool M = false, bool Pair = G == 32 && !M>
void q_matmul(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    switch (std::min<int64_t>(kRowTile, r1 - r)) {
      case 4: q_rows<G, M, 4, Pair>(w, wr, x, n, y + r); break;
      case 3: q_rows<G, M, 3, Pair>(w, wr, x, n, y + r); break;
      case 2: q_rows<G, M, 2, Pair>(w, wr, x, n, y + r); break;
      default: q_rows<G, M, 1, Pair>(w, wr, x, n, y + r); break;
    }
  }
}

// ---------------------------------------------------------------------------
// X8 (matmul.h), Q4: Q4 group-32 rows interleaved by 8 at load. One 32-byte
// load of a block holds quant bytes 4s..4s+3 of all 8 rows, so 32-bit lane i
// is row i throughout: its low nibbles are values 4s..4s+3, its high nibbles
// values 16+4s..19+4s, and the x values they meet are one broadcast dword
// each. vpmaddubsw + the running int16 sums give each lane its row's block
// dot (4 steps of at most 2 * 2 * 15 * 127 = 7620: below 2^15), one
// vpmaddwd makes it int32, and
//   acc_i = fma(dot_i - 8 * s_x, d_i * d_x, acc_i)
// per block, in block order, with nothing summed across lanes: the scales
// are a vector of the 8 rows' d times a broadcast d_x, and no horizontal sum
// is left for the end. W work (load, nibble split) is shared by the C x rows
// of a tile; with C = 4 a tile keeps its 4 accumulators and 4 int16 sums in
// registers. The portable matmul_x8_scalar does the same operations per
// row, so decode, prefill and the two families agree bit for bit.

inline __m256i broadcast_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// acc[c] (lane i: row i of the group at g) over blocks [b0, b1) for the C x
// rows of a tile in the layout of pack_x8_x (C == 1: x's own).
// Q8 (X8 only under a lowered cap or in tests, matmul.cpp): 8 steps of 4
// values, vpmaddubsw on |w| and x with w's sign (pairs within 2 * 128 *
// 127), vpmaddwd and int32 sums per step; its dot needs no offset.
// Prefetch: decode streams W from memory, and one stream of blocks is too
// slow to ramp the hardware prefetcher up; it then also touches the lines
// kPrefetchBytes ahead (only a hint).
template <DType T, int C, bool Prefetch>
inline void x8_blocks(const uint8_t* g, int64_t b0, int64_t b1, const int8_t* xq, const float* xd, const float* xs,
                      __m256 (&acc)[C]) {
  constexpr size_t kBlock = x8_block_bytes(T);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = g + size_t(b) * kBlock;
    if constexpr (Prefetch) prefetch_span<kBlock>(blk + kPrefetchBytes);
    const int8_t* xb = xq + b * 32 * C;
    __m256i dot[C];  // exact int32 block dots (Q4: of the nibbles)
    if constexpr (T == DType::Q4) {
      __m256i p16[C];
      LLM_UNROLL for (int s = 0; s < 4; ++s) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * s));
        const __m256i lo = _mm256_and_si256(v, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_i32(xb + (s * C + c) * 4)),
                                             _mm256_maddubs_epi16(hi, broadcast_i32(xb + ((4 + s) * C + c) * 4)));
          p16[c] = s == 0 ? t : _mm256_add_epi16(p16[c], t);
        }
      }
      LLM_UNROLL for (int c = 0; c < C; ++c) dot[c] = _mm256_madd_epi16(p16[c], ones);
    } else {
      LLM_UNROLL for (int k = 0; k < 8; ++k) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * k));
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i t = _mm256_madd_epi16(
              _mm256_maddubs_epi16(aw, _mm256_sign_epi8(broadcast_i32(xb + (k * C + c) * 4), wv)), ones);
          dot[c] = k == 0 ? t : _mm256_add_epi32(dot[c], t);
        }
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      __m256 v = _mm256_cvtepi32_ps(dot[c]);
      // Q4: dot - 8 * s_x, integers below 2^24, so exact.
      if constexpr (T == DType::Q4) v = _mm256_fnmadd_ps(_mm256_broadcast_ss(xs + b * C + c), eight, v);
      acc[c] = _mm256_fmadd_ps(v, _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + b * C + c)), acc[c]);
    }
  }
}

// Rows [r0, r1) (inside the 8-row groups; r0 a multiple of 4) for n x rows.
// K is taken in chunks of kX8KBlocks blocks for a prefill, the running sums
// waiting in y between chunks.
template <DType T>
void x8_matmul(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  constexpr int kCols = kX8ColsAvx2;
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
        LLM_UNROLL for (int c = 0; c < C; ++c)
          acc[c] = b0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(y + (c0 + c) * w.rows + g0);
        const bool tiled = C > 1;  // a whole tile: the packed copy
        const int8_t* xq = (tiled ? x.tq : x.q) + c0 * x.cols;
        const float* xd = (tiled ? x.td : x.d) + c0 * nb;
        const float* xs = (tiled ? x.ts : x.s) + c0 * nb;
        if (n <= kX8SmallBatch)
          x8_blocks<T, C, true>(g, b0, b1, xq, xd, xs, acc);
        else
          x8_blocks<T, C, false>(g, b0, b1, xq, xd, xs, acc);
        LLM_UNROLL for (int c = 0; c < C; ++c) {
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

// ---------------------------------------------------------------------------
// f32 tiles: W rows come through a loader that turns 8 stored values at
// element k into 8 floats (exact conversions).

struct LoadF32 {
  static constexpr int kBytes = 4;
  static __m256 load8(const uint8_t* row, int64_t k) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
  static float load1(const uint8_t* row, int64_t k) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
};

struct LoadF16 {
  static constexpr int kBytes = 2;
  static __m256 load8(const uint8_t* row, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  }
  static float load1(const uint8_t* row, int64_t k) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(row + 2 * k))));
  }
};

struct LoadBF16 {
  static constexpr int kBytes = 2;
  static __m256 load8(const uint8_t* row, int64_t k) {
    const __m256i v =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float load1(const uint8_t* row, int64_t k) {
    const uint32_t u = uint32_t(load_u16(row + 2 * k)) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
  }
};

// R W rows (byte stride ws, loader L) x C x rows (float stride xs), k in
// [0, len).
//
// Every output is summed in one canonical order, whatever R and C, so that a
// row's result is bit-identical alone (decode) or in a batch (prefill): the
// 8-float vector v = k / 8 goes into partial sum v % 4 (8 lanes each), the
// partials are combined as (p0 + p1) + (p2 + p3), reduced by hsum, and the
// scalar tail k >= 8 * (len / 8) is added last. Small tiles (decode) keep the
// four partials in registers and stream W once; big tiles (prefill) have no
// registers for that and compute the partials one after the other, each a
// strided pass over the L1-resident tile.
template <class L, int R, int C>
void f_tile(const uint8_t* w, size_t ws, const float* x, int64_t xs, int64_t len, float* y,
            int64_t ys, bool accumulate, const uint8_t* pf = nullptr) {
  constexpr int kSets = 4;
  const int64_t nv = len / 8;
  __m256 part[kSets][R][C];
  LLM_UNROLL for (int u = 0; u < kSets; ++u)
    LLM_UNROLL for (int r = 0; r < R; ++r)
      LLM_UNROLL for (int c = 0; c < C; ++c) part[u][r][c] = _mm256_setzero_ps();
  // One vector step into partial u.
  auto step = [&](int u, int64_t v, __m256 (&acc)[R][C]) {
    const int64_t k = 8 * v;
    __m256 xv[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) xv[c] = _mm256_loadu_ps(x + c * xs + k);
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 wv = L::load8(w + r * ws, k);
      LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv, xv[c], acc[r][c]);
    }
    (void)u;
  };
  if constexpr (R * C * kSets <= 12) {
    int64_t v = 0;
    for (; v + kSets <= nv; v += kSets) {
      if (pf) prefetch_span<R * 8 * kSets * L::kBytes>(pf + v * 8 * R * L::kBytes);
      LLM_UNROLL for (int u = 0; u < kSets; ++u) step(u, v + u, part[u]);
    }
    LLM_UNROLL for (int u = 0; u < kSets - 1; ++u)
      if (v + u < nv) step(u, v + u, part[u]);
  } else {
    LLM_UNROLL for (int u = 0; u < kSets; ++u) {
      __m256 acc[R][C];
      LLM_UNROLL for (int r = 0; r < R; ++r)
        LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
      for (int64_t v = u; v < nv; v += kSets) step(u, v, acc);
      LLM_UNROLL for (int r = 0; r < R; ++r)
        LLM_UNROLL for (int c = 0; c < C; ++c) part[u][r][c] = acc[r][c];
    }
  }
  __m256 total[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r) {
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      total[r][c] = _mm256_add_ps(_mm256_add_ps(part[0][r][c], part[1][r][c]),
                                  _mm256_add_ps(part[2][r][c], part[3][r][c]));
    }
  }
  float tail[R][C] = {};
  for (int64_t k = 8 * nv; k < len; ++k) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const float wk = L::load1(w + r * ws, k);
      // Explicit FMA: left to the compiler, a*b+c may or may not be contracted
      // depending on the instantiation, which would break batch invariance.
      LLM_UNROLL for (int c = 0; c < C; ++c) tail[r][c] = fmadd1(wk, x[c * xs + k], tail[r][c]);
    }
  }
  store_tile<R, C>(total, tail, y, ys, accumulate);
}

// K block of the f32 path: a 4-row tile of dequantized W (4 x 1024 floats =
// 16 KiB) stays in L1 while the x rows stream past it. A multiple of 128 so
// quantized groups never straddle blocks.
constexpr int64_t kFKBlock = 1024;

constexpr int kFCols = 3;  // x rows per f32 tile when n > 1: 4 x 3 accumulators

// x rows per L2 block on the f32 path. Each block re-reads (and re-converts)
// W, but a block that fills L2 leaves no room for the W prefetches and the
// tile buffer: 384 KiB measured ahead of 256 KiB and
// 512-768 KiB on f16 pp512 (1 thread).
constexpr int64_t kFXBlockBytes = 384 << 10;

template <class L, int R>
void f_rows(const uint8_t* w, size_t ws, const float* x, int64_t xs, int64_t n, int64_t len,
            float* y, int64_t ys, bool accumulate) {
  int64_t c0 = 0;
  for (; c0 + kFCols <= n; c0 += kFCols)
    f_tile<L, R, kFCols>(w, ws, x + c0 * xs, xs, len, y + c0 * ys, ys, accumulate);
  switch (n - c0) {
    case 2: f_tile<L, R, 2>(w, ws, x + c0 * xs, xs, len, y + c0 * ys, ys, accumulate); break;
    case 1: f_tile<L, R, 1>(w, ws, x + c0 * xs, xs, len, y + c0 * ys, ys, accumulate); break;
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

// Decode (n == 1) for F32/F16/BF16: one row at a time. Unlike the integer
// kernels these need no work shared between rows, and a single sequential
// stream is what the core's hardware prefetcher sustains best (measured:
// ~30 GB/s against ~25 GB/s with 4 interleaved row streams).
// Out of line, as in the AVX-512 family (f_gemv_rows there): inlined into
// matmul_f_avx2 next to its prefill code, the same loop ran ~20% slower
// (BM_Gemv f16 2048 x 2048, LLM_CPU_ISA=avx2: 279 against 223-234 us).
template <class L>
__attribute__((noinline)) void f_gemv_row(const WeightView& w, const float* x, float* y, int64_t r, size_t ahead) {
  const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
  // Same K blocks as the prefill path (matmul_f_avx2), for batch invariance.
  for (int64_t k0 = 0; k0 < w.cols; k0 += kFKBlock) {
    f_tile<L, 1, 1>(wr + k0 * L::kBytes, w.row_bytes, x + k0, w.cols, std::min(kFKBlock, w.cols - k0), y + r,
                    w.rows, k0 > 0, wr + ahead + k0 * L::kBytes);
  }
}

template <class L>
void f_gemv(const WeightView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  const size_t ahead = std::max<size_t>(1, (kPrefetchBytes + w.row_bytes - 1) / w.row_bytes) * w.row_bytes;
  for (int64_t r = r0; r < r1; ++r) f_gemv_row<L>(w, x, y, r, ahead);
}

// Up to this many x rows (the AVX-512 family's bound, not measured here).
constexpr int64_t kFSmallBatch = 8;

// Batched decode (2 <= n <= kFSmallBatch) of an unquantized type: as decode,
// one W row at a time streamed from memory (prefetched ahead) and converted
// in registers, run against kFCols x rows at a time while the row sits in
// L1, instead of the prefill loop nest (W converted into a buffer, one tile
// prefetched ahead). f_tile's order per output does not depend on C.
template <class L>
__attribute__((noinline)) void f_gemv_batch(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
                                            int64_t r1) {
  const size_t ahead = std::max<size_t>(1, (kPrefetchBytes + w.row_bytes - 1) / w.row_bytes) * w.row_bytes;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    for (int64_t c0 = 0; c0 < n; c0 += kFCols) {
      const int64_t nc = std::min<int64_t>(kFCols, n - c0);
      for (int64_t k0 = 0; k0 < w.cols; k0 += kFKBlock) {
        const uint8_t* wk = wr + k0 * L::kBytes;
        const float* xk = x + c0 * w.cols + k0;
        const int64_t len = std::min(kFKBlock, w.cols - k0);
        float* yc = y + c0 * w.rows + r;
        const uint8_t* pf = c0 == 0 ? wk + ahead : nullptr;  // the later groups find the row in L1
        static_assert(kFCols == 3, "cases below");
        switch (nc) {
          case 3: f_tile<L, 1, 3>(wk, w.row_bytes, xk, w.cols, len, yc, w.rows, k0 > 0, pf); break;
          case 2: f_tile<L, 1, 2>(wk, w.row_bytes, xk, w.cols, len, yc, w.rows, k0 > 0, pf); break;
          default: f_tile<L, 1, 1>(wk, w.row_bytes, xk, w.cols, len, yc, w.rows, k0 > 0, pf); break;
        }
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
        for (; k + 8 <= len; k += 8) _mm256_storeu_ps(dst + k, LoadF16::load8(row, k0 + k));
        for (; k < len; ++k) dst[k] = LoadF16::load1(row, k0 + k);
      } else {
        for (; k + 8 <= len; k += 8) _mm256_storeu_ps(dst + k, LoadBF16::load8(row, k0 + k));
        for (; k < len; ++k) dst[k] = LoadBF16::load1(row, k0 + k);
      }
      return;
    }
    case DType::Q8: {
      for (int64_t b = k0 / 32; b < (k0 + len) / 32; ++b) {
        const uint8_t* blk = row + b * 34;
        const __m256 d = f16_broadcast(blk);
        float* out = dst + (b * 32 - k0);
        LLM_UNROLL for (int i = 0; i < 4; ++i) {
          const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i));
          const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
          _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(d, q));
        }
      }
      return;
    }
    case DType::Q4: {
      const int64_t g = w.group, half = g / 2, gb = 2 + half;
      const __m256i m4 = _mm256_set1_epi32(0x0f);
      const __m256i eight = _mm256_set1_epi32(8);
      for (int64_t b = k0 / g; b < (k0 + len) / g; ++b) {
        const uint8_t* blk = row + b * gb;
        const __m256 d = f16_broadcast(blk);
        float* out = dst + (b * g - k0);
        for (int64_t j = 0; j < half; j += 8) {
          const __m256i v = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + j)));
          const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(v, m4), eight);
          const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight);
          _mm256_storeu_ps(out + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
          _mm256_storeu_ps(out + half + j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
        }
      }
      return;
    }
    case DType::Q4M: {
      // The reference decoder itself (quant.cpp, built without -mfma, so
      // nibble * d + m stays a multiply then an add): the exact values.
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


}  // namespace

void quantize_x_avx2(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                     bool pair_layout) {
  const int64_t nb = cols / 32;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b)
      quantize_block(x + i * cols + b * 32, q + i * cols + b * 32, d + i * nb + b, s + i * nb + b);
    if (!pair_layout) continue;
    for (int64_t b = 0; b + 2 <= nb; b += 2) {
      __m256i* p = reinterpret_cast<__m256i*>(q + i * cols + b * 32);
      const __m256i b0 = _mm256_loadu_si256(p), b1 = _mm256_loadu_si256(p + 1);
      _mm256_storeu_si256(p, _mm256_permute2x128_si256(b0, b1, 0x20));
      _mm256_storeu_si256(p + 1, _mm256_permute2x128_si256(b0, b1, 0x31));
    }
  }
}

void matmul_q_avx2(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0,
                   int64_t r1) {
  if (w.dtype == DType::Q8) {
    q_matmul<0>(w, x, n, y, r0, r1);
  } else if (w.dtype == DType::Q4M) {
    if (w.group == 32) q_matmul<32, true>(w, x, n, y, r0, r1);
    else if (w.group == 64) q_matmul<64, true>(w, x, n, y, r0, r1);
    else q_matmul<128, true>(w, x, n, y, r0, r1);
  } else if (w.group == 32) {
    // x in the pair layout, or plain where prepare_x made it so (the plain
    // tail rows of an X8 matrix).
    if (q_pair_layout(w))
      q_matmul<32>(w, x, n, y, r0, r1);
    else
      q_matmul<32, false, false>(w, x, n, y, r0, r1);
  } else if (w.group == 64) {
    q_matmul<64>(w, x, n, y, r0, r1);
  } else {
    q_matmul<128>(w, x, n, y, r0, r1);
  }
}

void matmul_x8_avx2(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (w.dtype == DType::Q8)
    x8_matmul<DType::Q8>(w, x, n, y, r0, r1);
  else
    x8_matmul<DType::Q4>(w, x, n, y, r0, r1);
}

void matmul_f_avx2(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0,
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
