// AVX2 + FMA + F16C kernels for the GGUF block types (matmul_ggml.h).
// Compiled with those flags and only entered after use_avx2_kernels() said
// yes.
//
// Both kinds first unpack a tile of kRowTile W rows into an L1/L2 buffer
// (exact integer codes and scales: KUnpacked, or int8 codes + f32 scales for
// the 32-value types), then run every x row over it in register tiles of R
// W rows x C x rows. Decode (n == 1) is the same code with C = 1; its unpack
// also prefetches the next tile's bytes.
//
// K-quants (Q8_K activations). Per super-block and (W row, x row):
//   for each 32 values k: p = vpmaddubsw(u, q) (int16 pairs, at most
//     2 * 63 * 127), S += vpmaddwd(p, sv[k]) (8 int32 lanes);
//   M = vpmaddwd(bsums, mn) (8 int32 lanes);
//   acc = fma(float(S - M), d * d_x, acc)                  (Q3_K, Q6_K)
//   acc = fma(float(M), -(dm * d_x), fma(float(S), d * d_x, acc))   (others)
//   and the output is hsum(acc) over the 8 lanes.
// 32-value types (Q8_0 / Q8_1 activations). Per block: t = vpmaddwd(p, 1)
//   (8 int32 lanes, each the sum of 4 products w * q), with the pairs p =
//   vpmaddubsw(|w|, sign(q, w)) (IQ4_NL), vpmaddubsw(w, q) (Q5_1) or
//   vpmaddubsw(w + 16, q) - vpmaddubsw(16, q) (Q5_0): the same integers;
//   acc = fma(float(t), d_w * d_x, acc); Q5_1 also macc = fma(m_w, s_x,
//   macc) over 8 blocks at a time; the output is hsum(acc) (+ hsum(macc)).
// Every (W row, x row) pair sees these operations in this order whatever
// the tile, so outputs are batch invariant within this family.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/matmul_ggml.h"
#include "core/half.h"

namespace llm::cpu::kern {

namespace {

#define LLM_UNROLL _Pragma("GCC unroll 16")

// Decode streams W once: the bytes kDecodeAhead ahead (a whole number of
// row tiles, the same place in a later tile) are prefetched as a tile is
// read. A tile of Gemma-sized rows is under 2 KiB, too close to hide DRAM
// latency; prefetching past the matrix's end is harmless (no fault).
constexpr size_t kDecodeAhead = 8192;
inline size_t decode_ahead(const WeightView& w) {
  const size_t span = size_t(kRowTile) * w.row_bytes;
  return std::max<size_t>(1, (kDecodeAhead + span - 1) / span) * span;
}
// Up to this many x rows a matmul is batched decode (llm_decode_batch), which
// still streams W from DRAM: its unpacking prefetches as decode does.
constexpr int64_t kSmallBatch = 16;

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);  // the same bits as the plain unpackers, NaN payloads included
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline void store256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 floats from p, or the first m of them zero padded.
inline __m256 load8_tail(const float* p, int64_t m) {
  if (m == 8) return _mm256_loadu_ps(p);
  alignas(32) float t[8] = {};
  for (int64_t i = 0; i < m; ++i) t[i] = p[i];
  return _mm256_load_ps(t);
}

inline void prefetch_bytes(const uint8_t* p, size_t n) {
  for (size_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

// --- unpacking -------------------------------------------------------------

// sv from 16 scales (int16): vector k (values 32k..32k+31) = [sc[2k] x 8 |
// sc[2k+1] x 8].
inline void expand_scales16(__m256i sc, int16_t* sv) {
  const __m256i lo = _mm256_permute2x128_si256(sc, sc, 0x00);
  const __m256i hi = _mm256_permute2x128_si256(sc, sc, 0x11);
  LLM_UNROLL for (int k = 0; k < 4; ++k) {
    const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(short(((4 * k + 3) << 8) | (4 * k + 2))),
                                          _mm_set1_epi16(short(((4 * k + 1) << 8) | (4 * k))));
    store256(sv + 16 * k, _mm256_shuffle_epi8(lo, pick));
    store256(sv + 16 * (k + 4), _mm256_shuffle_epi8(hi, pick));
  }
}

// sv from 8 scales of 32 values (int16): vector j = sc[j] x 16.
inline void expand_scales8(__m128i sc, int16_t* sv) {
  const __m256i s2 = _mm256_broadcastsi128_si256(sc);
  LLM_UNROLL for (int j = 0; j < 8; ++j)
    store256(sv + 16 * j, _mm256_shuffle_epi8(s2, _mm256_set1_epi16(short(((2 * j + 1) << 8) | (2 * j)))));
}

// Q4_K / Q5_K: the 8 six-bit scales (bytes 0..7) and minimums (8..15) of
// the 12-byte array at s (16 bytes readable), in registers. Words u0, u1, u2:
// scales 0..3 = u0 & 0x3f.., 4..7 = (u2 & 0x0f..) | (u0 >> 6 & 0x03..) << 4;
// minimums 0..3 = u1 & 0x3f.., 4..7 = (u2 >> 4 & 0x0f..) | (u1 >> 6 & 0x03..) << 4.
inline __m128i scales_mins_k4(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i top = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 1, 0)), 6),
                                                   _mm_set1_epi32(0x03030303)),
                                     4);
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2)), _mm_setr_epi32(0, 4, 0, 4)),
                                    _mm_set1_epi32(0x0f0f0f0f));
  return _mm_unpacklo_epi32(_mm_and_si128(v, _mm_set1_epi32(0x3f3f3f3f)), _mm_or_si128(low, top));
}

void unpack_q2k(const uint8_t* b, KUnpacked* o) {
  const __m128i s = load128(b);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  expand_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), o->sv);
  store256(o->mn, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4)));
  const __m256i m2 = _mm256_set1_epi8(3);
  LLM_UNROLL for (int n = 0; n < 2; ++n) {
    const __m256i v = load256(b + 16 + 32 * n);
    LLM_UNROLL for (int j = 0; j < 4; ++j)
      store256(o->q + 128 * n + 32 * j, _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m2));
  }
  o->d = half_at(b + 80);
  o->dm = half_at(b + 82);
}

void unpack_q3k(const uint8_t* b, KUnpacked* o) {
  const uint8_t* s = b + 96;
  alignas(32) int16_t sc[16];
  for (int k = 0; k < 16; ++k) {
    const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
    const int hi = (s[8 + (k % 4)] >> (2 * (k / 4))) & 3;
    sc[k] = int16_t((lo | (hi << 4)) - 32);
  }
  const __m256i scv = _mm256_load_si256(reinterpret_cast<const __m256i*>(sc));
  expand_scales16(scv, o->sv);
  store256(o->mn, _mm256_slli_epi16(scv, 2));
  const __m256i hm = load256(b);
  const __m256i m2 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  LLM_UNROLL for (int n = 0; n < 2; ++n) {
    const __m256i v = load256(b + 32 + 32 * n);
    LLM_UNROLL for (int j = 0; j < 4; ++j) {
      const __m256i bit = _mm256_set1_epi8(char(1 << (4 * n + j)));
      const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
      store256(o->q + 128 * n + 32 * j, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m2), high));
    }
  }
  o->d = o->dm = half_at(b + 108);
}

template <bool Five>
void unpack_q45k(const uint8_t* b, KUnpacked* o) {
  const __m128i sm = _mm_cvtepu8_epi16(scales_mins_k4(b + 4));  // 8 scales
  const __m128i mm = _mm_cvtepu8_epi16(_mm_srli_si128(scales_mins_k4(b + 4), 8));
  expand_scales8(sm, o->sv);
  store256(o->mn, _mm256_set_m128i(_mm_unpackhi_epi16(mm, mm), _mm_unpacklo_epi16(mm, mm)));
  const uint8_t* qs = b + (Five ? 48 : 16);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256i hb = _mm256_setzero_si256();
  if constexpr (Five) hb = load256(b + 16);
  const __m256i sixteen = _mm256_set1_epi8(16);
  LLM_UNROLL for (int p = 0; p < 4; ++p) {
    const __m256i v = load256(qs + 32 * p);
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if constexpr (Five) {
      const __m256i b0 = _mm256_set1_epi8(char(1 << (2 * p))), b1 = _mm256_set1_epi8(char(2 << (2 * p)));
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), sixteen));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), sixteen));
    }
    store256(o->q + 64 * p, lo);
    store256(o->q + 64 * p + 32, hi);
  }
  o->d = half_at(b);
  o->dm = half_at(b + 2);
}

void unpack_q6k(const uint8_t* b, KUnpacked* o) {
  const __m256i sc = _mm256_cvtepi8_epi16(load128(b + 192));
  expand_scales16(sc, o->sv);
  store256(o->mn, _mm256_slli_epi16(sc, 5));
  const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  LLM_UNROLL for (int n = 0; n < 2; ++n) {
    const __m256i l0 = load256(b + 64 * n), l1 = load256(b + 64 * n + 32);
    const __m256i h = load256(b + 128 + 32 * n);
    uint8_t* q = o->q + 128 * n;
    store256(q, _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)));
    store256(q + 32, _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)));
    store256(q + 64, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30)));
    const __m256i h3 = _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
    store256(q + 96, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h3));
  }
  o->d = o->dm = half_at(b + 208);
}

// The 16 nibble bytes at p as 32 values: low nibbles, then high nibbles.
// The bytes in both halves, the high half shifted right by 4 within its
// dwords (what comes down from the next byte lands above bit 3), then the
// mask: three operations where two shifts and an insert took five.
inline __m256i nibbles32(const uint8_t* p) {
  const __m256i v = _mm256_broadcastsi128_si256(load128(p));
  return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}

// IQ4_XS: 8 scales of 32 values (6 bits, bias 32), table values as int8.
void unpack_iq4xs(const uint8_t* b, KUnpacked* o) {
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  int16_t sc[8];
  for (int ib = 0; ib < 8; ++ib)
    sc[ib] = int16_t((((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4)) - 32);
  expand_scales8(_mm_setr_epi16(sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]), o->sv);
  store256(o->mn, _mm256_setzero_si256());
  const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                         -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  LLM_UNROLL for (int ib = 0; ib < 8; ++ib) store256(o->q + 32 * ib, _mm256_shuffle_epi8(table, nibbles32(b + 8 + 16 * ib)));
  o->d = o->dm = half_at(b);
}

// The 32 fifth bits of a Q5 block as 0 / 16 bytes in value order.
inline __m256i q5_high(const uint8_t* qh_p) {
  uint32_t qh;
  std::memcpy(&qh, qh_p, 4);
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bits = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)), pick);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits), _mm256_set1_epi8(16));
}


// Q5_0 / Q5_1: a block's stored 5-bit codes, 0..31, from its qh (4 bytes
// at qh) and the 16 nibble bytes right after them.
inline __m256i q5_codes(const uint8_t* qh) { return _mm256_or_si256(nibbles32(qh + 4), q5_high(qh)); }

inline __m256i unpack_b32(DType t, const uint8_t* b) {
  switch (t) {
    case DType::Q5_0: return _mm256_sub_epi8(q5_codes(b + 2), _mm256_set1_epi8(16));
    case DType::Q5_1: return q5_codes(b + 4);
    default: {  // IQ4_NL
      const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                             -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
      return _mm256_shuffle_epi8(table, nibbles32(b + 2));
    }
  }
}

// --- K-quant tiles ---------------------------------------------------------

// R unpacked rows (wb, row stride ws blocks) x C x rows over nsb super-blocks;
// writes y[c * ys + r].
template <int R, int C, bool MinD, bool Signed>
void k_tile(const KUnpacked* wb, int64_t ws, int64_t nsb, const int8_t* xq, const float* xd, const int16_t* xbs,
            int64_t xcols, float* y, int64_t ys) {
  __m256 acc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m256i S[R][C];
    LLM_UNROLL for (int r = 0; r < R; ++r)
      LLM_UNROLL for (int c = 0; c < C; ++c) S[r][c] = _mm256_setzero_si256();
    // Not unrolled: unrolled 8 times, GCC reorders the products of every
    // 32-value chunk ahead of their sums and spills them (16 ymm registers),
    // which cost a quarter of prefill (Zen 5, Q5_K_M pp256, one thread: 56-59
    // against 71-77 t/s). The integer sums are exact, so the order is free.
    _Pragma("GCC unroll 1") for (int k = 0; k < 8; ++k) {
      __m256i xv[C];
      LLM_UNROLL for (int c = 0; c < C; ++c) xv[c] = load256(xq + c * xcols + sb * 256 + 32 * k);
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        const KUnpacked& u = wb[r * ws + sb];
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.q + 32 * k));
        const __m256i s = _mm256_load_si256(reinterpret_cast<const __m256i*>(u.sv + 16 * k));
        if constexpr (Signed) {  // |w| and w's sign moved onto x: pairs of at most 2 * 127 * 127
          const __m256i aw = _mm256_sign_epi8(w, w);
          LLM_UNROLL for (int c = 0; c < C; ++c)
            S[r][c] = _mm256_add_epi32(
                S[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[c], w)), s));
        } else {
          LLM_UNROLL for (int c = 0; c < C; ++c)
            S[r][c] = _mm256_add_epi32(S[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv[c]), s));
        }
      }
    }
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const __m256i bs = load256(xbs + c * (xcols / 16) + sb * 16);
      const float dx = xd[c * (xcols / 256) + sb];
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        const KUnpacked& u = wb[r * ws + sb];
        const __m256i M = _mm256_madd_epi16(bs, _mm256_load_si256(reinterpret_cast<const __m256i*>(u.mn)));
        if constexpr (MinD) {
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[r][c], M)), _mm256_set1_ps(u.d * dx),
                                      acc[r][c]);
        } else {
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[r][c]), _mm256_set1_ps(u.d * dx), acc[r][c]);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_set1_ps(-(u.dm * dx)), acc[r][c]);
        }
      }
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c)
    LLM_UNROLL for (int r = 0; r < R; ++r) y[c * ys + r] = hsum(acc[r][c]);
}

// x rows per K-quant register tile when n > 1: 4 x 2 int32 sums plus the
// x, code and scale vectors fill the 16 ymm registers.
constexpr int kKCols = 2;

template <int R, bool MinD, bool Signed>
void k_rows(const KUnpacked* wb, int64_t nsb, const GgmlX& x, int64_t n, float* y, int64_t ys) {
  const int64_t cols = x.cols;
  auto tile = [&](auto cols_tag, int64_t c0) {
    constexpr int C = decltype(cols_tag)::value;
    k_tile<R, C, MinD, Signed>(wb, nsb, nsb, x.q + c0 * cols, x.d + c0 * nsb, x.bsums + c0 * (cols / 16), cols,
                       y + c0 * ys, ys);
  };
  int64_t c0 = 0;
  for (; c0 + kKCols <= n; c0 += kKCols) tile(std::integral_constant<int, kKCols>{}, c0);
  for (; c0 < n; ++c0) tile(std::integral_constant<int, 1>{}, c0);
}

// --- K-quant decode from the stored blocks ---------------------------------
//
// Decode and batched decode of up to kDirectBatch x rows read each stored
// super-block once per kDecCols x rows, so unpacking it into a KUnpacked
// buffer and reading that back costs more than the dots. KRegs<T> decodes
// one stored super-block into registers and scalars instead: the codes of
// each 32-value chunk and the same int16 scale lanes, minimums and d / dm as
// the unpackers above, so k_gemv runs k_tile's operations for each (W row,
// x row) in k_tile's order and gives its bits.

constexpr int kDecCols = 2;
constexpr int64_t kDirectBatch = 8;

template <DType T>
struct KRegs;

// F16C: the unpackers' value for every finite and infinite half; a NaN may
// come out quieted, which the first multiply by it does anyway.
inline float half_hw(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// int16 lanes 0..7 of v broadcast by pairs of bytes: scale lanes of chunk k
// from 8 scales of 32 values (lane t: scale k).
inline __m256i scale_lanes8(__m256i v2, int k) {
  return _mm256_shuffle_epi8(v2, _mm256_set1_epi16(short(((2 * k + 1) << 8) | (2 * k))));
}

// What k_gemv needs of a Q4_K / Q5_K super-block besides its codes: the 8
// scales as int16 in both 128-bit halves (for scale_lanes8), the minimums
// as int16 lanes (minimum j in lanes 2j, 2j + 1), d and dm.
struct KRow {
  __m256i sc2;
  __m256i mn;
  float d, dm;
};

// Q4_K / Q5_K blocks b0, b1 (f16 d | f16 dmin | scales[12]) decoded
// together, one per 128-bit lane: row by row, this decoding took a fifth of
// the decode GEMV, which is compute-bound on one thread. The per-lane
// arithmetic is scales_mins_k4's, on the dwords after d | dmin.
inline void k45_pair(const uint8_t* b0, const uint8_t* b1, KRow out[2]) {
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(b0)), load128(b1), 1);
  const __m256i top = _mm256_slli_epi32(
      _mm256_and_si256(_mm256_srli_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 1)), 6), _mm256_set1_epi8(3)), 4);
  const __m256i low = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_shuffle_epi32(v, _MM_SHUFFLE(3, 3, 3, 3)), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)),
      _mm256_set1_epi8(0x0f));
  const __m256i sm = _mm256_unpacklo_epi32(
      _mm256_and_si256(_mm256_shuffle_epi32(v, _MM_SHUFFLE(3, 3, 2, 1)), _mm256_set1_epi8(0x3f)),
      _mm256_or_si256(low, top));  // per lane: scales 0..7, minimums 0..7 (bytes)
  LLM_UNROLL for (int h = 0; h < 2; ++h) {
    const __m256i w = _mm256_cvtepu8_epi16(h ? _mm256_extracti128_si256(sm, 1) : _mm256_castsi256_si128(sm));
    out[h].sc2 = _mm256_permute4x64_epi64(w, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256i m = _mm256_permute4x64_epi64(w, _MM_SHUFFLE(3, 3, 2, 2));
    out[h].mn = _mm256_unpacklo_epi16(m, m);  // minimum j in lanes 2j, 2j + 1
  }
  // d | dmin of both rows as 4 halves: [d0, dm0, d1, dm1].
  const __m128 f =
      _mm_cvtph_ps(_mm_unpacklo_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
  alignas(16) float fs[4];
  _mm_store_ps(fs, f);
  out[0].d = fs[0];
  out[0].dm = fs[1];
  out[1].d = fs[2];
  out[1].dm = fs[3];
}

// Q4_K / Q5_K: chunk k is the low (k even) or high (k odd) nibbles of
// qs[32 (k / 2) ..]; Q5_K adds 16 where qh has bit k. Scales, minimums, d
// and dm come in pairs of rows from k45_pair (kPair).
template <bool Five>
struct KRegs45 {
  static constexpr size_t kBytes = Five ? 176 : 144;
  static constexpr bool kPair = true;
  const uint8_t* qs;
  __m256i hb;
  explicit KRegs45(const uint8_t* b) : qs(b + (Five ? 48 : 16)) {
    hb = Five ? load256(b + 16) : _mm256_setzero_si256();
  }
  static void pair(const uint8_t* b0, const uint8_t* b1, KRow out[2]) { k45_pair(b0, b1, out); }
  __m256i codes(int k) const {
    const __m256i v = load256(qs + 32 * (k / 2)), m4 = _mm256_set1_epi8(0x0f);
    __m256i c = k % 2 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    if constexpr (Five) {
      // Bit k of each qh byte to bit 4 by one 16-bit shift: what crosses
      // from the other byte of the lane lands in bits 0..3 or 5..7, which
      // the mask clears.
      const __m256i h = k <= 4 ? _mm256_slli_epi16(hb, 4 - k) : _mm256_srli_epi16(hb, k - 4);
      c = _mm256_or_si256(c, _mm256_and_si256(h, _mm256_set1_epi8(16)));
    }
    return c;
  }
};
template <>
struct KRegs<DType::Q4_K> : KRegs45<false> {
  using KRegs45<false>::KRegs45;
};
template <>
struct KRegs<DType::Q5_K> : KRegs45<true> {
  using KRegs45<true>::KRegs45;
};

// 16 scales of 16 values (Q2_K, Q3_K, Q6_K), given as int16 lanes s16 and
// kept as scales 0..7 (lo2) and 8..15 (hi2), each in both 128-bit halves.
// lanes(k): chunk k's scale lanes [scale 2k x 8 | scale 2k + 1 x 8], as
// expand_scales16.
struct Scales16 {
  __m256i lo2, hi2;
  Scales16() = default;
  explicit Scales16(__m256i s16)
      : lo2(_mm256_permute2x128_si256(s16, s16, 0x00)), hi2(_mm256_permute2x128_si256(s16, s16, 0x11)) {}
  __m256i lanes(int k) const {
    const int kk = k % 4;
    const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(short(((4 * kk + 3) << 8) | (4 * kk + 2))),
                                          _mm_set1_epi16(short(((4 * kk + 1) << 8) | (4 * kk))));
    return _mm256_shuffle_epi8(k < 4 ? lo2 : hi2, pick);
  }
};

// Q6_K: 16 scales of 16 values; chunk k = 4n + j of half n as unpack_q6k.
template <>
struct KRegs<DType::Q6_K> {
  static constexpr size_t kBytes = 210;
  static constexpr bool kPair = false;
  Scales16 sc;
  __m256i mn;
  float d, dm;
  const uint8_t* b;
  explicit KRegs(const uint8_t* blk) : b(blk) {
    const __m256i s16 = _mm256_cvtepi8_epi16(load128(blk + 192));
    sc = Scales16(s16);
    mn = _mm256_slli_epi16(s16, 5);
    d = dm = half_hw(blk + 208);
  }
  __m256i codes(int k) const {
    const int n = k / 4, j = k % 4;
    const __m256i l = load256(b + 64 * n + 32 * (j % 2)), h = load256(b + 128 + 32 * n);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m48 = _mm256_set1_epi8(0x30);
    const __m256i lo = j < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    const __m256i hs = j == 0 ? _mm256_slli_epi16(h, 4) : j == 1 ? _mm256_slli_epi16(h, 2)
                     : j == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hs, m48));
  }
  __m256i scales(int k) const { return sc.lanes(k); }
};

// Q2_K: chunk k is bits 2 (k % 4) of the 32 bytes qs[32 (k / 4) ..]; 16
// scales (low nibbles of the first 16 bytes) and 16 minimums (high nibbles).
template <>
struct KRegs<DType::Q2_K> {
  static constexpr size_t kBytes = 84;
  static constexpr bool kPair = false;
  Scales16 sc;
  __m256i mn;
  float d, dm;
  const uint8_t* qs;
  explicit KRegs(const uint8_t* b) : qs(b + 16) {
    const __m128i raw = load128(b), m4 = _mm_set1_epi8(0x0f);
    const __m256i s16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    sc = Scales16(s16);
    mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    d = half_hw(b + 80);
    dm = half_hw(b + 82);
  }
  __m256i codes(int k) const {
    return _mm256_and_si256(_mm256_srl_epi16(load256(qs + 32 * (k / 4)), _mm_cvtsi32_si128(2 * (k % 4))),
                            _mm256_set1_epi8(3));
  }
  __m256i scales(int k) const { return sc.lanes(k); }
};

// Q3_K: chunk k is bits 2 (k % 4) of qs[32 (k / 4) ..] plus 4 where bit k
// of hmask[0..32) is set (the format's -4 moved into the minimums: 4 x
// scale). The 16 six-bit scales (bias 32): low nibbles from s[0..8) (scales
// 0..7 low, 8..15 high nibble), high 2 bits from s[8..12), bits 2 (k / 4).
template <>
struct KRegs<DType::Q3_K> {
  static constexpr size_t kBytes = 110;
  static constexpr bool kPair = false;
  Scales16 sc;
  __m256i mn;
  float d, dm;
  const uint8_t* b;
  explicit KRegs(const uint8_t* blk) : b(blk) {
    uint32_t a[3];
    std::memcpy(a, blk + 96, 12);
    const uint32_t m2 = 0x03030303u, m4 = 0x0f0f0f0fu;
    const __m128i sc8 = _mm_sub_epi8(
        _mm_setr_epi32(int((a[0] & m4) | ((a[2] & m2) << 4)), int((a[1] & m4) | (((a[2] >> 2) & m2) << 4)),
                       int(((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4)),
                       int(((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4))),
        _mm_set1_epi8(32));
    const __m256i s16 = _mm256_cvtepi8_epi16(sc8);
    sc = Scales16(s16);
    mn = _mm256_slli_epi16(s16, 2);
    d = dm = half_hw(blk + 108);
  }
  __m256i codes(int k) const {
    const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(load256(b + 32 + 32 * (k / 4)), _mm_cvtsi32_si128(2 * (k % 4))),
                                        _mm256_set1_epi8(3));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(load256(b), _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1));
    return _mm256_or_si256(q2, _mm256_slli_epi16(hi, 2));
  }
  __m256i scales(int k) const { return sc.lanes(k); }
};

// IQ4_XS: the 8 six-bit scales (bias 32) as int32 lanes: low nibble ib of
// the 32-bit scales_l, high bits 2 ib of the 16-bit scales_h.
inline __m256i iq4xs_scales32(const uint8_t* b) {
  uint16_t sh;
  uint32_t sl;
  std::memcpy(&sh, b + 2, 2);
  std::memcpy(&sl, b + 4, 4);
  const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sl)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                      _mm256_set1_epi32(0x0f));
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                      _mm256_set1_epi32(3));
  return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

// IQ4_XS: chunk k is sub-block k through the table; scale lanes sc[k].
template <>
struct KRegs<DType::IQ4_XS> {
  static constexpr size_t kBytes = 136;
  static constexpr bool kPair = false;
  __m256i sc2;  // the 8 scales as int16, in both 128-bit halves
  __m256i mn;
  float d, dm;
  const uint8_t* qs;
  explicit KRegs(const uint8_t* b) : mn(_mm256_setzero_si256()), qs(b + 8) {
    const __m256i s32 = iq4xs_scales32(b);
    const __m256i p = _mm256_packs_epi32(s32, s32);  // [0..3 0..3 | 4..7 4..7]
    sc2 = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0))));
    d = dm = half_hw(b);
  }
  __m256i codes(int k) const {
    const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                           -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return _mm256_shuffle_epi8(table, nibbles32(qs + 16 * k));
  }
  __m256i scales(int k) const { return scale_lanes8(sc2, k); }
};

// R rows from the stored blocks x C x rows (x row c at xq + c * xcols, its
// scales and bsums likewise); pf: the same bytes of a later tile, or null.
template <DType T, int R, int C>
void k_gemv(const uint8_t* w, size_t rb, int64_t nsb, const int8_t* xq, const float* xd, const int16_t* xbs,
            int64_t xcols, float* y, int64_t ys, const uint8_t* pf) {
  constexpr bool MinD = k_min_uses_d(T), Signed = k_signed(T), Pair = KRegs<T>::kPair;
  constexpr size_t BB = KRegs<T>::kBytes;
  __m256 acc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    // kPair types: scales, minimums, d, dm of rows 2h, 2h + 1 together (a
    // missing last row repeats row 0 and is never used).
    KRow meta[4];
    if constexpr (Pair) {
      LLM_UNROLL for (int h = 0; h < (R + 1) / 2; ++h)
        KRegs<T>::pair(w + size_t(2 * h) * rb + size_t(sb) * BB,
                       w + size_t(2 * h + 1 < R ? 2 * h + 1 : 0) * rb + size_t(sb) * BB, meta + 2 * h);
    }
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + size_t(sb) * BB;
      if (pf) prefetch_bytes(pf + r * rb + size_t(sb) * BB, BB);
      const KRegs<T> u(blk);
      __m256i mn;
      float d, dm;
      if constexpr (Pair) {
        mn = meta[r].mn;
        d = meta[r].d;
        dm = meta[r].dm;
      } else {
        mn = u.mn;
        d = u.d;
        dm = u.dm;
      }
      __m256i S[C];
      LLM_UNROLL for (int c = 0; c < C; ++c) S[c] = _mm256_setzero_si256();
      LLM_UNROLL for (int k = 0; k < 8; ++k) {
        __m256i wq = u.codes(k), s;
        if constexpr (Pair)
          s = scale_lanes8(meta[r].sc2, k);
        else
          s = u.scales(k);
        if constexpr (Signed) {
          const __m256i aw = _mm256_sign_epi8(wq, wq);
          LLM_UNROLL for (int c = 0; c < C; ++c)
            S[c] = _mm256_add_epi32(
                S[c], _mm256_madd_epi16(
                          _mm256_maddubs_epi16(aw, _mm256_sign_epi8(load256(xq + c * xcols + sb * 256 + 32 * k), wq)),
                          s));
        } else {
          LLM_UNROLL for (int c = 0; c < C; ++c)
            S[c] = _mm256_add_epi32(
                S[c], _mm256_madd_epi16(_mm256_maddubs_epi16(wq, load256(xq + c * xcols + sb * 256 + 32 * k)), s));
        }
      }
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        const __m256i M = _mm256_madd_epi16(load256(xbs + c * (xcols / 16) + sb * 16), mn);
        const float dx = xd[c * (xcols / 256) + sb];
        if constexpr (MinD) {
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[c], M)), _mm256_set1_ps(d * dx),
                                      acc[r][c]);
        } else {
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[c]), _mm256_set1_ps(d * dx), acc[r][c]);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_set1_ps(-(dm * dx)), acc[r][c]);
        }
      }
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c)
    LLM_UNROLL for (int r = 0; r < R; ++r) y[c * ys + r] = hsum(acc[r][c]);
}

template <DType T, int R>
void k_decode_rows(const uint8_t* wr, const WeightView& w, const GgmlX& x, int64_t n, float* y, const uint8_t* pf) {
  const int64_t nsb = w.cols / 256, cols = x.cols;
  int64_t c0 = 0;
  for (; c0 + kDecCols <= n; c0 += kDecCols)
    k_gemv<T, R, kDecCols>(wr, w.row_bytes, nsb, x.q + c0 * cols, x.d + c0 * nsb, x.bsums + c0 * (cols / 16), cols,
                           y + c0 * w.rows, w.rows, c0 == 0 ? pf : nullptr);
  if (c0 < n)
    k_gemv<T, R, 1>(wr, w.row_bytes, nsb, x.q + c0 * cols, x.d + c0 * nsb, x.bsums + c0 * (cols / 16), cols,
                    y + c0 * w.rows, w.rows, c0 == 0 ? pf : nullptr);
}

template <DType T>
void k_decode(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const size_t ahead = decode_ahead(w);
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int nr = int(std::min<int64_t>(kRowTile, r1 - r));
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    switch (nr) {
      case 4: k_decode_rows<T, 4>(wr, w, x, n, y + r, wr + ahead); break;
      case 3: k_decode_rows<T, 3>(wr, w, x, n, y + r, wr + ahead); break;
      case 2: k_decode_rows<T, 2>(wr, w, x, n, y + r, wr + ahead); break;
      default: k_decode_rows<T, 1>(wr, w, x, n, y + r, wr + ahead); break;
    }
  }
}

// True when k_decode<T> ran the rows.
bool k_decode_any(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::Q4_K: k_decode<DType::Q4_K>(w, x, n, y, r0, r1); return true;
    case DType::Q5_K: k_decode<DType::Q5_K>(w, x, n, y, r0, r1); return true;
    case DType::Q6_K: k_decode<DType::Q6_K>(w, x, n, y, r0, r1); return true;
    case DType::IQ4_XS: k_decode<DType::IQ4_XS>(w, x, n, y, r0, r1); return true;
    case DType::Q2_K: k_decode<DType::Q2_K>(w, x, n, y, r0, r1); return true;
    case DType::Q3_K: k_decode<DType::Q3_K>(w, x, n, y, r0, r1); return true;
    default: return false;
  }
}

// Prefill: kTileGroup tiles of kRowTile W rows are unpacked first, then the
// x rows run against all of them kXBlock at a time, so that each x block is
// read from memory once per group (and stays in L2 while the group's tiles
// run) rather than once per tile: a prefill's x outgrows L2 (512 rows of
// 5632 codes are 2.9 MB). Each output is still one k_tile's sum over every
// super-block: the order of the loops around it does not change its bits.
constexpr int kTileGroup = 16;
constexpr int64_t kXBlock = 16;

template <bool MinD, bool Signed = false>
void k_matmul(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (n <= kDirectBatch && k_decode_any(w, x, n, y, r0, r1)) return;
  const int64_t nsb = w.cols / 256, cols = x.cols;
  thread_local std::vector<KUnpacked> buf;
  if (buf.size() < size_t(kTileGroup * kRowTile * nsb)) buf.resize(size_t(kTileGroup * kRowTile * nsb));
  for (int64_t g = r0; g < r1; g += kTileGroup * kRowTile) {
    const int64_t g1 = std::min<int64_t>(r1, g + kTileGroup * kRowTile);
    for (int64_t r = g; r < g1; r += kRowTile) {
      const int nr = int(std::min<int64_t>(kRowTile, g1 - r));
      const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
      const uint8_t* pf = n <= kSmallBatch ? wr + decode_ahead(w) : nullptr;
      unpack_k_rows_avx2(w.dtype, wr, w.row_bytes, nr, 0, nsb, buf.data() + (r - g) * nsb, nsb, pf);
    }
    for (int64_t c0 = 0; c0 < n; c0 += kXBlock) {
      const int64_t cn = std::min<int64_t>(kXBlock, n - c0);
      GgmlX xb = x;
      xb.q += c0 * cols;
      xb.d += c0 * (cols / 256);
      xb.bsums += c0 * (cols / 16);
      for (int64_t r = g; r < g1; r += kRowTile) {
        const KUnpacked* wb = buf.data() + (r - g) * nsb;
        float* yr = y + r + c0 * w.rows;
        switch (std::min<int64_t>(kRowTile, g1 - r)) {
          case 4: k_rows<4, MinD, Signed>(wb, nsb, xb, cn, yr, w.rows); break;
          case 3: k_rows<3, MinD, Signed>(wb, nsb, xb, cn, yr, w.rows); break;
          case 2: k_rows<2, MinD, Signed>(wb, nsb, xb, cn, yr, w.rows); break;
          default: k_rows<1, MinD, Signed>(wb, nsb, xb, cn, yr, w.rows); break;
        }
      }
    }
  }
}

// --- 32-value tiles --------------------------------------------------------

// How a 32-value type's codes w meet x in vpmaddubsw, which takes one
// operand unsigned: IQ4_NL's are signed (|w| against x with w's sign), Q5_1's
// are unsigned (0..31), and Q5_0's are given as w + kOffset = 0..31, the
// offset's 16 * (x pair) taken off each int16 pair sum. The int32 lanes are
// the same integers in every case.
template <DType T>
struct B32Codes {
  static constexpr bool kUnsigned = T != DType::IQ4_NL;
  static constexpr int kOffset = T == DType::Q5_0 ? 16 : 0;
};

// Where a 32-value tile reads W from: the unpacked tile buffer (prefill) or
// the stored blocks, decoded in registers (decode). Both give the same codes
// and scales, so the same outputs.
template <DType T>
struct B32Buffer : B32Codes<T> {
  const int8_t* q;  // [R][qs] codes as unpack_b32_ref gives them
  int64_t qs;
  const float* d;   // [R][ds] scales (m: minimums, Q5_1)
  const float* m;
  int64_t ds;
  B32Buffer(const int8_t* q_, int64_t qs_, const float* d_, const float* m_, int64_t ds_)
      : q(q_), qs(qs_), d(d_), m(m_), ds(ds_) {}
  __m256i code(int r, int64_t b) const {
    const __m256i v = load256(q + r * qs + 32 * b);
    if constexpr (B32Codes<T>::kOffset != 0) return _mm256_add_epi8(v, _mm256_set1_epi8(B32Codes<T>::kOffset));
    return v;
  }
  __m256 scales(int r, int64_t b0, int64_t n) const { return load8_tail(d + r * ds + b0, n); }
  __m256 mins(int r, int64_t b0, int64_t n) const { return load8_tail(m + r * ds + b0, n); }
  void prefetch(int, int64_t) const {}
};

template <DType T>
struct B32Stored : B32Codes<T> {
  static constexpr size_t kBB = T == DType::Q5_0 ? 22 : T == DType::Q5_1 ? 24 : 18;
  const uint8_t* w;   // R rows of blocks, rb bytes apart
  size_t rb;
  const uint8_t* pf;  // the next tile, or null
  B32Stored(const uint8_t* w_, size_t rb_, const uint8_t* pf_) : w(w_), rb(rb_), pf(pf_) {}
  // Q5_0: the stored code q, 0..31, is already w + 16.
  __m256i code(int r, int64_t b) const {
    const uint8_t* blk = w + r * rb + size_t(b) * kBB;
    if constexpr (T == DType::Q5_0) return q5_codes(blk + 2);
    return unpack_b32(T, blk);
  }
  // The f16 at offset `at` of blocks b0 .. b0 + n - 1 (n <= 8), zero padded.
  // Assembled in general-purpose registers: 8 two-byte stores read back as
  // one vector would stall on store-to-load forwarding.
  __m256 halves(int r, int64_t b0, int64_t n, size_t at) const {
    const uint8_t* p = w + r * rb + size_t(b0) * kBB + at;
    uint64_t lo = 0, hi = 0;
    if (n == 8) {
      LLM_UNROLL for (int i = 0; i < 4; ++i) {
        uint16_t a, b;
        std::memcpy(&a, p + i * kBB, 2);
        std::memcpy(&b, p + (i + 4) * kBB, 2);
        lo |= uint64_t(a) << (16 * i);
        hi |= uint64_t(b) << (16 * i);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t a;
        std::memcpy(&a, p + size_t(i) * kBB, 2);
        (i < 4 ? lo : hi) |= uint64_t(a) << (16 * (i % 4));
      }
    }
    return _mm256_cvtph_ps(_mm_set_epi64x(int64_t(hi), int64_t(lo)));
  }
  __m256 scales(int r, int64_t b0, int64_t n) const { return halves(r, b0, n, 0); }
  __m256 mins(int r, int64_t b0, int64_t n) const { return halves(r, b0, n, 2); }
  void prefetch(int r, int64_t b) const {
    if (!pf) return;
    const size_t off = size_t(b) * kBB;
    if (b == 0 || off / 64 != (off + kBB - 1) / 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf + r * rb + off + kBB - 1), _MM_HINT_T0);
  }
};

// R W rows x C x rows over nb blocks; writes y[c * ys + r].
template <int R, int C, bool Min, class Src>
void b32_tile(const Src& src, int64_t nb, const int8_t* xq, const float* xd, const float* xs, int64_t xcols, float* y,
              int64_t ys) {
  constexpr bool Unsigned = Src::kUnsigned;
  constexpr int Off = Src::kOffset;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][C], macc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r) {
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      macc[r][c] = _mm256_setzero_ps();
    }
  }
  alignas(32) float d8[R][C][8];
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int64_t m = std::min<int64_t>(8, nb - b0);
    __m256 dx8[C], s8[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      dx8[c] = load8_tail(xd + c * nb + b0, m);
      if constexpr (Min) s8[c] = load8_tail(xs + c * nb + b0, m);
    }
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const __m256 dw = src.scales(r, b0, m);
      __m256 mw = _mm256_setzero_ps();
      if constexpr (Min) mw = src.mins(r, b0, m);
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        _mm256_store_ps(d8[r][c], _mm256_mul_ps(dw, dx8[c]));
        if constexpr (Min) macc[r][c] = _mm256_fmadd_ps(mw, s8[c], macc[r][c]);
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int64_t b = b0 + i;
      __m256i xv[C], xoff[C];
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        xv[c] = load256(xq + c * xcols + 32 * b);
        // The code offset's share of every pair sum, once for the R rows.
        if constexpr (Off != 0) xoff[c] = _mm256_maddubs_epi16(_mm256_set1_epi8(Off), xv[c]);
      }
      LLM_UNROLL for (int r = 0; r < R; ++r) {
        src.prefetch(r, b);
        const __m256i wv = src.code(r, b);
        __m256i aw = wv;
        if constexpr (!Unsigned) aw = _mm256_sign_epi8(wv, wv);  // |w| <= 127
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          // int16 pairs: signed, two products of at most 127 * 127;
          // unsigned, at most 2 * 31 * 127, less the offset's 16 * 254.
          __m256i pairs;
          if constexpr (Unsigned) {
            pairs = _mm256_maddubs_epi16(aw, xv[c]);
            if constexpr (Off != 0) pairs = _mm256_sub_epi16(pairs, xoff[c]);
          } else {
            pairs = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[c], wv));
          }
          const __m256i p = _mm256_madd_epi16(pairs, ones);
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&d8[r][c][i]), acc[r][c]);
        }
      }
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      float v = hsum(acc[r][c]);
      if constexpr (Min) v += hsum(macc[r][c]);
      y[c * ys + r] = v;
    }
  }
}

constexpr int kBCols = 2;

template <int R, bool Min, class Src>
void b32_rows(const Src& src, int64_t nb, const GgmlX& x, int64_t n, float* y, int64_t ys) {
  const int64_t cols = x.cols;
  auto tile = [&](auto cols_tag, int64_t c0) {
    constexpr int C = decltype(cols_tag)::value;
    b32_tile<R, C, Min>(src, nb, x.q + c0 * cols, x.d + c0 * nb, Min ? x.s + c0 * nb : nullptr, cols, y + c0 * ys,
                        ys);
  };
  int64_t c0 = 0;
  for (; c0 + kBCols <= n; c0 += kBCols) tile(std::integral_constant<int, kBCols>{}, c0);
  for (; c0 < n; ++c0) tile(std::integral_constant<int, 1>{}, c0);
}

template <DType T>
void b32_matmul(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  constexpr bool Min = T == DType::Q5_1;
  const int64_t nb = w.cols / 32;
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf;
  if (n > 1) {
    if (qbuf.size() < size_t(kRowTile * w.cols)) qbuf.resize(size_t(kRowTile * w.cols));
    if (dbuf.size() < size_t(2 * kRowTile * nb)) dbuf.resize(size_t(2 * kRowTile * nb));
  }
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int nr = int(std::min<int64_t>(kRowTile, r1 - r));
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    if (n == 1) {
      const B32Stored<T> src(wr, w.row_bytes, wr + decode_ahead(w));
      const float* xs = Min ? x.s : nullptr;
      switch (nr) {
        case 4: b32_tile<4, 1, Min>(src, nb, x.q, x.d, xs, w.cols, y + r, w.rows); break;
        case 3: b32_tile<3, 1, Min>(src, nb, x.q, x.d, xs, w.cols, y + r, w.rows); break;
        case 2: b32_tile<2, 1, Min>(src, nb, x.q, x.d, xs, w.cols, y + r, w.rows); break;
        default: b32_tile<1, 1, Min>(src, nb, x.q, x.d, xs, w.cols, y + r, w.rows); break;
      }
      continue;
    }
    float* wd = dbuf.data();
    float* wm = dbuf.data() + kRowTile * nb;
    unpack_b32_rows_avx2(T, wr, w.row_bytes, nr, 0, nb, qbuf.data(), w.cols, wd, Min ? wm : nullptr, nb,
                         n <= kSmallBatch ? wr + decode_ahead(w) : nullptr);
    const B32Buffer<T> src(qbuf.data(), w.cols, wd, wm, nb);
    switch (nr) {
      case 4: b32_rows<4, Min>(src, nb, x, n, y + r, w.rows); break;
      case 3: b32_rows<3, Min>(src, nb, x, n, y + r, w.rows); break;
      case 2: b32_rows<2, Min>(src, nb, x, n, y + r, w.rows); break;
      default: b32_rows<1, Min>(src, nb, x, n, y + r, w.rows); break;
    }
  }
}

// --- activation quantization -------------------------------------------------
// The same bytes as quantize_ggml_x (matmul_ggml.cpp): the products are the
// same f32 values and vcvtps2dq rounds them half to even (default MXCSR),
// as the scalar code's magic-number rounding does.

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 32 floats times s, rounded, as 32 int8 in order (|values| <= 127).
inline __m256i round_pack32(const float* x, __m256 s) {
  __m256i i[4];
  LLM_UNROLL for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), s));
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// max |x| over n (a multiple of 8) floats; `bad` set if any is NaN or Inf.
inline float amax_of(const float* x, int n, bool* bad) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 m = _mm256_setzero_ps(), nonfinite = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask);
    nonfinite = _mm256_or_ps(nonfinite, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // a >= inf or NaN
    m = _mm256_max_ps(m, a);
  }
  *bad = _mm256_movemask_ps(nonfinite) != 0;
  return hmax(m);
}

void quantize_q8_0_blocks(const float* x, int64_t nb, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < nb; ++b) {
    bool bad;
    const float amax = amax_of(x + 32 * b, 32, &bad);
    int8_t* qb = q + 32 * b;
    if (bad) {
      store256(qb, _mm256_setzero_si256());
      d[b] = NAN;
      if (s) s[b] = NAN;
      continue;
    }
    const float dd = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    d[b] = s ? _cvtsh_ss(_cvtss_sh(dd, 0)) : dd;  // Q8_0 keeps d in f32 (matmul_ggml.h)
    const __m256i v = round_pack32(x + 32 * b, _mm256_set1_ps(id));
    store256(qb, v);
    if (s) {
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
      s[b] = _cvtsh_ss(_cvtss_sh(dd * float(_mm_cvtsi128_si32(t)), 0));
    }
  }
}

void quantize_q8_k_blocks(const float* x, int64_t nb, int8_t* q, float* d, int16_t* bsums) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + 256 * b;
    int8_t* qb = q + 256 * b;
    int16_t* bs = bsums + 16 * b;
    bool bad;
    const float amax = amax_of(xb, 256, &bad);
    if (bad || amax == 0.0f) {
      for (int k = 0; k < 8; ++k) store256(qb + 32 * k, _mm256_setzero_si256());
      store256(bs, _mm256_setzero_si256());
      d[b] = bad ? NAN : 0.0f;
      continue;
    }
    int j = 0;  // the first value of largest magnitude sets the sign
    while (std::fabs(xb[j]) != amax) ++j;
    const float iscale = -127.0f / xb[j];
    const __m256 s = _mm256_set1_ps(iscale);
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int k = 0; k < 8; ++k) {
      const __m256i v = round_pack32(xb + 32 * k, s);
      store256(qb + 32 * k, v);
      // Sums of 16: the int16 pairs summed within each half.
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), _mm256_set1_epi16(1));  // 8 x 4 values
      const __m256i h = _mm256_hadd_epi32(p, p);   // per lane: [s01, s23, s01, s23]
      const __m256i h2 = _mm256_hadd_epi32(h, h);  // per lane: 16-sum in every element
      bs[2 * k] = int16_t(_mm256_extract_epi32(h2, 0));
      bs[2 * k + 1] = int16_t(_mm256_extract_epi32(h2, 4));
    }
    d[b] = 1.0f / iscale;
  }
}

}  // namespace

void unpack_k_rows_avx2(DType t, const uint8_t* w, size_t rb, int nr, int64_t b0, int64_t b1, KUnpacked* out,
                        int64_t ostride, const uint8_t* pf) {
  const size_t bb = ggml_block_bytes(t);
  for (int r = 0; r < nr; ++r) {
    const uint8_t* row = w + size_t(r) * rb;
    KUnpacked* o = out + r * ostride;
    for (int64_t b = b0; b < b1; ++b) {
      if (pf) prefetch_bytes(pf + size_t(r) * rb + size_t(b) * bb, bb);
      const uint8_t* blk = row + size_t(b) * bb;
      KUnpacked* ob = o + (b - b0);
      switch (t) {
        case DType::Q2_K: unpack_q2k(blk, ob); break;
        case DType::Q3_K: unpack_q3k(blk, ob); break;
        case DType::Q4_K: unpack_q45k<false>(blk, ob); break;
        case DType::Q5_K: unpack_q45k<true>(blk, ob); break;
        case DType::IQ4_XS: unpack_iq4xs(blk, ob); break;
        default: unpack_q6k(blk, ob); break;
      }
    }
  }
}

void unpack_b32_rows_avx2(DType t, const uint8_t* w, size_t rb, int nr, int64_t b0, int64_t b1, int8_t* q,
                          int64_t qstride, float* d, float* m, int64_t dstride, const uint8_t* pf) {
  const size_t bb = ggml_block_bytes(t);
  for (int r = 0; r < nr; ++r) {
    const uint8_t* row = w + size_t(r) * rb;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* blk = row + size_t(b) * bb;
      // The next rows' bytes, one prefetch per cache line (a line is never
      // inside one block: 18..24 < 64).
      const size_t off = size_t(b) * bb;
      if (pf && (b == b0 || off / 64 != (off + bb - 1) / 64))
        _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(r) * rb + off + bb - 1), _MM_HINT_T0);
      store256(q + r * qstride + 32 * (b - b0), unpack_b32(t, blk));
      d[r * dstride + b - b0] = half_at(blk);
      if (m) m[r * dstride + b - b0] = t == DType::Q5_1 ? half_at(blk + 2) : 0.0f;
    }
  }
}

void quantize_ggml_x_avx2(GgmlAct a, const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                          int16_t* bsums) {
  const int64_t blk = ggml_act_block(a), nb = cols / blk;
  for (int64_t i = 0; i < n; ++i) {
    if (a == GgmlAct::Q8_K)
      quantize_q8_k_blocks(x + i * cols, nb, q + i * cols, d + i * nb, bsums + i * (cols / 16));
    else
      quantize_q8_0_blocks(x + i * cols, nb, q + i * cols, d + i * nb, a == GgmlAct::Q8_1 ? s + i * nb : nullptr);
  }
}

void matmul_ggml_avx2(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (x.act == GgmlAct::Q8_K) {
    if (k_signed(w.dtype))
      k_matmul<true, true>(w, x, n, y, r0, r1);
    else if (k_min_uses_d(w.dtype))
      k_matmul<true>(w, x, n, y, r0, r1);
    else
      k_matmul<false>(w, x, n, y, r0, r1);
  } else if (w.dtype == DType::Q5_0) {
    b32_matmul<DType::Q5_0>(w, x, n, y, r0, r1);
  } else if (w.dtype == DType::Q5_1) {
    b32_matmul<DType::Q5_1>(w, x, n, y, r0, r1);
  } else {
    b32_matmul<DType::IQ4_NL>(w, x, n, y, r0, r1);
  }
}

}  // namespace llm::cpu::kern

#undef LLM_UNROLL
