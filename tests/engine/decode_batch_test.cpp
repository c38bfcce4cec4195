// llm_decode_batch: same tokens as stepping each session alone; argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llm.h"
#include "reference.h"

namespace {

llm_model* load() {
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(llm::testing::model_path("stories260K.gguf").c_str(), nullptr, &m), LLM_OK);
  return m;
}

llm_session* start(llm_model* m, const std::string& prompt) {
  llm_session* s = nullptr;
  EXPECT_EQ(llm_session_create(m, nullptr, &s), LLM_OK);
  llm_token t[64];
  size_t n = 0;
  EXPECT_EQ(llm_tokenize(m, prompt.data(), prompt.size(), LLM_TOKENIZE_ADD_BOS, t, 64, &n), LLM_OK);
  EXPECT_EQ(llm_prefill(s, t, n), LLM_OK);
  return s;
}

}  // namespace

TEST(DecodeBatch, EqualsSteppingEachSessionAlone) {
  llm_model* m = load();
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a", "Tom and Sam went"};
  std::vector<llm_session*> batch, alone;
  for (const auto& p : prompts) {
    batch.push_back(start(m, p));
    alone.push_back(start(m, p));
  }
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 0.9f;
  samp.seed = 5;
  for (int step = 0; step < 25; ++step) {
    std::vector<llm_token> got(prompts.size());
    ASSERT_EQ(llm_decode_batch(batch.data(), batch.size(), &samp, got.data()), LLM_OK) << llm_last_error();
    for (size_t i = 0; i < prompts.size(); ++i) {
      llm_token want;
      ASSERT_EQ(llm_decode_step(alone[i], &samp, &want), LLM_OK);
      ASSERT_EQ(got[i], want) << "session " << i << " step " << step;
    }
  }
  for (auto* s : batch) llm_session_free(s);
  for (auto* s : alone) llm_session_free(s);
  llm_model_free(m);
}

TEST(DecodeBatch, RejectsDuplicatesForeignModelsAndNulls) {
  llm_model* m1 = load();
  llm_model* m2 = load();
  llm_session* a = start(m1, "Lily had a");
  llm_session* b = start(m2, "Lily had a");
  llm_token out[2] = {7, 7};
  llm_session* dup[2] = {a, a};
  EXPECT_EQ(llm_decode_batch(dup, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()), "");
  EXPECT_EQ(out[0], -1);
  llm_session* mixed[2] = {a, b};
  EXPECT_EQ(llm_decode_batch(mixed, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session* withnull[2] = {a, nullptr};
  EXPECT_EQ(llm_decode_batch(withnull, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_decode_batch(nullptr, 0, nullptr, nullptr), LLM_OK);
  // Nothing advanced: a's next greedy token is still the first one.
  llm_session* fresh = start(m1, "Lily had a");
  llm_token x, y;
  ASSERT_EQ(llm_decode_step(a, nullptr, &x), LLM_OK);
  ASSERT_EQ(llm_decode_step(fresh, nullptr, &y), LLM_OK);
  EXPECT_EQ(x, y);
  for (auto* s : {a, b, fresh}) llm_session_free(s);
  llm_model_free(m1);
  llm_model_free(m2);
}
