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

constexpr int kQK = 32;     // values per block of Q5_0 / Q5_1 / IQ4_NL; per sub-block of Q4_K, Q5_K, IQ4_XS
constexpr int kQKK = 256;   // values per super-block of the K types and IQ4_XS
constexpr int kSub16 = 16;  // values per sub-block of Q2_K, Q3_K, Q6_K

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

// Alternates rounding and solving from the grid's best step (error
// best_err) while the error falls: solve(step, &next) codes the values for
// step and returns their error with the least-squares step next.
template <class Solve>
double refine_step(const Solve& solve, double best, double best_err) {
  for (int it = 0; it < kRefine && best != 0.0; ++it) {
    double s = 0.0;
    const double e = solve(float(best), &s);
    if (!(e < best_err)) break;
    best_err = e, best = s;
  }
  return best;
}

// x ~ s * level(x / s) for a step s: the levels of the values, then the
// weighted least-squares step for those levels (*out); returns the error
// minus sum w x^2 (INFINITY when every level is 0).
template <class Level>
double ls_step(const float* x, const float* w, int n, float s, const Level& level, double* out) {
  const float is = 1.0f / s;
  double qq = 0.0, qx = 0.0;
  for (int j = 0; j < n; ++j) {
    const double q = level(x[j] * is);
    qq += w[j] * q * q, qx += w[j] * q * x[j];
  }
  if (!(qq > 0.0)) return double(INFINITY);
  *out = qx / qq;
  return -qx * qx / qq;
}

// x ~ s * q with q in qmin..qmax, qmin = -qmax - 1 (s may be negative: the
// value of largest magnitude can take the extra level qmin whatever its sign).
float fit_symmetric(const float* x, const float* w, int n, int qmin, int qmax) {
  const float vmax = signed_absmax(x, n);
  if (vmax == 0.0f) return 0.0f;
  const auto level = [=](float v) { return clamp_code(std::nearbyint(v), qmin, qmax); };
  auto solve = [&](float s, double* out) { return ls_step(x, w, n, s, level, out); };
  double best_err = INFINITY, best = double(vmax) / qmin;
  for (float delta : kDeltas) {
    double s = 0.0;
    // The extreme value on code qmin (the longer side), or on qmax.
    for (float levels : {float(qmin) - delta, float(qmax) + delta}) {
      const double e = solve(vmax / levels, &s);
      if (e < best_err) best_err = e, best = s;
    }
  }
  return float(refine_step(solve, best, best_err));
}

// IQ4_NL / IQ4_XS: value = step * kIq4Table[index], the table fixed by the
// format (ggml's kvalues_iq4nl), denser near 0 than a uniform grid.
constexpr int8_t kIq4Table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// The table entry nearest to v (in table units): a search on the midpoints.
inline int iq4_nearest(float v) {
  int lo = 0, hi = 15;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (v > 0.5f * float(kIq4Table[mid] + kIq4Table[mid + 1])) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return kIq4Table[lo];
}

// Where the value of largest magnitude is put, as a fraction of the table's
// end (-127, or 113): inside the table (< 1) to spend the dense middle on
// the bulk, or beyond it (> 1) to clip the extreme.
constexpr int kIq4Reaches = 9;
constexpr float kIq4Reach0 = 0.85f, kIq4ReachStep = 0.05f;

// x ~ s * table[i] (s signed: the table's longer side, -127, holds the value
// of largest magnitude whichever its sign, or its shorter side 113 does).
float fit_iq4(const float* x, const float* w, int n) {
  const float vmax = signed_absmax(x, n);
  if (vmax == 0.0f) return 0.0f;
  auto solve = [&](float s, double* out) { return ls_step(x, w, n, s, iq4_nearest, out); };
  double best_err = INFINITY, best = double(vmax) / -127.0;
  for (int r = 0; r < kIq4Reaches; ++r) {
    const float reach = kIq4Reach0 + kIq4ReachStep * float(r);
    for (float end : {-127.0f, 113.0f}) {
      double s = 0.0;
      const double e = solve(vmax / (end * reach), &s);
      if (e < best_err) best_err = e, best = s;
    }
  }
  return float(refine_step(solve, best, best_err));
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

// Levels q[j] = level(x[j] / ds) (value = ds * q; level(0) when ds is 0).
template <class Level>
double code_levels(const float* x, const float* w, int n, float ds, const Level& level, int8_t* q) {
  const float is = ds != 0.0f ? 1.0f / ds : 0.0f;
  double e = 0.0;
  for (int j = 0; j < n; ++j) {
    q[j] = int8_t(level(x[j] * is));
    const double r = double(ds * float(q[j])) - x[j];
    e += w[j] * r * r;
  }
  return e;
}

// Symmetric codes: q[j] in qmin..qmax is the level itself.
double code_symmetric(const float* x, const float* w, int n, int qmin, int qmax, float ds, int8_t* q) {
  return code_levels(x, w, n, ds, [=](float v) { return clamp_code(std::nearbyint(v), qmin, qmax); }, q);
}

// IQ4 codes as their table values (the index is found when packing).
double code_iq4(const float* x, const float* w, int n, float ds, int8_t* t) {
  return code_levels(x, w, n, ds, iq4_nearest, t);
}

// The integer multiple k of the unit u in [lo, hi] nearest to v, and its two
// neighbours, as a range to try (only k = 0 when u is 0).
void neighbours(float v, float u, int lo, int hi, int* first, int* last) {
  const int k = u != 0.0f ? clamp_code(std::nearbyint(v / u), lo, hi) : 0;
  *first = u != 0.0f ? std::max(lo, k - 1) : 0;
  *last = u != 0.0f ? std::min(hi, k + 1) : 0;
}

// ---------------------------------------------------------------------------
// Super-blocks: every sub-block's fitted step (and offset) becomes an integer
// multiple of the super-block's fp16 unit(s), chosen among the 3 (3 x 3)
// nearest multiples by the error of the sub-block re-coded with it.

// Affine (Q2_K, Q4_K, Q5_K): value = (d * sc) * q - dmin * mn, sc and mn in
// 0..kmax, q in 0..nmax; nsub sub-blocks of len values. Returns the error.
double pick_affine(const Block& b, const Affine* f, int nsub, int len, int nmax, int kmax, float d, float dmin,
                   uint8_t* sc, uint8_t* mn, uint8_t* q) {
  uint8_t trial[kQK];
  double total = 0.0;
  for (int s = 0; s < nsub; ++s) {
    const float* x = b.x + len * s;
    const float* w = b.w + len * s;
    int s0, s1, m0, m1;
    neighbours(f[s].s, d, 0, kmax, &s0, &s1);
    neighbours(f[s].m, dmin, 0, kmax, &m0, &m1);
    double best = INFINITY;
    for (int a = s0; a <= s1; ++a) {
      for (int c = m0; c <= m1; ++c) {
        const double e = code_affine(x, w, len, nmax, d * float(a), dmin * float(c), trial);
        if (e < best) {
          best = e, sc[s] = uint8_t(a), mn[s] = uint8_t(c);
          std::memcpy(q + len * s, trial, size_t(len));
        }
      }
    }
    total += best;
  }
  return total;
}

// Symmetric (Q3_K, IQ4_XS): value = (d * k) * level, k in kmin..-kmin-1;
// code(x, w, n, step, levels) writes a sub-block's levels for a step and
// returns their weighted squared error. Returns the error.
template <class Code>
double pick_symmetric(const Block& b, const float* fit, int nsub, int len, int kmin, float d, const Code& code,
                      int8_t* k, int8_t* lv) {
  int8_t trial[kQK];
  double total = 0.0;
  for (int s = 0; s < nsub; ++s) {
    const float* x = b.x + len * s;
    const float* w = b.w + len * s;
    int k0, k1;
    neighbours(fit[s], d, kmin, -kmin - 1, &k0, &k1);
    double best = INFINITY;
    for (int c = k0; c <= k1; ++c) {
      const double e = code(x, w, len, d * float(c), trial);
      if (e < best) {
        best = e, k[s] = int8_t(c);
        std::memcpy(lv + len * s, trial, size_t(len));
      }
    }
    total += best;
  }
  return total;
}

// The unit d of a symmetric super-block: first the largest fitted step on
// kmin (the longer side), then least-squares refits of d for the chosen
// scales and levels, each re-rounded and re-picked, kept while the error falls.
// Six-bit sub-block scales round coarsely; a refit lets d trade the
// largest sub-block's precision for the others'.
template <class Code>
float fit_unit_symmetric(const Block& b, const float* fit, int nsub, int len, int kmin, const Code& code, int8_t* k,
                         int8_t* lv) {
  float smax = 0.0f;
  for (int s = 0; s < nsub; ++s)
    if (std::fabs(fit[s]) > std::fabs(smax)) smax = fit[s];
  float d = round_half(smax / float(kmin));
  double err = pick_symmetric(b, fit, nsub, len, kmin, d, code, k, lv);
  int8_t k2[kQKK / 16], lv2[kQKK];
  for (int it = 0; it < kRefine && d != 0.0f; ++it) {
    double ax = 0.0, aa = 0.0;  // x ~ d * a with a = k * level
    for (int j = 0; j < nsub * len; ++j) {
      const double a = double(k[j / len]) * lv[j];
      ax += b.w[j] * a * b.x[j], aa += b.w[j] * a * a;
    }
    if (!(aa > 0.0)) break;
    const float d2 = round_half(float(ax / aa));
    if (d2 == d || d2 == 0.0f) break;
    const double e = pick_symmetric(b, fit, nsub, len, kmin, d2, code, k2, lv2);
    if (!(e < err)) break;
    err = e, d = d2;
    std::memcpy(k, k2, size_t(nsub));
    std::memcpy(lv, lv2, size_t(nsub * len));
  }
  return d;
}

// Low bits of the 2-bit planes of Q2_K and Q3_K: value v of the super-block
// in bits 2 * ((v % 128) / 32) of byte 32 * (v / 128) + v % 32.
void pack_2bit_planes(const uint8_t* q, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int v = 0; v < kQKK; ++v) qs[32 * (v / 128) + v % 32] |= uint8_t((q[v] & 3) << (2 * ((v % 128) / 32)));
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
  uint8_t sc[8], mn[8], q[kQKK];
  pick_affine(b, f, 8, kQK, nmax, 63, d, dmin, sc, mn, q);
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
// Q2_K super-block: 16 sub-blocks of 16, 4-bit scales and minimums, 2-bit codes.

void quantize_q2_k_block(const Block& b, uint8_t* out) {
  Affine f[16];
  float smax = 0.0f, mmax = 0.0f;
  for (int s = 0; s < 16; ++s) {
    f[s] = fit_affine(b.x + kSub16 * s, b.w + kSub16 * s, kSub16, 3);
    smax = std::fmax(smax, f[s].s);
    mmax = std::fmax(mmax, f[s].m);
  }
  float d = round_half(smax / 15.0f), dmin = round_half(mmax / 15.0f);
  uint8_t sc[16], mn[16], q[kQKK], sc2[16], mn2[16], q2[kQKK];
  double err = pick_affine(b, f, 16, kSub16, 3, 15, d, dmin, sc, mn, q);
  // Four bits of scale round coarsely: refit (d, dmin) by least squares for
  // the chosen integers, x ~ d * (sc q) - dmin * mn, re-pick, keep while better.
  for (int it = 0; it < kRefine; ++it) {
    double aa = 0.0, ac = 0.0, cc = 0.0, ax = 0.0, cx = 0.0;
    for (int j = 0; j < kQKK; ++j) {
      const double a = double(sc[j / kSub16]) * q[j], c = mn[j / kSub16], w = b.w[j];
      aa += w * a * a, ac += w * a * c, cc += w * c * c, ax += w * a * b.x[j], cx += w * c * b.x[j];
    }
    double nd = 0.0, nm = double(dmin);
    const double det = aa * cc - ac * ac;
    if (cc > 0.0 && det > 1e-9 * aa * cc) {
      nd = (ax * cc - ac * cx) / det;
      nm = (ac * ax - aa * cx) / det;
    } else if (aa > 0.0) {  // no minimums in use: d alone
      nd = (ax + nm * ac) / aa;
    }
    if (!(nd > 0.0) || !(nm >= 0.0)) break;
    const float d2 = round_half(float(nd)), dmin2 = round_half(float(nm));
    if (d2 == d && dmin2 == dmin) break;
    const double e = pick_affine(b, f, 16, kSub16, 3, 15, d2, dmin2, sc2, mn2, q2);
    if (!(e < err)) break;
    err = e, d = d2, dmin = dmin2;
    std::memcpy(sc, sc2, 16), std::memcpy(mn, mn2, 16), std::memcpy(q, q2, kQKK);
  }
  // 84 bytes: scales[16] (scale | min << 4 per sub-block) | 2-bit planes | d | dmin.
  for (int s = 0; s < 16; ++s) out[s] = uint8_t(sc[s] | mn[s] << 4);
  pack_2bit_planes(q, out + 16);
  store_half(out + 80, d);
  store_half(out + 82, dmin);
}

// ---------------------------------------------------------------------------
// Q3_K super-block: 16 sub-blocks of 16, 6-bit signed scales, codes -4..3.

void quantize_q3_k_block(const Block& b, uint8_t* out) {
  float fit[16];
  for (int s = 0; s < 16; ++s) fit[s] = fit_symmetric(b.x + kSub16 * s, b.w + kSub16 * s, kSub16, -4, 3);
  auto code = [](const float* x, const float* w, int n, float ds, int8_t* q) {
    return code_symmetric(x, w, n, -4, 3, ds, q);
  };
  int8_t k[16], lv[kQKK];
  const float d = fit_unit_symmetric(b, fit, 16, kSub16, -32, code, k, lv);
  // 110 bytes: hmask[32] | 2-bit planes | scales[12] | d. Code u = level + 4:
  // its low 2 bits in the planes, its bit 2 in bit v / 32 of hmask[v % 32].
  uint8_t u[kQKK];
  for (int v = 0; v < kQKK; ++v) u[v] = uint8_t(lv[v] + 4);
  uint8_t* hmask = out;
  std::memset(hmask, 0, 32);
  for (int v = 0; v < kQKK; ++v) hmask[v % 32] |= uint8_t((u[v] >> 2) << (v / 32));
  pack_2bit_planes(u, out + 32);
  // Scale k + 32 of sub-block s: low 4 bits in nibble s / 8 of byte s % 8,
  // high 2 bits in bits 2 * (s / 4) of byte 8 + s % 4.
  uint8_t* scales = out + 96;
  std::memset(scales, 0, 12);
  for (int s = 0; s < 16; ++s) {
    const int e = k[s] + 32;
    scales[s % 8] |= uint8_t((e & 0x0f) << (4 * (s / 8)));
    scales[8 + s % 4] |= uint8_t((e >> 4) << (2 * (s / 4)));
  }
  store_half(out + 108, d);
}

// ---------------------------------------------------------------------------
// IQ4_NL (one step per 32) and IQ4_XS (6-bit signed scales per 32 of 256).

uint8_t iq4_index(int8_t level) {
  uint8_t i = 0;
  while (i < 15 && kIq4Table[i] != level) ++i;
  return i;
}

// 16 bytes per 32 values: value j in the low nibble of byte j, value 16 + j
// in its high nibble.
void pack_iq4_nibbles(const int8_t* lv, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(iq4_index(lv[j]) | iq4_index(lv[j + 16]) << 4);
}

void quantize_iq4_nl_block(const Block& b, uint8_t* out) {
  const float d = round_half(fit_iq4(b.x, b.w, kQK));
  int8_t lv[kQK];
  code_iq4(b.x, b.w, kQK, d, lv);
  store_half(out, d);
  pack_iq4_nibbles(lv, out + 2);
}

void quantize_iq4_xs_block(const Block& b, uint8_t* out) {
  float fit[8];
  for (int s = 0; s < 8; ++s) fit[s] = fit_iq4(b.x + kQK * s, b.w + kQK * s, kQK);
  int8_t k[8], lv[kQKK];
  const float d = fit_unit_symmetric(b, fit, 8, kQK, -32, code_iq4, k, lv);
  // 136 bytes: d | scales_h (2 high bits of k + 32 per sub-block) |
  // scales_l[4] (low nibbles, two sub-blocks a byte) | 16 bytes per sub-block.
  store_half(out, d);
  uint16_t sh = 0;
  uint8_t* sl = out + 4;
  std::memset(sl, 0, 4);
  for (int s = 0; s < 8; ++s) {
    const int e = k[s] + 32;
    sh = uint16_t(sh | (e >> 4) << (2 * s));
    sl[s / 2] |= uint8_t((e & 0x0f) << (4 * (s % 2)));
    pack_iq4_nibbles(lv + kQK * s, out + 8 + 16 * s);
  }
  std::memcpy(out + 2, &sh, 2);
}

// ---------------------------------------------------------------------------
// Q6_K super-block: 16 sub-blocks of 16, int8 scales, 6-bit codes (bias 32).

void quantize_q6_k_block(const Block& b, uint8_t* out) {
  float sub[16], smax = 0.0f;
  for (int s = 0; s < 16; ++s) {
    sub[s] = fit_symmetric(b.x + kSub16 * s, b.w + kSub16 * s, kSub16, -32, 31);
    if (std::fabs(sub[s]) > std::fabs(smax)) smax = sub[s];
  }
  // The largest scale on -128, the longer side of int8.
  const float d = round_half(smax / -128.0f);
  int8_t sc[16], q[kQKK];
  auto code = [](const float* x, const float* w, int n, float ds, int8_t* lv) {
    return code_symmetric(x, w, n, -32, 31, ds, lv);
  };
  pick_symmetric(b, sub, 16, kSub16, -128, d, code, sc, q);
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

bool ggml_quantizer_exists(DType t) { return dtype_is_ggml_block(t); }

void quantize_ggml_row(DType t, const float* x, const float* importance, uint8_t* dst, int64_t cols) {
  LLM_CHECK(ggml_quantizer_exists(t), LLM_ERR_UNSUPPORTED, "quantize_row: there is no %s quantizer", dtype_name(t));
  const int64_t bv = ggml_block_values(t);
  const size_t bb = ggml_block_bytes(t);
  LLM_CHECK(cols >= 0 && cols % bv == 0, LLM_ERR_INVALID_ARGUMENT, "quantize_row: %lld values are not whole %s blocks",
            (long long)cols, dtype_name(t));
  Block b;
  const int sub = t == DType::Q2_K || t == DType::Q3_K || t == DType::Q6_K ? kSub16 : kQK;
  for (int64_t i = 0; i < cols / bv; ++i) {
    const float* imp = importance ? importance + i * bv : nullptr;
    uint8_t* out = dst + size_t(i) * bb;
    load_block(x + i * bv, imp, int(bv), sub, &b);
    switch (t) {
      case DType::Q5_0: quantize_q5_0_block(b.x, out); break;
      case DType::Q5_1: quantize_q5_1_block(b.x, out); break;
      case DType::Q2_K: quantize_q2_k_block(b, out); break;
      case DType::Q3_K: quantize_q3_k_block(b, out); break;
      case DType::Q4_K: quantize_qk_affine_block(b, 15, out); break;
      case DType::Q5_K: quantize_qk_affine_block(b, 31, out); break;
      case DType::IQ4_NL: quantize_iq4_nl_block(b, out); break;
      case DType::IQ4_XS: quantize_iq4_xs_block(b, out); break;
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
  quantize_ggml_row(t, src, importance, dst, cols);
}

}  // namespace llm
