// Gemma 3 270M Q4_K_M, the real model, through the public C API with default
// settings, against greedy references from llama.cpp (f32 KV cache):
//   - the 4 cases of shared/models/reference/gemma-3-270m-q4_k_m_greedy.json;
//   - 7 cases of tests/data/gemma3/extra_greedy.json, made with the same
//     program on prompts of this repository, two of them longer than the
//     512-token sliding window of the local layers.
// Teacher-forced top-1 agreement >= 96% on both files (shared: 185 of 192
// with either kernel family; repository's: 331 of 336 AVX-512, 330 AVX2),
// every differing step at a reference margin under kMargin, and free-running
// greedy ids identical up to the first step whose reference top-1/top-2
// margin is below kMargin. llama.cpp quantizes the activations of its
// quantized matmuls its own way; on this model that moves its logits by 0.15
// on average (up to 1.8) from exact f32 math on the same weights, and its
// greedy ids are exact math's top-1 at only 185 of the shared file's 192
// steps. libllm's fast path quantizes activations more finely (matmul_ggml.h)
// and lands nearer exact math (FastPathAgreesWithExactMath below), so on
// those 7 steps it mostly picks exact math's token, not llama.cpp's: a bar
// of 98% against llama.cpp (189 steps) and one of 99% against exact math
// (191) cannot both hold there, as each of the 7 steps can match only one of
// them (189 + 191 > 2 * 185 + 7). A 0.1 margin is not enough either: a step
// of margin 0.49 differs. The exact math itself is checked against llama.cpp
// on the dequantized weights (ExactMath... below).
// The model (253 MB, Gemma terms) is fetched by tests/models/fetch_gemma3.sh;
// LLM_GEMMA3_GGUF names it, and the tests skip when it is absent.
#include <gtest/gtest.h>
#include <llm.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/session.h"
#include "model/model.h"
#include "reference.h"

namespace {

std::string gemma_path() {
  const char* p = std::getenv("LLM_GEMMA3_GGUF");
  if (!p || !*p) return "";
  std::ifstream f(p);
  return f.good() ? std::string(p) : std::string();
}

struct Case {
  std::string prompt;
  std::vector<int32_t> prompt_ids, generated;
  std::vector<float> margins;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<Case> out;
  for (const auto& c : j.at("cases")) {
    Case k;
    k.prompt = c.at("prompt").get<std::string>();
    k.prompt_ids = c.at("prompt_token_ids").get<std::vector<int32_t>>();
    k.generated = c.at("generated_token_ids").get<std::vector<int32_t>>();
    k.margins = c.at("top1_top2_margin_per_step").get<std::vector<float>>();
    out.push_back(std::move(k));
  }
  return out;
}

constexpr float kMargin = 0.6f;

// The model on the exact path (LLM_LOAD_REFERENCE_MATH, CPU); null on failure.
llm_model* load_exact() {
  llm_load_params p;
  llm_load_params_init(&p);
  p.device = LLM_DEVICE_CPU;
  p.flags |= LLM_LOAD_REFERENCE_MATH;
  llm_model* m = nullptr;
  return llm_load(gemma_path().c_str(), &p, &m) == LLM_OK ? m : nullptr;
}

int32_t argmax(const float* x, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

class Gemma3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = gemma_path();
    if (path.empty()) return;
    llm_load_params p;
    llm_load_params_init(&p);
    // Diagnosis: LLM_TEST_REFERENCE_MATH=1 runs the same checks with f32 math.
    if (std::getenv("LLM_TEST_REFERENCE_MATH")) p.flags |= LLM_LOAD_REFERENCE_MATH;
    ASSERT_EQ(llm_load(path.c_str(), &p, &model_), LLM_OK) << llm_last_error();
  }
  static void TearDownTestSuite() {
    llm_model_free(model_);
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "LLM_GEMMA3_GGUF is not set or missing (tests/models/fetch_gemma3.sh fetches it)";
  }

  // Teacher-forced agreement and free-running greedy prefix over the cases of one file.
  void check(const std::vector<Case>& cases, double min_agreement) {
    size_t agree = 0, steps = 0;
    for (const Case& c : cases) {
      SCOPED_TRACE(c.prompt.substr(0, 60));
      std::vector<llm_token> ids(c.prompt.size() + 8);
      size_t n = 0;
      ASSERT_EQ(llm_tokenize(model_, c.prompt.data(), c.prompt.size(), LLM_TOKENIZE_ADD_BOS, ids.data(), ids.size(), &n),
                LLM_OK)
          << llm_last_error();
      ids.resize(n);
      EXPECT_EQ(ids, c.prompt_ids) << "tokenization differs";

      llm_session* s = nullptr;
      ASSERT_EQ(llm_session_create(model_, nullptr, &s), LLM_OK) << llm_last_error();
      ASSERT_EQ(llm_prefill(s, c.prompt_ids.data(), c.prompt_ids.size()), LLM_OK) << llm_last_error();
      for (size_t k = 0; k < c.generated.size(); ++k) {
        const float* logits = nullptr;
        size_t n_vocab = 0;
        ASSERT_EQ(llm_logits(s, &logits, &n_vocab), LLM_OK) << llm_last_error();
        const int32_t top = argmax(logits, n_vocab);
        agree += top == c.generated[k];
        ++steps;
        if (top != c.generated[k] && c.margins[k] >= kMargin)
          ADD_FAILURE() << "step " << k << ": " << top << " where the reference has " << c.generated[k]
                        << " with margin " << c.margins[k];
        ASSERT_EQ(llm_prefill(s, &c.generated[k], 1), LLM_OK) << llm_last_error();  // teacher forcing
      }
      llm_session_free(s);

      // Free-running greedy through llm_decode_step, up to the first close call.
      ASSERT_EQ(llm_session_create(model_, nullptr, &s), LLM_OK);
      ASSERT_EQ(llm_prefill(s, c.prompt_ids.data(), c.prompt_ids.size()), LLM_OK);
      for (size_t k = 0; k < c.generated.size() && c.margins[k] >= kMargin; ++k) {
        llm_token t = -1;
        ASSERT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << llm_last_error();
        if (t != c.generated[k]) {
          ADD_FAILURE() << "greedy step " << k << ": " << t << " where the reference has " << c.generated[k];
          break;
        }
      }
      llm_session_free(s);
    }
    const double rate = double(agree) / double(steps);
    std::printf("teacher-forced top-1 agreement: %zu / %zu = %.4f\n", agree, steps, rate);
    EXPECT_GE(rate, min_agreement);
  }

  static llm_model* model_;
};
llm_model* Gemma3::model_ = nullptr;

TEST_F(Gemma3, SharedReferenceCases) {
  check(read_cases(llm::testing::model_path("reference/gemma-3-270m-q4_k_m_greedy.json")), 0.96);
}

TEST_F(Gemma3, RepositoryPromptsPastTheLocalWindow) {
  const std::vector<Case> cases = read_cases(std::string(LLM_TEST_DATA_DIR) + "/gemma3/extra_greedy.json");
  size_t longest = 0;
  for (const Case& c : cases) longest = std::max(longest, c.prompt_ids.size());
  EXPECT_GT(longest, 512u);  // the file really crosses the 512-token window
  check(cases, 0.96);
}

TEST_F(Gemma3, EndOfTurnIsEndOfGeneration) {
  llm_token ids[8];
  size_t n = 0;
  const char* text = "<end_of_turn>";
  ASSERT_EQ(llm_tokenize(model_, text, std::strlen(text), LLM_TOKENIZE_PARSE_SPECIAL, ids, 8, &n), LLM_OK)
      << llm_last_error();
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(llm_token_is_eog(model_, ids[0]), 1);
  EXPECT_EQ(llm_token_is_eog(model_, 1), 1);    // <eos>
  EXPECT_EQ(llm_token_is_eog(model_, 506), 0);  // " the"
}

// The exact path (LLM_LOAD_REFERENCE_MATH, f32 KV) against llama.cpp running
// the same weights dequantized to F32 (tests/data/gemma3/f32_greedy.json):
// no activation quantization on either side, so the logits agree closely
// (worst 0.026 on logits near 20-28, 224 steps; bound 0.05) and every greedy step matches
// wherever the reference margin exceeds that noise.
TEST_F(Gemma3, ExactMathMatchesLlamaCppOnDequantizedWeights) {
  llm_model* m = load_exact();
  ASSERT_NE(m, nullptr) << llm_last_error();
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.kv_type = LLM_KV_F32;
  std::ifstream f(std::string(LLM_TEST_DATA_DIR) + "/gemma3/f32_greedy.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  double worst = 0;
  size_t steps = 0;
  for (const auto& c : j.at("cases")) {
    const auto prompt = c.at("prompt_token_ids").get<std::vector<llm_token>>();
    const auto gen = c.at("generated_token_ids").get<std::vector<llm_token>>();
    const auto margins = c.at("top1_top2_margin_per_step").get<std::vector<float>>();
    const auto& top5 = c.at("top5_per_step");
    llm_session* s = nullptr;
    ASSERT_EQ(llm_session_create(m, &sp, &s), LLM_OK) << llm_last_error();
    ASSERT_EQ(llm_prefill(s, prompt.data(), prompt.size()), LLM_OK) << llm_last_error();
    for (size_t k = 0; k < gen.size(); ++k) {
      const float* logits = nullptr;
      size_t nv = 0;
      ASSERT_EQ(llm_logits(s, &logits, &nv), LLM_OK);
      for (const auto& e : top5.at(k)) {
        const double d = std::fabs(double(logits[e.at(0).get<int>()]) - e.at(1).get<double>());
        worst = std::max(worst, d);
        EXPECT_LE(d, 0.05) << "prompt of " << prompt.size() << " tokens, step " << k;
      }
      if (margins[k] > 0.05f) {
        EXPECT_EQ(argmax(logits, nv), gen[k]) << "step " << k;
      }
      ++steps;
      ASSERT_EQ(llm_prefill(s, &gen[k], 1), LLM_OK);
    }
    llm_session_free(s);
  }
  std::printf("exact math vs llama.cpp on F32 weights: %zu steps, worst top-5 logit difference %.4f\n", steps, worst);
  llm_model_free(m);
}

// The fast path (quantized activations in the matmuls, default session)
// against the exact one (LLM_LOAD_REFERENCE_MATH, as llm-run/llm-bench
// --exact) on the same weights, teacher-forced on the reference ids: the
// top-1 tokens agree at every step where the exact logits' top-1/top-2
// margin is at least kMargin; overall at >= 98% of the steps of the shared
// file's 4 cases (one near-tie of slack: the same quantizer with its step
// computed as (1 / d) * (1 / e) instead of 1 / (d * e) gave 189) and >= 99%
// with LLM_GEMMA3_ALL_CASES=1, which adds the
// repository's 7 (about 2 minutes on two cores); at >= 99% of the steps where
// llama.cpp's id is exact math's top-1; never at fewer steps than
// llama.cpp's ids; and the mean absolute logit difference stays under 0.235.
// Measured, AVX-512 kernels: 190 of 192 (0.990), mean |d| 0.132; all cases
// 524 of 528 (0.992), 0.135. AVX2 kernels (LLM_CPU_ISA=avx2): 190 of 192,
// 0.214; all cases 523 of 528 (0.991), 0.225. llama.cpp's greedy ids are
// exact math's top-1 at 185 of 192 (all cases 518 of 528).
//
// Before the activations were refined (matmul_ggml.h: Q8_0's d in f32; the
// AVX-512 family's Q8_K with sub-scales) the fast path quantized them exactly
// as ggml does and was as far from exact math as llama.cpp: 185 of 192, mean
// |d| 0.210 (all cases 517 of 528, 0.219). Simulated in exact math, most of
// the difference came from the one-scale-per-256 Q8_K of the FFN down
// projection's input (mostly small values after the gate, a few large) and
// from rounding Q8_0's d to fp16. The remaining flips sit at near-ties of the
// exact logits: the shared file's two (steps 15 and 18 of its 6-token prompt)
// at exact top-1/top-2 margins of 0.015 and 0.073, under the mean logit
// difference that int8 activations leave (0.13).
TEST_F(Gemma3, FastPathAgreesWithExactMath) {
  llm_model* exact = load_exact();
  ASSERT_NE(exact, nullptr) << llm_last_error();
  std::vector<Case> cases = read_cases(llm::testing::model_path("reference/gemma-3-270m-q4_k_m_greedy.json"));
  const bool all_cases = std::getenv("LLM_GEMMA3_ALL_CASES") != nullptr;
  if (all_cases)
    for (Case& c : read_cases(std::string(LLM_TEST_DATA_DIR) + "/gemma3/extra_greedy.json")) cases.push_back(c);
  size_t agree = 0, steps = 0;
  size_t ref_agree = 0;   // steps where llama.cpp's greedy id is the exact top-1
  size_t both_agree = 0;  // of those, the steps where the fast path's top-1 is it too
  double dev_sum = 0;    // mean |fast - exact| over a step's logits, summed over steps
  for (const Case& c : cases) {
    llm_session *fast_s = nullptr, *exact_s = nullptr;
    ASSERT_EQ(llm_session_create(model_, nullptr, &fast_s), LLM_OK);
    ASSERT_EQ(llm_session_create(exact, nullptr, &exact_s), LLM_OK);
    ASSERT_EQ(llm_prefill(fast_s, c.prompt_ids.data(), c.prompt_ids.size()), LLM_OK) << llm_last_error();
    ASSERT_EQ(llm_prefill(exact_s, c.prompt_ids.data(), c.prompt_ids.size()), LLM_OK) << llm_last_error();
    for (size_t k = 0; k < c.generated.size(); ++k) {
      const float *lf = nullptr, *le = nullptr;
      size_t nf = 0, ne = 0;
      ASSERT_EQ(llm_logits(fast_s, &lf, &nf), LLM_OK);
      ASSERT_EQ(llm_logits(exact_s, &le, &ne), LLM_OK);
      const int32_t top_e = argmax(le, ne), top_f = argmax(lf, nf);
      agree += top_f == top_e;
      ref_agree += top_e == c.generated[k];
      both_agree += top_e == c.generated[k] && top_f == top_e;
      ++steps;
      double dev = 0;
      for (size_t i = 0; i < ne; ++i) dev += std::fabs(double(lf[i]) - double(le[i]));
      dev_sum += dev / double(ne);
      if (top_f != top_e) {
        float second = -INFINITY;
        for (size_t i = 0; i < ne; ++i)
          if (int32_t(i) != top_e) second = std::max(second, le[i]);
        EXPECT_LT(le[top_e] - second, kMargin) << "step " << k << " of a " << c.prompt_ids.size() << "-token prompt";
        std::printf("differs at step %zu of a %zu-token prompt: exact top-1/top-2 margin %.4f, fast path's margin %.4f\n",
                    k, c.prompt_ids.size(), double(le[top_e] - second), double(lf[top_f] - lf[top_e]));
      }
      ASSERT_EQ(llm_prefill(fast_s, &c.generated[k], 1), LLM_OK);
      ASSERT_EQ(llm_prefill(exact_s, &c.generated[k], 1), LLM_OK);
    }
    llm_session_free(fast_s);
    llm_session_free(exact_s);
  }
  const double rate = double(agree) / double(steps);
  const double mean_dev = dev_sum / double(steps);
  std::printf("fast path vs exact math, teacher-forced top-1: %zu / %zu = %.4f, mean |logit difference| %.4f\n",
              agree, steps, rate, mean_dev);
  std::printf("llama.cpp's ids vs exact math: %zu / %zu = %.4f\n", ref_agree, steps,
              double(ref_agree) / double(steps));
  std::printf("where llama.cpp's id is exact math's top-1, the fast path agrees at %zu / %zu\n", both_agree,
              ref_agree);
  EXPECT_GE(rate, all_cases ? 0.99 : 0.98);
  EXPECT_GE(double(both_agree), 0.99 * double(ref_agree));
  EXPECT_GE(agree, ref_agree) << "the fast path is farther from exact math than llama.cpp's quantized path";
  EXPECT_LT(mean_dev, 0.235);
  llm_model_free(exact);
}

// KV memory at 8192 tokens: the 15 local layers keep only the pages their
// 512-token window touches, so the session holds about a fifth of what a
// cache with every layer global would (at most 30% required), and its logits
// are bit-identical to a cache that keeps every page.
TEST_F(Gemma3, LongContextKeepsAFifthOfTheCacheWithTheSameLogits) {
  const std::string path = gemma_path();
  auto load = [&](bool prune) {
    llm::LoadOptions o;
    o.kv_prune_windows = prune;
    return llm::Model::load(path, o);
  };
  const std::unique_ptr<llm::Model> pruned = load(true), full = load(false);
  // 8192 tokens of text: the long prompt of the extra cases, repeated.
  const std::vector<Case> cases = read_cases(std::string(LLM_TEST_DATA_DIR) + "/gemma3/extra_greedy.json");
  const std::vector<int32_t>& text = cases.back().prompt_ids;
  std::vector<int32_t> toks = {text[0]};
  while (toks.size() < 8192) toks.push_back(text[1 + (toks.size() - 1) % (text.size() - 1)]);
  llm::SessionOptions so;
  llm::Session a(*pruned, so), b(*full, so);
  a.prefill(toks.data(), toks.size());
  b.prefill(toks.data(), toks.size());
  const int32_t n_vocab = pruned->config().vocab_size;
  EXPECT_EQ(0, std::memcmp(a.logits(), b.logits(), size_t(n_vocab) * sizeof(float)));
  for (int k = 0; k < 4; ++k) {  // and a few decode steps on top
    EXPECT_EQ(a.decode_step(nullptr), b.decode_step(nullptr));
    EXPECT_EQ(0, std::memcmp(a.logits(), b.logits(), size_t(n_vocab) * sizeof(float))) << "step " << k;
  }
  llm_session_stats_t sa, sb;
  sa.struct_size = sb.struct_size = sizeof sa;
  a.stats(&sa);
  b.stats(&sb);
  const double ratio = double(sa.kv_bytes) / double(sb.kv_bytes);
  std::printf("KV bytes at %u tokens: %llu pruned, %llu with every layer global (%.3f)\n", sa.n_cached,
              (unsigned long long)sa.kv_bytes, (unsigned long long)sb.kv_bytes, ratio);
  EXPECT_LE(ratio, 0.30);
}

}  // namespace

namespace {

// The process's resident set (VmRSS) in bytes.
uint64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return uint64_t(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;
  return 0;
}

}  // namespace

// What loading the model adds to the process's resident set (no session, so
// no KV cache) is at most the file's size + 10%: the weights once (on huge
// pages here, their file pages given back), the vocabulary, no metadata pages.
// (The CUDA runtime's libraries stay out of it too: cuBLASLt is opened only
// for a device GEMM.) ctest runs this in its own process.
TEST(Gemma3Memory, LoadAddsAtMostTheFileAndTenPercent) {
  const std::string path = gemma_path();
  if (path.empty()) GTEST_SKIP() << "LLM_GEMMA3_GGUF is not set or missing (tests/models/fetch_gemma3.sh fetches it)";
  const uint64_t before = resident_bytes();
  if (before == 0) GTEST_SKIP() << "no /proc/self/status";
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  const uint64_t file = uint64_t(f.tellg());
  llm_load_params p;
  llm_load_params_init(&p);
  p.device = LLM_DEVICE_CPU;
  llm_model* m = nullptr;
  ASSERT_EQ(llm_load(path.c_str(), &p, &m), LLM_OK) << llm_last_error();
  const uint64_t added = resident_bytes() - before;
  llm_model_free(m);
  std::printf("llm_load added %.1f MiB resident for a %.1f MiB file (%.3fx)\n", double(added) / 1048576.0,
              double(file) / 1048576.0, double(added) / double(file));
  EXPECT_LE(added, file + file / 10);
}
