// Random test vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace llm::testing {

// n values drawn from N(0, sd^2) by one mt19937 seeded with `seed`.
inline std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace llm::testing
