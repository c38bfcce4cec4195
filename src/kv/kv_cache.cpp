#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/alloc.h"
#include "core/error.h"
#include "core/half.h"

namespace llm::kv {

size_t row_bytes(llm_kv_type t, int32_t head_dim) {
  switch (t) {
    case LLM_KV_F32: return size_t(head_dim) * 4;
    case LLM_KV_F16: return size_t(head_dim) * 2;
    case LLM_KV_INT8: return size_t(head_dim);
    case LLM_KV_INT4: return (size_t(head_dim) + 1) / 2;
    default: return 0;
  }
}

size_t page_bytes(const Geometry& g, llm_kv_type t) {
  const size_t rows = size_t(g.n_layers) * 2 * size_t(g.n_kv_heads) * size_t(g.page_tokens);
  size_t bytes = rows * row_bytes(t, g.head_dim);
  if (has_scales(t)) bytes += rows * 2 * sizeof(float);
  return bytes;
}

PagePool::PagePool(const Geometry& g, uint64_t budget_bytes)
    : g_(g), budget_(std::make_shared<Budget>(budget_bytes)) {}

PagePool::PagePool(const Geometry& g, std::shared_ptr<Budget> budget) : g_(g), budget_(std::move(budget)) {}

PagePool::~PagePool() {
  for (Page* p : all_) {
    free_bytes(p->data);
    delete p;
  }
}

uint64_t PagePool::bytes_in_use() const {
  std::lock_guard<std::mutex> lk(mu_);
  return in_use_;
}

bool PagePool::acquire(llm_kv_type t, size_t n, std::vector<Page*>& out) {
  if (n == 0) return true;
  const size_t pb = kv::page_bytes(g_, t);
  std::lock_guard<std::mutex> lk(mu_);
  {
    std::lock_guard<std::mutex> bl(budget_->mu);  // order: pool, then budget
    if (budget_->in_use + uint64_t(pb) * n > budget_->limit) return false;
    budget_->in_use += uint64_t(pb) * n;
  }
  size_t taken = 0;
  try {
    auto& fl = free_[int(t)];
    out.reserve(out.size() + n);
    all_.reserve(all_.size() + n);
    for (; taken < n; ++taken) {
      Page* p;
      if (!fl.empty()) {
        p = fl.back();
        fl.pop_back();
      } else {
        std::unique_ptr<Page> np(new Page());
        np->data = static_cast<uint8_t*>(alloc_bytes(pb));  // may throw OOM
        np->type = t;
        p = np.release();
        all_.push_back(p);  // cannot throw: reserved above
      }
      p->refs.store(1, std::memory_order_relaxed);
      in_use_ += pb;
      out.push_back(p);
    }
  } catch (...) {  // the pages already in `out` stay counted, as before
    std::lock_guard<std::mutex> bl(budget_->mu);
    budget_->in_use -= uint64_t(pb) * (n - taken);
    throw;
  }
  return true;
}

void PagePool::release(Page* p) {
  if (p->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t pb = kv::page_bytes(g_, p->type);
  in_use_ -= pb;
  {
    std::lock_guard<std::mutex> bl(budget_->mu);
    budget_->in_use -= pb;
  }
  free_[int(p->type)].push_back(p);
}

// Int8 / int4: asymmetric per row (one row = one token's head): value =
// min + step * q with q in [0, 255] / [0, 15], step = (max - min) / qmax;
// int4 packs two per byte (even index in the low nibble).
void store_row(const Geometry& g, Page* p, int32_t layer, int kv, int32_t head, int32_t slot, const float* src) {
  uint8_t* dst = row_ptr(g, p, layer, kv, head, slot);
  const int32_t d = g.head_dim;
  switch (p->type) {
    case LLM_KV_F32: std::memcpy(dst, src, size_t(d) * 4); break;
    case LLM_KV_F16: {
      uint16_t* h = reinterpret_cast<uint16_t*>(dst);
      for (int32_t i = 0; i < d; ++i) h[i] = f32_to_f16(src[i]);
      break;
    }
    case LLM_KV_INT8:
    case LLM_KV_INT4: {
      // Asymmetric per row: the code spans [min, max] (a skewed row keeps
      // more precision than a symmetric [-amax, amax] code).
      float lo = src[0], hi = src[0];
      for (int32_t i = 1; i < d; ++i) {
        lo = std::min(lo, src[i]);
        hi = std::max(hi, src[i]);
      }
      const float qmax = p->type == LLM_KV_INT8 ? 255.f : 15.f;
      const float step = (hi - lo) / qmax;
      const float inv = step > 0.f ? 1.f / step : 0.f;
      float* sc = scale_ptr(g, p, layer, kv, head, slot);
      sc[0] = step;
      sc[1] = lo;
      if (p->type == LLM_KV_INT8) {
        for (int32_t i = 0; i < d; ++i) dst[i] = uint8_t(std::lrintf(std::clamp((src[i] - lo) * inv, 0.f, 255.f)));
      } else {
        std::memset(dst, 0, row_bytes(LLM_KV_INT4, d));
        for (int32_t i = 0; i < d; ++i) {
          const int q = int(std::lrintf(std::clamp((src[i] - lo) * inv, 0.f, 15.f)));
          dst[i / 2] |= uint8_t(q << ((i & 1) * 4));
        }
      }
      break;
    }
    default: break;
  }
}

void load_row(const Geometry& g, const Page* p, int32_t layer, int kv, int32_t head, int32_t slot, float* out) {
  const uint8_t* src = row_ptr(g, p, layer, kv, head, slot);
  const int32_t d = g.head_dim;
  switch (p->type) {
    case LLM_KV_F32: std::memcpy(out, src, size_t(d) * 4); break;
    case LLM_KV_F16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
      for (int32_t i = 0; i < d; ++i) out[i] = f16_to_f32(h[i]);
      break;
    }
    case LLM_KV_INT8: {
      const float* sc = scale_ptr(g, p, layer, kv, head, slot);
      for (int32_t i = 0; i < d; ++i) out[i] = sc[1] + sc[0] * float(src[i]);
      break;
    }
    case LLM_KV_INT4: {
      const float* sc = scale_ptr(g, p, layer, kv, head, slot);
      for (int32_t i = 0; i < d; ++i) out[i] = sc[1] + sc[0] * float((src[i / 2] >> ((i & 1) * 4)) & 15);
      break;
    }
    default: break;
  }
}

}  // namespace llm::kv
