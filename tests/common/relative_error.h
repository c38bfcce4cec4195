// max |a - b| over the range of b (max - min, at least 1e-6): how far a
// vector of logits (or K/V values) is from its reference, on the scale the
// reference spans. 0 for bit-identical vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace llm::testing {

// a holds b.size() values.
inline double relative_error(const float* a, const std::vector<float>& b) {
  if (b.empty()) return 0.0;
  double d = 0;
  const auto mm = std::minmax_element(b.begin(), b.end());
  for (size_t i = 0; i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d / std::max(1e-6, double(*mm.second) - double(*mm.first));
}

}  // namespace llm::testing
