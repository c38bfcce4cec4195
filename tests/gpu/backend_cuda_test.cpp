// The CUDA backend end to end on the shared test models: greedy generation
// against the reference outputs, batching, graphs, fork/copy-on-write,
// eviction against the CPU engine, snapshots, budget and error paths.
// Labelled "cuda"; each test skips when no CUDA device is visible.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_math.h"
#include "core/error.h"
#include "engine/session.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "reference.h"
#include "relative_error.h"
#include "status_of.h"

namespace {

using namespace llm;
using llm::testing::model_path;

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

std::unique_ptr<Model> load_model(const std::string& name) {
  LoadOptions o;
  o.n_threads = 2;
  o.reference_math = true;
  return Model::load(model_path(name), o);
}

std::unique_ptr<cuda::Backend> make_backend(const Model& m, llm_kv_type kv = LLM_KV_F32, bool graphs = true,
                                            uint64_t budget = uint64_t(64) << 20, int32_t max_chunk = 512) {
  cuda::BackendOptions o;
  o.kv_type = kv;
  o.use_graphs = graphs;
  o.kv_budget_bytes = budget;
  o.max_chunk = max_chunk;
  o.max_batch = 8;
  return cuda::Backend::create(m, o);
}

using llm::testing::status_of;

int32_t greedy(const std::vector<float>& l) {
  int32_t best = 0;
  for (int32_t i = 1; i < int32_t(l.size()); ++i)
    if (l[size_t(i)] > l[size_t(best)]) best = i;
  return best;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float w = 0.f;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(a[i] - b[i]));
  return w;
}

// The reference's greedy run, teacher-forced (llama2.c's conventions: a BOS
// ends the story): the logits of the first steps within tol, the device
// argmax equal to the host's on the same logits, and the host's pick equal to
// the reference's token at every step where the reference's top-1/top-2
// margin is wider than float reordering can close. The references have
// near-ties (a margin of 0.0027 at step 13 of 'Tom and Sam went'), where a
// free-running greedy comparison tested which way a rounding fell, and after
// the first such flip nothing at all.
void check_reference(const std::string& model_file, const std::string& json, llm_kv_type kv, float tol,
                     int32_t max_chunk = 512) {
  const float near_tie = std::max(0.01f, 4 * tol);
  auto model = load_model(model_file);
  auto be = make_backend(*model, kv, true, uint64_t(64) << 20, max_chunk);
  const int32_t vocab = model->config().vocab_size;
  for (const auto& c : llm::testing::load_greedy_cases(json)) {
    SCOPED_TRACE(model_file + " prompt '" + c.prompt + "'");
    auto seq = be->new_sequence();
    std::vector<float> logits(static_cast<size_t>(vocab));
    be->prefill(*seq, c.prompt_ids.data(), c.prompt_ids.size(), logits.data());
    EXPECT_EQ(seq->length(), c.prompt_ids.size());
    const size_t n = c.generated_ids.size();
    for (size_t i = 0; i <= n; ++i) {
      if (i < c.logits_steps.size()) {
        EXPECT_LE(max_diff(logits, c.logits_steps[i].logits), tol) << "step " << i;
      }
      const int32_t want = i < n ? c.generated_ids[i] : 1;  // past the last token: the BOS that stopped it
      if (i == n && !c.stopped_on_bos) break;
      const float margin = i < c.margins.size() ? c.margins[i] : std::numeric_limits<float>::infinity();
      if (margin >= near_tie) {
        EXPECT_EQ(greedy(logits), want) << "step " << i << ", reference margin " << margin;
      }
      if (i == n) break;
      int32_t dev_argmax = -1;
      cuda::DecodeOutput out;
      out.logits = logits.data();
      out.argmax = &dev_argmax;
      cuda::Sequence* s = seq.get();
      be->decode(&s, &want, 1, out);
      ASSERT_EQ(dev_argmax, greedy(logits)) << "step " << i + 1;
    }
  }
}

TEST_F(CudaBackend, Stories260KGreedyMatchesReference) {
  check_reference("stories260K.gguf", "stories260K_greedy.json", LLM_KV_F32, 1e-3f);
  check_reference("stories260K.gguf", "stories260K_greedy.json", LLM_KV_F16, 2e-2f);
  check_reference("stories260K.gguf", "stories260K_greedy.json", LLM_KV_F32, 1e-3f, 7);  // prompts in chunks of 7
}

TEST_F(CudaBackend, QuantizedAndF16ModelsMatchReference) {
  check_reference("stories260K-q8_0.gguf", "stories260K_q8_0_greedy.json", LLM_KV_F32, 1e-3f);
  check_reference("stories260K-q4_0.gguf", "stories260K_q4_0_greedy.json", LLM_KV_F32, 1e-3f);
  check_reference("llama-2-tiny-random.gguf", "llama-2-tiny-random_greedy.json", LLM_KV_F32, 1e-3f);
}

// A model file named by LLM_GPU_CHECK_MODEL (device_check.sh converts
// synthetic TinyLlama-shape files in every weight format it benchmarks, the
// GGUF K-quant mix among them, and runs this on each) on the device against
// the CPU's exact math on the same weights: a 40-token prompt in one
// prefill, then 16 decode steps fed the CPU's greedy ids. The device runs
// prefill GEMMs on f16 activations and keeps the cache in f16, so the logits
// agree to 2% of their range, not bit for bit.
TEST_F(CudaBackend, ModelFromTheEnvironmentMatchesTheCpuOnItsWeights) {
  const char* path = std::getenv("LLM_GPU_CHECK_MODEL");
  if (!path || !*path) GTEST_SKIP() << "LLM_GPU_CHECK_MODEL is not set";
  LoadOptions o;
  o.device = LLM_DEVICE_CPU;
  o.reference_math = true;
  const std::unique_ptr<Model> model = Model::load(path, o);
  const int32_t vocab = model->config().vocab_size;
  auto be = make_backend(*model, LLM_KV_F16, true, uint64_t(256) << 20);
  SessionOptions so;
  so.kv_type = LLM_KV_F32;
  Session cpu(*model, so);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(vocab));
  cpu.prefill(prompt.data(), prompt.size());
  auto seq = be->new_sequence();
  std::vector<float> dev(static_cast<size_t>(vocab));
  be->prefill(*seq, prompt.data(), prompt.size(), dev.data());
  double worst = 0;
  int agree = 0;
  for (int step = 0; step <= 16; ++step) {
    const float* c = cpu.logits();
    const std::vector<float> want(c, c + vocab);
    const double err = llm::testing::relative_error(dev.data(), want);
    worst = std::max(worst, err);
    EXPECT_LE(err, 2e-2) << "step " << step;
    const int32_t next = greedy(want);
    agree += greedy(dev) == next;
    if (step == 16) break;
    cpu.prefill(&next, 1);
    cuda::DecodeOutput out;
    out.logits = dev.data();
    cuda::Sequence* s = seq.get();
    be->decode(&s, &next, 1, out);
  }
  std::printf("%s: device against CPU exact math, worst max|diff| / range %.2e, greedy ids agree at %d of 17 steps\n",
              path, worst, agree);
  EXPECT_GE(agree, 15);
}

// Batched steps, with and without graphs, equal one-sequence steps.
TEST_F(CudaBackend, BatchedDecodeAndGraphsMatchSingleSequenceSteps) {
  auto model = load_model("stories260K.gguf");
  const int32_t vocab = model->config().vocab_size;
  auto batched = make_backend(*model, LLM_KV_F32, true);
  auto single = make_backend(*model, LLM_KV_F32, false);
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 411}, {1, 9, 30, 41, 50, 61, 70}, {1, 2, 3, 4, 5}};
  std::vector<std::unique_ptr<cuda::Sequence>> bs, ss;
  std::vector<int32_t> next;
  for (const auto& p : prompts) {
    std::vector<float> l(static_cast<size_t>(vocab));
    bs.push_back(batched->new_sequence());
    batched->prefill(*bs.back(), p.data(), p.size(), l.data());
    ss.push_back(single->new_sequence());
    single->prefill(*ss.back(), p.data(), p.size(), nullptr);
    next.push_back(greedy(l));
  }
  std::vector<cuda::Sequence*> ptrs;
  for (auto& s : bs) ptrs.push_back(s.get());
  for (int step = 0; step < 40; ++step) {
    std::vector<float> lb(size_t(3 * vocab));
    cuda::DecodeOutput ob;
    ob.logits = lb.data();
    batched->decode(ptrs.data(), next.data(), 3, ob);
    for (size_t i = 0; i < 3; ++i) {
      std::vector<float> li(static_cast<size_t>(vocab));
      cuda::DecodeOutput oi;
      oi.logits = li.data();
      cuda::Sequence* s = ss[i].get();
      single->decode(&s, &next[i], 1, oi);
      const std::vector<float> row(lb.begin() + std::ptrdiff_t(i * size_t(vocab)), lb.begin() + std::ptrdiff_t((i + 1) * size_t(vocab)));
      ASSERT_LE(max_diff(row, li), 1e-4f) << "step " << step << " sequence " << i;
      next[i] = greedy(row);
    }
  }
  EXPECT_GE(batched->memory().graphs_ready, 1u);  // 40 steps of one shape: captured and replayed
  EXPECT_EQ(single->memory().graphs_ready, 0u);
}

// The two ways a linear layer runs for a few rows (GEMV passes, or dequant /
// convert to f16 and a cuBLASLt GEMM; BackendOptions::gemv_max_rows*) give
// the same logits within f16 activation rounding, for a prompt and for a
// batched decode step, on float, q8 and q4 weights.
TEST_F(CudaBackend, GemvPassesAndGemmAgreeOnFewRows) {
  for (const char* file : {"stories260K.gguf", "stories260K-q8_0.gguf", "stories260K-q4_0.gguf"}) {
    SCOPED_TRACE(file);
    auto model = load_model(file);
    const size_t vocab = size_t(model->config().vocab_size);
    cuda::BackendOptions o;
    o.kv_type = LLM_KV_F32;
    o.kv_budget_bytes = uint64_t(64) << 20;
    o.max_batch = 8;
    o.gemv_max_rows = 64;
    o.gemv_max_rows_quant = 64;
    auto gemv = cuda::Backend::create(*model, o);
    o.gemv_max_rows = 1;
    o.gemv_max_rows_quant = 1;
    auto gemm = cuda::Backend::create(*model, o);
    auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
      EXPECT_LE(max_diff(a, b), 1e-2f * (*hi - *lo)) << what;
      EXPECT_NE(a, b) << what << ": the two paths should differ by rounding at least";
    };
    const std::vector<std::vector<int32_t>> prompts = {{1, 403, 411, 9, 30, 41, 50}, {1, 2, 3}, {1, 70, 61, 5}};
    std::vector<std::unique_ptr<cuda::Sequence>> sa, sb;
    std::vector<cuda::Sequence*> pa, pb;
    std::vector<int32_t> next;
    for (const auto& p : prompts) {
      std::vector<float> la(vocab), lb(vocab);
      sa.push_back(gemv->new_sequence());
      sb.push_back(gemm->new_sequence());
      gemv->prefill(*sa.back(), p.data(), p.size(), la.data());
      gemm->prefill(*sb.back(), p.data(), p.size(), lb.data());
      close(la, lb, "prefill");
      pa.push_back(sa.back().get());
      pb.push_back(sb.back().get());
      next.push_back(greedy(la));
    }
    std::vector<float> la(3 * vocab), lb(3 * vocab);
    cuda::DecodeOutput oa, ob;
    oa.logits = la.data();
    ob.logits = lb.data();
    gemv->decode(pa.data(), next.data(), 3, oa);
    gemm->decode(pb.data(), next.data(), 3, ob);
    close(la, lb, "batched decode step");
  }
}

TEST_F(CudaBackend, ForkSharesPagesAndCopiesOnWrite) {
  auto model = load_model("stories260K.gguf");
  const int32_t vocab = model->config().vocab_size;
  auto be = make_backend(*model);
  std::vector<int32_t> prompt(20);
  std::iota(prompt.begin(), prompt.end(), 5);
  auto a = be->new_sequence();
  be->prefill(*a, prompt.data(), prompt.size(), nullptr);
  EXPECT_EQ(a->n_pages(), 2u);
  auto b = be->fork(*a);
  EXPECT_EQ(be->memory().kv_pages_in_use, 2);  // shared, not copied
  std::vector<float> la(static_cast<size_t>(vocab)), lb(static_cast<size_t>(vocab)), lc(static_cast<size_t>(vocab));
  int32_t ta = 100, tb = 200;
  cuda::DecodeOutput o;
  cuda::Sequence* s = a.get();
  o.logits = la.data();
  be->decode(&s, &ta, 1, o);  // writes shared page 1: A gets a private copy
  EXPECT_EQ(be->memory().kv_pages_in_use, 3);
  s = b.get();
  o.logits = lb.data();
  be->decode(&s, &tb, 1, o);  // page 1 is B's alone now: no copy
  EXPECT_EQ(be->memory().kv_pages_in_use, 3);
  // B equals a sequence that never shared anything.
  auto c = be->new_sequence();
  std::vector<int32_t> pc = prompt;
  pc.push_back(tb);
  be->prefill(*c, pc.data(), pc.size(), lc.data());
  EXPECT_LE(max_diff(lb, lc), 1e-4f);
  EXPECT_GT(max_diff(la, lb), 1e-3f);  // A's write did not leak into B
}

// Eviction on the device equals the CPU engine's (rows re-rotated in place).
TEST_F(CudaBackend, EvictionMatchesCpuSession) {
  auto model = load_model("stories260K.gguf");
  const ModelConfig& cfg = model->config();
  auto be = make_backend(*model);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 500);
  SessionOptions so;
  so.kv_type = LLM_KV_F32;
  Session cpu(*model, so);
  cpu.prefill(prompt.data(), prompt.size());
  (void)cpu.logits();
  auto seq = be->new_sequence();
  be->prefill(*seq, prompt.data(), prompt.size(), nullptr);
  cpu.evict(4, 10);
  be->evict(*seq, 4, 10);
  ASSERT_EQ(seq->length(), cpu.n_cached());
  std::vector<float> a(size_t(cfg.head_dim)), b(size_t(cfg.head_dim));
  for (uint32_t slot = 0; slot < seq->length(); ++slot)
    for (int32_t l = 0; l < cfg.n_layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t h = 0; h < cfg.n_kv_heads; ++h) {
          be->kv_row(*seq, l, kv, h, slot, a.data());
          cpu.kv_row(l, kv, h, slot, b.data());
          for (int32_t d = 0; d < cfg.head_dim; ++d)
            ASSERT_NEAR(a[size_t(d)], b[size_t(d)], 1e-4 * (1 + std::fabs(b[size_t(d)]))) << "slot " << slot;
        }
  // Both continue identically.
  const int32_t tok = 77;
  std::vector<float> lg(size_t(cfg.vocab_size));
  cuda::DecodeOutput o;
  o.logits = lg.data();
  cuda::Sequence* s = seq.get();
  be->decode(&s, &tok, 1, o);
  cpu.prefill(&tok, 1);
  const float* lc = cpu.logits();
  EXPECT_LE(max_diff(lg, std::vector<float>(lc, lc + cfg.vocab_size)), 1e-3f);
}

TEST_F(CudaBackend, PagesRoundTripAndUseTheHostLayout) {
  auto model = load_model("stories260K.gguf");
  const ModelConfig& cfg = model->config();
  auto be = make_backend(*model);
  std::vector<int32_t> prompt(23);
  std::iota(prompt.begin(), prompt.end(), 40);
  auto a = be->new_sequence();
  be->prefill(*a, prompt.data(), prompt.size(), nullptr);
  std::vector<uint8_t> bytes(a->n_pages() * be->page_bytes());
  be->read_pages(*a, bytes.data());
  // The bytes are host kv pages: load_row gives what kv_row gives.
  kv::Geometry g;
  g.n_layers = cfg.n_layers;
  g.n_kv_heads = cfg.n_kv_heads;
  g.head_dim = cfg.head_dim;
  g.page_tokens = 16;
  ASSERT_EQ(be->page_bytes(), kv::page_bytes(g, be->kv_type()));
  std::vector<float> x(size_t(cfg.head_dim)), y(size_t(cfg.head_dim));
  for (uint32_t slot = 0; slot < a->length(); slot += 5) {
    kv::Page p;
    p.data = bytes.data() + (slot / 16) * be->page_bytes();
    p.type = be->kv_type();
    kv::load_row(g, &p, 2, 0, 1, int32_t(slot % 16), x.data());
    be->kv_row(*a, 2, 0, 1, slot, y.data());
    EXPECT_EQ(x, y);
  }
  auto b = be->new_sequence();
  be->write_pages(*b, bytes.data(), a->n_pages(), a->length());
  std::vector<float> la(size_t(cfg.vocab_size)), lb(size_t(cfg.vocab_size));
  const int32_t tok = 9;
  cuda::DecodeOutput o;
  cuda::Sequence* s = a.get();
  o.logits = la.data();
  be->decode(&s, &tok, 1, o);
  s = b.get();
  o.logits = lb.data();
  be->decode(&s, &tok, 1, o);
  EXPECT_EQ(la, lb);
}

TEST_F(CudaBackend, BudgetCancelAndBadArgumentsLeaveSequencesUnchanged) {
  auto model = load_model("stories260K.gguf");
  const ModelConfig& cfg = model->config();
  kv::Geometry g;
  g.n_layers = cfg.n_layers;
  g.n_kv_heads = cfg.n_kv_heads;
  g.head_dim = cfg.head_dim;
  g.page_tokens = 16;
  auto be = make_backend(*model, LLM_KV_F32, true, 3 * kv::page_bytes(g, LLM_KV_F32));
  std::vector<int32_t> prompt(40, 7);
  auto seq = be->new_sequence();
  be->prefill(*seq, prompt.data(), prompt.size(), nullptr);
  EXPECT_EQ(be->memory().kv_pages_in_use, 3);
  EXPECT_EQ(status_of([&] { be->prefill(*seq, prompt.data(), 20, nullptr); }), LLM_ERR_CONTEXT_FULL);
  EXPECT_EQ(seq->length(), 40u);
  EXPECT_EQ(seq->n_pages(), 3u);
  auto other = be->new_sequence();
  EXPECT_EQ(status_of([&] { be->prefill(*other, prompt.data(), 1, nullptr); }), LLM_ERR_CONTEXT_FULL);
  EXPECT_EQ(other->length(), 0u);
  // Cancelled prefill: nothing appended.
  int calls = 0;
  EXPECT_EQ(status_of([&] { be->prefill(*seq, prompt.data(), 5, nullptr, [&] { return ++calls > 2; }); }),
            LLM_ERR_CANCELLED);
  EXPECT_EQ(seq->length(), 40u);
  // Bad arguments.
  const int32_t bad = cfg.vocab_size;
  EXPECT_EQ(status_of([&] { be->prefill(*seq, &bad, 1, nullptr); }), LLM_ERR_INVALID_ARGUMENT);
  cuda::Sequence* twice[2] = {seq.get(), seq.get()};
  const int32_t toks[2] = {1, 2};
  EXPECT_EQ(status_of([&] { be->decode(twice, toks, 2, cuda::DecodeOutput{}); }), LLM_ERR_INVALID_ARGUMENT);
  auto be2 = make_backend(*model);
  EXPECT_EQ(status_of([&] { be2->truncate(*seq, 1); }), LLM_ERR_INVALID_ARGUMENT);  // foreign sequence
  EXPECT_EQ(status_of([&] { be->evict(*seq, 30, 20); }), LLM_ERR_INVALID_ARGUMENT);
  // Still usable: room for 8 more tokens in the third page.
  std::vector<float> l(size_t(cfg.vocab_size));
  cuda::DecodeOutput o;
  o.logits = l.data();
  cuda::Sequence* s = seq.get();
  const int32_t tok = 3;
  be->decode(&s, &tok, 1, o);
  EXPECT_EQ(seq->length(), 41u);
}

TEST_F(CudaBackend, TruncateAndTopK) {
  auto model = load_model("stories260K.gguf");
  const int32_t vocab = model->config().vocab_size;
  auto be = make_backend(*model);
  std::vector<int32_t> prompt(30);
  std::iota(prompt.begin(), prompt.end(), 100);
  auto a = be->new_sequence(), b = be->new_sequence();
  be->prefill(*a, prompt.data(), 30, nullptr);
  be->truncate(*a, 20);
  EXPECT_EQ(a->n_pages(), 2u);
  be->prefill(*b, prompt.data(), 20, nullptr);
  const int32_t tok = 5;
  std::vector<float> la(static_cast<size_t>(vocab)), lb(static_cast<size_t>(vocab)), tv(40);
  std::vector<int32_t> ti(40);
  cuda::DecodeOutput o;
  o.logits = la.data();
  o.top_k = 40;
  o.topk_logits = tv.data();
  o.topk_ids = ti.data();
  cuda::Sequence* s = a.get();
  be->decode(&s, &tok, 1, o);
  cuda::DecodeOutput ob;
  ob.logits = lb.data();
  s = b.get();
  be->decode(&s, &tok, 1, ob);
  EXPECT_LE(max_diff(la, lb), 1e-5f);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(), [&](int32_t x, int32_t y) {
    return la[size_t(x)] > la[size_t(y)] || (la[size_t(x)] == la[size_t(y)] && x < y);
  });
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(ti[size_t(i)], order[size_t(i)]);
    EXPECT_EQ(tv[size_t(i)], la[size_t(order[size_t(i)])]);
  }
}

}  // namespace
