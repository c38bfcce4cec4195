#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"

namespace llm::cpu {

void rmsnorm(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    ss = 1.0f / std::sqrt(ss / float(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (ss * xr[i]);
  }
}

void rope_head(float* x, int32_t head_dim, int64_t pos, float theta) {
  for (int32_t i = 0; i < head_dim; i += 2) {
    const float freq = 1.0f / std::pow(theta, float(i) / float(head_dim));
    const float val = float(pos) * freq;
    const float c = std::cos(val), s = std::sin(val);
    const float v0 = x[i], v1 = x[i + 1];
    x[i] = v0 * c - v1 * s;
    x[i + 1] = v0 * s + v1 * c;
  }
}

void rope(float* x, int64_t n, int32_t n_heads, int32_t head_dim, const int32_t* pos, float theta) {
  const int64_t stride = int64_t(n_heads) * head_dim;
  for (int64_t r = 0; r < n; ++r)
    for (int32_t h = 0; h < n_heads; ++h) rope_head(x + r * stride + int64_t(h) * head_dim, head_dim, pos[r], theta);
}

void silu_mul(float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = a[i];
    a[i] = v * (1.0f / (1.0f + std::exp(-v))) * b[i];
  }
}

void softmax(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool) {
  const kv::Geometry& g = *a.geom;
  const int32_t hd = g.head_dim;
  const int32_t group = a.n_heads / g.n_kv_heads;
  const int64_t q_stride = int64_t(a.n_heads) * hd;
  const int64_t max_len = a.p0 + a.n;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int nth = pool ? pool->size() : 1;
  if (int(scratch.size()) < nth) scratch.resize(size_t(nth));
  for (auto& s : scratch)
    if (int64_t(s.size()) < max_len + 2 * hd) s.resize(size_t(max_len + 2 * hd));

  auto work = [&](int ith, int nth_run) {
    int64_t begin, end;
    ThreadPool::split(a.n * a.n_heads, ith, nth_run, &begin, &end);
    float* att = scratch[size_t(ith)].data();
    float* row = att + max_len;
    float* acc = row + hd;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / a.n_heads;
      const int32_t h = int32_t(task % a.n_heads);
      const int32_t kvh = h / group;
      const float* q = a.q + i * q_stride + int64_t(h) * hd;
      const int64_t len = a.p0 + i + 1;
      for (int64_t t = 0; t < len; ++t) {
        const kv::Page* p = a.pages[t / g.page_tokens];
        const int32_t slot = int32_t(t % g.page_tokens);
        const float* k;
        if (p->type == LLM_KV_F32) {
          k = reinterpret_cast<const float*>(kv::row_ptr(g, p, a.layer, 0, kvh, slot));
        } else {
          kv::load_row(g, p, a.layer, 0, kvh, slot, row);
          k = row;
        }
        float dot = 0.f;
        for (int32_t d = 0; d < hd; ++d) dot += q[d] * k[d];
        att[t] = dot * scale;
      }
      softmax(att, len);
      std::fill(acc, acc + hd, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const kv::Page* p = a.pages[t / g.page_tokens];
        const int32_t slot = int32_t(t % g.page_tokens);
        const float* v;
        if (p->type == LLM_KV_F32) {
          v = reinterpret_cast<const float*>(kv::row_ptr(g, p, a.layer, 1, kvh, slot));
        } else {
          kv::load_row(g, p, a.layer, 1, kvh, slot, row);
          v = row;
        }
        const float w = att[t];
        for (int32_t d = 0; d < hd; ++d) acc[d] += w * v[d];
      }
      std::memcpy(a.out + i * q_stride + int64_t(h) * hd, acc, size_t(hd) * sizeof(float));
    }
  };
  if (pool)
    pool->parallel(work);
  else
    work(0, 1);
}

}  // namespace llm::cpu
