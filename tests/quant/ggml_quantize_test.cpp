// Quantizers into ggml's block formats (src/quant/ggml_quantize.cpp): round
// trips through ggml's own decoders, error against ggml's quantizers on the
// same rows, awkward rows (zeros, outliers, non-finite values), importance
// weights and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "quant/ggml_quants.h"
#include "quant/quant.h"
#include "random_vectors.h"
#include "convert/ggml_quantize.h"

namespace llm {
namespace {

struct Format {
  DType t;
  const char* ggml_name;  // q.<name> / deq.<name> in ggml-quant-vectors.gguf
  double gauss_bound;     // relative RMSE bound on N(0, 1) rows
};

// Bounds about 10% above what the quantizers give (Q4_K 0.0703, Q5_K 0.0346,
// Q6_K 0.0169, Q5_0 0.0424, Q5_1 0.0379, Q2_K 0.2639, Q3_K 0.1440, IQ4_NL
// 0.0728, IQ4_XS 0.0734 relative RMSE), far below what a wrong layout, a
// lost scale bit or a fit that ignores the minimum gives.
const Format kFormats[] = {
    {DType::Q4_K, "q4_K", 0.077},    {DType::Q5_K, "q5_K", 0.038},     {DType::Q6_K, "q6_K", 0.0185},
    {DType::Q5_0, "q5_0", 0.047},    {DType::Q5_1, "q5_1", 0.042},     {DType::Q2_K, "q2_K", 0.29},
    {DType::Q3_K, "q3_K", 0.158},    {DType::IQ4_NL, "iq4_nl", 0.080}, {DType::IQ4_XS, "iq4_xs", 0.081},
};

std::vector<float> round_trip(DType t, const std::vector<float>& x, const float* importance = nullptr) {
  const int64_t cols = int64_t(x.size());
  const uint32_t group = uint32_t(ggml_block_values(t));
  std::vector<uint8_t> q(dtype_row_bytes(t, cols, group));
  EXPECT_FALSE(q.empty()) << dtype_name(t);
  quantize_any_row(t, group, x.data(), q.data(), cols, importance);
  std::vector<float> y(x.size());
  dequantize_row(t, group, q.data(), y.data(), cols);
  // dequantize_row is ggml's decoder; call it directly too.
  std::vector<float> z(x.size());
  dequantize_ggml(ggml_type_of(t), q.data(), z.data(), cols);
  EXPECT_EQ(std::memcmp(y.data(), z.data(), z.size() * 4), 0) << dtype_name(t);
  return y;
}

double sq_error(const std::vector<float>& x, const std::vector<float>& y) {
  double s = 0.0;
  for (size_t i = 0; i < x.size(); ++i) s += double(y[i] - x[i]) * double(y[i] - x[i]);
  return s;
}

double sq_norm(const std::vector<float>& x) {
  double s = 0.0;
  for (float v : x) s += double(v) * v;
  return s;
}

using llm::testing::randn;

// RMSE relative to the row's RMS on Gaussian rows of several scales, and the
// formats rank by their bits: Q6_K < Q5_K < Q4_K < Q3_K < Q2_K, Q5_K < Q5_0,
// IQ4_NL and IQ4_XS (4.5 and 4.25 bits) near Q4_K (4.5).
TEST(GgmlQuantize, GaussianRoundTripErrors) {
  std::map<DType, double> rel;
  for (const Format& f : kFormats) {
    double err = 0.0, ref = 0.0;
    for (uint32_t seed = 1; seed <= 8; ++seed) {
      const std::vector<float> x = randn(1024, seed, seed % 2 ? 1.0f : 0.02f);
      const std::vector<float> y = round_trip(f.t, x);
      for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(f.t);
      err += sq_error(x, y) / sq_norm(x);
      ref += 1.0;
    }
    rel[f.t] = std::sqrt(err / ref);
    std::printf("%-5s relative RMSE on N(0, s): %.4f (bound %.4f)\n", dtype_name(f.t), rel[f.t], f.gauss_bound);
    EXPECT_LT(rel[f.t], f.gauss_bound) << dtype_name(f.t);
    EXPECT_GT(rel[f.t], 0.0) << dtype_name(f.t);
  }
  EXPECT_LT(rel[DType::Q6_K], 0.6 * rel[DType::Q5_K]);
  EXPECT_LT(rel[DType::Q5_K], 0.6 * rel[DType::Q4_K]);
  EXPECT_LT(rel[DType::Q5_K], rel[DType::Q5_0]);
  EXPECT_LT(rel[DType::Q4_K], 0.6 * rel[DType::Q3_K]);
  EXPECT_LT(rel[DType::Q3_K], 0.6 * rel[DType::Q2_K]);
  for (DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
    EXPECT_LT(rel[t], 1.1 * rel[DType::Q4_K]) << dtype_name(t);
    EXPECT_LT(rel[t], 0.6 * rel[DType::Q3_K]) << dtype_name(t);
  }
  EXPECT_LT(rel[DType::IQ4_NL], rel[DType::IQ4_XS]);  // an fp16 step per 32 against a 6-bit one
}

// ggml-quant-vectors.gguf: the same 129 rows of 256 (stories260K's embedding,
// and a zero row) quantized by ggml_quantize_chunk. Q5_0/Q5_1 follow ggml's
// rule, so their bytes are ggml's; the K types and IQ4_NL are fitted here and
// must not be worse than ggml's quantizers on these rows. The file holds no
// IQ4_XS; its rows are still checked against the source (and the zero row).
TEST(GgmlQuantize, AgainstGgmlOnTheVectors) {
  std::ifstream in(std::string(LLM_MODELS_DIR) + "/ggml-quant-vectors.gguf", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(bytes.empty());
  const GgufFile g = parse_gguf(bytes.data(), bytes.size());
  auto find = [&](const std::string& name) -> const GgufTensorInfo* {
    for (const auto& t : g.tensors)
      if (t.name == name) return &t;
    return nullptr;
  };
  auto get = [&](const std::string& name) -> const GgufTensorInfo& {
    if (const GgufTensorInfo* t = find(name)) return *t;
    throw std::runtime_error("missing tensor " + name);
  };
  const float* src = reinterpret_cast<const float*>(get("source.f32").data);
  const int64_t rows = 129, cols = 256;
  for (const Format& f : kFormats) {
    const size_t rb = dtype_row_bytes(f.t, cols, uint32_t(ggml_block_values(f.t)));
    const GgufTensorInfo* q = find(std::string("q.") + f.ggml_name);
    if (q == nullptr) {
      ASSERT_EQ(f.t, DType::IQ4_XS) << "ggml-quant-vectors.gguf has no " << f.ggml_name;
    } else {
      ASSERT_EQ(rb * rows, q->nbytes);
    }
    const float* ggml_y = q ? reinterpret_cast<const float*>(get(std::string("deq.") + f.ggml_name).data) : nullptr;
    std::vector<uint8_t> row(rb);
    std::vector<float> y(cols);
    double ours = 0.0, theirs = 0.0, ref = 0.0;
    int same_bytes = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = src + r * cols;
      quantize_any_row(f.t, uint32_t(ggml_block_values(f.t)), x, row.data(), cols);
      if (q) same_bytes += std::memcmp(row.data(), q->data + size_t(r) * rb, rb) == 0;
      dequantize_row(f.t, uint32_t(ggml_block_values(f.t)), row.data(), y.data(), cols);
      for (int64_t j = 0; j < cols; ++j) {
        ours += double(y[j] - x[j]) * (y[j] - x[j]);
        if (ggml_y) theirs += double(ggml_y[r * cols + j] - x[j]) * (ggml_y[r * cols + j] - x[j]);
        ref += double(x[j]) * x[j];
        if (r == rows - 1) {
          ASSERT_EQ(y[j], 0.0f) << f.ggml_name << ": the zero row";
        }
      }
    }
    if (!q) {
      std::printf("%-5s relative RMSE, libllm %.5f (not in the file)\n", f.ggml_name, std::sqrt(ours / ref));
      EXPECT_LT(std::sqrt(ours / ref), 1.1 * f.gauss_bound) << f.ggml_name;
      continue;
    }
    std::printf("%-5s relative RMSE, libllm %.5f, ggml %.5f (%d of %lld rows byte-identical)\n", f.ggml_name,
                std::sqrt(ours / ref), std::sqrt(theirs / ref), same_bytes, (long long)rows);
    if (f.t == DType::Q5_0 || f.t == DType::Q5_1) {
      EXPECT_EQ(same_bytes, rows) << f.ggml_name;
    } else {
      EXPECT_LE(ours, theirs) << f.ggml_name;
    }
  }
}

TEST(GgmlQuantize, ZeroAndConstantRows) {
  for (const Format& f : kFormats) {
    const std::vector<float> zero(512, 0.0f);
    for (float v : round_trip(f.t, zero)) ASSERT_EQ(v, 0.0f) << dtype_name(f.t);
    // A constant row: a single value per block is representable up to the
    // fp16 rounding of the scale (and of the minimum).
    for (float c : {0.37f, -1.5f}) {
      const std::vector<float> x(512, c);
      const std::vector<float> y = round_trip(f.t, x);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], c, 2e-3 * std::fabs(c)) << dtype_name(f.t) << " " << c;
    }
  }
}

// One huge value per super-block: it is reproduced to within its sub-block's
// step, nothing becomes non-finite, and the sub-blocks without an outlier
// keep a bounded error (their scales lose precision against the outlier's,
// which is the format's cost, not the fit's). Q2_K pays most: its 4-bit
// scales and minimums become 0..15 multiples of the outlier's (measured: the
// other sub-blocks at 0.37-0.60, 1.4-2.3x its Gaussian error; the outlier
// within 2.1%, the fit trading a little of it for its sub-block's others).
TEST(GgmlQuantize, OutliersStayBounded) {
  for (const Format& f : kFormats) {
    std::vector<float> x = randn(1024, 7);
    for (size_t b = 0; b < x.size(); b += 256) x[b + 37] = (b / 256) % 2 ? -60.0f : 45.0f;
    const std::vector<float> y = round_trip(f.t, x);
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
    const double outlier_tol = f.t == DType::Q2_K ? 0.03 : 0.02;
    const double rest_bound = std::max(0.25, 2.5 * f.gauss_bound);
    for (size_t b = 0; b < x.size(); b += 256) {
      EXPECT_NEAR(y[b + 37], x[b + 37], outlier_tol * std::fabs(x[b + 37])) << dtype_name(f.t);
      // Values 64..255 of each super-block share no sub-block (nor 32-block) with the outlier.
      double err = 0.0, ref = 0.0;
      for (size_t i = b + 64; i < b + 256; ++i) {
        err += double(y[i] - x[i]) * (y[i] - x[i]);
        ref += double(x[i]) * x[i];
      }
      EXPECT_LT(std::sqrt(err / ref), rest_bound) << dtype_name(f.t) << " block " << b / 256;
    }
  }
}

// NaN and infinities take the level nearest zero and do not disturb their
// neighbours. Every format but Q2_K has a level at (or within a step of the
// table's 1 of) zero; a Q2_K sub-block's levels d*sc*q - dmin*mn may all miss
// it, so there the value is only the one of its 16 nearest to zero.
TEST(GgmlQuantize, NonFiniteInputsGiveFiniteOutput) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Format& f : kFormats) {
    std::vector<float> x = randn(512, 3);
    x[5] = nan, x[40] = inf, x[300] = -inf;
    const std::vector<float> y = round_trip(f.t, x);
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << dtype_name(f.t) << " " << i;
      if (i == 5 || i == 40 || i == 300) {
        if (f.t != DType::Q2_K) {
          EXPECT_NEAR(y[i], 0.0f, 0.2f) << dtype_name(f.t);
        }
        // The other values of its 16 are levels of the same grid: none nearer 0.
        for (size_t j = i / 16 * 16; j < i / 16 * 16 + 16; ++j)
          EXPECT_LE(std::fabs(y[i]), std::fabs(y[j])) << dtype_name(f.t) << " " << i << " vs " << j;
        continue;
      }
      err += double(y[i] - x[i]) * (y[i] - x[i]);
      ref += double(x[i]) * x[i];
    }
    EXPECT_LT(std::sqrt(err / ref), 1.3 * f.gauss_bound) << dtype_name(f.t);
  }
}

// Importance weights: the fitted types spend their precision where the
// weights are large (the weighted error falls against the unweighted fit's);
// Q5_0/Q5_1 ignore them (same bytes).
TEST(GgmlQuantize, ImportanceWeightsSteerTheFit) {
  const std::vector<float> x = randn(2048, 11);
  std::vector<float> imp(x.size());
  std::mt19937 rng(5);
  for (float& v : imp) v = rng() % 8 == 0 ? 50.0f : 0.5f;
  for (const Format& f : kFormats) {
    const std::vector<float> plain = round_trip(f.t, x);
    const std::vector<float> weighted = round_trip(f.t, x, imp.data());
    double e_plain = 0.0, e_weighted = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      e_plain += imp[i] * double(plain[i] - x[i]) * (plain[i] - x[i]);
      e_weighted += imp[i] * double(weighted[i] - x[i]) * (weighted[i] - x[i]);
    }
    std::printf("%-6s weighted error of the weighted fit: %.3f of the plain fit's\n", dtype_name(f.t),
                e_weighted / e_plain);
    if (f.t == DType::Q5_0 || f.t == DType::Q5_1) {
      EXPECT_EQ(e_weighted, e_plain) << dtype_name(f.t);
    } else {
      EXPECT_LT(e_weighted, 0.85 * e_plain) << dtype_name(f.t);
    }
    // All-zero importance is the unweighted fit.
    const std::vector<float> zeros(x.size(), 0.0f);
    EXPECT_EQ(round_trip(f.t, x, zeros.data()), plain) << dtype_name(f.t);
  }
}

TEST(GgmlQuantize, DeterministicAndArgumentChecks) {
  const std::vector<float> x = randn(256, 9);
  for (const Format& f : kFormats) EXPECT_EQ(round_trip(f.t, x), round_trip(f.t, x)) << dtype_name(f.t);
  auto status = [&](DType t, int64_t cols) {
    std::vector<uint8_t> out(4096);
    std::vector<float> in(512, 1.0f);
    try {
      quantize_ggml_row(t, in.data(), nullptr, out.data(), cols);
    } catch (const Error& e) {
      return e.status();
    }
    return LLM_OK;
  };
  // Every GGUF block type has a quantizer; the native formats go through quant.h.
  for (const Format& f : kFormats) EXPECT_TRUE(ggml_quantizer_exists(f.t)) << dtype_name(f.t);
  for (DType t : {DType::F32, DType::F16, DType::Q8, DType::Q4, DType::Q4M}) {
    EXPECT_FALSE(ggml_quantizer_exists(t));
    EXPECT_EQ(status(t, 256), LLM_ERR_UNSUPPORTED) << dtype_name(t);
  }
  EXPECT_EQ(status(DType::Q4_K, 128), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(DType::Q2_K, 384), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(DType::IQ4_XS, 32), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(DType::Q5_0, 48), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(DType::IQ4_NL, 48), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(DType::Q6_K, 512), LLM_OK);
  EXPECT_EQ(status(DType::Q3_K, 512), LLM_OK);
  EXPECT_EQ(status(DType::IQ4_NL, 32), LLM_OK);
  // Through quantize_any_row: the group must be the block.
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_any_row(DType::Q4_K, 32, x.data(), out.data(), 256), Error);
  EXPECT_THROW(quantize_any_row(DType::Q3_K, 32, x.data(), out.data(), 256), Error);
  EXPECT_THROW(quantize_any_row(DType::IQ4_NL, 256, x.data(), out.data(), 256), Error);
  EXPECT_NO_THROW(quantize_any_row(DType::Q3_K, 256, x.data(), out.data(), 256));
  // The library's quantize_row writes the native formats only: these
  // quantizers are offline code, not in libllm.so.
  try {
    quantize_row(DType::Q4_K, 256, x.data(), out.data(), 256);
    ADD_FAILURE() << "quantize_row wrote Q4_K";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_UNSUPPORTED);
  }
}

}  // namespace
}  // namespace llm
