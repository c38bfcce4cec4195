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

// Rotates adjacent pairs (2j, 2j+1) of every head of x[n, n_heads * head_dim];
// row i is at position pos[i]; angle = pos * theta^(-2j / head_dim).
void rope(float* x, int64_t n, int32_t n_heads, int32_t head_dim, const int32_t* pos, float theta);
// Same rotation of one head vector by an arbitrary (possibly negative) position delta.
void rope_head(float* x, int32_t head_dim, int64_t pos, float theta);

// a[i] = silu(a[i]) * b[i]
void silu_mul(float* a, const float* b, int64_t n);

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
};

// Causal multi-head attention over the paged cache (scale 1/sqrt(head_dim)).
// scratch: per-thread workspace, resized as needed (one vector per pool thread).
void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool);

}  // namespace llm::cpu
