// Host-side CUDA plumbing: error checks that turn CUDA/cuBLASLt failures
// into llm::Error (never exit, abort or print), and RAII owners of device
// and pinned host memory. Only compiled when LLM_WITH_CUDA is set.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace llm::cuda {

// Throws Error(LLM_ERR_OUT_OF_MEMORY) for allocation failures and
// Error(LLM_ERR_DEVICE) otherwise, with `what` and CUDA's message. Clears
// the (non-sticky) error state first so later calls are not poisoned.
void check(cudaError_t e, const char* what);
void check_lt(cublasStatus_t s, const char* what);

// Owner of one cudaMalloc allocation (never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const char* what = "cudaMalloc");
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Owner of page-locked host memory (fast, asynchronous transfers).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// cuBLASLt GEMM for prefill and large batches:
//   D[m, n] = A^T B + beta D        (column-major, as cuBLASLt sees it)
// which for row-major data is  Y[n, m] = X[n, k] . W[m, k]^T (+ beta Y):
// A = W (row-major [m][lda], lda >= k), B = X (row-major [n][ldb]),
// D = Y (row-major [n][ldd]). A and B are f32, f16 or bf16 (same type);
// accumulation and D are f32 (CUBLAS_COMPUTE_32F: no TF32 shortcut).
enum class GemmType { F32, F16, BF16 };

class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(GemmType t, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
           float* d, int64_t ldd, float beta, cudaStream_t stream);

 private:
  struct Plan;
  Plan& plan_for(GemmType t, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldd, bool beta,
                 uint32_t align_a, uint32_t align_b, uint32_t align_d);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  struct Cache;
  Cache* cache_ = nullptr;
};

}  // namespace llm::cuda
