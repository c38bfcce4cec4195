// SiLU-gate, silu(g) * u = g / (1 + e^-g) * u, with one exponential written
// out here, so the scalar loop, the AVX2 loop (backend/cpu/elementwise_avx2.cpp)
// and the CUDA kernels (backend/cuda/kernel_math.h) give the same bits: every
// step is an IEEE operation that each of them performs identically (fma,
// round to nearest even, exponent arithmetic, one division). libm's expf,
// which the engine used before, is neither vectorizable nor the same on a GPU.
//
// exp(x), x clamped to [kExpLo, kExpHi]: x = n ln2 + r with n = rint(x / ln2),
// |r| <= ln2 / 2 (ln2 split in two so that n ln2 is exact); e^r by its
// Taylor polynomial of degree 7 (truncation below 6e-9 relative, under one
// float ulp); then 2^n added to the exponent bits. Relative error about 2
// ulp against e^x rounded from double (tests/ops: Ops.SiluMul*).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LLM_SILU_HD __host__ __device__ inline
#else
#define LLM_SILU_HD inline
#endif

namespace llm::silu {

// Clamps that keep n in [-124, 127]: 2^n stays a normal float and needs no
// special case. e^-86 adds nothing to 1 and e^88 is 1.6e38, so silu and its
// products keep their values to the last bit of what follows.
constexpr float kExpLo = -86.0f;
constexpr float kExpHi = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;        // 15 significant bits: n * kLn2Hi is exact for |n| < 512
constexpr float kLn2Lo = 1.42860682030941723e-06f;  // ln 2 - kLn2Hi
// 1 / k!, k = 2..7
constexpr float kC2 = 0.5f;
constexpr float kC3 = 0.166666666666666667f;
constexpr float kC4 = 0.0416666666666666667f;
constexpr float kC5 = 0.00833333333333333333f;
constexpr float kC6 = 0.00138888888888888889f;
constexpr float kC7 = 0.000198412698412698413f;

LLM_SILU_HD float fma_(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

LLM_SILU_HD float rint_(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);  // the default rounding mode: to nearest, ties to even
#endif
}

LLM_SILU_HD float exp(float x) {
  // NaN stays NaN through both comparisons (as the vector min/max with x second).
  x = kExpHi < x ? kExpHi : x;
  x = kExpLo > x ? kExpLo : x;
  const float n = rint_(x * kLog2e);
  float r = fma_(n, -kLn2Hi, x);
  r = fma_(n, -kLn2Lo, r);
  float p = kC7;
  p = fma_(p, r, kC6);
  p = fma_(p, r, kC5);
  p = fma_(p, r, kC4);
  p = fma_(p, r, kC3);
  p = fma_(p, r, kC2);
  p = fma_(p, r, 1.0f);
  p = fma_(p, r, 1.0f);
  // Exponent arithmetic; a NaN n converts to INT32_MIN, as cvtps2dq does.
  const int32_t ni = n == n ? int32_t(n) : INT32_MIN;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__float_as_uint(p) + (uint32_t(ni) << 23));
#else
  uint32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += uint32_t(ni) << 23;
  std::memcpy(&p, &bits, 4);
  return p;
#endif
}

// silu(g) * u, in this order of operations.
LLM_SILU_HD float silu_mul(float g, float u) { return g * (1.0f / (1.0f + exp(-g))) * u; }

}  // namespace llm::silu
