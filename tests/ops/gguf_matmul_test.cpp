// Matmul of the GGUF block types run as stored (Q5_0, Q5_1, IQ4_NL, Q2_K ..
// Q6_K, IQ4_XS), for every kernel family this CPU has:
//   - the activation quantizers give ggml's q8_0 (with an f32 d) / q8_1 / q8_K bytes (against
//     a transcription of ggml's formulas here), and the AVX-512 family's
//     Q8_K with sub-scales follows its definition (matmul_ggml.h);
//   - the unpackers give the plain ones' bytes, and the plain ones give the
//     values of ggml's own decoders;
//   - Fast mode equals the math of the quantized activations up to f32
//     rounding (so the integer sums are ggml's), and differs from
//     dequantize-then-f32 (Reference mode) by no more than the activation
//     quantization allows: sum |w| * |x - x_quantized|;
//   - non-finite scales make NaN/Inf outputs in their rows only, never a
//     crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/matmul_ggml.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/gguf_blocks.h"
#include "quant/ggml_quants.h"
#include "quant/quant.h"

namespace {

using llm::DType;
using llm::cpu::Isa;
using llm::cpu::MatmulMode;
using llm::cpu::WeightView;
namespace kern = llm::cpu::kern;
using llm::testing::random_gguf_rows;

const DType kTypes[] = {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::Q2_K, DType::Q3_K,
                        DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::IQ4_XS};

template <typename F>
void for_each_isa(F f) {
  struct Restore {
    Isa saved = llm::cpu::max_isa();
    ~Restore() { llm::cpu::set_max_isa(saved); }
  } restore;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa > llm::cpu::best_isa()) continue;
    llm::cpu::set_max_isa(isa);
    f(isa);
  }
}

WeightView view_of(DType t, int64_t rows, int64_t cols, const std::vector<uint8_t>& bytes) {
  const uint32_t g = uint32_t(llm::ggml_block_values(t));
  return WeightView{t, g, rows, cols, bytes.data(), llm::dtype_row_bytes(t, cols, g)};
}

std::vector<float> random_x(int64_t n, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

// --- ggml's activation formats, transcribed --------------------------------

float fp16_round(float v) { return llm::f16_to_f32(llm::f32_to_f16(v)); }

// quantize_row_q8_0 / _q8_1 of ggml-cpu's x86 AVX2 code: d = amax / 127 as
// fp16, q = round-half-even(x * (127 / amax)); q8_1's s = fp16(d * sum q)
// with the f32 d. libllm keeps Q8_0's d in f32 (f16_d false).
void ggml_q8_0(const float* x, int8_t* q, float* d, float* s, bool f16_d) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float dd = amax / 127.f;
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = int8_t(std::nearbyint(x[j] * id));
    sum += q[j];
  }
  *d = f16_d ? fp16_round(dd) : dd;
  *s = fp16_round(dd * float(sum));
}

// quantize_row_q8_K_ref: max = the value of largest magnitude (first wins),
// iscale = -127 / max, q = min(127, nearest(iscale * x)), d = 1 / iscale.
void ggml_q8_k(const float* x, int8_t* q, float* d, int16_t* bsums) {
  float amax = 0, max = 0;
  for (int j = 0; j < 256; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  if (amax == 0) {
    std::memset(q, 0, 256);
    std::memset(bsums, 0, 32);
    *d = 0;
    return;
  }
  const float iscale = -127.f / max;
  for (int j = 0; j < 256; ++j) q[j] = int8_t(std::min(127, int(std::nearbyint(iscale * x[j]))));
  for (int k = 0; k < 16; ++k) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += q[16 * k + j];
    bsums[k] = int16_t(s);
  }
  *d = 1 / iscale;
}

TEST(GgufActivations, QuantizersGiveGgmlBytes) {
  std::mt19937 rng(3);
  const int64_t n = 3, cols = 768;
  std::vector<float> x = random_x(n, cols, rng);
  // Hard cases: an all-zero block, exact .5 ties (amax 127 makes the scale
  // 1), equal magnitudes of both signs (the first one sets the sign), tiny
  // and huge values.
  for (int j = 0; j < 32; ++j) x[size_t(32 + j)] = 0.f;
  for (int j = 0; j < 32; ++j) x[size_t(64 + j)] = j == 0 ? 127.f : float(j % 7) - 2.5f;
  x[256 + 3] = 50.f;
  x[256 + 200] = -50.f;
  for (int j = 0; j < 256; ++j) x[size_t(512 + j)] = j == 9 ? -127.f : (j % 11) * 0.5f - 2.5f;
  x[size_t(cols + 5)] = 1e-30f;
  x[size_t(2 * cols + 700)] = 3e30f;
  for (kern::GgmlAct a : {kern::GgmlAct::Q8_0, kern::GgmlAct::Q8_1, kern::GgmlAct::Q8_K}) {
    SCOPED_TRACE(int(a));
    const int64_t blk = kern::ggml_act_block(a), nb = n * cols / blk;
    std::vector<int8_t> q(size_t(n * cols)), wq(q.size());
    std::vector<float> d(static_cast<size_t>(nb)), s(d.size()), wd(d.size()), ws(d.size());
    std::vector<int16_t> bs(size_t(n * cols / 16)), wbs(bs.size());
    for (int64_t b = 0; b < nb; ++b) {
      if (a == kern::GgmlAct::Q8_K)
        ggml_q8_k(&x[size_t(b * 256)], &wq[size_t(b * 256)], &wd[size_t(b)], &wbs[size_t(b * 16)]);
      else
        ggml_q8_0(&x[size_t(b * 32)], &wq[size_t(b * 32)], &wd[size_t(b)], &ws[size_t(b)],
                  a == kern::GgmlAct::Q8_1);
    }
    // The portable quantizer, and the AVX2 one both families use.
    for (bool simd : {false, true}) {
      SCOPED_TRACE(simd ? "avx2" : "scalar");
#if defined(__x86_64__) || defined(_M_X64)
      if (simd && llm::cpu::best_isa() < Isa::Avx2) continue;
      if (simd)
        kern::quantize_ggml_x_avx2(a, x.data(), n, cols, q.data(), d.data(), s.data(), bs.data());
      else
#else
      if (simd) continue;
#endif
        kern::quantize_ggml_x(a, x.data(), n, cols, q.data(), d.data(), s.data(), bs.data());
      EXPECT_EQ(q, wq);
      EXPECT_EQ(d, wd);
      if (a == kern::GgmlAct::Q8_1) {
        EXPECT_EQ(s, ws);
      }
      if (a == kern::GgmlAct::Q8_K) {
        EXPECT_EQ(bs, wbs);
      }
    }
  }
  // The ties went to the even neighbour, and the first of +50 / -50 set the sign.
  int8_t q[768];
  float d[768 / 32];  // one scale per block: 24 for Q8_0, 3 for Q8_K
  int16_t bs[48];
  kern::quantize_ggml_x(kern::GgmlAct::Q8_0, x.data(), 1, 768, q, d, nullptr, nullptr);
  EXPECT_EQ(q[64 + 1], -2);  // -1.5 -> -2
  EXPECT_EQ(q[64 + 3], 0);   // 0.5 -> 0
  EXPECT_EQ(q[64 + 5], 2);   // 2.5 -> 2
  kern::quantize_ggml_x(kern::GgmlAct::Q8_K, x.data(), 1, 768, q, d, nullptr, bs);
  EXPECT_EQ(q[256 + 3], -127);
  EXPECT_EQ(q[256 + 200], 127);
  EXPECT_EQ(q[512 + 9], -127);  // the largest magnitude always maps to -127
}

TEST(GgufActivations, NonFiniteInputsGiveANanScale) {
  for (kern::GgmlAct a : {kern::GgmlAct::Q8_0, kern::GgmlAct::Q8_1, kern::GgmlAct::Q8_K})
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x(256, 0.5f);
      x[17] = bad;
      std::vector<int8_t> q(256, 5);
      float d[8], s[8];
      int16_t bs[16];
      kern::quantize_ggml_x(a, x.data(), 1, 256, q.data(), d, s, bs);
      EXPECT_TRUE(std::isnan(d[0])) << int(a) << " " << bad;
      if (a != kern::GgmlAct::Q8_K) {
        EXPECT_EQ(d[1], a == kern::GgmlAct::Q8_1 ? fp16_round(0.5f / 127.f) : 0.5f / 127.f);
      }
#if defined(__x86_64__) || defined(_M_X64)
      if (llm::cpu::best_isa() >= Isa::Avx2) {
        float d2[8], s2[8];
        std::vector<int8_t> q2(256, 5);
        kern::quantize_ggml_x_avx2(a, x.data(), 1, 256, q2.data(), d2, s2, bs);
        EXPECT_TRUE(std::isnan(d2[0]));
        EXPECT_EQ(q, q2);
      }
#endif
    }
}

// Q8_K with sub-scales, checked against its definition: d = amax / (127 *
// 8); every e the smallest in 1..8 that covers its 32 values; q the rounded
// quotient x * (1 / (d * e)); bsums e times the 16-value sums; and finer
// than ggml's Q8_K where one sub-block holds the large values.
TEST(GgufActivations, SubScalesFollowTheirDefinition) {
  std::mt19937 rng(4);
  const int64_t n = 2, cols = 768, E = kern::kSubScaleMax;
  std::vector<float> x = random_x(n, cols, rng);
  for (int j = 0; j < 32; ++j) x[size_t(32 + j)] = 0.f;          // a zero sub-block
  for (int j = 0; j < 32; ++j) x[size_t(64 + j)] *= 1e-3f;       // a tiny one: e = 1
  x[size_t(256 + 7)] = 40.f;                                    // one large value
  for (int j = 0; j < 256; ++j) x[size_t(512 + j)] = 0.f;        // an all-zero super-block
  for (int j = 0; j < 256; ++j) x[size_t(cols + j)] = 1e-41f;    // d below FLT_MIN: zeros
  std::vector<int8_t> q(size_t(n * cols), 99);
  std::vector<float> d(size_t(n * cols / 256));
  std::vector<uint8_t> e(size_t(n * cols / 32));
  std::vector<int16_t> bs(size_t(n * cols / 16));
  kern::quantize_q8_ks(x.data(), n, cols, q.data(), d.data(), e.data(), bs.data());
  for (int64_t sb = 0; sb < n * cols / 256; ++sb) {
    SCOPED_TRACE(sb);
    const float* xs = &x[size_t(256 * sb)];
    float amax = 0;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(xs[j]));
    const float dd = amax / (127.f * float(E));
    if (!(dd >= FLT_MIN)) {
      EXPECT_EQ(d[size_t(sb)], 0.f);
      for (int j = 0; j < 256; ++j) EXPECT_EQ(q[size_t(256 * sb + j)], 0);
      continue;
    }
    EXPECT_EQ(d[size_t(sb)], dd);
    int largest = 0;
    for (int k = 0; k < 8; ++k) {
      float a = 0;
      for (int j = 0; j < 32; ++j) a = std::max(a, std::fabs(xs[32 * k + j]));
      const int ek = e[size_t(8 * sb + k)];
      largest = std::max(largest, ek);
      ASSERT_GE(ek, 1);
      ASSERT_LE(ek, E);
      EXPECT_LE(a, 127.f * dd * float(ek) * (1 + 1e-6f));                 // covers
      if (ek > 1) {
        EXPECT_GT(a, 127.f * dd * float(ek - 1) * (1 - 1e-6f));  // and is the smallest
      }
      const float iscale = 1.f / (dd * float(ek));
      int sum[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        const int8_t qj = q[size_t(256 * sb + 32 * k + j)];
        EXPECT_EQ(qj, int8_t(std::max(-127.f, std::min(127.f, std::nearbyint(xs[32 * k + j] * iscale)))));
        EXPECT_LE(std::fabs(xs[32 * k + j] - dd * float(ek) * float(qj)), 0.5f * dd * float(ek) * (1 + 1e-5f));
        sum[j / 16] += qj;
      }
      EXPECT_EQ(bs[size_t(16 * sb + 2 * k)], ek * sum[0]);
      EXPECT_EQ(bs[size_t(16 * sb + 2 * k + 1)], ek * sum[1]);
    }
    EXPECT_EQ(largest, E);  // the sub-block with amax uses the whole range
  }
  EXPECT_EQ(e[1], 1);   // the zero sub-block
  EXPECT_EQ(e[2], 1);   // the tiny one
  // Super-block 1 (one value of 40 among N(0, 1)): the other sub-blocks get
  // e = 1 and 8 times finer steps than ggml's Q8_K, whose one scale is set
  // by the 40.
  std::vector<int8_t> gq(256);
  float gd;
  int16_t gbs[16];
  kern::quantize_ggml_x(kern::GgmlAct::Q8_K, &x[256], 1, 256, gq.data(), &gd, nullptr, gbs);
  double err_sub = 0, err_ggml = 0;
  for (int j = 0; j < 256; ++j) {
    err_sub += std::fabs(x[size_t(256 + j)] - d[1] * float(e[size_t(8 + j / 32)]) * float(q[size_t(256 + j)]));
    err_ggml += std::fabs(x[size_t(256 + j)] - gd * float(gq[size_t(j)]));
  }
  EXPECT_LT(err_sub, 0.25 * err_ggml);
  // A NaN or Inf anywhere in a super-block: a NaN d, no trap.
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> y(256, 0.5f);
    y[100] = bad;
    kern::quantize_q8_ks(y.data(), 1, 256, q.data(), d.data(), e.data(), bs.data());
    EXPECT_TRUE(std::isnan(d[0])) << bad;
  }
}

// The AVX-512 family's quantizer gives quantize_q8_ks's bytes: random rows,
// a sub-block of exact .5 ties, a zero and a tiny super-block, NaN and Inf.
TEST(GgufActivations, SubScalesAvx512GivesThePortableBytes) {
#if defined(__x86_64__) || defined(_M_X64)
  if (llm::cpu::best_isa() < Isa::Avx512) GTEST_SKIP() << "no AVX-512 kernels on this CPU/build";
  std::mt19937 rng(5);
  const int64_t n = 5, cols = 1024;
  std::vector<float> x = random_x(n, cols, rng);
  // d = 1 (amax 1016 in sub-block 1), and sub-block 0's e = 1: ties at .5 steps.
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j % 9) - 4.5f;
  x[32] = 127.f * 8.f;
  for (int j = 0; j < 256; ++j) x[size_t(256 + j)] = 0.f;
  for (int j = 0; j < 256; ++j) x[size_t(512 + j)] = 1e-41f * float(j % 3);
  x[size_t(cols + 300)] = NAN;
  x[size_t(2 * cols + 3)] = -INFINITY;
  x[size_t(3 * cols + 40)] *= 1e4f;
  std::vector<int8_t> q(size_t(n * cols)), q2(q.size());
  std::vector<float> d(size_t(n * cols / 256)), d2(d.size());
  std::vector<uint8_t> e(size_t(n * cols / 32)), e2(e.size());
  std::vector<int16_t> bs(size_t(n * cols / 16)), bs2(bs.size());
  kern::quantize_q8_ks(x.data(), n, cols, q.data(), d.data(), e.data(), bs.data());
  kern::quantize_q8_ks_avx512(x.data(), n, cols, q2.data(), d2.data(), e2.data(), bs2.data());
  EXPECT_EQ(q, q2);
  EXPECT_EQ(e, e2);
  EXPECT_EQ(bs, bs2);
  ASSERT_EQ(d.size(), d2.size());
  for (size_t i = 0; i < d.size(); ++i) {
    if (std::isnan(d[i])) {
      EXPECT_TRUE(std::isnan(d2[i])) << i;
    } else {
      EXPECT_EQ(d[i], d2[i]) << i;
    }
  }
  EXPECT_EQ(e[0], 1);
  EXPECT_EQ(q[1], -4);  // -3.5 -> -4 (even)
  EXPECT_EQ(q[2], -2);  // -2.5 -> -2
#else
  GTEST_SKIP() << "x86 only";
#endif
}

// --- unpacking ---------------------------------------------------------------

TEST(GgufUnpack, PlainUnpackersGiveGgmlValues) {
  std::mt19937 rng(5);
  for (DType t : kTypes) {
    SCOPED_TRACE(llm::dtype_name(t));
    const int64_t cols = 512, rows = 8;
    const std::vector<uint8_t> w = random_gguf_rows(t, rows, cols, rng);
    const size_t bb = llm::ggml_block_bytes(t);
    const int64_t blocks = rows * cols / llm::ggml_block_values(t);
    std::vector<float> deq(size_t(rows * cols));
    llm::dequantize_ggml(llm::ggml_type_of(t), w.data(), deq.data(), rows * cols);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* want = &deq[size_t(b * llm::ggml_block_values(t))];
      if (llm::ggml_block_values(t) == 256) {
        kern::KUnpacked u;
        kern::unpack_k_ref(t, w.data() + size_t(b) * bb, &u);
        if (kern::k_min_uses_d(t)) {
          EXPECT_EQ(u.d, u.dm);
        }
        for (int i = 0; i < 256; ++i) {
          const int code = kern::k_signed(t) ? int(int8_t(u.q[i])) : int(u.q[i]);
          const double a = double(u.d) * u.sv[8 * (i / 16)] * code, m = double(u.dm) * u.mn[i / 16];
          ASSERT_NEAR(a - m, want[i], 1e-6 * (std::fabs(a) + std::fabs(m)) + 1e-30) << "block " << b << " value " << i;
          ASSERT_EQ(u.sv[8 * (i / 16)], u.sv[8 * (i / 16) + 7]);
        }
      } else {
        int8_t q[32];
        float d, m;
        kern::unpack_b32_ref(t, w.data() + size_t(b) * bb, q, &d, &m);
        for (int i = 0; i < 32; ++i)
          ASSERT_NEAR(double(d) * q[i] + m, want[i], 1e-6 * std::fabs(double(d) * q[i]) + 1e-6 * std::fabs(m) + 1e-30)
              << "block " << b << " value " << i;
      }
    }
  }
}

#if defined(__x86_64__) || defined(_M_X64)
TEST(GgufUnpack, Avx2UnpackersGiveThePlainBytes) {
  if (llm::cpu::best_isa() < Isa::Avx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(6);
  for (DType t : kTypes) {
    SCOPED_TRACE(llm::dtype_name(t));
    const int64_t cols = 1024, rows = 3;
    const std::vector<uint8_t> w = random_gguf_rows(t, rows, cols, rng);
    const size_t bb = llm::ggml_block_bytes(t), rb = llm::dtype_row_bytes(t, cols, uint32_t(llm::ggml_block_values(t)));
    const int64_t nb = cols / llm::ggml_block_values(t);
    if (llm::ggml_block_values(t) == 256) {
      std::vector<kern::KUnpacked> simd(size_t(rows * nb)), plain(simd.size());
      kern::unpack_k_rows_avx2(t, w.data(), rb, int(rows), 1, nb, simd.data(), nb, nullptr);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 1; b < nb; ++b) {
          kern::unpack_k_ref(t, w.data() + size_t(r) * rb + size_t(b) * bb, &plain[0]);
          const kern::KUnpacked& s = simd[size_t(r * nb + b - 1)];
          ASSERT_EQ(0, std::memcmp(s.q, plain[0].q, 256)) << r << " " << b;
          ASSERT_EQ(0, std::memcmp(s.sv, plain[0].sv, sizeof s.sv)) << r << " " << b;
          ASSERT_EQ(0, std::memcmp(s.mn, plain[0].mn, sizeof s.mn)) << r << " " << b;
          ASSERT_EQ(s.d, plain[0].d);
          ASSERT_EQ(s.dm, plain[0].dm);
        }
    } else {
      std::vector<int8_t> q(size_t(rows * cols));
      std::vector<float> d(size_t(rows * nb)), m(d.size());
      kern::unpack_b32_rows_avx2(t, w.data(), rb, int(rows), 0, nb, q.data(), cols, d.data(), m.data(), nb, nullptr);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < nb; ++b) {
          int8_t pq[32];
          float pd, pm;
          kern::unpack_b32_ref(t, w.data() + size_t(r) * rb + size_t(b) * bb, pq, &pd, &pm);
          ASSERT_EQ(0, std::memcmp(&q[size_t(r * cols + 32 * b)], pq, 32)) << r << " " << b;
          ASSERT_EQ(d[size_t(r * nb + b)], pd);
          ASSERT_EQ(m[size_t(r * nb + b)], pm);
        }
    }
  }
}
#endif

// --- matmul against the math ---------------------------------------------------

struct Oracle {
  std::vector<double> yq;     // with the quantized activations: what the integer kernels compute
  std::vector<double> bound;  // |y(fast) - y(exact x)| may reach this much from activation quantization
  std::vector<double> scale;  // sum |w| |x|, for the f32 rounding allowance
};

// Whether family `isa` quantizes t's activations as Q8_K with sub-scales.
bool sub_scaled(Isa isa, DType t) {
#if defined(__x86_64__) || defined(_M_X64)
  return isa == Isa::Avx512 && kern::ggml_act_of(t) == kern::GgmlAct::Q8_K && kern::ggml_avx512_runs(t);
#else
  (void)isa;
  (void)t;
  return false;
#endif
}

// y[i][r] from the dequantized weights (ggml's decoders) and x as ggml
// quantizes it for t (the quantizer checked above), or as Q8_K with
// sub-scales.
Oracle oracle(const WeightView& w, const std::vector<float>& x, int64_t n, bool sub_scales = false) {
  const kern::GgmlAct a = kern::ggml_act_of(w.dtype);
  const int64_t cols = w.cols, blk = kern::ggml_act_block(a), nb = cols / blk;
  std::vector<int8_t> q(size_t(n * cols));
  std::vector<float> d(size_t(n * nb)), s(size_t(n * nb));
  std::vector<int16_t> bs(size_t(n * cols / 16));
  std::vector<uint8_t> e(size_t(n * cols / 32), 1);
  if (sub_scales)
    kern::quantize_q8_ks(x.data(), n, cols, q.data(), d.data(), e.data(), bs.data());
  else
    kern::quantize_ggml_x(a, x.data(), n, cols, q.data(), d.data(), s.data(), bs.data());
  Oracle o;
  o.yq.assign(size_t(n * w.rows), 0.0);
  o.bound = o.scale = o.yq;
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    llm::dequantize_row(w.dtype, w.group, w.data + size_t(r) * w.row_bytes, row.data(), cols);
    for (int64_t i = 0; i < n; ++i) {
      double yq = 0, bound = 0, scale = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double xk = x[size_t(i * cols + k)],
                     xh = double(d[size_t(i * nb + k / blk)]) * e[size_t((i * cols + k) / 32)] * q[size_t(i * cols + k)];
        yq += double(row[size_t(k)]) * xh;
        bound += std::fabs(double(row[size_t(k)])) * std::fabs(xk - xh);
        scale += std::fabs(double(row[size_t(k)])) * (std::fabs(xk) + std::fabs(xh));
      }
      if (a == kern::GgmlAct::Q8_1) {
        // ggml's Q5_1 dot uses the fp16 s = d * sum(q) for the minimum's
        // term where the dequantized weights give d * sum(q) exactly.
        for (int64_t b = 0; b < nb; ++b) {
          float dw, m;
          int8_t wq[32];
          kern::unpack_b32_ref(w.dtype, w.data + size_t(r) * w.row_bytes + size_t(b) * 24, wq, &dw, &m);
          int sum = 0;
          for (int j = 0; j < 32; ++j) sum += q[size_t(i * cols + 32 * b + j)];
          const double diff = double(m) * (double(s[size_t(i * nb + b)]) - double(d[size_t(i * nb + b)]) * sum);
          yq += diff;
          bound += std::fabs(diff);
        }
      }
      o.yq[size_t(i * w.rows + r)] = yq;
      o.bound[size_t(i * w.rows + r)] = bound;
      o.scale[size_t(i * w.rows + r)] = scale;
    }
  }
  return o;
}

// Shapes: odd row counts; rows of 1 block, of partial AVX-512 quads (25
// blocks of 32), of several super-blocks.
std::vector<int64_t> cols_for(DType t) {
  return llm::ggml_block_values(t) == 32 ? std::vector<int64_t>{32, 800} : std::vector<int64_t>{256, 768};
}

TEST(GgufMatmul, FastIsTheQuantizedActivationMathAndWithinItsErrorOfReference) {
  std::mt19937 rng(7);
  llm::ThreadPool pool(2);
  for (DType t : kTypes)
    for (int64_t cols : cols_for(t)) {
      const int64_t rows = 37;
      const std::vector<uint8_t> bytes = random_gguf_rows(t, rows, cols, rng);
      const WeightView w = view_of(t, rows, cols, bytes);
      for (int64_t n : {1, 3, 8, 13}) {
        const std::vector<float> x = random_x(n, cols, rng);
        const Oracle og = oracle(w, x, n), os = oracle(w, x, n, true);
        for_each_isa([&](Isa isa) {
          SCOPED_TRACE(testing::Message() << llm::dtype_name(t) << " cols " << cols << " n " << n << " "
                                          << llm::cpu::isa_name(isa));
          const Oracle& o = sub_scaled(isa, t) ? os : og;
          std::vector<float> fast(size_t(n * rows)), ref(fast.size());
          llm::cpu::matmul(w, x.data(), n, fast.data(), &pool, MatmulMode::Fast);
          llm::cpu::matmul(w, x.data(), n, ref.data(), &pool, MatmulMode::Reference);
          for (size_t k = 0; k < fast.size(); ++k) {
            const double tol = 1e-5 * o.scale[k] + 1e-12;
            ASSERT_NEAR(fast[k], o.yq[k], tol) << "output " << k;
            ASSERT_NEAR(fast[k], ref[k], o.bound[k] + tol) << "output " << k;
          }
        });
      }
    }
}

// The bound is not vacuous: the activation error is a small part of the
// output, and Fast mode really differs from Reference mode.
TEST(GgufMatmul, ActivationErrorBoundIsTight) {
  std::mt19937 rng(8);
  for (DType t : {DType::Q5_0, DType::Q4_K, DType::Q6_K})
    for (bool sub_scales : {false, true}) {
      if (sub_scales && kern::ggml_act_of(t) != kern::GgmlAct::Q8_K) continue;
      const int64_t rows = 16, cols = 512, n = 2;
      const std::vector<uint8_t> bytes = random_gguf_rows(t, rows, cols, rng);
      const WeightView w = view_of(t, rows, cols, bytes);
      const std::vector<float> x = random_x(n, cols, rng);
      const Oracle o = oracle(w, x, n, sub_scales);
      double bound = 0, scale = 0;
      for (size_t k = 0; k < o.bound.size(); ++k) {
        bound += o.bound[k];
        scale += o.scale[k];
      }
      EXPECT_LT(bound, 0.02 * scale) << llm::dtype_name(t);
      EXPECT_GT(bound, 0.0) << llm::dtype_name(t);
    }
}

TEST(GgufMatmul, BatchAndThreadInvariantAndManyEqualsOneByOne) {
  std::mt19937 rng(9);
  llm::ThreadPool pool1(1), pool2(2);
  for (DType t : kTypes) {
    // 33 blocks of 32 for the 32-value types: the AVX-512 quads end partial.
    // 67 rows and 37 x rows: the prefill loops' groups of W rows (64 on one
    // thread) and blocks of x rows (16 in the AVX2 family) end partial too.
    const int64_t cols = llm::ggml_block_values(t) == 32 ? 1056 : 1024, rows = 67, n = 37;
    const std::vector<uint8_t> a = random_gguf_rows(t, rows, cols, rng);
    const std::vector<float> x = random_x(n, cols, rng);
    // matmul_many: two matrices of t on one x, and a group with a matrix of
    // another format (done one by one), all 1024 wide.
    const DType u = t == DType::Q5_0 ? DType::Q4_K : DType::Q5_0;
    const std::vector<uint8_t> m0 = random_gguf_rows(t, 37, 1024, rng), m1 = random_gguf_rows(t, 13, 1024, rng),
                               m2 = random_gguf_rows(u, 21, 1024, rng);
    const std::vector<float> xm = random_x(n, 1024, rng);
    for_each_isa([&](Isa isa) {
      for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::Reference}) {
        SCOPED_TRACE(testing::Message() << llm::dtype_name(t) << " " << llm::cpu::isa_name(isa) << " mode "
                                        << int(mode));
        const WeightView w = view_of(t, rows, cols, a);
        std::vector<float> batch(size_t(n * rows));
        llm::cpu::matmul(w, x.data(), n, batch.data(), &pool2, mode);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<float> one(static_cast<size_t>(rows));
          llm::cpu::matmul(w, x.data() + i * cols, 1, one.data(), (i % 2) ? &pool1 : &pool2, mode);
          ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + i * rows, size_t(rows) * 4)) << "row " << i;
        }
        for (int64_t nn : {int64_t(1), n})
          for (bool mixed : {false, true}) {
            const WeightView v[3] = {view_of(t, 37, 1024, m0), view_of(t, 13, 1024, m1), view_of(u, 21, 1024, m2)};
            const int count = mixed ? 3 : 2;
            std::vector<float> alone[3], many[3];
            float* outs[3];
            for (int i = 0; i < count; ++i) {
              alone[i].assign(size_t(nn * v[i].rows), 0.f);
              many[i].assign(size_t(nn * v[i].rows), -1.f);
              outs[i] = many[i].data();
              llm::cpu::matmul(v[i], xm.data(), nn, alone[i].data(), &pool2, mode);
            }
            llm::cpu::matmul_many(v, outs, count, xm.data(), nn, &pool2, mode);
            for (int i = 0; i < count; ++i) EXPECT_EQ(alone[i], many[i]) << "matrix " << i << " n " << nn;
          }
      }
    });
  }
}

// A NaN or Inf fp16 scale (d, or the minimum's scale) poisons its own row
// and no other, in both modes and every family; no trap, no crash.
TEST(GgufMatmul, NonFiniteScalesStayInTheirRow) {
  std::mt19937 rng(10);
  llm::ThreadPool pool(2);
  for (DType t : kTypes) {
    const int64_t rows = 9, cols = llm::ggml_block_values(t) == 32 ? 160 : 512;
    std::vector<uint8_t> bytes = random_gguf_rows(t, rows, cols, rng);
    const WeightView w = view_of(t, rows, cols, bytes);
    const size_t bb = llm::ggml_block_bytes(t);
    const uint16_t nan = 0x7e00, inf = 0x7c00, ninf = 0xfc00;
    std::memcpy(bytes.data() + 2 * w.row_bytes + bb + size_t(llm::testing::gguf_d_offset(t)), &nan, 2);
    std::memcpy(bytes.data() + 5 * w.row_bytes + size_t(llm::testing::gguf_d_offset(t)), &inf, 2);
    if (llm::testing::gguf_dmin_offset(t) >= 0)
      std::memcpy(bytes.data() + 7 * w.row_bytes + size_t(llm::testing::gguf_dmin_offset(t)), &ninf, 2);
    for (int64_t n : {1, 3, 6}) {  // decode, batched decode from the blocks, panels
      const std::vector<float> x = random_x(n, cols, rng);
      for_each_isa([&](Isa isa) {
        for (MatmulMode mode : {MatmulMode::Fast, MatmulMode::Reference}) {
          SCOPED_TRACE(testing::Message() << llm::dtype_name(t) << " " << llm::cpu::isa_name(isa) << " n " << n
                                          << " mode " << int(mode));
          std::vector<float> y(size_t(n * rows));
          llm::cpu::matmul(w, x.data(), n, y.data(), &pool, mode);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r) {
              const float v = y[size_t(i * rows + r)];
              const bool poisoned = r == 2 || r == 5 || (r == 7 && llm::testing::gguf_dmin_offset(t) >= 0);
              if (poisoned)
                EXPECT_FALSE(std::isfinite(v)) << "row " << r;
              else
                EXPECT_TRUE(std::isfinite(v)) << "row " << r;
            }
        }
      });
    }
  }
}

// A NaN activation makes its own output row NaN (the quantized block gets a
// NaN scale) and leaves the other x rows alone.
TEST(GgufMatmul, NanActivationsGiveNanOutputs) {
  std::mt19937 rng(12);
  llm::ThreadPool pool(2);
  for (DType t : kTypes) {
    const int64_t rows = 5, cols = 256, n = 3;
    const std::vector<uint8_t> bytes = random_gguf_rows(t, rows, cols, rng);
    const WeightView w = view_of(t, rows, cols, bytes);
    std::vector<float> x = random_x(n, cols, rng);
    x[size_t(cols + 40)] = NAN;
    for_each_isa([&](Isa isa) {
      SCOPED_TRACE(testing::Message() << llm::dtype_name(t) << " " << llm::cpu::isa_name(isa));
      std::vector<float> y(size_t(n * rows));
      llm::cpu::matmul(w, x.data(), n, y.data(), &pool, MatmulMode::Fast);
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_TRUE(std::isfinite(y[size_t(r)]));
        EXPECT_TRUE(std::isnan(y[size_t(rows + r)]));
        EXPECT_TRUE(std::isfinite(y[size_t(2 * rows + r)]));
      }
    });
  }
}

}  // namespace
