// Fuzz target: llama2.c checkpoints (read_llama2c, looks_like_llama2c) and
// the model built from an accepted checkpoint, run on its arbitrary float
// weights (NaN, Inf, denormals reach the matmuls, RoPE, softmax, sampler).
//
// read_llama2c only takes paths, so the bytes go into an in-memory file
// (memfd) opened through /proc/self/fd. The tokenizer is the real tok512.bin
// (so header vocab sizes up to 512 get past it).
//
// Input: one mode byte, then the checkpoint. Mode bit 0: resize the file to
// exactly what its header implies (zero padding or truncation, when that is
// under 4 MiB), so mutated headers reach the model instead of dying at the
// size check.
#include <sys/mman.h>
#include <unistd.h>

#include "format/llama2c.h"
#include "fuzz_model.h"

namespace {

struct MemFile {
  int fd = -1;
  std::string path;
  MemFile() {
    fd = memfd_create("llm-fuzz-llama2c", MFD_CLOEXEC);
    if (fd < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path = "/proc/self/fd/" + std::to_string(fd);
  }
  void write(const uint8_t* d, size_t n) {
    if (ftruncate(fd, 0) != 0 || (n && pwrite(fd, d, n, 0) != ssize_t(n))) {
      std::perror("memfd write");
      std::abort();
    }
  }
};

// Bytes a llama2.c (version 0) checkpoint with this header has, or 0 if the
// header is not plausible (the layout is in src/format/llama2c.cpp).
uint64_t implied_size(const uint8_t* d, size_t n) {
  if (n < 28) return 0;
  int32_t h[7];
  std::memcpy(h, d, 28);
  const int64_t dim = h[0], hid = h[1], L = h[2], heads = h[3], kvh = h[4], seq = h[6];
  const int64_t V = h[5] < 0 ? -int64_t(h[5]) : h[5];
  if (dim <= 0 || hid <= 0 || L <= 0 || heads <= 0 || kvh <= 0 || V <= 0 || seq <= 0) return 0;
  if (dim > 4096 || hid > 4096 || L > 64 || heads > dim || V > 4096 || seq > 4096) return 0;
  const int64_t hd = dim / heads, kv = hd * kvh;
  const uint64_t floats = uint64_t(V * dim + L * (2 * dim + 2 * dim * dim + 2 * kv * dim + 3 * hid * dim) + dim +
                                   2 * seq * (hd / 2) + (h[5] < 0 ? V * dim : 0));
  return floats <= (uint64_t(1) << 20) ? 28 + 4 * floats : 0;
}

}  // namespace

LLM_FUZZ_TARGET(llama2c_checkpoint) {
  static MemFile file;
  static const std::string tokenizer = llm::fuzz::model_path("tok512.bin");
  if (size < 1) return 0;
  const bool fit = data[0] & 1;
  std::vector<uint8_t> bytes(data + 1, data + size);
  if (fit) {
    if (const uint64_t want = implied_size(bytes.data(), bytes.size())) bytes.resize(size_t(want), 0);
  }
  data = bytes.data();
  size = bytes.size();
  file.write(data, size);
  const bool looks = llm::looks_like_llama2c(data, size);
  try {
    llm::ModelSource src = llm::read_llama2c(file.path, tokenizer);
    LLM_FUZZ_EXPECT(looks);  // the cheap sniffing test agrees with the full reader
    std::unique_ptr<llm::Model> m = llm::Model::from_source(std::move(src), llm::fuzz::fuzz_load_options(false));
    llm::fuzz::exercise_model(*m);
  }
  LLM_FUZZ_CATCH_ERRORS
  return 0;
}
