// The one interface a session runs on (docs/ARCHITECTURE.md §6): the CPU
// backend (backend/cpu/cpu_backend.h) and the CUDA backend (backend/cuda/,
// through cuda::as_backend) both implement it, so the session only
// orchestrates: which tokens, when to evict, sampling, metrics, snapshots.
//
// A backend belongs to one model and is shared by its sessions (calls on
// distinct sequences may run on different threads at once). Each session
// holds one KvSequence of it: the KV cache of its sequence, slot i holding
// position i, length() slots filled.
//
// Errors: every method throws llm::Error and leaves the sequences it was
// given as they were, except where a method says otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "llm.h"

namespace llm {

class KvSequence {
 public:
  virtual ~KvSequence() = default;
  virtual uint32_t length() const = 0;      // slots whose K/V are cached
  virtual llm_kv_type kv_type() const = 0;
  // Pages of the global layers (every layer when the model has no
  // sliding-window group), of the windowed layers, and the first slot the
  // windowed layers still hold (their earlier pages are given back).
  virtual size_t n_pages() const = 0;
  virtual size_t n_local_pages() const { return 0; }
  virtual uint32_t local_first() const { return 0; }
  virtual uint64_t kv_bytes() const = 0;    // bytes of the pages held
};

// One sequence's rows in a batched pass.
struct SequenceRows {
  KvSequence* seq = nullptr;
  const int32_t* tokens = nullptr;
  size_t n = 0;
  float* logits = nullptr;  // [vocab]: the last row's
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::unique_ptr<KvSequence> new_sequence(llm_kv_type kv_type) = 0;
  // A sequence sharing every page of src (copy-on-write on the first write).
  virtual std::unique_ptr<KvSequence> fork(const KvSequence& src) = 0;

  // Runs tokens[0..n) (n <= max_rows()) at positions s.length().. and
  // appends their K/V; the last row's logits go to `logits` ([vocab]).
  // `cancel` (may be empty) is polled between layers: true ->
  // Error(LLM_ERR_CANCELLED). A pass with n == 1 and no cancel is a decode
  // step (a backend may take a faster path for it).
  virtual void forward(KvSequence& s, const int32_t* tokens, size_t n, float* logits,
                       const std::function<bool()>& cancel) = 0;

  // forward() of several distinct sequences in one pass (one read of the
  // weights for all their rows; every logit bit-identical to running each
  // alone on the CPU). At most max_batch() sequences, each with at most
  // max_batch_rows_per_seq() rows, max_rows() rows in all. Runs a prefix
  // of them: returns how many ran (fewer when the next one's KV pages could
  // not be had; 0 when none ran). A throw leaves every sequence unchanged.
  virtual size_t forward_batch(const SequenceRows* seqs, size_t n) = 0;
  virtual size_t max_batch() const = 0;
  virtual size_t max_batch_rows_per_seq() const = 0;
  virtual size_t max_rows() const = 0;

  // Drops cached slots past n (n <= length) and the pages no longer needed.
  // Where a model has sliding-window layers, the rows that had left every
  // window stay gone, so a rerun is exact when it drops one slot (those
  // layers keep W + 1) or goes back to the length of a hold().
  virtual void truncate(KvSequence& s, uint32_t n) = 0;
  // hold() keeps what truncating back to the current length needs (the rows
  // the windows reach at that length) until release_hold() or an evict().
  // The session holds across a prompt that runs in several passes, so that
  // undoing the completed ones after a later one fails is exact.
  virtual void hold(KvSequence&) {}
  virtual void release_hold(KvSequence&) noexcept {}
  // Removes slots [n_keep, n_keep + n_discard) (all < length): later ones
  // move down and their keys are re-rotated to their new positions, so the
  // cache equals one computed at those positions.
  virtual void evict(KvSequence& s, uint32_t n_keep, uint32_t n_discard) = 0;

  // The cached K (kv = 0) or V (kv = 1) row of (layer, head) at slot (<
  // length; the caller checks the ranges), as f32.
  virtual void kv_row(const KvSequence& s, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) const = 0;

  // Snapshot pages, in the host page layout of kv/kv_cache.h: appends the
  // n_pages() pages of the global layers (slots past length() zeroed) and,
  // for a model with a windowed group, local_first() and that group's pages
  // from local_first()'s on.
  virtual void save_pages(const KvSequence& s, std::vector<uint8_t>& out) const = 0;
  // Fills an empty sequence from [data, data + size), bytes save_pages wrote
  // for n_pages pages holding `length` slots; throws LLM_ERR_FORMAT when the
  // size or a field does not fit, LLM_ERR_CONTEXT_FULL when the pool is full.
  virtual void restore_pages(KvSequence& s, const uint8_t* data, size_t size, uint32_t n_pages,
                             uint32_t length) = 0;
};

}  // namespace llm
