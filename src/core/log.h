// Logging goes to the embedder's callback only; the library never prints.
#pragma once

#include "llm.h"

namespace llm {

struct Logger {
  llm_log_fn fn = nullptr;
  void* user = nullptr;
  void log(llm_log_level level, const char* fmt, ...) const
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
};

}  // namespace llm
