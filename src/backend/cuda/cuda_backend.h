// CUDA backend entry points visible to the rest of the library. Without
// CUDA (LLM_WITH_CUDA undefined) these report LLM_ERR_UNSUPPORTED.
#pragma once

#include <string>

namespace llm::cuda {

// Number of usable CUDA devices (0 if none or no driver); `why` gets the
// driver's message when there are none.
int device_count(std::string* why);

// Throws Error(LLM_ERR_UNSUPPORTED) if built without CUDA, Error(LLM_ERR_DEVICE)
// with the driver's message if no device is usable, and Error(LLM_ERR_UNSUPPORTED)
// while the CUDA compute path is not available for models.
void require_device();

}  // namespace llm::cuda
