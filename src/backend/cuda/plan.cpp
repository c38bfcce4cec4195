// Built with or without CUDA: no CUDA calls here.
#include "backend/cuda/plan.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace llm::cuda {

// ---------------------------------------------------------------- launch shapes

int gemv_warps_per_row(int64_t rows, int64_t chunks_per_row, int sm_count) {
  const int64_t target_blocks = 2 * int64_t(std::max(sm_count, 1));
  int w = 1;
  while (w < 8) {
    const int64_t blocks = (rows + (8 / w) - 1) / (8 / w);
    if (blocks >= target_blocks) break;          // enough blocks in flight already
    if (chunks_per_row < 32 * int64_t(w) * 2) break;  // the next step would leave lanes idle
    w *= 2;
  }
  return w;
}

int gemv_rows_per_warp(int64_t rows, int warps_per_row, int nb_tile, int sm_count) {
  if (warps_per_row != 1 || nb_tile != 1) return 1;
  const int64_t blocks = (rows + 15) / 16;
  return blocks >= 2 * int64_t(std::max(sm_count, 1)) ? 2 : 1;
}

int gemv_batch_tile(int64_t n) {
  if (n > 4) return 8;
  if (n > 2) return 4;
  return n == 2 ? 2 : 1;
}

SplitPlan plan_decode_splits(int64_t capacity_tokens, int32_t n_seqs, int32_t n_kv_heads, int sm_count) {
  SplitPlan p;
  capacity_tokens = std::max<int64_t>(capacity_tokens, 1);
  const int64_t base_blocks = std::max<int64_t>(int64_t(n_seqs) * n_kv_heads, 1);
  const int64_t target_blocks = 2 * int64_t(std::max(sm_count, 1));
  // Splits wanted for enough blocks; each split keeps at least 4 tiles of
  // keys so the partial-merge overhead stays small against the key reads.
  const int64_t want = std::max<int64_t>(1, (target_blocks + base_blocks - 1) / base_blocks);
  constexpr int64_t kMinSplitTokens = 4 * kAttnTile;
  int64_t split = (capacity_tokens + want - 1) / want;
  split = std::max(split, kMinSplitTokens);
  split = (split + kAttnTile - 1) / kAttnTile * kAttnTile;
  // Bound the partial buffer: at most 64 splits per sequence.
  const int64_t max_splits = 64;
  if ((capacity_tokens + split - 1) / split > max_splits)
    split = ((capacity_tokens + max_splits - 1) / max_splits + kAttnTile - 1) / kAttnTile * kAttnTile;
  p.split_tokens = int32_t(split);
  p.n_splits = int32_t((capacity_tokens + split - 1) / split);
  return p;
}

int32_t prefill_rows_per_block(int32_t group, int32_t head_dim) {
  if (group <= 0 || head_dim <= 0 || head_dim > kAttnMaxHeadDim) return 0;
  const int64_t per_row = int64_t(group) * head_dim;
  const int64_t by_acc = int64_t(kAttnThreads) * kAttnMaxAcc / per_row;
  const int64_t by_queries = kAttnMaxQueries / group;
  return int32_t(std::max<int64_t>(0, std::min(by_acc, by_queries)));
}

AttnSmem attention_smem(int32_t n_queries, int32_t head_dim) {
  AttnSmem s;
  s.k_stride = head_dim + 1;
  int32_t off = 0;
  s.q = off;
  off += n_queries * head_dim;
  s.k = off;
  off += kAttnTile * s.k_stride;
  s.v = off;
  off += kAttnTile * head_dim;
  s.p = off;
  off += n_queries * kAttnTile;
  s.m = off;
  off += n_queries;
  s.l = off;
  off += n_queries;
  s.alpha = off;
  off += n_queries;
  s.total = off;
  return s;
}

int32_t table_bucket(int64_t pages_needed) {
  int64_t b = 16;
  while (b < pages_needed) b *= 2;
  return int32_t(std::min<int64_t>(b, int64_t(1) << 30));
}

// ---------------------------------------------------------------- PageAllocator

PageAllocator::PageAllocator(size_t page_bytes, uint64_t budget_bytes, int32_t pages_per_chunk)
    : page_bytes_(page_bytes), per_chunk_(std::max(pages_per_chunk, 1)) {
  LLM_CHECK(page_bytes > 0, LLM_ERR_INTERNAL, "KV page of 0 bytes");
  const uint64_t n = budget_bytes / page_bytes;
  max_pages_ = int32_t(std::min<uint64_t>(n, uint64_t(INT32_MAX / 2)));
}

int32_t PageAllocator::chunk_pages(int32_t c) const {
  const int64_t first = int64_t(c) * per_chunk_;
  if (first >= max_pages_) return 0;
  return int32_t(std::min<int64_t>(per_chunk_, max_pages_ - first));
}

int32_t PageAllocator::chunks_needed_for(size_t n) const {
  const size_t reuse = std::min(n, free_.size());
  const int64_t fresh = int64_t(n - reuse);
  const int64_t hw = int64_t(refs_.size()) + fresh;
  return int32_t((hw + per_chunk_ - 1) / per_chunk_);
}

bool PageAllocator::acquire(size_t n, std::vector<int32_t>& out) {
  if (n == 0) return true;
  if (int64_t(in_use_) + int64_t(n) > int64_t(max_pages_)) return false;
  out.reserve(out.size() + n);
  refs_.reserve(refs_.size() + n);
  for (size_t i = 0; i < n; ++i) {
    int32_t id;
    if (!free_.empty()) {
      std::pop_heap(free_.begin(), free_.end(), std::greater<int32_t>());
      id = free_.back();
      free_.pop_back();
    } else {
      id = int32_t(refs_.size());
      refs_.push_back(0);
    }
    refs_[size_t(id)] = 1;
    out.push_back(id);
  }
  in_use_ += int32_t(n);
  return true;
}

void PageAllocator::retain(int32_t id) {
  LLM_CHECK(id >= 0 && size_t(id) < refs_.size() && refs_[size_t(id)] > 0, LLM_ERR_INTERNAL,
            "retain of free KV page %d", id);
  ++refs_[size_t(id)];
}

void PageAllocator::release(int32_t id) {
  LLM_CHECK(id >= 0 && size_t(id) < refs_.size() && refs_[size_t(id)] > 0, LLM_ERR_INTERNAL,
            "release of free KV page %d", id);
  if (--refs_[size_t(id)] > 0) return;
  --in_use_;
  free_.push_back(id);
  std::push_heap(free_.begin(), free_.end(), std::greater<int32_t>());
}

// ---------------------------------------------------------------- PageList

bool PageList::prepare_write(PageAllocator& a, int32_t page_tokens, uint32_t from, uint32_t to,
                             std::vector<PageCopy>& copies, size_t* appended) {
  if (appended) *appended = 0;
  if (to <= from) return true;
  const size_t pt = size_t(page_tokens);
  const size_t need = (size_t(to) + pt - 1) / pt;
  const size_t first = size_t(from) / pt;
  const size_t n_new = need > ids_.size() ? need - ids_.size() : 0;
  // Shared pages in the range that already exist.
  size_t n_cow = 0;
  for (size_t i = first; i < std::min(need, ids_.size()); ++i)
    if (a.refs(ids_[i]) > 1) ++n_cow;
  std::vector<int32_t> fresh;
  if (!a.acquire(n_new + n_cow, fresh)) return false;
  size_t f = 0;
  for (size_t i = first; i < std::min(need, ids_.size()); ++i) {
    if (a.refs(ids_[i]) <= 1) continue;
    copies.push_back(PageCopy{ids_[i], fresh[f]});
    a.release(ids_[i]);  // drops our share; the other holders keep it
    ids_[i] = fresh[f++];
  }
  ids_.insert(ids_.end(), fresh.begin() + std::ptrdiff_t(f), fresh.end());
  if (appended) *appended = n_new;
  return true;
}

size_t PageList::pages_needed(const PageAllocator& a, int32_t page_tokens, uint32_t from, uint32_t to) const {
  if (to <= from) return 0;
  const size_t pt = size_t(page_tokens);
  const size_t need = (size_t(to) + pt - 1) / pt;
  size_t n = need > ids_.size() ? need - ids_.size() : 0;
  for (size_t i = size_t(from) / pt; i < std::min(need, ids_.size()); ++i)
    if (a.refs(ids_[i]) > 1) ++n;
  return n;
}

void PageList::shrink_to(PageAllocator& a, size_t n) {
  while (ids_.size() > n) {
    a.release(ids_.back());
    ids_.pop_back();
  }
}

PageList PageList::share(PageAllocator& a) const {
  PageList r;
  for (int32_t id : ids_) a.retain(id);
  r.ids_ = ids_;
  return r;
}

// ---------------------------------------------------------------- TableMirror

void TableMirror::reset(int32_t rows) {
  rows_.assign(size_t(std::max(rows, 0)), {});
  for (auto& r : rows_) r.push_back(-1);  // -1 never equals a page id: first sync uploads the whole row
}

size_t TableMirror::sync_row(int32_t r, const std::vector<int32_t>& ids) {
  LLM_CHECK(r >= 0 && size_t(r) < rows_.size(), LLM_ERR_INTERNAL, "page table row %d out of range", r);
  std::vector<int32_t>& have = rows_[size_t(r)];
  size_t first = 0;
  while (first < ids.size() && first < have.size() && have[first] == ids[first]) ++first;
  have = ids;
  return first;
}

// ---------------------------------------------------------------- DecodeGraphs

DecodeGraphs::DecodeGraphs(size_t max_graphs, int capture_after)
    : max_graphs_(std::max<size_t>(max_graphs, 1)), capture_after_(std::max(capture_after, 1)) {}

DecodeGraphs::Decision DecodeGraphs::lookup(const GraphKey& key) {
  Decision d;
  if (!enabled_) return d;
  ++clock_;
  for (size_t s = 0; s < entries_.size(); ++s) {
    Entry& e = entries_[s];
    if (!(e.key == key)) continue;
    e.last_use = clock_;
    if (e.ready) {
      d.action = Action::Replay;
      d.slot = int(s);
      return d;
    }
    if (++e.uses < capture_after_) return d;  // still eager
    d.action = Action::Capture;
    d.slot = int(s);
    return d;
  }
  // A new key: take a free slot or the least recently used one.
  size_t slot = entries_.size();
  if (entries_.size() >= max_graphs_) {
    slot = 0;
    for (size_t s = 1; s < entries_.size(); ++s)
      if (entries_[s].last_use < entries_[slot].last_use) slot = s;
    if (entries_[slot].ready) d.destroy_slot = int(slot);
  } else {
    entries_.emplace_back();
  }
  Entry& e = entries_[slot];
  e.key = key;
  e.uses = 1;
  e.ready = false;
  e.last_use = clock_;
  if (e.uses >= capture_after_) {
    d.action = Action::Capture;
    d.slot = int(slot);
  } else if (d.destroy_slot >= 0) {
    // The evicted graph must go even though this step runs eagerly.
    d.slot = -1;
  }
  return d;
}

void DecodeGraphs::captured(int slot) {
  if (slot >= 0 && size_t(slot) < entries_.size()) entries_[size_t(slot)].ready = true;
}

void DecodeGraphs::capture_failed() { enabled_ = false; }

std::vector<int> DecodeGraphs::invalidate_all() {
  std::vector<int> out;
  for (size_t s = 0; s < entries_.size(); ++s)
    if (entries_[s].ready) out.push_back(int(s));
  entries_.clear();
  return out;
}

size_t DecodeGraphs::n_ready() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.ready ? 1 : 0;
  return n;
}

}  // namespace llm::cuda
