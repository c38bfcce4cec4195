// Paged KV cache (ARCHITECTURE.md §5).
//
// A page holds K and V of `page_tokens` consecutive tokens for every layer
// and KV head. Layout of one page (elements of the storage type):
//
//   data:   [n_layers][2 (K, V)][n_kv_heads][page_tokens][head_dim]
//   scales: [n_layers][2 (K, V)][n_kv_heads][page_tokens]  (f32; int8/int4 only)
//
// so one head's keys within a page are contiguous (the attention inner loop
// walks them in order). Pages come from one PagePool per model with a hard
// byte budget; a session holds a page table (vector<Page*>). Pages are
// reference counted so forked sessions share them (copy-on-write).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "llm.h"

namespace llm::kv {

struct Geometry {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_tokens = 16;
};

// Bytes of one K or V row (head_dim values) in storage type t, excluding scales.
size_t row_bytes(llm_kv_type t, int32_t head_dim);
// Bytes of a whole page of type t.
size_t page_bytes(const Geometry& g, llm_kv_type t);
// True if t keeps a per-row f32 scale.
inline bool has_scales(llm_kv_type t) { return t == LLM_KV_INT8 || t == LLM_KV_INT4; }

struct Page {
  uint8_t* data = nullptr;
  llm_kv_type type = LLM_KV_F16;
  std::atomic<int32_t> refs{0};
};

// A byte budget that several pools may share (a model whose sliding-window
// layers keep their own pages: one budget for the whole cache).
struct Budget {
  explicit Budget(uint64_t limit_bytes) : limit(limit_bytes) {}
  const uint64_t limit;
  std::mutex mu;
  uint64_t in_use = 0;
};

class PagePool {
 public:
  PagePool(const Geometry& g, uint64_t budget_bytes);
  PagePool(const Geometry& g, std::shared_ptr<Budget> budget);
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  const Geometry& geometry() const { return g_; }
  uint64_t budget_bytes() const { return budget_->limit; }
  uint64_t bytes_in_use() const;  // this pool's pages (budget_bytes() may be shared)
  size_t page_bytes(llm_kv_type t) const { return kv::page_bytes(g_, t); }

  // Takes n pages of type t (refcount 1 each) and appends them to `out`.
  // All or nothing: returns false (and takes none) if the budget would be exceeded.
  // Throws Error(LLM_ERR_OUT_OF_MEMORY) if the host allocation fails.
  bool acquire(llm_kv_type t, size_t n, std::vector<Page*>& out);
  // Adds a reference (fork).
  static void retain(Page* p) { p->refs.fetch_add(1, std::memory_order_relaxed); }
  // Drops a reference; the last one returns the page to the free list.
  void release(Page* p);

 private:
  Geometry g_;
  std::shared_ptr<Budget> budget_;
  mutable std::mutex mu_;
  uint64_t in_use_ = 0;               // bytes of pages with refs > 0
  std::vector<Page*> free_[4];         // by llm_kv_type
  std::vector<Page*> all_;            // every page ever allocated (owned)
};

// ---- element access -------------------------------------------------------

// Pointer to the row of (layer, kv (0 = K, 1 = V), head, slot) in a page.
inline uint8_t* row_ptr(const Geometry& g, const Page* p, int32_t layer, int kv, int32_t head, int32_t slot) {
  const size_t rb = row_bytes(p->type, g.head_dim);
  const size_t idx = ((size_t(layer) * 2 + size_t(kv)) * size_t(g.n_kv_heads) + size_t(head)) * size_t(g.page_tokens) +
                     size_t(slot);
  return p->data + idx * rb;
}
// -> {step, min} of the row: value = min + step * q (q unsigned).
inline float* scale_ptr(const Geometry& g, const Page* p, int32_t layer, int kv, int32_t head, int32_t slot) {
  const size_t rb = row_bytes(p->type, g.head_dim);
  const size_t rows = size_t(g.n_layers) * 2 * size_t(g.n_kv_heads) * size_t(g.page_tokens);
  const size_t idx = ((size_t(layer) * 2 + size_t(kv)) * size_t(g.n_kv_heads) + size_t(head)) * size_t(g.page_tokens) +
                     size_t(slot);
  return reinterpret_cast<float*>(p->data + rows * rb) + 2 * idx;
}

// Stores head_dim floats into a row (quantizing for int8/int4).
void store_row(const Geometry& g, Page* p, int32_t layer, int kv, int32_t head, int32_t slot, const float* src);
// Loads a row back into head_dim floats.
void load_row(const Geometry& g, const Page* p, int32_t layer, int kv, int32_t head, int32_t slot, float* dst);

}  // namespace llm::kv
