#include "core/alloc.h"

#include <mimalloc.h>

#include <atomic>
#include <cstdlib>

#include "core/error.h"

// Sanitizer builds use the system allocator, which ASan/TSan intercept:
// mimalloc's own API is invisible to them (no redzones around Buffer<T>, no
// use-after-free or leak reports for KV pages).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LLM_ALLOC_SYSTEM 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define LLM_ALLOC_SYSTEM 1
#endif
#endif

namespace llm {

static std::atomic<int64_t> g_fail_countdown{0};

void alloc_fail_after(int64_t n) noexcept { g_fail_countdown.store(n); }

void* alloc_bytes(size_t size, size_t align) {
  if (size == 0) size = 1;
  if (g_fail_countdown.load(std::memory_order_relaxed) > 0 && g_fail_countdown.fetch_sub(1) == 1)
    fail(LLM_ERR_OUT_OF_MEMORY, "allocation of %zu bytes failed (injected)", size);
#ifdef LLM_ALLOC_SYSTEM
  void* p = nullptr;
  if (posix_memalign(&p, align < sizeof(void*) ? sizeof(void*) : align, size) != 0) p = nullptr;
#else
  void* p = mi_malloc_aligned(size, align);
#endif
  if (!p) fail(LLM_ERR_OUT_OF_MEMORY, "allocation of %zu bytes failed", size);
  return p;
}

void free_bytes(void* p) noexcept {
#ifdef LLM_ALLOC_SYSTEM
  std::free(p);
#else
  mi_free(p);
#endif
}

}  // namespace llm
