// AVX-512 (F/BW/VL/DQ/VNNI) kernels for the GGUF block types
// (matmul_ggml.h). Compiled with those flags and only entered after
// use_avx512_kernels() said yes. Q5_1 is not here: the dispatcher hands it to
// the AVX2 kernels (ggml_avx512_runs), for decode and prefill alike.
//
// K-quants (Q8_K activations with sub-scales e, quantize_q8_ks). The
// family's order, per (W row, x row) and super-block: S = sum over
// sub-blocks k of (sc_k * e_k) * dot_k and M = sum over
// 16-value groups j of mn_j * bsums_j, both exact int32 (IQ4_XS: codes + 128
// with mn_j = 128 * sc_j, the same S - M), then
//   Q3_K, Q6_K, IQ4_XS: acc = fma(float(S - M), d * d_x, acc);
//   Q2_K, Q4_K, Q5_K:   acc = fma(float(S), d * d_x, acc);
//                       acc = fma(float(M), dm * -d_x, acc);
// and the output is acc. Prefill and batches of more than kDirectBatch x
// rows decode 16 W rows once per call, straight from the stored blocks, into
// a panel with the rows in lanes: vpdpbusd of 4 codes per row against 4
// bytes of an x row broadcast, vpmulld by the sub-block's sc * e, vpdpwssd
// of minimum pairs against bsum pairs. Decode reads the stored blocks in
// registers (KRegs), sums the same integers over the lanes of vpmaddubsw /
// vpdpwssd and does the same f32 operations with 4 rows in lanes.
// Q5_0, IQ4_NL (Q8_0 activations): the quad layout of gemm_kernels.h, 4
//   blocks per step. W codes are unsigned with a bias (Q5_0: the 5-bit code,
//   bias 16; IQ4_NL: table value + 128); x's quads start each dot from
//   -bias * (their lane sums). Decode decodes the stored blocks in
//   registers; prefill decodes a W tile once into a buffer. Per quad: t = vpdpbusd(vpdpbusd(
//   corr, a_w, a_x), b_w, b_x), acc = fma(float(t), d_w * d_x, acc) (lane
//   4j + i belongs to block j); the output is hsum16(acc).
// hsum16(v): the 256-bit halves added, then 128-bit halves, then
// ((l0 + l2) + (l1 + l3)). Every (W row, x row) pair sees the same
// operations whatever the tile: batch invariant within this family.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning group
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/matmul_ggml.h"
#include "core/error.h"

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
// still streams W from DRAM: the Q5_0 / IQ4_NL tile decoding prefetches as
// decode does (the K-quant panels prefetch the next group at any n).
constexpr int64_t kSmallBatch = 16;

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hsum16(__m512 v) {
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

// --- K-quant prefill panels -----------------------------------------------
//
// A panel is kPanel W rows decoded once per call into the layout vpdpbusd
// wants with W rows in lanes: per super-block, 4 codes of each of 16 rows
// per 64 bytes, so one vector of codes meets 4 bytes of an x row broadcast
// to all lanes. Each lane (W row) keeps its own exact integer sums; the x
// rows of a column tile share the code vectors.

constexpr int kPanel = 16;

// One super-block of a panel. Codes are unsigned (IQ4_XS: table value + 128,
// whose minimum is then 128 * scale); scales per 16 values as int32 lanes
// (for vpmulld); minimums as int16 pairs (2j, 2j + 1) per lane (for
// vpdpwssd against the pair of x's bsums).
struct alignas(64) KPanelSb {
  uint32_t q[64][kPanel];
  int32_t sc[16][kPanel];
  int32_t mn[8][kPanel];
  float d[kPanel], dm[kPanel];
};

// --- Panels straight from the stored blocks ----------------------------------
//
// Every K-quant keeps its codes 4 values to a dword of the stored bytes, in
// the order the panel wants (a nibble, or a 2-bit plane, per value), so a
// dword transpose of the stored bytes of 16 rows, 16 bytes of each at a
// time, then a mask or a shift per plane (plus the high bits, or IQ4_XS's
// table), gives the panel's code vectors; the scales are decoded with the
// rows already in lanes. (The panels were first built from KUnpacked rows,
// by the AVX2 unpackers and gathers: with 16 x rows, batched decode, that
// cost more than the dots.)
// The codes, scales and minimums are unpack_k_ref's integers; d and dm come
// from F16C, as in k_gemv. Lanes past nr repeat row 0 (no read past the
// matrix): the tile stores only the live lanes and no operation mixes lanes,
// so their contents never matter.

// Dwords 0..3 of the 16 bytes at row[r] + off, for the 16 rows: out[e]
// lane r holds dword e of row r. The loads put row 4L + q in 128-bit lane L
// of v[q], so one 4 x 4 dword transpose within the 128-bit lanes leaves the
// rows in order (a 16 x 16 transpose of whole 64-byte rows took twice the
// shuffles, and its 32 live registers spilled).
inline void transpose_rows4(const uint8_t* const row[16], size_t off, __m512i out[4]) {
  __m512i v[4];
  const auto load = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + off)); };
  // The lane index of vinserti32x4 is an immediate: written out, not a loop
  // variable (clang rejects one even when the loop is unrolled).
  LLM_UNROLL for (int q = 0; q < 4; ++q) {
    v[q] = _mm512_castsi128_si512(load(q));
    v[q] = _mm512_inserti32x4(v[q], load(4 + q), 1);
    v[q] = _mm512_inserti32x4(v[q], load(8 + q), 2);
    v[q] = _mm512_inserti32x4(v[q], load(12 + q), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The 16 halves in the low (high = false) or high 16 bits of each lane, as floats.
inline __m512 halves_ps(__m512i v, bool high) {
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(high ? _mm512_srli_epi32(v, 16) : v));
}

// The vpdpwssd operand of a minimum pair: (a << shift) as the low int16 of
// each lane, (b << shift) as the high one (a, b: int32 lanes that fit).
inline __m512i min_pair(__m512i a, __m512i b, int shift) {
  return _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(a, shift), _mm512_set1_epi32(0xffff)),
                         _mm512_slli_epi32(b, 16 + shift));
}

// a | (b & c), one instruction.
inline __m512i or_and(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xf8); }

// Q4_K / Q5_K: f16 d | f16 dmin | scales[12] | [Q5_K: qh[32]] | qs[128]. qs
// dword m (of 32) holds values 64 (m / 8) + 4 (m % 8) .. + 3 in its low
// nibbles (sub-block 2 (m / 8)) and the same of sub-block 2 (m / 8) + 1 in
// its high ones; Q5_K's qh dword g holds bit j of values 32 j + 4 g .. + 3.
template <bool Five>
void panel_sb_q45k(const uint8_t* const row[16], KPanelSb& p) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10);
  __m512i qh[8];
  auto codes = [&](int m, __m512i v) {
    const int c = m / 8, g = m % 8;
    __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
    if constexpr (Five) {
      // Bit j of each byte to bit 4: j = 2c (lo) and 2c + 1 (hi).
      const int j = 2 * c;
      lo = or_and(lo, j <= 4 ? _mm512_slli_epi32(qh[g], 4 - j) : _mm512_srli_epi32(qh[g], j - 4), b4);
      hi = or_and(hi, j + 1 <= 4 ? _mm512_slli_epi32(qh[g], 3 - j) : _mm512_srli_epi32(qh[g], j - 3), b4);
    }
    _mm512_store_si512(p.q[16 * c + g], lo);
    _mm512_store_si512(p.q[16 * c + 8 + g], hi);
  };
  // qs 4 dwords at a time (Q5_K: after qh's 8), the fewest registers live.
  const size_t qs_off = Five ? 48 : 16;
  if constexpr (Five) {
    transpose_rows4(row, 16, qh);
    transpose_rows4(row, 32, qh + 4);
  }
  LLM_UNROLL for (int c = 0; c < 8; ++c) {
    __m512i t[4];
    transpose_rows4(row, qs_off + 16 * size_t(c), t);
    LLM_UNROLL for (int e = 0; e < 4; ++e) codes(4 * c + e, t[e]);
  }
  __m512i h[4];  // d | dmin, scales bytes 0..3, 4..7, 8..11
  transpose_rows4(row, 0, h);
  const __m512i m6 = _mm512_set1_epi32(63), m4d = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3);
  LLM_UNROLL for (int j = 0; j < 8; ++j) {
    __m512i sc, mn;
    if (j < 4) {
      sc = _mm512_and_si512(_mm512_srli_epi32(h[1], 8 * j), m6);
      mn = _mm512_and_si512(_mm512_srli_epi32(h[2], 8 * j), m6);
    } else {
      const int i = j - 4;
      sc = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 8 * i), m4d),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[1], 8 * i + 6), m2), 4));
      mn = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 8 * i + 4), m4d),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[2], 8 * i + 6), m2), 4));
    }
    _mm512_store_si512(p.sc[2 * j], sc);
    _mm512_store_si512(p.sc[2 * j + 1], sc);
    _mm512_store_si512(p.mn[j], min_pair(mn, mn, 0));
  }
  _mm512_store_ps(p.d, halves_ps(h[0], false));
  _mm512_store_ps(p.dm, halves_ps(h[0], true));
}

// Q6_K: ql[128] | qh[64] | int8 scales[16] | f16 d. Values 128 n + 32 q +
// 4 g .. + 3 (quarter q, g < 8): the low (q < 2) or high nibbles of ql dword
// 16 n + 8 (q & 1) + g, plus bits 2q, 2q + 1 of qh dword 8 n + g as bits 4, 5.
void panel_sb_q6k(const uint8_t* const row[16], const uint8_t* d_word, const __m512i& row_off, KPanelSb& p) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), b45 = _mm512_set1_epi8(0x30);
  // Per half n and 4-dword chunk gc of g: ql dwords 16 n + 4 gc .. (low
  // nibbles: quarter 0, high: 2), 16 n + 8 + 4 gc .. (quarters 1, 3) and qh
  // dwords 8 n + 4 gc ..: 12 registers live, none spilled.
  LLM_UNROLL for (int n = 0; n < 2; ++n) {
    LLM_UNROLL for (int gc = 0; gc < 2; ++gc) {
      __m512i ql[2][4], qh[4];
      transpose_rows4(row, size_t(64 * n + 16 * gc), ql[0]);
      transpose_rows4(row, size_t(64 * n + 32 + 16 * gc), ql[1]);
      transpose_rows4(row, size_t(128 + 32 * n + 16 * gc), qh);
      LLM_UNROLL for (int q = 0; q < 4; ++q) {
        LLM_UNROLL for (int e = 0; e < 4; ++e) {
          const __m512i l = ql[q & 1][e];
          const __m512i nib = q < 2 ? _mm512_and_si512(l, m4) : _mm512_and_si512(_mm512_srli_epi32(l, 4), m4);
          const __m512i hv = qh[e];
          const __m512i hs = q < 2 ? _mm512_slli_epi32(hv, 4 - 2 * q) : (q == 2 ? hv : _mm512_srli_epi32(hv, 2));
          _mm512_store_si512(p.q[32 * n + 8 * q + 4 * gc + e], or_and(nib, hs, b45));
        }
      }
    }
  }
  __m512i s[4];
  transpose_rows4(row, 192, s);
  __m512i sc[16];
  LLM_UNROLL for (int k = 0; k < 16; ++k) {
    sc[k] = _mm512_srai_epi32(_mm512_slli_epi32(s[k / 4], 24 - 8 * (k % 4)), 24);
    _mm512_store_si512(p.sc[k], sc[k]);
  }
  LLM_UNROLL for (int j = 0; j < 8; ++j) _mm512_store_si512(p.mn[j], min_pair(sc[2 * j], sc[2 * j + 1], 5));  // 32 * scale
  // d at bytes 208..209: the high half of the dword at 206 (in the block).
  const __m512 d = halves_ps(_mm512_i32gather_epi32(row_off, d_word, 1), true);
  _mm512_store_ps(p.d, d);
  _mm512_store_ps(p.dm, d);
}

// Q2_K: scales[16] (low nibble scale, high nibble minimum) | qs[64] | f16 d |
// f16 dmin. Values 128 n + 32 j + 4 g .. + 3 (plane j, g < 8): bits 2j, 2j + 1
// of qs dword 8 n + g.
void panel_sb_q2k(const uint8_t* const row[16], const uint8_t* d_word, const __m512i& row_off, KPanelSb& p) {
  const __m512i m2 = _mm512_set1_epi8(3);
  LLM_UNROLL for (int c = 0; c < 4; ++c) {  // qs dwords 4c .. 4c + 3: n = c / 2, g = 4 (c % 2) + e
    __m512i qs[4];
    transpose_rows4(row, 16 + 16 * size_t(c), qs);
    LLM_UNROLL for (int j = 0; j < 4; ++j)
      LLM_UNROLL for (int e = 0; e < 4; ++e)
        _mm512_store_si512(p.q[32 * (c / 2) + 8 * j + 4 * (c % 2) + e],
                           _mm512_and_si512(_mm512_srli_epi32(qs[e], 2 * j), m2));
  }
  __m512i s[4];
  transpose_rows4(row, 0, s);
  const __m512i m4 = _mm512_set1_epi32(15);
  LLM_UNROLL for (int k = 0; k < 16; ++k)
    _mm512_store_si512(p.sc[k], _mm512_and_si512(_mm512_srli_epi32(s[k / 4], 8 * (k % 4)), m4));
  // Minimum pairs (2j, 2j + 1): the high nibbles of bytes 2j, 2j + 1.
  const __m512i lo16 = _mm512_set1_epi32(0x000f), hi16 = _mm512_set1_epi32(0x000f0000);
  LLM_UNROLL for (int j = 0; j < 8; ++j) {
    const __m512i v = s[j / 2], b = (j % 2) ? _mm512_srli_epi32(v, 16) : v;  // bytes 2j, 2j + 1 low
    _mm512_store_si512(p.mn[j], _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(b, 4), lo16),
                                                _mm512_and_si512(_mm512_slli_epi32(b, 4), hi16)));
  }
  const __m512i dd = _mm512_i32gather_epi32(row_off, d_word, 1);  // d | dmin at byte 80
  _mm512_store_ps(p.d, halves_ps(dd, false));
  _mm512_store_ps(p.dm, halves_ps(dd, true));
}

// Q3_K: hmask[32] | qs[64] | scales[12] (16 x 6 bits, bias 32) | f16 d.
// Values 128 n + 32 j + 4 g .. + 3: bits 2j, 2j + 1 of qs dword 8 n + g, plus
// 4 where bit 4 n + j of hmask dword g is set.
void panel_sb_q3k(const uint8_t* const row[16], KPanelSb& p) {
  const __m512i m2 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);
  __m512i hm[8];  // hmask dwords 0..7
  transpose_rows4(row, 0, hm);
  transpose_rows4(row, 16, hm + 4);
  LLM_UNROLL for (int c = 0; c < 4; ++c) {  // qs dwords 4c .. 4c + 3: n = c / 2, g = 4 (c % 2) + e
    __m512i qs[4];
    transpose_rows4(row, 32 + 16 * size_t(c), qs);
    const int n = c / 2;
    LLM_UNROLL for (int j = 0; j < 4; ++j) {
      LLM_UNROLL for (int e = 0; e < 4; ++e) {
        const int g = 4 * (c % 2) + e, bit = 4 * n + j;
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(qs[e], 2 * j), m2);
        const __m512i hi = bit >= 2 ? _mm512_srli_epi32(hm[g], bit - 2) : _mm512_slli_epi32(hm[g], 2 - bit);
        _mm512_store_si512(p.q[32 * n + 8 * j + g], or_and(lo, hi, b2));
      }
    }
  }
  // The 12 scale bytes at 96 and d at 108 as bytes 2.. of the dwords at 94
  // (a 16-byte read at 96 would pass the block's 110 bytes).
  __m512i t[4], s[3];
  transpose_rows4(row, 94, t);
  LLM_UNROLL for (int i = 0; i < 3; ++i)
    s[i] = _mm512_or_si512(_mm512_srli_epi32(t[i], 16), _mm512_slli_epi32(t[i + 1], 16));
  const __m512i m4 = _mm512_set1_epi32(15), m2d = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
  __m512i sc[16];
  LLM_UNROLL for (int k = 0; k < 16; ++k) {
    const __m512i lo = k < 8 ? _mm512_srli_epi32(s[k / 4], 8 * (k % 4)) : _mm512_srli_epi32(s[(k - 8) / 4], 8 * (k % 4) + 4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(s[2], 8 * (k % 4) + 2 * (k / 4)), m2d);
    sc[k] = _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_slli_epi32(hi, 4)), bias);
    _mm512_store_si512(p.sc[k], sc[k]);
  }
  LLM_UNROLL for (int j = 0; j < 8; ++j) _mm512_store_si512(p.mn[j], min_pair(sc[2 * j], sc[2 * j + 1], 2));  // 4 * scale
  const __m512 d = halves_ps(t[3], true);
  _mm512_store_ps(p.d, d);
  _mm512_store_ps(p.dm, d);
}

// IQ4_XS: f16 d | u16 scales_h | scales_l[4] | qs[128]. qs dword m holds
// values 32 (m / 4) + 4 (m % 4) .. + 3 in its low nibbles and the 16 after
// them in its high ones, as indices into the table; the panel's codes are
// table value + 128 and its minimums 128 * scale.
void panel_sb_iq4xs(const uint8_t* const row[16], KPanelSb& p) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, char(129), char(141),
                                                             char(153), char(166), char(181), char(197), char(217),
                                                             char(241)));
  LLM_UNROLL for (int ib = 0; ib < 8; ++ib) {  // qs dwords 4 ib + g
    __m512i t[4];
    transpose_rows4(row, 8 + 16 * size_t(ib), t);
    LLM_UNROLL for (int g = 0; g < 4; ++g) {
      _mm512_store_si512(p.q[8 * ib + g], _mm512_shuffle_epi8(table, _mm512_and_si512(t[g], m4)));
      _mm512_store_si512(p.q[8 * ib + 4 + g],
                         _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi32(t[g], 4), m4)));
    }
  }
  __m512i h[4];  // d | scales_h, scales_l
  transpose_rows4(row, 0, h);
  const __m512i m4d = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
  LLM_UNROLL for (int ib = 0; ib < 8; ++ib) {
    const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(h[1], 4 * ib), m4d);  // nibble ib of scales_l
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(h[0], 16 + 2 * ib), m2);
    const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), bias);
    _mm512_store_si512(p.sc[2 * ib], sc);
    _mm512_store_si512(p.sc[2 * ib + 1], sc);
    _mm512_store_si512(p.mn[ib], min_pair(sc, sc, 7));  // 128 * scale
  }
  const __m512 d = halves_ps(h[0], false);
  _mm512_store_ps(p.d, d);
  _mm512_store_ps(p.dm, d);
}

// The panel of rows [0, nr) of w at wr (nr <= kPanel), straight from the
// stored blocks. pf: the same bytes of later rows (the next panel) to
// prefetch, or null (k_matmul passes it for a range's first group only; the
// tiles prefetch the groups after it).
void build_panel(DType t, const uint8_t* wr, size_t rb, int nr, int64_t nsb, KPanelSb* out, const uint8_t* pf) {
  const size_t bb = ggml_block_bytes(t);
  const uint8_t* row[16];
  alignas(64) int32_t off[16];
  for (int r = 0; r < 16; ++r) off[r] = int32_t((r < nr ? r : 0) * rb);
  const __m512i row_off = _mm512_load_si512(off);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const size_t o = size_t(sb) * bb;
    for (int r = 0; r < 16; ++r) row[r] = wr + size_t(off[r]) + o;
    if (pf)
      for (int r = 0; r < nr; ++r)
        for (size_t l = 0; l < bb; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(r) * rb + o + l), _MM_HINT_T0);
    switch (t) {
      case DType::Q4_K: panel_sb_q45k<false>(row, out[sb]); break;
      case DType::Q5_K: panel_sb_q45k<true>(row, out[sb]); break;
      case DType::Q6_K: panel_sb_q6k(row, wr + o + 206, row_off, out[sb]); break;
      case DType::Q2_K: panel_sb_q2k(row, wr + o + 80, row_off, out[sb]); break;
      case DType::Q3_K: panel_sb_q3k(row, out[sb]); break;
      default: panel_sb_iq4xs(row, out[sb]); break;  // IQ4_XS
    }
  }
}

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The stored bytes of the next panel group, prefetched (into L2) a few lines
// per super-block step of the tiles that run over this group, so that the
// DRAM stream overlaps the dots: with 16 x rows the builds had been waiting
// on memory at its full bandwidth while the tiles left it idle (Q4_K_M, 16
// sessions, 2 threads: 319-327 -> 336-364 t/s).
struct PrefetchStream {
  const uint8_t* p = nullptr;
  const uint8_t* end = nullptr;
  int64_t lines = 0;  // per call of step()
  void step() {
    for (int64_t i = 0; i < lines && p < end; ++i, p += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  }
};

// The panel's rows (lanes) against C x rows, x row c at xq + c * xcols (its
// scales and bsums likewise). Per super-block and (W row, x row):
//   S = sum over sub-blocks k (SUB values) of sc_k * e_k * dot_k (vpdpbusd,
//       then vpmulld by sc_k * e_k; e_k: x's sub-scale), M = sum over
//       16-value groups j of mn_j * bsums_j (vpdpwssd), both exact int32;
//   MinD:   acc = fma(float(S - M), d * d_x, acc);
//   others: acc = fma(float(S), d * d_x, acc); acc = fma(float(M), dm * -d_x, acc).
// This is the family's order for every K-quant (k_gemv gives the same bits).
template <int SUB, bool MinD, int C>
void k_panel_tile(const KPanelSb* P, int64_t nsb, const int8_t* xq, const float* xd, const int16_t* xbs,
                  const uint8_t* xe, int64_t xcols, float* y, int64_t ys, __mmask16 rows, PrefetchStream& pf) {
  constexpr int kGroups = SUB / 4;  // 4-value groups per sub-block
  __m512 acc[C];
  LLM_UNROLL for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    pf.step();
    const KPanelSb& p = P[sb];
    const int8_t* xs = xq + sb * 256;
    __m512i S[C], D[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) S[c] = _mm512_setzero_si512();
    for (int k = 0; k < 256 / SUB; ++k) {
      LLM_UNROLL for (int c = 0; c < C; ++c) D[c] = _mm512_setzero_si512();
      LLM_UNROLL for (int g = 0; g < kGroups; ++g) {
        const int gi = k * kGroups + g;
        const __m512i wv = _mm512_load_si512(p.q[gi]);
        LLM_UNROLL for (int c = 0; c < C; ++c) D[c] = _mm512_dpbusd_epi32(D[c], wv, bcast32(xs + c * xcols + 4 * gi));
      }
      const __m512i sc = _mm512_load_si512(p.sc[k * (SUB / 16)]);
      LLM_UNROLL for (int c = 0; c < C; ++c) {
        // sc * e: the int32 lanes of sc are small, so vpmaddwd against e in
        // each lane's low word is their product.
        const __m512i sce = _mm512_madd_epi16(sc, _mm512_set1_epi32(xe[c * (xcols / 32) + sb * 8 + k * SUB / 32]));
        S[c] = _mm512_add_epi32(S[c], _mm512_mullo_epi32(D[c], sce));
      }
    }
    LLM_UNROLL for (int c = 0; c < C; ++c) D[c] = _mm512_setzero_si512();
    LLM_UNROLL for (int j = 0; j < 8; ++j) {
      const __m512i mn = _mm512_load_si512(p.mn[j]);
      LLM_UNROLL for (int c = 0; c < C; ++c)
        D[c] = _mm512_dpwssd_epi32(D[c], mn, bcast32(xbs + c * (xcols / 16) + sb * 16 + 2 * j));
    }
    const __m512 d = _mm512_load_ps(p.d), dm = _mm512_load_ps(p.dm);
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = xd[c * (xcols / 256) + sb];
      if constexpr (MinD) {
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(S[c], D[c])), _mm512_mul_ps(d, _mm512_set1_ps(dx)),
                                 acc[c]);
      } else {
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[c]), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[c]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(D[c]), _mm512_mul_ps(dm, _mm512_set1_ps(-dx)),
                                 acc[c]);
      }
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c) _mm512_mask_storeu_ps(y + c * ys, rows, acc[c]);
}

// x rows per column tile: 8 x (sub-block sums, super-block sums, f32
// accumulators) = 24 of the 32 zmm registers.
constexpr int kPanelCols = 8;

// Panels per group: up to this many panels are built first, then every
// column tile of x runs over all of them, so a tile of x is read from L2 once
// per group rather than once per panel (a prefill's x outgrows L2: 512 rows
// of 5632 codes are 2.9 MB). 4 panels of 22 super-blocks are 0.5 MB.
constexpr int kPanelGroup = 4;

// Panels P[g * nsb ..] for g < np, panel g holding rows 16 g .. (nr[g] of
// them), against every x row; y is the first panel's first row.
template <int SUB, bool MinD>
void k_panel_rows(const KPanelSb* P, int np, const int* nr, int64_t nsb, const GgmlX& x, int64_t n, float* y,
                  int64_t ys, PrefetchStream& pf) {
  const int64_t cols = x.cols;
  auto tile = [&](auto cols_tag, int64_t c0) {
    constexpr int C = decltype(cols_tag)::value;
    for (int g = 0; g < np; ++g)
      k_panel_tile<SUB, MinD, C>(P + g * nsb, nsb, x.q + c0 * cols, x.d + c0 * nsb, x.bsums + c0 * (cols / 16),
                                 x.e + c0 * (cols / 32), cols, y + g * kPanel + c0 * ys, ys,
                                 __mmask16((1u << nr[g]) - 1), pf);
  };
  int64_t c0 = 0;
  for (; c0 + kPanelCols <= n; c0 += kPanelCols) tile(std::integral_constant<int, kPanelCols>{}, c0);
  if (n - c0 >= 4) {
    tile(std::integral_constant<int, 4>{}, c0);
    c0 += 4;
  }
  if (n - c0 >= 2) {
    tile(std::integral_constant<int, 2>{}, c0);
    c0 += 2;
  }
  if (n - c0 >= 1) tile(std::integral_constant<int, 1>{}, c0);
}

// --- K-quant decode from the stored blocks ---------------------------------
//
// Decode (n == 1) reads each super-block once, so unpacking it into a
// KUnpacked buffer and reading that back costs more than the dot itself.
// KRegs<T> decodes one stored super-block into registers instead: the same
// codes, int16 scale lanes, minimums and d / dm as unpack_k_ref (KUnpacked),
// so k_gemv below reaches the panels' integers S and M and does their f32
// operations: the same bits (GgufMatmul.BatchAndThreadInvariantAndManyEqualsOneByOne).

inline float half_of(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  // F16C: the unpackers' value for every finite and infinite half; a NaN
  // may come out quieted, which the first multiply by it does anyway.
  return _cvtsh_ss(h);
}

// The int16 scale lanes of a 64-value chunk: lane t (values 2t, 2t + 1)
// takes scale first + (t >> shift) of the scales in sc's low lanes.
inline __m512i sv_chunk(__m512i sc, int first, int shift) {
  const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                        12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_permutexvar_epi16(
      _mm512_add_epi16(_mm512_set1_epi16(short(first)), _mm512_srl_epi16(lane, _mm_cvtsi32_si128(shift))), sc);
}
// Chunk p with 16 scales of 16 values (Q6_K, Q2_K, Q3_K).
inline __m512i sv_chunk16(__m512i sc, int p) { return sv_chunk(sc, 4 * p, 3); }

// --- Scales of 4 rows at once ------------------------------------------------
//
// The types with 8 scales per super-block (Q4_K, Q5_K, IQ4_XS) decode the
// scales, minimums, d and dm of a tile's 4 rows together, one row per
// 128-bit lane: row by row, that decoding cost as much as the dots (Q4_K
// decode on one thread was compute-bound at 24 GB/s with the weights in
// cache, where Q6_K ran at 55).
struct KQuad {
  __m512i sc;  // int16 word 8 r + j: scale j of row r
  __m512i mn;  // int16 word 8 r + j: minimum j of row r (Q4_K, Q5_K)
  __m128 d, dm;  // lane r: row r's
};

// Lane r (128 bits): the 16 bytes at b[r].
inline __m512i rows16(const uint8_t* const b[4]) {
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0])));
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1])), 1);
  v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[2])), 2);
  return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[3])), 3);
}

// Bytes 0..7 of every 128-bit lane, in lane order, as the low 256 bits;
// bytes 8..15 as the high ones.
inline __m512i halves_of_lanes(__m512i v) {
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), v);
}

// Q4_K / Q5_K blocks at b[0..3]: f16 d | f16 dmin | scales[12]. Per row,
// with u0, u1, u2 the 3 dwords of the 12 bytes: scales 0..3 = u0 & 0x3f..,
// 4..7 = (u2 & 0x0f..) | (u0 >> 6 & 0x03..) << 4; minimums 0..3 = u1 &
// 0x3f.., 4..7 = (u2 >> 4 & 0x0f..) | (u1 >> 6 & 0x03..) << 4.
inline KQuad quad_k45(const uint8_t* const b[4]) {
  const __m512i v = rows16(b);  // dwords: d | dmin, u0, u1, u2
  const __m512i top = _mm512_slli_epi32(
      _mm512_and_si512(_mm512_srli_epi32(_mm512_shuffle_epi32(v, _MM_PERM_CBCB), 6), _mm512_set1_epi8(3)), 4);
  const __m512i low = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_shuffle_epi32(v, _MM_PERM_DDDD), _mm512_set4_epi32(4, 0, 4, 0)),
      _mm512_set1_epi8(0x0f));
  // Per lane: scales 0..3 | 4..7 | minimums 0..3 | 4..7.
  const __m512i sm = _mm512_unpacklo_epi32(
      _mm512_and_si512(_mm512_shuffle_epi32(v, _MM_PERM_DDCB), _mm512_set1_epi8(0x3f)), _mm512_or_si512(low, top));
  const __m512i g = halves_of_lanes(sm);
  KQuad q;
  q.sc = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(g));
  q.mn = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(g, 1));
  const __m128i dd = _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set4_epi32(12, 8, 4, 0), v));
  q.d = _mm_cvtph_ps(_mm_cvtepi32_epi16(dd));
  q.dm = _mm_cvtph_ps(_mm_cvtepi32_epi16(_mm_srli_epi32(dd, 16)));
  return q;
}

// IQ4_XS blocks at b[0..3]: f16 d | u16 scales_h | scales_l[4]. Scale ib:
// nibble ib of scales_l | bits 2 ib, 2 ib + 1 of scales_h << 4, minus 32.
inline KQuad quad_iq4xs(const uint8_t* const b[4]) {
  const __m512i v = rows16(b);
  const __m256i head = _mm512_castsi512_si256(halves_of_lanes(v));  // bytes 0..7 of each row
  const __m512i w = _mm512_cvtepu8_epi16(head);                      // word 8 r + k: byte k of row r
  // Word 8 r + ib takes byte 4 + ib / 2 (low nibble source) and byte 2 + ib / 4 (high bits).
  const __m512i lo_idx = _mm512_set_epi16(31, 31, 30, 30, 29, 29, 28, 28, 23, 23, 22, 22, 21, 21, 20, 20, 15, 15, 14,
                                          14, 13, 13, 12, 12, 7, 7, 6, 6, 5, 5, 4, 4);
  const __m512i hi_idx = _mm512_set_epi16(27, 27, 27, 27, 26, 26, 26, 26, 19, 19, 19, 19, 18, 18, 18, 18, 11, 11, 11,
                                          11, 10, 10, 10, 10, 3, 3, 3, 3, 2, 2, 2, 2);
  const __m512i lo_sh = _mm512_set1_epi32(0x00040000);  // words: 0, 4, 0, 4, ...
  const __m512i hi_sh = _mm512_set4_epi32(0x00060004, 0x00020000, 0x00060004, 0x00020000);  // 0, 2, 4, 6, ...
  const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(lo_idx, w), lo_sh),
                                      _mm512_set1_epi16(15));
  const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(hi_idx, w), hi_sh),
                                      _mm512_set1_epi16(3));
  KQuad q;
  q.sc = _mm512_sub_epi16(_mm512_or_si512(lo, _mm512_slli_epi16(hi, 4)), _mm512_set1_epi16(32));
  q.mn = _mm512_setzero_si512();
  q.d = q.dm = _mm_cvtph_ps(_mm256_cvtepi64_epi16(head));
  return q;
}

// The minimum sums M of the 4 rows of q (lane r) against one x row's 16
// bsums at bs: M = sum over j of minimum j * (bsum 2j + bsum 2j + 1),
// exact (a pair sum fits int16: a bsum, 16 int8 of at most 127 in size, is
// at most 2032).
inline __m128i quad_min_totals(const KQuad& q, const int16_t* bs) {
  const __m256i pairs = _mm256_madd_epi16(load256(bs), _mm256_set1_epi16(1));
  const __m512i m = _mm512_madd_epi16(q.mn, _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(pairs)));
  __m512i t = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
  t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set4_epi32(12, 8, 4, 0), t));
}

template <DType T>
struct KRegs;

// Q4_K / Q5_K: codes of values 64p .. 64p + 63 are the low nibbles of 32
// bytes, then their high nibbles; Q5_K adds 16 where qh has bit 2p (low
// half) or 2p + 1 (high half). 8 scales (of 32 values) and 8 minimums.
template <bool Five>
struct KRegs45 {
  static constexpr size_t kBytes = Five ? 176 : 144;
  static constexpr bool kQuad = true;  // scales etc. from quad()
  const uint8_t* qs;
  __m256i hb;
  explicit KRegs45(const uint8_t* b) : qs(b + (Five ? 48 : 16)) {
    hb = Five ? load256(b + 16) : _mm256_setzero_si256();
  }
  static KQuad quad(const uint8_t* const b[4]) { return quad_k45(b); }
  __m512i codes(int p) const {
    const __m256i v = load256(qs + 32 * p), m4 = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if constexpr (Five) {
      const __m256i sixteen = _mm256_set1_epi8(16);
      lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(hb, _mm256_set1_epi8(char(1 << (2 * p)))), lo, sixteen);
      hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(hb, _mm256_set1_epi8(char(2 << (2 * p)))), hi, sixteen);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
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

template <>
struct KRegs<DType::Q6_K> {
  static constexpr size_t kBytes = 210;
  static constexpr bool kQuad = false;
  __m512i sc;  // 16 scales as int16
  __m256i mn;  // 32 * scale
  float d, dm;
  const uint8_t* b;
  explicit KRegs(const uint8_t* blk) : b(blk) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    sc = _mm512_castsi256_si512(s16);
    mn = _mm256_slli_epi16(s16, 5);
    d = dm = half_of(blk + 208);
  }
  // Half h = p / 2 of the block: ql bytes L = [l0 | l1] (64), qh bytes h (32).
  // Chunk 2h: [(l0 & 15) | (h << 4 & 48), (l1 & 15) | (h << 2 & 48)];
  // chunk 2h + 1: [(l0 >> 4) | (h & 48), (l1 >> 4) | (h >> 2 & 48)].
  __m512i codes(int p) const {
    const int h = p / 2;
    const __m512i L = load512(b + 64 * h);
    const __m512i H = _mm512_broadcast_i64x4(load256(b + 128 + 32 * h));
    const __m512i m4 = _mm512_set1_epi8(0x0f), m48 = _mm512_set1_epi8(0x30);
    if (p % 2 == 0) {
      const __m512i hs = _mm512_sllv_epi64(H, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4));
      return _mm512_or_si512(_mm512_and_si512(L, m4), _mm512_and_si512(hs, m48));
    }
    const __m512i hs = _mm512_srlv_epi64(H, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0));
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4), _mm512_and_si512(hs, m48));
  }
  __m512i scales(int p) const { return sv_chunk16(sc, p); }
};

// Q2_K / Q3_K: codes of values 64p .. 64p + 63 are the 2-bit fields 2j and
// 2j + 1 (j = 2 (p % 2)) of the 32 bytes qs[32 (p / 2) ..]; Q3_K adds 4 where
// hmask[l] has bit 4 (p / 2) + j (value in the first half) or that + 1.
// 16 scales (of 16 values) and 16 minimums (Q3_K: 4 * scale).
template <bool Three>
struct KRegs23 {
  static constexpr size_t kBytes = Three ? 110 : 84;
  static constexpr bool kQuad = false;
  __m512i sc;  // 16 scales as int16
  __m256i mn;
  float d, dm;
  const uint8_t* qs;
  __m256i hm;
  explicit KRegs23(const uint8_t* b) : qs(b + (Three ? 32 : 16)) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    if constexpr (Three) {
      // scales[12] at 96: low nibbles of bytes 0..7 (scales 0..7) then their
      // high nibbles (8..15); 2 high bits of scale k at bits 2 (k / 4) of
      // byte 8 + k % 4; bias 32.
      uint64_t lo8;
      uint32_t hi4;
      std::memcpy(&lo8, b + 96, 8);
      std::memcpy(&hi4, b + 104, 4);
      const __m128i l = _mm_cvtsi64_si128(int64_t(lo8));
      const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4));
      const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(int(hi4)), _mm_setr_epi32(0, 2, 4, 6)),
                                         _mm_set1_epi8(3));
      const __m128i s8 = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
      const __m256i s16 = _mm256_cvtepi8_epi16(s8);
      sc = _mm512_castsi256_si512(s16);
      mn = _mm256_slli_epi16(s16, 2);
      hm = load256(b);
      d = dm = half_of(b + 108);
    } else {
      const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
      sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)));
      mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
      hm = _mm256_setzero_si256();
      d = half_of(b + 80);
      dm = half_of(b + 82);
    }
  }
  __m512i codes(int p) const {
    const int n = p / 2, j = 2 * (p % 2);
    const __m256i v = load256(qs + 32 * n), m2 = _mm256_set1_epi8(3);
    __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m2);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j + 2), m2);
    if constexpr (Three) {
      const __m256i four = _mm256_set1_epi8(4);
      lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(hm, _mm256_set1_epi8(char(1 << (4 * n + j)))), lo, four);
      hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(hm, _mm256_set1_epi8(char(2 << (4 * n + j)))), hi, four);
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  __m512i scales(int p) const { return sv_chunk16(sc, p); }
};
template <>
struct KRegs<DType::Q2_K> : KRegs23<false> {
  using KRegs23<false>::KRegs23;
};
template <>
struct KRegs<DType::Q3_K> : KRegs23<true> {
  using KRegs23<true>::KRegs23;
};

template <>
struct KRegs<DType::IQ4_XS> {
  static constexpr size_t kBytes = 136;
  static constexpr bool kQuad = true;  // scales and d from quad(); no minimums
  const uint8_t* qs;
  explicit KRegs(const uint8_t* b) : qs(b + 8) {}
  static KQuad quad(const uint8_t* const b[4]) { return quad_iq4xs(b); }
  // Sub-blocks 2p and 2p + 1 (16 bytes each): low nibbles then high nibbles
  // of each, through the table.
  __m512i codes(int p) const {
    const __m256i v = load256(qs + 32 * p), m4 = _mm256_set1_epi8(0x0f);
    const __m512i n = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m4)),
                                         _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), 1);
    const __m512i ordered = _mm512_shuffle_i64x2(n, n, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25,
                                                               38, 53, 69, 89, 113));
    return _mm512_shuffle_epi8(table, ordered);
  }
};

// Sums of the 16 int32 lanes of each of a0..a3 within each 128-bit lane:
// 128-bit lane L of the result holds [a0, a1, a2, a3]'s partial sums over
// their own 128-bit lane L.
inline __m512i lane_partials4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

// The totals of the 16 int32 lanes of each of a0..a3, as lanes 0..3.
inline __m128i lane_totals4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i u = lane_partials4(a0, a1, a2, a3);
  const __m256i v = _mm256_add_epi32(_mm512_castsi512_si256(u), _mm512_extracti64x4_epi64(u, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

// The same for a0..a3 that hold partial sums of S in their low 256 bits and
// of M in their high 256 bits: S totals into s, M totals into m.
inline void lane_totals4_split(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m128i& s, __m128i& m) {
  const __m512i u = lane_partials4(a0, a1, a2, a3);
  s = _mm_add_epi32(_mm512_extracti32x4_epi32(u, 0), _mm512_extracti32x4_epi32(u, 1));
  m = _mm_add_epi32(_mm512_extracti32x4_epi32(u, 2), _mm512_extracti32x4_epi32(u, 3));
}

// R (<= 4) rows straight from the stored blocks against C x rows (x row c at
// xq + c * xcols, its scales and bsums likewise): per super-block, the exact
// integer S and M of every (row, x row) as k_panel_tile has them (the
// integers are the same however they are summed), then its f32 operations
// with the rows in lanes 0..R-1. pf: the same bytes of a later tile.
// kQuad types take the 4 rows' scales, minimums, d and dm from one KQuad
// (rows past R repeat row 0; their lanes are never stored) and sum M apart
// from S; the others keep them per row, M in S's high half or subtracted
// inside S (MinD).
template <DType T, int R, int C>
void k_gemv(const uint8_t* w, size_t rb, int64_t nsb, const int8_t* xq, const float* xd, const int16_t* xbs,
            const uint8_t* xe, int64_t xcols, float* y, int64_t ys, const uint8_t* pf) {
  constexpr bool MinD = k_min_uses_d(T), Signed = k_signed(T), Quad = KRegs<T>::kQuad;
  constexpr size_t BB = KRegs<T>::kBytes;
  __m128 acc[C];
  LLM_UNROLL for (int c = 0; c < C; ++c) acc[c] = _mm_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    // Per (row, x row): Quad or MinD: 16 lanes summing to S (Quad) or S - M;
    // others: 8 lanes summing to S, then 8 summing to M.
    __m512i S[4][C];
    float dr[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dmr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    KQuad q;
    // Each x row's 8 sub-scales e as int16 words laid out as the scale words
    // they multiply: Quad (8 scales of 32 values per row, row r in 128-bit
    // lane r): word 8 r + j = e_j; others (16 scales of 16 values): word k =
    // e_{k / 2}.
    __m512i ev[C];
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const __m128i e8 =
          _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(xe + c * (xcols / 32) + sb * 8)));
      if constexpr (Quad)
        ev[c] = _mm512_broadcast_i32x4(e8);
      else
        ev[c] = _mm512_zextsi256_si512(_mm256_set_m128i(_mm_unpackhi_epi16(e8, e8), _mm_unpacklo_epi16(e8, e8)));
    }
    // Quad: the 4 rows' scales times e, per x row.
    __m512i qsc[Quad ? C : 1];
    if constexpr (Quad) {
      const uint8_t* b[4];
      LLM_UNROLL for (int r = 0; r < 4; ++r) b[r] = w + size_t(r < R ? r : 0) * rb + size_t(sb) * BB;
      q = KRegs<T>::quad(b);
      LLM_UNROLL for (int c = 0; c < C; ++c) qsc[c] = _mm512_mullo_epi16(q.sc, ev[c]);
    }
    LLM_UNROLL for (int r = 0; r < 4; ++r)
      LLM_UNROLL for (int c = 0; c < C; ++c) S[r][c] = _mm512_setzero_si512();
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + size_t(sb) * BB;
      if (pf)
        for (size_t o = 0; o < BB; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * rb + size_t(sb) * BB + o), _MM_HINT_T0);
      const KRegs<T> u(blk);
      // Others: the row's 16 scales times e, per x row (the high 256 bits
      // of u.sc are never read).
      __m512i rsc[Quad ? 1 : C];
      if constexpr (!Quad) {
        LLM_UNROLL for (int c = 0; c < C; ++c) rsc[c] = _mm512_mullo_epi16(u.sc, ev[c]);
      }
      // The int16 multipliers of chunk p's pairs for x row c.
      auto scales = [&](int c, int p) {
        if constexpr (Quad)
          return sv_chunk(qsc[c], 8 * r + 2 * p, 4);
        else
          return sv_chunk16(rsc[c], p);
      };
      LLM_UNROLL for (int p = 0; p < 4; ++p) {
        __m512i wq = u.codes(p);
        if constexpr (Signed) {
          // |w|, and x negated where w < 0 (x is never -128): pairs of at
          // most 2 * 127 * 127.
          const __m512i aw = _mm512_abs_epi8(wq);
          const __mmask64 neg = _mm512_movepi8_mask(wq);
          LLM_UNROLL for (int c = 0; c < C; ++c) {
            const __m512i xv = load512(xq + c * xcols + sb * 256 + 64 * p);
            const __m512i xs = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
            S[r][c] = _mm512_dpwssd_epi32(S[r][c], _mm512_maddubs_epi16(aw, xs), scales(c, p));
          }
        } else {
          // Pairs of at most 2 * 63 * 127: vpmaddubsw never saturates.
          LLM_UNROLL for (int c = 0; c < C; ++c)
            S[r][c] = _mm512_dpwssd_epi32(
                S[r][c], _mm512_maddubs_epi16(wq, load512(xq + c * xcols + sb * 256 + 64 * p)), scales(c, p));
        }
      }
      if constexpr (!Quad) {
        LLM_UNROLL for (int c = 0; c < C; ++c) {
          const __m256i bs = load256(xbs + c * (xcols / 16) + sb * 16);
          if constexpr (MinD) {
            S[r][c] = _mm512_dpwssd_epi32(S[r][c], _mm512_zextsi256_si512(bs),
                                          _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), u.mn)));
          } else {
            const __m256i s8 =
                _mm256_add_epi32(_mm512_castsi512_si256(S[r][c]), _mm512_extracti64x4_epi64(S[r][c], 1));
            S[r][c] = _mm512_inserti64x4(_mm512_castsi256_si512(s8), _mm256_madd_epi16(bs, u.mn), 1);
          }
        }
        dr[r] = u.d;
        dmr[r] = u.dm;
      }
    }
    // Built from registers: 4 scalar stores then a vector load would stall
    // on store forwarding once per super-block.
    __m128 d, dm;
    if constexpr (Quad) {
      d = q.d;
      dm = q.dm;
    } else {
      d = _mm_setr_ps(dr[0], dr[1], dr[2], dr[3]);
      dm = _mm_setr_ps(dmr[0], dmr[1], dmr[2], dmr[3]);
    }
    LLM_UNROLL for (int c = 0; c < C; ++c) {
      const float dx = xd[c * (xcols / 256) + sb];
      if constexpr (MinD) {  // Quad: IQ4_XS, whose M is 0
        const __m128i t = lane_totals4(S[0][c], S[1][c], S[2][c], S[3][c]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(t), _mm_mul_ps(d, _mm_set1_ps(dx)), acc[c]);
      } else {
        __m128i ts, tm;
        if constexpr (Quad) {
          ts = lane_totals4(S[0][c], S[1][c], S[2][c], S[3][c]);
          tm = quad_min_totals(q, xbs + c * (xcols / 16) + sb * 16);
        } else {
          lane_totals4_split(S[0][c], S[1][c], S[2][c], S[3][c], ts, tm);
        }
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(ts), _mm_mul_ps(d, _mm_set1_ps(dx)), acc[c]);
        acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(tm), _mm_mul_ps(dm, _mm_set1_ps(-dx)), acc[c]);
      }
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c) _mm_mask_storeu_ps(y + c * ys, __mmask8((1u << R) - 1), acc[c]);
}

// Decode and batched decode up to kDirectBatch x rows: each tile of
// kRowTile W rows is read from the stored blocks by kDecCols x rows at a
// time, all of them before the next tile (which the first column tile
// prefetches). Beyond that, decoding every block once per column tile costs
// more than building the panel once (TinyLlama-shape Q4_K_M, 2 threads, Zen
// 5: 8 sessions 180 t/s direct against 207-225 by panels; 4 sessions 150-176
// direct against 118-130).
constexpr int kDecCols = 4;
constexpr int64_t kDirectBatch = 4;

template <DType T, int R, int C>
void k_decode_tile(const uint8_t* wr, const WeightView& w, const GgmlX& x, int64_t c0, float* y, const uint8_t* pf) {
  const int64_t nsb = w.cols / 256, cols = x.cols;
  k_gemv<T, R, C>(wr, w.row_bytes, nsb, x.q + c0 * cols, x.d + c0 * nsb, x.bsums + c0 * (cols / 16),
                  x.e + c0 * (cols / 32), cols, y + c0 * w.rows, w.rows, pf);
}

template <DType T, int R>
void k_decode_rows(const uint8_t* wr, const WeightView& w, const GgmlX& x, int64_t n, float* y, const uint8_t* pf) {
  int64_t c0 = 0;
  for (; c0 + kDecCols <= n; c0 += kDecCols) k_decode_tile<T, R, kDecCols>(wr, w, x, c0, y, c0 == 0 ? pf : nullptr);
  switch (n - c0) {
    case 3: k_decode_tile<T, R, 3>(wr, w, x, c0, y, c0 == 0 ? pf : nullptr); break;
    case 2: k_decode_tile<T, R, 2>(wr, w, x, c0, y, c0 == 0 ? pf : nullptr); break;
    case 1: k_decode_tile<T, R, 1>(wr, w, x, c0, y, c0 == 0 ? pf : nullptr); break;
    default: break;
  }
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

template <int SUB, bool MinD>
void k_matmul(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (n <= kDirectBatch && k_decode_any(w, x, n, y, r0, r1)) return;
  const int64_t nsb = w.cols / 256;
  thread_local std::vector<KPanelSb> panels;
  if (panels.size() < size_t(kPanelGroup * nsb)) panels.resize(size_t(kPanelGroup * nsb));
  for (int64_t r = r0; r < r1; r += kPanelGroup * kPanel) {
    int nr[kPanelGroup];
    int np = 0;
    for (int64_t rp = r; rp < r1 && np < kPanelGroup; rp += kPanel, ++np) {
      nr[np] = int(std::min<int64_t>(kPanel, r1 - rp));
      const uint8_t* wr = w.data + size_t(rp) * w.row_bytes;
      build_panel(w.dtype, wr, w.row_bytes, nr[np], nsb, panels.data() + np * nsb,
                  r == r0 ? wr + kPanel * w.row_bytes : nullptr);  // later groups: by the tiles
    }
    // The next group's rows, spread over the tile steps to come (np panels,
    // ceil(n / kPanelCols) or so column tiles, nsb steps each).
    PrefetchStream pf;
    const int64_t next = r + kPanelGroup * kPanel, next_end = std::min<int64_t>(r1, next + kPanelGroup * kPanel);
    if (next < next_end) {
      pf.p = w.data + size_t(next) * w.row_bytes;
      pf.end = w.data + size_t(next_end) * w.row_bytes;
      const int64_t steps = np * ((n + kPanelCols - 1) / kPanelCols) * nsb;
      pf.lines = (int64_t(pf.end - pf.p) / 64 + steps) / steps;
    }
    k_panel_rows<SUB, MinD>(panels.data(), np, nr, nsb, x, n, y + r, w.rows, pf);
  }
}

// --- Q5_0 / IQ4_NL quads ---------------------------------------------------

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <DType T>
struct QuadFmt {
  static constexpr int BB = T == DType::Q5_0 ? 22 : 18;  // bytes per block
  static constexpr int QS = T == DType::Q5_0 ? 6 : 2;    // offset of the nibbles
  static constexpr int QB = 4 * BB;                      // bytes per quad
};

// The 4 f16 scales BB apart, as 16 lane scales (lane 4j + i: block j).
template <int BB>
inline __m512 quad_scales(const uint8_t* p) {
  __m128i h = _mm_cvtsi32_si128(load_u16(p));
  h = _mm_insert_epi16(h, load_u16(p + BB), 1);
  h = _mm_insert_epi16(h, load_u16(p + 2 * BB), 2);
  h = _mm_insert_epi16(h, load_u16(p + 3 * BB), 3);
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
}

// One row's 4 stored blocks at p in the x quad layout: a = the unsigned
// codes meeting values 0..15 of blocks 0..3, b = values 16..31; dw = lane
// scales.
//   Q5_0:   u = the 5-bit code 0..31 (value = d * (u - 16)): the nibbles,
//           plus 16 where the block's qh has the value's bit (qh bits 0..15
//           go with a, 16..31 with b, gathered into byte masks);
//   IQ4_NL: u = table value + 128 (1..241), a vpshufb of the nibbles.
template <DType T>
inline void w_quad(const uint8_t* p, __m512i& a, __m512i& b, __m512& dw) {
  constexpr int BB = QuadFmt<T>::BB, QS = QuadFmt<T>::QS;
  __m512i v = _mm512_castsi128_si512(load128(p + QS));
  v = _mm512_inserti32x4(v, load128(p + BB + QS), 1);
  v = _mm512_inserti32x4(v, load128(p + 2 * BB + QS), 2);
  v = _mm512_inserti32x4(v, load128(p + 3 * BB + QS), 3);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  if constexpr (T == DType::Q5_0) {
    const uint64_t h0 = load_u32(p + 2), h1 = load_u32(p + BB + 2), h2 = load_u32(p + 2 * BB + 2),
                   h3 = load_u32(p + 3 * BB + 2);
    const uint64_t ma = (h0 & 0xffff) | (h1 & 0xffff) << 16 | (h2 & 0xffff) << 32 | (h3 & 0xffff) << 48;
    const uint64_t mb = (h0 >> 16) | (h1 >> 16) << 16 | (h2 >> 16) << 32 | (h3 >> 16) << 48;
    const __m512i sixteen = _mm512_set1_epi8(16);
    a = _mm512_mask_add_epi8(lo, __mmask64(ma), lo, sixteen);
    b = _mm512_mask_add_epi8(hi, __mmask64(mb), hi, sixteen);
  } else {
    const __m512i table = _mm512_broadcast_i32x4(
        _mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, char(129), char(141), char(153), char(166), char(181),
                      char(197), char(217), char(241)));
    a = _mm512_shuffle_epi8(table, lo);
    b = _mm512_shuffle_epi8(table, hi);
  }
  dw = quad_scales<BB>(p);
}

// One row's quad for the last, partial step (m < 4 blocks): the blocks
// copied into a zeroed buffer (a zero block has scale 0; x is zero there).
template <DType T>
inline void w_quad_tail(const uint8_t* p, int64_t m, __m512i& a, __m512i& b, __m512& dw) {
  alignas(64) uint8_t t[QuadFmt<T>::QB] = {};
  std::memcpy(t, p, size_t(m) * QuadFmt<T>::BB);
  w_quad<T>(t, a, b, dw);
}

// One (W row, x row) step: the canonical order of this family.
inline void quad_dot(__m512& acc, __m512i a, __m512i b, __m512 dw, const uint8_t* xc) {
  __m512i t = _mm512_dpbusd_epi32(load512(xc + 128), a, load512(xc));
  t = _mm512_dpbusd_epi32(t, b, load512(xc + 64));
  const __m512 dx = _mm512_loadu_ps(reinterpret_cast<const float*>(xc + 192));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dw, dx), acc);
}

// One row's quad as the prefill tiles keep it.
struct alignas(64) WQuad {
  __m512i a, b;
  __m512 dw;
};

// Decode: R rows straight from the stored blocks, the next tile prefetched.
template <DType T, int R>
void quad_gemv(const uint8_t* w, size_t rb, int64_t nb, const uint8_t* xq, float* y, const uint8_t* pf) {
  constexpr int QB = QuadFmt<T>::QB;
  __m512 acc[R];
  LLM_UNROLL for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t nqf = nb / 4;
  for (int64_t k = 0; k < nqf; ++k) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      if (pf) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + r * rb + k * QB), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(pf + r * rb + k * QB + QB - 1), _MM_HINT_T0);
      }
      __m512i a, b;
      __m512 dw;
      w_quad<T>(w + r * rb + k * QB, a, b, dw);
      quad_dot(acc[r], a, b, dw, xq + k * kQuadBytes);
    }
  }
  if (nb % 4) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      __m512i a, b;
      __m512 dw;
      w_quad_tail<T>(w + r * rb + nqf * QB, nb % 4, a, b, dw);
      quad_dot(acc[r], a, b, dw, xq + nqf * kQuadBytes);
    }
  }
  LLM_UNROLL for (int r = 0; r < R; ++r) y[r] = hsum16(acc[r]);
}

// Prefill: R rows of quads from the tile buffer x C x rows.
template <int R, int C>
void quad_tile(const WQuad* wq, int64_t ws, int64_t nq, const uint8_t* xq, int64_t xs, float* y, int64_t ys) {
  __m512 acc[R][C];
  LLM_UNROLL for (int r = 0; r < R; ++r)
    LLM_UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nq; ++k) {
    LLM_UNROLL for (int r = 0; r < R; ++r) {
      const WQuad& q = wq[r * ws + k];
      LLM_UNROLL for (int c = 0; c < C; ++c) quad_dot(acc[r][c], q.a, q.b, q.dw, xq + c * xs + k * kQuadBytes);
    }
  }
  LLM_UNROLL for (int c = 0; c < C; ++c)
    LLM_UNROLL for (int r = 0; r < R; ++r) y[c * ys + r] = hsum16(acc[r][c]);
}

constexpr int kQCols = 4;

template <int R>
void quad_rows(const WQuad* wq, int64_t nq, const uint8_t* xq, int64_t n, float* y, int64_t ys) {
  const int64_t xs = nq * kQuadBytes;
  int64_t c0 = 0;
  for (; c0 + kQCols <= n; c0 += kQCols) quad_tile<R, kQCols>(wq, nq, nq, xq + c0 * xs, xs, y + c0 * ys, ys);
  switch (n - c0) {
    case 3: quad_tile<R, 3>(wq, nq, nq, xq + c0 * xs, xs, y + c0 * ys, ys); break;
    case 2: quad_tile<R, 2>(wq, nq, nq, xq + c0 * xs, xs, y + c0 * ys, ys); break;
    case 1: quad_tile<R, 1>(wq, nq, nq, xq + c0 * xs, xs, y + c0 * ys, ys); break;
    default: break;
  }
}

template <DType T>
void quad_matmul(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  constexpr int QB = QuadFmt<T>::QB;
  const int64_t nb = w.cols / 32, nq = quad_count(w.cols);
  thread_local std::vector<WQuad> wbuf;
  if (n > 1 && wbuf.size() < size_t(kRowTile * nq)) wbuf.resize(size_t(kRowTile * nq));
  for (int64_t r = r0; r < r1; r += kRowTile) {
    const int nr = int(std::min<int64_t>(kRowTile, r1 - r));
    const uint8_t* wr = w.data + size_t(r) * w.row_bytes;
    if (n == 1) {
      const uint8_t* pf = wr + decode_ahead(w);
      switch (nr) {
        case 4: quad_gemv<T, 4>(wr, w.row_bytes, nb, x.quads, y + r, pf); break;
        case 3: quad_gemv<T, 3>(wr, w.row_bytes, nb, x.quads, y + r, pf); break;
        case 2: quad_gemv<T, 2>(wr, w.row_bytes, nb, x.quads, y + r, pf); break;
        default: quad_gemv<T, 1>(wr, w.row_bytes, nb, x.quads, y + r, pf); break;
      }
      continue;
    }
    const size_t ahead = n <= kSmallBatch ? decode_ahead(w) : 0;
    for (int i = 0; i < nr; ++i) {
      const uint8_t* row = wr + size_t(i) * w.row_bytes;
      WQuad* o = wbuf.data() + i * nq;
      for (int64_t k = 0; k < nb / 4; ++k) {
        if (ahead) {  // batched decode: the same bytes of a later tile
          _mm_prefetch(reinterpret_cast<const char*>(row + ahead + k * QB), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(row + ahead + k * QB + QB - 1), _MM_HINT_T0);
        }
        w_quad<T>(row + k * QB, o[k].a, o[k].b, o[k].dw);
      }
      if (nb % 4) w_quad_tail<T>(row + (nb / 4) * QB, nb % 4, o[nb / 4].a, o[nb / 4].b, o[nb / 4].dw);
    }
    switch (nr) {
      case 4: quad_rows<4>(wbuf.data(), nq, x.quads, n, y + r, w.rows); break;
      case 3: quad_rows<3>(wbuf.data(), nq, x.quads, n, y + r, w.rows); break;
      case 2: quad_rows<2>(wbuf.data(), nq, x.quads, n, y + r, w.rows); break;
      default: quad_rows<1>(wbuf.data(), nq, x.quads, n, y + r, w.rows); break;
    }
  }
}

}  // namespace

bool ggml_avx512_runs(DType t) { return t != DType::Q5_1; }

namespace {

// Pairwise step of the 16-into-1 reductions below: within each 128-bit lane,
// [a0 + a2 | b0 + b2 | a1 + a3 | b1 + b3] (op = add or max).
template <class Op>
inline __m512i pair32(__m512i a, __m512i b, Op op) {
  return op(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
template <class Op>
inline __m512i quad32(__m512i ab, __m512i cd, Op op) {
  return op(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}
// From quad32 results u0, u1 (128-bit lane L of u holding lane L's totals of
// its 4 vectors), the 4 lanes folded: [u0 totals | u0 totals' | u1 | u1'],
// blocks 0 and 2 holding u0's and u1's 4 totals once all are folded.
template <class Op>
inline __m512i fold_lanes(__m512i u0, __m512i u1, Op op) {
  const __m512i x = op(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xdd));
  return op(x, _mm512_shuffle_i32x4(x, x, 0xb1));
}

}  // namespace

void quantize_q8_ks_avx512(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, uint8_t* e,
                           int16_t* bsums) {
  const __m512 sign = _mm512_set1_ps(-0.0f), big = _mm512_set1_ps(FLT_MAX);
  const auto maxi = [](__m512i a, __m512i b) { return _mm512_max_epi32(a, b); };  // |x| bits order as floats
  const auto addi = [](__m512i a, __m512i b) { return _mm512_add_epi32(a, b); };
  for (int64_t i = 0; i < n * (cols / 256); ++i) {
    const float* xs = x + 256 * i;
    int8_t* qs = q + 256 * i;
    __mmask16 bad = 0;
    __m512i m[8];
    LLM_UNROLL for (int k = 0; k < 8; ++k) {
      const __m512 a0 = _mm512_andnot_ps(sign, _mm512_loadu_ps(xs + 32 * k));
      const __m512 a1 = _mm512_andnot_ps(sign, _mm512_loadu_ps(xs + 32 * k + 16));
      bad |= _mm512_cmp_ps_mask(a0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(a1, big, _CMP_NLE_UQ);
      m[k] = _mm512_castps_si512(_mm512_max_ps(a0, a1));
    }
    // The 8 sub-blocks' largest |x| (non-negative floats order as their bit
    // patterns; with a NaN or Inf the values are not used): sub[k] = m[k]'s
    // lane maximum.
    alignas(64) float subv[16];
    _mm512_store_si512(subv, fold_lanes(quad32(pair32(m[0], m[1], maxi), pair32(m[2], m[3], maxi), maxi),
                                        quad32(pair32(m[4], m[5], maxi), pair32(m[6], m[7], maxi), maxi), maxi));
    const float sub[8] = {subv[0], subv[1], subv[2], subv[3], subv[8], subv[9], subv[10], subv[11]};
    float amax = 0.0f;
    for (int k = 0; k < 8; ++k) amax = sub[k] > amax ? sub[k] : amax;
    // The scalar quantizer's scalar steps, in its order: the same bytes.
    const float dd = amax / (127.0f * float(kSubScaleMax));
    if (bad || !(dd >= FLT_MIN)) {
      std::memset(qs, 0, 256);
      std::memset(e + 8 * i, 1, 8);
      std::memset(bsums + 16 * i, 0, 16 * sizeof(int16_t));
      d[i] = bad ? NAN : 0.0f;
      continue;
    }
    const float inv = 1.0f / (127.0f * dd);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512i v[16];
    alignas(64) int32_t ev[16];
    LLM_UNROLL for (int k = 0; k < 8; ++k) {
      const int ek = q8_ks_sub_scale(sub[k], inv);
      const __m512 is = _mm512_set1_ps(q8_ks_iscale(dd, ek));
      LLM_UNROLL for (int h = 0; h < 2; ++h) {
        // vcvtps2dq under the default MXCSR: round half to even.
        __m512i t = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 32 * k + 16 * h), is));
        v[2 * k + h] = _mm512_min_epi32(_mm512_max_epi32(t, lo), hi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * k + 16 * h), _mm512_cvtepi32_epi8(v[2 * k + h]));
      }
      e[8 * i + k] = uint8_t(ek);
      ev[2 * k] = ev[2 * k + 1] = ek;
    }
    // The 16 group sums in one vector (lane g: group g), times e.
    __m512i u[4];
    LLM_UNROLL for (int j = 0; j < 4; ++j)
      u[j] = quad32(pair32(v[4 * j], v[4 * j + 1], addi), pair32(v[4 * j + 2], v[4 * j + 3], addi), addi);
    const __m512i f01 = fold_lanes(u[0], u[1], addi), f23 = fold_lanes(u[2], u[3], addi);
    // Blocks 0 and 2 of f01 / f23 hold groups 0-3, 4-7 / 8-11, 12-15.
    const __m512i sums = _mm512_permutex2var_epi64(f01, _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), f23);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bsums + 16 * i),
                        _mm512_cvtepi32_epi16(_mm512_mullo_epi32(sums, _mm512_load_si512(ev))));
    d[i] = dd;
  }
}

void ggml_quads_avx512(DType t, const GgmlX& x, int64_t n, uint8_t* out) {
  // Q5_0 codes are stored with bias 16, IQ4_NL ones with bias 128.
  const unsigned shift = t == DType::Q5_0 ? 4 : 7;
  const int64_t cols = x.cols, nb = cols / 32, nq = quad_count(cols);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = 0; i < n; ++i) {
    const int8_t* q = x.q + i * cols;
    const float* d = x.d + i * nb;
    for (int64_t k = 0; k < nq; ++k) {
      uint8_t* o = out + (i * nq + k) * kQuadBytes;
      alignas(64) float dx[16];
      LLM_UNROLL for (int j = 0; j < 4; ++j) {
        const int64_t b = 4 * k + j;
        __m128i q0 = _mm_setzero_si128(), q1 = _mm_setzero_si128();
        float db = 0.0f;
        if (b < nb) {
          q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32 * b));
          q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32 * b + 16));
          db = d[b];
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * j), q0);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 64 + 16 * j), q1);
        LLM_UNROLL for (int l = 0; l < 4; ++l) dx[4 * j + l] = db;
      }
      // -bias * the sum of the 8 int8 each int32 lane of vpdpbusd meets.
      __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, load512(o));
      s = _mm512_dpbusd_epi32(s, ones, load512(o + 64));
      _mm512_storeu_si512(o + 128, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, shift)));
      _mm512_storeu_ps(reinterpret_cast<float*>(o + 192), _mm512_load_ps(dx));
    }
  }
}

void matmul_ggml_avx512(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  if (x.act == GgmlAct::Q8_K) {
    LLM_CHECK(x.e != nullptr, LLM_ERR_INTERNAL, "matmul_ggml_avx512: K-quant activations without sub-scales");
    // Sub-blocks of 32 values with one scale (Q4_K, Q5_K, IQ4_XS) or 16.
    switch (w.dtype) {
      case DType::Q4_K:
      case DType::Q5_K: k_matmul<32, false>(w, x, n, y, r0, r1); break;
      case DType::IQ4_XS: k_matmul<32, true>(w, x, n, y, r0, r1); break;
      case DType::Q2_K: k_matmul<16, false>(w, x, n, y, r0, r1); break;
      default: k_matmul<16, true>(w, x, n, y, r0, r1); break;  // Q3_K, Q6_K
    }
  } else if (w.dtype == DType::Q5_0) {
    quad_matmul<DType::Q5_0>(w, x, n, y, r0, r1);
  } else {
    quad_matmul<DType::IQ4_NL>(w, x, n, y, r0, r1);
  }
}

}  // namespace llm::cpu::kern

#undef LLM_UNROLL
