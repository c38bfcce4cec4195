// Internal error handling. Code inside the library throws llm::Error; the C
// shim in src/api/ catches it (and std::bad_alloc, std::exception) and turns
// it into an llm_status plus a thread-local message. Nothing else may escape.
#pragma once

#include <exception>
#include <string>

#include "llm.h"

namespace llm {

class Error : public std::exception {
 public:
  Error(llm_status status, std::string message) : status_(status), message_(std::move(message)) {}
  llm_status status() const noexcept { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  llm_status status_;
  std::string message_;
};

// Throws llm::Error(status, printf-formatted message).
[[noreturn]] void fail(llm_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

}  // namespace llm

#define LLM_CHECK(cond, status, ...)          \
  do {                                        \
    if (!(cond)) ::llm::fail(status, __VA_ARGS__); \
  } while (0)
