// The llama2.c reader against the GGUF reader on the same models: the README
// states stories260K.gguf is bit-identical to stories260K.bin, and that the
// GGUF vocabularies equal tok512 / the Llama 2 tokenizer.bin.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/llama2c.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void expect_same_vocab(const llm::VocabData& a, const llm::VocabData& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  size_t token_diff = 0, score_diff = 0, type_diff = 0;
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    if (a.tokens[i] != b.tokens[i] && token_diff++ < 5)
      ADD_FAILURE() << "token " << i << ": " << a.tokens[i] << " vs " << b.tokens[i];
    if (a.scores[i] != b.scores[i] && score_diff++ < 5)
      ADD_FAILURE() << "score " << i << ": " << a.scores[i] << " vs " << b.scores[i];
    if (a.types[i] != b.types[i] && type_diff++ < 5)
      ADD_FAILURE() << "type " << i << ": " << a.types[i] << " vs " << b.types[i];
  }
  EXPECT_EQ(token_diff + score_diff + type_diff, 0u);
  EXPECT_EQ(a.bos, b.bos);
  EXPECT_EQ(a.eos, b.eos);
  EXPECT_EQ(a.model, b.model);
}

}  // namespace

TEST(Llama2cVsGguf, Stories260KTensorsBitIdentical) {
  const llm::ModelSource bin = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  const llm::ModelSource gg = llm::read_gguf(model_path("stories260K.gguf"), false, nullptr);
  EXPECT_EQ(bin.config.dim, gg.config.dim);
  EXPECT_EQ(bin.config.hidden_dim, gg.config.hidden_dim);
  EXPECT_EQ(bin.config.n_layers, gg.config.n_layers);
  EXPECT_EQ(bin.config.n_heads, gg.config.n_heads);
  EXPECT_EQ(bin.config.n_kv_heads, gg.config.n_kv_heads);
  EXPECT_EQ(bin.config.head_dim, gg.config.head_dim);
  EXPECT_EQ(bin.config.vocab_size, gg.config.vocab_size);
  for (const auto& t : bin.tensors) {
    const llm::TensorData* g = gg.find(t.name);
    ASSERT_NE(g, nullptr) << t.name;
    EXPECT_EQ(g->dtype, llm::DType::F32) << t.name;
    EXPECT_EQ(g->shape, t.shape) << t.name;
    ASSERT_EQ(g->nbytes, t.nbytes) << t.name;
    EXPECT_EQ(0, std::memcmp(g->data, t.data, t.nbytes)) << t.name;
  }
  // The GGUF stores the tied classifier as a copy of the embedding.
  const llm::TensorData* out = gg.find("output.weight");
  ASSERT_NE(out, nullptr);
  const llm::TensorData* emb = bin.find("token_embd.weight");
  ASSERT_EQ(out->nbytes, emb->nbytes);
  EXPECT_EQ(0, std::memcmp(out->data, emb->data, emb->nbytes));
  EXPECT_EQ(gg.tensors.size(), bin.tensors.size() + 1);
}

TEST(Llama2cVsGguf, Tok512EqualsGgufVocab) {
  const std::vector<uint8_t> tok = slurp(model_path("tok512.bin"));
  const llm::VocabData v = llm::parse_llama2c_tokenizer(tok.data(), tok.size(), 512);
  const llm::ModelSource gg = llm::read_gguf(model_path("stories260K.gguf"), true, nullptr);
  expect_same_vocab(v, gg.vocab);
}

TEST(Llama2cVsGguf, Llama2TokenizerEqualsGgufVocab) {
  const std::vector<uint8_t> tok = slurp(model_path("llama2_tokenizer.bin"));
  const llm::VocabData v = llm::parse_llama2c_tokenizer(tok.data(), tok.size(), 32000);
  const llm::ModelSource gg = llm::read_gguf(model_path("ggml-vocab-llama-spm.gguf"), true, nullptr);
  expect_same_vocab(v, gg.vocab);
}
