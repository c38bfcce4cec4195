// The paged KV cache seen through sessions on the real stories260K model:
// eviction with key re-rotation, sliding window with sinks, fork with
// copy-on-write, save/restore, and CONTEXT_FULL atomicity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "api/handles.h"
#include "llm.h"
#include "reference.h"

using llm::testing::model_path;

namespace {

struct Model {
  llm_model* m = nullptr;
  explicit Model(uint32_t flags = LLM_LOAD_REFERENCE_MATH, uint64_t budget = 0) {
    llm_load_params p;
    llm_load_params_init(&p);
    p.flags = flags;
    p.n_threads = 2;
    p.kv_budget_bytes = budget;
    EXPECT_EQ(llm_load(model_path("stories260K.gguf").c_str(), &p, &m), LLM_OK) << llm_last_error();
  }
  ~Model() { llm_model_free(m); }
};

struct Session {
  llm_session* s = nullptr;
  Session(llm_model* m, llm_kv_type kv = LLM_KV_F32, uint32_t window = 0, uint32_t n_sink = 4, uint32_t max_tokens = 0) {
    llm_session_params p;
    llm_session_params_init(&p);
    p.kv_type = kv;
    p.window = window;
    p.n_sink = n_sink;
    p.max_tokens = max_tokens;
    EXPECT_EQ(llm_session_create(m, &p, &s), LLM_OK) << llm_last_error();
  }
  explicit Session(llm_session* raw) : s(raw) {}
  ~Session() { llm_session_free(s); }
  const llm::Session& impl() const { return *s->impl; }
};

const std::vector<int32_t>& prompt() {
  static const std::vector<int32_t> p = llm::testing::load_greedy_cases("stories260K_greedy.json")[0].prompt_ids;
  return p;
}

std::vector<int32_t> greedy(llm_session* s, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    llm_token t;
    EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << llm_last_error();
    out.push_back(t);
  }
  return out;
}

std::vector<float> logits(llm_session* s) {
  const float* l = nullptr;
  size_t n = 0;
  EXPECT_EQ(llm_logits(s, &l, &n), LLM_OK) << llm_last_error();
  return std::vector<float>(l, l + n);
}

llm_session_stats_t stats(llm_session* s) {
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  EXPECT_EQ(llm_session_stats(s, &st), LLM_OK);
  return st;
}

// Rotates x (one head) from position `from` to position `to` in double
// precision: undo the old rotation, apply the new one.
std::vector<float> rerotate(const std::vector<float>& x, int64_t from, int64_t to, double theta) {
  std::vector<float> y(x.size());
  const size_t hd = x.size();
  for (size_t i = 0; i < hd; i += 2) {
    const double freq = 1.0 / std::pow(theta, double(i) / double(hd));
    const double a0 = -double(from) * freq, a1 = double(to) * freq;
    const double u0 = x[i] * std::cos(a0) - x[i + 1] * std::sin(a0);
    const double u1 = x[i] * std::sin(a0) + x[i + 1] * std::cos(a0);
    y[i] = float(u0 * std::cos(a1) - u1 * std::sin(a1));
    y[i + 1] = float(u0 * std::sin(a1) + u1 * std::cos(a1));
  }
  return y;
}

}  // namespace

TEST(KvEvict, KeptKeysEqualKeysAtTheirNewPositions) {
  Model m;
  for (llm_kv_type kv : {LLM_KV_F32, LLM_KV_F16, LLM_KV_INT8, LLM_KV_INT4}) {
    SCOPED_TRACE(kv);
    Session a(m.m, kv);
    ASSERT_EQ(llm_prefill(a.s, prompt().data(), prompt().size()), LLM_OK);
    greedy(a.s, 40);  // 5 prompt + 40 generated (the last one pending)
    llm_session* raw = nullptr;
    ASSERT_EQ(llm_session_fork(a.s, &raw), LLM_OK);
    Session before(raw);  // untouched copy
    const uint32_t n_keep = 4, n_discard = 19;
    const uint32_t cached = before.impl().n_cached();
    ASSERT_EQ(llm_kv_evict(a.s, n_keep, n_discard), LLM_OK) << llm_last_error();
    EXPECT_EQ(a.impl().n_cached(), cached - n_discard);
    std::vector<float> old_k(8), new_k(8);
    for (uint32_t slot = 0; slot < a.impl().n_cached(); ++slot) {
      const uint32_t old_slot = slot < n_keep ? slot : slot + n_discard;
      for (int layer = 0; layer < 5; ++layer)
        for (int h = 0; h < 4; ++h) {
          before.impl().kv_row(layer, 0, h, old_slot, old_k.data());
          a.impl().kv_row(layer, 0, h, slot, new_k.data());
          const auto want = rerotate(old_k, old_slot, slot, 10000.0);
          // Tolerance: one more rounding to the storage type (quantized keys
          // are dequantized, rotated and re-quantized: half a step of the
          // new row's [min, max] code).
          float amax = 0.f, lo = want[0], hi = want[0];
          for (float v : want) {
            amax = std::max(amax, std::fabs(v));
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          for (int d = 0; d < 8; ++d) {
            const float tol = kv == LLM_KV_F32   ? 2e-5f * (1.f + amax)
                              : kv == LLM_KV_F16 ? amax / 1024.f + 1e-6f
                              : kv == LLM_KV_INT8 ? (hi - lo) / 255.f * 0.51f + 1e-6f
                                                  : (hi - lo) / 15.f * 0.51f + 1e-6f;
            ASSERT_NEAR(new_k[size_t(d)], want[size_t(d)], tol) << "slot " << slot << " dim " << d;
          }
          // Values move unchanged.
          before.impl().kv_row(layer, 1, h, old_slot, old_k.data());
          a.impl().kv_row(layer, 1, h, slot, new_k.data());
          ASSERT_EQ(old_k, new_k);
        }
    }
    // Generation goes on after eviction.
    EXPECT_EQ(greedy(a.s, 5).size(), 5u);
  }
}

TEST(KvEvict, EvictingTheTailEqualsAFreshSessionOfThePrefix) {
  Model m;
  Session a(m.m);
  ASSERT_EQ(llm_prefill(a.s, prompt().data(), prompt().size()), LLM_OK);
  const auto gen = greedy(a.s, 20);
  // Sequence = prompt + gen (last one pending). Keep the first 12 tokens.
  std::vector<int32_t> seq = prompt();
  seq.insert(seq.end(), gen.begin(), gen.end());
  const uint32_t keep = 12;
  ASSERT_EQ(llm_kv_evict(a.s, keep, uint32_t(seq.size()) - keep), LLM_OK) << llm_last_error();
  EXPECT_EQ(stats(a.s).n_tokens, keep);
  Session fresh(m.m);
  ASSERT_EQ(llm_prefill(fresh.s, seq.data(), keep), LLM_OK);
  const auto la = logits(a.s), lf = logits(fresh.s);
  ASSERT_EQ(la.size(), lf.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lf.data(), la.size() * sizeof(float))) << "logits differ";
  EXPECT_EQ(greedy(a.s, 16), greedy(fresh.s, 16));
}

TEST(KvEvict, RejectsRangesOutsideTheSequence) {
  Model m;
  Session a(m.m);
  ASSERT_EQ(llm_prefill(a.s, prompt().data(), prompt().size()), LLM_OK);
  EXPECT_EQ(llm_kv_evict(a.s, 3, 3), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_kv_evict(a.s, 0xffffffffu, 2), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_kv_evict(a.s, 2, 0), LLM_OK);
  EXPECT_EQ(stats(a.s).n_tokens, prompt().size());
}

TEST(KvWindow, StreamsFiveThousandTokensInConstantMemory) {
  Model m(0);
  Session s(m.m, LLM_KV_F16, 128, 4);
  ASSERT_EQ(llm_prefill(s.s, prompt().data(), prompt().size()), LLM_OK);
  uint64_t full_bytes = 0;
  for (int i = 0; i < 5000; ++i) {
    llm_token t;
    ASSERT_EQ(llm_decode_step(s.s, nullptr, &t), LLM_OK) << i << ": " << llm_last_error();
    const auto st = stats(s.s);
    ASSERT_LE(st.n_cached, 128u);
    if (i == 300) full_bytes = st.kv_bytes;
    if (i > 300) {
      ASSERT_EQ(st.kv_bytes, full_bytes) << i;
    }
  }
  EXPECT_GT(stats(s.s).n_evicted, 4800u);
}

TEST(KvFork, DivergingForksMatchIndependentSessionsAndSharePages) {
  Model m;
  Session base(m.m);
  std::vector<int32_t> system(prompt());
  for (int i = 0; i < 40; ++i) system.push_back(int32_t(300 + i));  // a 45-token "system prompt"
  ASSERT_EQ(llm_prefill(base.s, system.data(), system.size()), LLM_OK);
  llm_model_properties info;
  info.struct_size = sizeof info;
  ASSERT_EQ(llm_model_info(m.m, &info), LLM_OK);
  const uint64_t before = m.m->impl->kv_pool().bytes_in_use();
  llm_session *f1 = nullptr, *f2 = nullptr;
  ASSERT_EQ(llm_session_fork(base.s, &f1), LLM_OK);
  ASSERT_EQ(llm_session_fork(base.s, &f2), LLM_OK);
  Session s1(f1), s2(f2);
  EXPECT_EQ(m.m->impl->kv_pool().bytes_in_use(), before);  // shared, not tripled
  const std::vector<int32_t> a = {400, 401}, b = {450};
  ASSERT_EQ(llm_prefill(s1.s, a.data(), a.size()), LLM_OK);
  ASSERT_EQ(llm_prefill(s2.s, b.data(), b.size()), LLM_OK);
  // Only the partially filled last page was copied (once per writer).
  EXPECT_EQ(m.m->impl->kv_pool().bytes_in_use(), before + 2 * (before / stats(base.s).kv_pages));
  const auto g1 = greedy(s1.s, 30), g2 = greedy(s2.s, 30);
  for (int k = 0; k < 2; ++k) {
    Session ind(m.m);
    std::vector<int32_t> seq = system;
    const auto& extra = k == 0 ? a : b;
    seq.insert(seq.end(), extra.begin(), extra.end());
    ASSERT_EQ(llm_prefill(ind.s, seq.data(), seq.size()), LLM_OK);
    EXPECT_EQ(greedy(ind.s, 30), k == 0 ? g1 : g2);
  }
  // The base is untouched by its forks' writes.
  Session ind(m.m);
  ASSERT_EQ(llm_prefill(ind.s, system.data(), system.size()), LLM_OK);
  EXPECT_EQ(greedy(base.s, 10), greedy(ind.s, 10));
}

TEST(KvSaveRestore, ContinuingARestoredSessionIsBitExact) {
  Model m;
  for (llm_kv_type kv : {LLM_KV_F32, LLM_KV_F16, LLM_KV_INT8, LLM_KV_INT4}) {
    Session a(m.m, kv);
    ASSERT_EQ(llm_prefill(a.s, prompt().data(), prompt().size()), LLM_OK);
    greedy(a.s, 25);
    size_t need = 0;
    ASSERT_EQ(llm_session_save(a.s, nullptr, 0, &need), LLM_ERR_BUFFER_TOO_SMALL);
    std::vector<uint8_t> buf(need);
    ASSERT_EQ(llm_session_save(a.s, buf.data(), buf.size(), &need), LLM_OK);
    llm_session* raw = nullptr;
    ASSERT_EQ(llm_session_restore(m.m, buf.data(), buf.size(), &raw), LLM_OK) << llm_last_error();
    Session b(raw);
    llm_sampling samp;
    llm_sampling_init(&samp);
    samp.temperature = 0.8f;
    samp.seed = 7;
    for (int i = 0; i < 30; ++i) {
      llm_token ta, tb;
      ASSERT_EQ(llm_decode_step(a.s, &samp, &ta), LLM_OK);
      ASSERT_EQ(llm_decode_step(b.s, &samp, &tb), LLM_OK);
      ASSERT_EQ(ta, tb) << "step " << i;
    }
    const auto la = logits(a.s), lb = logits(b.s);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
    // Damaged snapshots are refused with a status, never a crash.
    std::vector<uint8_t> bad = buf;
    bad[bad.size() / 2] ^= 0x10;
    EXPECT_EQ(llm_session_restore(m.m, bad.data(), bad.size(), &raw), LLM_ERR_CHECKSUM);
    for (size_t cut : {size_t(0), size_t(7), size_t(40), buf.size() / 3, buf.size() - 1})
      EXPECT_NE(llm_session_restore(m.m, buf.data(), cut, &raw), LLM_OK) << cut;
    EXPECT_EQ(raw, nullptr);
  }
}

TEST(KvContextFull, FailedAppendLeavesTheSessionUnchangedAndUsable) {
  Model m;
  Session s(m.m, LLM_KV_F32, 0, 4, 32);
  ASSERT_EQ(llm_prefill(s.s, prompt().data(), prompt().size()), LLM_OK);
  const auto l0 = logits(s.s);
  std::vector<int32_t> big(40, 300);
  EXPECT_EQ(llm_prefill(s.s, big.data(), big.size()), LLM_ERR_CONTEXT_FULL);
  EXPECT_EQ(stats(s.s).n_tokens, prompt().size());
  EXPECT_EQ(logits(s.s), l0);
  // Generate until the context is full: the last step reports CONTEXT_FULL and
  // the session still answers.
  llm_token t;
  llm_status st = LLM_OK;
  int steps = 0;
  while ((st = llm_decode_step(s.s, nullptr, &t)) == LLM_OK && steps < 100) ++steps;
  EXPECT_EQ(st, LLM_ERR_CONTEXT_FULL);
  EXPECT_EQ(stats(s.s).n_cached, 32u);
  EXPECT_EQ(llm_kv_evict(s.s, 4, 16), LLM_OK);
  EXPECT_EQ(llm_decode_step(s.s, nullptr, &t), LLM_OK);
}

TEST(KvPool, BudgetExhaustionIsContextFull) {
  // A pool of 2 pages (f32): a third page cannot be had.
  const uint64_t page = 5 * 2 * 4 * 16 * 8 * 4;
  Model m(LLM_LOAD_REFERENCE_MATH, 2 * page);
  Session a(m.m, LLM_KV_F32);
  std::vector<int32_t> toks(30, 300);
  toks[0] = 1;
  ASSERT_EQ(llm_prefill(a.s, toks.data(), toks.size()), LLM_OK);
  Session b(m.m, LLM_KV_F32);
  EXPECT_EQ(llm_prefill(b.s, toks.data(), 5), LLM_ERR_CONTEXT_FULL);
  llm_session_free(a.s);
  a.s = nullptr;
  EXPECT_EQ(llm_prefill(b.s, toks.data(), 5), LLM_OK);
}
