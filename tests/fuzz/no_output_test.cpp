// reliability.no_output: the library prints nothing. With file descriptors 1
// and 2 redirected to a temporary file, this program loads models of every
// kind (with and without a log callback), tokenizes, generates, forks,
// saves/restores, and runs through error paths (missing, garbage, truncated
// and unsupported files, bad snapshots, misuse). Afterwards the file must be
// empty: nothing went to stdout or stderr, by stdio, iostreams or write(2).
// Exit status 0 = pass. Links the shared library (what embedders link).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "llm.h"

namespace {

int g_failures = 0;
std::vector<std::string> g_notes;  // printed after fds are restored
int g_log_lines = 0;

#define CHECK(cond)                                                                                  \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      ++g_failures;                                                                                  \
      g_notes.push_back(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": CHECK(" #cond ") failed; last error: " + \
                        llm_last_error());                                                           \
    }                                                                                                \
  } while (0)

std::string model(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

void log_cb(llm_log_level, const char* msg, void*) {
  if (msg) ++g_log_lines;
}

llm_model* load(const std::string& path, uint32_t flags, bool with_log, llm_status* st_out = nullptr) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.flags = flags;
  p.n_threads = 2;
  if (with_log) p.log = log_cb;
  llm_model* m = nullptr;
  const llm_status st = llm_load(path.c_str(), &p, &m);
  if (st_out) *st_out = st;
  return m;
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void generate(llm_model* m) {
  const char text[] = "Once upon a time";
  llm_token ids[64];
  size_t n = 0;
  CHECK(llm_tokenize(m, text, sizeof text - 1, LLM_TOKENIZE_ADD_BOS, ids, 64, &n) == LLM_OK);
  llm_session* s = nullptr;
  CHECK(llm_session_create(m, nullptr, &s) == LLM_OK);
  CHECK(llm_prefill(s, ids, n) == LLM_OK);
  llm_sampling sp;
  llm_sampling_init(&sp);
  sp.temperature = 0.8f;
  sp.top_p = 0.9f;
  llm_detok_state ds;
  llm_detok_init(&ds, ids[n - 1]);
  std::string out;
  for (int i = 0; i < 40; ++i) {
    llm_token t;
    CHECK(llm_decode_step(s, &sp, &t) == LLM_OK);
    char buf[64];
    size_t len = 0;
    CHECK(llm_detok_push(m, &ds, t, buf, sizeof buf, &len) == LLM_OK);
    out.append(buf, len);
  }
  CHECK(!out.empty());
  llm_session* f = nullptr;
  CHECK(llm_session_fork(s, &f) == LLM_OK);
  CHECK(llm_kv_evict(f, 1, 8) == LLM_OK);
  llm_token t;
  CHECK(llm_decode_step(f, nullptr, &t) == LLM_OK);
  size_t need = 0;
  CHECK(llm_session_save(s, nullptr, 0, &need) == LLM_ERR_BUFFER_TOO_SMALL);
  std::vector<char> snap(need);
  CHECK(llm_session_save(s, snap.data(), snap.size(), &need) == LLM_OK);
  llm_session* r = nullptr;
  CHECK(llm_session_restore(m, snap.data(), snap.size(), &r) == LLM_OK);
  snap[snap.size() / 2] ^= 0x40;
  llm_session* bad = nullptr;
  CHECK(llm_session_restore(m, snap.data(), snap.size(), &bad) == LLM_ERR_CHECKSUM);
  CHECK(llm_session_restore(m, snap.data(), 7, &bad) == LLM_ERR_FORMAT);
  // context full, bad ids, misuse
  llm_session_params tiny;
  llm_session_params_init(&tiny);
  tiny.max_tokens = 4;
  llm_session* c = nullptr;
  CHECK(llm_session_create(m, &tiny, &c) == LLM_OK);
  CHECK(llm_prefill(c, ids, 5) == LLM_ERR_CONTEXT_FULL);
  const llm_token bad_ids[2] = {1, 1 << 30};
  CHECK(llm_prefill(c, bad_ids, 2) == LLM_ERR_INVALID_ARGUMENT);
  CHECK(llm_decode_step(c, nullptr, &t) == LLM_ERR_INVALID_ARGUMENT);
  CHECK(llm_kv_evict(c, 3, 9) == LLM_ERR_INVALID_ARGUMENT);
  llm_session_free(c);
  llm_session_free(r);
  llm_session_free(f);
  llm_session_free(s);
  llm_session_free(s);  // freed handle: a no-op, not a crash or a message
  CHECK(llm_prefill(s, ids, 1) == LLM_ERR_INVALID_ARGUMENT);
}

void run_everything() {
  const std::string tmp = LLM_TEST_TMPDIR;
  llm_status st;
  // Missing file, a directory, garbage, a truncated GGUF, a llama2.c checkpoint (not loadable directly).
  CHECK(load(tmp + "/does-not-exist.gguf", 0, true, &st) == nullptr && st == LLM_ERR_IO);
  CHECK(load(tmp, 0, false, &st) == nullptr && st == LLM_ERR_IO);
  write_file(tmp + "/no_output_garbage.bin", std::vector<char>(1000, 'x'));
  CHECK(load(tmp + "/no_output_garbage.bin", 0, true, &st) == nullptr && st == LLM_ERR_FORMAT);
  std::vector<char> gguf = read_file(model("stories260K.gguf"));
  gguf.resize(gguf.size() / 3);
  write_file(tmp + "/no_output_truncated.gguf", gguf);
  CHECK(load(tmp + "/no_output_truncated.gguf", 0, true, &st) == nullptr && st == LLM_ERR_FORMAT);
  llm_model* vocab = load(tmp + "/no_output_truncated.gguf", LLM_LOAD_VOCAB_ONLY, false, &st);
  CHECK(vocab != nullptr || st == LLM_ERR_FORMAT);  // the vocabulary may lie in the first third
  llm_model_free(vocab);
  CHECK(load(model("stories260K.bin"), 0, true, &st) == nullptr && st == LLM_ERR_FORMAT);
  CHECK(load(model("ggml-quant-vectors.gguf"), 0, true, &st) == nullptr && st != LLM_OK);

  // Real models, with and without a log callback; vocab-only loads of both tokenizer kinds.
  for (const char* name : {"stories260K.gguf", "stories260K-q8_0.gguf", "stories260K-q4_0.gguf"}) {
    for (bool with_log : {false, true}) {
      llm_model* m = load(model(name), 0, with_log, &st);
      CHECK(m != nullptr);
      if (m) generate(m);
      llm_model_free(m);
    }
  }
  llm_model* tr = load(model("llama-2-tiny-random.gguf"), 0, false, &st);
  CHECK(tr != nullptr);
  if (tr) generate(tr);
  llm_model_free(tr);
  for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"}) {
    for (bool with_log : {false, true}) {
      llm_model* m = load(model(name), LLM_LOAD_VOCAB_ONLY, with_log, &st);
      CHECK(m != nullptr);
      const char text[] = "Hello <|endoftext|> <s> world \xFF\xFE caf\xC3\xA9";
      llm_token ids[128];
      size_t n = 0;
      CHECK(llm_tokenize(m, text, sizeof text - 1, LLM_TOKENIZE_PARSE_SPECIAL, ids, 128, &n) == LLM_OK);
      char buf[512];
      size_t len = 0;
      CHECK(llm_detokenize(m, ids, n, buf, sizeof buf, &len) == LLM_OK);
      llm_session* s = nullptr;
      CHECK(llm_session_create(m, nullptr, &s) == LLM_ERR_UNSUPPORTED);
      llm_model_free(m);
    }
  }
  // Misuse with NULLs.
  CHECK(llm_load(nullptr, nullptr, nullptr) == LLM_ERR_INVALID_ARGUMENT);
  CHECK(llm_tokenize(nullptr, "x", 1, 0, nullptr, 0, nullptr) == LLM_ERR_INVALID_ARGUMENT);
  llm_model_free(nullptr);
  llm_session_free(nullptr);
}

}  // namespace

int main() {
  const std::string capture = std::string(LLM_TEST_TMPDIR) + "/no_output_capture.txt";
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = dup(1), saved_err = dup(2);
  const int fd = open(capture.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || saved_out < 0 || saved_err < 0) {
    std::perror("no_output_test: setup");
    return 2;
  }
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);

  run_everything();

  std::fflush(stdout);
  std::fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);

  const std::vector<char> printed = read_file(capture);
  for (const std::string& n : g_notes) std::fprintf(stderr, "%s\n", n.c_str());
  if (!printed.empty()) {
    std::fprintf(stderr, "FAIL: the library wrote %zu bytes to stdout/stderr:\n%.*s\n", printed.size(),
                 int(printed.size() > 2000 ? 2000 : printed.size()), printed.data());
    return 1;
  }
  if (g_failures) {
    std::fprintf(stderr, "FAIL: %d checks failed\n", g_failures);
    return 1;
  }
  std::printf("no output on stdout/stderr; %d log lines went to the callback\n", g_log_lines);
  return 0;
}
