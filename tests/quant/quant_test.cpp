// Reference quantizers: byte equality with ggml's quantizers at group 32,
// layout and error bounds at groups 64/128, and hostile inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "format/gguf.h"
#include "quant/quant.h"

namespace llm {
namespace {

struct Vectors {
  std::vector<uint8_t> bytes;
  GgufFile g;
  const GgufTensorInfo& get(const std::string& name) const {
    for (const auto& t : g.tensors)
      if (t.name == name) return t;
    throw std::runtime_error("missing tensor " + name);
  }
};

const Vectors& vectors() {
  static const Vectors* v = [] {
    auto* p = new Vectors;
    std::ifstream f(std::string(LLM_MODELS_DIR) + "/ggml-quant-vectors.gguf", std::ios::binary);
    p->bytes.assign(std::istreambuf_iterator<char>(f), {});
    p->g = parse_gguf(p->bytes.data(), p->bytes.size());
    return p;
  }();
  return *v;
}

llm_status quantize_status(DType t, uint32_t group, int64_t cols) {
  std::vector<float> x(size_t(std::max<int64_t>(cols, 1)), 1.0f);
  std::vector<uint8_t> out(4096);
  try {
    quantize_row(t, group, x.data(), out.data(), cols);
  } catch (const Error& e) {
    return e.status();
  }
  return LLM_OK;
}

// quantize_row on source.f32 reproduces ggml_quantize_chunk's bytes exactly,
// and dequantize_row reproduces ggml's to_float exactly. Q4_1 is Q4M at group
// 32 byte for byte (GGUF Q4_1 loads natively): ggml's Q4_1 rows decode to its
// floats exactly, though our fitted quantizer chooses other bytes.
TEST(Quant, MatchesGgmlBytesAtGroup32) {
  const Vectors& v = vectors();
  const float* src = reinterpret_cast<const float*>(v.get("source.f32").data);
  struct Case {
    const char* name;
    DType t;
    uint32_t group;
    bool ggml_quantizer;  // false: the bytes are ggml's layout, the quantizer is our own (q4m's fit)
  };
  for (const Case& c : {Case{"q8_0", DType::Q8, 32, true}, Case{"q4_0", DType::Q4, 32, true},
                        Case{"q4_1", DType::Q4M, 32, false}, Case{"f16", DType::F16, 0, true},
                        Case{"bf16", DType::BF16, 0, true}}) {
    const GgufTensorInfo& q = v.get(std::string("q.") + c.name);
    const GgufTensorInfo& deq = v.get(std::string("deq.") + c.name);
    const size_t rb = dtype_row_bytes(c.t, 256, c.group);
    ASSERT_EQ(rb * 129, q.nbytes) << c.name;
    std::vector<uint8_t> row(rb);
    std::vector<float> back(256);
    int mismatched_rows = 0;
    for (int64_t r = 0; r < 129; ++r) {
      quantize_row(c.t, c.group, src + r * 256, row.data(), 256);
      mismatched_rows += std::memcmp(row.data(), q.data + size_t(r) * rb, rb) != 0;
      dequantize_row(c.t, c.group, q.data + size_t(r) * rb, back.data(), 256);
      ASSERT_EQ(std::memcmp(back.data(), deq.data + size_t(r) * 1024, 1024), 0) << c.name << " row " << r;
    }
    if (c.ggml_quantizer) {
      EXPECT_EQ(mismatched_rows, 0) << c.name;
    }
  }
}

// Q4 layout at every group: byte j of a group holds value j (low nibble)
// and value j + G/2 (high nibble); d = (signed max) / -8.
TEST(Quant, Q4LayoutAllGroups) {
  for (uint32_t g : {32u, 64u, 128u}) {
    std::vector<float> x(g);
    for (uint32_t j = 0; j < g; ++j) x[j] = float(int(j % 15) - 7);  // integers in [-7, 7]
    x[3] = -8.0f;  // the signed max: d = 1
    std::vector<uint8_t> q(dtype_row_bytes(DType::Q4, g, g));
    ASSERT_EQ(q.size(), 2 + g / 2);
    quantize_row(DType::Q4, g, x.data(), q.data(), g);
    uint16_t h;
    std::memcpy(&h, q.data(), 2);
    EXPECT_EQ(f16_to_f32(h), 1.0f);
    for (uint32_t j = 0; j < g / 2; ++j) {
      EXPECT_EQ(q[2 + j] & 0x0f, int(x[j]) + 8) << g << " " << j;
      EXPECT_EQ(q[2 + j] >> 4, int(x[j + g / 2]) + 8) << g << " " << j;
    }
    std::vector<float> y(g);
    dequantize_row(DType::Q4, g, q.data(), y.data(), g);
    for (uint32_t j = 0; j < g; ++j) EXPECT_EQ(y[j], x[j]);  // exact: integer grid, d = 1
  }
}

// Round trips on Gaussian rows: error within one step of each group's scale,
// larger groups are coarser, and several groups per row are independent.
TEST(Quant, RoundTripErrorBounds) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const int64_t cols = 512;
  std::vector<float> x(cols), y(cols);
  for (auto& v : x) v = nd(rng);
  x[100] = 0.5f;  // an outlier affects only its own group
  double prev_err = 0;
  for (uint32_t g : {32u, 64u, 128u}) {
    std::vector<uint8_t> q(dtype_row_bytes(DType::Q4, cols, g));
    quantize_row(DType::Q4, g, x.data(), q.data(), cols);
    dequantize_row(DType::Q4, g, q.data(), y.data(), cols);
    double err = 0;
    for (int64_t b = 0; b < cols / g; ++b) {
      float amax = 0;
      for (uint32_t j = 0; j < g; ++j) amax = std::max(amax, std::fabs(x[b * g + j]));
      for (uint32_t j = 0; j < g; ++j) {
        const float e = std::fabs(y[b * g + j] - x[b * g + j]);
        ASSERT_LE(e, amax / 8 * 1.01f) << g;
        err += double(e) * e;
      }
    }
    if (g > 32) {
      EXPECT_GT(err, prev_err) << g;
    }
    prev_err = err;
  }
  std::vector<uint8_t> q8(dtype_row_bytes(DType::Q8, cols, 32));
  quantize_row(DType::Q8, 32, x.data(), q8.data(), cols);
  dequantize_row(DType::Q8, 32, q8.data(), y.data(), cols);
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    for (int j = 0; j < 32; ++j) ASSERT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), amax / 127 * 0.57f);
  }
  // The group far from the outlier keeps a fine scale.
  EXPECT_LT(std::fabs(y[400] - x[400]), 0.002f);
}

TEST(Quant, FloatTypesRoundTrip) {
  const float x[4] = {1.0f, -2.5f, 65504.0f, 1e-8f};
  float y[4];
  uint8_t b[16];
  quantize_row(DType::F32, 0, x, b, 4);
  dequantize_row(DType::F32, 0, b, y, 4);
  EXPECT_EQ(std::memcmp(x, y, 16), 0);
  quantize_row(DType::F16, 0, x, b, 4);
  dequantize_row(DType::F16, 0, b, y, 4);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[2], 65504.0f);
  EXPECT_EQ(y[3], 0.0f);  // below the smallest f16 subnormal
  quantize_row(DType::BF16, 0, x, b, 4);
  dequantize_row(DType::BF16, 0, b, y, 4);
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[2], 65536.0f);  // 65504 rounds up at 8 bits of mantissa
}

TEST(Quant, ZeroAndNonFiniteInputs) {
  std::vector<float> x(64, 0.0f), y(64);
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q4, 64, 64));
  quantize_row(DType::Q4, 64, x.data(), q.data(), 64);
  dequantize_row(DType::Q4, 64, q.data(), y.data(), 64);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // NaN and inf must not hit undefined float->int conversions (UBSan builds).
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  x[41] = -1e30f;
  quantize_row(DType::Q4, 64, x.data(), q.data(), 64);
  std::vector<uint8_t> q8(dtype_row_bytes(DType::Q8, 64, 32));
  quantize_row(DType::Q8, 32, x.data(), q8.data(), 64);
  for (int j = 2; j < 34; ++j) EXPECT_LE(std::abs(int(int8_t(q8[j]))), 127);
}

// Q4M layout: [f16 d][f16 m][G/2 bytes], value = d * nibble + m. A group
// that is exactly on a 16-level grid is reproduced exactly at every group size.
TEST(Quant, Q4MLayoutAndExactGrid) {
  for (uint32_t g : {32u, 64u, 128u}) {
    std::vector<float> x(g);
    for (uint32_t j = 0; j < g; ++j) x[j] = 0.5f * float(j % 16) - 3.0f;  // d = 0.5, m = -3
    std::vector<uint8_t> q(dtype_row_bytes(DType::Q4M, g, g));
    ASSERT_EQ(q.size(), 4 + g / 2);
    quantize_row(DType::Q4M, g, x.data(), q.data(), g);
    uint16_t hd, hm;
    std::memcpy(&hd, q.data(), 2);
    std::memcpy(&hm, q.data() + 2, 2);
    EXPECT_EQ(f16_to_f32(hd), 0.5f) << g;
    EXPECT_EQ(f16_to_f32(hm), -3.0f) << g;
    for (uint32_t j = 0; j < g / 2; ++j) {
      EXPECT_EQ(q[4 + j] & 0x0f, int(j % 16)) << g << " " << j;
      EXPECT_EQ(q[4 + j] >> 4, int((j + g / 2) % 16)) << g << " " << j;
    }
    std::vector<float> y(g);
    dequantize_row(DType::Q4M, g, q.data(), y.data(), g);
    for (uint32_t j = 0; j < g; ++j) EXPECT_EQ(y[j], x[j]) << g << " " << j;
  }
}

// The fitted Q4M beats plain min/max Q4M (ggml's Q4_1 rule) and Q4 on
// Gaussian rows, never loses to min/max on any group (min/max is one of its
// starting points), and importance weights shift error to unweighted columns.
TEST(Quant, Q4MFitBeatsMinMax) {
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int g = 32, groups = 400;
  double e_fit = 0, e_minmax = 0, e_q4 = 0;
  std::vector<float> x(g), y(g);
  std::vector<uint8_t> q4(dtype_row_bytes(DType::Q4, g, g));
  for (int b = 0; b < groups; ++b) {
    for (auto& v : x) v = nd(rng);
    float d, m;
    q4m_fit_group(x.data(), nullptr, g, &d, &m);
    float lo = x[0], hi = x[0];
    for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
    const float d0 = f16_to_f32(f32_to_f16((hi - lo) / 15.0f)), m0 = f16_to_f32(f32_to_f16(lo));
    double ef = 0, em = 0;
    for (float v : x) {
      const double rf = v - (d * q4m_nibble(v, d, m) + m), rm = v - (d0 * q4m_nibble(v, d0, m0) + m0);
      ef += rf * rf, em += rm * rm;
    }
    EXPECT_LE(ef, em * (1 + 1e-9)) << "group " << b;
    e_fit += ef, e_minmax += em;
    quantize_row(DType::Q4, g, x.data(), q4.data(), g);
    dequantize_row(DType::Q4, g, q4.data(), y.data(), g);
    for (int j = 0; j < g; ++j) e_q4 += double(y[j] - x[j]) * double(y[j] - x[j]);
  }
  EXPECT_LT(e_fit, 0.9 * e_minmax);
  EXPECT_LT(e_fit, 0.8 * e_q4);
  // Weight the first half 100x: its error must drop relative to unweighted.
  std::vector<float> wt(g, 1.0f);
  for (int j = 0; j < g / 2; ++j) wt[j] = 100.0f;
  double first_w = 0, first_u = 0;
  for (int b = 0; b < groups; ++b) {
    for (auto& v : x) v = nd(rng);
    float dw, mw, du, mu;
    q4m_fit_group(x.data(), wt.data(), g, &dw, &mw);
    q4m_fit_group(x.data(), nullptr, g, &du, &mu);
    for (int j = 0; j < g / 2; ++j) {
      const double rw = x[j] - (dw * q4m_nibble(x[j], dw, mw) + mw), ru = x[j] - (du * q4m_nibble(x[j], du, mu) + mu);
      first_w += rw * rw, first_u += ru * ru;
    }
  }
  EXPECT_LT(first_w, 0.95 * first_u);
}

TEST(Quant, Q4MConstantAndNonFiniteGroups) {
  std::vector<float> x(32, 0.25f), y(32);
  std::vector<uint8_t> q(dtype_row_bytes(DType::Q4M, 32, 32));
  quantize_row(DType::Q4M, 32, x.data(), q.data(), 32);
  dequantize_row(DType::Q4M, 32, q.data(), y.data(), 32);
  for (float v : y) EXPECT_EQ(v, 0.25f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[7] = -std::numeric_limits<float>::infinity();
  x[9] = 1.0f;
  quantize_row(DType::Q4M, 32, x.data(), q.data(), 32);
  dequantize_row(DType::Q4M, 32, q.data(), y.data(), 32);
  EXPECT_NEAR(y[9], 1.0f, 0.05f);
  EXPECT_NEAR(y[0], 0.25f, 0.05f);
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

TEST(Quant, InvalidArguments) {
  EXPECT_EQ(quantize_status(DType::Q4M, 32, 48), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q4M, 128, 256), LLM_OK);
  EXPECT_EQ(quantize_status(DType::Q4, 32, 48), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q4, 16, 64), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q4, 256, 256), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q8, 64, 64), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q8, 32, 33), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType(9), 0, 4), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(quantize_status(DType::Q4, 128, 256), LLM_OK);
  EXPECT_EQ(quantize_status(DType::Q8, 32, 0), LLM_OK);
}

}  // namespace
}  // namespace llm
