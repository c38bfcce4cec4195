// CPU element-wise and attention ops of the Llama forward pass. Each has a
// plain definition here; the attention reads K/V through the page table.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace llm {
class ThreadPool;
}

namespace llm::cpu {

// y[r, :] = x[r, :] * w / sqrt(mean(x[r, :]^2) + eps); x, y: [rows, dim]; y may alias x.
void rmsnorm(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps);

// RoPE of one layer. Pair j (j < rope_dims / 2) of a head is
//   Interleaved: dimensions (2j, 2j + 1);  NeoX: (j, j + rope_dims / 2)
// rotated by the angle pos * inv_freq[j]; dimensions from rope_dims on pass
// through unchanged (partial rotary).
struct Rope {
  int32_t kind = 0;        // RopeKind: 0 interleaved, 1 NeoX
  int32_t head_dim = 0;
  int32_t rope_dims = 0;   // <= head_dim, even
  const float* inv_freq = nullptr;  // [rope_dims / 2]
  // The rotated dimensions are also multiplied by this (YaRN's and LongRoPE's
  // attention factor; the pass-through ones are not).
  float mscale = 1.0f;
};

// Rotates every head of x[n, n_heads * head_dim]; row i is at position pos[i].
void rope(float* x, int64_t n, int32_t n_heads, const Rope& r, const int32_t* pos);
// The same rotation of one head vector by an arbitrary (possibly negative) position delta.
void rope_head(float* x, const Rope& r, int64_t pos);

// The Llama-2 rotation: interleaved, every dimension, inv_freq[j] = theta^(-2j / head_dim).
void rope(float* x, int64_t n, int32_t n_heads, int32_t head_dim, const int32_t* pos, float theta);
void rope_head(float* x, int32_t head_dim, int64_t pos, float theta);

// a[i] = silu(a[i]) * b[i], with core/silu.h's exponential (the same bits on
// every path: scalar, AVX2, CUDA).
void silu_mul(float* a, const float* b, int64_t n);
namespace avx2 {
void silu_mul(float* a, const float* b, int64_t n);  // elementwise_avx2.cpp; only when use_avx2_kernels()
}
// a[i] = gelu_tanh(a[i]) * b[i], gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
// evaluated through fp16 as ggml does (see ops.cpp)
void gelu_tanh_mul(float* a, const float* b, int64_t n);
// x[i] = cap * tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap);
// y[r, :] += b for each of the rows
void add_bias(float* y, const float* b, int64_t rows, int64_t dim);

// In-place softmax of x[n].
void softmax(float* x, int64_t n);

struct AttentionArgs {
  const kv::Geometry* geom = nullptr;
  const kv::Page* const* pages = nullptr;  // the session's page table
  int32_t layer = 0;
  int32_t n_heads = 0;   // query heads; GQA: query head h reads KV head h / (n_heads / n_kv_heads)
  const float* q = nullptr;  // [n, n_heads * head_dim]
  int64_t n = 0;             // query rows
  int64_t p0 = 0;            // position of query row 0; row i attends to cache slots [0, p0 + i]
  float* out = nullptr;      // [n, n_heads * head_dim]
  int32_t window = 0;        // > 0: row i attends to slots [p0 + i - window + 1, p0 + i] only
  int64_t first = 0;         // slots before this one are not held: never attended
  float scale = 0.0f;        // q.k scale (0 = 1 / sqrt(head_dim))
  float softcap = 0.0f;      // > 0: score = softcap * tanh(score / softcap)
};

// Causal multi-head attention over the paged cache.
// scratch: per-thread workspace, resized as needed (one vector per pool thread).
void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool);

}  // namespace llm::cpu
