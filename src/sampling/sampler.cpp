#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace llm {

llm_sampling sampling_from_user(const llm_sampling* user) {
  llm_sampling s;
  llm_sampling_init(&s);
  if (user) {
    const size_t n = std::min<size_t>(user->struct_size, sizeof(llm_sampling));
    if (n > sizeof(uint32_t)) std::memcpy(reinterpret_cast<char*>(&s) + 4, reinterpret_cast<const char*>(user) + 4, n - 4);
    s.struct_size = sizeof(llm_sampling);
  }
  return s;
}

int32_t Sampler::sample(const float* logits, int32_t n_vocab, const llm_sampling& s, const int32_t* recent,
                        size_t n_recent, Rng& rng) {
  const float* l = logits;
  // Repetition penalty (CTRL): divide positive logits, multiply negative ones.
  if (s.repeat_penalty > 0.f && s.repeat_penalty != 1.f && n_recent > 0) {
    work_.assign(logits, logits + n_vocab);
    const size_t last_n = s.repeat_last_n < 0 ? n_recent : std::min<size_t>(n_recent, size_t(s.repeat_last_n));
    for (size_t i = n_recent - last_n; i < n_recent; ++i) {
      const int32_t id = recent[i];
      if (id < 0 || id >= n_vocab) continue;
      // Penalise each distinct token once: only when it still holds its original value.
      if (work_[size_t(id)] != logits[id]) continue;
      work_[size_t(id)] = logits[id] > 0.f ? logits[id] / s.repeat_penalty : logits[id] * s.repeat_penalty;
    }
    l = work_.data();
  }

  if (!(s.temperature > 0.f)) {  // greedy, lowest id on ties
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i)
      if (l[i] > l[best]) best = i;
    return best;
  }

  // Tokens at -inf (masked by a grammar) have probability 0 exactly: leaving
  // them out changes no draw and spares sorting them.
  cands_.clear();
  cands_.reserve(size_t(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i)
    if (l[i] != -INFINITY) cands_.push_back({l[i], i});
  if (cands_.empty()) cands_.push_back({l[0], 0});
  auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t n = cands_.size();
  if (s.top_k > 0 && size_t(s.top_k) < n) {
    std::partial_sort(cands_.begin(), cands_.begin() + s.top_k, cands_.end(), by_logit);
    n = size_t(s.top_k);
  } else {
    std::sort(cands_.begin(), cands_.end(), by_logit);
  }
  // Softmax with temperature over the survivors (sorted descending).
  const float inv_t = 1.0f / s.temperature;
  const float mx = cands_[0].logit;
  std::vector<float>& p = work_;
  p.resize(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((cands_[i].logit - mx) * inv_t);
    sum += p[i];
  }
  for (size_t i = 0; i < n; ++i) p[i] = float(p[i] / sum);
  if (s.min_p > 0.f) {  // keep tokens with p >= min_p * p_max
    const float cut = s.min_p * p[0];
    size_t keep = 1;
    while (keep < n && p[keep] >= cut) ++keep;
    n = keep;
  }
  if (s.top_p > 0.f && s.top_p < 1.f) {  // smallest prefix with mass >= top_p
    double mass = 0;
    size_t keep = 0;
    while (keep < n) {
      mass += p[keep++];
      if (mass >= s.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  const double r = double(rng.next_float()) * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += p[i];
    if (r < acc) return cands_[i].id;
  }
  return cands_[n - 1].id;
}

}  // namespace llm
