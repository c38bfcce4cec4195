// The Backend interface's contract (backend/backend.h), checked on every
// backend this machine has: the CPU one always, the CUDA one when a device
// is usable (skipped otherwise; tests/gpu/device_check.sh runs it there).
// Sessions rely on each property below; a new backend passes this file
// before a session runs on it.
//
// Logits and K/V rows are compared exactly on the CPU (its matmuls are
// batch- and chunk-invariant) and within 1e-3 of the reference's range on
// the device (tests/common/relative_error.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/model.h"
#include "relative_error.h"
#include "status_of.h"

namespace {

using llm::Backend;
using llm::KvSequence;
using llm::testing::status_of;

struct Case {
  const char* name;
  llm_device device;
  const char* family;  // tests/data/families/<family>.gguf
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BackendContract : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().device == LLM_DEVICE_CUDA && llm::cuda::device_count(nullptr) <= 0)
      GTEST_SKIP() << "no usable CUDA device";
    llm::LoadOptions lo;
    lo.device = GetParam().device;
    lo.n_threads = 2;
    lo.huge_pages = false;
    model_ = llm::Model::load(std::string(LLM_TEST_DATA_DIR) + "/families/" + GetParam().family + ".gguf", lo);
    be_ = &model_->backend_for(LLM_KV_F16);
    vocab_ = size_t(model_->config().vocab_size);
    tol_ = GetParam().device == LLM_DEVICE_CPU ? 0.0 : 1e-3;
  }

  std::vector<int32_t> tokens(size_t n, int32_t salt = 0) const {
    std::vector<int32_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 37 + size_t(salt) * 11 + 5) % vocab_);
    return t;
  }
  std::vector<float> run(KvSequence& s, const std::vector<int32_t>& t, size_t from, size_t n,
                         const std::function<bool()>& cancel = {}) {
    std::vector<float> logits(vocab_);
    be_->forward(s, t.data() + from, n, logits.data(), cancel);
    return logits;
  }
  // Every K and V row of every layer and head at slots [from, n), as f32;
  // the sliding-window layers' from max(from, local_from) (they give back
  // the rows that every window has left).
  std::vector<float> rows(const KvSequence& s, uint32_t from, uint32_t n, uint32_t local_from = 0) const {
    const llm::ModelConfig& c = model_->config();
    std::vector<float> out, row(size_t(c.head_dim));
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const uint32_t first = model_->layers()[size_t(l)].kv_group == 1 ? std::max(from, local_from) : from;
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t h = 0; h < c.n_kv_heads; ++h)
          for (uint32_t slot = first; slot < n; ++slot) {
            be_->kv_row(s, l, kv, h, slot, row.data());
            out.insert(out.end(), row.begin(), row.end());
          }
    }
    return out;
  }
  // a within tol of b (relative_error: max |diff| over b's range).
  void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what, double tol) const {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_LE(llm::testing::relative_error(a.data(), b), tol) << what;
  }
  void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) const {
    expect_close(a, b, what, tol_);
  }

  std::unique_ptr<llm::Model> model_;
  Backend* be_ = nullptr;
  size_t vocab_ = 0;
  double tol_ = 0;
};

TEST_P(BackendContract, ChunksAndDecodeStepsEqualOnePass) {
  const std::vector<int32_t> t = tokens(24);
  auto one = be_->new_sequence(LLM_KV_F16);
  const std::vector<float> want = run(*one, t, 0, t.size());
  EXPECT_EQ(one->length(), 24u);
  EXPECT_EQ(one->kv_type(), LLM_KV_F16);

  auto chunked = be_->new_sequence(LLM_KV_F16);
  run(*chunked, t, 0, 7);
  run(*chunked, t, 7, 16);  // crosses a page boundary at slot 16
  const std::vector<float> got_chunks = run(*chunked, t, 23, 1);
  expect_close(got_chunks, want, "chunked logits");
  EXPECT_EQ(chunked->local_first(), one->local_first());
  expect_close(rows(*chunked, 0, 24, one->local_first()), rows(*one, 0, 24, one->local_first()), "chunked K/V");

  auto steps = be_->new_sequence(LLM_KV_F16);
  std::vector<float> got_steps;
  for (size_t i = 0; i < t.size(); ++i) got_steps = run(*steps, t, i, 1);  // n = 1, no cancel: a decode step
  expect_close(got_steps, want, "decode-step logits");
  EXPECT_EQ(steps->n_pages(), 2u);
  EXPECT_GT(steps->kv_bytes(), 0u);
}

TEST_P(BackendContract, BatchEqualsEachSequenceAlone) {
  std::vector<std::unique_ptr<KvSequence>> batch, alone;
  std::vector<std::vector<int32_t>> toks;
  for (int k = 0; k < 3; ++k) {
    toks.push_back(tokens(size_t(5 + 4 * k), k));
    batch.push_back(be_->new_sequence(LLM_KV_F16));
    alone.push_back(be_->new_sequence(LLM_KV_F16));
    run(*batch.back(), toks[size_t(k)], 0, toks[size_t(k)].size() - 1);
    run(*alone.back(), toks[size_t(k)], 0, toks[size_t(k)].size() - 1);
  }
  std::vector<std::vector<float>> logits(3, std::vector<float>(vocab_));
  std::vector<llm::SequenceRows> rows(3);
  for (size_t k = 0; k < 3; ++k) rows[k] = {batch[k].get(), &toks[k].back(), 1, logits[k].data()};
  ASSERT_GE(be_->max_batch(), 3u);
  ASSERT_EQ(be_->forward_batch(rows.data(), rows.size()), 3u);
  for (size_t k = 0; k < 3; ++k) {
    const std::vector<float> want = run(*alone[k], toks[k], toks[k].size() - 1, 1);
    expect_close(logits[k], want, "batched logits");
    EXPECT_EQ(batch[k]->length(), alone[k]->length());
    const uint32_t lf = alone[k]->local_first();
    EXPECT_EQ(batch[k]->local_first(), lf);
    expect_close(this->rows(*batch[k], 0, batch[k]->length(), lf), this->rows(*alone[k], 0, alone[k]->length(), lf),
                 "batched K/V");
  }
}

TEST_P(BackendContract, ForkSharesThePastAndDivergesAfterIt) {
  const std::vector<int32_t> t = tokens(20);
  auto a = be_->new_sequence(LLM_KV_F16);
  run(*a, t, 0, 18);
  constexpr uint32_t kLocalFrom = 12;  // the windowed layers (window 8) still hold these once 20 slots are in
  const std::vector<float> past = rows(*a, 0, 18, kLocalFrom);
  auto b = be_->fork(*a);
  EXPECT_EQ(b->length(), 18u);
  const std::vector<int32_t> other = {1, 2};
  std::vector<float> lb(vocab_);
  be_->forward(*b, other.data(), 2, lb.data(), {});
  const std::vector<float> la = run(*a, t, 18, 2);
  expect_close(rows(*a, 0, 18, kLocalFrom), past, "original after the fork wrote", 0.0f);
  expect_close(rows(*b, 0, 18, kLocalFrom), past, "fork's shared past", 0.0f);
  EXPECT_NE(rows(*a, 18, 20), rows(*b, 18, 20));  // copy-on-write: each wrote its own page
  EXPECT_NE(la, lb);
}

// A session truncates by one slot to run its last token again (after an
// eviction); the windowed layers keep W + 1 slots for that.
TEST_P(BackendContract, TruncateThenRerunGivesTheSameLogits) {
  const std::vector<int32_t> t = tokens(17);
  auto s = be_->new_sequence(LLM_KV_F16);
  const std::vector<float> want = run(*s, t, 0, 17);
  EXPECT_EQ(s->n_pages(), 2u);
  be_->truncate(*s, 16);
  EXPECT_EQ(s->length(), 16u);
  EXPECT_EQ(s->n_pages(), 1u);  // the second page went back
  expect_close(run(*s, t, 16, 1), want, "logits after truncate and rerun");
}

// A prompt in several passes that fails in a later one is undone by
// truncating back to where it began; under a hold that is exact also on
// sliding-window layers, whose window has moved on meanwhile.
TEST_P(BackendContract, TruncateBackToAHoldIsExact) {
  const std::vector<int32_t> t = tokens(60);
  auto ref = be_->new_sequence(LLM_KV_F16);
  run(*ref, t, 0, 20);
  const std::vector<float> want = run(*ref, t, 20, 4);
  auto s = be_->new_sequence(LLM_KV_F16);
  run(*s, t, 0, 20);
  const uint32_t lf = s->local_first();
  std::vector<uint8_t> before;
  be_->save_pages(*s, before);
  be_->hold(*s);
  run(*s, {t.begin() + 20, t.end()}, 0, 40);  // the windows move well past slot 20
  be_->truncate(*s, 20);
  be_->release_hold(*s);
  EXPECT_EQ(s->local_first(), lf);
  std::vector<uint8_t> after;
  be_->save_pages(*s, after);
  EXPECT_EQ(after, before);
  expect_close(run(*s, t, 20, 4), want, "logits after undoing the held passes");
}

TEST_P(BackendContract, EvictedKeysEqualKeysComputedAtTheNewPositions) {
  const std::vector<int32_t> t = tokens(30);
  auto s = be_->new_sequence(LLM_KV_F16);
  run(*s, t, 0, 30);
  be_->evict(*s, 4, 9);  // slots [4, 13) go; 13.. move down by 9
  EXPECT_EQ(s->length(), 21u);
  // K at a position depends on the position only through RoPE, and V not at
  // all, so the moved rows equal those of a sequence that saw the kept
  // tokens' K/V inputs at the new positions: compare against a fresh
  // sequence of the same tokens, which differs in what the moved tokens
  // attended to, only for layer 0 (whose K/V inputs are the embeddings).
  auto fresh = be_->new_sequence(LLM_KV_F16);
  std::vector<int32_t> kept(t.begin(), t.begin() + 4);
  kept.insert(kept.end(), t.begin() + 13, t.end());
  run(*fresh, kept, 0, kept.size());
  const llm::ModelConfig& c = model_->config();
  const size_t hd = size_t(c.head_dim);
  std::vector<float> got, want;
  const uint32_t first = model_->layers()[0].kv_group == 1 ? std::max(s->local_first(), fresh->local_first()) : 0;
  ASSERT_LT(first, 21u);
  for (int kv = 0; kv < 2; ++kv)
    for (int32_t h = 0; h < c.n_kv_heads; ++h)
      for (uint32_t slot = first; slot < 21; ++slot) {
        got.resize(got.size() + hd);
        want.resize(want.size() + hd);
        be_->kv_row(*s, 0, kv, h, slot, got.data() + got.size() - hd);
        be_->kv_row(*fresh, 0, kv, h, slot, want.data() + want.size() - hd);
      }
  expect_close(got, want, "layer-0 K/V after eviction", 2e-3);
}

TEST_P(BackendContract, SavedPagesRestoreIntoTheSameCache) {
  const std::vector<int32_t> t = tokens(22);
  auto a = be_->new_sequence(LLM_KV_F16);
  run(*a, t, 0, 21);
  std::vector<uint8_t> bytes;
  be_->save_pages(*a, bytes);
  EXPECT_FALSE(bytes.empty());

  auto bad = be_->new_sequence(LLM_KV_F16);
  EXPECT_EQ(status_of([&] { be_->restore_pages(*bad, bytes.data(), bytes.size() - 1, uint32_t(a->n_pages()), 21); }),
            LLM_ERR_FORMAT);
  EXPECT_EQ(bad->length(), 0u);

  auto b = be_->new_sequence(LLM_KV_F16);
  be_->restore_pages(*b, bytes.data(), bytes.size(), uint32_t(a->n_pages()), 21);
  EXPECT_EQ(b->length(), 21u);
  EXPECT_EQ(b->local_first(), a->local_first());
  expect_close(rows(*b, 0, 21, a->local_first()), rows(*a, 0, 21, a->local_first()), "restored K/V", 0.0f);
  const std::vector<float> la = run(*a, t, 21, 1), lb = run(*b, t, 21, 1);
  expect_close(lb, la, "logits after restore", 0.0f);
}

TEST_P(BackendContract, CancelledPassLeavesTheSequenceAsItWas) {
  const std::vector<int32_t> t = tokens(40);
  auto s = be_->new_sequence(LLM_KV_F16);
  run(*s, t, 0, 10);
  const std::vector<float> before = rows(*s, 0, 10, s->local_first());
  const size_t pages = s->n_pages();
  EXPECT_EQ(status_of([&] { run(*s, t, 10, 30, [] { return true; }); }), LLM_ERR_CANCELLED);
  EXPECT_EQ(s->length(), 10u);
  EXPECT_EQ(s->n_pages(), pages);
  expect_close(rows(*s, 0, 10, s->local_first()), before, "K/V after a cancelled pass", 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendContract,
                         ::testing::Values(Case{"cpu_llama", LLM_DEVICE_CPU, "llama"},
                                           Case{"cpu_gemma3", LLM_DEVICE_CPU, "gemma3"},
                                           Case{"cuda_llama", LLM_DEVICE_CUDA, "llama"},
                                           Case{"cuda_gemma3", LLM_DEVICE_CUDA, "gemma3"}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
