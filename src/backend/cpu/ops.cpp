#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_features.h"
#include "core/half.h"
#include "core/silu.h"
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

// Pair j's two dimensions under each kind.
static inline void rotate_pairs(float* x, const Rope& r, const float* cs, const float* sn) {
  const int32_t half = r.rope_dims / 2;
  const int32_t stride = r.kind == 0 ? 2 : 1;    // distance between consecutive pairs' first elements
  const int32_t other = r.kind == 0 ? 1 : half;  // distance from a pair's first element to its second
  for (int32_t j = 0; j < half; ++j) {
    float* a = x + j * stride;
    const float v0 = a[0], v1 = a[other];
    a[0] = v0 * cs[j] - v1 * sn[j];
    a[other] = v0 * sn[j] + v1 * cs[j];
  }
}

// cos and sin of pair j's angle at pos, times r.mscale.
static inline void rope_angles(const Rope& r, int64_t pos, float* cs, float* sn, int32_t n_pairs) {
  for (int32_t j = 0; j < n_pairs; ++j) {
    const float val = float(pos) * r.inv_freq[j];
    cs[j] = std::cos(val);
    sn[j] = std::sin(val);
  }
  if (r.mscale != 1.0f) {
    for (int32_t j = 0; j < n_pairs; ++j) {
      cs[j] *= r.mscale;
      sn[j] *= r.mscale;
    }
  }
}

void rope_head(float* x, const Rope& r, int64_t pos) {
  constexpr int32_t kMaxPairs = 512;
  float cs[kMaxPairs], sn[kMaxPairs];
  rope_angles(r, pos, cs, sn, std::min(r.rope_dims / 2, kMaxPairs));
  rotate_pairs(x, r, cs, sn);
}

void rope(float* x, int64_t n, int32_t n_heads, const Rope& r, const int32_t* pos) {
  const int64_t stride = int64_t(n_heads) * r.head_dim;
  // The angles depend on the position only: computed once per row for all heads.
  constexpr int32_t kMaxPairs = 512;
  float cs[kMaxPairs], sn[kMaxPairs];
  for (int64_t i = 0; i < n; ++i) {
    rope_angles(r, pos[i], cs, sn, std::min(r.rope_dims / 2, kMaxPairs));
    for (int32_t h = 0; h < n_heads; ++h) rotate_pairs(x + i * stride + int64_t(h) * r.head_dim, r, cs, sn);
  }
}

// inv_freq of the Llama-2 rotation, with the expressions the engine has
// always used (so its angles are bit-identical to earlier releases).
static void llama_inv_freq(int32_t head_dim, float theta, float* f) {
  for (int32_t i = 0; i < head_dim; i += 2) f[i / 2] = 1.0f / std::pow(theta, float(i) / float(head_dim));
}

void rope_head(float* x, int32_t head_dim, int64_t pos, float theta) {
  std::vector<float> f(size_t(head_dim / 2));
  llama_inv_freq(head_dim, theta, f.data());
  rope_head(x, Rope{0, head_dim, head_dim, f.data()}, pos);
}

void rope(float* x, int64_t n, int32_t n_heads, int32_t head_dim, const int32_t* pos, float theta) {
  std::vector<float> f(size_t(head_dim / 2));
  llama_inv_freq(head_dim, theta, f.data());
  rope(x, n, n_heads, Rope{0, head_dim, head_dim, f.data()}, pos);
}

void silu_mul(float* a, const float* b, int64_t n) {
  if (use_avx2_kernels()) {
    avx2::silu_mul(a, b, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) a[i] = silu::silu_mul(a[i], b[i]);
}

// GELU is evaluated at the input rounded to fp16 and its result rounded to
// fp16, with gelu(x) = x above 10 and 0 below -10: the numerics of ggml's
// CPU GELU (a table over every fp16 value), which llama.cpp's references
// carry. The rounding (relative 2^-11) is far below what the model resolves;
// evaluating in plain f32 instead moves tiny random Gemma 2 logits by up to
// 1.4e-3 of their range against llama.cpp, with it 2e-4.
namespace {

float gelu_tanh_f16(uint16_t h) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  const float v = f16_to_f32(h);
  if (v >= 10.0f) return v;
  if (v <= -10.0f) return 0.0f;
  return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * v * (1.0f + 0.044715f * v * v)));
}

// The rounded GELU of every fp16 input (128 KiB), made on first use: the
// function costs a tanh per value, which was a third of a Gemma prefill.
const uint16_t* gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f32_to_f16(gelu_tanh_f16(uint16_t(h)));
    return t;
  }();
  return table.data();
}

}  // namespace

void gelu_tanh_mul(float* a, const float* b, int64_t n) {
  const uint16_t* table = gelu_table();
  for (int64_t i = 0; i < n; ++i) a[i] = f16_to_f32(table[f32_to_f16(a[i])]) * b[i];
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void add_bias(float* y, const float* b, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += b[i];
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
// With AVX2 (head_dim a multiple of 8, at most kMaxBlockedHeadDim) a work item
// is up to 4 consecutive query rows and cached rows go in blocks of 8: each is
// converted to f32 once for the item into a block buffer, the block's scores
// for every head of the group come out of one register transpose, the softmax
// exponentials are vector polynomials, and V blocks are accumulated with the
// head's output chunk held in registers (AVX-512 vectors under that family). Otherwise
// f32/f16 rows are used in place and int8/int4 rows are dequantized once
// into a scratch row. Per-element work is identical whatever the batch or
// thread split, so a row's result does not depend on either.
void attention(const AttentionArgs& a, std::vector<std::vector<float>>& scratch, ThreadPool* pool) {
  const kv::Geometry& g = *a.geom;
  const int32_t hd = g.head_dim;
  const int32_t group = a.n_heads / g.n_kv_heads;
  const int64_t q_stride = int64_t(a.n_heads) * hd;
  const int64_t max_len = a.p0 + a.n;
  const float scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(float(hd));
  const int nth = pool ? pool->size() : 1;
  const RowFns f = row_fns();
#if defined(__x86_64__) || defined(_M_X64)
  constexpr int32_t kMaxBlockedHeadDim = 512;
  const bool blocked = use_avx2_kernels() && hd % 8 == 0 && hd <= kMaxBlockedHeadDim;
  // The blocked V accumulation: AVX-512 where it runs (the same bits as AVX2's).
  auto pv8 = rows::avx2::pv8;
#if defined(LLM_AVX512_KERNELS)
  if (blocked && use_avx512_kernels()) pv8 = rows::avx512::pv8;
#endif
#else
  const bool blocked = false;
#endif
  // The blocked path takes kQueryRows consecutive query rows per task, so each
  // K/V block is converted to f32 once for all of them (at a 2048-token prompt
  // the conversions were 8% of a prefill). A row's scores, softmax and sums are
  // the same operations whichever rows share its task.
  constexpr int64_t kQueryRows = 4;
  const int64_t qrows = blocked ? std::min<int64_t>(kQueryRows, a.n) : 1;
  const size_t need = size_t(qrows) * size_t(group) * (size_t(max_len) + size_t(hd)) + size_t(hd) * size_t(1 + 8);
  if (int(scratch.size()) < nth) scratch.resize(size_t(nth));
  for (auto& s : scratch)
    if (s.size() < need) s.resize(need);

  // First cache slot a query row of causal length len attends (the window,
  // and slots no longer held, cut it).
  auto first_slot = [&](int64_t len) {
    return std::min(len - 1, std::max(a.first, a.window > 0 ? len - a.window : 0));
  };

  auto work = [&](int ith, int nth_run) {
    float* att = scratch[size_t(ith)].data();                       // [qrows][group][max_len]
    float* acc = att + size_t(qrows) * size_t(group) * size_t(max_len);  // [qrows][group][hd]
    float* row = acc + size_t(qrows) * size_t(group) * size_t(hd);      // [hd] dequantized row
    // Tasks (query rows, KV head) dealt out in turn: a causal query's cost
    // grows with its position, so contiguous ranges gave the last thread
    // about three times the first one's work in a prefill.
#if defined(__x86_64__) || defined(_M_X64)
    if (blocked) {
      float* blk = row + hd;  // [8][hd] rows in f32
      constexpr int32_t B = rows::avx2::kBlockRows;
      const int64_t n_blocks = (a.n + qrows - 1) / qrows;
      for (int64_t task = ith; task < n_blocks * g.n_kv_heads; task += nth_run) {
        const int64_t i0 = task / g.n_kv_heads * qrows, i1 = std::min(a.n, i0 + qrows);
        const int32_t kvh = int32_t(task % g.n_kv_heads);
        int64_t lo[kQueryRows] = {}, len[kQueryRows] = {};
        for (int64_t i = i0; i < i1; ++i) {
          len[i - i0] = a.p0 + i + 1;
          lo[i - i0] = first_slot(len[i - i0]);
        }
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
        // Every slot some row of the task attends: [lo of the first row, len
        // of the last) (lo never decreases with the row).
        const int64_t first = lo[0], last = len[i1 - i0 - 1];
        for (int64_t t0 = first; t0 < last; t0 += B) {
          const int32_t nr = int32_t(std::min<int64_t>(B, last - t0));
          load_block(0, t0, nr);
          for (int64_t r = 0; r < i1 - i0; ++r) {
            if (t0 >= len[r] || t0 + nr <= lo[r]) continue;
            const float* q0 = a.q + (i0 + r) * q_stride + int64_t(kvh) * group * hd;  // first query head of the group
            rows::avx2::scores8(q0, group, hd, blk, int32_t(std::min<int64_t>(nr, len[r] - t0)), scale,
                                att + (r * group) * max_len + t0, max_len);
          }
        }
        for (int64_t r = 0; r < i1 - i0; ++r)
          for (int32_t j = 0; j < group; ++j) {
            float* att_j = att + (r * group + j) * max_len;
            if (a.softcap > 0) softcap(att_j + lo[r], len[r] - lo[r], a.softcap);
            rows::avx2::softmax(att_j + lo[r], len[r] - lo[r]);
          }
        std::fill(acc, acc + size_t(i1 - i0) * size_t(group) * size_t(hd), 0.f);
        for (int64_t t0 = first; t0 < last; t0 += B) {
          const int32_t nr = int32_t(std::min<int64_t>(B, last - t0));
          load_block(1, t0, nr);
          for (int64_t r = 0; r < i1 - i0; ++r) {
            // This row's slots of the block, in order: each sum takes its
            // terms in order of the slot, however the blocks fall.
            const int64_t s0 = std::max(t0, lo[r]), s1 = std::min<int64_t>(t0 + nr, len[r]);
            if (s0 >= s1) continue;
            pv8(att + (r * group) * max_len + s0, max_len, group, hd, blk + (s0 - t0) * hd, int32_t(s1 - s0),
                acc + (r * group) * hd);
          }
        }
        for (int64_t r = 0; r < i1 - i0; ++r)
          for (int32_t j = 0; j < group; ++j)
            std::memcpy(a.out + (i0 + r) * q_stride + (int64_t(kvh) * group + j) * hd, acc + (r * group + j) * hd,
                        size_t(hd) * sizeof(float));
      }
      return;
    }
#endif
    for (int64_t task = ith; task < a.n * g.n_kv_heads; task += nth_run) {
      const int64_t i = task / g.n_kv_heads;
      const int32_t kvh = int32_t(task % g.n_kv_heads);
      const float* q0 = a.q + i * q_stride + int64_t(kvh) * group * hd;  // first query head of the group
      const int64_t len = a.p0 + i + 1;
      const int64_t lo = first_slot(len);
      auto finish_scores = [&](float* att_j) {  // softcap, then softmax over [lo, len)
        if (a.softcap > 0) softcap(att_j + lo, len - lo, a.softcap);
      };
      for (int64_t t = lo; t < len; ++t) {
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
      for (int32_t j = 0; j < group; ++j) {
        float* att_j = att + size_t(j) * size_t(max_len);
        finish_scores(att_j);
        softmax(att_j + lo, len - lo);
      }
      std::fill(acc, acc + size_t(group) * size_t(hd), 0.f);
      for (int64_t t = lo; t < len; ++t) {
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
