// A session: one sequence over a shared model. Owns its KV sequence (on the
// model's backend), tokens, pending token, logits, sampler, grammar state and
// metrics. Used by one thread at a time; sessions of one model run in
// parallel.
//
// The model math, the KV pages and their layout belong to the backend the
// session runs on (backend/backend.h: the CPU one, or the CUDA one when the
// model runs on a GPU whose cache holds the session's kv_type); the session
// decides which tokens run when, and keeps what the caller sees.
//
// Sequence bookkeeping:
//   tokens_   every token of the sequence, the pending one included
//   n_cached  tokens whose K/V are in the cache (seq_->length(); slot i
//             holds position i)
//   pending_  tokens_.back() is not in the cache yet: returned by
//             decode_step, or cached once and dropped to re-run it
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "llm.h"
#include "model/model.h"
#include "sampling/constraint.h"
#include "sampling/sampler.h"

namespace llm {

// A prompt chunk for Session::decode_batch: tokens appended (as prefill())
// before the session's step; sample = false appends only.
struct PromptChunk {
  const int32_t* tokens = nullptr;
  size_t n = 0;
  bool sample = true;
};

struct SessionOptions {
  uint32_t max_tokens = 0;  // 0 = model context
  uint32_t window = 0;
  uint32_t n_sink = 4;
  llm_kv_type kv_type = LLM_KV_F16;
  llm_cancel_fn cancel = nullptr;
  void* cancel_user = nullptr;
};

class Session {
 public:
  // Throws Error(LLM_ERR_INVALID_ARGUMENT / LLM_ERR_UNSUPPORTED).
  Session(const Model& model, const SessionOptions& opts);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void prefill(const int32_t* tokens, size_t n);
  // constraint (may be null): a prototype in its start state (see
  // sampling/constraint.h); the session keeps its own state of it until
  // prefill(), reset() or a constraint with another key.
  int32_t decode_step(const llm_sampling* sampling, const TokenConstraint* constraint = nullptr);
  // decode_step on each of n distinct sessions of one model; the pending
  // tokens of the sessions that can join run as batched passes of their
  // backend (Backend::forward_batch; see session.cpp for who joins). Session
  // i samples with samplings[i] under constraints[i] (either array may be
  // null: greedy, unconstrained; an entry may be null likewise). With
  // prompts, session i first appends prompts[i] as prefill() would (in a
  // batched pass with the other sessions' tokens when its backend takes
  // prompt chunks there, as the CPU one does) and samples
  // only if prompts[i].sample (out[i] is left as it was otherwise).
  static void decode_batch(Session* const* sessions, size_t n, const llm_sampling* const* samplings, int32_t* out,
                           const TokenConstraint* const* constraints = nullptr, const PromptChunk* prompts = nullptr);
  const float* logits();
  void evict(uint32_t n_keep, uint32_t n_discard);
  void reset();
  void stats(llm_session_stats_t* out) const;

  // A copy sharing every KV page (copy-on-write).
  std::unique_ptr<Session> fork() const;
  // Versioned, checksummed snapshot; restore() validates untrusted bytes.
  void save(std::vector<uint8_t>& out) const;
  static std::unique_ptr<Session> restore(const Model& model, const uint8_t* data, size_t size);

  // Reads the cached K (kv = 0) or V (kv = 1) row of (layer, head) at slot, as f32.
  void kv_row(int32_t layer, int kv, int32_t head, uint32_t slot, float* out) const;
  size_t n_pages() const { return seq_->n_pages(); }              // pages of the global layers
  size_t n_local_pages() const { return seq_->n_local_pages(); }  // pages the windowed layers still hold
  uint32_t local_first() const { return seq_->local_first(); }    // first slot the windowed layers hold
  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opts_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  uint32_t n_cached() const { return seq_->length(); }
  uint32_t capacity() const { return capacity_; }

 private:
  // Runs the forward pass of toks[0..n) at positions n_cached().. and, on
  // success, appends them to the cache. Logits of the last row go to logits_.
  // The last n_new tokens are new to the sequence: they are appended to
  // tokens_ chunk by chunk, as the cache takes them, so that a sliding
  // window's eviction between chunks sees both in step (the caller reserves
  // the room). On failure the cache and tokens_ hold what they held before,
  // except what a sliding window had to evict (then the completed chunks stay).
  void forward(const int32_t* toks, size_t n, bool allow_cancel, size_t n_new = 0);
  // Makes room for m more tokens: window eviction or CONTEXT_FULL.
  void make_room(size_t m);
  uint32_t page_tokens() const;
  // decode_batch's batched passes (session.cpp): run the pending tokens and
  // prompt chunks of the sessions that can join as Backend::forward_batch
  // passes. For each session i a pass advanced: gen0[i] = n_generated_ + 1
  // (0 when its prompt chunk ran: joined[i] is then true) and pass_ms[i] =
  // that pass's time (all three left empty when no pass ran).
  static void decode_batch_passes(Session* const* ss, size_t n, const PromptChunk* prompts,
                                  std::vector<uint32_t>& gen0, std::vector<double>& pass_ms,
                                  std::vector<bool>& joined);
  // prefill()'s bookkeeping once toks[0..n) are in the cache (cannot fail:
  // the caller reserved room in tokens_).
  void prefilled(const int32_t* toks, size_t n, size_t rows, double ms);
  // Throws INVALID_ARGUMENT for an id outside the vocabulary.
  void check_ids(const int32_t* toks, size_t n) const;
  void evict_cached(uint32_t n_keep, uint32_t n_discard);
  void ensure_logits();
  // Samples from logits_ under the constraint (if any) and advances it.
  int32_t sample_next(const llm_sampling& s, const TokenConstraint* constraint);

  const Model& model_;
  SessionOptions opts_;
  Backend& backend_;
  std::unique_ptr<KvSequence> seq_;
  uint32_t capacity_ = 0;  // max tokens held in the cache
  std::vector<int32_t> tokens_;
  bool pending_ = false;
  bool logits_valid_ = false;
  bool sampled_since_prefill_ = false;

  std::vector<float> logits_;
  Sampler sampler_;
  Rng rng_;
  uint64_t rng_seed_ = 0;
  bool rng_seeded_ = false;
  std::unique_ptr<TokenConstraint> constraint_;  // this session's grammar state
  std::vector<float> masked_;                    // logits_ with the grammar's mask applied
  std::vector<int32_t> greedy_ids_;              // the best candidates of a constrained greedy step

  // metrics
  using Clock = std::chrono::steady_clock;
  uint32_t n_prompt_ = 0, n_generated_ = 0, n_evicted_ = 0;
  double last_prefill_ms_ = 0, ttft_ms_ = 0, prompt_ms_total_ = 0, gen_ms_total_ = 0;
  uint32_t prompt_tokens_timed_ = 0;
  std::vector<float> itl_ms_;
};

}  // namespace llm
