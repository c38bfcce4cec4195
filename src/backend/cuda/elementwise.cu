// Memory-bound per-token kernels: RMSNorm (also per head, and fused into
// the residual add), biases, scales and softcaps, RoPE + KV store, the gated
// activation (SiLU or GELU),
// f32 -> f16/bf16, greedy argmax, top-k, and the eviction shift of the KV
// cache. Per-element math comes from kernel_math.h (tested on the CPU).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace llm::cuda {

namespace {

// ---------------------------------------------------------------- rmsnorm

__global__ void rmsnorm_kernel(const float* x, const float* w, int64_t dim, float eps, float* y) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rms_inv(block_sum(ss, red), dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w[i] * (inv * xr[i]);
}

// ---------------------------------------------------------------- rope + kv store

template <typename KvT>
__device__ __forceinline__ void store_pair(uint8_t* page, int64_t elem, float a, float b) {
  if constexpr (sizeof(KvT) == 4) {
    float2* p = reinterpret_cast<float2*>(reinterpret_cast<float*>(page) + elem);
    *p = make_float2(a, b);
  } else {
    uint32_t* p = reinterpret_cast<uint32_t*>(reinterpret_cast<uint16_t*>(page) + elem);
    *p = uint32_t(float_to_f16_bits(a)) | (uint32_t(float_to_f16_bits(b)) << 16);
  }
}

template <typename KvT>
__device__ __forceinline__ void load_pair(const uint8_t* page, int64_t elem, float* a, float* b) {
  if constexpr (sizeof(KvT) == 4) {
    const float2 v = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(page) + elem);
    *a = v.x;
    *b = v.y;
  } else {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint16_t*>(page) + elem);
    *a = f16_bits_to_float(v);
    *b = f16_bits_to_float(v >> 16);
  }
}

// Block per row. First every rotated pair of the q and k heads turns in
// place (threads over pairs; pairs never share an element), then K and V of
// the row go to the page (threads over consecutive element pairs).
template <typename KvT>
__global__ void rope_store_kv_kernel(RopeKvArgs a) {
  const int64_t r = blockIdx.x;
  const int32_t hd = a.head_dim, half = hd / 2, rhalf = a.rope.rope_dims / 2;
  const int32_t pos = a.pos[r];
  float* row = a.qkv + r * a.ld;
  const int32_t n_rot = (a.n_heads + a.n_kv_heads) * rhalf;
  for (int32_t idx = threadIdx.x; idx < n_rot; idx += blockDim.x)
    rope_spec_pair(row + int64_t(idx / rhalf) * hd, a.rope.kind, a.rope.rope_dims, a.rope.inv_freq, a.rope.mscale,
                   idx % rhalf, pos);
  __syncthreads();
  const int64_t seq = r / a.pages.rows_per_seq;
  uint8_t* page = a.pages.tables[seq * a.pages.table_stride + kv_page_of(pos, a.geom.page_tokens)];
  const int32_t slot = kv_slot_of(pos, a.geom.page_tokens);
  const int32_t nk = a.n_kv_heads * half;
  for (int32_t idx = threadIdx.x; idx < 2 * nk; idx += blockDim.x) {
    const int32_t kv = idx / nk, i = idx % nk, h = i / half, j = i % half;
    const float* v = row + int64_t(a.n_heads + kv * a.n_kv_heads + h) * hd + 2 * j;
    store_pair<KvT>(page, kv_row_index(a.geom, a.layer, kv, h, slot) * hd + 2 * j, v[0], v[1]);
  }
}

// ---------------------------------------------------------------- QK-norm, bias, residual, scale

// Block per (row, head).
__global__ void head_rmsnorm_kernel(float* x, int64_t ld, int32_t n_heads, int32_t hd, const float* w, float eps) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x / n_heads;
  float* v = x + r * ld + int64_t(blockIdx.x % n_heads) * hd;
  float ss = 0.f;
  for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
  const float inv = rms_inv(block_sum(ss, red), hd, eps);
  for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) v[i] = w[i] * (inv * v[i]);
}

__global__ void add_bias_kernel(float* y, int64_t ld, int64_t n, const float* b, int64_t cols) {
  const int64_t total = n * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    y[(i / cols) * ld + i % cols] += b[i % cols];
}

// Block per row: o = y (+ bias), o = w * rmsnorm(o) when w, x += o.
__global__ void residual_kernel(const float* y, const float* bias, const float* w, int64_t dim, float eps, float* x) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* yr = y + r * dim;
  float* xr = x + r * dim;
  if (w == nullptr) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += bias ? yr[i] + bias[i] : yr[i];
    return;
  }
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float o = bias ? yr[i] + bias[i] : yr[i];
    ss += o * o;
  }
  const float inv = rms_inv(block_sum(ss, red), dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float o = bias ? yr[i] + bias[i] : yr[i];
    xr[i] += w[i] * (inv * o);
  }
}

__global__ void scale_kernel(float* x, int64_t n, float s, bool softcap) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = softcap ? softcap_value(x[i], s) : x[i] * s;
}

// ---------------------------------------------------------------- gated activation, convert

template <bool kGelu>
__global__ void gated_kernel(const float* gu, int64_t n, int64_t hidden, float* h) {
  const int64_t total = n * hidden;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / hidden, j = i % hidden;
    const float g = gu[r * 2 * hidden + j], u = gu[r * 2 * hidden + hidden + j];
    h[i] = kGelu ? gelu_tanh_mul(g, u) : silu_mul(g, u);
  }
}

__global__ void convert_kernel(const float* x, int64_t n, uint16_t* out, bool bf16) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = bf16 ? float_to_bf16_bits(x[i]) : float_to_f16_bits(x[i]);
}

// ---------------------------------------------------------------- argmax / top-k

// Block-wide best (value, id) by logit_better; every thread gets the winner.
__device__ __forceinline__ void block_best(float* v, int32_t* id, float* sv, int32_t* si) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), n_warps = int(blockDim.x >> 5);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, *id, o);
    if (logit_better(ov, oi, *v, *id)) {
      *v = ov;
      *id = oi;
    }
  }
  __syncthreads();  // sv/si may still be read from the previous call
  if (lane == 0) {
    sv[warp] = *v;
    si[warp] = *id;
  }
  __syncthreads();
  *v = sv[0];
  *id = si[0];
  for (int w = 1; w < n_warps; ++w)
    if (logit_better(sv[w], si[w], *v, *id)) {
      *v = sv[w];
      *id = si[w];
    }
}

constexpr int32_t kNoId = 0x7fffffff;  // sentinel: worse than every real entry

__global__ void argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int32_t bi = kNoId;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (logit_better(row[i], int32_t(i), bv, bi)) {
      bv = row[i];
      bi = int32_t(i);
    }
  block_best(&bv, &bi, sv, si);
  if (threadIdx.x == 0) out[blockIdx.x] = bi;
}

// Selection by repeated "best strictly after the previous pick": the order
// is total (ties by id), so k rounds give the k best without marking anything.
// values/ids: candidates [n]; ids may be null (then id = index + id_base).
__device__ __forceinline__ void select_k(const float* values, const int32_t* ids, int64_t n, int64_t id_base, int k, float* out_v,
                         int32_t* out_i, float* sv, int32_t* si) {
  float last_v = 0.f;
  int32_t last_i = -1;
  for (int it = 0; it < k; ++it) {
    float bv = -INFINITY;
    int32_t bi = kNoId;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = values[j];
      const int32_t id = ids ? ids[j] : int32_t(id_base + j);
      if (id == kNoId) continue;
      if (it > 0 && !logit_better(last_v, last_i, v, id)) continue;
      if (logit_better(v, id, bv, bi)) {
        bv = v;
        bi = id;
      }
    }
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
      out_v[it] = bv;
      out_i[it] = bi;
    }
    last_v = bv;
    last_i = bi;
  }
}

// Stage 1: block (s, row) takes the k best of slice s of the row.
__global__ void topk_stage1(const float* logits, int64_t vocab, int64_t slice, int k, float* cand_v,
                            int32_t* cand_i) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int64_t row = blockIdx.y, s = blockIdx.x;
  const int64_t b = s * slice, e = min64(b + slice, vocab);
  const int64_t off = (row * gridDim.x + s) * k;
  select_k(logits + row * vocab + b, nullptr, max64(e - b, 0), b, k, cand_v + off, cand_i + off, sv, si);
}

// Stage 2: block per row merges the n_slices * k candidates.
__global__ void topk_stage2(const float* cand_v, const int32_t* cand_i, int64_t n_cand, int k, float* out_v,
                            int32_t* out_i) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int64_t row = blockIdx.x;
  select_k(cand_v + row * n_cand, cand_i + row * n_cand, n_cand, 0, k, out_v + row * k, out_i + row * k, sv, si);
}

// ---------------------------------------------------------------- kv shift (eviction)

template <typename KvT>
__device__ __forceinline__ float load_elem(const uint8_t* page, int64_t elem) {
  if constexpr (sizeof(KvT) == 4)
    return reinterpret_cast<const float*>(page)[elem];
  else
    return f16_bits_to_float(reinterpret_cast<const uint16_t*>(page)[elem]);
}

template <typename KvT>
__device__ __forceinline__ void store_elem(uint8_t* page, int64_t elem, float v) {
  if constexpr (sizeof(KvT) == 4)
    reinterpret_cast<float*>(page)[elem] = v;
  else
    reinterpret_cast<uint16_t*>(page)[elem] = float_to_f16_bits(v);
}

// Block per (layer, K/V, head). Thread unit u < rope_dims / 2 moves the two
// dimensions of rotation pair u (keys turn by -delta positions); the units
// after it move one pass-through dimension each. Each thread walks the
// moved slots in ascending order, so in-place moves never overwrite a slot
// before it was read (dst = src - delta < src), and threads never share
// elements.
template <typename KvT>
__global__ void kv_shift_kernel(KvShiftArgs a) {
  const int32_t hd = a.geom.head_dim, rhalf = a.rope_dims / 2;
  const int32_t head = int32_t(blockIdx.x) % a.geom.n_kv_heads;
  const int32_t kv = (int32_t(blockIdx.x) / a.geom.n_kv_heads) % 2;
  const int32_t layer = int32_t(blockIdx.x) / (2 * a.geom.n_kv_heads);
  const int32_t pt = a.geom.page_tokens;
  const float* inv_freq = a.inv_freq + int64_t(layer) * rhalf;
  const int32_t units = rhalf + (hd - a.rope_dims);
  for (int32_t u = threadIdx.x; u < units; u += blockDim.x) {
    int32_t d0, d1;
    if (u < rhalf) {
      rope_pair_dims(a.rope_kind, a.rope_dims, u, &d0, &d1);
    } else {
      d0 = a.rope_dims + (u - rhalf);
      d1 = -1;
    }
    for (int32_t t = 0; t < a.n_moved; ++t) {
      const int32_t src = a.first_moved + t, dst = src - a.delta;
      const uint8_t* ps = a.table[kv_page_of(src, pt)];
      uint8_t* pd = a.table[kv_page_of(dst, pt)];
      const int64_t rs = kv_row_index(a.geom, layer, kv, head, kv_slot_of(src, pt)) * hd;
      const int64_t rd = kv_row_index(a.geom, layer, kv, head, kv_slot_of(dst, pt)) * hd;
      float v0 = load_elem<KvT>(ps, rs + d0);
      if (d1 < 0) {
        store_elem<KvT>(pd, rd + d0, v0);
        continue;
      }
      float v1 = load_elem<KvT>(ps, rs + d1);
      if (kv == 0) rope_rotate_scaled(&v0, &v1, -float(a.delta) * inv_freq[u], 1.0f);
      store_elem<KvT>(pd, rd + d0, v0);
      store_elem<KvT>(pd, rd + d1, v1);
    }
  }
}

int grid_for(int64_t n, int threads) { return int(std::min<int64_t>(std::max<int64_t>((n + threads - 1) / threads, 1), 65535)); }

}  // namespace

cudaError_t launch_rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64;
  rmsnorm_kernel<<<unsigned(rows), threads, 0, stream>>>(x, w, dim, eps, y);
  return cudaGetLastError();
}

cudaError_t launch_head_rmsnorm(float* x, int64_t ld, int64_t n, int32_t n_heads, int32_t head_dim, const float* w,
                                float eps, cudaStream_t stream) {
  if (n <= 0 || n_heads <= 0) return cudaSuccess;
  const int threads = head_dim >= 256 ? 256 : head_dim >= 128 ? 128 : head_dim >= 64 ? 64 : 32;
  head_rmsnorm_kernel<<<unsigned(n * n_heads), threads, 0, stream>>>(x, ld, n_heads, head_dim, w, eps);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(float* y, int64_t ld, int64_t n, const float* b, int64_t cols, cudaStream_t stream) {
  if (n <= 0 || cols <= 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(n * cols, 256), 256, 0, stream>>>(y, ld, n, b, cols);
  return cudaGetLastError();
}

cudaError_t launch_residual(const float* y, const float* bias, const float* w, int64_t rows, int64_t dim, float eps,
                            float* x, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64;
  residual_kernel<<<unsigned(rows), threads, 0, stream>>>(y, bias, w, dim, eps, x);
  return cudaGetLastError();
}

cudaError_t launch_scale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, s, false);
  return cudaGetLastError();
}

cudaError_t launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, cap, true);
  return cudaGetLastError();
}

cudaError_t launch_rope_store_kv(const RopeKvArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return cudaSuccess;
  const int64_t work = int64_t(a.n_heads + 2 * a.n_kv_heads) * (a.head_dim / 2);
  const int threads = work >= 256 ? 256 : int((work + 31) / 32 * 32);
  if (a.kv_f32)
    rope_store_kv_kernel<float><<<unsigned(a.n), threads, 0, stream>>>(a);
  else
    rope_store_kv_kernel<uint16_t><<<unsigned(a.n), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_gated(const float* gu, int64_t n, int64_t hidden, bool gelu, float* h, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (gelu)
    gated_kernel<true><<<grid_for(n * hidden, 256), 256, 0, stream>>>(gu, n, hidden, h);
  else
    gated_kernel<false><<<grid_for(n * hidden, 256), 256, 0, stream>>>(gu, n, hidden, h);
  return cudaGetLastError();
}

cudaError_t launch_convert(const float* x, int64_t n, uint16_t* out, bool bf16, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  convert_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, out, bf16);
  return cudaGetLastError();
}

cudaError_t launch_argmax(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  argmax_kernel<<<unsigned(n_rows), 1024, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

int64_t topk_scratch_elems(int64_t n_rows, int64_t vocab, int k) { return n_rows * topk_slices(vocab) * k; }

cudaError_t launch_topk(const float* logits, int64_t n_rows, int64_t vocab, int k, float* scratch_v,
                        int32_t* scratch_i, float* out_v, int32_t* out_i, cudaStream_t stream) {
  if (n_rows <= 0 || k <= 0) return cudaSuccess;
  if (k > kMaxTopK || k > vocab) return cudaErrorInvalidValue;
  const int64_t slices = topk_slices(vocab);
  const int64_t slice = (vocab + slices - 1) / slices;
  topk_stage1<<<dim3(unsigned(slices), unsigned(n_rows)), 256, 0, stream>>>(logits, vocab, slice, k, scratch_v,
                                                                            scratch_i);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  topk_stage2<<<unsigned(n_rows), 256, 0, stream>>>(scratch_v, scratch_i, slices * k, k, out_v, out_i);
  return cudaGetLastError();
}

cudaError_t launch_kv_shift(const KvShiftArgs& a, cudaStream_t stream) {
  if (a.n_moved <= 0 || a.delta <= 0) return cudaSuccess;
  const int blocks = a.geom.n_layers * 2 * a.geom.n_kv_heads;
  const int units = a.rope_dims / 2 + (a.geom.head_dim - a.rope_dims);
  const int threads = units >= 128 ? 128 : (units + 31) / 32 * 32;
  if (a.kv_f32)
    kv_shift_kernel<float><<<blocks, threads, 0, stream>>>(a);
  else
    kv_shift_kernel<uint16_t><<<blocks, threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace llm::cuda
