// Paged causal attention: one kernel for prefill tiles and decode splits,
// plus the split-merge kernel (flash-decoding). The tile order, the online
// softmax and the merge use kernel_math.h (tested on the CPU against a
// naive softmax); this file is the parallel skeleton.
//
// Block (split s, KV head kvh, row tile z): the query vectors of rows
// [z * R, z * R + R) for the `group` query heads that read KV head kvh.
// Keys stream through shared memory in tiles of kAttnTile (32) tokens:
//   scores  P[q][t] = (q . k_t) * scale, softcapped when the model says so
//           (masked: t > pos[row], or before a sliding window -> -inf)
//   online  m' = max(m, max_t P), alpha = e^(m - m'), p_t = e^(P - m'),
//           l = l * alpha + sum p, acc = acc * alpha + sum p v_t
// so no score matrix beyond one tile ever exists.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/plan.h"

namespace llm::cuda {

namespace {

// Largest dynamic shared memory any allowed configuration needs
// (queries x head_dim <= 4096, head_dim <= 256, queries <= 64).
constexpr int kAttnSmemMaxBytes =
    4 * (4096 + kAttnTile * (kAttnMaxHeadDim + 1) + kAttnTile * kAttnMaxHeadDim + kAttnMaxQueries * kAttnTile +
         3 * kAttnMaxQueries);

// 16 bytes of one K/V row -> E floats.
template <typename KvT>
__device__ __forceinline__ void load_kv16(const uint8_t* p, float* out) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  if constexpr (sizeof(KvT) == 4) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
  } else {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = f16_bits_to_float(w[i]);
      out[2 * i + 1] = f16_bits_to_float(w[i] >> 16);
    }
  }
}

template <typename KvT>
__device__ __forceinline__ float load_kv1(const uint8_t* page, int64_t elem) {
  if constexpr (sizeof(KvT) == 4)
    return __ldg(reinterpret_cast<const float*>(page) + elem);
  else
    return f16_bits_to_float(__ldg(reinterpret_cast<const unsigned short*>(page) + elem));
}

template <typename KvT>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttnArgs a, AttnSmem sm) {
  constexpr int E = 16 / int(sizeof(KvT));  // elements per 16-byte load
  extern __shared__ float smem[];
  __shared__ int32_t s_nkeys, s_kfirst;
  float* sq = smem + sm.q;
  float* sk = smem + sm.k;
  float* sv = smem + sm.v;
  float* sp = smem + sm.p;
  float* s_m = smem + sm.m;
  float* s_l = smem + sm.l;
  float* s_alpha = smem + sm.alpha;

  const int32_t hd = a.geom.head_dim, pt = a.geom.page_tokens;
  const int32_t group = a.n_heads / a.geom.n_kv_heads;
  const int32_t split = int32_t(blockIdx.x), kvh = int32_t(blockIdx.y);
  const int64_t r0 = int64_t(blockIdx.z) * a.rows_per_block;
  const int32_t n_rows = int32_t(min64(a.rows_per_block, a.n_rows - r0));
  const int32_t nq = n_rows * group;
  const int32_t n_out = nq * hd;
  const int tid = int(threadIdx.x);
  const uint8_t* const* table = a.pages.tables + (r0 / a.pages.rows_per_seq) * a.pages.table_stride;

  if (tid == 0) {
    int32_t mx = 0, first = 0x7fffffff;
    for (int32_t r = 0; r < n_rows; ++r) {
      mx = max(mx, a.pos[r0 + r] + 1);
      first = min(first, int32_t(attn_first_key(a.pos[r0 + r], a.window)));
    }
    s_nkeys = mx;
    s_kfirst = first;  // tiles that end before it hold no visible key for any row
  }
  for (int32_t i = tid; i < n_out; i += kAttnThreads) {
    int32_t row, head;
    attn_query_of(i / hd, group, kvh, &row, &head);
    sq[i] = a.q[(r0 + row) * a.q_ld + int64_t(head) * hd + i % hd] * a.scale;
  }
  for (int32_t i = tid; i < nq; i += kAttnThreads) {
    s_m[i] = -INFINITY;
    s_l[i] = 0.f;
  }
  float acc[kAttnMaxAcc];
#pragma unroll
  for (int k = 0; k < kAttnMaxAcc; ++k) acc[k] = 0.f;
  __syncthreads();

  int32_t kb, ke;
  split_range(split, a.split_tokens, s_nkeys, &kb, &ke);
  const int32_t vec_per_row = hd / E;
  for (int32_t t0 = kb; t0 < ke; t0 += kAttnTile) {
    const int32_t nt = min(kAttnTile, ke - t0);
    if (t0 + nt <= s_kfirst) continue;  // the same for every thread of the block
    // K and V rows of the tile -> shared memory (f32): 16-byte loads when
    // head_dim allows (rows are then 16-byte aligned), else one element each.
    if (vec_per_row * E == hd) {
      for (int32_t i = tid; i < nt * vec_per_row; i += kAttnThreads) {
        const int32_t tt = i / vec_per_row, c = i % vec_per_row;
        const int32_t p = t0 + tt;
        const uint8_t* page = table[kv_page_of(p, pt)];
        const int32_t slot = kv_slot_of(p, pt);
        float kvals[E], vvals[E];
        load_kv16<KvT>(page + (kv_row_index(a.geom, a.layer, 0, kvh, slot) * hd + c * E) * int64_t(sizeof(KvT)), kvals);
        load_kv16<KvT>(page + (kv_row_index(a.geom, a.layer, 1, kvh, slot) * hd + c * E) * int64_t(sizeof(KvT)), vvals);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          sk[tt * sm.k_stride + c * E + e] = kvals[e];
          sv[tt * hd + c * E + e] = vvals[e];
        }
      }
    } else {
      for (int32_t i = tid; i < nt * hd; i += kAttnThreads) {
        const int32_t tt = i / hd, d = i % hd;
        const int32_t p = t0 + tt;
        const uint8_t* page = table[kv_page_of(p, pt)];
        const int32_t slot = kv_slot_of(p, pt);
        sk[tt * sm.k_stride + d] = load_kv1<KvT>(page, kv_row_index(a.geom, a.layer, 0, kvh, slot) * hd + d);
        sv[tt * hd + d] = load_kv1<KvT>(page, kv_row_index(a.geom, a.layer, 1, kvh, slot) * hd + d);
      }
    }
    __syncthreads();
    // Scores of every (query, key) of the tile.
    for (int32_t i = tid; i < nq * kAttnTile; i += kAttnThreads) {
      const int32_t qi = i / kAttnTile, tt = i % kAttnTile;
      float s = -INFINITY;
      if (tt < nt && attn_key_visible(t0 + tt, a.pos[r0 + qi / group], a.window)) {
        const float* qv = sq + qi * hd;
        const float* kr = sk + tt * sm.k_stride;
        float dot = 0.f;
        for (int32_t d = 0; d < hd; ++d) dot += qv[d] * kr[d];
        s = a.softcap > 0.f ? softcap_value(dot, a.softcap) : dot;
      }
      sp[i] = s;
    }
    __syncthreads();
    // Online softmax: warp per query, lane per key of the tile (kAttnTile == 32).
    for (int32_t qi = tid >> 5; qi < nq; qi += kAttnThreads / 32) {
      const int lane = tid & 31;
      const float s = sp[qi * kAttnTile + lane];
      const float mt = warp_max(s);
      const MergeFactors f = softmax_merge(s_m[qi], mt);
      const float p = exp_or_zero(s, f.m);
      sp[qi * kAttnTile + lane] = p;
      const float ls = warp_sum(p);
      if (lane == 0) {
        s_l[qi] = s_l[qi] * f.fa + ls;
        s_m[qi] = f.m;
        s_alpha[qi] = f.fa;
      }
    }
    __syncthreads();
    // acc = acc * alpha + P . V
#pragma unroll
    for (int k = 0; k < kAttnMaxAcc; ++k) {
      const int32_t i = tid + k * kAttnThreads;
      if (i < n_out) {
        const int32_t qi = i / hd, d = i % hd;
        const float* pr = sp + qi * kAttnTile;
        float s = acc[k] * s_alpha[qi];
        for (int32_t tt = 0; tt < nt; ++tt) s += pr[tt] * sv[tt * hd + d];
        acc[k] = s;
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int k = 0; k < kAttnMaxAcc; ++k) {
    const int32_t i = tid + k * kAttnThreads;
    if (i < n_out) {
      const int32_t qi = i / hd, d = i % hd;
      int32_t row, head;
      attn_query_of(qi, group, kvh, &row, &head);
      if (a.n_splits == 1) {
        a.out[(r0 + row) * a.out_ld + int64_t(head) * hd + d] = softmax_finish(acc[k], s_l[qi]);
      } else {
        const int64_t pi = ((r0 + row) * a.n_heads + head) * a.n_splits + split;
        a.part_acc[pi * hd + d] = acc[k];
        if (d == 0) {
          a.part_ml[pi * 2] = s_m[qi];
          a.part_ml[pi * 2 + 1] = s_l[qi];
        }
      }
    }
  }
}

// Block per (row, head), thread per output element: merges the splits.
__global__ void attention_reduce_kernel(AttnArgs a) {
  const int64_t rh = blockIdx.x;  // row * n_heads + head
  const int32_t hd = a.geom.head_dim;
  const int32_t d = int32_t(threadIdx.x);
  if (d >= hd) return;
  float m = -INFINITY, l = 0.f, acc = 0.f;
  for (int32_t s = 0; s < a.n_splits; ++s) {
    const int64_t pi = rh * a.n_splits + s;
    const MergeFactors f = softmax_merge(m, a.part_ml[pi * 2]);
    acc = acc * f.fa + a.part_acc[pi * hd + d] * f.fb;
    l = l * f.fa + a.part_ml[pi * 2 + 1] * f.fb;
    m = f.m;
  }
  const int64_t row = rh / a.n_heads, head = rh % a.n_heads;
  a.out[row * a.out_ld + head * hd + d] = softmax_finish(acc, l);
}

}  // namespace

cudaError_t attention_setup() {
  cudaError_t e = cudaFuncSetAttribute(attention_kernel<uint16_t>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kAttnSmemMaxBytes);
  if (e != cudaSuccess) return e;
  return cudaFuncSetAttribute(attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kAttnSmemMaxBytes);
}

cudaError_t launch_attention(const AttnArgs& a, cudaStream_t stream) {
  if (a.n_rows <= 0) return cudaSuccess;
  const int32_t group = a.n_heads / a.geom.n_kv_heads;
  const int32_t nq = a.rows_per_block * group;
  if (a.geom.head_dim % 2 != 0 || a.geom.head_dim > kAttnMaxHeadDim || nq > kAttnMaxQueries ||
      nq * a.geom.head_dim > kAttnThreads * kAttnMaxAcc || a.n_splits < 1)
    return cudaErrorInvalidValue;
  const AttnSmem sm = attention_smem(nq, a.geom.head_dim);
  if (sm.bytes() > size_t(kAttnSmemMaxBytes)) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(a.n_splits), unsigned(a.geom.n_kv_heads),
                  unsigned((a.n_rows + a.rows_per_block - 1) / a.rows_per_block));
  if (a.kv_f32)
    attention_kernel<float><<<grid, kAttnThreads, sm.bytes(), stream>>>(a, sm);
  else
    attention_kernel<uint16_t><<<grid, kAttnThreads, sm.bytes(), stream>>>(a, sm);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a.n_splits == 1) return e;
  const int threads = (a.geom.head_dim + 31) / 32 * 32;
  attention_reduce_kernel<<<unsigned(a.n_rows * a.n_heads), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace llm::cuda
