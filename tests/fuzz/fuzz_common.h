// Shared pieces of the fuzz targets in tests/fuzz/.
//
// Every target is written once with LLM_FUZZ_TARGET(name) { ... } and built
// two ways:
//   - as a libFuzzer binary (fuzz build, -DLLM_FUZZ=ON, clang): the macro
//     becomes LLVMFuzzerTestOneInput;
//   - into llm_fuzz_replay_tests (every build): the macro registers the body
//     under `name`, and a GoogleTest case feeds it the committed regression
//     inputs (tests/fuzz/regressions/<name>/) and the generated seed corpus.
// A target returns 0; it reports a broken invariant with LLM_FUZZ_EXPECT,
// which traps in the fuzzer (a crash to minimise) and fails the GoogleTest
// case in the replay build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llm.h"

namespace llm::fuzz {

using Entry = int (*)(const uint8_t* data, size_t size);

// Replay build only: name -> entry table (filled by static initialisers).
bool register_target(const char* name, Entry entry);
// Called by LLM_FUZZ_EXPECT in the replay build.
void report_failure(const char* file, int line, const char* what);

// Directory of the shared test models (LLM_MODELS_DIR at compile time,
// overridable at run time with the environment variable of the same name).
inline std::string models_dir() {
  const char* env = std::getenv("LLM_MODELS_DIR");
  if (env && *env) return env;
#ifdef LLM_MODELS_DIR
  return LLM_MODELS_DIR;
#else
  return "../shared/models";
#endif
}
inline std::string model_path(const char* name) { return models_dir() + "/" + name; }

// Loads a model once per process; a failed load is fatal (the harness, not
// the input, is broken).
inline llm_model* load_once(const char* file, uint32_t flags) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = 1;  // fuzzing runs one input at a time; no worker threads
  p.flags = flags;
  p.kv_budget_bytes = uint64_t(64) << 20;
  llm_model* m = nullptr;
  const std::string path = model_path(file);
  if (llm_load(path.c_str(), &p, &m) != LLM_OK) {
    std::fprintf(stderr, "fuzz harness: cannot load %s: %s\n", path.c_str(), llm_last_error());
    std::abort();
  }
  return m;
}

// Reads fields off the front of the input; past the end it yields zeros.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  size_t left() const { return n_ - off_; }
  const uint8_t* rest() const { return d_ + off_; }
  uint8_t u8() { return off_ < n_ ? d_[off_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | (u8() << 8)); }
  uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
  float f32() {
    const uint32_t b = u32();
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  // Up to n bytes (fewer at the end).
  std::vector<uint8_t> take(size_t n) {
    n = n < left() ? n : left();
    std::vector<uint8_t> v(d_ + off_, d_ + off_ + n);
    off_ += n;
    return v;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t off_ = 0;
};

// True if the status is one llm.h documents (anything else is a bug).
inline bool is_documented_status(llm_status s) {
  switch (s) {
    case LLM_OK: case LLM_ERR_INVALID_ARGUMENT: case LLM_ERR_OUT_OF_MEMORY: case LLM_ERR_IO:
    case LLM_ERR_FORMAT: case LLM_ERR_CHECKSUM: case LLM_ERR_UNSUPPORTED: case LLM_ERR_DEVICE:
    case LLM_ERR_CONTEXT_FULL: case LLM_ERR_CANCELLED: case LLM_ERR_BUFFER_TOO_SMALL:
      return true;
    default:
      return false;  // LLM_ERR_INTERNAL included: bad input must never be an "internal error"
  }
}

}  // namespace llm::fuzz

#ifdef LLM_FUZZ_REPLAY
#define LLM_FUZZ_TARGET(name)                                                                        \
  static int llm_fuzz_entry_##name(const uint8_t* data, size_t size);                               \
  static const bool llm_fuzz_registered_##name = ::llm::fuzz::register_target(#name, &llm_fuzz_entry_##name); \
  static int llm_fuzz_entry_##name(const uint8_t* data, size_t size)
#define LLM_FUZZ_EXPECT(cond)                                              \
  do {                                                                     \
    if (!(cond)) ::llm::fuzz::report_failure(__FILE__, __LINE__, #cond);   \
  } while (0)
#else
#define LLM_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
#define LLM_FUZZ_EXPECT(cond)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                   llm_last_error());                                                          \
      __builtin_trap();                                                                        \
    }                                                                                          \
  } while (0)
#endif
