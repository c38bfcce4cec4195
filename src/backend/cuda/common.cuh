// Device-only helpers shared by the .cu files: warp reductions and vector loads.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernel_math.h"

namespace llm::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Read-only 16-byte load (weights: streamed once, keep them out of L1).
__device__ __forceinline__ Chunk load_chunk(const uint8_t* p) {
  const uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));
  Chunk c;
  c.w[0] = u.x;
  c.w[1] = u.y;
  c.w[2] = u.z;
  c.w[3] = u.w;
  return c;
}

// Sum over the whole block (blockDim.x a multiple of 32, <= 1024). `red`
// holds 32 floats of shared memory. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? red[lane] : 0.f;
  return warp_sum(t);
}

__host__ __device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

inline int ceil_div_int(int64_t a, int64_t b) { return int((a + b - 1) / b); }

}  // namespace llm::cuda
