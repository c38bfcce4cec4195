// convert_to_llm: format planning and re-encoding, checked against files
// quantized by ggml itself (stories260K-q8_0.gguf / -q4_0.gguf were made from
// stories260K.gguf with ggml_quantize_chunk).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/llm_file.h"
#include "model/model.h"
#include "quant/quant.h"
#include "reference.h"
#include "tmp.h"
#include "convert/kquant_mix.h"
#include "convert/llm_file_writer.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }
using llm::testing::tmp_path;

// Converts stories260K.gguf (f32) with `dtype` and compares every tensor
// with the ggml-quantized reference file.
void check_against_ggml(llm::DType dtype, const char* reference, const char* out_name) {
  const llm::ModelSource f32 = llm::read_gguf(model_path("stories260K.gguf"), false, nullptr);
  const llm::ModelSource ref = llm::read_gguf(model_path(reference), false, nullptr);
  llm::LlmConvertOptions co;
  co.requantize = true;
  co.dtype = dtype;
  co.group = 32;
  llm::ThreadPool pool(2);
  llm::LlmWriteOptions wo;
  wo.pool = &pool;
  std::vector<std::string> notes;
  llm::convert_to_llm(f32, tmp_path(out_name), co, wo, &notes);
  // Only ffn_down (172 columns) cannot be grouped by 32.
  EXPECT_EQ(notes.size(), 5u);
  const llm::ModelSource got = llm::read_llm(tmp_path(out_name));
  ASSERT_EQ(got.tensors.size(), f32.tensors.size());
  int n_quant = 0;
  for (const auto& t : got.tensors) {
    const llm::TensorData* r = ref.find(t.name);
    ASSERT_NE(r, nullptr) << t.name;
    EXPECT_EQ(t.shape, r->shape) << t.name;
    if (t.shape.size() == 1) {
      EXPECT_EQ(t.dtype, llm::DType::F32) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, r->data, t.nbytes)) << t.name;
    } else if (t.cols() % 32 != 0) {
      // Kept f32 by ggml, f16 here: equal to f16 rounding of the original.
      EXPECT_EQ(t.dtype, llm::DType::F16) << t.name;
      ASSERT_EQ(r->dtype, llm::DType::F32);
      const float* want = reinterpret_cast<const float*>(r->data);
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        ASSERT_EQ(h, llm::f32_to_f16(want[i])) << t.name << "[" << i << "]";
      }
    } else {
      ++n_quant;
      EXPECT_EQ(t.dtype, dtype) << t.name;
      ASSERT_EQ(r->dtype, dtype) << t.name;
      ASSERT_EQ(t.nbytes, r->nbytes) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, r->data, t.nbytes)) << t.name << " differs from ggml's quantization";
    }
  }
  EXPECT_EQ(n_quant, 1 + 4 * 5 + 2 * 5 + 1);  // token_embd, q/k/v/o, gate/up, output
}

}  // namespace

TEST(Convert, Q8MatchesGgml) { check_against_ggml(llm::DType::Q8, "stories260K-q8_0.gguf", "conv_q8.llm"); }
TEST(Convert, Q4MatchesGgml) { check_against_ggml(llm::DType::Q4, "stories260K-q4_0.gguf", "conv_q4.llm"); }

TEST(Convert, PlanRules) {
  llm::LlmConvertOptions keep;
  std::vector<std::string> notes;
  llm::LlmTensorSpec s = llm::plan_llm_tensor("x", {64, 64}, llm::DType::Q4, 64, keep, &notes);
  EXPECT_EQ(s.dtype, llm::DType::Q4);
  EXPECT_EQ(s.group, 64u);
  llm::LlmConvertOptions q4;
  q4.requantize = true;
  q4.dtype = llm::DType::Q4;
  q4.group = 128;
  s = llm::plan_llm_tensor("n", {256}, llm::DType::F16, 0, q4, &notes);
  EXPECT_EQ(s.dtype, llm::DType::F32);  // norms stay f32
  s = llm::plan_llm_tensor("m", {8, 256}, llm::DType::F32, 0, q4, &notes);
  EXPECT_EQ(s.dtype, llm::DType::Q4);
  EXPECT_EQ(s.group, 128u);
  EXPECT_TRUE(notes.empty());
  s = llm::plan_llm_tensor("m", {8, 192}, llm::DType::F32, 0, q4, &notes);  // 192 % 128 != 0
  EXPECT_EQ(s.dtype, llm::DType::F16);
  EXPECT_EQ(notes.size(), 1u);
  llm::LlmConvertOptions f32;
  f32.requantize = true;
  f32.dtype = llm::DType::F32;
  s = llm::plan_llm_tensor("m", {8, 172}, llm::DType::Q8, 32, f32, &notes);
  EXPECT_EQ(s.dtype, llm::DType::F32);
  llm::LlmConvertOptions bf;
  bf.requantize = true;
  bf.dtype = llm::DType::BF16;
  s = llm::plan_llm_tensor("m", {8, 172}, llm::DType::F32, 0, bf, &notes);
  EXPECT_EQ(s.dtype, llm::DType::BF16);
}

// --tensor-quant: one kind of layer matrix takes another format in every
// layer; an exact-name override (--embd-quant) still wins; the same fallback
// applies (a q4 kind whose rows do not split into groups becomes f16).
TEST(Convert, KindOverridesApplyToEveryLayer) {
  EXPECT_EQ(llm::layer_tensor_kind("blk.0.attn_v.weight"), "attn_v.weight");
  EXPECT_EQ(llm::layer_tensor_kind("blk.117.ffn_up.weight"), "ffn_up.weight");
  EXPECT_EQ(llm::layer_tensor_kind("token_embd.weight"), "");
  EXPECT_EQ(llm::layer_tensor_kind("blk.attn_v.weight"), "");
  EXPECT_EQ(llm::layer_tensor_kind("blk.3"), "");
  EXPECT_EQ(llm::layer_tensor_kind("blk.3."), "");
  EXPECT_EQ(llm::layer_tensor_kind("xblk.3.attn_v.weight"), "");

  llm::LlmConvertOptions o;
  o.requantize = true;
  o.dtype = llm::DType::Q4M;
  o.group = 32;
  o.kind_overrides["attn_v.weight"] = llm::DType::Q8;
  o.kind_overrides["ffn_down.weight"] = llm::DType::Q4;
  o.overrides["blk.2.attn_v.weight"] = llm::DType::F16;
  std::vector<std::string> notes;
  for (int layer : {0, 1, 21}) {
    const std::string p = "blk." + std::to_string(layer) + ".";
    EXPECT_EQ(llm::plan_llm_tensor(p + "attn_v.weight", {256, 2048}, llm::DType::F32, 0, o, &notes).dtype,
              llm::DType::Q8);
    EXPECT_EQ(llm::plan_llm_tensor(p + "attn_q.weight", {2048, 2048}, llm::DType::F32, 0, o, &notes).dtype,
              llm::DType::Q4M);
  }
  EXPECT_EQ(llm::plan_llm_tensor("blk.2.attn_v.weight", {256, 2048}, llm::DType::F32, 0, o, &notes).dtype,
            llm::DType::F16);
  EXPECT_EQ(llm::plan_llm_tensor("output.weight", {512, 64}, llm::DType::F32, 0, o, &notes).dtype, llm::DType::Q4M);
  const llm::LlmTensorSpec down =
      llm::plan_llm_tensor("blk.0.ffn_down.weight", {64, 172}, llm::DType::F32, 0, o, &notes);
  EXPECT_EQ(down.dtype, llm::DType::F16);  // 172 columns: no whole q4 groups
  EXPECT_EQ(notes.size(), 1u);
  const llm::LlmTensorSpec down2 =
      llm::plan_llm_tensor("blk.0.ffn_down.weight", {64, 256}, llm::DType::F32, 0, o, &notes);
  EXPECT_EQ(down2.dtype, llm::DType::Q4);
  EXPECT_EQ(down2.group, 32u);
}

TEST(Convert, Llama2cToBf16AndBack) {
  // bf16 of every matrix element equals the reference rounding.
  const llm::ModelSource src = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  llm::LlmConvertOptions co;
  co.requantize = true;
  co.dtype = llm::DType::BF16;
  llm::convert_to_llm(src, tmp_path("conv_bf16.llm"), co);
  const llm::ModelSource got = llm::read_llm(tmp_path("conv_bf16.llm"));
  ASSERT_EQ(got.tensors.size(), src.tensors.size());
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    const auto& a = src.tensors[i];
    const auto& b = got.tensors[i];
    EXPECT_EQ(b.dtype, a.shape.size() == 1 ? llm::DType::F32 : llm::DType::BF16) << a.name;
    std::vector<float> row(size_t(a.numel()));
    llm::dequantize_row(b.dtype, 0, b.data, row.data(), a.numel());
    const float* want = reinterpret_cast<const float*>(a.data);
    const bool norm = a.shape.size() == 1;  // stays f32: exact
    for (int64_t j = 0; j < a.numel(); ++j)
      ASSERT_EQ(row[size_t(j)], norm ? want[j] : llm::bf16_to_f32(llm::f32_to_bf16(want[j])))
          << a.name << "[" << j << "]";
  }
  EXPECT_EQ(got.vocab.tokens, src.vocab.tokens);
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third in between (llama-quant.cpp).
TEST(Convert, KQuantMixLayers) {
  std::vector<int> picked;
  for (int l = 0; l < 22; ++l)
    if (llm::kquant_more_bits_layer(l, 22)) picked.push_back(l);
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 4, 7, 10, 13, 16, 19, 20, 21}));
  picked.clear();
  for (int l = 0; l < 32; ++l)
    if (llm::kquant_more_bits_layer(l, 32)) picked.push_back(l);
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
  llm::LlmConvertOptions co;
  EXPECT_FALSE(llm::kquant_mix_options("q4_K_X", 22, false, &co));
  EXPECT_FALSE(co.requantize);
}

// Which matrix gets which type in q4_K_M / q5_K_M on the TinyLlama shape,
// and the fallbacks for rows that are not whole 256-value blocks.
TEST(Convert, KQuantMixPlan) {
  std::vector<std::string> notes;
  auto plan = [&](const llm::LlmConvertOptions& co, const std::string& name, std::vector<int64_t> shape) {
    return llm::plan_llm_tensor(name, shape, llm::DType::F32, 0, co, &notes);
  };
  for (const char* mix : {"q4_K_M", "q5_k_m"}) {
    llm::LlmConvertOptions co;
    ASSERT_TRUE(llm::kquant_mix_options(mix, 22, false, &co));
    const llm::DType base = mix[1] == '4' ? llm::DType::Q4_K : llm::DType::Q5_K;
    EXPECT_EQ(plan(co, "token_embd.weight", {32000, 2048}).dtype, base);
    EXPECT_EQ(plan(co, "output.weight", {32000, 2048}).dtype, llm::DType::Q6_K);
    for (int l = 0; l < 22; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      const llm::DType more = llm::kquant_more_bits_layer(l, 22) ? llm::DType::Q6_K : base;
      EXPECT_EQ(plan(co, b + "attn_v.weight", {256, 2048}).dtype, more) << mix << " " << l;
      EXPECT_EQ(plan(co, b + "ffn_down.weight", {2048, 5632}).dtype, more) << mix << " " << l;
      for (const char* k : {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"})
        EXPECT_EQ(plan(co, b + k + ".weight", {2048, 2048}).dtype, base) << mix << " " << k;
      EXPECT_EQ(plan(co, b + "attn_norm.weight", {2048}).dtype, llm::DType::F32);
    }
    EXPECT_EQ(plan(co, "blk.0.attn_q.weight", {2048, 2048}).group, 256u);
    EXPECT_TRUE(notes.empty());
  }
  // Tied: the embedding is the output matrix and takes its type.
  llm::LlmConvertOptions tied;
  ASSERT_TRUE(llm::kquant_mix_options("q4_K_M", 5, true, &tied));
  EXPECT_EQ(plan(tied, "token_embd.weight", {512, 256}).dtype, llm::DType::Q6_K);
  // Fallbacks: 64 columns -> llama.cpp's 32-value types; 172 -> f16.
  struct Fallback {
    llm::DType want, got;
    uint32_t group;
  };
  for (const Fallback& f : {Fallback{llm::DType::Q4_K, llm::DType::Q5_0, 32},
                            Fallback{llm::DType::Q5_K, llm::DType::Q5_1, 32},
                            Fallback{llm::DType::Q6_K, llm::DType::Q8, 32},
                            Fallback{llm::DType::Q3_K, llm::DType::Q4, 32},
                            Fallback{llm::DType::Q2_K, llm::DType::Q4, 32},
                            Fallback{llm::DType::IQ4_XS, llm::DType::IQ4_NL, 32}}) {
    llm::LlmConvertOptions co;
    co.requantize = true;
    co.dtype = f.want;
    notes.clear();
    const llm::LlmTensorSpec s = plan(co, "blk.0.attn_q.weight", {64, 64});
    EXPECT_EQ(s.dtype, f.got) << llm::dtype_name(f.want);
    EXPECT_EQ(s.group, f.group);
    EXPECT_EQ(plan(co, "blk.0.ffn_down.weight", {64, 172}).dtype, llm::DType::F16);
    ASSERT_EQ(notes.size(), 2u);
    EXPECT_NE(notes[0].find(std::string("stored as ") + llm::dtype_name(f.got)), std::string::npos) << notes[0];
  }
}

// llama.cpp's Q3_K_M, Q2_K, IQ4_XS and IQ4_NL on the TinyLlama shape (22
// layers; 32 query heads on 4 KV heads, and a model without GQA): the
// types llama_tensor_get_type gives each matrix, written out layer by layer.
TEST(Convert, LowBitMixPlans) {
  std::vector<std::string> notes;
  auto plan = [&](const llm::LlmConvertOptions& co, const std::string& name, std::vector<int64_t> shape) {
    return llm::plan_llm_tensor(name, shape, llm::DType::F32, 0, co, &notes);
  };
  using llm::DType;
  struct Case {
    const char* mix;
    int32_t n_gqa;
    DType base;
    DType attn_v[22], attn_output, ffn_down[22];
  };
  auto layers = [](DType first, int n_first, DType rest, DType* out) {
    for (int l = 0; l < 22; ++l) out[l] = l < n_first ? first : rest;
  };
  auto all = [&](DType t, DType* out) { layers(t, 0, t, out); };
  std::vector<Case> cases(7);
  // Q3_K_M: attn_v Q5_K in the first 2 layers, ffn_down in the first 22/16 = 1.
  cases[0] = {"q3_K_M", 8, DType::Q3_K, {}, DType::Q4_K, {}};
  layers(DType::Q5_K, 2, DType::Q4_K, cases[0].attn_v);
  layers(DType::Q5_K, 1, DType::Q4_K, cases[0].ffn_down);
  cases[1] = cases[0];
  cases[1].mix = "q3_k_m";
  // Q2_K: attn_v Q4_K with GQA >= 4, Q3_K without; attn_output, ffn_down Q3_K.
  cases[2] = {"q2_K", 8, DType::Q2_K, {}, DType::Q3_K, {}};
  all(DType::Q4_K, cases[2].attn_v);
  all(DType::Q3_K, cases[2].ffn_down);
  cases[3] = cases[2];
  cases[3].n_gqa = 1;
  all(DType::Q3_K, cases[3].attn_v);
  // IQ4_XS / IQ4_NL: ffn_down Q5_K in the first 22/8 = 2 layers, attn_v Q5_K with GQA >= 4.
  cases[4] = {"iq4_xs", 8, DType::IQ4_XS, {}, DType::IQ4_XS, {}};
  all(DType::Q5_K, cases[4].attn_v);
  layers(DType::Q5_K, 2, DType::IQ4_XS, cases[4].ffn_down);
  cases[5] = cases[4];
  cases[5].n_gqa = 2;
  all(DType::IQ4_XS, cases[5].attn_v);
  cases[6] = {"iq4_nl", 4, DType::IQ4_NL, {}, DType::IQ4_NL, {}};
  all(DType::Q5_K, cases[6].attn_v);
  layers(DType::Q5_K, 2, DType::IQ4_NL, cases[6].ffn_down);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.mix) + " gqa " + std::to_string(c.n_gqa));
    DType base;
    ASSERT_TRUE(llm::kquant_mix_base(c.mix, &base));
    EXPECT_EQ(base, c.base);
    llm::LlmConvertOptions co;
    ASSERT_TRUE(llm::kquant_mix_options(c.mix, 22, false, &co, c.n_gqa));
    EXPECT_TRUE(co.requantize);
    EXPECT_EQ(plan(co, "token_embd.weight", {32000, 2048}).dtype, c.base);
    EXPECT_EQ(plan(co, "output.weight", {32000, 2048}).dtype, DType::Q6_K);
    for (int l = 0; l < 22; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      EXPECT_EQ(plan(co, b + "attn_v.weight", {256, 2048}).dtype, c.attn_v[l]) << l;
      EXPECT_EQ(plan(co, b + "attn_output.weight", {2048, 2048}).dtype, c.attn_output) << l;
      EXPECT_EQ(plan(co, b + "ffn_down.weight", {2048, 5632}).dtype, c.ffn_down[l]) << l;
      for (const char* k : {"attn_q", "attn_k", "ffn_gate", "ffn_up"})
        EXPECT_EQ(plan(co, b + k + ".weight", {2048, 2048}).dtype, c.base) << k << " " << l;
    }
    EXPECT_EQ(plan(co, "blk.3.attn_q.weight", {2048, 2048}).group, uint32_t(llm::ggml_block_values(c.base)));
    EXPECT_TRUE(notes.empty());
    llm::LlmConvertOptions tied;
    ASSERT_TRUE(llm::kquant_mix_options(c.mix, 22, true, &tied, c.n_gqa));
    EXPECT_EQ(plan(tied, "token_embd.weight", {32000, 2048}).dtype, DType::Q6_K);
  }
  // Names llama.cpp does not have, or spelt otherwise, are not mixes.
  for (const char* name : {"q2_K_M", "q3_K", "q3_K_S", "iq4_XS", "IQ4_NL", "q2_K_S"}) {
    DType base;
    EXPECT_FALSE(llm::kquant_mix_base(name, &base)) << name;
  }
}

// stories260K through convert_to_llm with q4_K_M: its rows (64, 172) take
// the fallbacks; the file loads and the model's greedy choices over the 4
// reference continuations mostly match f32's (run.c's greedy tokens).
TEST(Convert, Q4KMStories260KLoadsAndRuns) {
  const llm::ModelSource f32 = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  llm::LlmConvertOptions co;
  ASSERT_TRUE(llm::kquant_mix_options("q4_K_M", f32.config.n_layers, true, &co));
  std::vector<std::string> notes;
  llm::convert_to_llm(f32, tmp_path("conv_q4km.llm"), co, {}, &notes);
  EXPECT_EQ(notes.size(), 1u + 5 * 7);  // every matrix: no 256-value blocks
  const llm::ModelSource got = llm::read_llm(tmp_path("conv_q4km.llm"));
  EXPECT_EQ(got.find("token_embd.weight")->dtype, llm::DType::Q8);  // tied output: Q6_K -> Q8
  EXPECT_EQ(got.find("blk.0.attn_q.weight")->dtype, llm::DType::Q5_0);
  EXPECT_EQ(got.find("blk.0.attn_v.weight")->dtype, llm::DType::Q5_0);
  EXPECT_EQ(got.find("blk.2.attn_v.weight")->dtype, llm::DType::Q8);  // a "more bits" layer
  EXPECT_EQ(got.find("blk.4.ffn_down.weight")->dtype, llm::DType::F16);
  llm::LoadOptions lo;
  lo.n_threads = 1;
  lo.reference_math = true;
  const auto model = llm::Model::from_source(got, lo);
  llm::SessionOptions so;
  so.kv_type = LLM_KV_F32;
  size_t agree = 0, total = 0;
  for (const auto& c : llm::testing::load_greedy_cases("stories260K_greedy.json")) {
    llm::Session s(*model, so);
    s.prefill(c.prompt_ids.data(), c.prompt_ids.size());
    for (int32_t tok : c.generated_ids) {
      const float* l = s.logits();
      agree += std::max_element(l, l + got.config.vocab_size) - l == tok;
      ++total;
      s.prefill(&tok, 1);
    }
  }
  std::printf("q4_K_M stories260K: %zu of %zu greedy steps agree with f32\n", agree, total);
  EXPECT_GE(double(agree) / double(total), 0.93);
}
