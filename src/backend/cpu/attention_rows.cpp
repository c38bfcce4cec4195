#include "backend/cpu/attention_rows.h"

#include "core/half.h"

namespace llm::cpu::rows {

float dot_f32(const float* q, const float* k, int32_t n) {
  float s = 0.f;
  for (int32_t i = 0; i < n; ++i) s += q[i] * k[i];
  return s;
}

float dot_f16(const float* q, const uint16_t* k, int32_t n) {
  float s = 0.f;
  for (int32_t i = 0; i < n; ++i) s += q[i] * f16_to_f32(k[i]);
  return s;
}

void axpy_f32(float a, const float* v, float* acc, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] += a * v[i];
}

void axpy_f16(float a, const uint16_t* v, float* acc, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] += a * f16_to_f32(v[i]);
}

}  // namespace llm::cpu::rows
