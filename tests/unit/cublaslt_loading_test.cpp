// A CUDA build opens cuBLASLt only when the first device GEMM is made
// (backend/cuda/cublaslt_api.h): a process that never makes one does not
// carry the ~150 MB the library costs once loaded. Runs without a GPU; a
// build without CUDA has nothing to check.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#if defined(LLM_WITH_CUDA)
#include "backend/cuda/cublaslt_api.h"
#endif

namespace {

[[maybe_unused]] bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

#if defined(LLM_WITH_CUDA)
TEST(CublasLtLoading, OpenedOnFirstUseWithEveryEntryPoint) {
  const std::string lib = llm::cuda::cublaslt_library_name();
  // ctest runs each test in its own process; run alone, nothing before this
  // test makes a device GEMM either.
  EXPECT_FALSE(mapped("libcublasLt")) << "linked or loaded before any device GEMM";
  const llm::cuda::CublasLtApi& api = llm::cuda::cublaslt();
  EXPECT_TRUE(mapped(lib)) << lib;
  const void* fns[] = {reinterpret_cast<const void*>(api.create), reinterpret_cast<const void*>(api.destroy),
                       reinterpret_cast<const void*>(api.status_name), reinterpret_cast<const void*>(api.status_string),
                       reinterpret_cast<const void*>(api.matmul), reinterpret_cast<const void*>(api.algo_get_heuristic),
                       reinterpret_cast<const void*>(api.desc_create), reinterpret_cast<const void*>(api.desc_destroy),
                       reinterpret_cast<const void*>(api.desc_set_attribute),
                       reinterpret_cast<const void*>(api.pref_create), reinterpret_cast<const void*>(api.pref_destroy),
                       reinterpret_cast<const void*>(api.pref_set_attribute),
                       reinterpret_cast<const void*>(api.layout_create), reinterpret_cast<const void*>(api.layout_destroy)};
  for (const void* f : fns) EXPECT_NE(f, nullptr);
  // A status name through the opened library: the table points at cuBLASLt.
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(&llm::cuda::cublaslt(), &api);  // opened once
}
#else
TEST(CublasLtLoading, OpenedOnFirstUseWithEveryEntryPoint) { GTEST_SKIP() << "built without CUDA"; }
#endif
