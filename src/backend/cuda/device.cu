// CUDA device discovery. Compiled only when the toolkit is found.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"

namespace llm::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    (void)cudaGetLastError();  // clear the sticky error state
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device found";
  return n;
}

}  // namespace llm::cuda
