// Resource limits: absurd sizes in untrusted headers are refused before
// anything big is allocated; an allocation failure anywhere (llm::alloc_bytes
// through llm::alloc_fail_after, and any operator new through the probe
// below) becomes LLM_ERR_OUT_OF_MEMORY and leaves nothing half-built; a
// cancelled prefill returns LLM_ERR_CANCELLED with the session unchanged; a
// load progress callback that returns non-zero cancels the load; a failure
// inside a worker thread of the library's thread pool reaches the caller as
// a status instead of terminating the process.
//
// Leaks: every test checks that the operator-new allocations alive after a
// failed call are those alive before it; the ASan build (LeakSanitizer)
// checks the same for every allocator at exit.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "format/llm_file.h"
#include "llm.h"
#include "sanitizers.h"
#include "tmp.h"
#include "convert/llm_file_writer.h"

// ---------------------------------------------------------------- operator new probe
//
// Replaces the global operator new/delete of this test binary (pass-through
// to malloc, which ASan/TSan still intercept). While a thread "watches", the
// largest single request is recorded and requests above a cap throw
// std::bad_alloc instead of committing memory. A countdown makes the n-th
// operator new from now (any thread) throw. `live` counts allocations alive.
namespace probe {
std::atomic<int64_t> countdown{0};
std::atomic<int64_t> live{0};
std::atomic<int64_t> calls{0};
thread_local bool watching = false;
thread_local size_t max_request = 0;
constexpr size_t kCap = size_t(256) << 20;

void* allocate(size_t n, size_t align) {
  if (watching) {
    if (n > max_request) max_request = n;
    if (n > kCap) throw std::bad_alloc();
  }
  calls.fetch_add(1, std::memory_order_relaxed);
  if (countdown.load(std::memory_order_relaxed) > 0 && countdown.fetch_sub(1) == 1) throw std::bad_alloc();
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n ? n : 1);
  } else if (posix_memalign(&p, align, n ? n : 1) != 0) {
    p = nullptr;
  }
  if (!p) throw std::bad_alloc();
  live.fetch_add(1, std::memory_order_relaxed);
  return p;
}
void release(void* p) noexcept {
  if (!p) return;
  live.fetch_sub(1, std::memory_order_relaxed);
  std::free(p);
}

// Records the largest request made by this thread during its lifetime.
struct Watch {
  Watch() {
    watching = true;
    max_request = 0;
  }
  ~Watch() { watching = false; }
  size_t max() const { return max_request; }
};
}  // namespace probe

void* operator new(size_t n) { return probe::allocate(n, 0); }
void* operator new[](size_t n) { return probe::allocate(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return probe::allocate(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return probe::allocate(n, size_t(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return probe::allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
  try {
    return probe::allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return probe::allocate(n, size_t(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return probe::allocate(n, size_t(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { probe::release(p); }
void operator delete[](void* p) noexcept { probe::release(p); }
void operator delete(void* p, size_t) noexcept { probe::release(p); }
void operator delete[](void* p, size_t) noexcept { probe::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { probe::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { probe::release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { probe::release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { probe::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { probe::release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { probe::release(p); }

namespace {

using llm::testing::kSanitized;

using Bytes = std::vector<uint8_t>;

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }
using llm::testing::tmp_path;

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), {});
}
void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
template <typename T>
void put(Bytes& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}
template <typename T>
void poke(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

llm_load_params load_params(int threads = 1) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = threads;
  return p;
}

llm_model* load(const std::string& path, int threads = 1) {
  llm_load_params p = load_params(threads);
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(path.c_str(), &p, &m), LLM_OK) << path << ": " << llm_last_error();
  return m;
}

// A .llm copy of stories260K (zstd where it pays, so loading decompresses).
std::string stories_llm() {
  static std::string path;
  if (path.empty()) {
    path = tmp_path("oom_stories260K.llm");
    llm::LlmWriteOptions o;
    o.min_saving = 0.0;  // zstd wherever it saves anything: the load path decompresses
    o.chunk_bytes = 1 << 16;
    llm::write_llm(llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin")), path, o);
  }
  return path;
}

const llm_token kPrompt[] = {1, 403, 407, 261, 378};

struct Observed {
  uint32_t n_tokens = 0, n_cached = 0, kv_pages = 0;
  Bytes snapshot;
  bool operator==(const Observed& o) const {
    return n_tokens == o.n_tokens && n_cached == o.n_cached && kv_pages == o.kv_pages && snapshot == o.snapshot;
  }
};

// Everything a caller can see of a session: counters and its full snapshot.
Observed observe(llm_session* s) {
  Observed o;
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  EXPECT_EQ(llm_session_stats(s, &st), LLM_OK);
  o.n_tokens = st.n_tokens;
  o.n_cached = st.n_cached;
  o.kv_pages = st.kv_pages;
  size_t n = 0;
  EXPECT_EQ(llm_session_save(s, nullptr, 0, &n), LLM_ERR_BUFFER_TOO_SMALL);
  o.snapshot.resize(n);
  EXPECT_EQ(llm_session_save(s, o.snapshot.data(), n, &n), LLM_OK);
  return o;
}

std::vector<llm_token> greedy(llm_session* s, int n) {
  std::vector<llm_token> out;
  for (int i = 0; i < n; ++i) {
    llm_token t = -1;
    EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << llm_last_error();
    out.push_back(t);
  }
  return out;
}

// ================================================================ absurd sizes

// Runs `parse` on `bytes` watching allocations: it must throw an llm::Error
// with one of the given statuses, and no single allocation may exceed
// `limit` bytes (far below what the header claims).
template <typename Fn>
void expect_refused_cheaply(const char* what, Fn parse, std::initializer_list<llm_status> ok, size_t limit) {
  llm_status st = LLM_OK;
  size_t biggest = 0;
  {
    probe::Watch w;
    try {
      parse();
    } catch (const llm::Error& e) {
      st = e.status();
    } catch (const std::bad_alloc&) {
      st = LLM_ERR_OUT_OF_MEMORY;
    }
    biggest = w.max();
  }
  bool allowed = false;
  for (llm_status s : ok) allowed = allowed || s == st;
  EXPECT_TRUE(allowed) << what << ": status " << int(st);
  EXPECT_LE(biggest, limit) << what << ": allocated " << biggest << " bytes before refusing";
}

Bytes gguf_header(uint64_t n_tensors, uint64_t n_kv) {
  Bytes b = {'G', 'G', 'U', 'F'};
  put(b, uint32_t(3));
  put(b, n_tensors);
  put(b, n_kv);
  return b;
}
void gguf_key(Bytes& b, const std::string& k, uint32_t type) {
  put(b, uint64_t(k.size()));
  b.insert(b.end(), k.begin(), k.end());
  put(b, type);
}

TEST(AbsurdSizes, GgufCountsAreRefusedBeforeAllocating) {
  std::vector<std::pair<std::string, Bytes>> cases;
  cases.push_back({"n_kv 2^62", gguf_header(0, uint64_t(1) << 62)});
  cases.push_back({"n_tensors 2^62", gguf_header(uint64_t(1) << 62, 0)});
  {
    Bytes b = gguf_header(0, 1);
    gguf_key(b, "a", 8);
    put(b, uint64_t(1) << 63);  // string length
    cases.push_back({"string length 2^63", b});
  }
  {
    Bytes b = gguf_header(0, 1);
    gguf_key(b, "tokenizer.ggml.tokens", 9);
    put(b, uint32_t(8));
    put(b, uint64_t(1) << 60);  // array of 2^60 strings
    cases.push_back({"array count 2^60", b});
  }
  {
    Bytes b = gguf_header(0, 1);
    gguf_key(b, "x", 9);
    put(b, uint32_t(0));
    put(b, uint64_t(1) << 40);  // 2^40 u8 in a small file
    b.resize(b.size() + 4096, 0);
    cases.push_back({"u8 array 2^40", b});
  }
  {
    Bytes b = gguf_header(0, 1);
    gguf_key(b, "x", 9);
    for (int depth = 0; depth < 64; ++depth) {  // arrays of arrays, deeper than any real file
      put(b, uint32_t(9));
      put(b, uint64_t(1));
    }
    cases.push_back({"nested arrays", b});
  }
  {
    Bytes b = gguf_header(1, 0);
    put(b, uint64_t(1));
    b.push_back('t');
    put(b, uint32_t(4));  // n_dims
    for (int i = 0; i < 4; ++i) put(b, uint64_t(1) << 40);
    put(b, uint32_t(0));
    put(b, uint64_t(0));
    b.resize(b.size() + 64, 0);
    cases.push_back({"tensor of 2^160 elements", b});
  }
  {
    Bytes b = gguf_header(1, 0);
    put(b, uint64_t(1));
    b.push_back('t');
    put(b, uint32_t(1u << 30));  // n_dims
    cases.push_back({"n_dims 2^30", b});
  }
  for (auto& c : cases) {
    for (bool vocab_only : {false, true}) {
      const Bytes& bytes = c.second;
      expect_refused_cheaply(
          c.first.c_str(), [&] { llm::parse_gguf(bytes.data(), bytes.size(), vocab_only); },
          {LLM_ERR_FORMAT, LLM_ERR_UNSUPPORTED}, 1 << 20);
    }
  }
  // The same through llm_load.
  write_file(tmp_path("oom_absurd.gguf"), cases[1].second);
  llm_model* m = nullptr;
  llm_load_params p = load_params();
  EXPECT_EQ(llm_load(tmp_path("oom_absurd.gguf").c_str(), &p, &m), LLM_ERR_FORMAT);
  EXPECT_EQ(m, nullptr);
}

// Rewrites the header, metadata and table checksums of a .llm file (see
// docs/FORMAT.md: the header's last 8 bytes are its XXH3-64).
void repair_llm(Bytes& b) {
  uint32_t hs;
  std::memcpy(&hs, b.data() + 12, 4);
  auto region = [&](size_t off_field, size_t len_field, size_t sum_field) {
    uint64_t off, len;
    std::memcpy(&off, b.data() + off_field, 8);
    std::memcpy(&len, b.data() + len_field, 8);
    if (off <= b.size() && len <= b.size() - off) poke(b, sum_field, uint64_t(XXH3_64bits(b.data() + off, size_t(len))));
  };
  region(32, 40, 48);
  region(56, 64, 72);
  poke(b, hs - 8, uint64_t(XXH3_64bits(b.data(), hs - 8)));
}

TEST(AbsurdSizes, LlmFileCountsAreRefusedBeforeAllocating) {
  const Bytes good = read_file(stories_llm());
  ASSERT_GT(good.size(), 1000u);
  uint64_t table_off;
  std::memcpy(&table_off, good.data() + 56, 8);
  struct Case {
    const char* what;
    size_t off;
    uint64_t value;
    int width;
  };
  const Case cases[] = {
      {"n_tensors 2^60", 80, uint64_t(1) << 60, 8},
      {"meta_size 2^62", 40, uint64_t(1) << 62, 8},
      {"table_size 2^62", 64, uint64_t(1) << 62, 8},
      {"data_size 2^62", 96, uint64_t(1) << 62, 8},
      {"file_size 2^50", 24, uint64_t(1) << 50, 8},
      // First table entry: u32 entry_size, u32 dtype, u32 group, u32 codec, u32 n_dims, u32 chunk_bytes, u64 n_chunks
      {"entry n_dims 2^31", size_t(table_off) + 16, uint64_t(1) << 31, 4},
      {"entry n_chunks 2^60", size_t(table_off) + 24, uint64_t(1) << 60, 8},
      {"entry size 2^31", size_t(table_off), uint64_t(1) << 31, 4},
  };
  for (const Case& c : cases) {
    Bytes b = good;
    if (c.width == 8)
      poke(b, c.off, c.value);
    else
      poke(b, c.off, uint32_t(c.value));
    repair_llm(b);
    for (bool vocab_only : {false, true}) {
      llm::LlmReadOptions ro;
      ro.vocab_only = vocab_only;
      ro.verify_checksums = false;
      // A vocab-only read never looks at the tensor table or data: it may succeed.
      const bool table_field = c.off >= 56 && c.off != 24 && c.off != 40;
      expect_refused_cheaply(
          c.what, [&] { llm::parse_llm(llm::MappedFile::from_bytes(b), ro); },
          vocab_only && table_field ? std::initializer_list<llm_status>{LLM_OK, LLM_ERR_FORMAT}
                                    : std::initializer_list<llm_status>{LLM_ERR_FORMAT, LLM_ERR_UNSUPPORTED,
                                                                        LLM_ERR_CHECKSUM},
          4 * good.size());
    }
  }
}

TEST(AbsurdSizes, Llama2cHeadersAreRefusedBeforeAllocating) {
  // Checkpoint headers claiming huge shapes in a 1 KiB file.
  const int32_t headers[][7] = {{1 << 16, 1 << 19, 1 << 10, 1 << 8, 1 << 8, 1 << 22, 1 << 24},
                                {INT32_MAX, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, INT32_MAX},
                                {64, 172, 5, 8, 4, INT32_MIN, 512},
                                {64, 172, 5, 0, 0, 512, 512},
                                {-64, 172, 5, 8, 4, 512, 512}};
  int k = 0;
  for (const auto& h : headers) {
    Bytes b;
    for (int32_t v : h) put(b, v);
    b.resize(1024, 0);
    const std::string path = tmp_path("oom_ckpt" + std::to_string(k++) + ".bin");
    write_file(path, b);
    EXPECT_FALSE(llm::looks_like_llama2c(b.data(), b.size()));
    expect_refused_cheaply(
        "llama2.c checkpoint", [&] { llm::read_llama2c(path, model_path("tok512.bin")); }, {LLM_ERR_FORMAT},
        1 << 20);
  }
}

// A tokenizer file of a few bytes must not make the reader reserve room for
// the vocabulary size its checkpoint claims (up to 2^22 entries).
TEST(AbsurdSizes, Llama2cTokenizerReservesNoMoreThanTheFileHolds) {
  Bytes b;
  put(b, int32_t(16));  // max_token_length
  put(b, 0.0f);
  put(b, int32_t(1));
  b.push_back('a');
  expect_refused_cheaply(
      "tokenizer with vocab 2^22", [&] { llm::parse_llama2c_tokenizer(b.data(), b.size(), 1 << 22); },
      {LLM_ERR_FORMAT}, 1 << 20);
}

// Snapshot headers: counts far beyond the bytes present.
TEST(AbsurdSizes, SessionSnapshotCountsAreRefusedBeforeAllocating) {
  llm_model* m = load(model_path("stories260K.gguf"));
  ASSERT_NE(m, nullptr);
  llm_session* s = nullptr;
  ASSERT_EQ(llm_session_create(m, nullptr, &s), LLM_OK);
  ASSERT_EQ(llm_prefill(s, kPrompt, 5), LLM_OK);
  const Bytes good = observe(s).snapshot;
  llm_session_free(s);
  // Layout (src/engine/session.cpp): magic, version, header_bytes, then u32
  // n_layers, n_kv_heads, head_dim, page_tokens, vocab_size, dim, max_tokens,
  // window, n_sink, kv_type, flags, n_tokens, n_cached, n_pages.
  constexpr size_t kMaxTokens = 12 + 6 * 4, kTokens = 12 + 11 * 4, kCached = 12 + 12 * 4, kPages = 12 + 13 * 4;
  struct Case {
    const char* what;
    uint32_t max_tokens, n_tokens, n_cached, n_pages;
  };
  const Case cases[] = {
      {"n_tokens 2^30", 0xFFFFFFF0u, 1u << 30, 1u << 30, (1u << 30) / 16},
      {"n_tokens 2^32-1", 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0x10000000u},
      {"n_pages 2^28, few tokens", 0, 5, 5, 1u << 28},
  };
  for (const Case& c : cases) {
    Bytes b = good;
    poke(b, kMaxTokens, c.max_tokens);
    poke(b, kTokens, c.n_tokens);
    poke(b, kCached, c.n_cached);
    poke(b, kPages, c.n_pages);
    poke(b, b.size() - 8, uint64_t(XXH3_64bits(b.data(), b.size() - 8)));
    llm_session* r = nullptr;
    llm_status st;
    size_t biggest;
    {
      probe::Watch w;
      st = llm_session_restore(m, b.data(), b.size(), &r);
      biggest = w.max();
    }
    EXPECT_EQ(st, LLM_ERR_FORMAT) << c.what << ": " << llm_last_error();
    EXPECT_EQ(r, nullptr);
    EXPECT_LE(biggest, 4 * good.size()) << c.what << ": allocated " << biggest << " bytes before refusing";
    llm_session_free(r);
  }
  llm_model_free(m);
}

// ================================================================ allocation failure

// Runs call() with the n-th allocation failing, for n = 1, 2, ... until it
// succeeds, through both hooks: llm::alloc_bytes (Buffer<T>, KV pages) and
// operator new (std::vector, std::string, make_shared, ...; at up to
// max_points of the calls one run makes). A failing run must return
// LLM_ERR_OUT_OF_MEMORY with a message and, with check_leaks, leave no
// operator-new allocation behind. after(status) runs with injection off: it
// checks the documented "nothing half-built / unchanged" part and resets.
template <typename Call, typename After>
void inject_failures(const char* what, bool check_leaks, Call call, After after, int max_points = 60) {
  // A successful run first: warms up lazily created statics and caches.
  llm_status st = call();
  ASSERT_EQ(st, LLM_OK) << what << " without injected failures: " << llm_last_error();
  after(st);
  int failed = 0;
  auto judge = [&](llm_status s, int64_t live0, const char* hook, int64_t n) {
    if (s == LLM_OK) return;
    ++failed;
    EXPECT_EQ(s, LLM_ERR_OUT_OF_MEMORY) << what << ", " << hook << " #" << n << ": " << llm_last_error();
    EXPECT_STRNE(llm_last_error(), "") << what;
    if (check_leaks) {
      EXPECT_EQ(probe::live.load(), live0) << what << ": allocations leaked after " << hook << " #" << n << " failed";
    }
  };
  for (int64_t n = 1;; ++n) {
    const int64_t live0 = probe::live.load();
    llm::alloc_fail_after(n);
    st = call();
    llm::alloc_fail_after(0);
    judge(st, live0, "alloc_bytes", n);
    after(st);
    if (st == LLM_OK) break;
    ASSERT_LT(n, 10000) << what << ": never succeeds";
  }
  const int64_t c0 = probe::calls.load();
  st = call();
  const int64_t total = probe::calls.load() - c0;
  ASSERT_EQ(st, LLM_OK);
  after(st);
  const int64_t head = max_points / 2, stride = std::max<int64_t>(1, total / std::max<int64_t>(1, max_points - head));
  for (int64_t n = 1; n <= total; n += n < head ? 1 : stride) {
    const int64_t live0 = probe::live.load();
    probe::countdown.store(n);
    st = call();
    probe::countdown.store(0);
    judge(st, live0, "operator new", n);
    after(st);
  }
  EXPECT_GT(failed, 0) << what << ": no injected failure ever reached it";
}

TEST(AllocationFailure, LoadModelsOfEveryKind) {
  for (const char* name : {"stories260K.gguf", "stories260K-q8_0.gguf", "llama-2-tiny-random.gguf"}) {
    const std::string path = model_path(name);
    inject_failures(
        name, true,
        [&] {
          llm_load_params p = load_params();
          llm_model* m = reinterpret_cast<llm_model*>(&p);
          const llm_status st = llm_load(path.c_str(), &p, &m);
          if (st != LLM_OK) {
            EXPECT_EQ(m, nullptr);
          }
          llm_model_free(m);
          return st;
        },
        [](llm_status) {});
  }
  const std::string llm_path = stories_llm();
  inject_failures(
      ".llm with zstd tensors", true,
      [&] {
        llm_load_params p = load_params();
        llm_model* m = nullptr;
        const llm_status st = llm_load(llm_path.c_str(), &p, &m);
        llm_model_free(m);
        return st;
      },
      [](llm_status) {});
  const std::string gpt2 = model_path("ggml-vocab-gpt-2.gguf");
  inject_failures(
      "vocab-only GPT-2", true,
      [&] {
        llm_load_params p = load_params();
        p.flags = LLM_LOAD_VOCAB_ONLY;
        llm_model* m = nullptr;
        const llm_status st = llm_load(gpt2.c_str(), &p, &m);
        llm_model_free(m);
        return st;
      },
      [](llm_status) {}, 30);
}

class SessionOom : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = load(model_path("stories260K-q8_0.gguf"));
    ASSERT_NE(m_, nullptr);
  }
  void TearDown() override { llm_model_free(m_); }
  llm_model* m_ = nullptr;
};

TEST_F(SessionOom, CreateForkRestoreSaveTokenize) {
  llm_session* s = nullptr;
  inject_failures(
      "session create", true,
      [&] {
        s = reinterpret_cast<llm_session*>(this);
        const llm_status st = llm_session_create(m_, nullptr, &s);
        if (st != LLM_OK) {
          EXPECT_EQ(s, nullptr);
        }
        return st;
      },
      [&](llm_status) {
        llm_session_free(s);
        s = nullptr;
      });
  llm_session* src = nullptr;
  ASSERT_EQ(llm_session_create(m_, nullptr, &src), LLM_OK);
  ASSERT_EQ(llm_prefill(src, kPrompt, 5), LLM_OK);
  greedy(src, 3);
  const Observed before = observe(src);
  inject_failures(
      "fork", true,
      [&] {
        s = reinterpret_cast<llm_session*>(this);
        const llm_status st = llm_session_fork(src, &s);
        if (st != LLM_OK) {
          EXPECT_EQ(s, nullptr);
        }
        return st;
      },
      [&](llm_status st) {
        if (st == LLM_OK) {
          EXPECT_TRUE(observe(s) == before) << "the fork differs from its source";
        }
        EXPECT_TRUE(observe(src) == before) << "the source session changed";
        llm_session_free(s);
        s = nullptr;
      });
  inject_failures(
      "restore", true,
      [&] {
        s = reinterpret_cast<llm_session*>(this);
        const llm_status st = llm_session_restore(m_, before.snapshot.data(), before.snapshot.size(), &s);
        if (st != LLM_OK) {
          EXPECT_EQ(s, nullptr);
        }
        return st;
      },
      [&](llm_status st) {
        if (st == LLM_OK) {
          EXPECT_TRUE(observe(s) == before) << "the restored session differs";
        }
        llm_session_free(s);
        s = nullptr;
      });
  Bytes saved(before.snapshot.size());
  inject_failures(
      "save", true,
      [&] {
        size_t n = 0;
        return llm_session_save(src, saved.data(), saved.size(), &n);
      },
      [&](llm_status st) {
        if (st == LLM_OK) {
          EXPECT_EQ(saved, before.snapshot);
        }
        EXPECT_TRUE(observe(src) == before) << "the source session changed";
      });
  const std::string text(2000, 'a');
  std::vector<llm_token> ids(4096);
  inject_failures(
      "tokenize", false,  // the tokenizer's per-thread cache may keep what it learnt
      [&] {
        size_t n = 0;
        return llm_tokenize(m_, text.data(), text.size(), LLM_TOKENIZE_ADD_BOS, ids.data(), ids.size(), &n);
      },
      [](llm_status) {});
  llm_session_free(src);
}

// A prefill or decode that fails on an allocation leaves the session exactly
// as it was, and the session then continues as if nothing had happened.
TEST_F(SessionOom, FailedPrefillAndDecodeLeaveTheSessionUnchanged) {
  llm_session* ref = nullptr;
  ASSERT_EQ(llm_session_create(m_, nullptr, &ref), LLM_OK);
  ASSERT_EQ(llm_prefill(ref, kPrompt, 3), LLM_OK);
  greedy(ref, 2);
  ASSERT_EQ(llm_prefill(ref, kPrompt + 3, 2), LLM_OK);
  const std::vector<llm_token> want = greedy(ref, 6);
  llm_session_free(ref);

  llm_session* s = nullptr;
  Observed before;
  auto fresh = [&] {
    llm_session_free(s);
    s = nullptr;
    EXPECT_EQ(llm_session_create(m_, nullptr, &s), LLM_OK);
    EXPECT_EQ(llm_prefill(s, kPrompt, 3), LLM_OK);
    greedy(s, 2);  // a pending token: the next prefill runs it first
    before = observe(s);
  };
  fresh();
  // Session scratch buffers may grow and stay: no live-allocation check here.
  inject_failures(
      "prefill", false, [&] { return llm_prefill(s, kPrompt + 3, 2); },
      [&](llm_status st) {
        if (st != LLM_OK) {
          const Observed now = observe(s);
          EXPECT_TRUE(now == before) << "failed prefill changed the session: n_tokens " << before.n_tokens << " -> "
                                     << now.n_tokens << ", n_cached " << before.n_cached << " -> " << now.n_cached
                                     << ", kv_pages " << before.kv_pages << " -> " << now.kv_pages << ", snapshot "
                                     << (now.snapshot == before.snapshot ? "same" : "differs");
          ASSERT_EQ(llm_prefill(s, kPrompt + 3, 2), LLM_OK);  // the retry works ...
        }
        EXPECT_EQ(greedy(s, 6), want);  // ... and continues exactly like the reference
        fresh();
      });
  // A failed decode step may have run the pending token's forward pass (an
  // internal step the next call would take anyway); what the caller sees is
  // unchanged: the same tokens, and the same continuation.
  inject_failures(
      "decode", false,
      [&] {
        llm_token t = -1;
        return llm_decode_step(s, nullptr, &t);
      },
      [&](llm_status st) {
        if (st != LLM_OK) {
          const Observed now = observe(s);
          EXPECT_EQ(now.n_tokens, before.n_tokens) << "failed decode appended a token";
          ASSERT_EQ(llm_prefill(s, kPrompt + 3, 2), LLM_OK);
          EXPECT_EQ(greedy(s, 6), want) << "the session does not continue like the reference";
        }
        fresh();
      });
  llm_session_free(s);
}

// ================================================================ cancellation

struct CancelAt {
  int polls = 0;
  int cancel_at = -1;  // cancel on this poll (0-based); -1 never
  static int fn(void* user) {
    auto* c = static_cast<CancelAt*>(user);
    return c->cancel_at >= 0 && c->polls++ >= c->cancel_at ? 1 : 0;
  }
};

llm_session* cancellable(llm_model* m, CancelAt* c, uint32_t window = 0) {
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.cancel = CancelAt::fn;
  sp.cancel_user_data = c;
  sp.window = window;
  llm_session* s = nullptr;
  EXPECT_EQ(llm_session_create(m, &sp, &s), LLM_OK) << llm_last_error();
  return s;
}

std::vector<llm_token> long_prompt(size_t n) {
  std::vector<llm_token> p = {1};
  for (size_t i = 1; i < n; ++i) p.push_back(llm_token(259 + (i * 37) % 250));
  return p;
}

// After llm_kv_evict the next logits re-run the last token (dropped from the
// cache, run again at its new position). If that pass fails, the session
// keeps every token (the last one is pending again: one fewer cached) and
// the next call gives the logits of a session that never failed. The cut
// page is shared with a fork, so the re-run also copies it.
TEST_F(SessionOom, FailedRerunAfterEvictionLosesNothing) {
  const std::vector<llm_token> prompt = long_prompt(20);
  auto evicted = [&](llm_session** fork) {
    llm_session* s = nullptr;
    EXPECT_EQ(llm_session_create(m_, nullptr, &s), LLM_OK);
    EXPECT_EQ(llm_prefill(s, prompt.data(), prompt.size()), LLM_OK);
    EXPECT_EQ(llm_session_fork(s, fork), LLM_OK);
    EXPECT_EQ(llm_kv_evict(s, 17, 3), LLM_OK);  // the last cached slot is 16, the first of page 2
    return s;
  };
  llm_session* ref_fork = nullptr;
  llm_session* ref = evicted(&ref_fork);
  const float* l = nullptr;
  size_t nv = 0;
  ASSERT_EQ(llm_logits(ref, &l, &nv), LLM_OK);
  const std::vector<float> want(l, l + nv);
  const std::vector<llm_token> want_next = greedy(ref, 4);
  llm_session_free(ref);
  llm_session_free(ref_fork);

  llm_session* fork = nullptr;
  llm_session* s = evicted(&fork);
  int failures = 0;
  inject_failures(
      "logits after eviction", false,
      [&] {
        const float* p = nullptr;
        size_t n = 0;
        return llm_logits(s, &p, &n);
      },
      [&](llm_status st) {
        if (st != LLM_OK) {
          ++failures;
          const Observed now = observe(s);
          EXPECT_EQ(now.n_tokens, 17u) << "a failed re-run lost a token";
          EXPECT_EQ(now.n_cached, 16u) << "the re-run token is pending again";
        }
        const float* p = nullptr;
        size_t n = 0;
        ASSERT_EQ(llm_logits(s, &p, &n), LLM_OK) << llm_last_error();
        EXPECT_EQ(std::vector<float>(p, p + n), want) << "the retry gives other logits";
        EXPECT_EQ(greedy(s, 4), want_next);
        llm_session_free(s);
        llm_session_free(fork);
        s = evicted(&fork);
      });
  EXPECT_GT(failures, 0) << "no injected failure reached the re-run";
  llm_session_free(s);
  llm_session_free(fork);
}

class Cancel : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = load(model_path("stories260K.gguf"));
    ASSERT_NE(m_, nullptr);
  }
  void TearDown() override { llm_model_free(m_); }
  // Cancels `tokens` appended after `history` at each poll in `polls` (all
  // polls if empty). Each time the session must be unchanged (or, with a
  // sliding window, changed only by the eviction that made room), and
  // finishing the prefill afterwards must give the same continuation as a
  // session that was never cancelled.
  void check_cancel(const std::vector<llm_token>& history, bool pending, const std::vector<llm_token>& tokens,
                    std::vector<int> polls = {}, uint32_t window = 0) {
    CancelAt never;
    llm_session* ref = cancellable(m_, &never, window);
    ASSERT_EQ(llm_prefill(ref, history.data(), history.size()), LLM_OK);
    if (pending) greedy(ref, 1);
    ASSERT_EQ(llm_prefill(ref, tokens.data(), tokens.size()), LLM_OK);
    const std::vector<llm_token> want = greedy(ref, 8);
    llm_session_free(ref);

    const bool all = polls.empty();
    if (all)
      for (int at = 0; at < 200; ++at) polls.push_back(at);
    bool reached_end = false;
    for (int at : polls) {
      CancelAt c;
      llm_session* s = cancellable(m_, &c, window);
      ASSERT_EQ(llm_prefill(s, history.data(), history.size()), LLM_OK);
      if (pending) greedy(s, 1);
      const Observed before = observe(s);
      llm_session_stats_t st0;
      st0.struct_size = sizeof st0;
      llm_session_stats(s, &st0);
      c.cancel_at = at;
      c.polls = 0;
      const llm_status st = llm_prefill(s, tokens.data(), tokens.size());
      if (st == LLM_OK) {
        reached_end = true;  // more polls than the prefill makes
        llm_session_free(s);
        if (all) break;
        continue;
      }
      EXPECT_EQ(st, LLM_ERR_CANCELLED) << "cancel at poll " << at;
      EXPECT_STRNE(llm_last_error(), "");
      const Observed now = observe(s);
      if (!window) {
        EXPECT_TRUE(now == before) << "cancel at poll " << at << " changed the session: n_tokens "
                                   << before.n_tokens << " -> " << now.n_tokens << ", n_cached " << before.n_cached
                                   << " -> " << now.n_cached << ", kv_pages " << before.kv_pages << " -> "
                                   << now.kv_pages;
      } else {
        // The window's evictions remain, and with them the chunks completed
        // before the cancel (they cannot be undone once older rows are gone);
        // the sequence and the cache still agree.
        llm_session_stats_t st1;
        st1.struct_size = sizeof st1;
        llm_session_stats(s, &st1);
        const int64_t appended = int64_t(st1.n_tokens) + int64_t(st1.n_evicted - st0.n_evicted) - int64_t(st0.n_tokens);
        EXPECT_GE(appended, 0) << "cancel at poll " << at;
        EXPECT_LE(appended, int64_t(tokens.size())) << "cancel at poll " << at;
        if (st1.n_evicted == st0.n_evicted) {
          EXPECT_TRUE(now == before) << "cancel at poll " << at;
        }
        EXPECT_TRUE(st1.n_cached == st1.n_tokens || st1.n_cached + 1 == st1.n_tokens) << "cancel at poll " << at;
        EXPECT_EQ(st1.kv_pages, (st1.n_cached + 15) / 16) << "cancel at poll " << at;
      }
      c.cancel_at = -1;
      ASSERT_EQ(llm_prefill(s, tokens.data(), tokens.size()), LLM_OK);
      if (!window) {
        EXPECT_EQ(greedy(s, 8), want) << "cancel at poll " << at;
      } else {
        greedy(s, 8);  // continues; the window moved further than in the reference
      }
      llm_session_free(s);
    }
    if (all) {
      EXPECT_TRUE(reached_end);
    }
  }
  llm_model* m_ = nullptr;
};

TEST_F(Cancel, PrefillCancelledAtEveryPollLeavesTheSessionUnchanged) {
  check_cancel({}, false, {kPrompt, kPrompt + 5});
  check_cancel({kPrompt, kPrompt + 3}, true, {kPrompt + 3, kPrompt + 5});
}

// Prompts longer than one chunk (512 tokens) run in several forward passes
// (5 layers = 5 polls each): cancelling during the second one must still
// leave the session unchanged, although the first chunk had completed.
TEST_F(Cancel, LongPromptCancelledInItsSecondChunkLeavesTheSessionUnchanged) {
  check_cancel({kPrompt, kPrompt + 2}, false, long_prompt(530), {0, 4, 5, 7, 9});
}

// The same on a model with sliding-window layers (the tiny Gemma 3 of
// tests/data/families: window 8 on layers 0-4 of 6). Those layers give back
// the pages every window has left as the prompt advances; when a later chunk
// is cancelled and the completed ones are undone, the rows the window needs
// at the old end must still be there, or the retry attends to fewer
// positions than a session that was never cancelled.
class CancelWindowedModel : public Cancel {
 protected:
  void SetUp() override {
    m_ = load(std::string(LLM_TEST_DATA_DIR) + "/families/gemma3.gguf");
    ASSERT_NE(m_, nullptr);
  }
};

TEST_F(CancelWindowedModel, LongPromptCancelledInItsSecondChunkLeavesTheSessionUnchanged) {
  std::vector<llm_token> history = long_prompt(40);
  for (llm_token& t : history) t %= 512;
  std::vector<llm_token> prompt = long_prompt(530);
  for (llm_token& t : prompt) t = (t * 7) % 512;
  check_cancel(history, true, prompt, {0, 6, 7, 9, 11});
}

// With a sliding window a prefill makes room by evicting the oldest non-sink
// tokens, chunk by chunk; evicted rows cannot come back, so a cancelled
// windowed prefill may leave the window moved and the chunks before the
// cancel appended. The session stays consistent and usable. (llm.h's
// "session unchanged" needs this exception for windowed sessions; see
// docs/RELIABILITY.md.) A prompt longer than the window used to fail with
// LLM_ERR_INVALID_ARGUMENT: the second chunk's eviction was checked against
// a token list that did not hold the first chunk yet.
TEST_F(Cancel, WindowedPrefillCancelledStaysConsistent) {
  check_cancel(long_prompt(60), false, long_prompt(20), {}, 64);
  check_cancel(long_prompt(40), true, long_prompt(90), {0, 3, 6, 12}, 64);
}

// The callback is polled during prefill only: decode steps never see it.
TEST_F(Cancel, DecodeIsNotCancelled) {
  CancelAt c;
  llm_session* s = cancellable(m_, &c);
  ASSERT_EQ(llm_prefill(s, kPrompt, 5), LLM_OK);
  c.cancel_at = 0;
  llm_token t = -1;
  EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK);
  EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK);
  llm_session_free(s);
}

struct Progress {
  std::vector<float> seen;
  int cancel_at = -1;
  static int fn(float p, void* user) {
    auto* pr = static_cast<Progress*>(user);
    pr->seen.push_back(p);
    return pr->cancel_at >= 0 && int(pr->seen.size()) > pr->cancel_at ? 1 : 0;
  }
};

// With one thread the loads are deterministic, so the operator-new count can
// be compared; with two, the .llm reader verifies and decompresses in
// parallel and the cancel lands on any thread (leaks: LSan in the ASan build).
class LoadProgress : public ::testing::TestWithParam<int> {};

TEST_P(LoadProgress, NonZeroReturnCancelsAtEveryCall) {
  const int threads = GetParam();
  for (const std::string& path : {model_path("stories260K.gguf"), stories_llm()}) {
    Progress full;
    llm_load_params p = load_params(threads);
    p.progress = Progress::fn;
    p.progress_user_data = &full;
    llm_model* m = nullptr;
    ASSERT_EQ(llm_load(path.c_str(), &p, &m), LLM_OK) << llm_last_error();
    llm_model_free(m);
    ASSERT_GE(full.seen.size(), 2u) << path;
    EXPECT_EQ(full.seen.front(), 0.0f);
    EXPECT_EQ(full.seen.back(), 1.0f);
    for (size_t i = 1; i < full.seen.size(); ++i) {
      EXPECT_GE(full.seen[i], full.seen[i - 1]) << path << ": progress went backwards";
      EXPECT_LE(full.seen[i], 1.0f);
    }
    for (size_t at = 0; at < full.seen.size(); ++at) {
      Progress pr;
      pr.seen.reserve(full.seen.size() + 8);  // the callback itself allocates nothing then
      pr.cancel_at = int(at);
      p.progress_user_data = &pr;
      m = reinterpret_cast<llm_model*>(&pr);
      const int64_t live0 = probe::live.load();
      const llm_status st = llm_load(path.c_str(), &p, &m);
      if (threads > 1 && st == LLM_OK && pr.seen.size() <= at) {
        // With two threads the number of progress calls varies from load to
        // load (only the calling thread reports): this one made fewer.
        llm_model_free(m);
        continue;
      }
      EXPECT_EQ(st, LLM_ERR_CANCELLED) << path << ", cancel at call " << at;
      EXPECT_EQ(m, nullptr);
      EXPECT_STRNE(llm_last_error(), "");
      EXPECT_EQ(pr.seen.size(), at + 1) << "the callback was called again after asking to stop";
      if (st == LLM_OK) llm_model_free(m);
      if (threads == 1) {
        EXPECT_EQ(probe::live.load(), live0) << path << ": load cancelled at progress call " << at << " of "
                                             << full.seen.size() << " leaked " << probe::live.load() - live0
                                             << " allocations";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, LoadProgress, ::testing::Values(1, 2));

// ================================================================ worker threads

// An exception thrown by a task on a worker thread reaches the caller of
// ThreadPool::parallel (it used to escape the worker and call std::terminate).
TEST(ThreadPoolFailure, WorkerExceptionReachesTheCaller) {
  llm::ThreadPool pool(4);
  for (int victim = 0; victim < 4; ++victim) {
    std::atomic<int> finished{0};
    bool caught = false;
    try {
      pool.parallel([&](int ith, int) {
        if (ith == victim) llm::fail(LLM_ERR_OUT_OF_MEMORY, "task %d failed", ith);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        finished.fetch_add(1);
      });
    } catch (const llm::Error& e) {
      caught = e.status() == LLM_ERR_OUT_OF_MEMORY;
      // Every other task had finished before the exception left parallel():
      // no task still runs on the caller's (now unwound) stack frame.
      EXPECT_EQ(finished.load(), pool.size() - 1) << "victim " << victim;
    }
    EXPECT_TRUE(caught) << "victim " << victim;
    // The pool still works afterwards.
    std::atomic<int> ran{0};
    pool.parallel([&](int, int) { ran.fetch_add(1); });
    EXPECT_EQ(ran.load(), pool.size());
  }
}

// Starting worker threads can fail (thread limits, no memory for stacks).
// llm_load must then fail with a status, not terminate the process. The
// address-space limit makes thread stacks unmappable; it runs in a child
// process and is meaningless under sanitizers (their shadow memory).
TEST(ThreadPoolFailure, ThreadCreationFailureIsAStatus) {
  if (kSanitized) GTEST_SKIP() << "RLIMIT_AS cannot be used under ASan/TSan";
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        llm_model* m = nullptr;
        llm_load_params p = load_params(1);
        if (llm_load(model_path("stories260K.gguf").c_str(), &p, &m) != LLM_OK) std::_Exit(3);
        llm_model_free(m);
        rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        // Room for the heap, not for 256 thread stacks of 8 MiB.
        std::ifstream statm("/proc/self/statm");
        size_t pages = 0;
        statm >> pages;
        rl.rlim_cur = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(256) << 20);
        setrlimit(RLIMIT_AS, &rl);
        p.n_threads = 256;
        const llm_status st = llm_load(model_path("stories260K.gguf").c_str(), &p, &m);
        if (st == LLM_OK) std::_Exit(4);
        if (st != LLM_ERR_OUT_OF_MEMORY) std::_Exit(5);
        // The failure is the thread pool's, not some allocation's.
        std::_Exit(std::strstr(llm_last_error(), "worker thread") ? 0 : 6);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
