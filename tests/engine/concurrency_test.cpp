// The threading contract of llm.h: one llm_model is shared by any number of
// threads (tokenize, detokenize, session creation, info); each llm_session is
// used by one thread at a time, and sessions of one model run in parallel.
//
// Each test first runs its workload on one thread to get the expected
// results, then runs the same workload from many threads in random
// interleavings and requires identical results: every session's tokens
// (greedy and seeded sampling), every tokenization. The TSan build
// (-DLLM_SANITIZE=thread, tests/run_reliability.sh) runs this file to prove
// the absence of data races; the normal build keeps it to a few seconds.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "llm.h"
#include "sanitizers.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

llm_model* load(const char* name, uint32_t flags = 0, int threads = 2) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = threads;
  p.flags = flags;
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(model_path(name).c_str(), &p, &m), LLM_OK) << name << ": " << llm_last_error();
  return m;
}

// Sanitizer builds run the same workload, smaller.
using llm::testing::kSanitized;

constexpr int kThreads = 8;
constexpr int kSessionsPerThread = 4;
constexpr int kSteps = kSanitized ? 60 : 200;

// One session's life as a sequence of small steps, so that a thread can
// interleave several of them at random. Step 0 creates the session and
// prefills; every later step decodes one token. Along the way it evicts,
// forks a child that decodes alongside it, swaps itself for a restored
// snapshot, and frees everything at the end. The kind of session (KV type,
// window, sampling) depends on its id.
class Runner {
 public:
  Runner(llm_model* m, int id) : m_(m), id_(id) {}
  ~Runner() {
    llm_session_free(s_);
    llm_session_free(child_);
  }

  bool done() const { return step_ > kSteps; }

  // Runs the next step; returns false on an API failure (recorded in error_).
  bool step() {
    if (step_ == 0) {
      start();
    } else if (step_ == kSteps) {
      finish();
    } else {
      decode();
    }
    ++step_;
    return error_.empty();
  }

  const std::vector<llm_token>& tokens() const { return out_; }
  const std::string& error() const { return error_; }

 private:
  void fail(const char* what) {
    if (error_.empty()) error_ = std::string(what) + " (session " + std::to_string(id_) + ", step " +
                                 std::to_string(step_) + "): " + llm_last_error();
  }

  void start() {
    llm_session_params sp;
    llm_session_params_init(&sp);
    static const llm_kv_type kKinds[] = {LLM_KV_F16, LLM_KV_F32, LLM_KV_INT8, LLM_KV_INT4};
    sp.kv_type = kKinds[id_ % 4];
    if (id_ % 5 == 3) sp.window = 64;  // sliding window: evicts on its own
    if (llm_session_create(m_, &sp, &s_) != LLM_OK) return fail("create");
    llm_sampling_init(&sampling_);
    if (id_ % 2 == 1) {
      sampling_.temperature = 0.9f;
      sampling_.top_k = 40;
      sampling_.top_p = 0.95f;
      sampling_.seed = uint64_t(1000 + id_);
    }
    // A prompt of its own: BOS and a few ids that depend on the session.
    std::vector<llm_token> prompt = {1};
    for (int i = 0; i < 3 + id_ % 7; ++i) prompt.push_back(llm_token(259 + (id_ * 37 + i * 11) % 250));
    if (llm_prefill(s_, prompt.data(), prompt.size()) != LLM_OK) return fail("prefill");
  }

  void decode() {
    llm_token t = -1;
    if (llm_decode_step(s_, &sampling_, &t) != LLM_OK) return fail("decode");
    out_.push_back(t);
    if (child_) {
      llm_token c = -1;
      if (llm_decode_step(child_, &child_sampling_, &c) != LLM_OK) return fail("decode child");
      out_.push_back(-1000 - c);  // child tokens, told apart from the parent's
    }
    if (step_ % 50 == 25) {
      llm_session_stats_t st;
      st.struct_size = sizeof st;
      if (llm_session_stats(s_, &st) != LLM_OK) return fail("stats");
      if (st.n_tokens >= 12 && llm_kv_evict(s_, 2, 6) != LLM_OK) return fail("evict");
    }
    if (step_ == kSteps / 2) {
      if (llm_session_fork(s_, &child_) != LLM_OK) return fail("fork");
      child_sampling_ = sampling_;
      child_sampling_.temperature = 0.7f;
      child_sampling_.seed = uint64_t(77 + id_);
    }
    if (step_ == kSteps / 2 + 25) {
      llm_session_free(child_);
      child_ = nullptr;
    }
    if (step_ == kSteps / 2 + 10) {  // replace the session by a restored copy of itself
      size_t n = 0;
      if (llm_session_save(s_, nullptr, 0, &n) != LLM_ERR_BUFFER_TOO_SMALL) return fail("save size");
      std::vector<unsigned char> b(n);
      if (llm_session_save(s_, b.data(), b.size(), &n) != LLM_OK) return fail("save");
      llm_session* r = nullptr;
      if (llm_session_restore(m_, b.data(), b.size(), &r) != LLM_OK) return fail("restore");
      llm_session_free(s_);
      s_ = r;
    }
  }

  void finish() {
    llm_session_free(s_);
    llm_session_free(child_);
    s_ = child_ = nullptr;
  }

  llm_model* m_;
  int id_;
  int step_ = 0;
  llm_session* s_ = nullptr;
  llm_session* child_ = nullptr;
  llm_sampling sampling_{}, child_sampling_{};
  std::vector<llm_token> out_;
  std::string error_;
};

std::vector<std::vector<llm_token>> run_alone(llm_model* m, int n) {
  std::vector<std::vector<llm_token>> out;
  for (int id = 0; id < n; ++id) {
    Runner r(m, id);
    while (!r.done())
      if (!r.step()) ADD_FAILURE() << r.error();
    out.push_back(r.tokens());
  }
  return out;
}

TEST(Concurrency, SessionsOnManyThreadsMatchSingleThreaded) {
  llm_model* m = load("stories260K.gguf");
  ASSERT_NE(m, nullptr);
  const int n = kThreads * kSessionsPerThread;
  const std::vector<std::vector<llm_token>> expected = run_alone(m, n);

  std::vector<std::vector<llm_token>> got(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::unique_ptr<Runner>> mine;
      for (int k = 0; k < kSessionsPerThread; ++k) mine.push_back(std::make_unique<Runner>(m, t * kSessionsPerThread + k));
      std::mt19937 rng(uint32_t(t + 1));
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (;;) {
        std::vector<Runner*> live;
        for (auto& r : mine)
          if (!r->done()) live.push_back(r.get());
        if (live.empty()) break;
        Runner* r = live[rng() % live.size()];
        r->step();
      }
      for (int k = 0; k < kSessionsPerThread; ++k) {
        got[size_t(t * kSessionsPerThread + k)] = mine[size_t(k)]->tokens();
        errors[size_t(t * kSessionsPerThread + k)] = mine[size_t(k)]->error();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int id = 0; id < n; ++id) {
    EXPECT_EQ(errors[size_t(id)], "") << "session " << id;
    EXPECT_EQ(got[size_t(id)], expected[size_t(id)]) << "session " << id << " diverged from its single-threaded run";
    EXPECT_GE(got[size_t(id)].size(), size_t(kSteps - 1));
  }
  llm_model_free(m);
}

// A session may move between threads (one thread at a time): it is handed
// from thread to thread every few steps.
TEST(Concurrency, SessionHandedBetweenThreads) {
  llm_model* m = load("stories260K-q8_0.gguf");
  ASSERT_NE(m, nullptr);
  const std::vector<std::vector<llm_token>> expected = run_alone(m, 3);
  std::vector<std::unique_ptr<Runner>> runners;
  for (int id = 0; id < 3; ++id) runners.push_back(std::make_unique<Runner>(m, id));
  // Each round, a fresh thread advances every runner by a few steps.
  while (!runners[0]->done() || !runners[1]->done() || !runners[2]->done()) {
    std::vector<std::thread> ts;
    for (auto& r : runners)
      ts.emplace_back([&r] {
        for (int k = 0; k < 7 && !r->done(); ++k) r->step();
      });
    for (auto& t : ts) t.join();
  }
  for (int id = 0; id < 3; ++id) {
    EXPECT_EQ(runners[size_t(id)]->error(), "");
    EXPECT_EQ(runners[size_t(id)]->tokens(), expected[size_t(id)]) << "session " << id;
  }
  runners.clear();
  llm_model_free(m);
}

std::vector<std::string> test_texts() {
  std::ifstream f(model_path("ggml-vocab-gpt-2.gguf.inp"), std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), {});
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t p; (p = all.find(sep, at)) != std::string::npos; at = p + sep.size()) out.push_back(all.substr(at, p - at));
  out.push_back("<s>[INST] <|endoftext|> caf\xC3\xA9 \xFF\xFE </s>");
  return out;
}

std::vector<llm_token> tokenize(llm_model* m, const std::string& text, uint32_t flags) {
  size_t n = 0;
  llm_tokenize(m, text.data(), text.size(), flags, nullptr, 0, &n);
  std::vector<llm_token> ids(n);
  if (llm_tokenize(m, text.data(), text.size(), flags, ids.data(), ids.size(), &n) != LLM_OK) return {-1};
  return ids;
}

std::string detokenize(llm_model* m, const std::vector<llm_token>& ids) {
  size_t n = 0;
  llm_detokenize(m, ids.data(), ids.size(), nullptr, 0, &n);
  std::string s(n, '\0');
  if (llm_detokenize(m, ids.data(), ids.size(), s.empty() ? nullptr : &s[0], s.size(), &n) != LLM_OK) return "<error>";
  return s;
}

// Tokenizers keep per-thread caches: many threads tokenizing the same and
// different texts with both tokenizer kinds get the single-threaded answers.
TEST(Concurrency, TokenizeFromManyThreads) {
  llm_model* models[3] = {load("stories260K.gguf", LLM_LOAD_VOCAB_ONLY),
                          load("ggml-vocab-llama-spm.gguf", LLM_LOAD_VOCAB_ONLY),
                          load("ggml-vocab-gpt-2.gguf", LLM_LOAD_VOCAB_ONLY)};
  for (llm_model* m : models) ASSERT_NE(m, nullptr);
  const std::vector<std::string> texts = test_texts();
  struct Expect {
    std::vector<llm_token> ids;
    std::string text;
  };
  std::vector<Expect> expected;  // [model][text][flags]
  for (llm_model* m : models)
    for (const auto& t : texts)
      for (uint32_t flags = 0; flags < 4; ++flags) {
        Expect e;
        e.ids = tokenize(m, t, flags);
        e.text = detokenize(m, e.ids);
        expected.push_back(e);
      }
  const int rounds = kSanitized ? 1 : 3;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(static_cast<uint32_t>(th));
      for (int r = 0; r < rounds; ++r) {
        for (size_t k = 0; k < expected.size(); ++k) {
          const size_t i = (k * 7 + size_t(rng() % 3) + size_t(th) * 13) % expected.size();
          llm_model* m = models[i / (texts.size() * 4)];
          const std::string& text = texts[(i / 4) % texts.size()];
          const std::vector<llm_token> ids = tokenize(m, text, uint32_t(i % 4));
          if (ids != expected[i].ids || detokenize(m, ids) != expected[i].text) mismatches.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  for (llm_model* m : models) llm_model_free(m);
}

// llm_load is thread-safe: several threads load, use and free models at the
// same time (handle registry, thread pools, page pools), while another model
// stays in use.
TEST(Concurrency, LoadUseFreeInParallel) {
  llm_model* shared = load("stories260K.gguf");
  ASSERT_NE(shared, nullptr);
  const std::vector<std::vector<llm_token>> expected = run_alone(shared, 2);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int r = 0; r < (kSanitized ? 1 : 3); ++r) {
        llm_load_params p;
        llm_load_params_init(&p);
        p.n_threads = 1 + th % 2;
        llm_model* m = nullptr;
        if (llm_load(model_path(th % 2 ? "stories260K-q4_0.gguf" : "stories260K.gguf").c_str(), &p, &m) != LLM_OK) {
          failures.fetch_add(1);
          continue;
        }
        llm_model_properties info;
        info.struct_size = sizeof info;
        if (llm_model_info(m, &info) != LLM_OK || info.vocab_size != 512) failures.fetch_add(1);
        Runner run(th % 2 ? m : shared, th % 2);
        for (int k = 0; k < 30; ++k) run.step();
        if (!run.error().empty()) failures.fetch_add(1);
        if (th % 2 == 0 &&
            !std::equal(run.tokens().begin(), run.tokens().end(), expected[0].begin()))
          failures.fetch_add(1);
        llm_model_free(m);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  llm_model_free(shared);
}

// Errors are per thread: a failing call on one thread does not change the
// message another thread reads.
// One grammar shared by sessions on several threads: its mask caches fill
// concurrently (the grammar's mutex), and every thread gets what it gets alone.
TEST(Concurrency, SessionsShareOneGrammar) {
  llm_model* m = load("stories260K.gguf");
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_from_json_schema(m, R"({"type": "object", "properties": {"name": {"type": "string"},
      "n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "n"]})", &g),
            LLM_OK)
      << llm_last_error();
  auto run = [&](uint64_t seed) {
    std::vector<llm_token> out;
    llm_session* s = nullptr;
    if (llm_session_create(m, nullptr, &s) != LLM_OK) return out;
    const llm_token bos = 1;
    llm_sampling sp;
    llm_sampling_init(&sp);
    sp.temperature = 0.9f;
    sp.seed = seed;
    sp.grammar = g;
    llm_token t = 0;
    if (llm_prefill(s, &bos, 1) == LLM_OK)
      for (int i = 0; i < 48 && llm_decode_step(s, &sp, &t) == LLM_OK && !llm_token_is_eog(m, t); ++i) out.push_back(t);
    llm_session_free(s);
    return out;
  };
  constexpr int kThreads = 4;
  std::vector<std::vector<llm_token>> got(kThreads);
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; ++i) th.emplace_back([&, i] { got[size_t(i)] = run(uint64_t(i)); });
  for (auto& t : th) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_FALSE(got[size_t(i)].empty());
    EXPECT_EQ(got[size_t(i)], run(uint64_t(i))) << "thread " << i;
  }
  llm_grammar_free(g);
  llm_model_free(m);
}

TEST(Concurrency, LastErrorIsThreadLocal) {
  llm_model* m = load("stories260K.gguf", LLM_LOAD_VOCAB_ONLY);
  ASSERT_NE(m, nullptr);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int k = 0; k < 200; ++k) {
        const llm_token bad = 100000 + th;
        char buf[8];
        size_t len = 0;
        if (llm_token_to_text(m, bad, buf, sizeof buf, &len) != LLM_ERR_INVALID_ARGUMENT) wrong.fetch_add(1);
        if (std::string(llm_last_error()).find(std::to_string(bad)) == std::string::npos) wrong.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  llm_model_free(m);
}

}  // namespace
