// Host allocations of the library go through mimalloc. Large buffers are
// 64-byte aligned (cache line, AVX2 loads). A test build can inject
// allocation failures to prove that OOM is reported and nothing leaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace llm {

// Throws Error(LLM_ERR_OUT_OF_MEMORY) on failure. Never returns nullptr for size > 0.
void* alloc_bytes(size_t size, size_t align = 64);
void free_bytes(void* p) noexcept;

// Test hook: the n-th allocation from now on (1-based) fails; 0 disables.
void alloc_fail_after(int64_t n) noexcept;

struct FreeBytes {
  void operator()(void* p) const noexcept { free_bytes(p); }
};

// Owning, aligned, uninitialised array of trivially-copyable T.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  void resize(size_t n) {
    if (n == size_) return;
    ptr_.reset(n ? static_cast<T*>(alloc_bytes(n * sizeof(T))) : nullptr);
    size_ = n;
  }
  T* data() { return ptr_.get(); }
  const T* data() const { return ptr_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return ptr_.get()[i]; }
  const T& operator[](size_t i) const { return ptr_.get()[i]; }

 private:
  std::unique_ptr<T, FreeBytes> ptr_;
  size_t size_ = 0;
};

// One block of memory for the weights that every decode step streams. On
// Linux it is an anonymous mapping of whole 2 MiB pages, advised for
// transparent huge pages before anything touches it, so the kernel can back
// it with 2 MiB pages: a token's walk over the weights then misses the TLB
// every 2 MiB instead of every 4 KiB. Elsewhere it is ordinary memory.
class HugePageBlock {
 public:
  HugePageBlock() = default;
  explicit HugePageBlock(size_t size);  // throws Error(LLM_ERR_OUT_OF_MEMORY); size > 0
  ~HugePageBlock();
  HugePageBlock(HugePageBlock&& o) noexcept { *this = std::move(o); }
  HugePageBlock& operator=(HugePageBlock&& o) noexcept;
  HugePageBlock(const HugePageBlock&) = delete;
  HugePageBlock& operator=(const HugePageBlock&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The kernel took the huge-page advice and its huge pages are not off.
  // (It may still fall back to 4 KiB pages when memory is fragmented.)
  bool advised() const { return advised_; }

 private:
  void release() noexcept;
  uint8_t* data_ = nullptr;
  size_t size_ = 0, mapped_ = 0;  // mapped_ = 0: data_ came from alloc_bytes
  bool advised_ = false;
};

}  // namespace llm
