#include "backend/cpu/forward.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace llm::cpu {

void ForwardScratch::ensure(const Model& m, int64_t n) {
  if (n <= rows) return;
  const ModelConfig& c = m.config();
  const size_t q_dim = size_t(c.n_heads) * size_t(c.head_dim), kv_dim = size_t(c.n_kv_heads) * size_t(c.head_dim);
  x.resize(size_t(n) * size_t(c.dim));
  xb.resize(size_t(n) * std::max(size_t(c.dim), q_dim));
  q.resize(size_t(n) * q_dim);
  k.resize(size_t(n) * kv_dim);
  v.resize(size_t(n) * kv_dim);
  att.resize(size_t(n) * q_dim);
  hb.resize(size_t(n) * size_t(c.hidden_dim));
  hb2.resize(size_t(n) * size_t(c.hidden_dim));
  pos.resize(size_t(n));
  rows = n;
}

static Rope rope_of(const Model& m, const LayerWeights& w) {
  const ModelConfig& c = m.config();
  return Rope{int32_t(c.spec.rope_kind), c.head_dim, c.spec.rope_dims, w.inv_freq, c.spec.rope_mscale};
}

void rerotate_key(const Model& m, int32_t layer, float* key, int64_t delta) {
  Rope r = rope_of(m, m.layers()[size_t(layer)]);
  r.mscale = 1.0f;  // the key holds its magnitude factor already: a pure rotation
  rope_head(key, r, delta);
}

namespace {

// The one pass behind forward() and forward_batch(): the rows of sequence k
// are rows [row0[k], row0[k] + seqs[k].n) of every activation matrix.
void run_pass(const Model& m, const ForwardArgs* seqs, size_t n_seqs, ForwardScratch& s) {
  const ModelConfig& c = m.config();
  const BlockSpec& spec = c.spec;
  const kv::Geometry* geoms[2] = {&m.kv_pool().geometry(),
                                  m.kv_pool_local() ? &m.kv_pool_local()->geometry() : nullptr};
  ThreadPool* pool = m.pool();
  const MatmulMode mode = m.matmul_mode();
  int64_t n = 0;
  for (size_t k = 0; k < n_seqs; ++k) {
    LLM_CHECK(seqs[k].n > 0 && seqs[k].tokens != nullptr && seqs[k].logits != nullptr, LLM_ERR_INVALID_ARGUMENT,
              "forward: sequence %zu has no tokens", k);
    n += seqs[k].n;
  }
  const int64_t dim = c.dim, hd = c.head_dim, hidden = c.hidden_dim;
  const int64_t q_dim = int64_t(c.n_heads) * hd, kv_dim = int64_t(c.n_kv_heads) * hd;
  s.ensure(m, n);
  s.seq_of.resize(size_t(n));
  s.row0.resize(n_seqs);
  float* x = s.x.data();    // [n, dim] residual stream
  float* xb = s.xb.data();  // [n, dim] block input / output
  // The element-wise steps between the matmuls, split by rows over the pool
  // in prefill (serial, they held the other threads idle for ~3% of an f16
  // pp512). Every row is computed by the same code whatever the split, so
  // results do not depend on the thread count.
  auto for_rows = [&](int64_t rows, auto&& fn) {
    if (pool != nullptr && pool->size() > 1 && rows >= 2 * pool->size()) {
      pool->parallel([&](int ith, int nth) {
        int64_t r0, r1;
        ThreadPool::split(rows, ith, nth, &r0, &r1);
        if (r0 < r1) fn(r0, r1);
      });
    } else {
      fn(0, rows);
    }
  };
  for (size_t k = 0, i = 0; k < n_seqs; ++k) {
    s.row0[k] = int64_t(i);
    for (int64_t j = 0; j < seqs[k].n; ++j, ++i) {
      dequantize_row(m.tok_embd(), seqs[k].tokens[j], x + int64_t(i) * dim);
      if (spec.embed_scale != 1.0f)
        for (int64_t e = 0; e < dim; ++e) x[int64_t(i) * dim + e] *= spec.embed_scale;
      s.pos[i] = int32_t(seqs[k].p0 + uint32_t(j));
      s.seq_of[i] = int32_t(k);
    }
  }
  // Threads take whole one-row sequences in attention when there are enough
  // of them (batched decode: one query row each, too little work to split by
  // head); longer sequences (prompt chunks in the batch) use the whole pool.
  const int nth = pool != nullptr ? pool->size() : 1;
  std::vector<size_t>& single = s.single_row_seqs;
  single.clear();
  for (size_t k = 0; k < n_seqs; ++k)
    if (seqs[k].n == 1) single.push_back(k);
  const bool att_by_seq = n_seqs > 1 && nth > 1 && single.size() >= size_t(nth);
  if (att_by_seq && s.att_seq.size() < size_t(nth)) s.att_seq.resize(size_t(nth));

  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (size_t k = 0; k < n_seqs; ++k)
      if (seqs[k].cancel && seqs[k].cancel()) fail(LLM_ERR_CANCELLED, "prefill cancelled");
    const LayerWeights& w = m.layers()[size_t(l)];
    const Rope rope = rope_of(m, w);
    const kv::Geometry& g = *geoms[w.kv_group];
    // --- attention
    for_rows(n, [&](int64_t r0, int64_t r1) {
      if (l > 0) {  // the previous layer's feed-forward residual, fused with this norm
        const LayerWeights& prev = m.layers()[size_t(l - 1)];
        if (prev.post_ffn_norm) rmsnorm(xb + r0 * dim, xb + r0 * dim, prev.post_ffn_norm, r1 - r0, dim, c.norm_eps);
        for (int64_t i = r0 * dim; i < r1 * dim; ++i) x[i] += xb[i];
      }
      rmsnorm(xb + r0 * dim, x + r0 * dim, w.attn_norm, r1 - r0, dim, c.norm_eps);
    });
    {  // q: [n, q_dim], k and v: [n, kv_dim]
      const WeightView qkv[3] = {w.wq, w.wk, w.wv};
      float* const out[3] = {s.q.data(), s.k.data(), s.v.data()};
      matmul_many(qkv, out, 3, xb, n, pool, mode);
    }
    for_rows(n, [&](int64_t r0, int64_t r1) {
      float* q = s.q.data() + r0 * q_dim;
      float* k = s.k.data() + r0 * kv_dim;
      float* v = s.v.data() + r0 * kv_dim;
      if (w.bq) add_bias(q, w.bq, r1 - r0, q_dim);
      if (w.bk) add_bias(k, w.bk, r1 - r0, kv_dim);
      if (w.bv) add_bias(v, w.bv, r1 - r0, kv_dim);
      if (w.q_norm) rmsnorm(q, q, w.q_norm, (r1 - r0) * c.n_heads, hd, c.norm_eps);  // per head
      if (w.k_norm) rmsnorm(k, k, w.k_norm, (r1 - r0) * c.n_kv_heads, hd, c.norm_eps);
      cpu::rope(q, r1 - r0, c.n_heads, rope, s.pos.data() + r0);
      cpu::rope(k, r1 - r0, c.n_kv_heads, rope, s.pos.data() + r0);
      for (int64_t i = r0; i < r1; ++i) {  // each row its own slot: no two threads write the same bytes
        const uint32_t p = uint32_t(s.pos[size_t(i)]);
        kv::Page* page = seqs[s.seq_of[size_t(i)]].pages[w.kv_group][p / uint32_t(g.page_tokens)];
        const int32_t slot = int32_t(p % uint32_t(g.page_tokens));
        for (int32_t h = 0; h < c.n_kv_heads; ++h) {
          kv::store_row(g, page, w.kv_layer, 0, h, slot, s.k.data() + i * kv_dim + h * hd);
          kv::store_row(g, page, w.kv_layer, 1, h, slot, s.v.data() + i * kv_dim + h * hd);
        }
      }
    });
    auto att_args = [&](size_t k) {
      const ForwardArgs& sq = seqs[k];
      AttentionArgs a;
      a.geom = &g;
      a.pages = sq.pages[w.kv_group];
      a.layer = w.kv_layer;
      a.first = sq.first_slot[w.kv_group];
      a.n_heads = c.n_heads;
      a.q = s.q.data() + s.row0[k] * q_dim;
      a.n = sq.n;
      a.p0 = sq.p0;
      a.out = s.att.data() + s.row0[k] * q_dim;
      a.window = w.window;
      a.scale = spec.attn_scale;
      a.softcap = spec.attn_softcap;
      return a;
    };
    if (att_by_seq) {
      // Each (row, KV head) is computed by the same code on any thread, so
      // this split gives the bits attention() over the pool gives.
      pool->parallel([&](int ith, int nth_run) {
        int64_t k0, k1;
        ThreadPool::split(int64_t(single.size()), ith, nth_run, &k0, &k1);
        for (int64_t k = k0; k < k1; ++k) attention(att_args(single[size_t(k)]), s.att_seq[size_t(ith)], nullptr);
      });
      for (size_t k = 0; k < n_seqs; ++k)
        if (seqs[k].n > 1) attention(att_args(k), s.att_rows, pool);
    } else {
      for (size_t k = 0; k < n_seqs; ++k) attention(att_args(k), s.att_rows, pool);
    }
    matmul(w.wo, s.att.data(), n, xb, pool, mode);
    // --- feed-forward (gated)
    for_rows(n, [&](int64_t r0, int64_t r1) {
      float* o = xb + r0 * dim;
      if (w.bo) add_bias(o, w.bo, r1 - r0, dim);
      if (w.post_attn_norm) rmsnorm(o, o, w.post_attn_norm, r1 - r0, dim, c.norm_eps);
      for (int64_t i = r0 * dim; i < r1 * dim; ++i) x[i] += xb[i];
      rmsnorm(o, x + r0 * dim, w.ffn_norm, r1 - r0, dim, c.norm_eps);
    });
    {
      const WeightView gate_up[2] = {w.w_gate, w.w_up};
      float* const out[2] = {s.hb.data(), s.hb2.data()};
      matmul_many(gate_up, out, 2, xb, n, pool, mode);
    }
    for_rows(n, [&](int64_t r0, int64_t r1) {
      float* a0 = s.hb.data() + r0 * hidden;
      const float* b0 = s.hb2.data() + r0 * hidden;
      if (spec.act == Activation::GeluTanh)
        gelu_tanh_mul(a0, b0, (r1 - r0) * hidden);
      else
        silu_mul(a0, b0, (r1 - r0) * hidden);
    });
    matmul(w.w_down, s.hb.data(), n, xb, pool, mode);
  }
  // Logits of each sequence's last row only, so only those rows take the
  // last layer's feed-forward residual (the others' is fused into a next
  // layer's norm). Row k of xb gets sequence k's final norm: its last row is
  // at k or later, and the rows before k are done with.
  const LayerWeights& last_layer = m.layers().back();
  for (size_t k = 0; k < n_seqs; ++k) {
    const int64_t r = s.row0[k] + seqs[k].n - 1;
    float* last = x + r * dim;
    float* last_out = xb + r * dim;
    if (last_layer.post_ffn_norm) rmsnorm(last_out, last_out, last_layer.post_ffn_norm, 1, dim, c.norm_eps);
    for (int64_t i = 0; i < dim; ++i) last[i] += last_out[i];
    rmsnorm(xb + int64_t(k) * dim, last, m.output_norm(), 1, dim, c.norm_eps);
  }
  const size_t vocab = size_t(c.vocab_size);
  float* logits = seqs[0].logits;  // [n_seqs, vocab]
  if (n_seqs > 1) {
    if (s.logits.size() < n_seqs * vocab) s.logits.resize(n_seqs * vocab);
    logits = s.logits.data();
  }
  matmul(m.output(), xb, int64_t(n_seqs), logits, pool, mode);
  for (size_t k = 0; k < n_seqs; ++k) {
    float* out = seqs[k].logits;
    if (n_seqs > 1) std::memcpy(out, logits + k * vocab, vocab * sizeof(float));
    if (spec.final_softcap > 0) softcap(out, c.vocab_size, spec.final_softcap);
  }
}

}  // namespace

void forward(const Model& m, const ForwardArgs& args, ForwardScratch& s) { run_pass(m, &args, 1, s); }

void forward_batch(const Model& m, const ForwardArgs* seqs, size_t n_seqs, ForwardScratch& s) {
  if (n_seqs == 0) return;
  LLM_CHECK(seqs != nullptr, LLM_ERR_INVALID_ARGUMENT, "forward_batch: no sequences");
  run_pass(m, seqs, n_seqs, s);
}

}  // namespace llm::cpu
