// Weight-streaming kernels: fused dequantize + GEMV (decode), dequantize to
// f16/bf16 (prefill GEMM tiles), embedding lookup. Per-element work is
// decode_chunk / dot_chunk of kernel_math.h (tested on the CPU); this file
// is the parallel skeleton only. GGUF block weights (WFormat::Ggml) have
// their own kernels in gemv_ggml.cu; the launchers below forward to them.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/plan.h"

namespace llm::cuda {

namespace {

struct GemvParams {
  const uint8_t* w;        // [rows][pitch]
  const uint16_t* scales;  // [rows][groups_per_row]
  int64_t rows, cols, pitch, chunks;
  int32_t group, groups_per_row;
  const float* x;    // [nb][ldx]: the pass's activations, row layout
  int64_t ldx;
  const float4* xt;  // the same chunk-major (gemv_prepare_x), where gemv_x_chunk_major(F)
  int32_t nb;        // live activation rows (<= NB)
  float* y;        // [nb][ldy]
  int64_t ldy;
  float beta;
  int32_t warps_per_row;
};

// Block = 8 warps. A warp owns R consecutive rows (R = 2 only when each row
// has one warp), or 1 / warps_per_row of one row. The warps of a row stride
// over its 16-byte chunks; each activation chunk is loaded once and dotted
// with the R rows' weights, for NB activation rows. With NB > 1 a weight
// chunk is decoded once and its values dotted with each row (dot_decoded;
// decoding per row made the batch ALU-bound: 4.4x the time of one row at
// NB = 8 for q4 on an H200).
template <WFormat F, int NB, int R>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvParams p) {
  constexpr int V = chunk_values(F);
  constexpr bool kChunkMajor = gemv_x_chunk_major(F);
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int wpr = p.warps_per_row;
  const int rows_per_block = (kGemvThreads / 32) * R / wpr;
  const int64_t row0 = int64_t(blockIdx.x) * rows_per_block + int64_t(warp / wpr) * R;
  const int sub = warp % wpr;

  float acc[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = 0.f;

  if (row0 < p.rows) {
#pragma unroll 2
    for (int64_t c = int64_t(sub) * 32 + lane; c < p.chunks; c += 32 * int64_t(wpr)) {
      const int64_t first = c * V;
      Chunk ch[R];
      float scale[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r < p.rows ? row0 + r : row0;  // past the end: recompute row0, discarded
        ch[r] = load_chunk(p.w + row * p.pitch + c * kChunkBytes);
        scale[r] = 1.f;
        if constexpr (is_quantized(F))
          scale[r] = f16_bits_to_float(__ldg(p.scales + row * p.groups_per_row + chunk_group(first, p.group)));
      }
      const int n_valid = int(min64(V, p.cols - first));
      float wv[NB > 1 ? R : 1][V];
      if constexpr (NB > 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) decode_chunk<F>(ch[r], 1.f, wv[r]);
      }
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (b < p.nb) {
          float xv[V];
          if constexpr (kChunkMajor)
            load_xt<V>(p.xt + b * (V / 4) * p.chunks, p.chunks, c, xv);
          else
            load_x<V>(p.x + b * p.ldx, first, n_valid, xv);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if constexpr (NB > 1)
              acc[r][b] += dot_decoded<F>(wv[r], scale[r], xv, n_valid);
            else
              acc[r][b] += dot_chunk<F>(ch[r], scale[r], xv, n_valid);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = warp_sum(acc[r][b]);
  if (wpr > 1) gemv_reduce_row_split<NB>(acc[0], warp, lane, sub, wpr);  // R == 1 here
  if (lane == 0 && sub == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= p.rows) break;
      gemv_store_row<NB>(p.y, p.ldy, row0 + r, p.nb, p.beta, acc[r]);
    }
  }
}

template <WFormat F>
cudaError_t gemv_dispatch_nb(const GemvParams& p, int nb_tile, int rows_per_warp, dim3 grid, cudaStream_t st) {
  switch (nb_tile) {
    case 1:
      if (rows_per_warp == 2)
        gemv_kernel<F, 1, 2><<<grid, kGemvThreads, 0, st>>>(p);
      else
        gemv_kernel<F, 1, 1><<<grid, kGemvThreads, 0, st>>>(p);
      break;
    case 2: gemv_kernel<F, 2, 1><<<grid, kGemvThreads, 0, st>>>(p); break;
    case 4: gemv_kernel<F, 4, 1><<<grid, kGemvThreads, 0, st>>>(p); break;
    default: gemv_kernel<F, 8, 1><<<grid, kGemvThreads, 0, st>>>(p); break;
  }
  return cudaGetLastError();
}

// Grid-stride over xt's float4s (gemv_common.cuh), in xt's order: the
// stores are coalesced, the strided reads of x (a few KiB) come from L2.
__global__ void gemv_prepare_x_kernel(const float* x, int64_t ldx, int64_t cols, int64_t nb, int q, int64_t chunks,
                                      float4* xt) {
  const int64_t per_row = int64_t(q) * chunks, total = nb * per_row;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = idx / per_row, r = idx % per_row, i = r / chunks, c = r % chunks;
    const int64_t first = c * 4 * q + 4 * i;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (first < cols) v = __ldg(reinterpret_cast<const float4*>(x + b * ldx + first));
    xt[idx] = v;
  }
}

// ---------------------------------------------------------------- dequantize / embed

// Thread per piece of P = min(V, 8) values (4 for f32 weights), grid-stride:
// consecutive threads write consecutive 16 (or 8) bytes of the output. (A
// thread per chunk wrote 4-byte pairs 64 bytes apart for q4, and the
// dequantized prefill of TinyLlama-shape q4 spent about 6 ms of its 17 there
// on an H200.) A thread decodes its piece's words only: the chunk with those
// words moved to the front, whose other values are never used.
template <WFormat F>
__global__ void dequant_kernel(const uint8_t* w, const uint16_t* scales, int64_t pitch, int64_t chunks, int64_t cols,
                               int32_t group, int32_t groups_per_row, int64_t r0, int64_t n, uint16_t* out,
                               bool bf16) {
  constexpr int V = chunk_values(F), P = V < 8 ? V : 8, kPieces = V / P, kWords = 4 / kPieces;
  const int64_t per_row = chunks * kPieces, total = n * per_row;
  const bool vector_store = cols % P == 0;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / per_row, rem = idx % per_row, c = rem / kPieces;
    const int j = int(rem % kPieces);
    const int64_t first = c * V + int64_t(j) * P;
    if (first >= cols) continue;
    const int64_t r = r0 + i;
    float scale = 1.f;
    if constexpr (is_quantized(F)) scale = f16_bits_to_float(__ldg(scales + r * groups_per_row + chunk_group(c * V, group)));
    const Chunk ch = load_chunk(w + r * pitch + c * kChunkBytes);
    Chunk part = ch;
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const int q = j * kWords + k;
      part.w[k] = q == 0 ? ch.w[0] : q == 1 ? ch.w[1] : q == 2 ? ch.w[2] : ch.w[3];
    }
    float v[V];
    decode_chunk<F>(part, scale, v);
    uint16_t h[P];
#pragma unroll
    for (int k = 0; k < P; ++k) h[k] = bf16 ? float_to_bf16_bits(v[k]) : float_to_f16_bits(v[k]);
    uint16_t* o = out + i * cols + first;
    if (vector_store) {
      uint32_t pairs[P / 2];
#pragma unroll
      for (int k = 0; k < P / 2; ++k) pairs[k] = uint32_t(h[2 * k]) | (uint32_t(h[2 * k + 1]) << 16);
      if constexpr (P == 8)
        *reinterpret_cast<uint4*>(o) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
      else
        *reinterpret_cast<uint2*>(o) = make_uint2(pairs[0], pairs[1]);
    } else {
      const int n_valid = int(min64(P, cols - first));
#pragma unroll
      for (int k = 0; k < P; ++k)
        if (k < n_valid) o[k] = h[k];
    }
  }
}

// Block per token: x[i, :] = decoded row tokens[i].
template <WFormat F>
__global__ void embed_kernel(const uint8_t* w, const uint16_t* scales, int64_t pitch, int64_t chunks, int64_t cols,
                             int32_t group, int32_t groups_per_row, const int32_t* tokens, float* x) {
  constexpr int V = chunk_values(F);
  const int64_t i = blockIdx.x;
  const int64_t r = tokens[i];
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const int64_t first = c * V;
    float scale = 1.f;
    if constexpr (is_quantized(F)) scale = f16_bits_to_float(__ldg(scales + r * groups_per_row + chunk_group(first, group)));
    float v[V];
    decode_chunk<F>(load_chunk(w + r * pitch + c * kChunkBytes), scale, v);
    const int n_valid = int(min64(V, cols - first));
#pragma unroll
    for (int k = 0; k < V; ++k)
      if (k < n_valid) x[i * cols + first + k] = v[k];
  }
}

template <template <WFormat> class Fn, typename... A>
cudaError_t by_format(WFormat f, A&&... args) {
  switch (f) {
    case WFormat::F32: return Fn<WFormat::F32>::run(args...);
    case WFormat::F16: return Fn<WFormat::F16>::run(args...);
    case WFormat::BF16: return Fn<WFormat::BF16>::run(args...);
    case WFormat::Q8: return Fn<WFormat::Q8>::run(args...);
    case WFormat::Q4: return Fn<WFormat::Q4>::run(args...);
    case WFormat::Ggml: break;  // gemv_ggml.cu; the launchers forward before getting here
  }
  return cudaErrorInvalidValue;
}

template <WFormat F>
struct GemvRun {
  static cudaError_t run(const GemvParams& p, int nb_tile, int rows_per_warp, dim3 grid, cudaStream_t st) {
    return gemv_dispatch_nb<F>(p, nb_tile, rows_per_warp, grid, st);
  }
};

template <WFormat F>
struct DequantRun {
  static cudaError_t run(const DeviceMatrix& w, int64_t r0, int64_t n, uint16_t* out, bool bf16, cudaStream_t st) {
    const MatrixLayout& l = w.layout;
    const int64_t total = n * l.chunks_per_row() * (chunk_values(F) < 8 ? 1 : chunk_values(F) / 8);
    const int threads = 256;
    const int blocks = int(std::min<int64_t>((total + threads - 1) / threads, 65535));
    dequant_kernel<F><<<blocks, threads, 0, st>>>(w.data, w.scales, int64_t(l.pitch), l.chunks_per_row(), l.cols,
                                                 l.group, l.groups_per_row, r0, n, out, bf16);
    return cudaGetLastError();
  }
};

template <WFormat F>
struct EmbedRun {
  static cudaError_t run(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x, cudaStream_t st) {
    const MatrixLayout& l = w.layout;
    const int threads = int(std::min<int64_t>(256, (l.chunks_per_row() + 31) / 32 * 32));
    embed_kernel<F><<<unsigned(n), threads, 0, st>>>(w.data, w.scales, int64_t(l.pitch), l.chunks_per_row(), l.cols,
                                                    l.group, l.groups_per_row, tokens, x);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t gemv_prepare_x(const float* x, int64_t ldx, int64_t cols, int64_t nb, int V, int64_t chunks, float4* xt,
                           cudaStream_t stream) {
  const int64_t total = nb * chunks * (V / 4);
  if (total <= 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((total + threads - 1) / threads, 4096));
  gemv_prepare_x_kernel<<<blocks, threads, 0, stream>>>(x, ldx, cols, nb, V / 4, chunks, xt);
  return cudaGetLastError();
}

cudaError_t launch_gemv(const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                        float beta, float* scratch, int sm_count, cudaStream_t stream) {
  const MatrixLayout& l = w.layout;
  if (l.format == WFormat::Ggml) return launch_gemv_ggml(w, x, ldx, n, y, ldy, beta, scratch, sm_count, stream);
  if (n <= 0 || l.rows == 0) return cudaSuccess;
  GemvParams p;
  p.w = w.data;
  p.scales = w.scales;
  p.rows = l.rows;
  p.cols = l.cols;
  p.pitch = int64_t(l.pitch);
  p.chunks = l.chunks_per_row();
  p.group = l.group;
  p.groups_per_row = l.groups_per_row;
  p.ldx = ldx;
  p.xt = reinterpret_cast<const float4*>(scratch);
  p.ldy = ldy;
  p.beta = beta;
  p.warps_per_row = gemv_warps_per_row(l.rows, p.chunks, sm_count);
  for (int64_t b0 = 0; b0 < n;) {
    const int tile = gemv_batch_tile(n - b0);
    const int rpw = gemv_rows_per_warp(l.rows, p.warps_per_row, tile, sm_count);
    const int rows_per_block = (kGemvThreads / 32) * rpw / p.warps_per_row;
    const dim3 grid(unsigned((l.rows + rows_per_block - 1) / rows_per_block));
    p.nb = int32_t(std::min<int64_t>(tile, n - b0));
    p.x = x + b0 * ldx;
    p.y = y + b0 * ldy;
    cudaError_t e = cudaSuccess;
    if (gemv_x_chunk_major(l.format))
      e = gemv_prepare_x(p.x, ldx, l.cols, p.nb, chunk_values(l.format), p.chunks, reinterpret_cast<float4*>(scratch),
                         stream);
    if (e == cudaSuccess) e = by_format<GemvRun>(l.format, p, tile, rpw, grid, stream);
    if (e != cudaSuccess) return e;
    b0 += p.nb;
  }
  return cudaSuccess;
}

cudaError_t launch_dequant(const DeviceMatrix& w, int64_t r0, int64_t n, uint16_t* out, bool bf16,
                           cudaStream_t stream) {
  if (w.layout.format == WFormat::Ggml) return launch_dequant_ggml(w, r0, n, out, bf16, stream);
  if (n <= 0) return cudaSuccess;
  return by_format<DequantRun>(w.layout.format, w, r0, n, out, bf16, stream);
}

cudaError_t launch_embed(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x, cudaStream_t stream) {
  if (w.layout.format == WFormat::Ggml) return launch_embed_ggml(w, tokens, n, x, stream);
  if (n <= 0) return cudaSuccess;
  return by_format<EmbedRun>(w.layout.format, w, tokens, n, x, stream);
}

}  // namespace llm::cuda
