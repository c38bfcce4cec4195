// RMSNorm, RoPE, SwiGLU, GELU and softmax against naive double-precision definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/half.h"
#include "random_vectors.h"

namespace {
using llm::testing::randn;
}  // namespace

TEST(Ops, RmsNormMatchesDefinition) {
  for (int64_t dim : {1, 8, 63, 64, 2048}) {
    const int64_t rows = 3;
    auto x = randn(size_t(rows * dim), 1), w = randn(size_t(dim), 2);
    std::vector<float> y(x.size());
    llm::cpu::rmsnorm(y.data(), x.data(), w.data(), rows, dim, 1e-5f);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
      const double inv = 1.0 / std::sqrt(ss / double(dim) + 1e-5);
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_NEAR(y[size_t(r * dim + i)], w[size_t(i)] * x[size_t(r * dim + i)] * inv, 1e-5) << dim;
    }
    // In place gives the same.
    llm::cpu::rmsnorm(x.data(), x.data(), w.data(), rows, dim, 1e-5f);
    EXPECT_EQ(x, y);
  }
}

TEST(Ops, RopeRotatesAdjacentPairsAsComplexNumbers) {
  const int32_t heads = 3, hd = 16;
  const float theta = 10000.f;
  const std::vector<int32_t> pos = {0, 1, 7, 511};
  auto x = randn(pos.size() * heads * hd, 3);
  auto y = x;
  llm::cpu::rope(y.data(), int64_t(pos.size()), heads, hd, pos.data(), theta);
  for (size_t r = 0; r < pos.size(); ++r)
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < hd / 2; ++j) {
        const size_t o = (r * heads + size_t(h)) * hd + size_t(2 * j);
        const double ang = pos[r] * std::pow(double(theta), -2.0 * j / hd);
        const std::complex<double> z(x[o], x[o + 1]), want = z * std::polar(1.0, ang);
        ASSERT_NEAR(y[o], want.real(), 2e-4);
        ASSERT_NEAR(y[o + 1], want.imag(), 2e-4);
      }
  // Rotating by +d then -d is the identity (what eviction relies on).
  auto z = x;
  llm::cpu::rope_head(z.data(), hd, 37, theta);
  llm::cpu::rope_head(z.data(), hd, -37, theta);
  for (int i = 0; i < hd; ++i) EXPECT_NEAR(z[size_t(i)], x[size_t(i)], 1e-5);
}

TEST(Ops, SwiGluAndSoftmax) {
  auto a = randn(100, 4, 3.f), b = randn(100, 5);
  auto out = a;
  llm::cpu::silu_mul(out.data(), b.data(), 100);
  for (size_t i = 0; i < 100; ++i) ASSERT_NEAR(out[i], a[i] / (1.0 + std::exp(-double(a[i]))) * b[i], 1e-5);
  auto s = randn(37, 6, 10.f);
  auto p = s;
  llm::cpu::softmax(p.data(), 37);
  double mx = s[0], sum = 0;
  for (float v : s) mx = std::max(mx, double(v));
  for (float v : s) sum += std::exp(v - mx);
  double total = 0;
  for (size_t i = 0; i < 37; ++i) {
    ASSERT_NEAR(p[i], std::exp(s[i] - mx) / sum, 1e-6);
    total += p[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
}

// GELU (tanh form) at every fp16 input, against the formula in double: the
// input is rounded to fp16 first and the result is rounded to fp16 (ggml's
// numerics), so the result is within one fp16 rounding of the exact value
// (plus f32 noise), the clamps hold, and the product with b is exact in f32.
TEST(Ops, GeluTanhMulAtEveryHalfInput) {
  std::vector<float> a, b;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = llm::f16_to_f32(uint16_t(h));
    if (std::isnan(v)) continue;
    a.push_back(v);
    b.push_back(h % 3 == 0 ? 1.0f : -0.5f);
  }
  std::vector<float> out = a;
  llm::cpu::gelu_tanh_mul(out.data(), b.data(), int64_t(out.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    const double v = a[i];
    double g;
    if (v >= 10.0)
      g = v;
    else if (v <= -10.0)
      g = 0.0;
    else
      g = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * v * (1.0 + 0.044715 * v * v)));
    const float got = out[i] / b[i];
    ASSERT_EQ(got, llm::f16_to_f32(llm::f32_to_f16(got))) << v;
    if (std::isinf(v)) {
      ASSERT_EQ(got, v > 0 ? float(v) : 0.0f);
      continue;
    }
    ASSERT_NEAR(got, g, std::fabs(g) * 1.5e-3 + 1e-6) << v;
  }
  // NaN stays NaN.
  float nan_in = std::nanf(""), one = 1.0f;
  llm::cpu::gelu_tanh_mul(&nan_in, &one, 1);
  EXPECT_TRUE(std::isnan(nan_in));
}
