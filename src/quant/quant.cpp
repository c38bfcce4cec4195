// Reference quantizers. At group 32 they produce the same bytes as ggml's
// quantize_row_q8_0_ref / quantize_row_q4_0_ref (ggml_quantize_chunk without
// an importance matrix): the scale is computed in float, its reciprocal is
// taken once, values are scaled by multiplying with it, and the scale is
// stored as fp16 (round to nearest even) only afterwards.
#include "quant/quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/ggml_quants.h"

namespace llm {

namespace {

inline void store_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q8 group of 32: d = max|x| / 127, q = round(x * (1/d)) in [-127, 127].
void quantize_q8_group(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  int8_t* q = reinterpret_cast<int8_t*>(out + 2);
  for (int j = 0; j < 32; ++j) {
    const float v = std::round(x[j] * id);  // round half away from zero, like roundf
    // Only a non-finite input leaves [-127, 127]; map it to 0 rather than convert out of range.
    q[j] = v >= -127.0f && v <= 127.0f ? int8_t(v) : int8_t(0);
  }
}

// trunc(v) clamped to [0, 15]; v = x/d + 8.5 is in [0.5, 16.5] for finite x.
inline int nibble(float v) {
  if (v != v) return 8;  // NaN: zero
  if (v < 0.0f) return 0;
  if (v >= 15.0f) return 15;
  return int(v);
}

// Q4 group of G: d = (the value of largest magnitude, with its sign) / -8, so
// that value maps to nibble 0 and the full range [-8, 7] is used on the other
// side; nibble = min(15, trunc(x/d + 8.5)).
void quantize_q4_group(const float* x, uint8_t* out, int g) {
  const float d = signed_absmax(x, g) / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  uint8_t* qs = out + 2;
  const int h = g / 2;
  for (int j = 0; j < h; ++j) {
    // x * id lies in [-8, 8]; + 8.5 then truncation rounds half up.
    const float v0 = x[j] * id + 8.5f, v1 = x[j + h] * id + 8.5f;
    qs[j] = uint8_t(nibble(v0) | nibble(v1) << 4);
  }
}

void quantize_q4m_group(const float* x, const float* wt, uint8_t* out, int g) {
  float d, m;
  q4m_fit_group(x, wt, g, &d, &m);
  store_half(out, d);
  store_half(out + 2, m);
  uint8_t* qs = out + 4;
  const int h = g / 2;
  for (int j = 0; j < h; ++j) qs[j] = uint8_t(q4m_nibble(x[j], d, m) | q4m_nibble(x[j + h], d, m) << 4);
}

}  // namespace

float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

int q4m_nibble(float x, float d, float m) {
  if (d == 0.0f) return 0;
  const float v = std::nearbyint((x - m) / d);
  if (!(v > 0.0f)) return 0;  // also NaN
  return v >= 15.0f ? 15 : int(v);
}

void q4m_fit_group(const float* x, const float* wt, int g, float* d_out, float* m_out) {
  // Starting ranges: (lo, hi) scaled by these factors; 1.0 is plain min/max.
  static const float kShrink[][2] = {{1.0f, 1.0f}, {0.95f, 0.95f}, {0.9f, 0.9f}, {1.0f, 0.9f},
                                     {0.9f, 1.0f}, {0.85f, 0.85f}, {0.8f, 0.8f}};
  constexpr int kIters = 6;
  float lo = INFINITY, hi = -INFINITY;
  for (int j = 0; j < g; ++j) {
    if (!std::isfinite(x[j])) continue;
    lo = std::fmin(lo, x[j]);
    hi = std::fmax(hi, x[j]);
  }
  if (!(lo < hi)) {  // constant group (or nothing finite): the minimum alone
    *d_out = 0.0f;
    *m_out = lo <= hi ? f16_to_f32(f32_to_f16(lo)) : 0.0f;
    return;
  }
  auto weight = [&](int j) { return wt ? double(wt[j]) : 1.0; };
  auto round16 = [](double v) { return f16_to_f32(f32_to_f16(float(v))); };
  auto error = [&](float d, float m) {
    double e = 0.0;
    for (int j = 0; j < g; ++j) {
      if (!std::isfinite(x[j])) continue;
      const double r = double(x[j]) - (double(d) * q4m_nibble(x[j], d, m) + double(m));
      e += weight(j) * r * r;
    }
    return e;
  };
  double best = INFINITY;
  float bd = round16((hi - lo) / 15.0f), bm = round16(lo);
  for (const auto& f : kShrink) {
    float m = round16(double(lo) * f[0]);
    float d = round16((double(hi) * f[1] - double(lo) * f[0]) / 15.0);
    for (int it = 0; it < kIters && d != 0.0f; ++it) {
      // Weighted least squares of x ~ d * q + m for the current nibbles.
      double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
      for (int j = 0; j < g; ++j) {
        if (!std::isfinite(x[j])) continue;
        const double w = weight(j), q = q4m_nibble(x[j], d, m);
        sw += w, sq += w * q, sqq += w * q * q, sx += w * x[j], sqx += w * q * x[j];
      }
      const double det = sw * sqq - sq * sq;
      if (!(det > 1e-30)) break;
      const float nd = round16((sw * sqx - sq * sx) / det), nm = round16((sqq * sx - sq * sqx) / det);
      if (!(nd > 0.0f) || !std::isfinite(nm)) break;
      d = nd, m = nm;
    }
    if (d == 0.0f) continue;
    const double e = error(d, m);
    if (e < best) best = e, bd = d, bm = m;
  }
  *d_out = bd;
  *m_out = bm;
}

void quantize_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols) {
  quantize_row_weighted(t, group, src, nullptr, dst, cols);
}

void quantize_row_weighted(DType t, uint32_t group, const float* src, const float* importance,
                           uint8_t* dst, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols, group);
  LLM_CHECK(row_bytes != 0 || cols == 0, LLM_ERR_INVALID_ARGUMENT, "quantize_row: %s with %lld cols, group %u",
            dtype_name(t), (long long)cols, group);
  switch (t) {
    case DType::F32:
      if (cols) std::memcpy(dst, src, size_t(cols) * 4);
      return;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < cols; ++i) {
        const uint16_t h = t == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::Q8:
      for (int64_t g = 0; g < cols / 32; ++g) quantize_q8_group(src + g * 32, dst + g * 34);
      return;
    case DType::Q4: {
      const size_t gbytes = 2 + group / 2;
      for (int64_t g = 0; g < cols / int64_t(group); ++g) quantize_q4_group(src + g * group, dst + g * gbytes, int(group));
      return;
    }
    case DType::Q4M: {
      const size_t gbytes = 4 + group / 2;
      for (int64_t g = 0; g < cols / int64_t(group); ++g)
        quantize_q4m_group(src + g * group, importance ? importance + g * group : nullptr, dst + g * gbytes, int(group));
      return;
    }
    default:
      // The GGUF block quantizers are offline code (convert/ggml_quantize.h):
      // nothing that loads or runs a model writes those blocks.
      LLM_CHECK(!dtype_is_ggml_block(t), LLM_ERR_UNSUPPORTED,
                "quantize_row: %s blocks have no quantizer in the library (llm-convert writes them)", dtype_name(t));
      break;
  }
  fail(LLM_ERR_INVALID_ARGUMENT, "quantize_row: unknown dtype %u", unsigned(t));
}

void dequantize_row(DType t, uint32_t group, const uint8_t* src, float* dst, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols, group);
  LLM_CHECK(row_bytes != 0 || cols == 0, LLM_ERR_INVALID_ARGUMENT, "dequantize_row: %s with %lld cols, group %u",
            dtype_name(t), (long long)cols, group);
  switch (t) {
    case DType::F32:
      if (cols) std::memcpy(dst, src, size_t(cols) * 4);
      return;
    case DType::F16:
    case DType::BF16:
      for (int64_t i = 0; i < cols; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = t == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case DType::Q8:
      for (int64_t g = 0; g < cols / 32; ++g) {
        const uint8_t* b = src + g * 34;
        const float d = load_half(b);
        const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < 32; ++j) dst[g * 32 + j] = q[j] * d;
      }
      return;
    case DType::Q4: {
      const int64_t h = group / 2;
      for (int64_t g = 0; g < cols / int64_t(group); ++g) {
        const uint8_t* b = src + g * (2 + h);
        const float d = load_half(b);
        float* y = dst + g * group;
        for (int64_t j = 0; j < h; ++j) {
          y[j] = ((b[2 + j] & 0x0f) - 8) * d;
          y[j + h] = ((b[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case DType::Q4M: {
      // As ggml's Q4_1: float(nibble) * d + m, a multiply then an add.
      const int64_t h = group / 2;
      for (int64_t g = 0; g < cols / int64_t(group); ++g) {
        const uint8_t* b = src + g * (4 + h);
        const float d = load_half(b), m = load_half(b + 2);
        float* y = dst + g * group;
        for (int64_t j = 0; j < h; ++j) {
          y[j] = float(b[4 + j] & 0x0f) * d + m;
          y[j + h] = float(b[4 + j] >> 4) * d + m;
        }
      }
      return;
    }
    default:
      // GGUF blocks: ggml's own to_float, bit for bit (ggml_quants.cpp).
      if (dtype_is_ggml_block(t)) {
        dequantize_ggml(ggml_type_of(t), src, dst, cols);
        return;
      }
      break;
  }
  fail(LLM_ERR_INVALID_ARGUMENT, "dequantize_row: unknown dtype %u", unsigned(t));
}

}  // namespace llm
