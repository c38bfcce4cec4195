// The byte layout of a .llm file shared by its reader (format/llm_file.cpp)
// and its writer (convert/llm_file_writer.cpp): the format's constants, the
// header, table entry sizes, byte planes, and the parallel task runner both
// use. Internal to those two files; docs/FORMAT.md is the specification.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "format/llm_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .llm reader/writer assumes a little-endian host"
#endif

namespace llm::llm_file {

// ---------------------------------------------------------------------------
// Constants of the format (docs/FORMAT.md)

constexpr uint8_t kMagic[8] = {0x89, 'L', 'L', 'M', '\r', '\n', 0x1A, '\n'};

// Flag bits 16..31 are "required": a reader that does not know one must refuse
// the file. Bits 0..15 are optional hints. Version 1 defines none.
constexpr uint32_t kRequiredFlagMask = 0xFFFF0000u;
constexpr uint32_t kKnownRequiredFlags = 0;

constexpr uint32_t kMaxDims = 8;
// Absurd sizes are refused before anything is allocated: no real tensor has
// a dimension of 2^31 or more, or more than 64 GiB of raw bytes (the largest
// models' embedding matrices are a few GiB).
constexpr uint64_t kMaxDimSize = (1ull << 31) - 1;
constexpr uint64_t kMaxTensorBytes = 1ull << 36;
// A zstd block holds at most 128 KiB and costs at least 4 bytes (header +
// RLE byte), so no valid frame expands more than 32768x.
constexpr uint64_t kMaxZstdRatio = 32768;
constexpr uint32_t kMaxNameLen = 1024;
constexpr uint32_t kMinChunkBytes = 64;
constexpr uint32_t kMaxChunkBytes = 1u << 30;
constexpr uint64_t kChunkIndexEntryBytes = 16;     // u64 frame size, u64 XXH3-64 of the frame
constexpr uint64_t kEntryFixedBytes = 64;          // table entry bytes before dims and name
constexpr uint32_t kMaxHeaderSize = 1u << 16;

enum MetaType : uint32_t {
  kMetaI64 = 1,
  kMetaF64 = 2,
  kMetaStr = 3,
  kMetaStrArray = 4,
  kMetaF32Array = 5,
  kMetaI32Array = 6,
};

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

inline uint64_t xxh3(const void* p, size_t n) { return XXH3_64bits(p, n); }

// Bytes per element for the byte-plane codec; 0 when the dtype has no
// fixed-width elements (quantized blocks).
inline uint32_t plane_width(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    default: return 0;
  }
}

// Byte-plane split of little-endian elements: the most significant byte of
// every element first, then the next one, ... For f16/bf16 the high plane
// holds sign+exponent(+top mantissa bits), which compresses far better on
// its own than interleaved with the noisy low bytes.
inline void split_planes(const uint8_t* src, size_t n_bytes, uint32_t width, uint8_t* dst) {
  const size_t n = n_bytes / width;
  for (uint32_t p = 0; p < width; ++p) {
    const uint32_t b = width - 1 - p;
    uint8_t* out = dst + p * n;
    for (size_t i = 0; i < n; ++i) out[i] = src[i * width + b];
  }
}

inline void join_planes(const uint8_t* src, size_t n_bytes, uint32_t width, uint8_t* dst) {
  const size_t n = n_bytes / width;
  for (uint32_t p = 0; p < width; ++p) {
    const uint32_t b = width - 1 - p;
    const uint8_t* in = src + p * n;
    for (size_t i = 0; i < n; ++i) dst[i * width + b] = in[i];
  }
}

// ---------------------------------------------------------------------------
// Tensor table

inline uint64_t entry_size(size_t n_dims, size_t name_len) {
  return align_up(kEntryFixedBytes + 8 * n_dims + 4 + name_len, 8);
}

// Expected bytes of a tensor: 0 if the dtype/group/shape combination is invalid.
inline uint64_t tensor_raw_bytes(DType dtype, uint32_t group, const std::vector<int64_t>& shape) {
  if (shape.empty()) return 0;
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0 || uint64_t(d) > kMaxDimSize) return 0;
    if (numel > kMaxTensorBytes / uint64_t(d)) return 0;
    numel *= uint64_t(d);
  }
  const int64_t cols = shape.back();
  const uint64_t rows = numel / uint64_t(cols);
  const size_t row = dtype_row_bytes(dtype, cols, group);
  if (row == 0 || rows > kMaxTensorBytes / row) return 0;
  return rows * row;
}

struct Header {
  uint16_t major = 0, minor = 0;
  uint32_t header_size = 0, flags = 0, alignment = 0;
  uint64_t file_size = 0;
  uint64_t meta_offset = 0, meta_size = 0, meta_checksum = 0;
  uint64_t table_offset = 0, table_size = 0, table_checksum = 0;
  uint64_t n_tensors = 0;
  uint64_t data_offset = 0, data_size = 0;
};

// ---------------------------------------------------------------------------
// Parallel task runner with progress, cancellation and error capture. The
// embedder's progress callback is only ever called from the calling thread.

class TaskRunner {
 public:
  TaskRunner(ThreadPool* pool, std::function<bool(float)> progress, uint64_t total_work)
      : pool_(pool), progress_(std::move(progress)), total_(total_work ? total_work : 1) {}

  int max_threads() const { return pool_ ? pool_->size() : 1; }

  // fn(i, ith) for every i in [0, n); weight(i) is added to the progress.
  template <typename Fn, typename Weight>
  void run(size_t n, Fn&& fn, Weight&& weight) {
    std::atomic<size_t> next{0};
    auto body = [&](int ith, int /*nth*/) {
      for (;;) {
        if (stop_.load(std::memory_order_relaxed)) return;
        const size_t i = next.fetch_add(1);
        if (i >= n) return;
        try {
          fn(i, ith);
        } catch (const Error& e) {
          record(e.status(), e.what());
          return;
        } catch (const std::bad_alloc&) {
          record(LLM_ERR_OUT_OF_MEMORY, "out of memory");
          return;
        } catch (const std::exception& e) {
          record(LLM_ERR_INTERNAL, e.what());
          return;
        }
        done_.fetch_add(weight(i));
        if (ith == 0) report();
      }
    };
    if (pool_ && n > 1)
      pool_->parallel(body);
    else
      body(0, 1);
    if (status_ != LLM_OK) throw Error(status_, message_);
    report();
    if (status_ != LLM_OK) throw Error(status_, message_);
  }

 private:
  void record(llm_status s, const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ == LLM_OK) {
      status_ = s;
      message_ = msg;
    }
    stop_.store(true);
  }
  void report() {
    if (!progress_ || stop_.load()) return;
    const float f = float(std::min<double>(1.0, double(done_.load()) / double(total_)));
    if (!progress_(f)) record(LLM_ERR_CANCELLED, "loading cancelled by the progress callback");
  }

  ThreadPool* pool_;
  std::function<bool(float)> progress_;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  llm_status status_ = LLM_OK;
  std::string message_;
};

}  // namespace llm::llm_file
