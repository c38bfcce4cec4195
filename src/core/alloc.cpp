#include "core/alloc.h"
#include "core/release_memory.h"

#include <mimalloc.h>
#ifdef __linux__
#include <malloc.h>  // malloc_trim (glibc)
#endif

#ifdef __linux__
#include <sys/mman.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

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

// The test hook: throws when this allocation is the one alloc_fail_after chose.
static void count_allocation(size_t size) {
  if (g_fail_countdown.load(std::memory_order_relaxed) > 0 && g_fail_countdown.fetch_sub(1) == 1)
    fail(LLM_ERR_OUT_OF_MEMORY, "allocation of %zu bytes failed (injected)", size);
}

void* alloc_bytes(size_t size, size_t align) {
  if (size == 0) size = 1;
  count_allocation(size);
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

void release_free_memory() noexcept {
#ifndef LLM_ALLOC_SYSTEM
  mi_collect(false);
#endif
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

#ifdef __linux__
// The kernel takes MADV_HUGEPAGE even when transparent huge pages are off
// ("[never]" in this file); then the advice changes nothing.
static bool transparent_huge_pages_off() {
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return true;
  char buf[128] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  return n == 0 || std::strstr(buf, "[never]") != nullptr;
}
#endif

HugePageBlock::HugePageBlock(size_t size) {
  if (size == 0) size = 1;
#ifdef __linux__
  count_allocation(size);
  // Whole 2 MiB pages, on a 2 MiB boundary: map one page more, trim both ends.
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t body = (size + kHuge - 1) / kHuge * kHuge, len = body + kHuge;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail(LLM_ERR_OUT_OF_MEMORY, "mapping %zu bytes failed", size);
  uint8_t* const base = static_cast<uint8_t*>(p);
  uint8_t* const start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1));
  const size_t head = size_t(start - base);
  if (head) ::munmap(base, head);
  if (len - head > body) ::munmap(start + body, len - head - body);
  data_ = start;
  size_ = size;
  mapped_ = body;
  advised_ = ::madvise(start, body, MADV_HUGEPAGE) == 0 && !transparent_huge_pages_off();
#else
  data_ = static_cast<uint8_t*>(alloc_bytes(size));
  size_ = size;
#endif
}

HugePageBlock& HugePageBlock::operator=(HugePageBlock&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    advised_ = std::exchange(o.advised_, false);
  }
  return *this;
}

HugePageBlock::~HugePageBlock() { release(); }

void HugePageBlock::release() noexcept {
  if (!data_) return;
#ifdef __linux__
  if (mapped_) {
    ::munmap(data_, mapped_);
    data_ = nullptr;
    return;
  }
#endif
  free_bytes(data_);
  data_ = nullptr;
}

}  // namespace llm
