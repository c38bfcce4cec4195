// AVX2/FMA element-wise ops; called only when use_avx2_kernels(). Each lane
// performs the operations of core/silu.h in the same order, so the results
// equal the scalar loop's bit for bit (and the CUDA kernels').
#include <immintrin.h>

#include "backend/cpu/ops.h"
#include "core/silu.h"

namespace llm::cpu::avx2 {

static inline __m256 exp8(__m256 x) {
  using namespace llm::silu;
  // min/max with x second: a NaN x passes through, as in the scalar code.
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), x);
  x = _mm256_max_ps(_mm256_set1_ps(kExpLo), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

void silu_mul(float* a, const float* b, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(a + i);
    const __m256 e = exp8(_mm256_xor_ps(g, sign));
    const __m256 q = _mm256_div_ps(one, _mm256_add_ps(one, e));
    _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(g, q), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) a[i] = llm::silu::silu_mul(a[i], b[i]);
}

}  // namespace llm::cpu::avx2
