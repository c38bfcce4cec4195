// Row primitives of attention over cached K/V rows, in three builds: portable
// (attention_rows.cpp), AVX2/FMA/F16C (attention_rows_avx2.cpp) and AVX-512
// (attention_rows_avx512.cpp, the kernels it speeds up).
#pragma once

#include <cstdint>

namespace llm::cpu::rows {

// dot(q[n], k[n]) with k stored as f32 or f16.
float dot_f32(const float* q, const float* k, int32_t n);
float dot_f16(const float* q, const uint16_t* k, int32_t n);
// acc[n] += a * v[n]
void axpy_f32(float a, const float* v, float* acc, int32_t n);
void axpy_f16(float a, const uint16_t* v, float* acc, int32_t n);

namespace avx2 {
float dot_f32(const float* q, const float* k, int32_t n);
float dot_f16(const float* q, const uint16_t* k, int32_t n);
void axpy_f32(float a, const float* v, float* acc, int32_t n);
void axpy_f16(float a, const uint16_t* v, float* acc, int32_t n);

// Blocked attention over up to 8 cached rows at a time, rows already in f32
// (k and v: [8][hd], rows nr.. ignored). hd must be a multiple of 8.
constexpr int32_t kBlockRows = 8;
void f16_row_to_f32(const uint16_t* src, float* dst, int32_t n);
// att[j * att_stride + u] = scale * dot(q_j, k_u) for the n_q query heads
// (q: [n_q][hd]) and rows u < nr.
void scores8(const float* q, int32_t n_q, int32_t hd, const float* k, int32_t nr, float scale, float* att,
             int64_t att_stride);
// In-place softmax; e^x by a vector polynomial (relative error ~2e-7).
void softmax(float* x, int64_t n);
// acc_j[hd] += sum_u w[j * w_stride + u] * v_u, in order of u, for each head.
void pv8(const float* w, int64_t w_stride, int32_t n_q, int32_t hd, const float* v, int32_t nr, float* acc);
}  // namespace avx2

// The AVX-512 family's (attention_rows_avx512.cpp, built where the compiler
// has AVX-512): the same results as the AVX2 kernel of the same name, bit
// for bit.
namespace avx512 {
void pv8(const float* w, int64_t w_stride, int32_t n_q, int32_t hd, const float* v, int32_t nr, float* acc);
}  // namespace avx512

}  // namespace llm::cpu::rows
