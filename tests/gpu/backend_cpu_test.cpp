// The CUDA entry points on machines without a usable GPU (or without a
// CUDA build): clean statuses, never a crash. Not labelled cuda; on a
// machine with a GPU these skip (tests/gpu/*_cuda_test.cpp cover it).
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "model/model.h"

namespace {

using namespace llm;

llm_status status_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()), "");
    return e.status();
  }
  return LLM_OK;
}

#ifdef LLM_WITH_CUDA
constexpr llm_status kNoDevice = LLM_ERR_DEVICE;
#else
constexpr llm_status kNoDevice = LLM_ERR_UNSUPPORTED;
#endif

TEST(CudaNoDevice, EntryPointsReportAStatus) {
  std::string why;
  const int n = cuda::device_count(&why);
  ASSERT_GE(n, 0);
  if (n > 0) GTEST_SKIP() << "a CUDA device is present; the cuda-labelled tests cover it";
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(status_of([] { cuda::check_device(); }), kNoDevice);
  EXPECT_EQ(status_of([] { cuda::require_device(); }), kNoDevice);
}

TEST(CudaNoDevice, BackendCreationFailsCleanly) {
  if (cuda::device_count(nullptr) > 0) GTEST_SKIP() << "a CUDA device is present";
  LoadOptions o;
  o.n_threads = 1;
  auto model = Model::load(std::string(LLM_MODELS_DIR) + "/stories260K.gguf", o);
  cuda::BackendOptions bo;
  EXPECT_EQ(status_of([&] { (void)cuda::Backend::create(*model, bo); }), kNoDevice);
}

}  // namespace
