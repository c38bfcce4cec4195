// Quantized KV against f16 KV on the real model: teacher-forced top-1
// agreement over the reference continuations (each case from BOS).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llm.h"
#include "reference.h"

namespace {

size_t argmax(const float* l, size_t n) {
  size_t b = 0;
  for (size_t i = 1; i < n; ++i)
    if (l[i] > l[b]) b = i;
  return b;
}

// Fraction of positions where sessions with kv types a and b predict the same next token.
double agreement(llm_model* m, llm_kv_type a, llm_kv_type b, size_t* positions) {
  size_t same = 0, total = 0;
  for (const char* file : {"stories260K_greedy.json", "stories260K_q8_0_greedy.json", "stories260K_q4_0_greedy.json"}) {
    for (const auto& c : llm::testing::load_greedy_cases(file)) {
      std::vector<int32_t> seq = c.prompt_ids;
      seq.insert(seq.end(), c.generated_ids.begin(), c.generated_ids.end());
      llm_session* s[2] = {nullptr, nullptr};
      for (int k = 0; k < 2; ++k) {
        llm_session_params p;
        llm_session_params_init(&p);
        p.kv_type = k == 0 ? a : b;
        EXPECT_EQ(llm_session_create(m, &p, &s[k]), LLM_OK);
      }
      for (size_t i = 0; i + 1 < seq.size(); ++i) {
        size_t best[2];
        for (int k = 0; k < 2; ++k) {
          EXPECT_EQ(llm_prefill(s[k], &seq[i], 1), LLM_OK);
          const float* l = nullptr;
          size_t n = 0;
          EXPECT_EQ(llm_logits(s[k], &l, &n), LLM_OK);
          best[k] = argmax(l, n);
        }
        same += best[0] == best[1];
        ++total;
      }
      llm_session_free(s[0]);
      llm_session_free(s[1]);
    }
  }
  *positions = total;
  return double(same) / double(total);
}

}  // namespace

TEST(KvQuality, Int8AgreesWithF16OnTheReferenceContinuations) {
  llm_load_params lp;
  llm_load_params_init(&lp);
  lp.flags = LLM_LOAD_REFERENCE_MATH;  // isolate the KV storage from activation quantization
  lp.n_threads = 1;
  llm_model* m = nullptr;
  ASSERT_EQ(llm_load(llm::testing::model_path("stories260K.gguf").c_str(), &lp, &m), LLM_OK);
  size_t n = 0;
  const double int8 = agreement(m, LLM_KV_F16, LLM_KV_INT8, &n);
  EXPECT_GT(n, 800u);
  EXPECT_GE(int8, 0.995) << "int8 KV top-1 agreement with f16 KV over " << n << " positions";
  // int4 is reported, not required; it must still be far better than chance.
  const double int4 = agreement(m, LLM_KV_F16, LLM_KV_INT4, &n);
  EXPECT_GE(int4, 0.80);
  RecordProperty("int8_agreement", std::to_string(int8));
  RecordProperty("int4_agreement", std::to_string(int4));
  llm_model_free(m);
}
