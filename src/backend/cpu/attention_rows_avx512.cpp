// AVX-512 attention row kernels; called only when use_avx512_kernels(). Each
// computes exactly what its AVX2 namesake does (the same fma per element, in
// the same order), so the two families give the same attention bits.
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/attention_rows.h"

namespace llm::cpu::rows::avx512 {

namespace {

// Lanes of the 16-float vector at value `at` that lie inside a head of hd
// values (hd is a multiple of 8: all 16, the first 8, or none).
inline __mmask16 head_lanes(int32_t at, int32_t hd) {
  return at + 16 <= hd ? __mmask16(0xffff) : at < hd ? __mmask16(0x00ff) : __mmask16(0);
}

// acc_j[d0, d0 + 16 T) += sum_u w_j[u] * v_u[d0, ...) for the H heads at
// w[j * w_stride] / acc + j * hd, in order of u; V loads are shared by the heads.
template <int H, int T>
inline void pv_chunk(const float* w, int64_t w_stride, int32_t hd, const float* v, int32_t nr, float* acc,
                     int32_t d0) {
  __mmask16 m[T];
  __m512 a[H][T];
  for (int t = 0; t < T; ++t) {
    m[t] = head_lanes(d0 + 16 * t, hd);
    for (int j = 0; j < H; ++j) a[j][t] = _mm512_maskz_loadu_ps(m[t], acc + int64_t(j) * hd + d0 + 16 * t);
  }
  for (int32_t u = 0; u < nr; ++u) {
    __m512 wu[H];
    for (int j = 0; j < H; ++j) wu[j] = _mm512_set1_ps(w[int64_t(j) * w_stride + u]);
    const float* vu = v + int64_t(u) * hd + d0;
    for (int t = 0; t < T; ++t) {
      const __m512 vv = _mm512_maskz_loadu_ps(m[t], vu + 16 * t);
      for (int j = 0; j < H; ++j) a[j][t] = _mm512_fmadd_ps(wu[j], vv, a[j][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < H; ++j) _mm512_mask_storeu_ps(acc + int64_t(j) * hd + d0 + 16 * t, m[t], a[j][t]);
}

}  // namespace

void pv8(const float* w, int64_t w_stride, int32_t n_q, int32_t hd, const float* v, int32_t nr, float* acc) {
  int32_t j = 0;
  for (; j + 2 <= n_q; j += 2)
    for (int32_t d0 = 0; d0 < hd; d0 += 64)
      pv_chunk<2, 4>(w + int64_t(j) * w_stride, w_stride, hd, v, nr, acc + int64_t(j) * hd, d0);
  for (; j < n_q; ++j)
    for (int32_t d0 = 0; d0 < hd; d0 += 128)
      pv_chunk<1, 8>(w + int64_t(j) * w_stride, w_stride, hd, v, nr, acc + int64_t(j) * hd, d0);
}

}  // namespace llm::cpu::rows::avx512
