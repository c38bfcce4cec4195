// Device helpers of the two GEMV kernels (gemv.cu for f32/f16/bf16/q8/q4,
// gemv_ggml.cu for GGUF blocks): activation loads, the reduction of a row
// split over several warps, and the `y = acc + beta * y` epilogue.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/plan.h"

namespace llm::cuda {

// Activations as the GEMV kernels read them. Lane l of a warp works on chunk
// c0 + l and needs its V consecutive values: in x's own row layout the
// lanes' float4 loads fall in 32 different 128-byte lines (32 L1 wavefronts
// per load, the kernels' limit before this). So x is first laid out per pass
// (gemv_prepare_x): row b, float4 i of chunk c at xt[(b * V/4 + i) * chunks
// + c], zeros past cols; a warp's load then reads 512 consecutive bytes.
template <int V>
__device__ __forceinline__ void load_xt(const float4* xt_row, int64_t chunks, int64_t c, float* xv) {
#pragma unroll
  for (int i = 0; i < V / 4; ++i) {
    const float4 v = __ldg(xt_row + i * chunks + c);
    xv[4 * i] = v.x;
    xv[4 * i + 1] = v.y;
    xv[4 * i + 2] = v.z;
    xv[4 * i + 3] = v.w;
  }
}

// Loads V activations of x's row layout starting at `first`; reads stop at
// n_valid (a multiple of 4), the rest is zero. For the formats of at most 8
// values per chunk (gemv_x_chunk_major false).
template <int V>
__device__ __forceinline__ void load_x(const float* xrow, int64_t first, int n_valid, float* xv) {
#pragma unroll
  for (int i = 0; i < V / 4; ++i) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (4 * i < n_valid) v = __ldg(reinterpret_cast<const float4*>(xrow + first) + i);
    xv[4 * i] = v.x;
    xv[4 * i + 1] = v.y;
    xv[4 * i + 2] = v.z;
    xv[4 * i + 3] = v.w;
  }
}

// Writes xt (above) for rows [0, nb) of x (row stride ldx, cols a multiple
// of 4), chunks of V values; xt holds nb * chunks * V floats (gemv.cu).
cudaError_t gemv_prepare_x(const float* x, int64_t ldx, int64_t cols, int64_t nb, int V, int64_t chunks, float4* xt,
                           cudaStream_t stream);

// A row's wpr warps (warp % wpr == sub, consecutive warps) have each reduced
// their partial sums over lanes; lane 0 of the row's first warp (sub == 0)
// gets the row's totals in acc. Called by every thread of the block (it
// synchronizes), only when wpr > 1.
template <int NB>
__device__ __forceinline__ void gemv_reduce_row_split(float (&acc)[NB], int warp, int lane, int sub, int wpr) {
  __shared__ float red[kGemvThreads / 32][NB];
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < NB; ++b) red[warp][b] = acc[b];
  __syncthreads();
  if (lane == 0 && sub == 0)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float s = 0.f;
      for (int w = 0; w < wpr; ++w) s += red[warp + w][b];
      acc[b] = s;
    }
}

// y[b][row] = acc[b] + beta * y[b][row] for the live activation rows b < nb
// (y is not read when beta is 0).
template <int NB>
__device__ __forceinline__ void gemv_store_row(float* y, int64_t ldy, int64_t row, int nb, float beta,
                                               const float (&acc)[NB]) {
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    if (b < nb) {
      float* yp = y + b * ldy + row;
      *yp = beta != 0.f ? acc[b] + beta * *yp : acc[b];
    }
  }
}

}  // namespace llm::cuda
