// AWQ and GPTQ: the f32 reference forward pass they calibrate with, the
// function-preserving folding of the AWQ scales, and the error reductions
// that justify both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "format/llama2c.h"
#include "format/llm_file.h"
#include "model/model.h"
#include "quant/quant.h"
#include "reference.h"
#include "tokenizer/tokenizer.h"
#include "tmp.h"
#include "random_model.h"
#include "status_of.h"
#include "convert/awq.h"
#include "convert/llm_file_writer.h"

namespace {

using llm::AwqSite;
using llm::DType;

const llm::ModelSource& stories() {
  static const llm::ModelSource src = llm::read_llama2c(llm::testing::model_path("stories260K.bin"),
                                                        llm::testing::model_path("tok512.bin"));
  return src;
}

std::vector<int32_t> tokenize(const llm::ModelSource& src, const std::string& text) {
  std::vector<int32_t> ids;
  llm::Tokenizer::create(src.vocab)->encode(text, true, false, ids);
  return ids;
}

// Calibration text: llama2.c's documented temperature-1 sample (not one of
// the greedy reference continuations).
const std::string kCalibText =
    "Once upon a time, there was a little boy named Timmy. Timmy loved to play with his toys and eat sandwiches. "
    "One day, Timmy's mom told him it was time to rest for a while. Timmy's friend Billy came over and took him a "
    "down.\nTimmy's mom saw that Timmy was sad, but Timmy said, \"I didn't understand what is it! We need to find "
    "some leafs.\" Timmy thought about it and took a deep breath on a spoon. He hoped it was important to be kind "
    "and continued to find its image next time.\nAfter they finished getting, Timmy's dad came up to his house and "
    "promised to help Timmy.\n";

// Held-out text for the error checks.
const std::string kHeldOutText =
    "Tom and Sam went to the park. They saw a big box. They wanted to see what was inside. Sam said, \"Let's open "
    "it!\" Tom was scared, but he helped his friend. Inside the box there was a small red ball and a funny hat.";

// A random untied model whose hidden size (128) splits into q4 groups, so
// every AWQ site (including down and output) is exercised. A few embedding
// channels are 8x larger, like the outlier channels of trained models.
llm::ModelSource synthetic_model() {
  llm::ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 512;
  c.seq_len = 256;
  llm::ModelSource src = llm::testing::random_llama(c, 42, false, [](const std::string& kind) {
    return kind == "token_embd" ? 0.5f : kind.find("norm") != std::string::npos ? 0.2f : 0.1f;
  });
  src.vocab = stories().vocab;
  float* embd = llm::testing::random_values(src, "token_embd.weight");
  for (int64_t r = 0; r < c.vocab_size; ++r)
    for (int64_t ch : {3, 17, 40}) embd[r * c.dim + ch] *= 8.0f;
  return src;
}

std::vector<float> f32_of(const llm::TensorData& t) {
  std::vector<float> v(size_t(t.numel()));
  const int64_t rows = t.shape.size() == 2 ? t.rows() : 1, cols = t.cols();
  const size_t rb = llm::dtype_row_bytes(t.dtype, cols, t.group);
  for (int64_t r = 0; r < rows; ++r) llm::dequantize_row(t.dtype, t.group, t.data + size_t(r) * rb, &v[size_t(r * cols)], cols);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

using llm::testing::status_of;

}  // namespace

// ---------------------------------------------------------------------------
// The reference forward pass

TEST(ReferenceForward, MatchesLlama2cLogits) {
  llm::ThreadPool* const pool = nullptr;  // tiny model: one thread is fastest
  const llm::ReferenceForward fwd(stories(), pool);
  int checked = 0;
  for (const auto& c : llm::testing::load_greedy_cases("stories260K_greedy.json")) {
    if (c.logits_steps.empty()) continue;
    std::vector<int32_t> seq = c.prompt_ids;
    seq.insert(seq.end(), c.generated_ids.begin(), c.generated_ids.end());
    std::vector<float> logits;
    fwd.run(seq.data(), int64_t(seq.size()), &logits);
    for (const auto& step : c.logits_steps) {
      ASSERT_LT(size_t(step.position), seq.size());
      const float* got = &logits[size_t(step.position) * 512];
      float worst = 0.0f;
      for (size_t i = 0; i < step.logits.size(); ++i) worst = std::max(worst, std::fabs(got[i] - step.logits[i]));
      EXPECT_LT(worst, 1e-4f) << "'" << c.prompt << "' position " << step.position;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(ReferenceForward, ObserverSeesEveryLinearInput) {
  const llm::ReferenceForward fwd(stories(), nullptr);
  const std::vector<int32_t> ids = tokenize(stories(), "Lily had a big box.");
  std::vector<int> seen(size_t(6 * llm::kAwqSites), 0);
  fwd.run(ids.data(), int64_t(ids.size()), nullptr, [&](int32_t layer, AwqSite site, const float*, int64_t n, int64_t cols) {
    EXPECT_EQ(n, int64_t(ids.size()));
    EXPECT_EQ(cols, site == AwqSite::Down ? 172 : 64);
    ++seen[size_t(layer * llm::kAwqSites + int(site))];
  });
  for (int l = 0; l < 5; ++l)
    for (AwqSite s : {AwqSite::Qkv, AwqSite::GateUp, AwqSite::Down, AwqSite::AttnOut})
      EXPECT_EQ(seen[size_t(l * llm::kAwqSites + int(s))], 1) << l << " " << llm::awq_site_name(s);
  EXPECT_EQ(seen[size_t(5 * llm::kAwqSites + int(AwqSite::Output))], 1);
  std::vector<int32_t> bad = {1, 512};
  EXPECT_EQ(status_of([&] { fwd.run(bad.data(), 2, nullptr); }), LLM_ERR_INVALID_ARGUMENT);
}

TEST(Awq, Windows) {
  const std::vector<int32_t> t = {1, 10, 11, 12, 13, 14};
  const auto w = llm::awq_windows(t, 1, 3);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], (std::vector<int32_t>{1, 10, 11}));
  EXPECT_EQ(w[1], (std::vector<int32_t>{1, 12, 13}));
  EXPECT_EQ(w[2], (std::vector<int32_t>{1, 14}));
  EXPECT_EQ(status_of([&] { llm::awq_windows(t, 1, 1); }), LLM_ERR_INVALID_ARGUMENT);
  llm::AwqOptions o;
  EXPECT_EQ(status_of([&] { llm::awq_calibrate(stories(), {}, o, nullptr); }), LLM_ERR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------
// AWQ

TEST(Awq, FoldingPreservesTheF32Function) {
  // Fixed alpha so that every site (qkv, gate/up, down into up's rows,
  // output into output_norm) really is rescaled.
  const llm::ModelSource src = synthetic_model();
  llm::ThreadPool pool(2);
  const std::vector<int32_t> calib = tokenize(src, kCalibText);
  llm::AwqOptions o;
  o.fixed_alpha = 0.5f;
  const llm::AwqCalibration cal = llm::awq_calibrate(src, llm::awq_windows(calib, 1, 512), o, &pool);
  llm::AwqReport rep;
  const llm::ModelSource awq = llm::awq_apply(src, cal, o, &rep, &pool);
  ASSERT_EQ(rep.sites.size(), 2u * 3u + 1u);
  for (const auto& s : rep.sites) EXPECT_EQ(s.alpha, 0.5f);

  // Every folded tensor changed; the function did not.
  for (const char* name : {"blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.1.ffn_norm.weight",
                           "blk.1.ffn_up.weight", "blk.1.ffn_down.weight", "output_norm.weight", "output.weight"}) {
    EXPECT_GT(max_abs_diff(f32_of(*src.find(name)), f32_of(*awq.find(name))), 1e-3f) << name << " was not rescaled";
  }
  EXPECT_EQ(max_abs_diff(f32_of(*src.find("token_embd.weight")), f32_of(*awq.find("token_embd.weight"))), 0.0f);

  const std::vector<int32_t> ids = tokenize(src, kHeldOutText);
  std::vector<float> before, after;
  llm::ReferenceForward(src, &pool).run(ids.data(), int64_t(ids.size()), &before);
  llm::ReferenceForward(awq, &pool).run(ids.data(), int64_t(ids.size()), &after);
  float range = 0.0f;
  for (float v : before) range = std::max(range, std::fabs(v));
  EXPECT_GT(range, 1.0f);
  EXPECT_LT(max_abs_diff(before, after), 2e-4f * range);

  // The engine agrees (an independent forward pass).
  llm::LoadOptions lo;
  lo.n_threads = 1;
  lo.reference_math = true;
  lo.kv_budget_bytes = 8u << 20;
  const auto m0 = llm::Model::from_source(src, lo), m1 = llm::Model::from_source(awq, lo);
  llm::SessionOptions so;
  so.kv_type = LLM_KV_F32;
  llm::Session s0(*m0, so), s1(*m1, so);
  s0.prefill(ids.data(), ids.size());
  s1.prefill(ids.data(), ids.size());
  const std::vector<float> l0(s0.logits(), s0.logits() + 512), l1(s1.logits(), s1.logits() + 512);
  EXPECT_LT(max_abs_diff(l0, l1), 2e-4f * range);
  EXPECT_LT(max_abs_diff(l0, std::vector<float>(before.end() - 512, before.end())), 1e-4f * range);
}

TEST(Awq, StoriesFoldedModelComputesTheSameFunction) {
  // The searched scales on the real model: same logits on all 12 reference sequences.
  llm::ThreadPool* const pool = nullptr;  // tiny model: one thread is fastest
  const std::vector<int32_t> calib = tokenize(stories(), kCalibText);
  llm::AwqOptions o;
  llm::AwqReport rep;
  const llm::ModelSource awq = llm::awq_quantize_prepare(stories(), calib, o, &rep, pool);
  int scaled = 0;
  for (const auto& s : rep.sites) {
    EXPECT_NE(s.site, AwqSite::Down);    // 172 columns: ffn_down is not quantized to q4 g32
    EXPECT_NE(s.site, AwqSite::Output);  // tied embeddings
    scaled += s.alpha > 0.0f;
  }
  EXPECT_EQ(rep.sites.size(), 10u);
  EXPECT_GE(scaled, 8);
  const llm::ReferenceForward f0(stories(), pool), f1(awq, pool);
  float worst = 0.0f;
  for (const char* file : {"stories260K_greedy.json", "stories260K_q8_0_greedy.json", "stories260K_q4_0_greedy.json"}) {
    for (const auto& c : llm::testing::load_greedy_cases(file)) {
      std::vector<int32_t> seq = c.prompt_ids;
      seq.insert(seq.end(), c.generated_ids.begin(), c.generated_ids.end());
      std::vector<float> a, b;
      f0.run(seq.data(), int64_t(seq.size()), &a);
      f1.run(seq.data(), int64_t(seq.size()), &b);
      worst = std::max(worst, max_abs_diff(a, b));
    }
  }
  std::printf("stories260K AWQ fold: max |logit difference| %.3g\n", double(worst));
  EXPECT_LT(worst, 2e-3f);  // logits span about +-15
}

// The searched scales lower the q4 output error of a layer, on the
// calibration set (by construction: alpha = 0 is in the grid) and on
// held-out text (which could fail). Measured here directly from the
// weights: W (original), W' = W diag(s) (folded), s from the folded norm.
TEST(Awq, LowersQ4OutputErrorOnHeldOutText) {
  llm::ThreadPool* const pool = nullptr;  // tiny model: one thread is fastest
  const std::vector<int32_t> calib = tokenize(stories(), kCalibText);
  llm::AwqOptions o;
  llm::AwqReport rep;
  const llm::ModelSource awq = llm::awq_quantize_prepare(stories(), calib, o, &rep, pool);
  for (const auto& s : rep.sites) EXPECT_LE(s.err_scaled, s.err_plain);
  double calib_plain = 0, calib_scaled = 0;
  for (const auto& s : rep.sites) {
    calib_plain += s.err_plain;
    calib_scaled += s.err_scaled;
  }
  EXPECT_LT(calib_scaled, 0.9 * calib_plain);

  const std::vector<int32_t> held = tokenize(stories(), kHeldOutText);
  const llm::AwqCalibration hc = llm::awq_calibrate(stories(), {held}, o, pool);
  double plain_total = 0, awq_total = 0;
  int better = 0;
  for (int l = 0; l < 5; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto& site = hc.at(l, AwqSite::Qkv);
    const int64_t n = site.n_samples(), cols = 64;
    const std::vector<float> g0 = f32_of(*stories().find(p + "attn_norm.weight"));
    const std::vector<float> g1 = f32_of(*awq.find(p + "attn_norm.weight"));
    double plain = 0, scaled = 0;
    for (const char* m : {"attn_q.weight", "attn_k.weight", "attn_v.weight"}) {
      const std::vector<float> W = f32_of(*stories().find(p + m)), Ws = f32_of(*awq.find(p + m));
      const int64_t rows = int64_t(W.size()) / cols;
      std::vector<float> qw(W.size()), qs(W.size());
      std::vector<uint8_t> buf(llm::dtype_row_bytes(DType::Q4, cols, 32));
      for (int64_t r = 0; r < rows; ++r) {
        llm::quantize_row(DType::Q4, 32, &W[size_t(r * cols)], buf.data(), cols);
        llm::dequantize_row(DType::Q4, 32, buf.data(), &qw[size_t(r * cols)], cols);
        llm::quantize_row(DType::Q4, 32, &Ws[size_t(r * cols)], buf.data(), cols);
        llm::dequantize_row(DType::Q4, 32, buf.data(), &qs[size_t(r * cols)], cols);
      }
      for (int64_t i = 0; i < n; ++i) {
        const float* x = &site.samples[size_t(i * cols)];
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0, yp = 0, ys = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double s = double(g0[size_t(c)]) / double(g1[size_t(c)]);  // the folded scale
            exact += double(W[size_t(r * cols + c)]) * x[c];
            yp += double(qw[size_t(r * cols + c)]) * x[c];
            ys += double(qs[size_t(r * cols + c)]) * (x[c] / s);  // the folded model's input is x / s
          }
          plain += (yp - exact) * (yp - exact);
          scaled += (ys - exact) * (ys - exact);
        }
      }
    }
    better += scaled < plain;
    plain_total += plain;
    awq_total += scaled;
  }
  std::printf("held-out q/k/v output error: plain %.4g, AWQ %.4g (%d of 5 layers better)\n", plain_total, awq_total,
              better);
  EXPECT_LT(awq_total, 0.9 * plain_total);
  EXPECT_GE(better, 4);
}

TEST(Awq, ClipLowersCalibrationErrorFurther) {
  llm::ThreadPool* const pool = nullptr;  // tiny model: one thread is fastest
  const std::vector<int32_t> calib = tokenize(stories(), kCalibText);
  llm::AwqOptions o;
  o.clip = true;
  llm::AwqReport rep;
  llm::awq_quantize_prepare(stories(), calib, o, &rep, pool);
  ASSERT_FALSE(rep.sites.empty());
  for (const auto& s : rep.sites) EXPECT_LT(s.err_final, s.err_scaled) << s.layer << " " << llm::awq_site_name(s.site);
}

// ---------------------------------------------------------------------------
// GPTQ

TEST(Gptq, LowersOutputErrorAndWritesValidBlocks) {
  llm::ThreadPool pool(2);
  const llm::ModelSource src = synthetic_model();
  const std::vector<int32_t> calib = tokenize(src, kCalibText);
  llm::AwqOptions o;
  const llm::AwqCalibration cal = llm::awq_calibrate(src, llm::awq_windows(calib, 1, 512), o, &pool);
  for (DType dt : {DType::Q4, DType::Q8}) {
    llm::LlmConvertOptions co;
    co.requantize = true;
    co.dtype = dt;
    co.group = 64;
    std::vector<llm::GptqTensorReport> rep;
    const llm::ModelSource q = llm::gptq_quantize(src, cal, co, 0.01, &rep, &pool);
    ASSERT_EQ(rep.size(), 2u * 7u + 1u) << llm::dtype_name(dt);  // q k v o gate up down per layer, output
    for (const auto& r : rep) EXPECT_LT(r.err_gptq, r.err_plain) << r.name;
    for (const auto& r : rep) {
      const llm::TensorData& t = *q.find(r.name);
      EXPECT_EQ(t.dtype, dt);
      EXPECT_EQ(t.group, dt == DType::Q4 ? 64u : 32u);
      EXPECT_EQ(t.nbytes, llm::dtype_row_bytes(dt, t.cols(), t.group) * size_t(t.rows()));
      // Rounding may differ from the plain quantizer, the values stay close.
      const std::vector<float> a = f32_of(t), b = f32_of(*src.find(r.name));
      float amax = 0.0f;
      for (float v : b) amax = std::max(amax, std::fabs(v));
      EXPECT_LT(max_abs_diff(a, b), 0.5f * amax) << r.name;
    }
    EXPECT_EQ(q.find("token_embd.weight")->dtype, DType::F32);  // left to the converter
    // The converter keeps GPTQ's bytes as they are.
    const std::string path = llm::testing::tmp_path("gptq_synthetic.llm");
    llm::convert_to_llm(q, path, co);
    const llm::ModelSource back = llm::read_llm(path);
    const llm::TensorData& a = *q.find("blk.1.ffn_down.weight");
    const llm::TensorData& b = *back.find("blk.1.ffn_down.weight");
    ASSERT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
  }
}
