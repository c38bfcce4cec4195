// Weight-streaming kernels for GGUF block weights (WFormat::Ggml: Q5_0, Q5_1,
// Q2_K .. Q6_K, IQ4_NL, IQ4_XS kept as stored): fused decode + GEMV,
// decode to f16/bf16 (prefill GEMM tiles), embedding lookup. The unit of
// work is a 32-value sub-block; its math (ggml_decode32, ggml_dot32) is in
// ggml_blocks.h and tested on the CPU, this file is the parallel skeleton.
// launch_gemv / launch_dequant / launch_embed (gemv.cu) forward here.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/ggml_blocks.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/plan.h"

namespace llm::cuda {

namespace {

struct GgmlGemvParams {
  const uint8_t* w;  // [rows][pitch]: whole blocks, then zero padding
  int64_t rows, pitch;
  int64_t units;     // 32-value sub-blocks per row (cols / 32)
  const float4* xt;  // [nb][8][units]: the pass's activations (gemv_prepare_x, V = 32)
  int32_t nb;        // live activation rows (<= NB)
  float* y;          // [nb][ldy]
  int64_t ldy;
  float beta;
  int32_t warps_per_row;
};

// Block = 8 warps; warps_per_row warps share one output row (8 / wpr rows per
// block). The warps of a row take sub-blocks u = sub * 32 + lane, stepping
// 32 * wpr: neighbouring lanes read neighbouring sub-blocks, so a warp's
// byte loads fall in a few consecutive blocks. One activation row: the
// factored dot (scale once per run). NB > 1: decode the sub-block once into
// registers and dot it with each activation row.
template <DType T, int NB>
__global__ void __launch_bounds__(kGemvThreads) gemv_ggml_kernel(GgmlGemvParams p) {
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int wpr = p.warps_per_row;
  const int rows_per_block = (kGemvThreads / 32) / wpr;
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + warp / wpr;
  const int sub = warp % wpr;

  float acc[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = 0.f;

  if (row < p.rows) {
    const uint8_t* wrow = p.w + row * p.pitch;
    for (int64_t u = int64_t(sub) * 32 + lane; u < p.units; u += 32 * int64_t(wpr)) {
      const uint8_t* blk = ggml_unit_block<T>(wrow, u);
      const int s = ggml_unit_sub<T>(u);
      float xv[32];
      if constexpr (NB == 1) {
        load_xt<32>(p.xt, p.units, u, xv);
        acc[0] += ggml_dot32<T>(blk, s, xv);
      } else {
        float wv[32];
        ggml_decode32<T>(blk, s, wv);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if (b < p.nb) {
            load_xt<32>(p.xt + b * 8 * p.units, p.units, u, xv);
            acc[b] += dot32(wv, xv);
          }
        }
      }
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) acc[b] = warp_sum(acc[b]);
  if (wpr > 1) gemv_reduce_row_split<NB>(acc, warp, lane, sub, wpr);
  if (lane == 0 && sub == 0 && row < p.rows) gemv_store_row<NB>(p.y, p.ldy, row, p.nb, p.beta, acc);
}

// Grid-stride over (row, sub-block): its 32 values as 16 f16/bf16 pairs.
// out: [n][cols] halves; cols is a multiple of 32, so each sub-block's 64
// bytes are 16-byte aligned.
template <DType T>
__global__ void dequant_ggml_kernel(const uint8_t* w, int64_t pitch, int64_t units, int64_t r0, int64_t n,
                                    uint32_t* out, bool bf16) {
  const int64_t total = n * units;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx / units, u = idx % units;
    float v[32];
    ggml_decode32<T>(ggml_unit_block<T>(w + (r0 + i) * pitch, u), ggml_unit_sub<T>(u), v);
    uint32_t pairs[16];
#pragma unroll
    for (int k = 0; k < 32; k += 2) {
      const uint32_t lo = bf16 ? float_to_bf16_bits(v[k]) : float_to_f16_bits(v[k]);
      const uint32_t hi = bf16 ? float_to_bf16_bits(v[k + 1]) : float_to_f16_bits(v[k + 1]);
      pairs[k / 2] = lo | (hi << 16);
    }
    // 16-byte stores (4-byte ones 64 bytes apart were a quarter as efficient).
    uint4* o = reinterpret_cast<uint4*>(out + (i * units + u) * 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = make_uint4(pairs[4 * k], pairs[4 * k + 1], pairs[4 * k + 2], pairs[4 * k + 3]);
  }
}

// Block per token: x[i, :] = decoded row tokens[i], thread per sub-block.
template <DType T>
__global__ void embed_ggml_kernel(const uint8_t* w, int64_t pitch, int64_t units, const int32_t* tokens, float* x) {
  const int64_t i = blockIdx.x;
  const uint8_t* wrow = w + int64_t(tokens[i]) * pitch;
  float* xrow = x + i * units * 32;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    float v[32];
    ggml_decode32<T>(ggml_unit_block<T>(wrow, u), ggml_unit_sub<T>(u), v);
#pragma unroll
    for (int k = 0; k < 32; ++k) xrow[u * 32 + k] = v[k];
  }
}

template <DType T>
struct GgmlGemvRun {
  static cudaError_t run(const GgmlGemvParams& p, int nb_tile, dim3 grid, cudaStream_t st) {
    switch (nb_tile) {
      case 1: gemv_ggml_kernel<T, 1><<<grid, kGemvThreads, 0, st>>>(p); break;
      case 2: gemv_ggml_kernel<T, 2><<<grid, kGemvThreads, 0, st>>>(p); break;
      case 4: gemv_ggml_kernel<T, 4><<<grid, kGemvThreads, 0, st>>>(p); break;
      default: gemv_ggml_kernel<T, 8><<<grid, kGemvThreads, 0, st>>>(p); break;
    }
    return cudaGetLastError();
  }
};

template <DType T>
struct GgmlDequantRun {
  static cudaError_t run(const DeviceMatrix& w, int64_t r0, int64_t n, uint32_t* out, bool bf16, cudaStream_t st) {
    const MatrixLayout& l = w.layout;
    const int64_t units = l.cols / 32;
    const int threads = 256;
    const int blocks = int(std::min<int64_t>((n * units + threads - 1) / threads, 65535));
    dequant_ggml_kernel<T><<<blocks, threads, 0, st>>>(w.data, int64_t(l.pitch), units, r0, n, out, bf16);
    return cudaGetLastError();
  }
};

template <DType T>
struct GgmlEmbedRun {
  static cudaError_t run(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x, cudaStream_t st) {
    const MatrixLayout& l = w.layout;
    const int64_t units = l.cols / 32;
    const int threads = int(std::min<int64_t>(256, (units + 31) / 32 * 32));
    embed_ggml_kernel<T><<<unsigned(n), threads, 0, st>>>(w.data, int64_t(l.pitch), units, tokens, x);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t launch_gemv_ggml(const DeviceMatrix& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
                             float beta, float* scratch, int sm_count, cudaStream_t stream) {
  const MatrixLayout& l = w.layout;
  if (l.format != WFormat::Ggml || l.cols % 32 != 0) return cudaErrorInvalidValue;
  if (n <= 0 || l.rows == 0) return cudaSuccess;
  GgmlGemvParams p;
  p.w = w.data;
  p.rows = l.rows;
  p.pitch = int64_t(l.pitch);
  p.units = l.cols / 32;
  p.xt = reinterpret_cast<const float4*>(scratch);
  p.ldy = ldy;
  p.beta = beta;
  p.warps_per_row = gemv_warps_per_row(l.rows, p.units, sm_count);
  const int rows_per_block = (kGemvThreads / 32) / p.warps_per_row;
  const dim3 grid(unsigned((l.rows + rows_per_block - 1) / rows_per_block));
  for (int64_t b0 = 0; b0 < n;) {
    const int tile = gemv_batch_tile(n - b0);
    p.nb = int32_t(std::min<int64_t>(tile, n - b0));
    p.y = y + b0 * ldy;
    cudaError_t e = gemv_prepare_x(x + b0 * ldx, ldx, l.cols, p.nb, 32, p.units, reinterpret_cast<float4*>(scratch),
                                   stream);
    if (e == cudaSuccess)
      e = with_ggml_type(
          l.block, [&](auto t) { return GgmlGemvRun<decltype(t)::value>::run(p, tile, grid, stream); },
          [] { return cudaErrorInvalidValue; });
    if (e != cudaSuccess) return e;
    b0 += p.nb;
  }
  return cudaSuccess;
}

cudaError_t launch_dequant_ggml(const DeviceMatrix& w, int64_t r0, int64_t n, uint16_t* out, bool bf16,
                                cudaStream_t stream) {
  if (w.layout.format != WFormat::Ggml || w.layout.cols % 32 != 0) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  uint32_t* pairs = reinterpret_cast<uint32_t*>(out);
  return with_ggml_type(
      w.layout.block, [&](auto t) { return GgmlDequantRun<decltype(t)::value>::run(w, r0, n, pairs, bf16, stream); },
      [] { return cudaErrorInvalidValue; });
}

cudaError_t launch_embed_ggml(const DeviceMatrix& w, const int32_t* tokens, int64_t n, float* x,
                              cudaStream_t stream) {
  if (w.layout.format != WFormat::Ggml || w.layout.cols % 32 != 0) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  return with_ggml_type(
      w.layout.block, [&](auto t) { return GgmlEmbedRun<decltype(t)::value>::run(w, tokens, n, x, stream); },
      [] { return cudaErrorInvalidValue; });
}

}  // namespace llm::cuda
