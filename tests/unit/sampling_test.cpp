#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "sampling/sampler.h"

namespace {

llm_sampling params() {
  llm_sampling s;
  llm_sampling_init(&s);
  return s;
}

std::vector<float> ramp(int n) {  // logit i = i / 4: token n-1 most likely
  std::vector<float> l(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) l[size_t(i)] = float(i) / 4.0f;
  return l;
}

}  // namespace

TEST(Sampling, GreedyPicksArgmaxLowestIdOnTies) {
  llm::Sampler s;
  llm::Rng rng(1);
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l.data(), 4, params(), nullptr, 0, rng), 1);
}

TEST(Sampling, SameSeedSameTokensDifferentSeedDiffers) {
  auto draw = [](uint64_t seed) {
    llm::Sampler s;
    llm::Rng rng(seed);
    llm_sampling p = params();
    p.temperature = 1.0f;
    std::vector<float> l(64, 0.0f);  // uniform: every draw is pure RNG
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) out.push_back(s.sample(l.data(), 64, p, nullptr, 0, rng));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampling, TopKKeepsOnlyKMostLikely) {
  llm::Sampler s;
  llm::Rng rng(7);
  llm_sampling p = params();
  p.temperature = 5.0f;  // flatten, so any survivor is likely to appear
  p.top_k = 3;
  const auto l = ramp(32);
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l.data(), 32, p, nullptr, 0, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{29, 30, 31}));
}

TEST(Sampling, TopPCutsTheTail) {
  llm::Sampler s;
  llm::Rng rng(3);
  llm_sampling p = params();
  p.temperature = 1.0f;
  p.top_p = 0.5f;
  // probabilities 0.4, 0.3, 0.2, 0.1 -> the smallest prefix with mass >= 0.5 is {0, 1}
  std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  std::map<int32_t, int> counts;
  for (int i = 0; i < 4000; ++i) counts[s.sample(l.data(), 4, p, nullptr, 0, rng)]++;
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[0], counts[1]);
  // 0.4 / 0.7 = 0.571 of the draws
  EXPECT_NEAR(counts[0] / 4000.0, 0.4 / 0.7, 0.04);
}

// A vocabulary in shuffled order, logit of the token of rank i = -i / 100:
// the draws follow the softmax without sorting it (no top-k, no top-p), and
// top-p keeps exactly the smallest most-likely prefix with the mass asked for
// (92 tokens here, past the first partial sort of 64).
TEST(Sampling, LargeShuffledVocabularyDrawsTheSoftmaxAndTopPItsExactPrefix) {
  const int n = 1000;
  std::vector<int32_t> id_of_rank(n);
  for (int i = 0; i < n; ++i) id_of_rank[size_t(i)] = i;
  std::mt19937 g(11);
  std::shuffle(id_of_rank.begin(), id_of_rank.end(), g);
  std::vector<float> l(size_t(n), 0.f);
  for (int i = 0; i < n; ++i) l[size_t(id_of_rank[size_t(i)])] = -float(i) / 100.0f;
  std::vector<double> q(static_cast<size_t>(n));
  double z = 0;
  for (int i = 0; i < n; ++i) z += q[size_t(i)] = std::exp(-double(i) / 100.0);
  for (double& v : q) v /= z;

  llm::Sampler s;
  llm::Rng rng(13);
  llm_sampling p = params();
  p.temperature = 1.0f;
  const int draws = 40000;
  std::vector<int> count(size_t(n), 0);
  for (int k = 0; k < draws; ++k) count[size_t(s.sample(l.data(), n, p, nullptr, 0, rng))]++;
  for (int rank : {0, 50, 200}) {  // binomial, 5 standard deviations
    const double e = draws * q[size_t(rank)], sd = std::sqrt(e * (1 - q[size_t(rank)]));
    EXPECT_NEAR(count[size_t(id_of_rank[size_t(rank)])], e, 5 * sd) << "rank " << rank;
  }

  p.top_p = 0.6f;
  size_t keep = 0;
  for (double mass = 0; mass < 0.6;) mass += q[keep++];
  ASSERT_EQ(keep, 92u);
  std::set<int32_t> want(id_of_rank.begin(), id_of_rank.begin() + long(keep)), seen;
  for (int k = 0; k < draws; ++k) seen.insert(s.sample(l.data(), n, p, nullptr, 0, rng));
  EXPECT_EQ(seen, want);
}

TEST(Sampling, MinPDropsUnlikely) {
  llm::Sampler s;
  llm::Rng rng(5);
  llm_sampling p = params();
  p.temperature = 1.0f;
  p.min_p = 0.6f;  // keep p >= 0.6 * 0.4 = 0.24
  std::vector<float> l = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l.data(), 4, p, nullptr, 0, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

// The C API does not bound min_p: above 1 no token reaches the cut, and the
// most likely one (lowest id on ties) is what is left, never an empty set.
TEST(Sampling, MinPAboveOneKeepsTheMostLikely) {
  llm::Sampler s;
  llm::Rng rng(6);
  llm_sampling p = params();
  p.temperature = 1.0f;
  p.min_p = 2.0f;
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(l.data(), 5, p, nullptr, 0, rng), 1);
  p.top_k = 2;  // ranked candidates take the same rule
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(l.data(), 5, p, nullptr, 0, rng), 1);
}

TEST(Sampling, RepeatPenaltyChangesGreedyChoice) {
  llm::Sampler s;
  llm::Rng rng(1);
  llm_sampling p = params();
  std::vector<float> l = {1.0f, 1.5f, 0.2f};
  const int32_t recent[] = {1, 1, 1};
  EXPECT_EQ(s.sample(l.data(), 3, p, recent, 3, rng), 1);
  p.repeat_penalty = 2.0f;  // 1.5 / 2 = 0.75 < 1.0
  EXPECT_EQ(s.sample(l.data(), 3, p, recent, 3, rng), 0);
  EXPECT_EQ(l[1], 1.5f);  // the caller's logits are untouched
}

TEST(Sampling, TemperatureZeroIsGreedyEvenWithFilters) {
  llm::Sampler s;
  llm::Rng rng(9);
  llm_sampling p = params();
  p.top_k = 2;
  p.top_p = 0.1f;
  const auto l = ramp(10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l.data(), 10, p, nullptr, 0, rng), 9);
}

TEST(Sampling, OlderShorterStructGetsDefaultsForNewFields) {
  llm_sampling user = params();
  user.temperature = 0.7f;
  user.repeat_last_n = 5;
  user.struct_size = offsetof(llm_sampling, seed);  // a client compiled before `seed` existed
  const llm_sampling s = llm::sampling_from_user(&user);
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_EQ(s.seed, 0u);
  EXPECT_EQ(s.repeat_last_n, 64);  // default, not the caller's unread 5
}
