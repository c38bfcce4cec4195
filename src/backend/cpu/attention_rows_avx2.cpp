// AVX2/FMA/F16C attention row kernels; called only when use_avx2_kernels().
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_rows.h"
#include "core/half.h"

namespace llm::cpu::rows::avx2 {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float dot_f32(const float* q, const float* k, int32_t n) {
  __m256 acc = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += q[i] * k[i];
  return s;
}

float dot_f16(const float* q, const uint16_t* k, int32_t n) {
  __m256 acc = _mm256_setzero_ps();
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 kv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, acc);
  }
  float s = hsum(acc);
  for (; i < n; ++i) s += q[i] * f16_to_f32(k[i]);
  return s;
}

void axpy_f32(float a, const float* v, float* acc, int32_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] += a * v[i];
}

void axpy_f16(float a, const uint16_t* v, float* acc, int32_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(av, vv, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += a * f16_to_f32(v[i]);
}

}  // namespace llm::cpu::rows::avx2

// ---------------------------------------------------------------------------
// Blocked attention rows (see attention_rows.h). Every function below fixes
// its floating-point order by position only, never by how many rows a call
// gets, so a query row's result is the same in decode and in prefill.

namespace llm::cpu::rows::avx2 {

namespace {

// e^x for x <= 0 (softmax inputs after subtracting the maximum): x = n ln2 + r
// with |r| <= ln2 / 2, e^r by a degree-7 polynomial (relative error about
// 2e-7), 2^n through the exponent bits. Inputs below -87 give e^-87, which
// next to the maximum's e^0 = 1 is far below float resolution.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, with ln2 split in two so n * hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}

}  // namespace

void f16_row_to_f32(const uint16_t* src, float* dst, int32_t n) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

namespace {

// [sum(a[0]), .., sum(a[3])]: lanes added pairwise inside each vector
// (hadd), then the 128-bit halves: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m128 transpose_sum4(const __m256 (&a)[4]) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Scores of rows u0 .. u0 + 3 for query heads j (and j + 1 when Two): the K
// loads are shared by the two heads. Each score sees the same operations as
// whatever the head count: fma over d in order, then transpose_sum4's order.
template <bool Two>
inline void scores4(const float* qj, int32_t hd, const float* k, int u0, float scale, __m128& s0, __m128& s1) {
  __m256 a0[4], a1[4];
  for (int u = 0; u < 4; ++u) a0[u] = a1[u] = _mm256_setzero_ps();
  for (int32_t d = 0; d < hd; d += 8) {
    const __m256 q0 = _mm256_loadu_ps(qj + d);
    const __m256 q1 = Two ? _mm256_loadu_ps(qj + hd + d) : q0;
    for (int u = 0; u < 4; ++u) {
      const __m256 kv = _mm256_loadu_ps(k + int64_t(u0 + u) * hd + d);
      a0[u] = _mm256_fmadd_ps(q0, kv, a0[u]);
      if (Two) a1[u] = _mm256_fmadd_ps(q1, kv, a1[u]);
    }
  }
  s0 = _mm_mul_ps(transpose_sum4(a0), _mm_set1_ps(scale));
  if (Two) s1 = _mm_mul_ps(transpose_sum4(a1), _mm_set1_ps(scale));
}

inline void store_scores(float* out, __m128 lo, __m128 hi, int32_t nr) {
  if (nr == 8) {
    _mm_storeu_ps(out, lo);
    _mm_storeu_ps(out + 4, hi);
    return;
  }
  alignas(32) float tmp[8];
  _mm_store_ps(tmp, lo);
  _mm_store_ps(tmp + 4, hi);
  for (int32_t u = 0; u < nr; ++u) out[u] = tmp[u];
}

}  // namespace

void scores8(const float* q, int32_t n_q, int32_t hd, const float* k, int32_t nr, float scale, float* att,
             int64_t att_stride) {
  int32_t j = 0;
  for (; j + 2 <= n_q; j += 2) {
    const float* qj = q + int64_t(j) * hd;
    __m128 lo0, lo1, hi0, hi1;
    scores4<true>(qj, hd, k, 0, scale, lo0, lo1);
    scores4<true>(qj, hd, k, 4, scale, hi0, hi1);
    store_scores(att + int64_t(j) * att_stride, lo0, hi0, nr);
    store_scores(att + int64_t(j + 1) * att_stride, lo1, hi1, nr);
  }
  if (j < n_q) {
    const float* qj = q + int64_t(j) * hd;
    __m128 lo, hi, unused;
    scores4<false>(qj, hd, k, 0, scale, lo, unused);
    scores4<false>(qj, hd, k, 4, scale, hi, unused);
    store_scores(att + int64_t(j) * att_stride, lo, hi, nr);
  }
}

void softmax(float* x, int64_t n) {
  int64_t i = 0;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float mx = _mm_cvtss_f32(m4);
  for (; i < n; ++i) mx = std::fmax(mx, x[i]);
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 sv = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx));
    _mm256_storeu_ps(x + i, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum(sv);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  for (; i < n; ++i) x[i] *= _mm256_cvtss_f32(inv);
}

void pv8(const float* w, int64_t w_stride, int32_t n_q, int32_t hd, const float* v, int32_t nr, float* acc) {
  // Two query heads at a time share each load of V; every element of acc
  // still takes its fmas in order of u.
  int32_t j = 0;
  for (; j + 2 <= n_q; j += 2) {
    const float* w0 = w + int64_t(j) * w_stride;
    const float* w1 = w0 + w_stride;
    float* a0p = acc + int64_t(j) * hd;
    float* a1p = a0p + hd;
    for (int32_t d0 = 0; d0 < hd; d0 += 32) {
      const int32_t nv = std::min<int32_t>(4, (hd - d0) / 8);
      __m256 a0[4], a1[4];
      for (int32_t t = 0; t < 4; ++t) {
        a0[t] = t < nv ? _mm256_loadu_ps(a0p + d0 + 8 * t) : _mm256_setzero_ps();
        a1[t] = t < nv ? _mm256_loadu_ps(a1p + d0 + 8 * t) : _mm256_setzero_ps();
      }
      for (int32_t u = 0; u < nr; ++u) {
        const __m256 wu0 = _mm256_set1_ps(w0[u]), wu1 = _mm256_set1_ps(w1[u]);
        const float* vu = v + int64_t(u) * hd + d0;
        for (int32_t t = 0; t < 4; ++t)
          if (t < nv) {
            const __m256 vv = _mm256_loadu_ps(vu + 8 * t);
            a0[t] = _mm256_fmadd_ps(wu0, vv, a0[t]);
            a1[t] = _mm256_fmadd_ps(wu1, vv, a1[t]);
          }
      }
      for (int32_t t = 0; t < nv; ++t) {
        _mm256_storeu_ps(a0p + d0 + 8 * t, a0[t]);
        _mm256_storeu_ps(a1p + d0 + 8 * t, a1[t]);
      }
    }
  }
  for (; j < n_q; ++j) {
    const float* wj = w + int64_t(j) * w_stride;
    float* aj = acc + int64_t(j) * hd;
    for (int32_t d0 = 0; d0 < hd; d0 += 64) {
      const int32_t nv = std::min<int32_t>(8, (hd - d0) / 8);
      __m256 a[8];
      for (int32_t t = 0; t < 8; ++t) a[t] = t < nv ? _mm256_loadu_ps(aj + d0 + 8 * t) : _mm256_setzero_ps();
      for (int32_t u = 0; u < nr; ++u) {
        const __m256 wu = _mm256_set1_ps(wj[u]);
        const float* vu = v + int64_t(u) * hd + d0;
        for (int32_t t = 0; t < 8; ++t)
          if (t < nv) a[t] = _mm256_fmadd_ps(wu, _mm256_loadu_ps(vu + 8 * t), a[t]);
      }
      for (int32_t t = 0; t < nv; ++t) _mm256_storeu_ps(aj + d0 + 8 * t, a[t]);
    }
  }
}

}  // namespace llm::cpu::rows::avx2
