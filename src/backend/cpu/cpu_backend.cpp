#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/forward.h"
#include "core/error.h"
#include "model/model.h"

namespace llm::cpu {

namespace {

// Prompts longer than this run in chunks (the session splits them),
// bounding scratch memory.
constexpr size_t kMaxRows = 512;
// Sequences per batched pass: beyond this the weights are read once per
// many tokens already and the activations outgrow the caches.
constexpr size_t kMaxSeqs = 64;

struct CpuSequence final : KvSequence {
  CpuSequence(const Model& m, llm_kv_type t) : model(m), type(t) {}
  ~CpuSequence() override { release_all(); }

  uint32_t length() const override { return len; }
  llm_kv_type kv_type() const override { return type; }
  size_t n_pages() const override { return tables[0].size(); }
  size_t n_local_pages() const override {
    size_t n = 0;
    for (const kv::Page* p : tables[1]) n += p != nullptr;
    return n;
  }
  uint32_t local_first() const override { return first_local; }
  uint64_t kv_bytes() const override {
    uint64_t b = 0;
    for (int t = 0; t < n_tables(); ++t)
      for (const kv::Page* p : tables[t])
        if (p) b += pool(t).page_bytes(p->type);
    return b;
  }

  kv::PagePool& pool(int t) const { return t == 0 ? model.kv_pool() : *model.kv_pool_local(); }
  int n_tables() const { return model.kv_pool_local() ? 2 : 1; }
  uint32_t page_tokens() const { return uint32_t(model.kv_pool().geometry().page_tokens); }

  void release_all() {
    for (int t = 0; t < n_tables(); ++t) {
      for (kv::Page* p : tables[t])
        if (p) pool(t).release(p);
      tables[t].clear();
    }
    first_local = 0;
  }

  // Ensures page i of table t exists (a fresh one where the window had let
  // it go) and is private to this sequence.
  void make_private(int t, size_t i) {
    std::vector<kv::Page*>& pages = tables[t];
    kv::PagePool& pl = pool(t);
    kv::Page* p = pages[i];
    if (p && p->refs.load(std::memory_order_acquire) == 1) return;
    std::vector<kv::Page*> fresh;
    LLM_CHECK(pl.acquire(type, 1, fresh), LLM_ERR_CONTEXT_FULL, "KV page pool is full (%s)",
              p ? "copy-on-write" : "window page");
    if (p) {
      std::memcpy(fresh[0]->data, p->data, pl.page_bytes(p->type));
      pl.release(p);
    }
    pages[i] = fresh[0];
  }

  // Ensures the pages covering slots [from, to) exist and are private.
  void reserve_slots(uint32_t from, uint32_t to) {
    const uint32_t pt = page_tokens();
    const size_t need = (size_t(to) + pt - 1) / pt;
    for (int t = 0; t < n_tables(); ++t) {
      std::vector<kv::Page*>& pages = tables[t];
      if (need > pages.size()) {
        std::vector<kv::Page*> fresh;
        const kv::PagePool* local = model.kv_pool_local();
        LLM_CHECK(pool(t).acquire(type, need - pages.size(), fresh), LLM_ERR_CONTEXT_FULL,
                  "KV page pool is full (%llu of %llu bytes in use)",
                  (unsigned long long)(model.kv_pool().bytes_in_use() + (local ? local->bytes_in_use() : 0)),
                  (unsigned long long)model.kv_pool().budget_bytes());
        pages.insert(pages.end(), fresh.begin(), fresh.end());
      }
      for (size_t i = from / pt; i < need && i < pages.size(); ++i) make_private(t, i);
    }
  }

  // Drops pages past len and, in table 1, pages wholly before first_local.
  void shrink_pages() {
    const uint32_t pt = page_tokens();
    const size_t need = (size_t(len) + pt - 1) / pt;
    for (int t = 0; t < n_tables(); ++t) {
      std::vector<kv::Page*>& pages = tables[t];
      while (pages.size() > need) {
        if (pages.back()) pool(t).release(pages.back());
        pages.pop_back();
      }
    }
    if (n_tables() == 1) return;
    // The windowed layers keep the last W + 1 slots: the next query reads W of
    // them, and re-running the last token (logits after an eviction) one more.
    const uint32_t w = model.kv_local_window();
    if (len > w) first_local = std::max(first_local, len - w);
    first_local = std::min(first_local, len);
    // Back at (or before) a hold's length: the held rows are the window again.
    if (held && len <= hold_to) first_local = std::min(first_local, hold_from);
    std::vector<kv::Page*>& lp = tables[1];
    for (size_t i = 0; i < lp.size() && (i + 1) * pt <= first_local; ++i) {
      if (held && i * pt < hold_to && (i + 1) * pt > hold_from) continue;
      if (lp[i]) pool(1).release(lp[i]);
      lp[i] = nullptr;
    }
  }

  ForwardArgs args(const int32_t* toks, size_t n, float* logits) {
    ForwardArgs a;
    a.tokens = toks;
    a.n = int64_t(n);
    a.p0 = len;
    a.pages[0] = tables[0].data();
    a.pages[1] = tables[1].data();
    a.first_slot[1] = first_local;
    a.logits = logits;
    return a;
  }

  const Model& model;
  const llm_kv_type type;
  std::vector<kv::Page*> tables[2];
  uint32_t first_local = 0;  // the windowed layers hold slots [first_local, len)
  uint32_t len = 0;
  // Backend::hold(): the windowed layers' pages over [hold_from, hold_to) stay.
  bool held = false;
  uint32_t hold_from = 0, hold_to = 0;
  ForwardScratch scratch;  // grown on demand, never per token
};

CpuSequence& cpu_seq(KvSequence& s) { return static_cast<CpuSequence&>(s); }
const CpuSequence& cpu_seq(const KvSequence& s) { return static_cast<const CpuSequence&>(s); }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const Model& m) : m_(m) {}

  std::unique_ptr<KvSequence> new_sequence(llm_kv_type t) override { return std::make_unique<CpuSequence>(m_, t); }

  std::unique_ptr<KvSequence> fork(const KvSequence& src) override {
    const CpuSequence& a = cpu_seq(src);
    auto f = std::make_unique<CpuSequence>(m_, a.type);
    for (int t = 0; t < 2; ++t) {
      for (kv::Page* p : a.tables[t])
        if (p) kv::PagePool::retain(p);
      f->tables[t] = a.tables[t];
    }
    f->first_local = a.first_local;
    f->len = a.len;
    return f;
  }

  void forward(KvSequence& seq, const int32_t* toks, size_t n, float* logits,
               const std::function<bool()>& cancel) override {
    CpuSequence& s = cpu_seq(seq);
    LLM_CHECK(n > 0 && n <= kMaxRows, LLM_ERR_INVALID_ARGUMENT, "forward: %zu rows (1..%zu)", n, kMaxRows);
    try {
      s.reserve_slots(s.len, s.len + uint32_t(n));
      ForwardArgs a = s.args(toks, n, logits);
      a.cancel = cancel;
      cpu::forward(m_, a, s.scratch);
    } catch (...) {
      s.shrink_pages();  // pages taken for this pass go back
      throw;
    }
    s.len += uint32_t(n);
    s.shrink_pages();  // the windowed layers' pages that every window has left
  }

  size_t forward_batch(const SequenceRows* rows, size_t n) override {
    // Pages are reserved in order; the first sequence that cannot get its
    // pages ends the batch (it then fails or succeeds alone).
    size_t k = 0, total = 0;
    for (; k < n && k < kMaxSeqs && total + rows[k].n <= kMaxRows; ++k) {
      CpuSequence& s = cpu_seq(*rows[k].seq);
      try {
        s.reserve_slots(s.len, s.len + uint32_t(rows[k].n));
      } catch (...) {
        s.shrink_pages();
        break;
      }
      total += rows[k].n;
    }
    if (k == 0) return 0;
    std::vector<ForwardArgs> args(k);
    for (size_t i = 0; i < k; ++i) args[i] = cpu_seq(*rows[i].seq).args(rows[i].tokens, rows[i].n, rows[i].logits);
    try {
      cpu::forward_batch(m_, args.data(), k, cpu_seq(*rows[0].seq).scratch);
    } catch (...) {
      for (size_t i = 0; i < k; ++i) cpu_seq(*rows[i].seq).shrink_pages();
      throw;
    }
    for (size_t i = 0; i < k; ++i) {
      CpuSequence& s = cpu_seq(*rows[i].seq);
      s.len += uint32_t(rows[i].n);
      s.shrink_pages();
    }
    return k;
  }
  size_t max_batch() const override { return kMaxSeqs; }
  size_t max_batch_rows_per_seq() const override { return kMaxRows; }
  size_t max_rows() const override { return kMaxRows; }

  void truncate(KvSequence& seq, uint32_t n) override {
    CpuSequence& s = cpu_seq(seq);
    s.len = std::min(s.len, n);
    s.shrink_pages();
  }

  void hold(KvSequence& seq) override {
    CpuSequence& s = cpu_seq(seq);
    s.held = true;
    s.hold_from = s.first_local;
    s.hold_to = s.len;
  }
  void release_hold(KvSequence& seq) noexcept override {
    CpuSequence& s = cpu_seq(seq);
    if (!s.held) return;
    s.held = false;
    s.shrink_pages();
  }

  // The windowed layers move only the rows they still hold: a row that had
  // left their window before the eviction does not come back after it (their
  // attention reads from local_first on).
  void evict(KvSequence& seq, uint32_t n_keep, uint32_t n_discard) override {
    CpuSequence& s = cpu_seq(seq);
    if (n_discard == 0) return;
    s.held = false;  // rows move: a hold's slots mean nothing after this
    const uint32_t pt = s.page_tokens();
    const uint32_t first_moved = n_keep + n_discard, new_len = s.len - n_discard;
    const uint32_t old_first = s.first_local;
    const uint32_t new_first =
        old_first <= n_keep ? old_first : old_first <= first_moved ? n_keep : old_first - n_discard;
    // Every page that receives a moved row must exist and be private.
    for (int t = 0; t < s.n_tables(); ++t) {
      const uint32_t lo = t == 0 ? n_keep : std::max(n_keep, new_first);
      for (size_t i = lo / pt; i < (size_t(new_len) + pt - 1) / pt; ++i) s.make_private(t, i);
    }
    const ModelConfig& c = m_.config();
    std::vector<float> row(size_t(c.head_dim));
    const size_t rb = kv::row_bytes(s.type, c.head_dim);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const LayerWeights& w = m_.layers()[size_t(l)];
      const int t = w.kv_group;
      const kv::Geometry& g = s.pool(t).geometry();
      const std::vector<kv::Page*>& pages = s.tables[t];
      const int32_t kl = w.kv_layer;
      for (uint32_t src = t == 0 ? first_moved : std::max(first_moved, old_first); src < s.len; ++src) {
        const uint32_t dst = src - n_discard;
        const kv::Page* ps = pages[src / pt];
        kv::Page* pd = pages[dst / pt];
        const int32_t ss = int32_t(src % pt), sd = int32_t(dst % pt);
        for (int32_t h = 0; h < g.n_kv_heads; ++h) {
          kv::load_row(g, ps, kl, 0, h, ss, row.data());
          rerotate_key(m_, l, row.data(), -int64_t(n_discard));
          kv::store_row(g, pd, kl, 0, h, sd, row.data());
          std::memcpy(kv::row_ptr(g, pd, kl, 1, h, sd), kv::row_ptr(g, ps, kl, 1, h, ss), rb);
          if (kv::has_scales(s.type))
            std::memcpy(kv::scale_ptr(g, pd, kl, 1, h, sd), kv::scale_ptr(g, ps, kl, 1, h, ss), 2 * sizeof(float));
        }
      }
    }
    s.len = new_len;
    if (s.n_tables() == 2) s.first_local = new_first;
    s.shrink_pages();
  }

  void kv_row(const KvSequence& seq, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) const override {
    const CpuSequence& s = cpu_seq(seq);
    const LayerWeights& w = m_.layers()[size_t(layer)];
    const int t = w.kv_group;
    LLM_CHECK(t == 0 || slot >= s.first_local, LLM_ERR_INVALID_ARGUMENT,
              "kv_row: slot %u has left the window of layer %d", slot, layer);
    const kv::Geometry& g = s.pool(t).geometry();
    const kv::Page* p = s.tables[t][slot / uint32_t(g.page_tokens)];
    kv::load_row(g, p, w.kv_layer, kv, head, int32_t(slot % uint32_t(g.page_tokens)), out);
  }

  // Slots past the sequence in the last page hold stale bytes (a recycled
  // page once used by another session, rows of a cancelled pass): they are
  // written as zeros, so a snapshot holds nothing but this session's state.
  void save_pages(const KvSequence& seq, std::vector<uint8_t>& out) const override {
    const CpuSequence& s = cpu_seq(seq);
    const uint32_t pt = s.page_tokens();
    // Appends page `index` of a group, zeroing the slots outside [keep_from, len).
    auto put_page = [&](const kv::Geometry& pg, const kv::Page* p, size_t index, uint32_t keep_from) {
      LLM_CHECK(p != nullptr, LLM_ERR_INTERNAL, "KV page %zu, which the sequence holds, is missing", index);
      const size_t at = out.size(), bytes = kv::page_bytes(pg, p->type);
      out.insert(out.end(), p->data, p->data + bytes);
      kv::Page view;  // the copy just written, addressed like a page
      view.data = out.data() + at;
      view.type = p->type;
      const size_t rb = kv::row_bytes(p->type, pg.head_dim);
      for (uint32_t slot = 0; slot < pt; ++slot) {
        const uint64_t pos = uint64_t(index) * pt + slot;
        if (pos >= keep_from && pos < s.len) continue;
        for (int32_t l = 0; l < pg.n_layers; ++l)
          for (int kv = 0; kv < 2; ++kv)
            for (int32_t h = 0; h < pg.n_kv_heads; ++h) {
              std::memset(kv::row_ptr(pg, &view, l, kv, h, int32_t(slot)), 0, rb);
              if (kv::has_scales(p->type))
                std::memset(kv::scale_ptr(pg, &view, l, kv, h, int32_t(slot)), 0, 2 * sizeof(float));
            }
      }
    };
    for (size_t i = 0; i < s.tables[0].size(); ++i) put_page(s.pool(0).geometry(), s.tables[0][i], i, 0);
    if (s.n_tables() == 2) {
      const auto* f = reinterpret_cast<const uint8_t*>(&s.first_local);
      out.insert(out.end(), f, f + sizeof(uint32_t));
      for (size_t i = s.first_local / pt; i < s.tables[1].size(); ++i)
        put_page(s.pool(1).geometry(), s.tables[1][i], i, s.first_local);
    }
  }

  void restore_pages(KvSequence& seq, const uint8_t* data, size_t size, uint32_t n_pages, uint32_t length) override {
    CpuSequence& s = cpu_seq(seq);
    LLM_CHECK(s.len == 0 && s.tables[0].empty(), LLM_ERR_INVALID_ARGUMENT, "restore_pages: the sequence is not empty");
    const uint32_t pt = s.page_tokens();
    const size_t pb = s.pool(0).page_bytes(s.type);
    LLM_CHECK(size >= uint64_t(n_pages) * pb, LLM_ERR_FORMAT, "session snapshot has %zu bytes of KV, expected %llu",
              size, (unsigned long long)(uint64_t(n_pages) * pb));
    const uint8_t* local = data + size_t(n_pages) * pb;
    size_t left = size - size_t(n_pages) * pb;
    uint32_t local_first = 0;
    size_t lpb = 0, n_local = 0;
    if (s.n_tables() == 2) {
      LLM_CHECK(left >= sizeof(uint32_t), LLM_ERR_FORMAT, "session snapshot is truncated");
      std::memcpy(&local_first, local, sizeof(uint32_t));
      local += sizeof(uint32_t);
      left -= sizeof(uint32_t);
      LLM_CHECK(local_first <= length, LLM_ERR_FORMAT, "session snapshot: local_first %u past %u cached tokens",
                local_first, length);
      lpb = s.pool(1).page_bytes(s.type);
      n_local = n_pages - std::min<size_t>(n_pages, local_first / pt);
    }
    LLM_CHECK(left == uint64_t(n_local) * lpb, LLM_ERR_FORMAT,
              "session snapshot has %zu bytes of windowed-layer KV, expected %llu", left,
              (unsigned long long)(uint64_t(n_local) * lpb));
    LLM_CHECK(s.pool(0).acquire(s.type, n_pages, s.tables[0]), LLM_ERR_CONTEXT_FULL,
              "KV page pool is full: cannot restore %u pages", n_pages);
    for (size_t i = 0; i < n_pages; ++i) std::memcpy(s.tables[0][i]->data, data + i * pb, pb);
    if (s.n_tables() == 2) {
      std::vector<kv::Page*> fresh;
      LLM_CHECK(s.pool(1).acquire(s.type, n_local, fresh), LLM_ERR_CONTEXT_FULL,
                "KV page pool is full: cannot restore %zu windowed-layer pages", n_local);
      s.tables[1].assign(n_pages - n_local, nullptr);
      for (size_t i = 0; i < n_local; ++i) {
        std::memcpy(fresh[i]->data, local + i * lpb, lpb);
        s.tables[1].push_back(fresh[i]);
      }
      s.first_local = local_first;
    }
    s.len = length;
  }

 private:
  const Model& m_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(const Model& m) { return std::make_unique<CpuBackend>(m); }

}  // namespace llm::cpu
