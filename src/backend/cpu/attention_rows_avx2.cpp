// AVX2/FMA/F16C attention row kernels; called only when use_avx2_kernels().
#include <immintrin.h>

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
