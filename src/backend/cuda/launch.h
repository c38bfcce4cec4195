// Kernel launchers of the CUDA backend (implemented in gemv.cu,
// elementwise.cu, attention.cu). Host code calls only these. Each launcher
// validates nothing the caller already checked, launches on `stream`, and
// returns the launch's cudaError_t; it never exits, prints or throws.
// Only compiled when LLM_WITH_CUDA is set.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/block_pass.h"
#include "backend/cuda/kernel_math.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/weight_layout.h"

namespace llm::cuda {

// A weight matrix in device memory, layout as in kernel_math.h.
struct DeviceMatrix {
  MatrixLayout layout;
  const uint8_t* data = nullptr;     // [rows][pitch] bytes
  const uint16_t* scales = nullptr;  // [rows][groups_per_row] f16 bits (q8/q4; null for Ggml)
};

// ---------------------------------------------------------------- gemv.cu

// y[b, r] = sum_k W[r, k] x[b, k] + beta * y[b, r]   for b < n, r < rows.
// x: [n, cols] f32, row stride ldx (multiple of 4); y: row stride ldy.
// Fused dequantization, 16-byte weight loads; n > 8 runs in passes of 8
// (each pass streams W once). beta is 0 or 1 (1 = residual add epilogue).
// scratch: device memory of gemv_scratch_floats(w.layout) floats, where
// each pass first lays out its activations for coalesced loads (x and y
// must not overlap it); none for the formats that read x's rows.
cudaError_t launch_gemv(const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                        float beta, float* scratch, int sm_count, cudaStream_t stream);
inline int64_t gemv_scratch_floats(const MatrixLayout& l) {
  if (!gemv_x_chunk_major(l.format)) return 0;
  const int64_t per_row = l.format == WFormat::Ggml ? l.cols : l.chunks_per_row() * chunk_values(l.format);
  return int64_t(kGemvMaxBatch) * per_row;
}

// out[i, :] = row (r0 + i) of W as f16 (or bf16) bits, i < n; out: [n, cols].
// The prefill GEMM dequantizes quantized weights (q8/q4/Ggml) tile-wise with this.
cudaError_t launch_dequant(const DeviceMatrix& w, int64_t r0, int64_t n, uint16_t* out, bool bf16,
                           cudaStream_t stream);

// x[i, :] = row tokens[i] of the embedding table, as f32; x: [n, cols].
cudaError_t launch_embed(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x, cudaStream_t stream);

// The same three for WFormat::Ggml matrices (GGUF blocks as stored,
// gemv_ggml.cu); the launchers above forward to them. Same contracts;
// cudaErrorInvalidValue for a matrix of another format.
cudaError_t launch_gemv_ggml(const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                             float beta, float* scratch, int sm_count, cudaStream_t stream);
cudaError_t launch_dequant_ggml(const DeviceMatrix& w, int64_t r0, int64_t n, uint16_t* out, bool bf16,
                                cudaStream_t stream);
cudaError_t launch_embed_ggml(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x,
                              cudaStream_t stream);

// ---------------------------------------------------------------- elementwise.cu

// y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps); x, y: [rows, dim]; w: [dim].
cudaError_t launch_rmsnorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                           cudaStream_t stream);

// Per-head RMSNorm in place (QK-norm): heads [h * head_dim, (h + 1) * head_dim)
// of rows x + r * ld, h < n_heads, r < n, each normalised with w [head_dim].
cudaError_t launch_head_rmsnorm(float* x, int64_t ld, int64_t n, int32_t n_heads, int32_t head_dim, const float* w,
                                float eps, cudaStream_t stream);

// y[r, c] += b[c] for r < n, c < cols; y has row stride ld.
cudaError_t launch_add_bias(float* y, int64_t ld, int64_t n, const float* b, int64_t cols, cudaStream_t stream);

// The residual add of a block output that needs more than the GEMV's fused
// add: x[r, :] += o with o = y[r, :] (+ bias), then (when w is given)
// o = w * rmsnorm(o) (post-attention / post-feed-forward norm). bias and w
// may be null. y, x: [rows, dim].
cudaError_t launch_residual(const float* y, const float* bias, const float* w, int64_t rows, int64_t dim, float eps,
                            float* x, cudaStream_t stream);

// x[i] *= s (embedding scale), or x[i] = cap * tanh(x[i] / cap) (final-logit softcap), i < n.
cudaError_t launch_scale(float* x, int64_t n, float s, cudaStream_t stream);
cudaError_t launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// Page tables: for sequence s, tables[s * table_stride + p] is the device
// address of its page p. Row r of a batch belongs to sequence r / rows_per_seq
// (decode: 1 row per sequence; prefill: all rows of one sequence).
struct PageTables {
  uint8_t* const* tables = nullptr;
  int32_t table_stride = 0;
  int64_t rows_per_seq = 1;
};

// RoPE on q and k of qkv rows, then K and V of each row stored into the
// sequence's page at slot pos[r] (f16 with round-to-nearest-even, or f32).
// qkv: [n, ld] with q heads, then k heads, then v heads (head_dim each).
struct RopeKvArgs {
  float* qkv = nullptr;
  int64_t ld = 0;
  int64_t n = 0;
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  RopeSpec rope;                 // inv_freq in device memory
  const int32_t* pos = nullptr;  // [n]
  PageTables pages;
  KvGeom geom;
  int32_t layer = 0;
  bool kv_f32 = false;
};
cudaError_t launch_rope_store_kv(const RopeKvArgs& a, cudaStream_t stream);

// h[r, j] = act(gu[r, j]) * gu[r, hidden + j]; gu: [n, 2 * hidden]; h: [n, hidden];
// act is SiLU, or GELU (tanh form, kernel_math.h's gelu_tanh_mul) when gelu is set.
cudaError_t launch_gated(const float* gu, int64_t n, int64_t hidden, bool gelu, float* h, cudaStream_t stream);

// out[i] = x[i] as f16 (or bf16) bits, i < n (GEMM inputs).
cudaError_t launch_convert(const float* x, int64_t n, uint16_t* out, bool bf16, cudaStream_t stream);

// out[r] = argmax of logits[r, :vocab] (lowest id on ties, NaN as -inf).
cudaError_t launch_argmax(const float* logits, int64_t n_rows, int64_t vocab, int32_t* out, cudaStream_t stream);

// The k best (value, id) of each row, best first, same order as argmax.
// k <= kMaxTopK. scratch: topk_scratch_elems() floats and ints.
constexpr int kMaxTopK = 256;
int64_t topk_scratch_elems(int64_t n_rows, int64_t vocab, int k);
cudaError_t launch_topk(const float* logits, int64_t n_rows, int64_t vocab, int k, float* scratch_v,
                        int32_t* scratch_i, float* out_v, int32_t* out_i, cudaStream_t stream);

// Eviction: slots [first_moved, first_moved + n_moved) of one sequence move
// down by delta slots in every layer and KV head; keys are rotated by -delta
// positions (as the CPU's Session::evict_cached: a pure rotation, no mscale).
// In place.
struct KvShiftArgs {
  uint8_t* const* table = nullptr;  // the sequence's page pointers
  KvGeom geom;
  bool kv_f32 = false;
  int32_t first_moved = 0;
  int32_t n_moved = 0;
  int32_t delta = 0;
  const float* inv_freq = nullptr;  // device [n_layers][rope_dims / 2]: each layer's frequencies
  int32_t rope_kind = 0;
  int32_t rope_dims = 0;
};
cudaError_t launch_kv_shift(const KvShiftArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- attention.cu

// Causal GQA attention over the paged cache with an online softmax over key
// tiles of kAttnTile (scores never materialised beyond one tile).
// Query row r sees keys [0, pos[r]] (the last `window` of them when window
// > 0, attn_key_visible); rows of one block belong to one
// sequence. n_splits > 1 (decode) splits each row's keys into chunks of
// split_tokens, writes partial (m, l, acc) and merges them in a second kernel.
struct AttnArgs {
  const float* q = nullptr;  // [n_rows, q_ld]; head h at column h * head_dim (RoPE applied)
  int64_t q_ld = 0;
  const int32_t* pos = nullptr;  // [n_rows]
  PageTables pages;
  KvGeom geom;
  int32_t layer = 0;
  bool kv_f32 = false;
  int32_t n_heads = 0;
  float scale = 1.f;             // of q.k: 1 / sqrt(head_dim), or the model's query scale
  float softcap = 0.f;           // > 0: score = softcap * tanh(score / softcap)
  int32_t window = 0;            // > 0: sliding-window layer
  int64_t n_rows = 0;
  int32_t rows_per_block = 1;    // prefill_rows_per_block(); 1 for decode
  int32_t split_tokens = 1 << 30;
  int32_t n_splits = 1;
  float* out = nullptr;          // [n_rows, out_ld], head h at column h * head_dim
  int64_t out_ld = 0;
  float* part_ml = nullptr;      // [n_rows, n_heads, n_splits, 2]   (n_splits > 1)
  float* part_acc = nullptr;     // [n_rows, n_heads, n_splits, head_dim]
};
cudaError_t launch_attention(const AttnArgs& a, cudaStream_t stream);

// One-time setup (shared-memory opt-in of the attention kernel) for the current device.
cudaError_t attention_setup();

}  // namespace llm::cuda
