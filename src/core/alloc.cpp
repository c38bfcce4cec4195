#include "core/alloc.h"

#include <mimalloc.h>

#include <atomic>

#include "core/error.h"

namespace llm {

static std::atomic<int64_t> g_fail_countdown{0};

void alloc_fail_after(int64_t n) noexcept { g_fail_countdown.store(n); }

void* alloc_bytes(size_t size, size_t align) {
  if (size == 0) size = 1;
  if (g_fail_countdown.load(std::memory_order_relaxed) > 0 && g_fail_countdown.fetch_sub(1) == 1)
    fail(LLM_ERR_OUT_OF_MEMORY, "allocation of %zu bytes failed (injected)", size);
  void* p = mi_malloc_aligned(size, align);
  if (!p) fail(LLM_ERR_OUT_OF_MEMORY, "allocation of %zu bytes failed", size);
  return p;
}

void free_bytes(void* p) noexcept { mi_free(p); }

}  // namespace llm
