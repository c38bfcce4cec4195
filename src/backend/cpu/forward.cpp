#include "backend/cpu/forward.h"

#include <cmath>

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
  return Rope{int32_t(c.spec.rope_kind), c.head_dim, c.spec.rope_dims, w.inv_freq};
}

void rerotate_key(const Model& m, int32_t layer, float* key, int64_t delta) {
  rope_head(key, rope_of(m, m.layers()[size_t(layer)]), delta);
}

void forward(const Model& m, const ForwardArgs& args, ForwardScratch& s) {
  const ModelConfig& c = m.config();
  const BlockSpec& spec = c.spec;
  const kv::Geometry* geoms[2] = {&m.kv_pool().geometry(),
                                  m.kv_pool_local() ? &m.kv_pool_local()->geometry() : nullptr};
  ThreadPool* pool = m.pool();
  const MatmulMode mode = m.matmul_mode();
  const int64_t n = args.n, dim = c.dim, hd = c.head_dim, hidden = c.hidden_dim;
  const int64_t q_dim = int64_t(c.n_heads) * hd, kv_dim = int64_t(c.n_kv_heads) * hd;
  const uint32_t p0 = args.p0;
  s.ensure(m, n);
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
  for (int64_t i = 0; i < n; ++i) {
    dequantize_row(m.tok_embd(), args.tokens[i], x + i * dim);
    if (spec.embed_scale != 1.0f)
      for (int64_t e = 0; e < dim; ++e) x[i * dim + e] *= spec.embed_scale;
    s.pos[size_t(i)] = int32_t(p0 + uint32_t(i));
  }

  for (int32_t l = 0; l < c.n_layers; ++l) {
    if (args.cancel && args.cancel()) fail(LLM_ERR_CANCELLED, "prefill cancelled");
    const LayerWeights& w = m.layers()[size_t(l)];
    const Rope rope = rope_of(m, w);
    const kv::Geometry& g = *geoms[w.kv_group];
    kv::Page* const* pages = args.pages[w.kv_group];
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
        const uint32_t p = p0 + uint32_t(i);
        kv::Page* page = pages[p / uint32_t(g.page_tokens)];
        const int32_t slot = int32_t(p % uint32_t(g.page_tokens));
        for (int32_t h = 0; h < c.n_kv_heads; ++h) {
          kv::store_row(g, page, w.kv_layer, 0, h, slot, s.k.data() + i * kv_dim + h * hd);
          kv::store_row(g, page, w.kv_layer, 1, h, slot, s.v.data() + i * kv_dim + h * hd);
        }
      }
    });
    AttentionArgs a;
    a.geom = &g;
    a.pages = pages;
    a.layer = w.kv_layer;
    a.first = args.first_slot[w.kv_group];
    a.n_heads = c.n_heads;
    a.q = s.q.data();
    a.n = n;
    a.p0 = p0;
    a.out = s.att.data();
    a.window = w.window;
    a.scale = spec.attn_scale;
    a.softcap = spec.attn_softcap;
    attention(a, s.att_rows, pool);
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
  // Logits of the last row only, so only that row takes the last layer's
  // feed-forward residual (the others' is fused into a next layer's norm).
  const LayerWeights& last_layer = m.layers().back();
  float* last = x + (n - 1) * dim;
  float* last_out = xb + (n - 1) * dim;
  if (last_layer.post_ffn_norm) rmsnorm(last_out, last_out, last_layer.post_ffn_norm, 1, dim, c.norm_eps);
  for (int64_t i = 0; i < dim; ++i) last[i] += last_out[i];
  rmsnorm(xb, last, m.output_norm(), 1, dim, c.norm_eps);
  matmul(m.output(), xb, 1, args.logits, pool, mode);
  if (spec.final_softcap > 0) softcap(args.logits, c.vocab_size, spec.final_softcap);
}

}  // namespace llm::cpu
