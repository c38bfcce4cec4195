// CUDA error checks, device/pinned memory owners and the cuBLASLt GEMM.
// Host code compiled by the C++ compiler; empty without LLM_WITH_CUDA.
#ifdef LLM_WITH_CUDA

#include "backend/cuda/device_util.h"

#include "backend/cuda/cublaslt_api.h"

#include <map>
#include <memory>
#include <tuple>

#include "core/error.h"

namespace llm::cuda {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the non-sticky error; sticky ones stay and fail the next call too
  const llm_status st = e == cudaErrorMemoryAllocation ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_DEVICE;
  fail(st, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const llm_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_DEVICE;
  fail(st, "%s: %s (%s)", what, cublaslt().status_string(s), cublaslt().status_name(s));
}

// ---------------------------------------------------------------- memory owners

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(e == cudaErrorMemoryAllocation ? LLM_ERR_OUT_OF_MEMORY : LLM_ERR_DEVICE, "%s of %zu bytes: %s", what, bytes,
         cudaGetErrorString(e));
  }
  p_ = p;
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) (void)cudaFree(p_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) (void)cudaFree(p_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(LLM_ERR_OUT_OF_MEMORY, "cudaMallocHost of %zu bytes: %s", bytes, cudaGetErrorString(e));
  }
  p_ = p;
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) (void)cudaFreeHost(p_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) (void)cudaFreeHost(p_);
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---------------------------------------------------------------- Gemm

namespace {

cudaDataType_t cuda_type(GemmType t) {
  switch (t) {
    case GemmType::F32: return CUDA_R_32F;
    case GemmType::F16: return CUDA_R_16F;
    case GemmType::BF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256
// unless told, and an algorithm chosen for aligned data may fault otherwise.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublaslt().layout_destroy(a);
    if (b) cublaslt().layout_destroy(b);
    if (d) cublaslt().layout_destroy(d);
    if (desc) cublaslt().desc_destroy(desc);
  }
};

struct Gemm::Cache {
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t>;
  std::map<Key, std::unique_ptr<Plan>> plans;
};

Gemm::Gemm(size_t workspace_bytes) : workspace_(workspace_bytes, "cuBLASLt workspace") {
  check_lt(cublaslt().create(&handle_), "cublasLtCreate");
  cache_ = new Cache();
}

Gemm::~Gemm() {
  delete cache_;
  if (handle_) cublaslt().destroy(handle_);
}

Gemm::Plan& Gemm::plan_for(GemmType t, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldd,
                           bool beta, uint32_t align_a, uint32_t align_b, uint32_t align_d) {
  const Cache::Key key{int(t), m, n, k, lda, ldb, ldd, beta, align_a, align_b, align_d};
  auto it = cache_->plans.find(key);
  if (it != cache_->plans.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const cudaDataType_t ab = cuda_type(t);
  check_lt(cublaslt().desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  check_lt(cublaslt().desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t), "set TRANSA");
  check_lt(cublaslt().desc_set_attribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n), "set TRANSB");
  // Column-major views: A is [k, m] (ld lda), B is [k, n] (ld ldb), D is [m, n] (ld ldd).
  check_lt(cublaslt().layout_create(&p->a, ab, uint64_t(k), uint64_t(m), lda), "layout A");
  check_lt(cublaslt().layout_create(&p->b, ab, uint64_t(k), uint64_t(n), ldb), "layout B");
  check_lt(cublaslt().layout_create(&p->d, CUDA_R_32F, uint64_t(m), uint64_t(n), ldd), "layout D");

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublaslt().pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublaslt().pref_destroy(p); }
  } guard{pref};
  const size_t ws = workspace_.bytes();
  check_lt(cublaslt().pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "set workspace");
  check_lt(cublaslt().pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                sizeof align_a), "set align A");
  check_lt(cublaslt().pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                sizeof align_b), "set align B");
  check_lt(cublaslt().pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                sizeof align_d), "set align C");
  check_lt(cublaslt().pref_set_attribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                sizeof align_d), "set align D");
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  check_lt(cublaslt().algo_get_heuristic(handle_, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &found),
           "cublasLtMatmulAlgoGetHeuristic");
  LLM_CHECK(found > 0, LLM_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for a %lld x %lld x %lld GEMM", (long long)m,
            (long long)n, (long long)k);
  p->algo = res.algo;
  Plan& ref = *p;
  cache_->plans.emplace(key, std::move(p));
  return ref;
}

void Gemm::run(GemmType t, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
               float* d, int64_t ldd, float beta, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  Plan& p = plan_for(t, m, n, k, lda, ldb, ldd, beta != 0.f, alignment_of(a), alignment_of(b), alignment_of(d));
  const float alpha = 1.f;
  check_lt(cublaslt().matmul(handle_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo, workspace_.get(),
                          workspace_.bytes(), stream),
           "cublasLtMatmul");
}

}  // namespace llm::cuda

#endif  // LLM_WITH_CUDA
