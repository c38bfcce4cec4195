// Every supported family against llama.cpp, on tiny random-weight GGUFs
// (tests/data/families/, made by tests/tools/make_family_refs.sh): at every
// position of 3 prompts (one longer than the family's sliding window), the
// logits agree within 1e-3 of the reference's logit range (max abs
// difference), and the 32 greedy ids are identical. Through the public C API
// with f32 math (LLM_LOAD_REFERENCE_MATH) and an f32 KV cache, as the
// references were made (F32 weights, F32 KV cache in llama.cpp).
//   - decode path: the prompt one token at a time, logits after each;
//   - prefill path: the whole prompt in one llm_prefill, last logits;
//   - greedy: llm_decode_step for 32 steps after the prefill.
#include <gtest/gtest.h>
#include <llm.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "engine/session.h"
#include "format/family_spec.h"
#include "format/gguf.h"
#include "model/model.h"
#include "convert/llm_file_writer.h"
#include "block_spec_eq.h"
#include "relative_error.h"

namespace {

std::string data_dir() { return std::string(LLM_TEST_DATA_DIR) + "/families/"; }

using llm::testing::relative_error;

class Family : public ::testing::TestWithParam<const char*> {};

// The same checks on each backend: the CPU, and the CUDA backend where a
// device is visible (tests/gpu/device_check.sh runs these; they skip elsewhere).
class FamilyOn : public ::testing::TestWithParam<std::tuple<const char*, llm_device>> {
 protected:
  void SetUp() override {
    std::string why;
    if (device() == LLM_DEVICE_CUDA && llm::cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
  std::string name() const { return std::get<0>(GetParam()); }
  llm_device device() const { return std::get<1>(GetParam()); }
};

TEST_P(FamilyOn, LogitsAndGreedyMatchLlamaCpp) {
  const std::string name = this->name();
  std::ifstream f(data_dir() + name + ".json");
  ASSERT_TRUE(f.good()) << name;
  const nlohmann::json ref = nlohmann::json::parse(f);
  const std::string path = data_dir() + ref.at("model_file").get<std::string>();
  llm_load_params lp;
  llm_load_params_init(&lp);
  lp.device = device();
  lp.flags |= LLM_LOAD_REFERENCE_MATH;
  llm_model* m = nullptr;
  ASSERT_EQ(llm_load(path.c_str(), &lp, &m), LLM_OK) << llm_last_error();
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.kv_type = LLM_KV_F32;

  double worst = 0;
  size_t positions = 0;
  for (const auto& c : ref.at("cases")) {
    const auto prompt = c.at("prompt_token_ids").get<std::vector<llm_token>>();
    const auto prompt_logits = c.at("prompt_logits").get<std::vector<std::vector<float>>>();
    const auto gen = c.at("generated_token_ids").get<std::vector<llm_token>>();
    const auto gen_logits = c.at("generated_logits").get<std::vector<std::vector<float>>>();
    ASSERT_EQ(prompt_logits.size(), prompt.size());
    SCOPED_TRACE(name + ", prompt of " + std::to_string(prompt.size()) + " tokens");

    // Decode path: one token at a time over the prompt and the greedy continuation.
    llm_session* s = nullptr;
    ASSERT_EQ(llm_session_create(m, &sp, &s), LLM_OK) << llm_last_error();
    std::vector<llm_token> seq = prompt;
    seq.insert(seq.end(), gen.begin(), gen.end() - 1);
    for (size_t i = 0; i < seq.size(); ++i) {
      ASSERT_EQ(llm_prefill(s, &seq[i], 1), LLM_OK) << llm_last_error();
      const float* lg = nullptr;
      size_t nv = 0;
      ASSERT_EQ(llm_logits(s, &lg, &nv), LLM_OK);
      const std::vector<float>& want = i < prompt.size() ? prompt_logits[i] : gen_logits[i - prompt.size()];
      ASSERT_EQ(nv, want.size());
      const double e = relative_error(lg, want);
      worst = std::max(worst, e);
      ++positions;
      EXPECT_LE(e, 1e-3) << "position " << i;
    }
    llm_session_free(s);

    // Prefill path and greedy decode.
    ASSERT_EQ(llm_session_create(m, &sp, &s), LLM_OK);
    ASSERT_EQ(llm_prefill(s, prompt.data(), prompt.size()), LLM_OK) << llm_last_error();
    const float* lg = nullptr;
    size_t nv = 0;
    ASSERT_EQ(llm_logits(s, &lg, &nv), LLM_OK);
    EXPECT_LE(relative_error(lg, prompt_logits.back()), 1e-3) << "prefill";
    std::vector<llm_token> got;
    for (size_t k = 0; k < gen.size(); ++k) {
      llm_token t;
      ASSERT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << llm_last_error();
      got.push_back(t);
    }
    EXPECT_EQ(got, gen) << "greedy ids";
    llm_session_free(s);
  }
  std::printf("%s: %zu positions, worst max|diff| / range = %.2e\n", name.c_str(), positions, worst);
  llm_model_free(m);
}

// Eviction re-rotates the kept keys to their new positions: a pure rotation,
// also where RoPE scales the rotated dimensions (YaRN, LongRoPE). Layer 0's
// key of a token depends only on the token and its position, so after
// evicting, every layer-0 key equals the one a fresh session computes for
// the kept tokens at those positions.
TEST_P(FamilyOn, EvictedKeysEqualFreshKeysAtTheNewPositions) {
  const std::string name = this->name();
  llm::LoadOptions o;
  o.device = device();
  o.n_threads = 1;
  o.huge_pages = false;
  o.reference_math = true;
  o.kv_prune_windows = false;  // layer 0 slides on Gemma: keep its pages to compare them
  const std::unique_ptr<llm::Model> m = llm::Model::load(data_dir() + name + ".gguf", o);
  llm::SessionOptions so;
  so.kv_type = LLM_KV_F32;
  std::vector<int32_t> toks;
  for (int i = 0; i < 30; ++i) toks.push_back(3 + (i * 53) % 500);
  const uint32_t keep = 3, drop = 11;
  llm::Session a(*m, so), b(*m, so);
  a.prefill(toks.data(), toks.size());
  a.evict(keep, drop);
  std::vector<int32_t> kept(toks.begin(), toks.begin() + keep);
  kept.insert(kept.end(), toks.begin() + keep + drop, toks.end());
  b.prefill(kept.data(), kept.size());
  ASSERT_EQ(a.n_cached(), b.n_cached());
  const int32_t hd = m->config().head_dim;
  std::vector<float> ka(static_cast<size_t>(hd)), kb(static_cast<size_t>(hd));
  double worst = 0;
  for (uint32_t slot = 0; slot < a.n_cached(); ++slot)
    for (int32_t h = 0; h < m->config().n_kv_heads; ++h) {
      a.kv_row(0, 0, h, slot, ka.data());
      b.kv_row(0, 0, h, slot, kb.data());
      float amax = 0;
      for (float v : kb) amax = std::max(amax, std::fabs(v));
      for (int32_t d = 0; d < hd; ++d) worst = std::max(worst, double(std::fabs(ka[size_t(d)] - kb[size_t(d)]) / (1.f + amax)));
    }
  EXPECT_LE(worst, 2e-5) << name;
}

#define LLM_FAMILY_NAMES                                                                                   \
  "llama", "llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2_yarn", "phi3_longrope"

INSTANTIATE_TEST_SUITE_P(LlamaCpp, Family, ::testing::Values(LLM_FAMILY_NAMES),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

INSTANTIATE_TEST_SUITE_P(LlamaCpp, FamilyOn,
                         ::testing::Combine(::testing::Values(LLM_FAMILY_NAMES),
                                            ::testing::Values(LLM_DEVICE_CPU, LLM_DEVICE_CUDA)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, llm_device>>& i) {
                           return std::string(std::get<0>(i.param)) +
                                  (std::get<1>(i.param) == LLM_DEVICE_CUDA ? "_Cuda" : "");
                         });

}  // namespace

// ---------------------------------------------------------------------------
// The block spec survives the native format: each family's GGUF written as
// .llm (format/llm_file.h) loads with the same spec and gives bit-identical
// logits.

namespace {

TEST_P(Family, SpecSurvivesTheLlmFormat) {
  const std::string name = GetParam();
  const std::string gguf = data_dir() + name + ".gguf";
  const std::string out = std::string(LLM_TEST_TMPDIR) + "/family-" + name + ".llm";
  llm::write_llm(llm::read_gguf(gguf, false, nullptr), out);
  llm::LoadOptions o;
  o.n_threads = 1;
  o.huge_pages = false;
  const std::unique_ptr<llm::Model> a = llm::Model::load(gguf, o), b = llm::Model::load(out, o);
  EXPECT_EQ(a->config().arch, b->config().arch);
  llm::testing::expect_same_block_spec(a->spec(), b->spec());
  EXPECT_EQ(a->spec().norm_offset, b->spec().norm_offset);
  // Only the plain Llama block is what the offline calibration passes run;
  // every other family names the first feature it adds.
  EXPECT_EQ(llm::non_llama_feature(llm::read_gguf(gguf, false, nullptr)).empty(), name == "llama");
  llm::Session s1(*a, llm::SessionOptions()), s2(*b, llm::SessionOptions());
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back(3 + (i * 37) % 500);
  s1.prefill(toks.data(), toks.size());
  s2.prefill(toks.data(), toks.size());
  const int32_t nv = a->config().vocab_size;
  EXPECT_EQ(std::vector<float>(s1.logits(), s1.logits() + nv), std::vector<float>(s2.logits(), s2.logits() + nv));
  std::remove(out.c_str());
}

}  // namespace
