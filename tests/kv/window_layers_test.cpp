// Sliding-window layers in the paged cache: a model that mixes windowed and
// global layers (Gemma 2/3) keeps the windowed layers' K/V in their own pool
// and drops the pages every window has left. On the tiny random Gemma 2 and
// Gemma 3 of tests/data/families (window 8, 16-token pages), the pruned
// cache must give bit-identical logits to one that keeps every page
// (LoadOptions::kv_prune_windows = false), through prefill chunks, decode,
// llm_kv_evict, the session window with sinks, fork and save/restore, while
// holding fewer bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/session.h"
#include "model/model.h"

namespace llm {
namespace {

std::string family_file(const char* name) { return std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".gguf"; }

std::unique_ptr<Model> load(const char* name, bool prune) {
  LoadOptions o;
  o.n_threads = 2;
  o.huge_pages = false;
  o.kv_prune_windows = prune;
  return Model::load(family_file(name), o);
}

std::vector<int32_t> tokens(size_t n, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = int32_t(3 + (seed >> 8) % 509);
  }
  return t;
}

std::vector<float> logits_of(Session& s) {
  const float* l = s.logits();
  return std::vector<float>(l, l + s.model().config().vocab_size);
}

class WindowLayers : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    pruned_ = load(GetParam(), true);
    full_ = load(GetParam(), false);
    ASSERT_NE(pruned_->kv_pool_local(), nullptr);
    ASSERT_EQ(full_->kv_pool_local(), nullptr);
    ASSERT_EQ(pruned_->kv_local_window(), 8u);
  }
  std::unique_ptr<Model> pruned_, full_;
};

// Runs the same steps on a pruned and a full session, comparing logits after each.
struct Pair {
  Session a, b;
  Pair(const Model& pruned, const Model& full, const SessionOptions& o) : a(pruned, o), b(full, o) {}
  void prefill(const std::vector<int32_t>& t) {
    a.prefill(t.data(), t.size());
    b.prefill(t.data(), t.size());
    expect_same("prefill");
  }
  void decode(int n) {
    for (int i = 0; i < n; ++i) {
      const int32_t ta = a.decode_step(nullptr), tb = b.decode_step(nullptr);
      ASSERT_EQ(ta, tb) << "step " << i;
      expect_same("decode");
    }
  }
  void expect_same(const char* what) {
    const std::vector<float> la = logits_of(a), lb = logits_of(b);
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << what << " at " << a.n_cached();
  }
};

TEST_P(WindowLayers, PrunedCacheGivesTheSameLogits) {
  for (llm_kv_type kv : {LLM_KV_F32, LLM_KV_F16, LLM_KV_INT8}) {
    SessionOptions o;
    o.kv_type = kv;
    Pair p(*pruned_, *full_, o);
    p.prefill(tokens(37, 1));   // crosses two pages in one chunk
    p.decode(40);
    p.prefill(tokens(100, 2));  // a chunk longer than the window
    p.decode(5);
    // The windowed layers hold at most the pages touching the last 9 slots.
    EXPECT_LE(p.a.n_local_pages(), 2u);
    EXPECT_EQ(p.a.n_pages(), p.b.n_pages());
    llm_session_stats_t sa, sb;
    sa.struct_size = sb.struct_size = sizeof sa;
    p.a.stats(&sa);
    p.b.stats(&sb);
    EXPECT_LT(double(sa.kv_bytes), 0.6 * double(sb.kv_bytes)) << sa.kv_bytes << " vs " << sb.kv_bytes;
    // Rows that left the window are not readable any more; the global layer's are.
    float row[64];
    const int32_t local_layer = 0;
    EXPECT_THROW(p.a.kv_row(local_layer, 0, 0, 0, row), Error);
  }
}

TEST_P(WindowLayers, EvictAndSessionWindowWithSinks) {
  SessionOptions o;
  o.kv_type = LLM_KV_F32;
  {
    Pair p(*pruned_, *full_, o);
    p.prefill(tokens(60, 3));
    p.a.evict(4, 20);
    p.b.evict(4, 20);
    p.expect_same("after llm_kv_evict");
    p.decode(30);
  }
  o.window = 48;
  o.n_sink = 4;
  Pair p(*pruned_, *full_, o);
  p.prefill(tokens(20, 4));
  p.decode(120);  // slides the session window several times
  p.prefill(tokens(30, 5));
  p.decode(10);
}

TEST_P(WindowLayers, ForkAndSaveRestore) {
  SessionOptions o;
  o.kv_type = LLM_KV_F16;
  Pair p(*pruned_, *full_, o);
  p.prefill(tokens(50, 6));
  p.decode(10);
  std::unique_ptr<Session> fa = p.a.fork(), fb = p.b.fork();
  std::vector<uint8_t> snap;
  p.a.save(snap);
  p.decode(20);  // the originals move on; the fork and the snapshot do not
  const std::vector<int32_t> more = tokens(25, 7);
  fa->prefill(more.data(), more.size());
  fb->prefill(more.data(), more.size());
  EXPECT_EQ(logits_of(*fa), logits_of(*fb));
  std::unique_ptr<Session> r = Session::restore(*pruned_, snap.data(), snap.size());
  r->prefill(more.data(), more.size());
  EXPECT_EQ(logits_of(*r), logits_of(*fa));
  EXPECT_EQ(r->local_first(), fa->local_first());
  // A damaged or cut snapshot is refused with a status.
  std::vector<uint8_t> bad = snap;
  bad[bad.size() - 20] ^= 1;
  EXPECT_THROW(Session::restore(*pruned_, bad.data(), bad.size()), Error);
  EXPECT_THROW(Session::restore(*pruned_, snap.data(), snap.size() - 9), Error);
  // A snapshot of the other layout is refused.
  std::vector<uint8_t> full_snap;
  fb->save(full_snap);
  EXPECT_THROW(Session::restore(*pruned_, full_snap.data(), full_snap.size()), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, WindowLayers, ::testing::Values("gemma2", "gemma3"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace llm
