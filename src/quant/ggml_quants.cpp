// ggml block decoders. Each mirrors the arithmetic of ggml's reference
// dequantize_row_* exactly: the same float products in the same order
// (e.g. Q6_K is (d * scale) * q, not d * (scale * q)), so the results are
// bit-identical. Block layouts are written next to each decoder.
#include "quant/ggml_quants.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace llm {

namespace {

constexpr int kQK = 32;    // values per block of the 32-value formats
constexpr int kQKK = 256;  // values per super-block of the K formats

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_0, 18 bytes: f16 d | qs[16]; byte j: value j low nibble, value j+16 high nibble.
void deq_q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = (qs[j] & 0x0f) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

// Q4_1, 20 bytes: f16 d | f16 m | qs[16]; value = q * d + m.
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = qs[j] & 0x0f;
    const int x1 = qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

// Q5_0, 22 bytes: f16 d | qh u32 (bit j = 5th bit of value j) | qs[16]; value = (q - 16) * d.
void deq_q5_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t h0 = uint8_t(((qh >> j) << 4) & 0x10);
    const uint8_t h1 = uint8_t((qh >> (j + 12)) & 0x10);
    const int x0 = ((qs[j] & 0x0f) | h0) - 16;
    const int x1 = ((qs[j] >> 4) | h1) - 16;
    y[j] = x0 * d;
    y[j + kQK / 2] = x1 * d;
  }
}

// Q5_1, 24 bytes: f16 d | f16 m | qh u32 | qs[16]; value = q * d + m.
void deq_q5_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const uint8_t h0 = uint8_t(((qh >> j) << 4) & 0x10);
    const uint8_t h1 = uint8_t((qh >> (j + 12)) & 0x10);
    const int x0 = (qs[j] & 0x0f) | h0;
    const int x1 = (qs[j] >> 4) | h1;
    y[j] = x0 * d + m;
    y[j + kQK / 2] = x1 * d + m;
  }
}

// Q8_0, 34 bytes: f16 d | int8 qs[32].
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = qs[j] * d;
}

// Q8_1, 36 bytes: f16 d | f16 s (sum, unused here) | int8 qs[32].
void deq_q8_1(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 4);
  for (int j = 0; j < kQK; ++j) y[j] = qs[j] * d;
}

// IQ4_NL, 18 bytes: f16 d | qs[16] indices into a fixed non-linear table.
void deq_iq4_nl(const uint8_t* b, float* y) {
  static const int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * kValues[qs[j] & 0x0f];
    y[j + kQK / 2] = d * kValues[qs[j] >> 4];
  }
}

// IQ4_XS, 136 bytes: f16 d | u16 scales_h | scales_l[4] | qs[128]; per 32 values
// the 6-bit scale ls (low 4 bits from scales_l, high 2 from scales_h), value
// = (d * (ls - 32)) * table[nibble]; nibbles as in IQ4_NL, 16 bytes per 32.
void deq_iq4_xs(const uint8_t* b, float* y) {
  static const int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const float d = half_at(b);
  uint16_t sh;
  std::memcpy(&sh, b + 2, 2);
  const uint8_t* sl = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < kQKK / 32; ++ib) {
    const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kValues[qs[j] & 0x0f];
      y[j + 16] = dl * kValues[qs[j] >> 4];
    }
    y += 32;
    qs += 16;
  }
}

// Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, per 16 values)
// | qs[64] (2-bit, four planes) | f16 d | f16 dmin.
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < kQKK; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * (sc & 0x0f), ml = dmin * (sc >> 4);
        const uint8_t* qq = q + 16 * half;
        for (int l = 0; l < 16; ++l) *y++ = dl * int8_t((qq[l] >> shift) & 3) - ml;
      }
      shift += 2;
    }
    q += 32;
  }
}

// Q3_K, 110 bytes: hmask[32] (3rd bit) | qs[64] (low 2 bits) | scales[12]
// (16 x 6-bit, biased by 32) | f16 d.
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = half_at(b + 108);
  // Unpack 16 6-bit scales: low 4 bits from bytes 0..7, high 2 bits from bytes 8..11.
  const uint8_t* s = b + 96;
  int8_t scales[16];
  for (int k = 0; k < 16; ++k) {
    const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
    const int hi = (s[8 + (k % 4)] >> (2 * (k / 4))) & 3;
    scales[k] = int8_t((lo | (hi << 4)) - 32);
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQKK; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * scales[is++];
        const uint8_t* qq = q + 16 * half;
        const uint8_t* hh = hm + 16 * half;
        for (int l = 0; l < 16; ++l) *y++ = dl * (int8_t((qq[l] >> shift) & 3) - ((hh[l] & m) ? 0 : 4));
      }
      shift += 2;
      m = uint8_t(m << 1);
    }
    q += 32;
  }
}

// 6-bit scale and min j (0..7) of the Q4_K / Q5_K 12-byte scale array.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    *mn = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K, 144 bytes: f16 d | f16 dmin | scales[12] | qs[128]; per 32 values value = d*sc*q - dmin*m.
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int j = 0; j < kQKK; j += 64) {
    uint8_t sc, mn;
    scale_min_k4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    scale_min_k4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// Q5_K, 176 bytes: f16 d | f16 dmin | scales[12] | qh[32] (5th bits) | qs[128].
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < kQKK; j += 64) {
    uint8_t sc, mn;
    scale_min_k4(is, scales, &sc, &mn);
    const float d1 = d * sc, m1 = dmin * mn;
    scale_min_k4(is + 1, scales, &sc, &mn);
    const float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 = uint8_t(u1 << 2);
    u2 = uint8_t(u2 << 2);
  }
}

// Q6_K, 210 bytes: ql[128] (low 4 bits) | qh[64] (high 2 bits) | int8 scales[16] | f16 d.
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < kQKK; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// Q8_K, 292 bytes: f32 d | int8 qs[256] | int16 bsums[16] (unused here).
void deq_q8_k(const uint8_t* b, float* y) {
  float d;
  std::memcpy(&d, b, 4);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 4);
  for (int j = 0; j < kQKK; ++j) y[j] = d * qs[j];
}

struct Decoder {
  int block;
  size_t bytes;
  const char* name;  // as ggml_type_name (format/gguf.h) spells it
  void (*fn)(const uint8_t*, float*);
};

bool decoder_for(GgmlType t, Decoder* dec) {
  switch (t) {
    case GgmlType::Q4_0: *dec = {kQK, 18, "q4_0", deq_q4_0}; return true;
    case GgmlType::Q4_1: *dec = {kQK, 20, "q4_1", deq_q4_1}; return true;
    case GgmlType::Q5_0: *dec = {kQK, 22, "q5_0", deq_q5_0}; return true;
    case GgmlType::Q5_1: *dec = {kQK, 24, "q5_1", deq_q5_1}; return true;
    case GgmlType::Q8_0: *dec = {kQK, 34, "q8_0", deq_q8_0}; return true;
    case GgmlType::Q8_1: *dec = {kQK, 36, "q8_1", deq_q8_1}; return true;
    case GgmlType::IQ4_NL: *dec = {kQK, 18, "iq4_nl", deq_iq4_nl}; return true;
    case GgmlType::Q2_K: *dec = {kQKK, 84, "q2_K", deq_q2_k}; return true;
    case GgmlType::Q3_K: *dec = {kQKK, 110, "q3_K", deq_q3_k}; return true;
    case GgmlType::Q4_K: *dec = {kQKK, 144, "q4_K", deq_q4_k}; return true;
    case GgmlType::Q5_K: *dec = {kQKK, 176, "q5_K", deq_q5_k}; return true;
    case GgmlType::Q6_K: *dec = {kQKK, 210, "q6_K", deq_q6_k}; return true;
    case GgmlType::Q8_K: *dec = {kQKK, 292, "q8_K", deq_q8_k}; return true;
    case GgmlType::IQ4_XS: *dec = {kQKK, 136, "iq4_xs", deq_iq4_xs}; return true;
    default: return false;
  }
}

}  // namespace

int64_t ggml_block_size(GgmlType t) {
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return 1;
  Decoder dec;
  return decoder_for(t, &dec) ? dec.block : 0;
}

GgmlType ggml_type_of(DType t) {
  switch (t) {
    case DType::Q5_0: return GgmlType::Q5_0;
    case DType::Q5_1: return GgmlType::Q5_1;
    case DType::Q2_K: return GgmlType::Q2_K;
    case DType::Q3_K: return GgmlType::Q3_K;
    case DType::Q4_K: return GgmlType::Q4_K;
    case DType::Q5_K: return GgmlType::Q5_K;
    case DType::Q6_K: return GgmlType::Q6_K;
    case DType::IQ4_NL: return GgmlType::IQ4_NL;
    case DType::IQ4_XS: return GgmlType::IQ4_XS;
    default: break;
  }
  fail(LLM_ERR_INVALID_ARGUMENT, "ggml_type_of: %s is not a GGUF block type", dtype_name(t));
}

void dequantize_ggml(GgmlType t, const uint8_t* src, float* dst, int64_t n) {
  LLM_CHECK(n >= 0, LLM_ERR_INVALID_ARGUMENT, "dequantize_ggml: negative count");
  switch (t) {
    case GgmlType::F32:
      if (n) std::memcpy(dst, src, size_t(n) * 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16: {
      const bool f16 = t == GgmlType::F16;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    }
    default: break;
  }
  Decoder dec;
  LLM_CHECK(decoder_for(t, &dec), LLM_ERR_UNSUPPORTED, "dequantize_ggml: type %u is not supported", unsigned(t));
  LLM_CHECK(n % dec.block == 0, LLM_ERR_INVALID_ARGUMENT, "dequantize_ggml: %lld values is not a multiple of the %s block %d",
            (long long)n, dec.name, dec.block);
  for (int64_t b = 0; b < n / dec.block; ++b) dec.fn(src + size_t(b) * dec.bytes, dst + b * dec.block);
}

}  // namespace llm
