#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace llm {

void fail(llm_status status, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  throw Error(status, buf);
}

}  // namespace llm
