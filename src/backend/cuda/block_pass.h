// The order of operations of one CUDA forward pass over a block spec
// (format/family_spec.h), written once over an executor so that the same
// orchestration runs on the device (BackendImpl's executor, whose methods
// launch kernels) and on the host in tests/gpu/block_pass_cpu_test.cpp
// (whose methods are plain loops over kernel_math.h's functions), where
// every model family's logits are compared with the CPU forward's. Plain
// C++: no CUDA types here.
//
// An executor E provides
//   using Layer = ...;   // per layer: the fields block_pass reads below
//   Layer::qkv and Layer::gate_up are what linear_parts() takes, Layer::wo and
//   Layer::down what linear() takes
//   float* x, *xb, *qkv, *att, *gu, *h, *logits;  // activation buffers (rows as below)
//   const float* output_norm; Matrix output;      // the final norm and the LM head
//   void embed(int64_t n, float* x);                   // x[i] = row tokens[i] of the table
//   void scale(float* x, int64_t n, float s);
//   void softcap(float* x, int64_t n, float cap);
//   void rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float* y);
//   void head_rmsnorm(float* x, int64_t ld, int64_t n, int32_t heads, const float* w);
//   void add_bias(float* y, int64_t ld, int64_t n, const float* b, int64_t cols);
//   void linear(const Matrix& w, const float* x, int64_t n, float* y, int64_t ldy, float beta);
//   void linear_parts(const Matrices& parts, const float* x, int64_t n, float* y, int64_t ldy);
//   void rope_store_kv(int32_t layer, const RopeSpec& r, float* qkv, int64_t n);
//   void attention(int32_t layer, const AttnSpec& a, const float* qkv, int64_t n, float* att);
//   void residual(const float* y, const float* bias, const float* w, int64_t rows, float* x);
//   void gated(const float* gu, int64_t n, bool gelu, float* h);
// each of which either completes (in stream order) or throws llm::Error.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "format/model_source.h"

namespace llm::cuda {

// How a layer rotates q and k (kernel_math.h, rope_spec_pair).
struct RopeSpec {
  const float* inv_freq = nullptr;  // [rope_dims / 2]: this layer's frequencies
  int32_t kind = 0;                 // 0 interleaved, 1 NeoX
  int32_t rope_dims = 0;            // rotated dimensions of each head (even, <= head_dim)
  float mscale = 1.f;               // cos and sin are multiplied by this
};

// What a layer's attention does besides the causal softmax.
struct AttnSpec {
  float scale = 1.f;    // of q.k
  float softcap = 0.f;  // > 0: score = softcap * tanh(score / softcap)
  int32_t window = 0;   // > 0: the last `window` positions only
};

// One pass over n rows: the embedding, every layer, then the final norm and
// the LM head of the rows [first_logit_row, first_logit_row + logit_rows)
// into e.logits. `cancel` (may be null or empty) is polled between layers.
template <class E>
void block_pass(E& e, const ModelConfig& c, const std::vector<typename E::Layer>& layers, int64_t n,
                int64_t first_logit_row, int64_t logit_rows, const std::function<bool()>* cancel) {
  const BlockSpec& spec = c.spec;
  const int64_t dim = c.dim, hd = c.head_dim;
  const int64_t q_dim = int64_t(c.n_heads) * hd, kv_dim = int64_t(c.n_kv_heads) * hd, qkv_dim = q_dim + 2 * kv_dim;
  float* const x = e.x;      // [n, dim] residual stream
  float* const xb = e.xb;    // [n, dim] normalised input, or a block output before its residual add
  float* const qkv = e.qkv;  // [n, qkv_dim]: q heads, k heads, v heads
  float* const att = e.att;  // [n, q_dim]
  float* const gu = e.gu;    // [n, 2 hidden]: gate | up
  float* const h = e.h;      // [n, hidden]

  e.embed(n, x);
  if (spec.embed_scale != 1.0f) e.scale(x, n * dim, spec.embed_scale);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    if (cancel && *cancel && (*cancel)()) fail(LLM_ERR_CANCELLED, "prefill cancelled");
    const typename E::Layer& w = layers[size_t(l)];
    // --- attention
    e.rmsnorm(x, w.attn_norm, n, dim, xb);
    e.linear_parts(w.qkv, xb, n, qkv, qkv_dim);
    if (w.qkv_bias) e.add_bias(qkv, qkv_dim, n, w.qkv_bias, qkv_dim);
    if (w.q_norm) e.head_rmsnorm(qkv, qkv_dim, n, c.n_heads, w.q_norm);
    if (w.k_norm) e.head_rmsnorm(qkv + q_dim, qkv_dim, n, c.n_kv_heads, w.k_norm);
    RopeSpec r;
    r.inv_freq = w.inv_freq;
    r.kind = int32_t(spec.rope_kind);
    r.rope_dims = spec.rope_dims > 0 ? spec.rope_dims : c.head_dim;
    r.mscale = spec.rope_mscale;
    e.rope_store_kv(l, r, qkv, n);
    AttnSpec a;
    a.scale = spec.attn_scale > 0 ? spec.attn_scale : 1.0f / std::sqrt(float(c.head_dim));
    a.softcap = spec.attn_softcap;
    a.window = w.window;
    e.attention(l, a, qkv, n, att);
    if (w.bo || w.post_attn_norm) {  // x += post_norm(wo . att + bo)
      e.linear(w.wo, att, n, xb, dim, 0.f);
      e.residual(xb, w.bo, w.post_attn_norm, n, x);
    } else {
      e.linear(w.wo, att, n, x, dim, 1.f);  // x += wo . att
    }
    // --- feed-forward (gated SiLU or GELU)
    e.rmsnorm(x, w.ffn_norm, n, dim, xb);
    e.linear_parts(w.gate_up, xb, n, gu, 2 * int64_t(c.hidden_dim));
    e.gated(gu, n, spec.act == Activation::GeluTanh, h);
    if (w.post_ffn_norm) {  // x += post_norm(w_down . h)
      e.linear(w.down, h, n, xb, dim, 0.f);
      e.residual(xb, nullptr, w.post_ffn_norm, n, x);
    } else {
      e.linear(w.down, h, n, x, dim, 1.f);  // x += w_down . h
    }
  }
  e.rmsnorm(x + first_logit_row * dim, e.output_norm, logit_rows, dim, xb);
  e.linear(e.output, xb, logit_rows, e.logits, c.vocab_size, 0.f);
  if (spec.final_softcap > 0) e.softcap(e.logits, logit_rows * int64_t(c.vocab_size), spec.final_softcap);
}

}  // namespace llm::cuda
