// Host-side decisions of the CUDA backend that need no GPU: launch shapes,
// device KV page bookkeeping, sequence page tables with copy-on-write, and
// CUDA-graph bookkeeping. Plain C++ (built with or without CUDA) so the
// CPU tests in tests/gpu/ cover them everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/kernel_math.h"

namespace llm::cuda {

// ---------------------------------------------------------------- launch shapes

constexpr int kGemvThreads = 256;  // 8 warps per block
constexpr int kGemvMaxBatch = 8;   // activation rows per GEMV pass (template NB)

// Warps cooperating on one output row (1, 2, 4 or 8; a block holds 8 / w
// rows). More warps per row when there are few rows, so that a small matrix
// (wk, wv) still puts >= 2 blocks per SM in flight; never more warps than
// the row has chunks for (32 lanes each).
int gemv_warps_per_row(int64_t rows, int64_t chunks_per_row, int sm_count);

// Activation rows per GEMV pass for n rows left: the template NB in {1, 2, 4, 8}.
int gemv_batch_tile(int64_t n);

// Output rows per warp (1 or 2) for a pass of nb_tile activation rows. With
// one activation row a q4 chunk (16 bytes of weights) needs 128 bytes of
// activations, so a warp that owns one row is L1-bound, not HBM-bound; two
// rows per warp reuse every activation load. Only when each row has one
// warp and 16 rows per block still leave >= 2 blocks per SM.
int gemv_rows_per_warp(int64_t rows, int warps_per_row, int nb_tile, int sm_count);

// Decode attention split: keys of a sequence are cut into n_splits chunks of
// split_tokens (a multiple of kAttnTile). Chosen from the page-table
// capacity (not the current length) so that one captured graph serves every
// length up to that capacity; blocks past the live length exit early.
struct SplitPlan {
  int32_t split_tokens = kAttnTile;
  int32_t n_splits = 1;
};
SplitPlan plan_decode_splits(int64_t capacity_tokens, int32_t n_seqs, int32_t n_kv_heads, int sm_count);

// Prefill attention: rows of one sequence per block, so that rows x group
// query vectors x head_dim accumulators fit kAttnThreads x kAttnMaxAcc and
// kAttnMaxQueries. 0 when even one row does not fit (head_dim x group too large).
int32_t prefill_rows_per_block(int32_t group, int32_t head_dim);

// Shared-memory layout of the attention kernel, in floats.
struct AttnSmem {
  int32_t q = 0, k = 0, v = 0, p = 0, m = 0, l = 0, alpha = 0;  // offsets
  int32_t k_stride = 0;  // head_dim + 1: no bank conflicts when threads read different keys
  int32_t total = 0;     // floats
  size_t bytes() const { return size_t(total) * sizeof(float); }
};
AttnSmem attention_smem(int32_t n_queries, int32_t head_dim);

// Page-table capacity (pages per sequence) for a need: powers of two from 16,
// so graphs and buffers are rebuilt O(log n) times as sequences grow.
int32_t table_bucket(int64_t pages_needed);

// ---------------------------------------------------------------- device KV pages

// Ids of device KV pages under a hard byte budget. Device memory comes in
// chunks of pages_per_chunk pages allocated on demand (the caller allocates
// chunk i before handing out ids in it: see chunks_needed_for). Lowest free
// ids are reused first, so memory use stays compact. Reference counts give
// copy-on-write sharing between forked sequences. Not thread-safe (the
// backend serialises its calls).
class PageAllocator {
 public:
  PageAllocator(size_t page_bytes, uint64_t budget_bytes, int32_t pages_per_chunk);

  size_t page_bytes() const { return page_bytes_; }
  int32_t max_pages() const { return max_pages_; }
  int32_t pages_per_chunk() const { return per_chunk_; }
  int32_t pages_in_use() const { return in_use_; }
  uint64_t bytes_in_use() const { return uint64_t(in_use_) * page_bytes_; }
  int32_t high_water() const { return int32_t(refs_.size()); }
  // Pages in chunk c (the last chunk is cut so the total never exceeds the budget).
  int32_t chunk_pages(int32_t c) const;
  // Chunks that must exist before acquire(n) can succeed.
  int32_t chunks_needed_for(size_t n) const;
  int32_t chunk_of(int32_t id) const { return id / per_chunk_; }
  int32_t index_in_chunk(int32_t id) const { return id % per_chunk_; }

  // Appends n ids (refcount 1) to out, lowest free first. All or nothing:
  // false, and nothing taken, if the budget would be exceeded.
  bool acquire(size_t n, std::vector<int32_t>& out);
  void retain(int32_t id);
  void release(int32_t id);
  int32_t refs(int32_t id) const { return refs_[size_t(id)]; }

 private:
  size_t page_bytes_;
  int32_t max_pages_;
  int32_t per_chunk_;
  int32_t in_use_ = 0;
  std::vector<int32_t> refs_;  // per id ever handed out
  std::vector<int32_t> free_;  // min-heap of ids with refs 0
};

// Device-to-device page copy made by copy-on-write.
struct PageCopy {
  int32_t src = -1;
  int32_t dst = -1;
};

// The page ids of one sequence, slot i of the sequence in page i / page_tokens.
class PageList {
 public:
  const std::vector<int32_t>& ids() const { return ids_; }
  size_t size() const { return ids_.size(); }

  // Makes slots [from, to) writable: appends fresh pages up to
  // ceil(to / page_tokens) and replaces every shared page (refs > 1) that the
  // range touches by a fresh one, recording the copy to make before writing.
  // All or nothing: returns false with nothing changed if pages run out.
  // appended (optional) gets the number of pages appended, for rollback.
  bool prepare_write(PageAllocator& a, int32_t page_tokens, uint32_t from, uint32_t to, std::vector<PageCopy>& copies,
                     size_t* appended = nullptr);
  // Pages prepare_write(from, to) would take from the allocator.
  size_t pages_needed(const PageAllocator& a, int32_t page_tokens, uint32_t from, uint32_t to) const;
  // Releases pages past the first n.
  void shrink_to(PageAllocator& a, size_t n);
  void release_all(PageAllocator& a) { shrink_to(a, 0); }
  // A second list sharing every page (refcounts + 1).
  PageList share(PageAllocator& a) const;

 private:
  std::vector<int32_t> ids_;
};

// What the device copy of the page tables holds, row by row, so a step
// uploads only what changed (usually nothing, or one appended page).
class TableMirror {
 public:
  // Forgets everything (the device buffer was reallocated): every row is dirty.
  void reset(int32_t rows);
  // Records `ids` as row r's content and returns the first index that differs
  // from what the device had (ids.size() when nothing needs uploading).
  size_t sync_row(int32_t r, const std::vector<int32_t>& ids);

 private:
  std::vector<std::vector<int32_t>> rows_;
};

// ---------------------------------------------------------------- CUDA graphs

// What identifies a captured decode step. A graph bakes in launch shapes and
// buffer addresses, so anything that changes them is part of the key or
// invalidates every graph (see DecodeGraphs::invalidate_all).
struct GraphKey {
  int32_t batch = 0;        // sequences in the step
  int32_t table_pages = 0;  // page-table capacity per sequence (table_bucket)
  int32_t out_mode = 0;     // what the graph computes at the end (logits only, argmax, top-k k)
  bool operator==(const GraphKey& o) const {
    return batch == o.batch && table_pages == o.table_pages && out_mode == o.out_mode;
  }
};

// Bookkeeping of captured decode graphs: when to run eagerly, when to
// capture, when to replay, which slot to destroy. The backend owns the
// cudaGraphExec_t of each slot; this class decides.
//  - a key is captured on its `capture_after`-th use (one-off batch sizes run eagerly),
//  - at most max_graphs are kept; the least recently used is evicted,
//  - a failed capture or replay disables graphs for good (eager from then on).
class DecodeGraphs {
 public:
  enum class Action { Eager, Capture, Replay };
  struct Decision {
    Action action = Action::Eager;
    int slot = -1;        // Capture/Replay: the slot
    int destroy_slot = -1;  // Capture: the slot whose old graph must be destroyed first (-1: none)
  };
  explicit DecodeGraphs(size_t max_graphs = 8, int capture_after = 2);

  Decision lookup(const GraphKey& key);
  // After a Capture decision: the capture worked (the slot now replays) or failed (graphs disabled).
  void captured(int slot);
  void capture_failed();
  // Forgets every graph (buffers moved); returns the slots whose graphs must be destroyed.
  std::vector<int> invalidate_all();
  bool enabled() const { return enabled_; }
  void disable() { enabled_ = false; }
  size_t n_ready() const;

 private:
  struct Entry {
    GraphKey key;
    int uses = 0;
    bool ready = false;
    uint64_t last_use = 0;
  };
  std::vector<Entry> entries_;  // index = slot
  size_t max_graphs_;
  int capture_after_;
  uint64_t clock_ = 0;
  bool enabled_ = true;
};

}  // namespace llm::cuda
