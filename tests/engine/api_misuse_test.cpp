// API misuse: every exported function of llm.h called with NULLs, zero and
// huge sizes, foreign / freed / wrong-kind handles, out-of-range token ids and
// too-small buffers. Each call must return its documented status, leave a
// non-empty llm_last_error(), reset its out-parameters as documented, and
// crash nothing (the ASan build runs this suite too).
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llm.h"
#include "tmp.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }
using llm::testing::tmp_path;

llm_model* load(const char* name, uint32_t flags = 0, uint32_t page_tokens = 0, uint64_t kv_budget = 0) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = 1;
  p.flags = flags;
  p.kv_page_tokens = page_tokens;
  p.kv_budget_bytes = kv_budget;
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(model_path(name).c_str(), &p, &m), LLM_OK) << name << ": " << llm_last_error();
  return m;
}

// The status is `want` and a message explains it.
#define EXPECT_FAILS(call, want)                                        \
  do {                                                                  \
    const llm_status st_ = (call);                                      \
    EXPECT_EQ(st_, (want)) << #call << ": " << llm_last_error();        \
    EXPECT_STRNE(llm_last_error(), "") << #call << " left no message";  \
  } while (0)

const llm_token kPrompt[] = {1, 403, 407, 261, 378};  // "Once upon a time" in stories260K

// Stores any 32-bit value in an enum field the way a C caller can (in C++ a
// cast to an out-of-range enum value would itself be undefined).
template <typename E>
void set_enum(E& field, int32_t value) {
  static_assert(sizeof(E) == sizeof(int32_t), "32-bit enums");
  std::memcpy(&field, &value, sizeof value);
}

class ApiMisuse : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = load("stories260K.gguf");
    vocab_only_ = load("ggml-vocab-llama-spm.gguf", LLM_LOAD_VOCAB_ONLY);
  }
  static void TearDownTestSuite() {
    llm_model_free(model_);
    llm_model_free(vocab_only_);
    model_ = vocab_only_ = nullptr;
  }
  llm_session* new_session(uint32_t max_tokens = 0) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.max_tokens = max_tokens;
    llm_session* s = nullptr;
    EXPECT_EQ(llm_session_create(model_, &sp, &s), LLM_OK) << llm_last_error();
    return s;
  }
  static llm_model* model_;
  static llm_model* vocab_only_;
};
llm_model* ApiMisuse::model_ = nullptr;
llm_model* ApiMisuse::vocab_only_ = nullptr;

// ---------------------------------------------------------------- handles

// Pointers that are not live handles: a stack object, a heap object, a freed
// model, a freed session, and handles of the wrong kind.
TEST_F(ApiMisuse, ForeignFreedAndWrongKindHandlesAreInvalidArgument) {
  alignas(16) unsigned char stack_junk[256];
  std::memset(stack_junk, 0x5A, sizeof stack_junk);
  std::vector<unsigned char> heap_junk(256, 0xA5);
  llm_model* freed_model = load("stories260K.gguf");
  ASSERT_NE(freed_model, nullptr);
  llm_session* freed_session = new_session();
  llm_session_free(freed_session);
  llm_model_free(freed_model);
  llm_session* live = new_session();
  ASSERT_NE(live, nullptr);

  const std::vector<llm_model*> bad_models = {reinterpret_cast<llm_model*>(stack_junk),
                                              reinterpret_cast<llm_model*>(heap_junk.data()), freed_model,
                                              reinterpret_cast<llm_model*>(live)};
  const std::vector<llm_session*> bad_sessions = {reinterpret_cast<llm_session*>(stack_junk),
                                                  reinterpret_cast<llm_session*>(heap_junk.data()), freed_session,
                                                  reinterpret_cast<llm_session*>(model_)};
  for (llm_model* m : bad_models) {
    llm_model_properties info;
    info.struct_size = sizeof info;
    EXPECT_FAILS(llm_model_info(m, &info), LLM_ERR_INVALID_ARGUMENT);
    size_t n = 99;
    EXPECT_FAILS(llm_tokenize(m, "a", 1, 0, nullptr, 0, &n), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(n, 0u);
    char buf[8];
    size_t len = 99;
    EXPECT_FAILS(llm_token_to_text(m, 1, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_FAILS(llm_detokenize(m, kPrompt, 5, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(llm_token_is_eog(m, 2), 0);
    llm_detok_state ds;
    llm_detok_init(&ds, -1);
    EXPECT_FAILS(llm_detok_push(m, &ds, 5, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
    llm_session* s = reinterpret_cast<llm_session*>(&ds);
    EXPECT_FAILS(llm_session_create(m, nullptr, &s), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
    const unsigned char snap[32] = {0};
    EXPECT_FAILS(llm_session_restore(m, snap, sizeof snap, &s), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
  }
  for (llm_session* s : bad_sessions) {
    EXPECT_FAILS(llm_session_reset(s), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_FAILS(llm_prefill(s, kPrompt, 5), LLM_ERR_INVALID_ARGUMENT);
    const float* lg = reinterpret_cast<const float*>(1);
    size_t nv = 7;
    EXPECT_FAILS(llm_logits(s, &lg, &nv), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(lg, nullptr);
    EXPECT_EQ(nv, 0u);
    llm_token t = 5;
    EXPECT_FAILS(llm_decode_step(s, nullptr, &t), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(t, -1);
    EXPECT_FAILS(llm_kv_evict(s, 0, 0), LLM_ERR_INVALID_ARGUMENT);
    llm_session_stats_t st;
    st.struct_size = sizeof st;
    EXPECT_FAILS(llm_session_stats(s, &st), LLM_ERR_INVALID_ARGUMENT);
    llm_session* f = live;
    EXPECT_FAILS(llm_session_fork(s, &f), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(f, nullptr);
    size_t len = 3;
    EXPECT_FAILS(llm_session_save(s, nullptr, 0, &len), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(len, 0u);
  }
  // Freeing foreign, freed or wrong-kind handles is a no-op, and the
  // wrong-kind "frees" did not destroy the real objects.
  llm_model_free(freed_model);
  llm_session_free(freed_session);
  llm_model_free(reinterpret_cast<llm_model*>(stack_junk));
  llm_session_free(reinterpret_cast<llm_session*>(heap_junk.data()));
  llm_model_free(reinterpret_cast<llm_model*>(live));
  llm_session_free(reinterpret_cast<llm_session*>(model_));
  EXPECT_EQ(llm_prefill(live, kPrompt, 5), LLM_OK) << llm_last_error();
  llm_model_properties info;
  info.struct_size = sizeof info;
  EXPECT_EQ(llm_model_info(model_, &info), LLM_OK);
  llm_session_free(live);
  llm_session_free(live);  // double free: no-op
}

TEST_F(ApiMisuse, NullHandlesAndFreesOfNull) {
  llm_model_free(nullptr);
  llm_session_free(nullptr);
  llm_load_params_init(nullptr);
  llm_session_params_init(nullptr);
  llm_sampling_init(nullptr);
  llm_detok_init(nullptr, 0);
  llm_model_properties info;
  info.struct_size = sizeof info;
  EXPECT_FAILS(llm_model_info(nullptr, &info), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_reset(nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_prefill(nullptr, kPrompt, 1), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_token_is_eog(nullptr, 2), 0);
  llm_status odd;
  set_enum(odd, 12345);  // (negative values are only legal from C: tests/abi)
  EXPECT_NE(llm_status_string(odd), nullptr);
  EXPECT_NE(llm_status_string(LLM_STATUS_FORCE_32BIT), nullptr);
  EXPECT_NE(llm_last_error(), nullptr);
}

// A session outlives llm_model_free of its model without crashing (the
// contract asks callers not to do this; the library must still be memory-safe).
TEST_F(ApiMisuse, SessionSurvivesItsModelBeingFreedFirst) {
  llm_model* m = load("stories260K.gguf");
  ASSERT_NE(m, nullptr);
  llm_session* s = nullptr;
  ASSERT_EQ(llm_session_create(m, nullptr, &s), LLM_OK);
  llm_model_free(m);
  EXPECT_EQ(llm_prefill(s, kPrompt, 5), LLM_OK) << llm_last_error();
  llm_token t = -1;
  EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK);
  EXPECT_EQ(t, 432);  // reference/stories260K_greedy.json, first step of "Once upon a time"
  llm_session_free(s);
}

// ---------------------------------------------------------------- loading

TEST_F(ApiMisuse, LoadRejectsBadArgumentsAndFiles) {
  llm_model* m = reinterpret_cast<llm_model*>(&m);
  EXPECT_FAILS(llm_load(nullptr, nullptr, &m), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);
  EXPECT_FAILS(llm_load(model_path("stories260K.gguf").c_str(), nullptr, nullptr), LLM_ERR_INVALID_ARGUMENT);

  const std::string good = model_path("stories260K.gguf");
  llm_load_params p;
  llm_load_params_init(&p);
  p.struct_size = 0;  // never initialised
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  llm_load_params_init(&p);
  set_enum(p.device, 7);
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  set_enum(p.device, -1);
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  llm_load_params_init(&p);
  p.n_threads = -1;
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  p.n_threads = INT32_MAX;
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  llm_load_params_init(&p);
  p.flags = 0x80;
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  llm_load_params_init(&p);
  p.kv_page_tokens = UINT32_MAX;
  EXPECT_FAILS(llm_load(good.c_str(), &p, &m), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);

  EXPECT_FAILS(llm_load("", nullptr, &m), LLM_ERR_IO);
  EXPECT_FAILS(llm_load(tmp_path("definitely-missing.gguf").c_str(), nullptr, &m), LLM_ERR_IO);
  EXPECT_FAILS(llm_load(LLM_TEST_TMPDIR, nullptr, &m), LLM_ERR_IO);  // a directory
  // Not a model: empty file, text, a llama2.c checkpoint (needs llm-convert), GGUF magic only.
  const std::pair<const char*, std::string> files[] = {
      {"misuse-empty.bin", ""},
      {"misuse-text.txt", "hello, I am not a model\n"},
      {"misuse-magic.gguf", "GGUF"},
      {"misuse-llm-magic.llm", std::string("\x89LLM\r\n\x1a\n", 8)},
  };
  for (const auto& f : files) {
    std::ofstream(tmp_path(f.first), std::ios::binary) << f.second;
    EXPECT_FAILS(llm_load(tmp_path(f.first).c_str(), nullptr, &m), LLM_ERR_FORMAT);
    EXPECT_EQ(m, nullptr);
  }
  EXPECT_FAILS(llm_load(model_path("stories260K.bin").c_str(), nullptr, &m), LLM_ERR_FORMAT);
}

TEST_F(ApiMisuse, ModelInfoHonoursStructSize) {
  llm_model_properties info;
  EXPECT_FAILS(llm_model_info(model_, nullptr), LLM_ERR_INVALID_ARGUMENT);
  info.struct_size = 0;
  EXPECT_FAILS(llm_model_info(model_, &info), LLM_ERR_INVALID_ARGUMENT);
  // An older, shorter struct: only its bytes are written.
  unsigned char raw[sizeof(llm_model_properties) + 16];
  std::memset(raw, 0xEE, sizeof raw);
  const uint32_t old_size = 12;  // struct_size, vocab_size, context_length
  std::memcpy(raw, &old_size, 4);
  ASSERT_EQ(llm_model_info(model_, reinterpret_cast<llm_model_properties*>(raw)), LLM_OK);
  uint32_t vocab = 0;
  std::memcpy(&vocab, raw + 4, 4);
  EXPECT_EQ(vocab, 512u);
  for (size_t i = old_size; i < sizeof raw; ++i) ASSERT_EQ(raw[i], 0xEE) << "byte " << i << " written";
}

// ---------------------------------------------------------------- tokens

TEST_F(ApiMisuse, TokenizeArguments) {
  size_t n = 77;
  llm_token ids[16];
  EXPECT_FAILS(llm_tokenize(model_, "abc", 3, 0, ids, 16, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_tokenize(model_, nullptr, 3, 0, ids, 16, &n), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, 0u);
  EXPECT_FAILS(llm_tokenize(model_, nullptr, SIZE_MAX, 0, ids, 16, &n), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_tokenize(model_, "abc", 3, 0, nullptr, 4, &n), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_tokenize(model_, "abc", 3, 0x100, ids, 16, &n), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_tokenize(model_, "abc", 3, UINT32_MAX, ids, 16, &n), LLM_ERR_INVALID_ARGUMENT);
  // NULL text with length 0 is the empty text.
  EXPECT_EQ(llm_tokenize(model_, nullptr, 0, LLM_TOKENIZE_ADD_BOS, ids, 16, &n), LLM_OK);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(ids[0], 1);
  // Too small: the size needed comes back, nothing is written past capacity.
  const char text[] = "Once upon a time";
  llm_token small[3] = {-9, -9, -9};
  EXPECT_FAILS(llm_tokenize(model_, text, sizeof text - 1, LLM_TOKENIZE_ADD_BOS, small, 2, &n),
               LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(small[2], -9);
  EXPECT_EQ(llm_tokenize(model_, text, sizeof text - 1, LLM_TOKENIZE_ADD_BOS, ids, 5, &n), LLM_OK);
  EXPECT_EQ(std::vector<llm_token>(ids, ids + 5), std::vector<llm_token>(kPrompt, kPrompt + 5));
}

TEST_F(ApiMisuse, DetokenizeArgumentsAndBadIds) {
  char buf[64];
  size_t len = 5;
  for (llm_token bad : {-1, 512, INT32_MAX, INT32_MIN}) {
    EXPECT_FAILS(llm_token_to_text(model_, bad, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(llm_token_is_eog(model_, bad), 0);
    const llm_token seq[3] = {1, bad, 5};
    EXPECT_FAILS(llm_detokenize(model_, seq, 3, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  }
  EXPECT_FAILS(llm_token_to_text(model_, 5, buf, sizeof buf, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_token_to_text(model_, 5, nullptr, 8, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detokenize(model_, nullptr, 3, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detokenize(model_, kPrompt, 5, nullptr, 8, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detokenize(model_, kPrompt, 5, buf, sizeof buf, nullptr), LLM_ERR_INVALID_ARGUMENT);
  // Too small: the length needed, and the buffer untouched past capacity.
  std::memset(buf, '#', sizeof buf);
  EXPECT_FAILS(llm_detokenize(model_, kPrompt, 5, buf, 3, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, std::strlen("Once upon a time"));
  EXPECT_EQ(buf[3], '#');
  EXPECT_FAILS(llm_token_to_text(model_, 403, buf, 2, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 5u);  // " Once"
  EXPECT_EQ(llm_detokenize(model_, nullptr, 0, nullptr, 0, &len), LLM_OK);
  EXPECT_EQ(len, 0u);
}

TEST_F(ApiMisuse, StreamingDetokenizerState) {
  char buf[64];
  size_t len = 0;
  llm_detok_state ds;
  std::memset(&ds, 0, sizeof ds);  // not initialised
  EXPECT_FAILS(llm_detok_push(model_, &ds, 5, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_flush(&ds, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  llm_detok_init(&ds, -1);
  ds.n_pending = 9;  // corrupted
  EXPECT_FAILS(llm_detok_push(model_, &ds, 5, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_flush(&ds, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  llm_detok_init(&ds, -1);
  EXPECT_FAILS(llm_detok_push(model_, nullptr, 5, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_push(model_, &ds, 5, buf, sizeof buf, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_push(model_, &ds, 5, nullptr, 4, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_push(model_, &ds, 512, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_detok_flush(nullptr, buf, sizeof buf, &len), LLM_ERR_INVALID_ARGUMENT);
  // Too small a buffer leaves the state exactly as it was.
  const llm_detok_state before = ds;
  EXPECT_FAILS(llm_detok_push(model_, &ds, 403, buf, 1, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 4u);  // "Once" (leading space dropped at the start)
  EXPECT_EQ(std::memcmp(&before, &ds, sizeof ds), 0);
  EXPECT_EQ(llm_detok_push(model_, &ds, 403, buf, sizeof buf, &len), LLM_OK);
  EXPECT_EQ(std::string(buf, len), "Once");
  // A held-back partial UTF-8 sequence: "ö" is bytes C3 B6 = byte tokens 198, 185.
  EXPECT_EQ(llm_detok_push(model_, &ds, 198, buf, sizeof buf, &len), LLM_OK);
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(ds.n_pending, 1u);
  EXPECT_FAILS(llm_detok_flush(&ds, buf, 2, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 3u);  // one U+FFFD
  EXPECT_EQ(ds.n_pending, 1u);
  EXPECT_EQ(llm_detok_flush(&ds, buf, sizeof buf, &len), LLM_OK);
  EXPECT_EQ(std::string(buf, len), "\xEF\xBF\xBD");
}

// One llm_detok_push turns at most 3 held-back bytes plus one piece into
// output, and every byte that can never complete becomes a 3-byte U+FFFD, so
// it writes at most 3 * (3 + longest piece) bytes. (llm.h said "4 + longest
// piece": three held lead bytes followed by an invalid byte already give 12
// bytes for a 1-byte piece.)
TEST_F(ApiMisuse, DetokPushOutputIsBounded) {
  size_t longest = 0;
  for (llm_token t = 0; t < 512; ++t) {
    size_t n = 0;
    llm_token_to_text(model_, t, nullptr, 0, &n);
    longest = std::max(longest, n);
  }
  // Three lead bytes of a 4-byte sequence (held back), then an invalid byte.
  const llm_token seq[] = {3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0xFF, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 403};
  llm_detok_state ds;
  llm_detok_init(&ds, -1);
  char buf[256];
  size_t most = 0;
  for (llm_token t : seq) {
    size_t len = 0;
    ASSERT_EQ(llm_detok_push(model_, &ds, t, buf, sizeof buf, &len), LLM_OK);
    EXPECT_LE(len, 3 * (3 + longest)) << "token " << t;
    most = std::max(most, len);
  }
  EXPECT_GE(most, 12u);  // "\xFF" after three held bytes: four U+FFFD
}

// ---------------------------------------------------------------- sessions

TEST_F(ApiMisuse, SessionCreateArguments) {
  llm_session* s = reinterpret_cast<llm_session*>(&s);
  EXPECT_FAILS(llm_session_create(model_, nullptr, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_create(vocab_only_, nullptr, &s), LLM_ERR_UNSUPPORTED);
  EXPECT_EQ(s, nullptr);
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.struct_size = 0;
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  llm_session_params_init(&sp);
  set_enum(sp.kv_type, 4);
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  set_enum(sp.kv_type, -1);
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  set_enum(sp.kv_type, INT32_MIN);
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  llm_session_params_init(&sp);
  sp.window = 8;  // not more than n_sink (4) + one page (16)
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  sp.window = 64;
  sp.n_sink = UINT32_MAX;  // n_sink + page would wrap around
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  llm_session_params_init(&sp);
  sp.window = 100;
  sp.max_tokens = 50;
  EXPECT_FAILS(llm_session_create(model_, &sp, &s), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
}

TEST_F(ApiMisuse, PrefillDecodeEvictArguments) {
  llm_session* s = new_session(8);
  ASSERT_NE(s, nullptr);
  const float* lg = nullptr;
  size_t nv = 0;
  llm_token t = 0;
  // Empty session: nothing to sample from.
  EXPECT_FAILS(llm_logits(s, &lg, &nv), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_decode_step(s, nullptr, &t), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t, -1);
  EXPECT_EQ(llm_prefill(s, nullptr, 0), LLM_OK);  // nothing to do
  EXPECT_FAILS(llm_prefill(s, nullptr, 3), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_prefill(s, kPrompt, (size_t(1) << 31) + 1), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_prefill(s, kPrompt, SIZE_MAX), LLM_ERR_INVALID_ARGUMENT);
  for (llm_token bad : {-1, 512, INT32_MAX, INT32_MIN}) {
    const llm_token seq[3] = {1, 403, bad};
    EXPECT_FAILS(llm_prefill(s, seq, 3), LLM_ERR_INVALID_ARGUMENT);
  }
  const llm_token nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_FAILS(llm_prefill(s, nine, 9), LLM_ERR_CONTEXT_FULL);
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  ASSERT_EQ(llm_session_stats(s, &st), LLM_OK);
  EXPECT_EQ(st.n_tokens, 0u);  // every failure above left the session empty
  EXPECT_EQ(st.kv_pages, 0u);

  ASSERT_EQ(llm_prefill(s, kPrompt, 5), LLM_OK);
  EXPECT_FAILS(llm_logits(s, nullptr, &nv), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_logits(s, &lg, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_decode_step(s, nullptr, nullptr), LLM_ERR_INVALID_ARGUMENT);
  llm_sampling bad_sampling;
  std::memset(&bad_sampling, 0, sizeof bad_sampling);  // struct_size 0: never initialised
  EXPECT_FAILS(llm_decode_step(s, &bad_sampling, &t), LLM_ERR_INVALID_ARGUMENT);
  // Fill the 8-token context: 5 prompt + 3 sampled, the last one pending.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << i;
  EXPECT_FAILS(llm_decode_step(s, nullptr, &t), LLM_ERR_CONTEXT_FULL);
  EXPECT_FAILS(llm_prefill(s, kPrompt, 1), LLM_ERR_CONTEXT_FULL);

  // Eviction ranges outside the sequence (including uint32 wrap-around).
  ASSERT_EQ(llm_session_stats(s, &st), LLM_OK);
  const uint32_t n = st.n_tokens;
  EXPECT_FAILS(llm_kv_evict(s, n, 1), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_kv_evict(s, 0, n + 1), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_kv_evict(s, UINT32_MAX, 2), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_kv_evict(s, 2, UINT32_MAX), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_kv_evict(s, n, 0), LLM_OK);
  EXPECT_EQ(llm_kv_evict(s, 1, 4), LLM_OK);
  EXPECT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK) << llm_last_error();

  EXPECT_FAILS(llm_session_stats(s, nullptr), LLM_ERR_INVALID_ARGUMENT);
  st.struct_size = 0;
  EXPECT_FAILS(llm_session_stats(s, &st), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_fork(s, nullptr), LLM_ERR_INVALID_ARGUMENT);
  llm_session_free(s);
}

TEST_F(ApiMisuse, DecodeBatchArguments) {
  llm_session* a = new_session();
  llm_session* b = new_session();
  llm_session* empty = new_session();
  ASSERT_EQ(llm_prefill(a, kPrompt, 5), LLM_OK);
  ASSERT_EQ(llm_prefill(b, kPrompt, 3), LLM_OK);
  llm_token out[4] = {7, 7, 7, 7};
  EXPECT_EQ(llm_decode_batch(nullptr, 0, nullptr, nullptr), LLM_OK);
  EXPECT_FAILS(llm_decode_batch(nullptr, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session* two[2] = {a, b};
  EXPECT_FAILS(llm_decode_batch(two, 2, nullptr, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_decode_batch(two, 4097, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_sampling bad_sampling;
  std::memset(&bad_sampling, 0, sizeof bad_sampling);
  EXPECT_FAILS(llm_decode_batch(two, 2, &bad_sampling, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session* twice[2] = {a, a};
  EXPECT_FAILS(llm_decode_batch(twice, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session* with_null[2] = {a, nullptr};
  EXPECT_FAILS(llm_decode_batch(with_null, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session* with_model[2] = {a, reinterpret_cast<llm_session*>(model_)};
  EXPECT_FAILS(llm_decode_batch(with_model, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  // Sessions of another model.
  llm_model* other = load("stories260K.gguf");
  llm_session* foreign = nullptr;
  ASSERT_EQ(llm_session_create(other, nullptr, &foreign), LLM_OK);
  ASSERT_EQ(llm_prefill(foreign, kPrompt, 2), LLM_OK);
  llm_session* mixed[2] = {a, foreign};
  EXPECT_FAILS(llm_decode_batch(mixed, 2, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  ASSERT_EQ(llm_session_stats(a, &st), LLM_OK);
  EXPECT_EQ(st.n_tokens, 5u) << "a rejected batch advanced a session";
  // An empty session in the middle: the ones before it advance, it and the
  // ones after stay as they were, with -1 tokens.
  llm_session* three[3] = {a, empty, b};
  EXPECT_FAILS(llm_decode_batch(three, 3, nullptr, out), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out[0], 432);  // reference/stories260K_greedy.json, "Once upon a time"
  EXPECT_EQ(out[1], -1);
  EXPECT_EQ(out[2], -1);
  ASSERT_EQ(llm_session_stats(b, &st), LLM_OK);
  EXPECT_EQ(st.n_tokens, 3u);
  llm_session_free(foreign);
  llm_model_free(other);
  llm_session_free(a);
  llm_session_free(b);
  llm_session_free(empty);
}

TEST_F(ApiMisuse, SaveAndRestoreArguments) {
  llm_session* s = new_session();
  ASSERT_EQ(llm_prefill(s, kPrompt, 5), LLM_OK);
  size_t len = 0;
  EXPECT_FAILS(llm_session_save(s, nullptr, 0, nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_save(s, nullptr, 16, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_save(s, nullptr, 0, &len), LLM_ERR_BUFFER_TOO_SMALL);
  ASSERT_GT(len, 64u);
  std::vector<unsigned char> snap(len + 8, 0xCC);
  EXPECT_FAILS(llm_session_save(s, snap.data(), len - 1, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(snap[0], 0xCC);  // nothing written
  ASSERT_EQ(llm_session_save(s, snap.data(), snap.size(), &len), LLM_OK);
  EXPECT_EQ(snap[len], 0xCC);
  snap.resize(len);

  llm_session* r = reinterpret_cast<llm_session*>(&r);
  EXPECT_FAILS(llm_session_restore(model_, snap.data(), snap.size(), nullptr), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_restore(nullptr, snap.data(), snap.size(), &r), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r, nullptr);
  EXPECT_FAILS(llm_session_restore(model_, nullptr, 10, &r), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_FAILS(llm_session_restore(model_, nullptr, 0, &r), LLM_ERR_FORMAT);
  EXPECT_FAILS(llm_session_restore(model_, snap.data(), 19, &r), LLM_ERR_FORMAT);
  std::vector<unsigned char> garbage(snap.size(), 0x42);
  EXPECT_FAILS(llm_session_restore(model_, garbage.data(), garbage.size(), &r), LLM_ERR_FORMAT);
  // Every truncation is refused.
  for (size_t cut = 0; cut < snap.size(); cut += 97)
    EXPECT_NE(llm_session_restore(model_, snap.data(), cut, &r), LLM_OK) << cut;
  EXPECT_EQ(r, nullptr);
  std::vector<unsigned char> flipped = snap;
  flipped[flipped.size() / 2] ^= 1;
  EXPECT_FAILS(llm_session_restore(model_, flipped.data(), flipped.size(), &r), LLM_ERR_CHECKSUM);
  // A model of another shape, or the same model with another KV page size, or vocab-only.
  llm_model* other = load("llama-2-tiny-random.gguf");
  llm_model* paged8 = load("stories260K.gguf", 0, 8);
  EXPECT_FAILS(llm_session_restore(other, snap.data(), snap.size(), &r), LLM_ERR_UNSUPPORTED);
  EXPECT_FAILS(llm_session_restore(paged8, snap.data(), snap.size(), &r), LLM_ERR_UNSUPPORTED);
  EXPECT_FAILS(llm_session_restore(vocab_only_, snap.data(), snap.size(), &r), LLM_ERR_UNSUPPORTED);
  llm_model_free(other);
  llm_model_free(paged8);
  // No room in the KV pool.
  llm_model* small_pool = load("stories260K.gguf", 0, 0, 4096);
  EXPECT_FAILS(llm_session_restore(small_pool, snap.data(), snap.size(), &r), LLM_ERR_CONTEXT_FULL);
  llm_model_free(small_pool);
  EXPECT_EQ(r, nullptr);
  ASSERT_EQ(llm_session_restore(model_, snap.data(), snap.size(), &r), LLM_OK) << llm_last_error();
  llm_session_free(r);
  llm_session_free(s);
}

// llm_last_error is per thread and describes the failure of that thread's call.
TEST_F(ApiMisuse, LastErrorNamesTheProblem) {
  llm_session* s = new_session();
  const llm_token seq[2] = {1, 9999};
  EXPECT_EQ(llm_prefill(s, seq, 2), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()).find("9999"), std::string::npos) << llm_last_error();
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(tmp_path("nope-nope.gguf").c_str(), nullptr, &m), LLM_ERR_IO);
  EXPECT_NE(std::string(llm_last_error()).find("nope-nope.gguf"), std::string::npos) << llm_last_error();
  llm_session_free(s);
}

}  // namespace
