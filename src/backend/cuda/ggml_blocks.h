// Per-block math of the GGUF block formats the CUDA backend runs as stored
// (WFormat::Ggml: Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS;
// layouts in quant/dtype.h). The unit of work is a "sub-block": 32
// consecutive values of a block (sub-block s of a K-quant or IQ4_XS block
// is values [32 s, 32 s + 32); the 32-value formats have one).
//
// ggml_decode32 does exactly the float operations of quant/ggml_quants.cpp's
// decoders, in the same order, so on the host it gives the same bits as
// dequantize_ggml. On the device, mul/add pairs go through __fmul_rn /
// __fadd_rn so nvcc cannot fuse them into an FMA (ggml's x * d + m is two
// roundings), and the f16 conversion is exact either way.
//
// Blocks are read with byte loads only: a row starts 16-byte aligned, but
// blocks of 22, 24, 84, 110, 136, 176 or 210 bytes do not.
//
// Same conventions as kernel_math.h: no CUDA API calls, compiles with nvcc
// and with the host compiler; tests/gpu/ggml_blocks_cpu_test.cpp runs these
// functions on the CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernel_math.h"
#include "quant/dtype.h"

namespace llm::cuda {

// ---------------------------------------------------------------- block geometry

// Values and bytes per block of a GGUF block type; 0 for any other DType.
LLM_HD constexpr int ggml_values_of(DType t) {
  return (t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL) ? 32
         : (t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ||
            t == DType::IQ4_XS)
             ? 256
             : 0;
}
LLM_HD constexpr int ggml_bytes_of(DType t) {
  return t == DType::Q5_0     ? 22
         : t == DType::Q5_1   ? 24
         : t == DType::IQ4_NL ? 18
         : t == DType::Q2_K   ? 84
         : t == DType::Q3_K   ? 110
         : t == DType::Q4_K   ? 144
         : t == DType::Q5_K   ? 176
         : t == DType::Q6_K   ? 210
         : t == DType::IQ4_XS ? 136
                              : 0;
}
// Sub-blocks of 32 values per block (1 or 8).
LLM_HD constexpr int ggml_subs_of(DType t) { return ggml_values_of(t) / 32; }

// Sub-block u of a row (u < cols / 32): its block's bytes and its index in the block.
template <DType T>
LLM_HD const uint8_t* ggml_unit_block(const uint8_t* row, int64_t u) {
  return row + (u / ggml_subs_of(T)) * ggml_bytes_of(T);
}
template <DType T>
LLM_HD int ggml_unit_sub(int64_t u) {
  return int(u % ggml_subs_of(T));
}

// Host code (the launchers, the tests) reaching the templates below from a
// run-time DType: returns f(std::integral_constant<DType, t>{}) for a GGUF
// block type t, otherwise() for any other DType.
template <class F, class G>
auto with_ggml_type(DType t, F&& f, G&& otherwise) {
  switch (t) {
    case DType::Q5_0: return f(std::integral_constant<DType, DType::Q5_0>{});
    case DType::Q5_1: return f(std::integral_constant<DType, DType::Q5_1>{});
    case DType::Q2_K: return f(std::integral_constant<DType, DType::Q2_K>{});
    case DType::Q3_K: return f(std::integral_constant<DType, DType::Q3_K>{});
    case DType::Q4_K: return f(std::integral_constant<DType, DType::Q4_K>{});
    case DType::Q5_K: return f(std::integral_constant<DType, DType::Q5_K>{});
    case DType::Q6_K: return f(std::integral_constant<DType, DType::Q6_K>{});
    case DType::IQ4_NL: return f(std::integral_constant<DType, DType::IQ4_NL>{});
    case DType::IQ4_XS: return f(std::integral_constant<DType, DType::IQ4_XS>{});
    default: return otherwise();
  }
}

// ---------------------------------------------------------------- loads and exact float steps

LLM_HD uint32_t ggml_u16(const uint8_t* p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
LLM_HD uint32_t ggml_u32(const uint8_t* p) { return ggml_u16(p) | (ggml_u16(p + 2) << 16); }
LLM_HD float ggml_f16(const uint8_t* p) { return f16_bits_to_float(ggml_u16(p)); }

// One rounding each, never fused (the host decoders round the product too).
LLM_HD float ggml_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LLM_HD float ggml_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LLM_HD float ggml_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// IQ4_NL / IQ4_XS non-linear table {-127, -104, -83, -65, -49, -35, -22, -10,
// 1, 13, 25, 38, 53, 69, 89, 113}, entry i as byte i of two 64-bit words: no
// memory table, so nothing to place in __constant__ memory and nothing that
// needs --expt-relaxed-constexpr.
LLM_HD int iq4_value(uint32_t i) {
  const uint64_t t = i < 8u ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
  return int(int8_t(uint8_t((t >> ((i & 7u) * 8u)) & 0xffu)));
}

// 6-bit scale and min j (0..7) of the Q4_K / Q5_K 12-byte scale array.
LLM_HD void ggml_scale_min_k4(int j, const uint8_t* q, uint32_t* sc, uint32_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63u;
    *mn = q[j + 4] & 63u;
  } else {
    *sc = (q[j + 4] & 0x0fu) | ((uint32_t(q[j - 4]) >> 6) << 4);
    *mn = (uint32_t(q[j + 4]) >> 4) | ((uint32_t(q[j]) >> 6) << 4);
  }
}

// Signed 6-bit scale k (0..15) of Q3_K's 12-byte scale array, bias removed.
LLM_HD int q3k_scale(const uint8_t* s, int k) {
  const uint32_t lo = k < 8 ? (s[k] & 0x0fu) : (uint32_t(s[k - 8]) >> 4);
  const uint32_t hi = (uint32_t(s[8 + (k % 4)]) >> (2 * (k / 4))) & 3u;
  return int(int8_t(int(lo | (hi << 4)) - 32));
}

// ---------------------------------------------------------------- per type: codes and scales
//
// Each type's 32 values of sub-block s are v[l] = A(l) * q(l) - B(l) (or + B)
// with an integer code q(l) and A, B constant over runs of 16 or 32 values.
// The decoders below keep ggml's exact expression; the dots factor A and B
// out of each run: A * sum(q x) - B * sum(x).

// Q5_0, 22 bytes: f16 d | u32 qh | qs[16]; value j: low nibble of qs[j] (j < 16)
// or high nibble of qs[j - 16], 5th bit qh bit j; value = (q - 16) * d.
LLM_HD int q5_code(const uint8_t* qs, uint32_t qh, int l) {
  const int j = l & 15;
  return l < 16 ? int((qs[j] & 0x0fu) | (((qh >> j) << 4) & 0x10u))
                : int((uint32_t(qs[j]) >> 4) | ((qh >> (j + 12)) & 0x10u));
}

// Q2_K code l of sub-block s: 2 bits of q[32 (s / 4) + l] at shift 2 (s % 4).
LLM_HD int q2k_code(const uint8_t* b, int s, int l) {
  return int((uint32_t(b[16 + 32 * (s / 4) + l]) >> (2 * (s % 4))) & 3u);
}

// Q3_K code l of sub-block s: 2 low bits as Q2_K's, minus 4 unless bit s of hmask[l] is set.
LLM_HD int q3k_code(const uint8_t* b, int s, int l) {
  const int q = int((uint32_t(b[32 + 32 * (s / 4) + l]) >> (2 * (s % 4))) & 3u);
  return q - ((b[l] >> s) & 1u ? 0 : 4);
}

// Q4_K code l of sub-block s: nibble (s & 1) of q[32 (s / 2) + l].
LLM_HD int q4k_code(const uint8_t* b, int s, int l) {
  return int((uint32_t(b[16 + 32 * (s / 2) + l]) >> (4 * (s & 1))) & 0x0fu);
}

// Q5_K code l of sub-block s: Q4_K's nibble (at offset 48) + 16 if bit s of qh[l].
LLM_HD int q5k_code(const uint8_t* b, int s, int l) {
  const int q = int((uint32_t(b[48 + 32 * (s / 2) + l]) >> (4 * (s & 1))) & 0x0fu);
  return q + ((b[16 + l] >> s) & 1u ? 16 : 0);
}

// Q6_K code l of sub-block s = 4 h + t: low nibble (t < 2) or high nibble of
// ql[64 h + 32 (t & 1) + l], high 2 bits of qh[32 h + l] at shift 2 t; minus 32.
// Its int8 scale is sc[8 h + 2 t + l / 16].
LLM_HD int q6k_code(const uint8_t* b, int s, int l) {
  const int h = s / 4, t = s % 4;
  const uint32_t lo = (uint32_t(b[64 * h + 32 * (t & 1) + l]) >> (4 * (t >> 1))) & 0x0fu;
  const uint32_t hi = (uint32_t(b[128 + 32 * h + l]) >> (2 * t)) & 3u;
  return int(lo | (hi << 4)) - 32;
}
LLM_HD int q6k_scale(const uint8_t* b, int s, int half) {
  return int(int8_t(b[192 + 8 * (s / 4) + 2 * (s % 4) + half]));
}

// IQ4_XS 6-bit scale of sub-block s, bias removed.
LLM_HD int iq4xs_scale(const uint8_t* b, int s) {
  const uint32_t sh = ggml_u16(b + 2);
  const uint32_t ls = ((uint32_t(b[4 + s / 2]) >> (4 * (s % 2))) & 0x0fu) | (((sh >> (2 * s)) & 3u) << 4);
  return int(ls) - 32;
}

// IQ4 nibble l of 16 bytes qs: low nibble of qs[l] (l < 16), high of qs[l - 16].
LLM_HD uint32_t iq4_nibble(const uint8_t* qs, int l) {
  return l < 16 ? (qs[l] & 0x0fu) : (uint32_t(qs[l - 16]) >> 4);
}

// ---------------------------------------------------------------- decode

// y[0..31] = values [32 s, 32 s + 32) of the block at b, bit-exact with dequantize_ggml.
template <DType T>
LLM_HD void ggml_decode32(const uint8_t* b, int s, float* y) {
  static_assert(ggml_values_of(T) != 0, "not a GGUF block type");
  (void)s;  // the 32-value formats have one sub-block
  if constexpr (T == DType::Q5_0) {
    const float d = ggml_f16(b);
    const uint32_t qh = ggml_u32(b + 2);
    for (int l = 0; l < 32; ++l) y[l] = ggml_mul(float(q5_code(b + 6, qh, l) - 16), d);
  } else if constexpr (T == DType::Q5_1) {
    const float d = ggml_f16(b), m = ggml_f16(b + 2);
    const uint32_t qh = ggml_u32(b + 4);
    for (int l = 0; l < 32; ++l) y[l] = ggml_add(ggml_mul(float(q5_code(b + 8, qh, l)), d), m);
  } else if constexpr (T == DType::IQ4_NL) {
    const float d = ggml_f16(b);
    for (int l = 0; l < 32; ++l) y[l] = ggml_mul(d, float(iq4_value(iq4_nibble(b + 2, l))));
  } else if constexpr (T == DType::IQ4_XS) {
    const float dl = ggml_mul(ggml_f16(b), float(iq4xs_scale(b, s)));
    for (int l = 0; l < 32; ++l) y[l] = ggml_mul(dl, float(iq4_value(iq4_nibble(b + 8 + 16 * s, l))));
  } else if constexpr (T == DType::Q2_K) {
    const float d = ggml_f16(b + 80), dmin = ggml_f16(b + 82);
    for (int half = 0; half < 2; ++half) {
      const uint32_t sc = b[2 * s + half];
      const float dl = ggml_mul(d, float(sc & 0x0fu)), ml = ggml_mul(dmin, float(sc >> 4));
      for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = ggml_sub(ggml_mul(dl, float(q2k_code(b, s, l))), ml);
    }
  } else if constexpr (T == DType::Q3_K) {
    const float d = ggml_f16(b + 108);
    for (int half = 0; half < 2; ++half) {
      const float dl = ggml_mul(d, float(q3k_scale(b + 96, 2 * s + half)));
      for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = ggml_mul(dl, float(q3k_code(b, s, l)));
    }
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    uint32_t sc, mn;
    ggml_scale_min_k4(s, b + 4, &sc, &mn);
    const float d1 = ggml_mul(ggml_f16(b), float(sc)), m1 = ggml_mul(ggml_f16(b + 2), float(mn));
    for (int l = 0; l < 32; ++l) {
      const int q = T == DType::Q4_K ? q4k_code(b, s, l) : q5k_code(b, s, l);
      y[l] = ggml_sub(ggml_mul(d1, float(q)), m1);
    }
  } else {  // Q6_K: (d * sc) * q
    const float d = ggml_f16(b + 208);
    for (int half = 0; half < 2; ++half) {
      const float ds = ggml_mul(d, float(q6k_scale(b, s, half)));
      for (int l = 16 * half; l < 16 * half + 16; ++l) y[l] = ggml_mul(ds, float(q6k_code(b, s, l)));
    }
  }
}

// ---------------------------------------------------------------- dot

// sum over l < 32 of w[l] * x[l] (decoded values against activations).
LLM_HD float dot32(const float* w, const float* x) {
  float acc = 0.f;
  for (int l = 0; l < 32; ++l) acc += w[l] * x[l];
  return acc;
}

// sum over l < 32 of value(32 s + l) * x[l] for the block at b, in f32, with
// each run's scale (and min) applied once: A * sum(q x) + B * sum(x). Not
// bit-exact with dot32 of the decoded values (different rounding), close
// to it: the tests bound the difference.
template <DType T>
LLM_HD float ggml_dot32(const uint8_t* b, int s, const float* x) {
  static_assert(ggml_values_of(T) != 0, "not a GGUF block type");
  (void)s;
  if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
    const uint32_t qh = ggml_u32(b + (T == DType::Q5_0 ? 2 : 4));
    const uint8_t* qs = b + (T == DType::Q5_0 ? 6 : 8);
    float qx = 0.f, sx = 0.f;
    for (int l = 0; l < 32; ++l) {
      qx += float(q5_code(qs, qh, l)) * x[l];
      sx += x[l];
    }
    if constexpr (T == DType::Q5_0) return ggml_f16(b) * (qx - 16.f * sx);
    else return ggml_f16(b) * qx + ggml_f16(b + 2) * sx;
  } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
    const uint8_t* qs = T == DType::IQ4_NL ? b + 2 : b + 8 + 16 * s;
    float qx = 0.f;
    for (int l = 0; l < 32; ++l) qx += float(iq4_value(iq4_nibble(qs, l))) * x[l];
    const float d = ggml_f16(b);
    return T == DType::IQ4_NL ? d * qx : d * float(iq4xs_scale(b, s)) * qx;
  } else if constexpr (T == DType::Q2_K) {
    const float d = ggml_f16(b + 80), dmin = ggml_f16(b + 82);
    float acc = 0.f;
    for (int half = 0; half < 2; ++half) {
      const uint32_t sc = b[2 * s + half];
      float qx = 0.f, sx = 0.f;
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        qx += float(q2k_code(b, s, l)) * x[l];
        sx += x[l];
      }
      acc += d * float(sc & 0x0fu) * qx - dmin * float(sc >> 4) * sx;
    }
    return acc;
  } else if constexpr (T == DType::Q3_K || T == DType::Q6_K) {
    const float d = ggml_f16(b + (T == DType::Q3_K ? 108 : 208));
    float acc = 0.f;
    for (int half = 0; half < 2; ++half) {
      float qx = 0.f;
      for (int l = 16 * half; l < 16 * half + 16; ++l)
        qx += float(T == DType::Q3_K ? q3k_code(b, s, l) : q6k_code(b, s, l)) * x[l];
      const int sc = T == DType::Q3_K ? q3k_scale(b + 96, 2 * s + half) : q6k_scale(b, s, half);
      acc += d * float(sc) * qx;
    }
    return acc;
  } else {  // Q4_K, Q5_K
    uint32_t sc, mn;
    ggml_scale_min_k4(s, b + 4, &sc, &mn);
    float qx = 0.f, sx = 0.f;
    for (int l = 0; l < 32; ++l) {
      const int q = T == DType::Q4_K ? q4k_code(b, s, l) : q5k_code(b, s, l);
      qx += float(q) * x[l];
      sx += x[l];
    }
    return ggml_f16(b) * float(sc) * qx - ggml_f16(b + 2) * float(mn) * sx;
  }
}

}  // namespace llm::cuda
