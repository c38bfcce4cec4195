// Quantizers into ggml's block formats. Layouts as in ggml_quants.cpp (the
// decoders); the error of every choice is computed with the decoder's own
// float operations (e.g. Q4_K's (d * sc) * q - dmin * mn), so a fit ranks
// candidates by the values that will really be read back.
#include "convert/ggml_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"

namespace llm {

namespace {

constexpr int kQK = 32;    // values per block of Q5_0 / Q5_1; per sub-block of Q4_K / Q5_K
constexpr int kQKK = 256;  // values per super-block of the K types
constexpr int kSub6 = 16;  // values per Q6_K sub-block

// An fp16 scale as it will be read back; saturates at the largest finite half.
float round_half(float v) {
  const float r = f16_to_f32(f32_to_f16(v));
  return std::isinf(r) ? std::copysign(65504.0f, v) : r;
}

void store_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(round_half(v));
  std::memcpy(p, &h, 2);
}

// One block's values with non-finite ones set to 0, and the weights of their
// squared errors: importance (clamped at 0; 1 without it), 0 for non-finite
// values. A sub-block whose weights are all 0 is fitted unweighted.
struct Block {
  float x[kQKK];
  float w[kQKK];
};

void load_block(const float* x, const float* importance, int n, int sub, Block* b) {
  for (int j = 0; j < n; ++j) {
    const bool finite = std::isfinite(x[j]);
    b->x[j] = finite ? x[j] : 0.0f;
    const float w = importance ? importance[j] : 1.0f;
    b->w[j] = finite && w > 0.0f ? w : 0.0f;  // also drops a NaN weight
  }
  for (int s = 0; s < n; s += sub) {
    float sum = 0.0f;
    for (int j = s; j < s + sub; ++j) sum += b->w[j];
    if (!(sum > 0.0f) || !std::isfinite(sum))
      for (int j = s; j < s + sub; ++j) b->w[j] = 1.0f;
  }
}

inline int clamp_code(float v, int lo, int hi) {
  if (!(v > float(lo))) return lo;  // also NaN
  return v >= float(hi) ? hi : int(v);
}

// ---------------------------------------------------------------------------
// Q5_0 / Q5_1: ggml's reference rule (see the header).

// Q5_0, 22 bytes: d = (value of largest magnitude, signed) / -16, code =
// min(31, trunc(x/d + 16.5)); value = d * (code - 16).
void quantize_q5_0_block(const float* x, uint8_t* out) {
  const float d = signed_absmax(x, kQK) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  uint32_t qh = 0;
  uint8_t* qs = out + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int c0 = clamp_code(x[j] * id + 16.5f, 0, 31), c1 = clamp_code(x[j + kQK / 2] * id + 16.5f, 0, 31);
    qs[j] = uint8_t((c0 & 0x0f) | (c1 & 0x0f) << 4);
    qh |= uint32_t(c0 >> 4) << j | uint32_t(c1 >> 4) << (j + kQK / 2);
  }
  std::memcpy(out + 2, &qh, 4);
}

// Q5_1, 24 bytes: d = (max - min) / 31, m = min, code = trunc((x - min)/d + 0.5);
// value = d * code + m.
void quantize_q5_1_block(const float* x, uint8_t* out) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < kQK; ++j) {
    lo = std::fmin(lo, x[j]);
    hi = std::fmax(hi, x[j]);
  }
  const float d = (hi - lo) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_half(out, d);
  store_half(out + 2, lo);
  uint32_t qh = 0;
  uint8_t* qs = out + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int c0 = clamp_code((x[j] - lo) * id + 0.5f, 0, 31);
    const int c1 = clamp_code((x[j + kQK / 2] - lo) * id + 0.5f, 0, 31);
    qs[j] = uint8_t((c0 & 0x0f) | (c1 & 0x0f) << 4);
    qh |= uint32_t(c0 >> 4) << j | uint32_t(c1 >> 4) << (j + kQK / 2);
  }
  std::memcpy(out + 4, &qh, 4);
}

// ---------------------------------------------------------------------------
// Fits. Sums of one candidate's codes q against the values x with weights w.

struct Sums {
  double w = 0, q = 0, qq = 0, x = 0, qx = 0;
  void add(double wj, double qj, double xj) {
    w += wj, q += wj * qj, qq += wj * qj * qj, x += wj * xj, qx += wj * qj * xj;
  }
};

// Rounding steps tried around the full-range step: the range is divided into
// (levels + delta) steps, delta in kDeltas. Fewer steps than levels clip the
// extremes less often than they help the bulk; more steps spread the codes.
constexpr float kDeltas[] = {-1.0f, -0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f,
                             1.0f,  1.25f,  1.5f,  1.75f,  2.0f};
constexpr int kRefine = 2;  // alternations of rounding and solving after the grid

// x ~ s * q - m with s >= 0, m >= 0 and q in 0..nmax.
struct Affine {
  float s = 0.0f, m = 0.0f;
};

// Weighted least squares (s, b) of x ~ s*q + b for fixed codes, with b <= 0
// (the format offsets downwards only) and s > 0. Returns the error
// sum w (x - s q - b)^2 up to the constant sum w x^2, or +inf when the
// codes do not determine a positive s.
double solve_affine(const Sums& S, double* s, double* b) {
  const double det = S.w * S.qq - S.q * S.q;
  *s = 0.0, *b = 0.0;
  if (det > 1e-9 * S.w * S.qq) {
    *s = (S.w * S.qx - S.q * S.x) / det;
    *b = (S.qq * S.x - S.q * S.qx) / det;
  }
  if (!(*b <= 0.0 && *s > 0.0)) {  // the optimum lies on b = 0
    *b = 0.0;
    *s = S.qq > 0.0 ? S.qx / S.qq : 0.0;
  }
  if (!(*s > 0.0)) return INFINITY;
  return -2.0 * *s * S.qx - 2.0 * *b * S.x + *s * *s * S.qq + 2.0 * *s * *b * S.q + *b * *b * S.w;
}

Affine fit_affine(const float* x, const float* w, int n, int nmax) {
  float lo = 0.0f, hi = -INFINITY;
  for (int j = 0; j < n; ++j) {
    lo = std::fmin(lo, x[j]);
    hi = std::fmax(hi, x[j]);
  }
  Affine best;
  if (!(hi > lo)) {  // constant (<= 0) sub-block: the offset alone is exact
    best.m = -lo;
    return best;
  }
  auto codes = [&](float s, float b, Sums* S) {
    const float is = 1.0f / s;
    for (int j = 0; j < n; ++j) S->add(w[j], clamp_code(std::nearbyint((x[j] - b) * is), 0, nmax), x[j]);
  };
  double best_err = INFINITY, bs = 0.0, bb = 0.0;
  for (float delta : kDeltas) {
    Sums S;
    codes((hi - lo) / (float(nmax) + delta), lo, &S);
    double s, b;
    const double e = solve_affine(S, &s, &b);
    if (e < best_err) best_err = e, bs = s, bb = b;
  }
  for (int it = 0; it < kRefine && std::isfinite(best_err); ++it) {
    Sums S;
    codes(float(bs), float(bb), &S);
    double s, b;
    const double e = solve_affine(S, &s, &b);
    if (!(e < best_err)) break;
    best_err = e, bs = s, bb = b;
  }
  if (!std::isfinite(best_err)) {  // no grid point gave a positive step: plain range
    best.s = (hi - lo) / float(nmax);
    best.m = -lo;
    return best;
  }
  best.s = float(bs);
  best.m = float(-bb);
  return best;
}

// x ~ s * q with q in -32..31 (s may be negative: the value of largest
// magnitude can take the extra level -32 whatever its sign).
float fit_symmetric(const float* x, const float* w, int n) {
  const float vmax = signed_absmax(x, n);
  if (vmax == 0.0f) return 0.0f;
  auto solve = [&](float s, double* out) {  // codes for step s, then the LS step; returns the error - sum w x^2
    const float is = 1.0f / s;
    double qq = 0.0, qx = 0.0;
    for (int j = 0; j < n; ++j) {
      const double q = clamp_code(std::nearbyint(x[j] * is), -32, 31);
      qq += w[j] * q * q, qx += w[j] * q * x[j];
    }
    if (!(qq > 0.0)) return double(INFINITY);
    *out = qx / qq;
    return -qx * qx / qq;
  };
  double best_err = INFINITY, best = double(vmax) / -32.0;
  for (float delta : kDeltas) {
    double s = 0.0;
    // The extreme value on code -32 (the longer side), or on +31.
    for (float levels : {-32.0f - delta, 31.0f + delta}) {
      const double e = solve(vmax / levels, &s);
      if (e < best_err) best_err = e, best = s;
    }
  }
  for (int it = 0; it < kRefine && best != 0.0; ++it) {
    double s = 0.0;
    const double e = solve(float(best), &s);
    if (!(e < best_err)) break;
    best_err = e, best = s;
  }
  return float(best);
}

// ---------------------------------------------------------------------------
// Codes of one sub-block for its stored step ds and offset dm (value =
// ds * q - dm, as the decoders compute it), and their weighted squared error.

double code_affine(const float* x, const float* w, int n, int nmax, float ds, float dm, uint8_t* q) {
  const float is = ds > 0.0f ? 1.0f / ds : 0.0f;
  double e = 0.0;
  for (int j = 0; j < n; ++j) {
    const int c = ds > 0.0f ? clamp_code(std::nearbyint((x[j] + dm) * is), 0, nmax) : 0;
    q[j] = uint8_t(c);
    const double r = double(ds * float(c) - dm) - x[j];
    e += w[j] * r * r;
  }
  return e;
}

double code_symmetric(const float* x, const float* w, int n, float ds, int8_t* q) {
  const float is = ds != 0.0f ? 1.0f / ds : 0.0f;
  double e = 0.0;
  for (int j = 0; j < n; ++j) {
    const int c = ds != 0.0f ? clamp_code(std::nearbyint(x[j] * is), -32, 31) : 0;
    q[j] = int8_t(c);
    const double r = double(ds * float(c)) - x[j];
    e += w[j] * r * r;
  }
  return e;
}

// The integer multiple k of the unit u in [lo, hi] nearest to v, and its two
// neighbours, as a range to try (only k = 0 when u is 0).
void neighbours(float v, float u, int lo, int hi, int* first, int* last) {
  const int k = u != 0.0f ? clamp_code(std::nearbyint(v / u), lo, hi) : 0;
  *first = u != 0.0f ? std::max(lo, k - 1) : 0;
  *last = u != 0.0f ? std::min(hi, k + 1) : 0;
}

// ---------------------------------------------------------------------------
// Q4_K / Q5_K super-block: 8 sub-blocks of 32, 6-bit scales and minimums.

void quantize_qk_affine_block(const Block& b, int nmax, uint8_t* out) {
  Affine f[8];
  float smax = 0.0f, mmax = 0.0f;
  for (int s = 0; s < 8; ++s) {
    f[s] = fit_affine(b.x + kQK * s, b.w + kQK * s, kQK, nmax);
    smax = std::fmax(smax, f[s].s);
    mmax = std::fmax(mmax, f[s].m);
  }
  const float d = round_half(smax / 63.0f), dmin = round_half(mmax / 63.0f);
  uint8_t sc[8], mn[8], q[kQKK], trial[kQK];
  for (int s = 0; s < 8; ++s) {
    const float* x = b.x + kQK * s;
    const float* w = b.w + kQK * s;
    int s0, s1, m0, m1;
    neighbours(f[s].s, d, 0, 63, &s0, &s1);
    neighbours(f[s].m, dmin, 0, 63, &m0, &m1);
    double best = INFINITY;
    for (int a = s0; a <= s1; ++a) {
      for (int c = m0; c <= m1; ++c) {
        const double e = code_affine(x, w, kQK, nmax, d * float(a), dmin * float(c), trial);
        if (e < best) {
          best = e, sc[s] = uint8_t(a), mn[s] = uint8_t(c);
          std::memcpy(q + kQK * s, trial, kQK);
        }
      }
    }
  }
  store_half(out, d);
  store_half(out + 2, dmin);
  // 12 bytes: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and
  // 4..7 (minimums); sub-blocks 4..7 in bytes 8..11 (low nibble scale, high
  // nibble minimum) with their top 2 bits in the top bits of bytes 0..7.
  uint8_t* scales = out + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = uint8_t(sc[j] | (sc[j + 4] >> 4) << 6);
    scales[j + 4] = uint8_t(mn[j] | (mn[j + 4] >> 4) << 6);
    scales[j + 8] = uint8_t((sc[j + 4] & 0x0f) | (mn[j + 4] & 0x0f) << 4);
  }
  // Per 64 values: 32 bytes, value l in the low nibble and value 32 + l in
  // the high nibble of byte l; Q5_K's 5th bits: bit 2c (2c + 1) of qh[l].
  const bool five = nmax == 31;
  uint8_t* qh = out + 16;
  uint8_t* qs = out + (five ? 48 : 16);
  if (five) std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      qs[32 * c + l] = uint8_t((lo & 0x0f) | (hi & 0x0f) << 4);
      if (five) qh[l] = uint8_t(qh[l] | (lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
    }
  }
}

// ---------------------------------------------------------------------------
// Q6_K super-block: 16 sub-blocks of 16, int8 scales, 6-bit codes (bias 32).

void quantize_q6_k_block(const Block& b, uint8_t* out) {
  float sub[16], smax = 0.0f;
  for (int s = 0; s < 16; ++s) {
    sub[s] = fit_symmetric(b.x + kSub6 * s, b.w + kSub6 * s, kSub6);
    if (std::fabs(sub[s]) > std::fabs(smax)) smax = sub[s];
  }
  // The largest scale on -128, the longer side of int8.
  const float d = round_half(smax / -128.0f);
  int8_t sc[16], q[kQKK], trial[kSub6];
  for (int s = 0; s < 16; ++s) {
    const float* x = b.x + kSub6 * s;
    const float* w = b.w + kSub6 * s;
    int k0, k1;
    neighbours(sub[s], d, -128, 127, &k0, &k1);
    double best = INFINITY;
    for (int k = k0; k <= k1; ++k) {
      const double e = code_symmetric(x, w, kSub6, d * float(k), trial);
      if (e < best) {
        best = e, sc[s] = int8_t(k);
        std::memcpy(q + kSub6 * s, trial, kSub6);
      }
    }
  }
  // Per 128 values: ql[64] holds values l and 64 + l (low, high nibble) in
  // byte l, values 32 + l and 96 + l in byte 32 + l; qh[32] holds their top 2
  // bits at bit 0, 2, 4, 6 (values l, 32 + l, 64 + l, 96 + l).
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  for (int n = 0; n < 2; ++n) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t u1 = uint8_t(q[128 * n + l] + 32), u2 = uint8_t(q[128 * n + l + 32] + 32);
      const uint8_t u3 = uint8_t(q[128 * n + l + 64] + 32), u4 = uint8_t(q[128 * n + l + 96] + 32);
      ql[64 * n + l] = uint8_t((u1 & 0x0f) | (u3 & 0x0f) << 4);
      ql[64 * n + l + 32] = uint8_t((u2 & 0x0f) | (u4 & 0x0f) << 4);
      qh[32 * n + l] = uint8_t((u1 >> 4) | (u2 >> 4) << 2 | (u3 >> 4) << 4 | (u4 >> 4) << 6);
    }
  }
  std::memcpy(out + 192, sc, 16);
  store_half(out + 208, d);
}

}  // namespace

bool ggml_quantizer_exists(DType t) {
  return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

void quantize_ggml_row(DType t, const float* x, const float* importance, uint8_t* dst, int64_t cols) {
  LLM_CHECK(ggml_quantizer_exists(t), LLM_ERR_UNSUPPORTED, "quantize_row: there is no %s quantizer", dtype_name(t));
  const int64_t bv = ggml_block_values(t);
  const size_t bb = ggml_block_bytes(t);
  LLM_CHECK(cols >= 0 && cols % bv == 0, LLM_ERR_INVALID_ARGUMENT, "quantize_row: %lld values are not whole %s blocks",
            (long long)cols, dtype_name(t));
  Block b;
  for (int64_t i = 0; i < cols / bv; ++i) {
    const float* imp = importance ? importance + i * bv : nullptr;
    uint8_t* out = dst + size_t(i) * bb;
    load_block(x + i * bv, imp, int(bv), t == DType::Q6_K ? kSub6 : kQK, &b);
    switch (t) {
      case DType::Q5_0: quantize_q5_0_block(b.x, out); break;
      case DType::Q5_1: quantize_q5_1_block(b.x, out); break;
      case DType::Q4_K: quantize_qk_affine_block(b, 15, out); break;
      case DType::Q5_K: quantize_qk_affine_block(b, 31, out); break;
      default: quantize_q6_k_block(b, out); break;
    }
  }
}

void quantize_any_row(DType t, uint32_t group, const float* src, uint8_t* dst, int64_t cols, const float* importance) {
  if (!dtype_is_ggml_block(t)) {
    quantize_row_weighted(t, group, src, importance, dst, cols);  // quant.cpp
    return;
  }
  LLM_CHECK(dtype_row_bytes(t, cols, group) != 0 || cols == 0, LLM_ERR_INVALID_ARGUMENT,
            "quantize_row: %s with %lld cols, group %u", dtype_name(t), (long long)cols, group);
  LLM_CHECK(ggml_quantizer_exists(t), LLM_ERR_UNSUPPORTED,
            "quantize_row: %s blocks are read from GGUF files; there is no %s quantizer", dtype_name(t), dtype_name(t));
  quantize_ggml_row(t, src, importance, dst, cols);
}

}  // namespace llm
