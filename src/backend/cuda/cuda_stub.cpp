// Built into every library: the device-independent half of the CUDA entry
// points. device_count() lives in device.cu and Backend::create's real body
// in backend.cpp when CUDA is compiled in.
#include "backend/cuda/cuda_backend.h"

#include "core/error.h"

namespace llm::cuda {

#ifndef LLM_WITH_CUDA
int device_count(std::string* why) {
  if (why) *why = "libllm was built without CUDA";
  return 0;
}

std::unique_ptr<Backend> Backend::create(const Model&, const BackendOptions&) {
  fail(LLM_ERR_UNSUPPORTED, "libllm was built without CUDA (configure with -DLLM_CUDA=ON)");
}
#endif

void check_device() {
#ifndef LLM_WITH_CUDA
  fail(LLM_ERR_UNSUPPORTED, "libllm was built without CUDA (configure with -DLLM_CUDA=ON)");
#else
  std::string why;
  if (device_count(&why) <= 0) fail(LLM_ERR_DEVICE, "no usable CUDA device: %s", why.c_str());
#endif
}

void require_device() {
  check_device();
  fail(LLM_ERR_UNSUPPORTED, "the CUDA compute path is not available yet; use LLM_DEVICE_CPU or AUTO");
}

}  // namespace llm::cuda
