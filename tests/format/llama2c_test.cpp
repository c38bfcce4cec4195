// llama2.c checkpoint + tokenizer reader, against the README's facts about
// stories260K.bin / tok512.bin and the Llama 2 tokenizer.bin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/llama2c.h"
#include "tmp.h"
#include "status_of.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

using llm::testing::tmp_path;

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

using llm::testing::status_of;

const char kSpace[] = "\xE2\x96\x81";

}  // namespace

TEST(Llama2c, Stories260KConfigAndTensors) {
  llm::ModelSource src = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  const llm::ModelConfig& c = src.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);

  // 1 embedding + 9 per layer + final norm; shared classifier -> no output.weight.
  EXPECT_EQ(src.tensors.size(), size_t(1 + 9 * 5 + 1));
  EXPECT_EQ(src.find("output.weight"), nullptr);
  const llm::TensorData* emb = src.find("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(emb->nbytes, size_t(512 * 64 * 4));
  // Zero copy: the embedding starts right after the 28-byte header of the mapping.
  ASSERT_TRUE(src.file);
  EXPECT_EQ(emb->data, src.file->data() + 28);

  const std::vector<uint8_t> raw = slurp(model_path("stories260K.bin"));
  ASSERT_EQ(raw.size(), size_t(28 + 4 * 264128));
  // Spot-check the offset of a late tensor by recomputing it from the README's order.
  size_t off = 28 + 4 * (512 * 64 + 5 * 64 + 5 * 64 * 64 + 2 * 5 * 32 * 64 + 5 * 64 * 64 + 5 * 64);
  off += 4 * (size_t(2) * 172 * 64);                 // layers 0, 1 of w1
  const llm::TensorData* g2 = src.find("blk.2.ffn_gate.weight");
  ASSERT_NE(g2, nullptr);
  EXPECT_EQ(g2->shape, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(0, std::memcmp(g2->data, raw.data() + off, g2->nbytes));
  const llm::TensorData* d4 = src.find("blk.4.ffn_down.weight");
  ASSERT_NE(d4, nullptr);
  EXPECT_EQ(d4->shape, (std::vector<int64_t>{64, 172}));
  const llm::TensorData* k3 = src.find("blk.3.attn_k.weight");
  ASSERT_NE(k3, nullptr);
  EXPECT_EQ(k3->shape, (std::vector<int64_t>{32, 64}));
  const llm::TensorData* norm = src.find("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{64}));
  // rms weights of a trained model are positive and O(1); a misplaced
  // pointer would land in a matrix of small signed values.
  float w0;
  std::memcpy(&w0, norm->data, 4);
  EXPECT_GT(w0, 0.1f);
  // Every tensor lies within the mapping and tensors do not overlap.
  size_t total = 0;
  for (const auto& t : src.tensors) {
    EXPECT_EQ(t.dtype, llm::DType::F32);
    EXPECT_EQ(t.nbytes, size_t(t.numel()) * 4);
    EXPECT_GE(t.data, src.file->data() + 28);
    EXPECT_LE(t.data + t.nbytes, src.file->data() + src.file->size());
    total += t.nbytes;
  }
  EXPECT_EQ(total, size_t(4) * (264128 - 2 * 512 * 4));  // all but freq_cis
}

TEST(Llama2c, Tok512Vocab) {
  const std::vector<uint8_t> bytes = slurp(model_path("tok512.bin"));
  llm::VocabData v = llm::parse_llama2c_tokenizer(bytes.data(), bytes.size(), 512);
  ASSERT_EQ(v.tokens.size(), size_t(512));
  ASSERT_EQ(v.scores.size(), size_t(512));
  ASSERT_EQ(v.types.size(), size_t(512));
  EXPECT_EQ(v.model, "llama");
  EXPECT_TRUE(v.add_bos);
  EXPECT_TRUE(v.add_space_prefix);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.types[0], int32_t(llm::TokenType::Unknown));
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.types[1], int32_t(llm::TokenType::Control));
  EXPECT_EQ(v.types[2], int32_t(llm::TokenType::Control));
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  for (int b = 0; b < 256; ++b) {
    char want[8];
    std::snprintf(want, sizeof want, "<0x%02X>", b);
    EXPECT_EQ(v.tokens[size_t(3 + b)], want);
    EXPECT_EQ(v.types[size_t(3 + b)], int32_t(llm::TokenType::Byte));
  }
  EXPECT_EQ(v.tokens[410], kSpace);
  EXPECT_EQ(v.types[410], int32_t(llm::TokenType::Normal));
  // Merge scores start at 259 with 0, -1, -2, ...
  EXPECT_FLOAT_EQ(v.scores[259], 0.0f);
  EXPECT_FLOAT_EQ(v.scores[260], -1.0f);
  EXPECT_FLOAT_EQ(v.scores[261], -2.0f);
  // " Once" is id 403 and must read as "▁Once".
  EXPECT_EQ(v.tokens[403], std::string(kSpace) + "Once");
  // No raw space survives anywhere.
  for (const auto& t : v.tokens) EXPECT_EQ(t.find(' '), std::string::npos) << t;
}

TEST(Llama2c, Llama2Tokenizer32000) {
  const std::vector<uint8_t> bytes = slurp(model_path("llama2_tokenizer.bin"));
  llm::VocabData v = llm::parse_llama2c_tokenizer(bytes.data(), bytes.size(), 32000);
  ASSERT_EQ(v.tokens.size(), size_t(32000));
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ(v.tokens[3], "<0x00>");
  EXPECT_EQ(v.tokens[258], "<0xFF>");
  EXPECT_EQ(v.types[258], int32_t(llm::TokenType::Byte));
  // Llama 2: id 29871 is "▁", 450 is "▁The".
  EXPECT_EQ(v.tokens[29871], kSpace);
  EXPECT_EQ(v.tokens[450], std::string(kSpace) + "The");
  int n_byte = 0, n_ctrl = 0, n_unk = 0;
  for (int32_t t : v.types) {
    n_byte += t == int32_t(llm::TokenType::Byte);
    n_ctrl += t == int32_t(llm::TokenType::Control);
    n_unk += t == int32_t(llm::TokenType::Unknown);
  }
  EXPECT_EQ(n_byte, 256);
  EXPECT_EQ(n_ctrl, 2);
  EXPECT_EQ(n_unk, 1);
}

TEST(Llama2c, TokenizerTruncationIsFormatError) {
  const std::vector<uint8_t> bytes = slurp(model_path("tok512.bin"));
  // Every cut point short of the full file must be rejected cleanly.
  for (size_t cut = 0; cut < bytes.size(); cut += (cut < 64 ? 1 : 97)) {
    EXPECT_EQ(status_of([&] { llm::parse_llama2c_tokenizer(bytes.data(), cut, 512); }), LLM_ERR_FORMAT) << cut;
  }
  // A token length pointing past the end.
  std::vector<uint8_t> bad = bytes;
  const int32_t huge = 0x7fffffff;
  std::memcpy(bad.data() + 4 + 4, &huge, 4);  // token 0's len
  EXPECT_EQ(status_of([&] { llm::parse_llama2c_tokenizer(bad.data(), bad.size(), 512); }), LLM_ERR_FORMAT);
  const int32_t neg = -5;
  std::memcpy(bad.data() + 4 + 4, &neg, 4);
  EXPECT_EQ(status_of([&] { llm::parse_llama2c_tokenizer(bad.data(), bad.size(), 512); }), LLM_ERR_FORMAT);
  // Asking for more tokens than the file holds.
  EXPECT_EQ(status_of([&] { llm::parse_llama2c_tokenizer(bytes.data(), bytes.size(), 513); }), LLM_ERR_FORMAT);
}

TEST(Llama2c, CheckpointValidation) {
  const std::vector<uint8_t> bytes = slurp(model_path("stories260K.bin"));
  EXPECT_TRUE(llm::looks_like_llama2c(bytes.data(), bytes.size()));
  EXPECT_FALSE(llm::looks_like_llama2c(bytes.data(), bytes.size() - 4));
  EXPECT_FALSE(llm::looks_like_llama2c(bytes.data(), 20));
  const std::string tok = model_path("tok512.bin");

  // One float short / one float long.
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 4);
  spit(tmp_path("l2c_short.bin"), cut);
  EXPECT_EQ(status_of([&] { llm::read_llama2c(tmp_path("l2c_short.bin"), tok); }), LLM_ERR_FORMAT);
  std::vector<uint8_t> longer = bytes;
  longer.resize(bytes.size() + 4);
  spit(tmp_path("l2c_long.bin"), longer);
  EXPECT_EQ(status_of([&] { llm::read_llama2c(tmp_path("l2c_long.bin"), tok); }), LLM_ERR_FORMAT);

  // Negative vocab (separate classifier) without the extra wcls bytes.
  std::vector<uint8_t> neg = bytes;
  const int32_t nv = -512;
  std::memcpy(neg.data() + 20, &nv, 4);
  EXPECT_FALSE(llm::looks_like_llama2c(neg.data(), neg.size()));
  spit(tmp_path("l2c_neg.bin"), neg);
  EXPECT_EQ(status_of([&] { llm::read_llama2c(tmp_path("l2c_neg.bin"), tok); }), LLM_ERR_FORMAT);

  // Absurd header values: rejected, no allocation, no crash.
  const int32_t fields[][2] = {{0, 0}, {0, -64}, {2, 0}, {3, 7}, {4, 3}, {4, 16}, {6, 0}, {5, INT32_MIN},
                               {0, 0x7fffffff}, {2, 0x7fffffff}};
  for (const auto& f : fields) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + 28);
    std::memcpy(b.data() + 4 * f[0], &f[1], 4);
    EXPECT_FALSE(llm::looks_like_llama2c(b.data(), b.size()));
    spit(tmp_path("l2c_bad.bin"), b);
    EXPECT_EQ(status_of([&] { llm::read_llama2c(tmp_path("l2c_bad.bin"), tok); }), LLM_ERR_FORMAT)
        << "field " << f[0] << " = " << f[1];
  }
}

TEST(Llama2c, SeparateClassifier) {
  // Build a checkpoint with vocab_size < 0: the same weights plus a wcls
  // array; output.weight must point at the trailing bytes.
  std::vector<uint8_t> bytes = slurp(model_path("stories260K.bin"));
  const int32_t nv = -512;
  std::memcpy(bytes.data() + 20, &nv, 4);
  const size_t base = bytes.size();
  bytes.resize(base + 512 * 64 * 4);
  for (size_t i = 0; i < 512 * 64; ++i) {
    const float x = float(i) * 0.25f;
    std::memcpy(bytes.data() + base + 4 * i, &x, 4);
  }
  spit(tmp_path("l2c_wcls.bin"), bytes);
  llm::ModelSource src = llm::read_llama2c(tmp_path("l2c_wcls.bin"), model_path("tok512.bin"));
  const llm::TensorData* out = src.find("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->shape, (std::vector<int64_t>{512, 64}));
  float x;
  std::memcpy(&x, out->data + 4 * 1001, 4);
  EXPECT_EQ(x, 1001 * 0.25f);
  EXPECT_EQ(src.config.vocab_size, 512);
}

TEST(Llama2c, MissingFilesAreIoErrors) {
  EXPECT_EQ(status_of([&] { llm::read_llama2c(tmp_path("does_not_exist.bin"), model_path("tok512.bin")); }),
            LLM_ERR_IO);
  EXPECT_EQ(status_of([&] { llm::read_llama2c(model_path("stories260K.bin"), tmp_path("nope.bin")); }), LLM_ERR_IO);
}
