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
  // them out changes no draw. Candidates stay in id order unless top-k or
  // top-p needs them sorted (by logit, then id): a full sort of a 32k or
  // 256k vocabulary cost 2 ms a token, more than a small model's forward
  // pass, and a draw needs no order; top-p sorts only the prefix it keeps.
  cands_.clear();
  cands_.reserve(size_t(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i)
    if (l[i] != -INFINITY) cands_.push_back({l[i], i, 0.f});
  if (cands_.empty()) cands_.push_back({l[0], 0, 0.f});
  auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  size_t n = cands_.size();
  bool sorted = false;
  if (s.top_k > 0 && size_t(s.top_k) < n) {
    std::partial_sort(cands_.begin(), cands_.begin() + s.top_k, cands_.end(), by_logit);
    n = size_t(s.top_k);
    sorted = true;
  }
  // Softmax with temperature over the survivors.
  const float inv_t = 1.0f / s.temperature;
  size_t top = 0;  // the most likely candidate, first in the current order (lowest id on ties)
  for (size_t i = 1; i < n; ++i)
    if (cands_[i].logit > cands_[top].logit) top = i;
  const float mx = cands_[top].logit;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    cands_[i].p = std::exp((cands_[i].logit - mx) * inv_t);
    sum += cands_[i].p;
  }
  for (size_t i = 0; i < n; ++i) cands_[i].p = float(cands_[i].p / sum);
  if (s.min_p > 0.f) {  // keep tokens with p >= min_p * p_max (a most likely token has exp(0) = 1)
    const float cut = s.min_p * float(1.0 / sum);
    size_t keep = 0;
    for (size_t i = 0; i < n; ++i)
      if (cands_[i].p >= cut) cands_[keep++] = cands_[i];  // order kept
    if (keep == 0) cands_[keep++] = cands_[top];  // min_p > 1: nothing was moved; the most likely stays
    n = keep;
  }
  if (s.top_p > 0.f && s.top_p < 1.f) {  // smallest prefix, most likely first, with mass >= top_p
    double mass = 0;
    size_t done = 0, chunk = 64, keep = n;
    while (keep == n && done < n) {
      const size_t end = std::min(n, done + chunk);
      if (!sorted) {
        if (end < n) std::nth_element(cands_.begin() + long(done), cands_.begin() + long(end), cands_.begin() + long(n), by_logit);
        std::sort(cands_.begin() + long(done), cands_.begin() + long(end), by_logit);
      }
      for (size_t i = done; i < end; ++i) {
        mass += cands_[i].p;
        if (mass >= s.top_p) {
          keep = i + 1;
          break;
        }
      }
      done = end;
      chunk *= 2;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += cands_[i].p;
  const double r = double(rng.next_float()) * total;
  double acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += cands_[i].p;
    if (r < acc) return cands_[i].id;
  }
  return cands_[n - 1].id;
}

}  // namespace llm
