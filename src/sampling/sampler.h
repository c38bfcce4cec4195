// Token sampling: repetition penalty, then greedy argmax or
// temperature -> top-k -> min-p -> top-p -> draw from a seeded RNG.
#pragma once

#include <cstdint>
#include <vector>

#include "llm.h"

namespace llm {

// PCG32 (O'Neill): small, fast, and the same sequence on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    state_ = 0;
    inc_ = (seed << 1u) | 1u;
    next_u32();
    state_ += seed ^ 0x853c49e6748fea9bULL;
    next_u32();
  }
  uint32_t next_u32() {
    const uint64_t old = state_;
    state_ = old * 6364136223846793005ULL + inc_;
    const uint32_t xorshifted = uint32_t(((old >> 18u) ^ old) >> 27u);
    const uint32_t rot = uint32_t(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
  }
  // Uniform in [0, 1) with 24 bits.
  float next_float() { return float(next_u32() >> 8) * (1.0f / 16777216.0f); }
  uint64_t state() const { return state_; }
  uint64_t inc() const { return inc_; }
  void set_state(uint64_t state, uint64_t inc) { state_ = state; inc_ = inc; }

 private:
  uint64_t state_ = 0, inc_ = 1;
};

// Copies the caller's (possibly older, shorter) struct over the defaults.
llm_sampling sampling_from_user(const llm_sampling* user);

class Sampler {
 public:
  // logits[n_vocab] is not modified. recent: the last tokens of the sequence
  // (for the repetition penalty). Returns the chosen id.
  int32_t sample(const float* logits, int32_t n_vocab, const llm_sampling& s, const int32_t* recent,
                 size_t n_recent, Rng& rng);

 private:
  struct Cand {
    float logit;
    int32_t id;
    float p;  // probability once computed
  };
  std::vector<float> work_;
  std::vector<Cand> cands_;
};

}  // namespace llm
