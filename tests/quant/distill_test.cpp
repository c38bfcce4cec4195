// Quantization-aware distillation (quant/distill.h): its forward pass against
// the reference forward pass, its backward pass against finite differences,
// and that the stored blocks compute exactly the KL the pass reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "format/llama2c.h"
#include "quant/quant.h"
#include "reference.h"
#include "random_model.h"
#include "status_of.h"
#include "convert/awq.h"
#include "convert/distill.h"
#include "convert/llm_file_writer.h"

namespace {

using llm::DType;

// A random model small enough for finite differences: GQA (4 heads on 2 KV
// heads), an untied output unless `tied`. `seed` changes every weight.
llm::ModelSource tiny_model(uint32_t seed, bool tied) {
  llm::ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 48;
  c.seq_len = 64;
  return llm::testing::random_llama(c, seed, tied, [](const std::string& kind) {
    if (kind == "token_embd") return 0.6f;
    if (kind.find("norm") != std::string::npos || kind == "attn_output" || kind == "ffn_down") return 0.2f;
    return 0.3f;
  });
}

// teacher with every value moved by N(0, sigma^2) (a different model, so
// the KL and its gradient are not zero).
llm::ModelSource perturbed(const llm::ModelSource& teacher, float sigma, uint32_t seed) {
  llm::ModelSource out = teacher;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  for (auto& t : out.tensors) {
    auto bytes = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
    float* f = reinterpret_cast<float*>(bytes->data());
    for (int64_t i = 0; i < t.numel(); ++i) f[i] += nd(rng);
    t.data = bytes->data();
    t.owned = bytes;
  }
  return out;
}

// teacher with one more vocabulary entry (token_embd gains a row).
llm::ModelSource perturbed_vocab(const llm::ModelSource& teacher) {
  llm::ModelSource out = teacher;
  out.config.vocab_size += 1;
  for (auto& t : out.tensors) {
    if (t.name != "token_embd.weight") continue;
    auto bytes = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
    bytes->resize(bytes->size() + size_t(t.shape[1]) * 4, 0);
    t.shape[0] += 1;
    t.data = bytes->data();
    t.nbytes = bytes->size();
    t.owned = bytes;
  }
  return out;
}

// src with value i of tensor `name` (f32) set to v.
llm::ModelSource with_value(const llm::ModelSource& src, const std::string& name, size_t i, float v) {
  llm::ModelSource out = src;
  for (auto& t : out.tensors) {
    if (t.name != name) continue;
    auto bytes = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.nbytes);
    reinterpret_cast<float*>(bytes->data())[i] = v;
    t.data = bytes->data();
    t.owned = bytes;
  }
  return out;
}

std::vector<std::vector<int32_t>> random_sequences(int count, int len, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(count));
  for (auto& s : out) {
    s.push_back(1);
    for (int i = 1; i < len; ++i) s.push_back(int32_t(rng() % uint32_t(vocab)));
  }
  return out;
}

using llm::testing::status_of;

}  // namespace

// The pass's own forward computes what the reference forward pass computes:
// a student equal to its teacher has KL 0 and a zero gradient, on the real
// stories260K over a 64-token sequence.
TEST(Distill, StudentEqualToTeacherHasNoLoss) {
  const llm::ModelSource src = llm::read_llama2c(llm::testing::model_path("stories260K.bin"),
                                                 llm::testing::model_path("tok512.bin"));
  const auto cases = llm::testing::load_greedy_cases("stories260K_greedy.json");
  std::vector<int32_t> seq = cases[0].prompt_ids;
  seq.insert(seq.end(), cases[0].generated_ids.begin(), cases[0].generated_ids.end());
  std::map<std::string, std::vector<float>> grad;
  const double kl = llm::distill_kl_and_gradient(src, src, {seq}, &grad, nullptr);
  EXPECT_LT(std::fabs(kl), 1e-6);  // float rounding of two implementations: 5e-8
  EXPECT_EQ(grad.size(), size_t(2 + 9 * src.config.n_layers));  // tied: no output.weight
  float gmax = 0.0f;
  for (const auto& [name, g] : grad)
    for (float v : g) gmax = std::max(gmax, std::fabs(v));
  EXPECT_LT(gmax, 1e-4f);
  // A different student is not free.
  const double kl2 = llm::distill_kl_and_gradient(src, perturbed(src, 0.02f, 5), {seq}, nullptr, nullptr);
  EXPECT_GT(kl2, 1e-4);
}

// Backward pass: the gradient of every tensor (norms, attention with GQA and
// RoPE, SwiGLU, tied and untied output) against central differences, at the
// value of largest gradient and at two random ones per tensor; with threads.
TEST(Distill, GradientMatchesFiniteDifferences) {
  llm::ThreadPool pool(2);
  for (bool tied : {false, true}) {
    const llm::ModelSource teacher = tiny_model(7, tied);
    const llm::ModelSource student = perturbed(teacher, 0.05f, 11);
    const auto seqs = random_sequences(3, 12, teacher.config.vocab_size, 3);
    std::map<std::string, std::vector<float>> grad;
    const double kl = llm::distill_kl_and_gradient(teacher, student, seqs, &grad, &pool);
    ASSERT_GT(kl, 1e-3);
    EXPECT_EQ(grad.size(), student.tensors.size());
    std::mt19937 rng(1);
    int checked = 0;
    for (const auto& entry : grad) {
      const std::string& name = entry.first;  // not a structured binding: C++17 lambdas cannot capture one
      const auto& g = entry.second;
      const llm::TensorData& t = *student.find(name);
      ASSERT_EQ(g.size(), size_t(t.numel())) << name;
      std::vector<size_t> at = {size_t(std::max_element(g.begin(), g.end(), [](float a, float b) {
                                         return std::fabs(a) < std::fabs(b);
                                       }) - g.begin()),
                                rng() % g.size(), rng() % g.size()};
      float gmax = 0.0f;
      for (float v : g) gmax = std::max(gmax, std::fabs(v));
      for (size_t i : at) {
        const float w = reinterpret_cast<const float*>(t.data)[i];
        const float h = 1e-2f * std::max(0.1f, std::fabs(w));
        auto kl_at = [&](float v) {
          return llm::distill_kl_and_gradient(teacher, with_value(student, name, i, v), seqs, nullptr, &pool);
        };
        const double fd = (kl_at(w + h) - kl_at(w - h)) / (2.0 * double(h));
        EXPECT_NEAR(double(g[i]), fd, 0.02 * double(gmax) + 2e-5) << name << "[" << i << "] tied " << tied;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 3 * int(grad.size()));
  }
}

// Training lowers the KL of a quantized student, and the stored blocks are
// the weights whose KL was reported: read back through the ordinary
// dequantizers they give that KL again. Every planned format: q4, q4m, q8
// matrices; the embeddings in another format; norms stay f32.
TEST(Distill, StoredBlocksComputeTheReportedKl) {
  llm::ThreadPool pool(2);
  const llm::ModelSource teacher = tiny_model(21, false);
  const auto seqs = random_sequences(4, 24, teacher.config.vocab_size, 9);
  for (DType dt : {DType::Q4, DType::Q4M, DType::Q8}) {
    llm::LlmConvertOptions co;
    co.requantize = true;
    co.dtype = dt;
    co.group = 32;
    co.overrides["token_embd.weight"] = dt == DType::Q8 ? DType::Q4 : DType::Q8;
    llm::DistillOptions opt;
    opt.steps = 40;
    opt.lr = 2e-3f;
    int calls = 0;
    opt.progress = [&](int32_t step, double kl) {
      EXPECT_EQ(step, ++calls);
      EXPECT_GT(kl, 0.0);
    };
    llm::DistillReport rep;
    const llm::ModelSource out = llm::distill_quantize(teacher, teacher, seqs, co, opt, &rep, &pool);
    EXPECT_EQ(calls, opt.steps);
    EXPECT_EQ(rep.n_tokens, 4 * 24);
    EXPECT_LT(rep.kl_end, rep.kl_start * 0.7) << llm::dtype_name(dt);
    std::printf("%s: KL %.6f -> %.6f\n", llm::dtype_name(dt), rep.kl_start, rep.kl_end);
    EXPECT_EQ(out.find("blk.1.ffn_down.weight")->dtype, dt);
    EXPECT_EQ(out.find("blk.0.attn_q.weight")->group, 32u);
    EXPECT_EQ(out.find("token_embd.weight")->dtype, co.overrides["token_embd.weight"]);
    EXPECT_EQ(out.find("output.weight")->dtype, dt);
    EXPECT_EQ(out.find("blk.0.attn_norm.weight")->dtype, DType::F32);
    const double kl = llm::distill_kl_and_gradient(teacher, out, seqs, nullptr, &pool);
    EXPECT_NEAR(kl, rep.kl_end, 1e-6 + 1e-4 * rep.kl_end) << llm::dtype_name(dt);
  }
}

TEST(Distill, RejectsBadInput) {
  const llm::ModelSource teacher = tiny_model(1, true);
  llm::LlmConvertOptions co;
  co.requantize = true;
  co.dtype = DType::Q4;
  llm::DistillOptions opt;
  opt.steps = 1;
  auto run = [&](const std::vector<std::vector<int32_t>>& seqs, const llm::DistillOptions& o,
                 const llm::ModelSource& student) {
    return status_of([&] { llm::distill_quantize(teacher, student, seqs, co, o, nullptr, nullptr); });
  };
  EXPECT_EQ(run({}, opt, teacher), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(run({{1, 2, 48}}, opt, teacher), LLM_ERR_INVALID_ARGUMENT);  // token outside the vocabulary
  EXPECT_EQ(run({{1, -1}}, opt, teacher), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(run({{}}, opt, teacher), LLM_ERR_INVALID_ARGUMENT);
  llm::DistillOptions bad = opt;
  bad.lr = 0.0f;
  EXPECT_EQ(run({{1, 2}}, bad, teacher), LLM_ERR_INVALID_ARGUMENT);
  // A NaN weight (here in a norm, which stays f32) makes the loss NaN: refused, not written.
  llm::ModelSource nan_student = with_value(teacher, "blk.1.ffn_norm.weight", 5, std::nanf(""));
  std::string msg;
  EXPECT_EQ(llm::testing::status_of(
                [&] { llm::distill_quantize(teacher, nan_student, {{1, 2, 3}}, co, opt, nullptr, nullptr); }, &msg),
            LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("not finite"), std::string::npos) << msg;
  bad = opt;
  bad.steps = -1;
  EXPECT_EQ(run({{1, 2}}, bad, teacher), LLM_ERR_INVALID_ARGUMENT);
  llm::ModelSource missing = teacher;
  missing.tensors.erase(missing.tensors.begin() + 3);
  EXPECT_EQ(run({{1, 2}}, opt, missing), LLM_ERR_FORMAT);
  llm::ModelSource misshapen = teacher;
  misshapen.tensors[2].shape = {7};
  EXPECT_EQ(run({{1, 2}}, opt, misshapen), LLM_ERR_FORMAT);
  // A teacher of another shape (its logits would not line up with the student's).
  EXPECT_EQ(status_of([&] {
              llm::distill_quantize(tiny_model(1, false), perturbed_vocab(teacher), {{1, 2}}, co, opt, nullptr, nullptr);
            }),
            LLM_ERR_INVALID_ARGUMENT);
  // Over kDistillMaxParams: refused from the shapes, before any weight is read.
  llm::ModelSource huge = teacher;
  huge.config.vocab_size = int32_t(llm::kDistillMaxParams / teacher.config.dim) + 1;
  huge.tensors[0].shape = {huge.config.vocab_size, teacher.config.dim};
  EXPECT_EQ(status_of([&] { llm::distill_quantize(huge, huge, {{1, 2}}, co, opt, nullptr, nullptr); }),
            LLM_ERR_UNSUPPORTED);
  EXPECT_EQ(run({{1, 2, 3}}, opt, teacher), LLM_OK);
}
