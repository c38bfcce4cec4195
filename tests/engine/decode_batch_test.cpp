// llm_decode_batch: same tokens as stepping each session alone; argument
// checks. On the CPU the pending tokens of the batch run as one forward pass
// (cpu::forward_batch), which must give every session the bits it gets alone:
// logits and K/V rows for every weight format, KV type and a sliding-window
// family; tokens and whole snapshots through Session::decode_batch; a
// failure in the middle leaves the failing session and those after it as
// they were.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/forward.h"
#include "core/error.h"
#include "engine/session.h"
#include "format/gguf.h"
#include "llm.h"
#include "model/model.h"
#include "ops/gguf_blocks.h"
#include "quant/quant.h"
#include "random_model.h"
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

// llm_decode_batch_each: every session its own sampling (greedy, two
// temperatures and seeds, a grammar) in one pass; each gets the tokens it
// gets stepping alone with that sampling.
TEST(DecodeBatch, EachSessionItsOwnSampling) {
  llm_model* m = load();
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_create(m, "root ::= \" yes.\" | \" no.\"", "root", &g), LLM_OK) << llm_last_error();
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a", "Tom and Sam went", "The cat"};
  std::vector<llm_sampling> samp(4);
  for (auto& s : samp) llm_sampling_init(&s);
  samp[1].temperature = 0.9f;
  samp[1].seed = 5;
  samp[2].temperature = 1.3f;
  samp[2].top_k = 20;
  samp[2].seed = 77;
  samp[3].grammar = g;
  const llm_sampling* each[4] = {nullptr, &samp[1], &samp[2], &samp[3]};
  std::vector<llm_session*> batch, alone;
  for (const auto& p : prompts) {
    batch.push_back(start(m, p));
    alone.push_back(start(m, p));
  }
  std::vector<std::vector<llm_token>> streams(prompts.size());
  // Until the grammar's session ends (" yes." or " no.", then an end-of-generation token).
  for (int step = 0; step < 16 && (streams[3].empty() || !llm_token_is_eog(m, streams[3].back())); ++step) {
    std::vector<llm_token> got(prompts.size());
    ASSERT_EQ(llm_decode_batch_each(batch.data(), batch.size(), each, got.data()), LLM_OK) << llm_last_error();
    for (size_t i = 0; i < prompts.size(); ++i) {
      llm_token want;
      ASSERT_EQ(llm_decode_step(alone[i], each[i], &want), LLM_OK);
      ASSERT_EQ(got[i], want) << "session " << i << " step " << step;
      streams[i].push_back(got[i]);
    }
  }
  EXPECT_TRUE(llm_token_is_eog(m, streams[3].back()));
  // The sampled sessions differ from greedy on the same pass: their settings were used.
  std::vector<llm_token> greedy(prompts.size());
  ASSERT_EQ(llm_decode_batch_each(batch.data(), 3, nullptr, greedy.data()), LLM_OK);
  for (size_t i = 0; i < 3; ++i) {
    llm_token want;
    ASSERT_EQ(llm_decode_step(alone[i], nullptr, &want), LLM_OK);
    EXPECT_EQ(greedy[i], want) << "session " << i;
  }

  // An invalid sampling anywhere: refused before any session moves.
  llm_sampling bad;
  std::memset(&bad, 0, sizeof bad);
  const llm_sampling* with_bad[3] = {nullptr, &samp[1], &bad};
  llm_token out[3] = {7, 7, 7};
  EXPECT_EQ(llm_decode_batch_each(batch.data(), 3, with_bad, out), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()).find("sampling 2"), std::string::npos) << llm_last_error();
  EXPECT_EQ(out[0], -1);
  // A grammar of another model, likewise.
  llm_model* other = load();
  llm_grammar* foreign = nullptr;
  ASSERT_EQ(llm_grammar_create(other, "root ::= \" yes.\"", "root", &foreign), LLM_OK);
  llm_sampling fs;
  llm_sampling_init(&fs);
  fs.grammar = foreign;
  const llm_sampling* with_foreign[3] = {nullptr, nullptr, &fs};
  EXPECT_EQ(llm_decode_batch_each(batch.data(), 3, with_foreign, out), LLM_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i < 3; ++i) {  // nothing moved: each still matches its twin
    llm_token x, y;
    ASSERT_EQ(llm_decode_step(batch[i], each[i], &x), LLM_OK);
    ASSERT_EQ(llm_decode_step(alone[i], each[i], &y), LLM_OK);
    EXPECT_EQ(x, y) << "session " << i;
  }
  llm_grammar_free(foreign);
  llm_model_free(other);
  for (auto* s : batch) llm_session_free(s);
  for (auto* s : alone) llm_session_free(s);
  llm_grammar_free(g);
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

// ---------------------------------------------------------------- the CPU batched pass

namespace {

using llm::DType;

struct Format {
  DType t;
  uint32_t group;
};

// Every weight format the CPU runs: the native ones and the GGUF block types
// (Q4_0 and Q8_0 are Q4 g32 and Q8).
const Format kFormats[] = {{DType::F32, 0},    {DType::F16, 0},    {DType::BF16, 0},    {DType::Q8, 32},
                           {DType::Q4, 32},    {DType::Q4, 64},    {DType::Q4, 128},    {DType::Q4M, 32},
                           {DType::Q5_0, 32},  {DType::Q5_1, 32},  {DType::IQ4_NL, 32}, {DType::Q2_K, 256},
                           {DType::Q3_K, 256}, {DType::Q4_K, 256}, {DType::Q5_K, 256},  {DType::Q6_K, 256},
                           {DType::IQ4_XS, 256}};

std::string name_of(const Format& f) {
  return std::string(llm::dtype_name(f.t)) + (f.group && !llm::dtype_is_ggml_block(f.t) ? "g" + std::to_string(f.group) : "");
}

const llm::VocabData& vocab512() {
  static const llm::ModelSource src =
      llm::read_gguf(std::string(LLM_TEST_DATA_DIR) + "/families/llama.gguf", true, nullptr);
  return src.vocab;
}

// A random Llama (2 layers, dim 256 so that every K-quant row is whole
// super-blocks, GQA 8/4) with every matrix in format f: quantized from the
// random f32 values for the native formats, random well-formed blocks for
// the GGUF ones (there is no quantizer for those).
std::unique_ptr<llm::Model> random_model(const Format& f, int threads, uint64_t kv_budget = 0, int32_t seq_len = 512,
                                         bool huge_pages = false, bool reference_math = false) {
  llm::ModelConfig c;
  c.dim = 256;
  c.hidden_dim = 512;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 32;
  c.vocab_size = 512;
  c.seq_len = seq_len;
  llm::ModelSource src = llm::testing::random_llama(c, 7, false, [](const std::string& kind) {
    return kind == "token_embd" ? 0.5f : kind.find("norm") != std::string::npos ? 0.1f : 0.06f;
  });
  src.vocab = vocab512();
  std::mt19937 rng(3);
  for (llm::TensorData& t : src.tensors) {
    if (t.shape.size() != 2 || f.t == DType::F32) continue;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    auto bytes = std::make_shared<std::vector<uint8_t>>();
    if (llm::dtype_is_ggml_block(f.t)) {
      *bytes = llm::testing::random_gguf_rows(f.t, rows, cols, rng);
    } else {
      const size_t rb = llm::dtype_row_bytes(f.t, cols, f.group);
      bytes->resize(rb * size_t(rows));
      const float* v = reinterpret_cast<const float*>(t.data);
      for (int64_t r = 0; r < rows; ++r) llm::quantize_row(f.t, f.group, v + r * cols, bytes->data() + size_t(r) * rb, cols);
    }
    t.dtype = f.t;
    t.group = f.group;
    t.data = bytes->data();
    t.nbytes = bytes->size();
    t.owned = std::move(bytes);
  }
  llm::LoadOptions lo;
  lo.n_threads = threads;
  lo.huge_pages = huge_pages;
  lo.reference_math = reference_math;
  lo.kv_budget_bytes = kv_budget;
  return llm::Model::from_source(std::move(src), lo);
}

std::unique_ptr<llm::Model> family_model(const std::string& name, int threads) {
  llm::LoadOptions lo;
  lo.n_threads = threads;
  lo.huge_pages = false;
  return llm::Model::load(std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".gguf", lo);
}

// One sequence's K/V pages (both groups) straight from the model's pools.
struct Pages {
  const llm::Model* m = nullptr;
  std::vector<llm::kv::Page*> t[2];
  Pages(const llm::Model& model, llm_kv_type type, uint32_t slots) : m(&model) {
    const size_t n = (slots + 15) / 16;
    EXPECT_TRUE(model.kv_pool().acquire(type, n, t[0]));
    if (model.kv_pool_local()) {
      EXPECT_TRUE(model.kv_pool_local()->acquire(type, n, t[1]));
    }
  }
  ~Pages() {
    for (llm::kv::Page* p : t[0]) m->kv_pool().release(p);
    for (llm::kv::Page* p : t[1]) m->kv_pool_local()->release(p);
  }
  llm::cpu::ForwardArgs args(const int32_t* toks, int64_t n, uint32_t p0, float* logits) const {
    llm::cpu::ForwardArgs a;
    a.tokens = toks;
    a.n = n;
    a.p0 = p0;
    a.pages[0] = t[0].data();
    a.pages[1] = t[1].data();
    a.logits = logits;
    return a;
  }
};

// The stored bytes (row and scales) of slot `slot` of every layer, K and V, head.
std::vector<uint8_t> slot_bytes(const llm::Model& m, const Pages& p, uint32_t slot) {
  std::vector<uint8_t> out;
  for (const llm::LayerWeights& w : m.layers()) {
    const llm::kv::PagePool& pool = w.kv_group ? *m.kv_pool_local() : m.kv_pool();
    const llm::kv::Geometry& g = pool.geometry();
    const llm::kv::Page* page = p.t[w.kv_group][slot / 16];
    const size_t rb = llm::kv::row_bytes(page->type, g.head_dim);
    for (int kv = 0; kv < 2; ++kv)
      for (int32_t h = 0; h < g.n_kv_heads; ++h) {
        const uint8_t* r = llm::kv::row_ptr(g, page, w.kv_layer, kv, h, int32_t(slot % 16));
        out.insert(out.end(), r, r + rb);
        if (llm::kv::has_scales(page->type)) {
          const uint8_t* s = reinterpret_cast<const uint8_t*>(llm::kv::scale_ptr(g, page, w.kv_layer, kv, h, int32_t(slot % 16)));
          out.insert(out.end(), s, s + 2 * sizeof(float));
        }
      }
  }
  return out;
}

// b sequences of different lengths: each prefilled alone into two page
// sets, then `steps` decode steps as one forward_batch on one set and one
// forward each on the other. Logits and the new K/V rows must match bit for
// bit.
void check_forward_batch(const llm::Model& m, size_t b, llm_kv_type kv, int steps, const std::string& what) {
  SCOPED_TRACE(what + " batch " + std::to_string(b));
  const size_t vocab = size_t(m.config().vocab_size);
  std::mt19937 rng(uint32_t(100 + b));
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab) - 1);
  std::vector<std::vector<int32_t>> seq(b);
  std::vector<std::unique_ptr<Pages>> batch_pages, alone_pages;
  std::vector<std::vector<float>> batch_logits(b, std::vector<float>(vocab)), alone_logits = batch_logits;
  llm::cpu::ForwardScratch sb, sa;
  for (size_t k = 0; k < b; ++k) {
    const size_t len = 1 + (k * 7 + b) % 29;
    for (size_t i = 0; i < len; ++i) seq[k].push_back(tok(rng));
    batch_pages.push_back(std::make_unique<Pages>(m, kv, uint32_t(len + size_t(steps))));
    alone_pages.push_back(std::make_unique<Pages>(m, kv, uint32_t(len + size_t(steps))));
    llm::cpu::forward(m, batch_pages[k]->args(seq[k].data(), int64_t(len), 0, batch_logits[k].data()), sb);
    llm::cpu::forward(m, alone_pages[k]->args(seq[k].data(), int64_t(len), 0, alone_logits[k].data()), sa);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> next(b);
    std::vector<llm::cpu::ForwardArgs> args;
    for (size_t k = 0; k < b; ++k) {
      next[k] = tok(rng);
      args.push_back(batch_pages[k]->args(&next[k], 1, uint32_t(seq[k].size()), batch_logits[k].data()));
    }
    llm::cpu::forward_batch(m, args.data(), args.size(), sb);
    for (size_t k = 0; k < b; ++k) {
      const uint32_t p0 = uint32_t(seq[k].size());
      llm::cpu::forward(m, alone_pages[k]->args(&next[k], 1, p0, alone_logits[k].data()), sa);
      ASSERT_EQ(0, std::memcmp(batch_logits[k].data(), alone_logits[k].data(), vocab * sizeof(float)))
          << "logits of sequence " << k << " at position " << p0;
      ASSERT_EQ(slot_bytes(m, *batch_pages[k], p0), slot_bytes(m, *alone_pages[k], p0))
          << "K/V of sequence " << k << " at position " << p0;
      seq[k].push_back(next[k]);
    }
  }
}

}  // namespace

TEST(ForwardBatch, LogitsAndKvEqualEachSequenceAloneInEveryWeightFormat) {
  for (const Format& f : kFormats) {
    const auto m = random_model(f, 2);
    for (size_t b : {1, 2, 3, 4, 5, 7, 8, 11, 16}) check_forward_batch(*m, b, LLM_KV_F16, 3, name_of(f));
    if (HasFatalFailure()) return;
  }
}

TEST(ForwardBatch, EveryKernelFamily) {
  // The batched matmuls run the prefill kernels of each family (scalar,
  // AVX2, AVX-512), the single rows the decode ones.
  struct Restore {
    llm::cpu::Isa saved = llm::cpu::max_isa();
    ~Restore() { llm::cpu::set_max_isa(saved); }
  } restore;
  for (llm::cpu::Isa isa : {llm::cpu::Isa::Scalar, llm::cpu::Isa::Avx2}) {
    if (isa > llm::cpu::best_isa()) continue;
    llm::cpu::set_max_isa(isa);
    for (const Format& f : kFormats) {
      const auto m = random_model(f, 2);
      for (size_t b : {5}) check_forward_batch(*m, b, LLM_KV_F16, 2, std::string(llm::cpu::isa_name(isa)) + " " + name_of(f));
      if (HasFatalFailure()) return;
    }
  }
}

// The load's weight copy interleaves Q4_0 (Q4 g32) matrices by 8 rows (the
// X8 layout) under the AVX2 and AVX-512 families; Q8_0 (Q8) ones and the
// portable family keep the rows. The model then still gives
// each sequence the same bits alone or batched. Its logits: under AVX2 within
// float-rounding distance of the plain layout's (the same quantized
// activations and integer dots, summed in another order); under AVX-512,
// whose plain-row prefill kernels round activations their own way, as close
// to exact math as the plain layout's are.
void check_x8_model(const Format& f, llm::cpu::Isa isa, bool expect_x8) {
  SCOPED_TRACE(name_of(f) + " " + llm::cpu::isa_name(isa));
  llm::cpu::set_max_isa(isa);
  const auto packed = random_model(f, 2, 0, 512, true);
  const auto plain = random_model(f, 2, 0, 512, false);
  const llm::cpu::WeightLayout want = expect_x8 ? llm::cpu::WeightLayout::X8 : llm::cpu::WeightLayout::Rows;
  for (const llm::cpu::WeightView* w : {&packed->layers()[0].wq, &packed->layers()[1].w_down, &packed->output()})
    EXPECT_EQ(w->layout, want);
  EXPECT_EQ(plain->layers()[0].wq.layout, llm::cpu::WeightLayout::Rows);
  if (!expect_x8) return;
  for (size_t b : {1, 3, 9, 16}) check_forward_batch(*packed, b, LLM_KV_F16, 2, "x8");
  const auto exact = random_model(f, 2, 0, 512, false, true);
  const size_t vocab = size_t(packed->config().vocab_size);
  std::vector<int32_t> toks;
  for (int i = 0; i < 40; ++i) toks.push_back((i * 37 + 11) % int32_t(vocab));
  auto logits = [&](const llm::Model& m) {
    std::vector<float> out(vocab);
    llm::cpu::ForwardScratch sc;
    Pages pg(m, LLM_KV_F16, 41);
    llm::cpu::forward(m, pg.args(toks.data(), int64_t(toks.size()), 0, out.data()), sc);
    return out;
  };
  const std::vector<float> a = logits(*packed), b = logits(*plain), e = logits(*exact);
  double diff2 = 0, ref2 = 0, err_a = 0, err_b = 0;
  for (size_t i = 0; i < vocab; ++i) {
    diff2 += double(a[i] - b[i]) * (a[i] - b[i]);
    ref2 += double(b[i]) * b[i];
    err_a += double(a[i] - e[i]) * (a[i] - e[i]);
    err_b += double(b[i] - e[i]) * (b[i] - e[i]);
  }
  EXPECT_GT(ref2, 0.0);
  EXPECT_GT(diff2, 0.0);  // not the same path
  if (isa == llm::cpu::Isa::Avx2) {
    EXPECT_LT(diff2, 1e-8 * ref2);
  }
  EXPECT_LT(err_a, 1.5 * err_b + 1e-9 * ref2) << "packed " << err_a << " plain " << err_b;
  EXPECT_LT(err_a, 1e-2 * ref2);
}

TEST(ForwardBatch, X8LayoutWhereTheKernelsWantIt) {
  if (llm::cpu::best_isa() < llm::cpu::Isa::Avx2) GTEST_SKIP() << "no AVX2 here";
  struct Restore {
    llm::cpu::Isa saved = llm::cpu::max_isa();
    ~Restore() { llm::cpu::set_max_isa(saved); }
  } restore;
  const bool avx512 = llm::cpu::best_isa() >= llm::cpu::Isa::Avx512;
  check_x8_model({DType::Q4, 32}, llm::cpu::Isa::Avx2, true);
  check_x8_model({DType::Q8, 32}, llm::cpu::Isa::Avx2, false);
  if (avx512) {
    check_x8_model({DType::Q4, 32}, llm::cpu::Isa::Avx512, true);
    check_x8_model({DType::Q8, 32}, llm::cpu::Isa::Avx512, false);  // not chosen yet (matmul.cpp)
  }
  check_x8_model({DType::Q4, 32}, llm::cpu::Isa::Scalar, false);
  check_x8_model({DType::Q4, 64}, llm::cpu::Isa::Avx2, false);
}

TEST(ForwardBatch, EveryBatchSizeAndKvType) {
  const auto m = random_model({DType::Q4, 32}, 2);
  for (size_t b = 1; b <= 16; ++b) check_forward_batch(*m, b, LLM_KV_F16, 2, "q4 f16 kv");
  for (llm_kv_type kv : {LLM_KV_F32, LLM_KV_INT8, LLM_KV_INT4})
    for (size_t b : {2, 9, 16}) check_forward_batch(*m, b, kv, 2, "q4 kv " + std::to_string(int(kv)));
}

TEST(ForwardBatch, SlidingWindowFamiliesAndThreadCounts) {
  for (const char* fam : {"gemma2", "gemma3", "qwen2", "phi3"})
    for (int threads : {1, 2, 3}) {
      const auto m = family_model(fam, threads);
      for (size_t b : {2, 6, 16}) check_forward_batch(*m, b, LLM_KV_F16, 12, std::string(fam) + " threads " + std::to_string(threads));
      if (HasFatalFailure()) return;
    }
}

TEST(ForwardBatch, CancelOfAnySequenceStopsThePass) {
  const auto m = random_model({DType::Q8, 32}, 2);
  Pages a(*m, LLM_KV_F16, 4), b(*m, LLM_KV_F16, 4);
  std::vector<float> la(512), lb(512);
  const int32_t t[2] = {5, 9};
  llm::cpu::ForwardArgs args[2] = {a.args(&t[0], 1, 0, la.data()), b.args(&t[1], 1, 0, lb.data())};
  int polls = 0;
  args[1].cancel = [&polls] { return ++polls == 2; };  // before the second layer
  llm::cpu::ForwardScratch s;
  try {
    llm::cpu::forward_batch(*m, args, 2, s);
    FAIL() << "no cancel";
  } catch (const llm::Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_CANCELLED);
  }
  EXPECT_EQ(polls, 2);
}

// ---------------------------------------------------------------- Session::decode_batch on the CPU

namespace {

using Sessions = std::vector<std::unique_ptr<llm::Session>>;

std::vector<uint8_t> snapshot(const llm::Session& s) {
  std::vector<uint8_t> b;
  s.save(b);
  return b;
}

// b sessions of prompt lengths 1 + (7k + b) % 29 (+ extra for the first),
// the same for `alone`.
Sessions start_sessions(const llm::Model& m, size_t b, const llm::SessionOptions& o, size_t extra = 0) {
  Sessions out;
  std::mt19937 rng(uint32_t(7 + b));
  std::uniform_int_distribution<int32_t> tok(0, m.config().vocab_size - 1);
  for (size_t k = 0; k < b; ++k) {
    out.push_back(std::make_unique<llm::Session>(m, o));
    std::vector<int32_t> prompt(1 + (k * 7 + b) % 29 + (k == 0 ? extra : 0));
    for (auto& t : prompt) t = tok(rng);
    out.back()->prefill(prompt.data(), prompt.size());
  }
  return out;
}

// decode_batch over `batch` and decode_step over `alone`, step by step: the
// same tokens (greedy on even steps, seeded sampling on odd ones) and, after
// every step, the same snapshot (tokens, KV pages, sampler state).
void check_sessions(Sessions& batch, Sessions& alone, int steps, const std::string& what) {
  SCOPED_TRACE(what + " batch " + std::to_string(batch.size()));
  std::vector<llm::Session*> ptrs;
  for (auto& s : batch) ptrs.push_back(s.get());
  for (int step = 0; step < steps; ++step) {
    llm_sampling samp;
    llm_sampling_init(&samp);
    if (step % 2) {
      samp.temperature = 0.8f;
      samp.top_k = 40;
      samp.seed = uint64_t(step);
    }
    std::vector<int32_t> got(batch.size(), -1);
    const std::vector<const llm_sampling*> each(batch.size(), &samp);
    llm::Session::decode_batch(ptrs.data(), ptrs.size(), each.data(), got.data());
    for (size_t k = 0; k < batch.size(); ++k) {
      ASSERT_EQ(got[k], alone[k]->decode_step(&samp)) << "session " << k << " step " << step;
      ASSERT_EQ(batch[k]->n_cached(), alone[k]->n_cached()) << "session " << k << " step " << step;
      ASSERT_EQ(snapshot(*batch[k]), snapshot(*alone[k])) << "session " << k << " step " << step;
    }
  }
}

}  // namespace

TEST(DecodeBatchCpu, TokensAndSnapshotsEqualSteppingAloneInEveryWeightFormat) {
  for (const Format& f : kFormats) {
    const auto m = random_model(f, 2);
    for (size_t b : {1, 2, 5, 16}) {
      Sessions batch = start_sessions(*m, b, {}), alone = start_sessions(*m, b, {});
      check_sessions(batch, alone, 4, name_of(f));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(DecodeBatchCpu, EveryBatchSizeAndKvType) {
  const auto m = random_model({DType::Q4, 32}, 2);
  for (llm_kv_type kv : {LLM_KV_F16, LLM_KV_F32, LLM_KV_INT8, LLM_KV_INT4})
    for (size_t b = 1; b <= 16; ++b) {
      if (kv != LLM_KV_F16 && b % 5 != 1) continue;
      llm::SessionOptions o;
      o.kv_type = kv;
      Sessions batch = start_sessions(*m, b, o), alone = start_sessions(*m, b, o);
      check_sessions(batch, alone, 5, "kv " + std::to_string(int(kv)));
      if (HasFatalFailure()) return;
    }
}

TEST(DecodeBatchCpu, MoreSessionsThanOnePassTakes) {
  const auto m = random_model({DType::Q8, 32}, 2);
  Sessions batch = start_sessions(*m, 70, {}), alone = start_sessions(*m, 70, {});
  check_sessions(batch, alone, 3, "70 sessions");
}

TEST(DecodeBatchCpu, SlidingWindowFamiliesDropPagesAsAlone) {
  // Window 8 on some layers: past 24 tokens the windowed layers give pages
  // back during the batched steps.
  for (const char* fam : {"gemma2", "gemma3"}) {
    const auto m = family_model(fam, 2);
    ASSERT_NE(m->kv_pool_local(), nullptr) << fam;
    Sessions batch = start_sessions(*m, 7, {}), alone = start_sessions(*m, 7, {});
    check_sessions(batch, alone, 40, fam);
    for (size_t k = 0; k < batch.size(); ++k) EXPECT_EQ(batch[k]->n_local_pages(), alone[k]->n_local_pages());
  }
}

TEST(DecodeBatchCpu, SessionsThatCannotJoinRunAloneWithTheSameResult) {
  // Session 1 has an eviction window (it evicts every few steps and then
  // runs alone), session 3 a context that fills up at the end; the others
  // batch around them.
  const auto m = random_model({DType::Q8, 32}, 2);
  auto make = [&](Sessions& out) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> tok(0, 511);
    for (int k = 0; k < 5; ++k) {
      llm::SessionOptions o;
      if (k == 1) {
        o.window = 40;
        o.n_sink = 4;
      }
      std::vector<int32_t> prompt(size_t(k == 1 ? 34 : 3 + 5 * k));
      if (k == 3) o.max_tokens = uint32_t(prompt.size() + 11);  // full after 12 steps
      for (auto& t : prompt) t = tok(rng);
      out.push_back(std::make_unique<llm::Session>(*m, o));
      out.back()->prefill(prompt.data(), prompt.size());
    }
  };
  Sessions batch, alone;
  make(batch);
  make(alone);
  check_sessions(batch, alone, 12, "mixed");
  // Session 3 is full now: the batch stops at it. Sessions 0..2 advance, 3 and 4 do not.
  std::vector<llm::Session*> ptrs;
  for (auto& s : batch) ptrs.push_back(s.get());
  std::vector<std::vector<uint8_t>> before;
  for (auto* s : ptrs) before.push_back(snapshot(*s));
  std::vector<int32_t> got(5, -1);
  try {
    llm::Session::decode_batch(ptrs.data(), ptrs.size(), nullptr, got.data());
    FAIL() << "session 3 should be full";
  } catch (const llm::Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_CONTEXT_FULL);
  }
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got[k], alone[k]->decode_step(nullptr)) << k;
  for (size_t k = 3; k < 5; ++k) {
    EXPECT_EQ(got[k], -1);
    EXPECT_EQ(snapshot(*ptrs[k]), before[k]) << k;
  }
}

TEST(DecodeBatchCpu, PoolFullInTheMiddleLeavesTheRestUnchanged) {
  // 16 KiB pages (2 layers x K,V x 4 heads x 16 slots x 32 x f16). Four
  // sessions of exactly one full page each; room for two more pages, so
  // the third session cannot take the page its next token needs.
  const Format f{DType::Q4, 32};
  const auto m = random_model(f, 2, 6 * 16384);
  const auto ref = random_model(f, 2);
  ASSERT_EQ(m->kv_pool().page_bytes(LLM_KV_F16), 16384u);
  auto make = [](const llm::Model& model, Sessions& out) {
    std::mt19937 rng(2);
    std::uniform_int_distribution<int32_t> tok(0, 511);
    for (int k = 0; k < 4; ++k) {
      std::vector<int32_t> prompt(15);
      for (auto& t : prompt) t = tok(rng);
      out.push_back(std::make_unique<llm::Session>(model, llm::SessionOptions{}));
      out.back()->prefill(prompt.data(), prompt.size());
      out.back()->decode_step(nullptr);  // pending: slot 15, the last of page 0
    }
  };
  Sessions batch, alone;
  make(*m, batch);
  make(*ref, alone);
  std::vector<llm::Session*> ptrs;
  for (auto& s : batch) ptrs.push_back(s.get());
  std::vector<int32_t> got(4, -1);
  llm::Session::decode_batch(ptrs.data(), 4, nullptr, got.data());  // slot 15: no new page
  for (size_t k = 0; k < 4; ++k) ASSERT_EQ(got[k], alone[k]->decode_step(nullptr));
  std::vector<std::vector<uint8_t>> before;
  for (auto* s : ptrs) before.push_back(snapshot(*s));
  std::fill(got.begin(), got.end(), -1);
  try {
    llm::Session::decode_batch(ptrs.data(), 4, nullptr, got.data());  // slot 16: a page each
    FAIL() << "the pool should be full";
  } catch (const llm::Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_CONTEXT_FULL);
  }
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(got[k], alone[k]->decode_step(nullptr)) << k;
    EXPECT_EQ(snapshot(*ptrs[k]), snapshot(*alone[k])) << k;
  }
  for (size_t k = 2; k < 4; ++k) {
    EXPECT_EQ(got[k], -1);
    EXPECT_EQ(snapshot(*ptrs[k]), before[k]) << k;
    EXPECT_EQ(ptrs[k]->n_pages(), 1u) << k;
  }
}

// ---------------------------------------------------------------- prompt chunks in the pass

namespace {

// decode_batch with prompt chunks over `batch`, prefill + decode_step over
// `alone`: session k gets chunk_len(k, step) random tokens at a step (0:
// none) and samples unless sample(k, step) says no; the same tokens and
// snapshots after every step. Sessions may start empty (their first step
// must bring a prompt).
void check_prompt_steps(Sessions& batch, Sessions& alone, int steps, const std::function<size_t(size_t, int)>& chunk_len,
                        const std::function<bool(size_t, int)>& sample, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<llm::Session*> ptrs;
  for (auto& s : batch) ptrs.push_back(s.get());
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, batch[0]->model().config().vocab_size - 1);
  for (int step = 0; step < steps; ++step) {
    llm_sampling samp;
    llm_sampling_init(&samp);
    if (step % 2) {
      samp.temperature = 0.8f;
      samp.seed = uint64_t(step);
    }
    std::vector<std::vector<int32_t>> toks(batch.size());
    std::vector<llm::PromptChunk> chunks(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      toks[k].resize(chunk_len(k, step));
      for (auto& t : toks[k]) t = tok(rng);
      chunks[k].tokens = toks[k].data();
      chunks[k].n = toks[k].size();
      chunks[k].sample = sample(k, step);
    }
    std::vector<int32_t> got(batch.size(), -1);
    const std::vector<const llm_sampling*> each(batch.size(), &samp);
    llm::Session::decode_batch(ptrs.data(), ptrs.size(), each.data(), got.data(), nullptr, chunks.data());
    for (size_t k = 0; k < batch.size(); ++k) {
      if (!toks[k].empty()) alone[k]->prefill(toks[k].data(), toks[k].size());
      const int32_t want = chunks[k].sample ? alone[k]->decode_step(&samp) : -1;
      ASSERT_EQ(got[k], want) << "session " << k << " step " << step;
      ASSERT_EQ(batch[k]->n_cached(), alone[k]->n_cached()) << "session " << k << " step " << step;
      ASSERT_EQ(snapshot(*batch[k]), snapshot(*alone[k])) << "session " << k << " step " << step;
    }
  }
}

// Every few steps some sessions take a prompt chunk (1..40 tokens), some of
// them without sampling (a chunk of a longer prompt); two sessions start empty.
size_t mixed_chunk(size_t k, int step) {
  if (step == 0 && k >= 4) return 3 + k;  // the empty ones
  return (k * 5 + size_t(step) * 3) % 7 == 0 ? 1 + (k * 13 + size_t(step) * 7) % 40 : 0;
}
bool mixed_sample(size_t k, int step) { return (k + size_t(step)) % 4 != 0 || mixed_chunk(k, step) == 0; }

Sessions with_empty(const llm::Model& m, const llm::SessionOptions& o) {
  Sessions s = start_sessions(m, 4, o);
  for (int k = 0; k < 2; ++k) s.push_back(std::make_unique<llm::Session>(m, o));
  return s;
}

}  // namespace

TEST(DecodeBatchCpu, PromptChunksJoinThePassAsPrefillAlone) {
  for (const Format& f : {Format{DType::Q4, 32}, Format{DType::Q8, 32}, Format{DType::F16, 0}, Format{DType::Q4_K, 256}}) {
    const auto m = random_model(f, 2);
    Sessions batch = with_empty(*m, {}), alone = with_empty(*m, {});
    check_prompt_steps(batch, alone, 12, mixed_chunk, mixed_sample, name_of(f));
    if (HasFatalFailure()) return;
  }
}

TEST(DecodeBatchCpu, PromptChunksWithSlidingWindowLayersAndThreadCounts) {
  for (const char* fam : {"gemma2", "gemma3"})
    for (int threads : {1, 3}) {
      const auto m = family_model(fam, threads);
      Sessions batch = with_empty(*m, {}), alone = with_empty(*m, {});
      check_prompt_steps(batch, alone, 14, mixed_chunk, mixed_sample, std::string(fam) + " threads " + std::to_string(threads));
      if (HasFatalFailure()) return;
    }
}

TEST(DecodeBatchCpu, PromptChunksOverOnePassRunInSeveralOrAlone) {
  // 300 + 300 rows do not fit one pass of 512; a 600-token chunk never joins
  // (it runs alone, in two chunks of its own prefill); a session with an
  // eviction window and no room runs alone too.
  const auto m = random_model({DType::Q8, 32}, 2, 0, 2048);
  auto make = [&](Sessions& out) {
    out = start_sessions(*m, 3, {});
    llm::SessionOptions w;
    w.window = 64;
    w.n_sink = 4;
    out.push_back(std::make_unique<llm::Session>(*m, w));
    std::vector<int32_t> p(60, 7);
    out.back()->prefill(p.data(), p.size());
    out.push_back(std::make_unique<llm::Session>(*m, llm::SessionOptions{}));
  };
  Sessions batch, alone;
  make(batch);
  make(alone);
  auto len = [](size_t k, int step) -> size_t {
    if (step == 0) return k == 4 ? 600 : k < 2 ? 300 : k == 3 ? 10 : 0;
    return step == 2 && k == 2 ? 511 : 0;
  };
  check_prompt_steps(batch, alone, 4, len, [](size_t, int) { return true; }, "long chunks");
}

// Through the C API: a new request's prompt joins three running sessions;
// a chunk without sampling; a bad id anywhere moves nothing.
TEST(DecodeBatch, PrefillJoinsRunningSessions) {
  llm_model* m = load();
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a", "Tom and Sam went"};
  std::vector<llm_session*> batch, alone;
  for (const auto& p : prompts) {
    batch.push_back(start(m, p));
    alone.push_back(start(m, p));
  }
  llm_session *fresh = nullptr, *fresh_alone = nullptr;
  ASSERT_EQ(llm_session_create(m, nullptr, &fresh), LLM_OK);
  ASSERT_EQ(llm_session_create(m, nullptr, &fresh_alone), LLM_OK);
  batch.push_back(fresh);
  alone.push_back(fresh_alone);
  llm_token p[64];
  size_t np = 0;
  const std::string text = "The little dog ran to the park";
  ASSERT_EQ(llm_tokenize(m, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, p, 64, &np), LLM_OK);
  ASSERT_GT(np, 4u);
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 0.9f;
  samp.seed = 3;
  const std::vector<const llm_sampling*> each(batch.size(), &samp);
  // A bad id in the new prompt: LLM_ERR_INVALID_ARGUMENT, nothing moved.
  std::vector<llm_session_stats_t> before(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    before[i].struct_size = sizeof(llm_session_stats_t);
    ASSERT_EQ(llm_session_stats(batch[i], &before[i]), LLM_OK);
  }
  std::vector<llm_token> bad(p, p + np);
  bad[2] = 1 << 20;
  const llm_token* ptoks[4] = {nullptr, nullptr, nullptr, bad.data()};
  size_t nps[4] = {0, 0, 0, np};
  std::vector<llm_token> got(batch.size(), 0);
  EXPECT_EQ(llm_decode_batch_prefill(batch.data(), batch.size(), ptoks, nps, nullptr, each.data(), got.data()),
            LLM_ERR_INVALID_ARGUMENT);
  for (size_t i = 0; i < batch.size(); ++i) {
    llm_session_stats_t st;
    st.struct_size = sizeof st;
    ASSERT_EQ(llm_session_stats(batch[i], &st), LLM_OK);
    EXPECT_EQ(st.n_tokens, before[i].n_tokens) << i;
    EXPECT_EQ(got[i], -1) << i;
  }
  // The first half of the prompt without sampling, then the rest with it.
  const size_t half = np / 2;
  const int32_t no[4] = {1, 1, 1, 0};
  ptoks[3] = p;
  nps[3] = half;
  ASSERT_EQ(llm_decode_batch_prefill(batch.data(), batch.size(), ptoks, nps, no, each.data(), got.data()), LLM_OK)
      << llm_last_error();
  EXPECT_EQ(got[3], -1);
  ASSERT_EQ(llm_prefill(fresh_alone, p, half), LLM_OK);
  for (size_t i = 0; i < 3; ++i) {
    llm_token want;
    ASSERT_EQ(llm_decode_step(alone[i], &samp, &want), LLM_OK);
    EXPECT_EQ(got[i], want) << i;
  }
  ptoks[3] = p + half;
  nps[3] = np - half;
  ASSERT_EQ(llm_decode_batch_prefill(batch.data(), batch.size(), ptoks, nps, nullptr, each.data(), got.data()), LLM_OK);
  ASSERT_EQ(llm_prefill(fresh_alone, p + half, np - half), LLM_OK);
  for (int step = 0; step < 20; ++step) {
    if (step > 0) {
      ASSERT_EQ(llm_decode_batch_prefill(batch.data(), batch.size(), nullptr, nullptr, nullptr, each.data(), got.data()),
                LLM_OK);
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      llm_token want;
      ASSERT_EQ(llm_decode_step(alone[i], &samp, &want), LLM_OK);
      ASSERT_EQ(got[i], want) << "session " << i << " step " << step;
    }
  }
  // prompts NULL with a count: refused.
  const size_t one[4] = {0, 0, 0, 1};
  EXPECT_EQ(llm_decode_batch_prefill(batch.data(), batch.size(), nullptr, one, nullptr, each.data(), got.data()),
            LLM_ERR_INVALID_ARGUMENT);
  for (auto* s : batch) llm_session_free(s);
  for (auto* s : alone) llm_session_free(s);
  llm_model_free(m);
}

// llm_prefill starts the seed's stream again: generating, cutting back to
// the prompt and appending its last token again gives the same tokens.
TEST(DecodeBatch, PrefillRestartsTheSeedsStream) {
  llm_model* m = load();
  llm_session* s = start(m, "Once upon a time there was");
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  ASSERT_EQ(llm_session_stats(s, &st), LLM_OK);
  const uint32_t n_prompt = st.n_tokens;
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 1.5f;
  samp.seed = 42;
  auto run = [&] {
    std::vector<llm_token> out(12);
    for (auto& t : out) EXPECT_EQ(llm_decode_step(s, &samp, &t), LLM_OK);
    return out;
  };
  const std::vector<llm_token> first = run();
  ASSERT_EQ(llm_session_stats(s, &st), LLM_OK);
  std::vector<llm_token> last(1);
  {
    llm_token t[64];
    size_t n = 0;
    const std::string p = "Once upon a time there was";
    ASSERT_EQ(llm_tokenize(m, p.data(), p.size(), LLM_TOKENIZE_ADD_BOS, t, 64, &n), LLM_OK);
    last[0] = t[n - 1];
  }
  ASSERT_EQ(llm_kv_evict(s, n_prompt - 1, st.n_tokens - (n_prompt - 1)), LLM_OK);
  ASSERT_EQ(llm_prefill(s, last.data(), 1), LLM_OK);
  EXPECT_EQ(run(), first);
  llm_session_free(s);
  llm_model_free(m);
}
