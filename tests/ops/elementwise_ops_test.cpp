// RMSNorm, RoPE, SwiGLU, GELU and softmax against naive double-precision definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <complex>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
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

// SiLU's exponential (core/silu.h) against e^x in double: within 4 ulp of
// silu(g) over the whole range that matters (libm's expf gave 2.4 ulp, this
// one 2.3 on a dense sweep), and bounded below the clamp.
TEST(Ops, SiluMulWithinFourUlpOfDouble) {
  std::vector<float> g, u;
  for (float v = -100.f; v <= 100.f; v += 0.0137f) g.push_back(v);
  auto r = randn(4096, 11, 20.f);
  g.insert(g.end(), r.begin(), r.end());
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 86.f, -86.f, 88.f, -88.f, 87.9f, -87.9f}) g.push_back(v);
  u.assign(g.size(), 1.0f);
  auto a = g;
  llm::cpu::silu_mul(a.data(), u.data(), int64_t(a.size()));
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = double(g[i]) / (1.0 + std::exp(-double(g[i])));
    const float fw = float(std::fabs(want));
    const double ulp = std::max(double(std::nextafter(fw, INFINITY)) - double(fw), 1e-45);
    const double err = std::fabs(double(a[i]) - want) / ulp;
    // Below -86 the exponential is clamped: silu is then g e^86-ish tiny, not g e^g.
    if (g[i] < -86.f) {
      ASSERT_LE(std::fabs(a[i]), 1e-35f) << g[i];
      continue;
    }
    worst = std::max(worst, err);
    ASSERT_LE(err, 4.0) << "g = " << g[i] << ": " << a[i] << " vs " << want;
  }
  std::printf("silu: worst %.2f ulp over %zu inputs\n", worst, g.size());
}

// The AVX2 loop and the scalar loop give the same bits, at every length (the
// vector body and the scalar tail meet at n % 8), for odd inputs too.
TEST(Ops, SiluMulScalarAndAvx2AgreeBitForBit) {
  if (!llm::cpu::cpu_features().avx2 || !llm::cpu::cpu_features().fma) GTEST_SKIP() << "no AVX2/FMA";
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> g = randn(67, 12, 30.f), u = randn(67, 13, 2.f);
  const float odd[] = {0.f, -0.f, inf, -inf, nan, 1e-40f, -1e-40f, 3e38f, -3e38f, 86.f, -88.f, 88.5f, -1e5f};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; ++i) g[i * 5] = odd[i];
  const llm::cpu::Isa saved = llm::cpu::max_isa();
  for (int64_t n = 0; n <= int64_t(g.size()); ++n) {
    std::vector<float> vec(g.begin(), g.begin() + n), sca = vec;
    llm::cpu::set_max_isa(llm::cpu::Isa::Avx2);
    llm::cpu::silu_mul(vec.data(), u.data(), n);
    llm::cpu::set_max_isa(llm::cpu::Isa::Scalar);
    llm::cpu::silu_mul(sca.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(sca[size_t(i)])) {
        ASSERT_TRUE(std::isnan(vec[size_t(i)])) << n << " " << i;
        continue;
      }
      uint32_t x, y;
      std::memcpy(&x, &vec[size_t(i)], 4);
      std::memcpy(&y, &sca[size_t(i)], 4);
      ASSERT_EQ(x, y) << "n " << n << " i " << i << " g " << g[size_t(i)];
    }
  }
  llm::cpu::set_max_isa(saved);
}
