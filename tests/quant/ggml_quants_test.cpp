// ggml block decoders against ggml's own to_float output
// (ggml-quant-vectors.gguf: q.<type> = ggml_quantize_chunk(source), deq.<type> = to_float(q.<type>)).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "format/gguf.h"
#include "quant/ggml_quants.h"

namespace llm {
namespace {

class GgmlVectors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream f(std::string(LLM_MODELS_DIR) + "/ggml-quant-vectors.gguf", std::ios::binary);
    bytes_ = new std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
    file_ = new GgufFile(parse_gguf(bytes_->data(), bytes_->size()));
  }
  static void TearDownTestSuite() {
    delete file_;
    delete bytes_;
  }
  static const GgufTensorInfo& get(const std::string& name) {
    for (const auto& t : file_->tensors)
      if (t.name == name) return t;
    throw std::runtime_error("missing tensor " + name);
  }
  static std::vector<uint8_t>* bytes_;
  static GgufFile* file_;
};
std::vector<uint8_t>* GgmlVectors::bytes_ = nullptr;
GgufFile* GgmlVectors::file_ = nullptr;

struct TypeCase {
  const char* name;
  GgmlType type;
};

const TypeCase kTypes[] = {
    {"f16", GgmlType::F16},   {"bf16", GgmlType::BF16}, {"q8_0", GgmlType::Q8_0}, {"q4_0", GgmlType::Q4_0},
    {"q4_1", GgmlType::Q4_1}, {"q5_0", GgmlType::Q5_0}, {"q5_1", GgmlType::Q5_1}, {"q2_K", GgmlType::Q2_K},
    {"q3_K", GgmlType::Q3_K}, {"q4_K", GgmlType::Q4_K}, {"q5_K", GgmlType::Q5_K}, {"q6_K", GgmlType::Q6_K},
    {"iq4_nl", GgmlType::IQ4_NL},
};

// Every decoded float is bit-identical to ggml's (memcmp, so -0.0 and NaN
// payloads count too).
TEST_F(GgmlVectors, DecodeMatchesGgmlBitForBit) {
  const int64_t n = 256 * 129;
  for (const TypeCase& c : kTypes) {
    const GgufTensorInfo& q = get(std::string("q.") + c.name);
    const GgufTensorInfo& deq = get(std::string("deq.") + c.name);
    ASSERT_EQ(q.type, c.type) << c.name;
    ASSERT_EQ(deq.type, GgmlType::F32);
    ASSERT_EQ(q.nbytes, ggml_type_size(c.type, n));
    std::vector<float> out(size_t(n), -1.0f);
    dequantize_ggml(c.type, q.data, out.data(), n);
    ASSERT_EQ(deq.nbytes, out.size() * 4);
    EXPECT_EQ(std::memcmp(out.data(), deq.data, deq.nbytes), 0) << c.name;
    // Row by row gives the same result (decoders carry no state across blocks).
    const size_t rb = ggml_type_size(c.type, 256);
    std::vector<float> row(256);
    for (int64_t r = 0; r < 129; r += 32) {
      dequantize_ggml(c.type, q.data + size_t(r) * rb, row.data(), 256);
      EXPECT_EQ(std::memcmp(row.data(), out.data() + r * 256, 256 * 4), 0) << c.name << " row " << r;
    }
  }
}

// The decoders are not trivially right: the all-zero source row decodes to
// zeros and real rows do not, and the 4-bit types stay within their steps.
TEST_F(GgmlVectors, DecodedValuesAreCloseToTheSource) {
  const GgufTensorInfo& src = get("source.f32");
  const float* x = reinterpret_cast<const float*>(src.data);
  for (const TypeCase& c : kTypes) {
    std::vector<float> out(256 * 129);
    dequantize_ggml(c.type, get(std::string("q.") + c.name).data, out.data(), 256 * 129);
    double err = 0, ref = 0;
    for (size_t i = 0; i < 256 * 128; ++i) {
      err += double(out[i] - x[i]) * (out[i] - x[i]);
      ref += double(x[i]) * x[i];
    }
    for (size_t i = 256 * 128; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f) << c.name;
    EXPECT_LT(err / ref, 0.15) << c.name;  // q2_K is the coarsest (~0.1)
    EXPECT_GT(ref, 0.0);
  }
}

TEST(GgmlQuants, BlockSizesAndErrors) {
  EXPECT_EQ(ggml_block_size(GgmlType::F32), 1);
  EXPECT_EQ(ggml_block_size(GgmlType::Q4_0), 32);
  EXPECT_EQ(ggml_block_size(GgmlType::Q6_K), 256);
  EXPECT_EQ(ggml_block_size(GgmlType(77)), 0);
  std::vector<uint8_t> b(1024, 0);
  std::vector<float> y(512);
  auto status = [&](GgmlType t, int64_t n) {
    try {
      dequantize_ggml(t, b.data(), y.data(), n);
    } catch (const Error& e) {
      return e.status();
    }
    return LLM_OK;
  };
  EXPECT_EQ(status(GgmlType::Q4_K, 128), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(GgmlType::Q4_0, 48), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status(GgmlType(77), 32), LLM_ERR_UNSUPPORTED);
  EXPECT_EQ(status(GgmlType::Q8_K, 256), LLM_OK);
  EXPECT_EQ(status(GgmlType::Q8_1, 32), LLM_OK);
}

// IQ4_XS is not in the vectors file: random blocks against the format's
// definition, evaluated with ggml's float expression (d * (ls - 32)) * value.
// (Checked once against ggml's own dequantize_row_iq4_xs, libggml-base of
// llama.cpp 0.5.0: identical bits on 4096 random blocks.)
TEST(GgmlQuants, Iq4XsBlocks) {
  static const int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::mt19937 rng(21);
  std::vector<uint8_t> b(136 * 5);
  for (auto& v : b) v = uint8_t(rng());
  for (int blk = 0; blk < 5; ++blk) {
    const uint16_t d = uint16_t(0x2000 + rng() % 0x1000);  // small positive halves
    std::memcpy(&b[size_t(blk) * 136], &d, 2);
  }
  EXPECT_EQ(ggml_type_size(GgmlType::IQ4_XS, 256), 136u);
  EXPECT_EQ(ggml_block_size(GgmlType::IQ4_XS), 256);
  std::vector<float> y(256 * 5);
  dequantize_ggml(GgmlType::IQ4_XS, b.data(), y.data(), 256 * 5);
  for (int blk = 0; blk < 5; ++blk) {
    const uint8_t* p = &b[size_t(blk) * 136];
    uint16_t dh, sh;
    std::memcpy(&dh, p, 2);
    std::memcpy(&sh, p + 2, 2);
    const float d = f16_to_f32(dh);
    for (int i = 0; i < 256; ++i) {
      const int ib = i / 32, j = i % 32;
      const int ls = ((p[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
      const uint8_t byte = p[8 + 16 * ib + j % 16];
      const float want = (d * float(ls - 32)) * float(kValues[j < 16 ? byte & 15 : byte >> 4]);
      ASSERT_EQ(y[size_t(blk * 256 + i)], want) << blk << " " << i;
    }
  }
}

// Q8_K and Q8_1 are not in the vectors file: hand-made blocks.
TEST(GgmlQuants, Q8KAndQ8_1Blocks) {
  std::vector<uint8_t> k(292, 0);
  const float d = 0.25f;
  std::memcpy(k.data(), &d, 4);
  for (int j = 0; j < 256; ++j) k[4 + j] = uint8_t(int8_t(j - 128));
  std::vector<float> y(256);
  dequantize_ggml(GgmlType::Q8_K, k.data(), y.data(), 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], 0.25f * float(j - 128));
  std::vector<uint8_t> b(36, 0);
  b[0] = 0x00;
  b[1] = 0x3c;  // fp16 1.0
  b[2] = 0xff;  // the sum field is ignored
  for (int j = 0; j < 32; ++j) b[4 + j] = uint8_t(int8_t(j - 16));
  dequantize_ggml(GgmlType::Q8_1, b.data(), y.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], float(j - 16));
}

}  // namespace
}  // namespace llm
