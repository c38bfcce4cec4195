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
// and dequantize_row reproduces ggml's to_float exactly.
TEST(Quant, MatchesGgmlBytesAtGroup32) {
  const Vectors& v = vectors();
  const float* src = reinterpret_cast<const float*>(v.get("source.f32").data);
  struct Case {
    const char* name;
    DType t;
    uint32_t group;
  };
  for (const Case& c : {Case{"q8_0", DType::Q8, 32}, Case{"q4_0", DType::Q4, 32}, Case{"f16", DType::F16, 0},
                        Case{"bf16", DType::BF16, 0}}) {
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
    EXPECT_EQ(mismatched_rows, 0) << c.name;
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

TEST(Quant, InvalidArguments) {
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
