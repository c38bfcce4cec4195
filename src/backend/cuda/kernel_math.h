// Per-element math, index layouts and small planning rules of the CUDA
// kernels, written once as __host__ __device__ functions. The kernels call
// them on the GPU; tests/gpu/*_cpu_test.cpp call the very same functions on
// the CPU, so everything but the parallel skeleton (threads, shared memory,
// shuffles) is verified on machines without a GPU.
//
// This header compiles with nvcc and with the host C++ compiler; it holds no
// CUDA API calls.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>

#include "core/half.h"
#include "core/silu.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define LLM_HD __host__ __device__ inline
#else
#define LLM_HD inline
#endif

namespace llm::cuda {

// ---------------------------------------------------------------- scalars

LLM_HD float f16_bits_to_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffffu)));
#else
  return ::llm::f16_to_f32(uint16_t(h & 0xffffu));
#endif
}

LLM_HD float bf16_bits_to_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float((h & 0xffffu) << 16);
#else
  return ::llm::bf16_to_f32(uint16_t(h & 0xffffu));
#endif
}

// Round to nearest even, like llm::f32_to_f16 (the CPU KV cache's store_row).
LLM_HD uint16_t float_to_f16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return ::llm::f32_to_f16(f);
#endif
}

LLM_HD uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  return ::llm::f32_to_bf16(f);
#endif
}

LLM_HD float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return ::llm::bits_to_f32(u);
#endif
}

// ---------------------------------------------------------------- weights on the device
//
// Device matrices are stored row by row with a row pitch that is a multiple
// of 16 bytes, so a warp reads each row with 16-byte vector loads ("chunks").
// Quantized formats keep their f16 scales in a separate array
// [rows][groups_per_row], so quant bytes stay 16-byte aligned:
//
//   F32 / F16 / BF16 : the row's values, zero padded to the pitch
//   Q8               : int8 q[cols] (value = d * q, one d per 32 values)
//   Q4               : byte k holds value 2k (low nibble) and 2k + 1 (high
//                      nibble), value = d * (nibble - 8), one d per group of G.
//                      (dtype.h's Q4 keeps j and j + G/2 in one byte; the
//                      upload repacks to consecutive pairs so a 16-byte chunk
//                      is 32 consecutive values.)
//   Ggml             : GGUF blocks (Q5_0 .. IQ4_XS, quant/dtype.h) byte for
//                      byte as stored, scales inside the blocks, rows of whole
//                      blocks; MatrixLayout::block says which type. Their
//                      math is in ggml_blocks.h, their kernels in gemv_ggml.cu
//                      (not decode_chunk / dot_chunk).
// Tails: values past `cols` are zero and are never multiplied with
// activations (the kernels guard activation reads at 4-float granularity, so
// cols must be a multiple of 4).
enum class WFormat : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4, Ggml = 5 };

constexpr int kChunkBytes = 16;

LLM_HD constexpr int chunk_values(WFormat f) {
  return f == WFormat::F32 ? 4 : (f == WFormat::F16 || f == WFormat::BF16) ? 8 : f == WFormat::Q8 ? 16 : 32;
}
LLM_HD constexpr bool is_quantized(WFormat f) { return f == WFormat::Q8 || f == WFormat::Q4 || f == WFormat::Ggml; }

// One 16-byte vector load, little-endian words.
struct alignas(16) Chunk {
  uint32_t w[4];
};

// Byte k (0..15) of a chunk.
LLM_HD uint32_t chunk_byte(const Chunk& c, int k) { return (c.w[k >> 2] >> ((k & 3) * 8)) & 0xffu; }

// Decodes one chunk into chunk_values(F) floats. `scale` is the group's d
// (ignored for float formats). Bit-exact with llm::dequantize_row.
template <WFormat F>
LLM_HD void decode_chunk(const Chunk& c, float scale, float* out) {
  if constexpr (F == WFormat::F32) {
    for (int i = 0; i < 4; ++i) out[i] = bits_as_float(c.w[i]);
  } else if constexpr (F == WFormat::F16) {
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = f16_bits_to_float(c.w[i]);
      out[2 * i + 1] = f16_bits_to_float(c.w[i] >> 16);
    }
  } else if constexpr (F == WFormat::BF16) {
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = bf16_bits_to_float(c.w[i]);
      out[2 * i + 1] = bf16_bits_to_float(c.w[i] >> 16);
    }
  } else if constexpr (F == WFormat::Q8) {
    for (int k = 0; k < 16; ++k) out[k] = scale * float(int(int8_t(uint8_t(chunk_byte(c, k)))));
  } else {
    for (int k = 0; k < 16; ++k) {
      const uint32_t b = chunk_byte(c, k);
      out[2 * k] = scale * float(int(b & 15u) - 8);
      out[2 * k + 1] = scale * float(int(b >> 4) - 8);
    }
  }
}

// sum_i w_i * x_i over one chunk whose values decode_chunk<F>(c, 1.f, v)
// gave; `n_valid` (a multiple of 4, <= chunk_values) limits the activation
// reads at the end of a row. For quantized formats the scale is applied once
// per chunk: scale * sum(q * x). The GEMV kernels decode a chunk once and dot
// it with each of a batch's activation rows through this, and dot_chunk
// below is the same operations, so a batch row and a row alone agree to the bit.
template <WFormat F>
LLM_HD float dot_decoded(const float* v, float scale, const float* x, int n_valid) {
  constexpr int V = chunk_values(F);
  float acc = 0.f;
  if constexpr (F == WFormat::Q4) {
    for (int k = 0; k < V / 2; ++k) {
      if (2 * k >= n_valid) break;
      acc += v[2 * k] * x[2 * k] + v[2 * k + 1] * x[2 * k + 1];
    }
  } else {
    for (int k = 0; k < V; ++k)
      if (k < n_valid) acc += v[k] * x[k];
  }
  return is_quantized(F) ? acc * scale : acc;
}

// dot_decoded of the chunk's own values.
template <WFormat F>
LLM_HD float dot_chunk(const Chunk& c, float scale, const float* x, int n_valid) {
  float v[chunk_values(F)];
  decode_chunk<F>(c, 1.f, v);
  return dot_decoded<F>(v, scale, x, n_valid);
}

// Whether the GEMV kernels read activations chunk-major (gemv_common.cuh):
// at 16 and 32 values per chunk the lanes' row-layout loads spread over 16 or
// 32 cache lines each; at 4 and 8 the layout pass costs more than it saves
// (measured for f16 on an H200).
LLM_HD constexpr bool gemv_x_chunk_major(WFormat f) { return chunk_values(f) >= 16; }

// Index of the scale (group) of the chunk that starts at value `first`.
LLM_HD int64_t chunk_group(int64_t first, int32_t group) { return group > 0 ? first / group : 0; }

// ---------------------------------------------------------------- KV pages
//
// Device pages use the host page layout of kv/kv_cache.h, so a page can be
// copied between host and device byte for byte (session save/restore):
//   [n_layers][2 (K, V)][n_kv_heads][page_tokens][head_dim]  (f16 or f32)
// Page tables hold device pointers to page starts.
struct KvGeom {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_tokens = 16;
};

// Row index (in units of head_dim elements) of (layer, kv, head, slot) within a page.
LLM_HD int64_t kv_row_index(const KvGeom& g, int32_t layer, int32_t kv, int32_t head, int32_t slot) {
  return ((int64_t(layer) * 2 + kv) * g.n_kv_heads + head) * g.page_tokens + slot;
}

// Page index and slot of sequence position `pos`.
LLM_HD int32_t kv_page_of(int64_t pos, int32_t page_tokens) { return int32_t(pos / page_tokens); }
LLM_HD int32_t kv_slot_of(int64_t pos, int32_t page_tokens) { return int32_t(pos % page_tokens); }

// ---------------------------------------------------------------- element-wise ops

// 1 / sqrt(mean(x^2) + eps); y = w * (inv * x) exactly as cpu::rmsnorm.
LLM_HD float rms_inv(float sumsq, int64_t dim, float eps) { return 1.0f / sqrtf(sumsq / float(dim) + eps); }

// cpu::silu_mul for one element.
LLM_HD float silu_mul(float g, float u) { return ::llm::silu::silu_mul(g, u); }

// RoPE of a block spec (format/family_spec.h), as cpu::rope: pair j of the
// first rope_dims dimensions of a head is (2j, 2j + 1) when interleaved
// (kind 0) and (j, j + rope_dims / 2) under NeoX (kind 1); the dimensions
// past rope_dims pass through. Its angle is pos * inv_freq[j] (the model's
// per-layer table: base, linear / YaRN scaling and frequency factors folded
// in), and cos and sin are multiplied by mscale (YaRN, LongRoPE).
LLM_HD void rope_pair_dims(int32_t kind, int32_t rope_dims, int32_t j, int32_t* d0, int32_t* d1) {
  *d0 = kind == 0 ? 2 * j : j;
  *d1 = kind == 0 ? 2 * j + 1 : j + rope_dims / 2;
}
LLM_HD void rope_rotate_scaled(float* v0, float* v1, float angle, float mscale) {
  float c = cosf(angle), s = sinf(angle);
  if (mscale != 1.0f) {
    c *= mscale;
    s *= mscale;
  }
  const float a = *v0, b = *v1;
  *v0 = a * c - b * s;
  *v1 = a * s + b * c;
}
// Rotates pair j of `head` (head_dim floats) at position pos (negative: eviction's re-rotation).
LLM_HD void rope_spec_pair(float* head, int32_t kind, int32_t rope_dims, const float* inv_freq, float mscale,
                           int32_t j, int64_t pos) {
  int32_t d0, d1;
  rope_pair_dims(kind, rope_dims, j, &d0, &d1);
  rope_rotate_scaled(&head[d0], &head[d1], float(pos) * inv_freq[j], mscale);
}

// The gated feed-forward's GELU (tanh form) times up, with cpu::gelu_tanh_mul's
// numerics: evaluated at the gate rounded to f16, the result rounded to f16,
// x above 10 and 0 below -10.
LLM_HD float gelu_tanh_mul(float g, float u) {
  const float v = f16_bits_to_float(float_to_f16_bits(g));
  float r;
  if (v >= 10.0f) {
    r = v;
  } else if (v <= -10.0f) {
    r = 0.0f;
  } else {
    const float k = 0.79788456080286535588f;  // sqrt(2 / pi)
    r = 0.5f * v * (1.0f + tanhf(k * v * (1.0f + 0.044715f * v * v)));
  }
  return f16_bits_to_float(float_to_f16_bits(r)) * u;
}

// cap * tanh(x / cap), as cpu::softcap (attention scores, final logits).
LLM_HD float softcap_value(float x, float cap) { return cap * tanhf(x * (1.0f / cap)); }

// Whether the query at position pos sees the key at t: causal, and within
// the last `window` positions when window > 0 (as cpu::attention).
LLM_HD bool attn_key_visible(int64_t t, int64_t pos, int32_t window) {
  return t <= pos && (window <= 0 || t > pos - window);
}
// The first key the query at pos sees.
LLM_HD int64_t attn_first_key(int64_t pos, int32_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// ---------------------------------------------------------------- softmax pieces
//
// Attention keeps, per query, a running max m, a running sum l of
// exp(s - m) and an unnormalised accumulator acc = sum exp(s - m) v. A new
// block of scores (tile or split) with its own (m_b, l_b, acc_b) merges as
//   m = max(m_a, m_b); acc = acc_a * e^(m_a - m) + acc_b * e^(m_b - m); same for l.
// -inf marks "no keys seen yet"; it must never produce NaN.
LLM_HD float exp_or_zero(float s, float m) { return s == -INFINITY ? 0.f : expf(s - m); }

struct MergeFactors {
  float m;   // merged max
  float fa;  // factor for the a side
  float fb;  // factor for the b side
};
LLM_HD MergeFactors softmax_merge(float m_a, float m_b) {
  MergeFactors r;
  r.m = m_a > m_b ? m_a : m_b;
  r.fa = r.m == -INFINITY ? 0.f : exp_or_zero(m_a, r.m);
  r.fb = r.m == -INFINITY ? 0.f : exp_or_zero(m_b, r.m);
  return r;
}

// Final output of a merged state: acc / l (0 when no key was visible).
LLM_HD float softmax_finish(float acc, float l) { return l > 0.f ? acc / l : 0.f; }

// ---------------------------------------------------------------- attention tiling
//
// Keys are processed in tiles of kAttnTile consecutive positions staged in
// shared memory. Decode splits the key range of a sequence into n_splits
// chunks of split_tokens (a multiple of kAttnTile); each block writes a
// partial (m, l, acc) and a reduce kernel merges them (flash-decoding).
constexpr int kAttnTile = 32;
constexpr int kAttnThreads = 256;
constexpr int kAttnMaxAcc = 16;       // accumulators per thread: queries_per_block * head_dim <= 256 * 16
constexpr int kAttnMaxQueries = 64;   // query vectors per block (rows x heads of one KV group)
constexpr int kAttnMaxHeadDim = 256;

// Keys [begin, end) of split s over n_keys keys.
LLM_HD void split_range(int32_t s, int32_t split_tokens, int32_t n_keys, int32_t* begin, int32_t* end) {
  const int64_t b = int64_t(s) * split_tokens;
  const int64_t e = b + split_tokens;
  *begin = int32_t(b < n_keys ? b : n_keys);
  *end = int32_t(e < n_keys ? e : n_keys);
}

// Query vector qi of a block (rows x group heads of one KV head kvh): its
// row in the tile and its query head.
LLM_HD void attn_query_of(int32_t qi, int32_t group, int32_t kvh, int32_t* row, int32_t* head) {
  *row = qi / group;
  *head = kvh * group + qi % group;
}

// Greedy comparison: a beats b if larger, lower id on ties; NaN counts as -inf.
LLM_HD bool logit_better(float va, int32_t ia, float vb, int32_t ib) {
  if (va != va) va = -INFINITY;
  if (vb != vb) vb = -INFINITY;
  return va > vb || (va == vb && ia < ib);
}

// Top-k runs in two stages: each of topk_slices(vocab) slices of a row
// keeps its k best, then one block picks the k best of those candidates.
// Both stages select by "best entry strictly worse than the previous pick"
// under logit_better, a total order, so nothing needs marking.
LLM_HD int64_t topk_slices(int64_t vocab) {
  const int64_t s = (vocab + 4095) / 4096;
  return s < 1 ? 1 : s > 64 ? 64 : s;
}

}  // namespace llm::cuda
