// Paged attention against a contiguous naive reference, for shuffled page
// placements, lengths that are not multiples of the page size, GQA ratios
// 1/2/4/8, and every KV storage type.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"

namespace {

// q: [n, n_heads*hd]; k, v: [len, n_kv*hd] contiguous; row i attends to [0, p0 + i].
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                   int64_t n, int64_t p0, int n_heads, int n_kv, int hd) {
  std::vector<float> out(size_t(n) * n_heads * hd, 0.f);
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / (n_heads / n_kv);
      const int64_t len = p0 + i + 1;
      std::vector<double> s(static_cast<size_t>(len));
      double mx = -1e30;
      for (int64_t t = 0; t < len; ++t) {
        double d = 0;
        for (int j = 0; j < hd; ++j) d += double(q[size_t((i * n_heads + h) * hd + j)]) * k[size_t((t * n_kv + kvh) * hd + j)];
        s[size_t(t)] = d / std::sqrt(double(hd));
        mx = std::max(mx, s[size_t(t)]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int j = 0; j < hd; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < len; ++t) acc += s[size_t(t)] / sum * v[size_t((t * n_kv + kvh) * hd + j)];
        out[size_t((i * n_heads + h) * hd + j)] = float(acc);
      }
    }
  return out;
}

struct Case {
  int n_heads, n_kv;
  llm_kv_type type;
  float tol;
};

// Returns the attention output; checks it against naive_attention, and
// (check_rows) that each query row computed alone (n = 1, as in decode)
// gives the very same bits as inside the batch.
std::vector<float> run_case(const Case& c, int64_t len, int64_t n, int threads, std::mt19937& rng, int hd = 16,
                            bool check_rows = false) {
  const int layers = 2, layer = 1;
  llm::kv::Geometry g;
  g.n_layers = layers;
  g.n_kv_heads = c.n_kv;
  g.head_dim = hd;
  g.page_tokens = 16;
  llm::kv::PagePool pool(g, 1u << 30);
  const size_t n_pages = size_t((len + g.page_tokens - 1) / g.page_tokens);
  // Take extra pages and shuffle, so the table is not in allocation order.
  std::vector<llm::kv::Page*> all;
  EXPECT_TRUE(pool.acquire(c.type, n_pages + 5, all));
  if (all.empty()) return {};
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<llm::kv::Page*> table(all.begin(), all.begin() + long(n_pages));

  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(size_t(len) * c.n_kv * hd), v(k.size()), q(size_t(n) * c.n_heads * hd);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  for (int64_t t = 0; t < len; ++t)
    for (int h = 0; h < c.n_kv; ++h) {
      llm::kv::Page* p = table[size_t(t / g.page_tokens)];
      const int slot = int(t % g.page_tokens);
      llm::kv::store_row(g, p, layer, 0, h, slot, &k[size_t((t * c.n_kv + h) * hd)]);
      llm::kv::store_row(g, p, layer, 1, h, slot, &v[size_t((t * c.n_kv + h) * hd)]);
      // What the cache really holds (quantized types round): the reference uses that.
      llm::kv::load_row(g, p, layer, 0, h, slot, &k[size_t((t * c.n_kv + h) * hd)]);
      llm::kv::load_row(g, p, layer, 1, h, slot, &v[size_t((t * c.n_kv + h) * hd)]);
    }
  const int64_t p0 = len - n;
  const auto want = naive_attention(q, k, v, n, p0, c.n_heads, c.n_kv, hd);
  std::vector<float> got(want.size(), -1.f);
  llm::cpu::AttentionArgs a;
  a.geom = &g;
  a.pages = table.data();
  a.layer = layer;
  a.n_heads = c.n_heads;
  a.q = q.data();
  a.n = n;
  a.p0 = p0;
  a.out = got.data();
  llm::ThreadPool tp(threads);
  std::vector<std::vector<float>> scratch;
  llm::cpu::attention(a, scratch, &tp);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], c.tol) << "i=" << i << " len=" << len << " hd=" << hd;
    if (std::fabs(got[i] - want[i]) > c.tol) break;
  }
  if (check_rows) {
    const int64_t row = int64_t(c.n_heads) * hd;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> one(static_cast<size_t>(row), -1.f);
      llm::cpu::AttentionArgs b = a;
      b.q = q.data() + i * row;
      b.n = 1;
      b.p0 = p0 + i;
      b.out = one.data();
      llm::cpu::attention(b, scratch, &tp);
      EXPECT_EQ(0, std::memcmp(one.data(), got.data() + i * row, size_t(row) * sizeof(float)))
          << "row " << i << " alone differs from the batch (len " << len << ", hd " << hd << ")";
    }
  }
  for (auto* p : all) pool.release(p);
  EXPECT_EQ(pool.bytes_in_use(), 0u);
  return got;
}

}  // namespace

TEST(PagedAttention, MatchesContiguousReference) {
  std::mt19937 rng(1234);
  for (int ratio : {1, 2, 4, 8})
    for (llm_kv_type t : {LLM_KV_F32, LLM_KV_F16, LLM_KV_INT8, LLM_KV_INT4})
      for (int64_t len : {1, 15, 16, 17, 53, 100})
        for (int64_t n : {int64_t(1), std::min<int64_t>(len, 7)}) {
          SCOPED_TRACE(testing::Message() << "gqa " << ratio << " type " << t << " len " << len << " n " << n);
          run_case({8, 8 / ratio, t, 2e-5f}, len, n, (len % 2) ? 1 : 2, rng);
        }
}

// Real head sizes (64, 128), ones whose last 64-float chunk is partial (8,
// 72, 200), long rows (the vector softmax and 8-row blocks with a partial
// last block), for the blocked AVX2 kernels and the portable path; every row
// alone equals the batch bit for bit.
TEST(PagedAttention, HeadSizesLongRowsAndDecodeEqualsPrefill) {
  std::mt19937 rng(77);
  for (bool scalar : {false, true}) {
    llm::cpu::set_force_scalar(scalar);
    for (int hd : {8, 64, 72, 128, 200})
      for (llm_kv_type t : {LLM_KV_F16, LLM_KV_F32, LLM_KV_INT8})
        for (int64_t len : {9, 131, 300}) {
          SCOPED_TRACE(testing::Message() << (scalar ? "scalar" : "simd") << " hd " << hd << " type " << t << " len " << len);
          run_case({8, 2, t, 2e-5f}, len, std::min<int64_t>(len, 5), 2, rng, hd, true);
        }
  }
  llm::cpu::set_force_scalar(false);
}

// The blocked kernels and the portable path agree to float rounding.
TEST(PagedAttention, SimdMatchesPortable) {
  for (llm_kv_type t : {LLM_KV_F16, LLM_KV_INT4}) {
    std::mt19937 r1(5), r2(5);
    const std::vector<float> simd = run_case({32, 4, t, 2e-5f}, 257, 3, 2, r1, 64);
    llm::cpu::set_force_scalar(true);
    const std::vector<float> port = run_case({32, 4, t, 2e-5f}, 257, 3, 2, r2, 64);
    llm::cpu::set_force_scalar(false);
    ASSERT_EQ(simd.size(), port.size());
    for (size_t i = 0; i < simd.size(); ++i) ASSERT_NEAR(simd[i], port[i], 1e-5f) << t << " i=" << i;
  }
}

// The AVX-512 family's blocked kernels give the AVX2 family's bits: head
// sizes with a half 16-float vector at the end (8, 72, 200), even and odd
// query heads per KV head, partial 8-row blocks.
TEST(PagedAttention, Avx512FamilyGivesTheAvx2Bits) {
  if (llm::cpu::best_isa() != llm::cpu::Isa::Avx512) GTEST_SKIP() << "no AVX-512 family on this machine";
  const llm::cpu::Isa cap = llm::cpu::max_isa();
  for (int hd : {8, 64, 72, 128, 200, 256})
    for (int group : {1, 3, 4})
      for (llm_kv_type t : {LLM_KV_F16, LLM_KV_F32}) {
        SCOPED_TRACE(testing::Message() << "hd " << hd << " group " << group << " type " << t);
        std::mt19937 r1(11), r2(11);
        llm::cpu::set_max_isa(llm::cpu::Isa::Avx512);
        const std::vector<float> wide = run_case({2 * group, 2, t, 2e-5f}, 131, 9, 2, r1, hd);
        llm::cpu::set_max_isa(llm::cpu::Isa::Avx2);
        const std::vector<float> narrow = run_case({2 * group, 2, t, 2e-5f}, 131, 9, 2, r2, hd);
        llm::cpu::set_max_isa(cap);
        ASSERT_EQ(wide.size(), narrow.size());
        EXPECT_EQ(0, std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)));
      }
}

TEST(PagePool, BudgetIsHardAndAllOrNothing) {
  llm::kv::Geometry g{2, 2, 8, 16};
  const size_t pb = llm::kv::page_bytes(g, LLM_KV_F16);
  llm::kv::PagePool pool(g, pb * 3);
  std::vector<llm::kv::Page*> got;
  EXPECT_FALSE(pool.acquire(LLM_KV_F16, 4, got));
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(pool.acquire(LLM_KV_F16, 3, got));
  EXPECT_EQ(pool.bytes_in_use(), pb * 3);
  EXPECT_FALSE(pool.acquire(LLM_KV_F16, 1, got));
  llm::kv::PagePool::retain(got[0]);  // shared (fork)
  pool.release(got[0]);
  EXPECT_EQ(pool.bytes_in_use(), pb * 3);  // still referenced
  pool.release(got[0]);
  EXPECT_EQ(pool.bytes_in_use(), pb * 2);
  std::vector<llm::kv::Page*> again;
  EXPECT_TRUE(pool.acquire(LLM_KV_F16, 1, again));
  EXPECT_EQ(again[0], got[0]);  // recycled from the free list
  for (auto* p : {got[1], got[2], again[0]}) pool.release(p);
  EXPECT_EQ(pool.bytes_in_use(), 0u);
}

TEST(KvStorage, QuantizedRowsRoundTripWithinTheirStep) {
  llm::kv::Geometry g{1, 1, 64, 16};
  llm::kv::PagePool pool(g, 1u << 20);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (llm_kv_type t : {LLM_KV_F32, LLM_KV_F16, LLM_KV_INT8, LLM_KV_INT4}) {
    std::vector<llm::kv::Page*> p;
    ASSERT_TRUE(pool.acquire(t, 1, p));
    std::vector<float> x(64), y(64);
    for (auto& v : x) v = nd(rng);
    llm::kv::store_row(g, p[0], 0, 0, 0, 5, x.data());
    llm::kv::load_row(g, p[0], 0, 0, 0, 5, y.data());
    float amax = 0, lo = x[0], hi = x[0];
    for (float v : x) {
      amax = std::max(amax, std::fabs(v));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    // int8/int4 code the row's [min, max] range in 255 / 15 steps.
    const float step = t == LLM_KV_INT8 ? (hi - lo) / 255 : t == LLM_KV_INT4 ? (hi - lo) / 15 : t == LLM_KV_F16 ? amax / 1024 : 0;
    for (int i = 0; i < 64; ++i) EXPECT_LE(std::fabs(x[size_t(i)] - y[size_t(i)]), step * 0.5f + 1e-7f) << t;
    pool.release(p[0]);
  }
}
