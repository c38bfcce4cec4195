// The status of the llm::Error that a piece of code throws (LLM_OK when it
// returns), for tests of what the library refuses.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace llm::testing {

// msg (optional) receives the error's message.
inline llm_status status_of(const std::function<void()>& fn, std::string* msg = nullptr) {
  try {
    fn();
  } catch (const llm::Error& e) {
    if (msg) *msg = e.what();
    return e.status();
  }
  return LLM_OK;
}

}  // namespace llm::testing
