// Internal interface of the matmul kernels for the GGUF block types that are
// run as stored (quant/dtype.h: Q5_0, Q5_1, IQ4_NL, Q2_K .. Q6_K, IQ4_XS), in Fast
// mode. Reference mode dequantizes them like every other type (matmul.cpp).
//
// The activations are quantized as ggml quantizes them for that weight type
// (ggml-cpu's vec_dot_type), so every block's integer dot is llama.cpp's,
// with two refinements that cost nothing and halve the distance of Gemma 3
// 270M's fast path from exact math (docs/QUANTIZATION.md): Q8_0 keeps its d
// in f32, and the AVX-512 family uses Q8_K with sub-scales (below):
//   Q5_0, IQ4_NL -> Q8_0: per 32 values d = amax / 127 in f32 (ggml rounds it
//                   to fp16), q = round-half-even(x * (127 / amax));
//   Q5_1         -> Q8_1: the same q and d, plus s = fp16(d * sum(q)) with
//                   the unrounded d (the x86 AVX2 quantize_row_q8_1);
//   K-quants, IQ4_XS -> Q8_K: per 256 values, with max the value of largest
//                   magnitude (the first one on ties), iscale = -127 / max,
//                   q = min(127, round-half-even(iscale * x)), d = 1 / iscale
//                   kept in f32, and bsums = sum(q) per 16 values
//                   (quantize_row_q8_K_ref, which x86 uses as it is).
// The AVX-512 family quantizes the K-quants' and IQ4_XS's activations more
// finely than ggml (Q8_K with sub-scales, quantize_q8_ks below): each 32
// values get their own integer multiplier e of the super-block's d, so a
// sub-block of small values (the FFN down projection's input after the
// gate is mostly such) keeps its precision. The integer dot is then
//   sum_k (sc[k] * e[k]) * sum_{values} u * q, with bsums already times e.
// The weight side is unpacked exactly into integer codes and integer scales
// (below), then:
//   32-value blocks: y += (d_w * d_x) * sum(w * q) [Q5_1: + m_w * s_x]
//   256-value super-blocks, with 16 scales sc and 16 minimums mn per block:
//     y += (d_w * d_x) * sum_k sc[k] * sum_{16 values} u * q
//        - (dm_w * d_x) * sum_k mn[k] * bsums[k]
// The integer sums are exact; only the f32 order differs between families,
// and each family fixes its own (see the kernel files), so a row's output is
// the same decoded alone or inside any prefill batch.
//
// Non-finite weight scales (NaN/Inf fp16 d) give NaN/Inf outputs, never a
// trap. Non-finite activations quantize to a NaN scale, so their outputs are
// NaN too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/matmul.h"

namespace llm::cpu::kern {

// ggml's activation format for one weight type.
enum class GgmlAct { Q8_0, Q8_1, Q8_K };

inline GgmlAct ggml_act_of(DType t) {
  switch (t) {
    case DType::Q5_1: return GgmlAct::Q8_1;
    case DType::Q5_0:
    case DType::IQ4_NL: return GgmlAct::Q8_0;
    default: return GgmlAct::Q8_K;
  }
}

// Values per activation block.
inline int64_t ggml_act_block(GgmlAct a) { return a == GgmlAct::Q8_K ? 256 : 32; }

// Activation rows quantized for one weight type.
struct GgmlX {
  GgmlAct act = GgmlAct::Q8_0;
  const int8_t* q = nullptr;       // [n][cols]
  const float* d = nullptr;        // [n][cols / block]; Q8_0/Q8_1: the fp16 scale as a float
  const float* s = nullptr;        // Q8_1: [n][cols / 32] fp16(d * sum(q)) as a float; else null
  const int16_t* bsums = nullptr;  // Q8_K: [n][cols / 16]; else null
  const uint8_t* e = nullptr;      // Q8_K with sub-scales: [n][cols / 32], 1..kSubScaleMax; null: ggml's Q8_K
  const uint8_t* quads = nullptr;  // AVX-512 family, Q8_0 types: the quad layout below; else null
  int64_t cols = 0;
};

// Quantizes n rows of x as ggml does for `a`. cols is a multiple of the
// block; q [n * cols], d [n * cols / block], s (Q8_1 only) [n * cols / 32],
// bsums (Q8_K only) [n * cols / 16].
void quantize_ggml_x(GgmlAct a, const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                     int16_t* bsums);

// Q8_K with sub-scales. Per 256 values (a super-block): d = amax /
// (127 * kSubScaleMax) in f32, amax the largest |x|; per 32 values the
// smallest integer e in 1..kSubScaleMax with amax_32 <= 127 * d * e (amax_32
// their largest |x|), computed as ceil(amax_32 * (1 / (127 * d))); q =
// round-half-even(x * (1 / (d * e))) clamped to -127..127, and bsums =
// e * sum(q) per 16 values (q8_ks_sub_scale / q8_ks_iscale: both quantizers'
// scalar steps). Value i is then
// d * e[i / 32] * q[i]. A super-block with a NaN or Inf gets d = NaN (its
// outputs are NaN, as with ggml's Q8_K); one whose d would be below the
// smallest normal float is quantized to zeros (d = 0). kSubScaleMax = 8
// keeps every integer in range: bsums <= 8 * 16 * 127 (int16, and a pair of
// them too), sc * e <= 128 * 8 (int16), and a super-block's S within int32
// for every type (Q6_K: 16 * 63 * 127 * 128 * 8 * 16 < 2^31).
constexpr int kSubScaleMax = 8;
// e of a sub-block whose largest |x| is a, with inv = 1 / (127 * d).
inline int q8_ks_sub_scale(float a, float inv) {
  const float need = std::ceil(a * inv);
  return need < 1.0f ? 1 : need > float(kSubScaleMax) ? kSubScaleMax : int(need);
}
// The multiplier of its values.
inline float q8_ks_iscale(float d, int e) { return 1.0f / (d * float(e)); }
void quantize_q8_ks(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, uint8_t* e, int16_t* bsums);

// --- unpacked weights ------------------------------------------------------
// A K-quant super-block as codes and integer scales: its value i is
//   d * sv[8 * (i / 16)] * q[i] - dm * mn[i / 16]   (exactly, in real arithmetic),
// q unsigned (the format's bias moved into mn): Q2_K 0..3, Q3_K 0..7 (bias
// 4), Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (bias 32); IQ4_XS: the table value
// as int8 (-127..113, k_signed), mn = 0. Q3_K, Q6_K and IQ4_XS have dm == d
// (k_min_uses_d). sv holds each of the 16 scales 8 times over
// (sv[t] = scale of values 2t, 2t + 1): as int16 lanes it is the multiplier
// of the pairs vpmaddubsw makes, 16 lanes (32 values) per AVX2 vector and 32
// lanes (64 values) per AVX-512 one.
struct alignas(64) KUnpacked {
  uint8_t q[256];
  int16_t sv[128];
  int16_t mn[16];
  float d, dm;
  uint8_t pad_[24];
};
static_assert(sizeof(KUnpacked) == 576, "KUnpacked layout");

constexpr bool k_min_uses_d(DType t) { return t == DType::Q3_K || t == DType::Q6_K || t == DType::IQ4_XS; }
// Codes are int8 (IQ4_XS) rather than unsigned bytes.
constexpr bool k_signed(DType t) { return t == DType::IQ4_XS; }

// The plain decoders of one stored block into that form: the oracle of the
// SIMD unpackers (which must give the same bytes).
void unpack_k_ref(DType t, const uint8_t* blk, KUnpacked* out);

// A 32-value block as signed codes: value i = d * q[i] + m (m = 0 but for
// Q5_1). Q5_0: q - 16 in -16..15; Q5_1: q in 0..31; IQ4_NL: the table value
// in -127..113.
void unpack_b32_ref(DType t, const uint8_t* blk, int8_t* q /* [32] */, float* d, float* m);

// Portable kernels (the fallback without AVX2; ggml's activations, x.e null).
void matmul_ggml_scalar(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1);

#if defined(__x86_64__) || defined(_M_X64)
// quantize_ggml_x with AVX2 (the same bytes; both families use it).
void quantize_ggml_x_avx2(GgmlAct a, const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                          int16_t* bsums);
// AVX2 family: every GGUF block type.
void matmul_ggml_avx2(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1);
// The AVX2 family's unpackers (tests hold them to unpack_k_ref and
// unpack_b32_ref byte for byte). nr rows from w (byte
// stride rb), blocks [b0, b1) of each row: K-quants into out[r * ostride +
// b - b0] (KUnpacked), others as below. pf: the same bytes of the next rows
// to prefetch (decode), or null.
void unpack_k_rows_avx2(DType t, const uint8_t* w, size_t rb, int nr, int64_t b0, int64_t b1, KUnpacked* out,
                        int64_t ostride, const uint8_t* pf);
// 32-value types: codes into q[r * qstride + 32 * (b - b0) + i] (int8),
// scales into d[r * dstride + b - b0] (and m likewise for Q5_1; m may be
// null otherwise).
void unpack_b32_rows_avx2(DType t, const uint8_t* w, size_t rb, int nr, int64_t b0, int64_t b1, int8_t* q,
                          int64_t qstride, float* d, float* m, int64_t dstride, const uint8_t* pf);

// AVX-512 family. It runs the K-quants, IQ4_XS, Q5_0 and IQ4_NL itself; Q5_1 it
// hands to the AVX2 kernels (ggml_avx512_runs), for decode and prefill alike.
// Its K-quant and IQ4_XS activations are Q8_K with sub-scales (x.e set),
// from quantize_q8_ks_avx512 (quantize_q8_ks's bytes).
bool ggml_avx512_runs(DType t);
void quantize_q8_ks_avx512(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, uint8_t* e,
                           int16_t* bsums);
// Q5_0 / IQ4_NL activations in the quad layout of gemm_kernels.h
// (kQuadBytes per 4 blocks), with the ggml Q8_0 q and d of `x` and the
// offset correction of t's unsigned weight codes (K = 16 for Q5_0, 128 for
// IQ4_NL).
void ggml_quads_avx512(DType t, const GgmlX& x, int64_t n, uint8_t* out);
void matmul_ggml_avx512(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1);
#endif

}  // namespace llm::cpu::kern
