#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_features.h"
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

namespace {

struct RowFns {
  float (*dot_f32)(const float*, const float*, int32_t);
  float (*dot_f16)(const float*, const uint16_t*, int32_t);
  void (*axpy_f32)(float, const float*, float*, int32_t);
  void (*axpy_f16)(float, const uint16_t*, float*, int32_t);
};

RowFns row_fns() {
#if defined(__x86_64__) || defined(_M_X64)
  if (use_avx2_kernels()) return {rows::avx2::dot_f32, rows::avx2::dot_f16, rows::avx2::axpy_f32, rows::avx2::axpy_f16};
#endif
  return {rows::dot_f32, rows::dot_f16, rows::axpy_f32, rows::axpy_f16};
}

}  // namespace

// Work item = (query row i, KV head): each cached K/V row is read once and
// serves all the query heads of its GQA group (n_heads / n_kv_heads of them).
// f32/f16 rows are used in place; int8/int4 rows are dequantized once into a
// scratch row. Per-element work is identical whatever the batch or thread
// split, so a row's result does not depend on either.
void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool) {
  const kv::Geometry& g = *a.geom;
  const int32_t hd = g.head_dim;
  const int32_t group = a.n_heads / g.n_kv_heads;
  const int64_t q_stride = int64_t(a.n_heads) * hd;
  const int64_t max_len = a.p0 + a.n;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int nth = pool ? pool->size() : 1;
  const RowFns f = row_fns();
  const size_t need = size_t(group) * size_t(max_len) + size_t(hd) * size_t(group + 1);
  if (int(scratch.size()) < nth) scratch.resize(size_t(nth));
  for (auto& s : scratch)
    if (s.size() < need) s.resize(need);

  auto work = [&](int ith, int nth_run) {
    int64_t begin, end;
    ThreadPool::split(a.n * g.n_kv_heads, ith, nth_run, &begin, &end);
    float* att = scratch[size_t(ith)].data();    // [group][len]
    float* acc = att + size_t(group) * size_t(max_len);  // [group][hd]
    float* row = acc + size_t(group) * size_t(hd);       // [hd] dequantized row
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / g.n_kv_heads;
      const int32_t kvh = int32_t(task % g.n_kv_heads);
      const float* q0 = a.q + i * q_stride + int64_t(kvh) * group * hd;  // first query head of the group
      const int64_t len = a.p0 + i + 1;
      for (int64_t t = 0; t < len; ++t) {
        const kv::Page* p = a.pages[t / g.page_tokens];
        const int32_t slot = int32_t(t % g.page_tokens);
        const uint8_t* kr = kv::row_ptr(g, p, a.layer, 0, kvh, slot);
        for (int32_t j = 0; j < group; ++j) {
          const float* q = q0 + int64_t(j) * hd;
          float dot;
          if (p->type == LLM_KV_F32) {
            dot = f.dot_f32(q, reinterpret_cast<const float*>(kr), hd);
          } else if (p->type == LLM_KV_F16) {
            dot = f.dot_f16(q, reinterpret_cast<const uint16_t*>(kr), hd);
          } else {
            if (j == 0) kv::load_row(g, p, a.layer, 0, kvh, slot, row);
            dot = f.dot_f32(q, row, hd);
          }
          att[size_t(j) * size_t(max_len) + size_t(t)] = dot * scale;
        }
      }
      for (int32_t j = 0; j < group; ++j) softmax(att + size_t(j) * size_t(max_len), len);
      std::fill(acc, acc + size_t(group) * size_t(hd), 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const kv::Page* p = a.pages[t / g.page_tokens];
        const int32_t slot = int32_t(t % g.page_tokens);
        const uint8_t* vr = kv::row_ptr(g, p, a.layer, 1, kvh, slot);
        if (p->type != LLM_KV_F32 && p->type != LLM_KV_F16) kv::load_row(g, p, a.layer, 1, kvh, slot, row);
        for (int32_t j = 0; j < group; ++j) {
          const float w = att[size_t(j) * size_t(max_len) + size_t(t)];
          float* aj = acc + size_t(j) * size_t(hd);
          if (p->type == LLM_KV_F32)
            f.axpy_f32(w, reinterpret_cast<const float*>(vr), aj, hd);
          else if (p->type == LLM_KV_F16)
            f.axpy_f16(w, reinterpret_cast<const uint16_t*>(vr), aj, hd);
          else
            f.axpy_f32(w, row, aj, hd);
        }
      }
      for (int32_t j = 0; j < group; ++j)
        std::memcpy(a.out + i * q_stride + (int64_t(kvh) * group + j) * hd, acc + size_t(j) * size_t(hd),
                    size_t(hd) * sizeof(float));
    }
  };
  // A parallel region costs a few microseconds (more on a busy machine):
  // small attentions run on the calling thread.
  const int64_t work_items = a.n * (a.p0 + a.n) * int64_t(a.n_heads) * hd;
  if (pool && pool->size() > 1 && work_items >= (int64_t(1) << 15))
    pool->parallel(work);
  else
    work(0, 1);
}

}  // namespace llm::cpu
