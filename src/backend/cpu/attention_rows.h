// Row primitives of attention over cached K/V rows, in two builds: portable
// (attention_rows.cpp) and AVX2/FMA/F16C (attention_rows_avx2.cpp).
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
}  // namespace avx2

}  // namespace llm::cpu::rows
