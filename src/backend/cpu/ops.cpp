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
  // The angles depend on the position only: computed once per row for all
  // heads, with exactly rope_head's expressions (so the same values).
  constexpr int32_t kMaxPairs = 256;
  if (head_dim > 2 * kMaxPairs) {
    for (int64_t r = 0; r < n; ++r)
      for (int32_t h = 0; h < n_heads; ++h) rope_head(x + r * stride + int64_t(h) * head_dim, head_dim, pos[r], theta);
    return;
  }
  float cs[kMaxPairs], sn[kMaxPairs];
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t i = 0; i < head_dim; i += 2) {
      const float freq = 1.0f / std::pow(theta, float(i) / float(head_dim));
      const float val = float(pos[r]) * freq;
      cs[i / 2] = std::cos(val);
      sn[i / 2] = std::sin(val);
    }
    for (int32_t h = 0; h < n_heads; ++h) {
      float* xh = x + r * stride + int64_t(h) * head_dim;
      for (int32_t i = 0; i < head_dim; i += 2) {
        const float c = cs[i / 2], sv = sn[i / 2];
        const float v0 = xh[i], v1 = xh[i + 1];
        xh[i] = v0 * c - v1 * sv;
        xh[i + 1] = v0 * sv + v1 * c;
      }
    }
  }
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
// With AVX2 (head_dim a multiple of 8, at most kMaxBlockedHeadDim) rows go
// in blocks of 8: each is converted to f32 once into a block buffer, the
// block's scores for every head of the group come out of one register
// transpose, the softmax exponentials are vector polynomials, and V blocks
// are accumulated with the head's output chunk held in registers. Otherwise
// f32/f16 rows are used in place and int8/int4 rows are dequantized once
// into a scratch row. Per-element work is identical whatever the batch or
// thread split, so a row's result does not depend on either.
void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool) {
  const kv::Geometry& g = *a.geom;
  const int32_t hd = g.head_dim;
  const int32_t group = a.n_heads / g.n_kv_heads;
  const int64_t q_stride = int64_t(a.n_heads) * hd;
  const int64_t max_len = a.p0 + a.n;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int nth = pool ? pool->size() : 1;
  const RowFns f = row_fns();
#if defined(__x86_64__) || defined(_M_X64)
  constexpr int32_t kMaxBlockedHeadDim = 512;
  const bool blocked = use_avx2_kernels() && hd % 8 == 0 && hd <= kMaxBlockedHeadDim;
#else
  const bool blocked = false;
#endif
  const size_t need = size_t(group) * size_t(max_len) + size_t(hd) * size_t(group + 1 + 8);
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
#if defined(__x86_64__) || defined(_M_X64)
      if (blocked) {
        float* blk = row + hd;  // [8][hd] rows in f32
        // Row t of K (kv 0) or V (kv 1) into blk + u * hd.
        auto load_block = [&](int kvi, int64_t t0, int32_t nr) {
          for (int32_t u = 0; u < nr; ++u) {
            const int64_t t = t0 + u;
            const kv::Page* p = a.pages[t / g.page_tokens];
            const int32_t slot = int32_t(t % g.page_tokens);
            float* dst = blk + int64_t(u) * hd;
            const uint8_t* src = kv::row_ptr(g, p, a.layer, kvi, kvh, slot);
            if (p->type == LLM_KV_F32)
              std::memcpy(dst, src, size_t(hd) * sizeof(float));
            else if (p->type == LLM_KV_F16)
              rows::avx2::f16_row_to_f32(reinterpret_cast<const uint16_t*>(src), dst, hd);
            else
              kv::load_row(g, p, a.layer, kvi, kvh, slot, dst);
          }
        };
        constexpr int32_t B = rows::avx2::kBlockRows;
        for (int64_t t0 = 0; t0 < len; t0 += B) {
          const int32_t nr = int32_t(std::min<int64_t>(B, len - t0));
          load_block(0, t0, nr);
          rows::avx2::scores8(q0, group, hd, blk, nr, scale, att + t0, max_len);
        }
        for (int32_t j = 0; j < group; ++j) rows::avx2::softmax(att + size_t(j) * size_t(max_len), len);
        std::fill(acc, acc + size_t(group) * size_t(hd), 0.f);
        for (int64_t t0 = 0; t0 < len; t0 += B) {
          const int32_t nr = int32_t(std::min<int64_t>(B, len - t0));
          load_block(1, t0, nr);
          rows::avx2::pv8(att + t0, max_len, group, hd, blk, nr, acc);
        }
        for (int32_t j = 0; j < group; ++j)
          std::memcpy(a.out + i * q_stride + (int64_t(kvh) * group + j) * hd, acc + size_t(j) * size_t(hd),
                      size_t(hd) * sizeof(float));
        continue;
      }
#endif
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
