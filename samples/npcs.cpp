// npcs.cpp: eight game characters share one model and one system prompt.
//
// The shared prompt is prefilled once; each character is a session forked
// from it (its KV pages are shared copy-on-write, so the prompt is stored
// once). Worker threads generate the characters' lines in turn, while the
// main thread runs a 60 Hz "frame" loop that only polls for finished lines
// and never waits on the model: a frame's work stays far below 16.7 ms.
//
//   npcs MODEL [TURNS_PER_NPC] [TOKENS_PER_LINE]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llm.h"

namespace {

struct Npc {
  std::string name;
  llm_session* session = nullptr;
  int turns_done = 0;
};

struct Mailbox {  // finished lines, produced by workers, consumed by the frame loop
  std::mutex mu;
  std::deque<std::string> lines;
};

std::vector<llm_token> tokenize(llm_model* m, const std::string& text, uint32_t flags) {
  size_t n = 0;
  llm_tokenize(m, text.data(), text.size(), flags, nullptr, 0, &n);
  std::vector<llm_token> t(n);
  if (llm_tokenize(m, text.data(), text.size(), flags, t.data(), t.size(), &n) != LLM_OK) t.clear();
  return t;
}

// One line of a character: prefill "<Name> said", generate up to max_tokens.
std::string speak(llm_model* m, Npc& npc, int max_tokens, llm_token bos, uint64_t seed) {
  const std::vector<llm_token> cue = tokenize(m, " " + npc.name + " said", 0);
  if (llm_prefill(npc.session, cue.data(), cue.size()) != LLM_OK) return npc.name + ": (" + llm_last_error() + ")";
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 0.7f;
  samp.seed = seed;
  llm_detok_state ds;
  llm_detok_init(&ds, cue.back());
  std::string line = npc.name + " said";
  char buf[128];
  size_t len;
  for (int i = 0; i < max_tokens; ++i) {
    llm_token t;
    if (llm_decode_step(npc.session, &samp, &t) != LLM_OK || t == bos || llm_token_is_eog(m, t)) break;
    if (llm_detok_push(m, &ds, t, buf, sizeof buf, &len) == LLM_OK) line.append(buf, len);
    if (line.back() == '.' || line.back() == '!' || line.back() == '?') break;
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "../shared/models/stories260K.gguf";
  const int turns = argc > 2 ? std::atoi(argv[2]) : 2;
  const int tokens_per_line = argc > 3 ? std::atoi(argv[3]) : 24;

  llm_load_params lp;
  llm_load_params_init(&lp);
  lp.n_threads = 1;  // the parallelism is across characters (worker threads)
  llm_model* model = nullptr;
  if (llm_load(path, &lp, &model) != LLM_OK) {
    std::fprintf(stderr, "npcs: %s\n", llm_last_error());
    return 1;
  }
  llm_model_properties info;
  info.struct_size = sizeof info;
  llm_model_info(model, &info);

  // The shared "system prompt", prefilled once.
  llm_session* base = nullptr;
  llm_session_create(model, nullptr, &base);
  const std::vector<llm_token> sys =
      tokenize(model, "Once upon a time, in a small village, there lived eight friends who loved to talk.",
               LLM_TOKENIZE_ADD_BOS);
  if (!base || llm_prefill(base, sys.data(), sys.size()) != LLM_OK) {
    std::fprintf(stderr, "npcs: %s\n", llm_last_error());
    return 1;
  }
  const char* names[] = {"Lily", "Tom", "Sue", "Max", "Anna", "Ben", "Mia", "Sam"};
  std::vector<Npc> npcs(8);
  for (size_t i = 0; i < npcs.size(); ++i) {
    npcs[i].name = names[i];
    if (llm_session_fork(base, &npcs[i].session) != LLM_OK) {
      std::fprintf(stderr, "npcs: fork: %s\n", llm_last_error());
      return 1;
    }
  }
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  llm_session_stats(base, &st);
  std::printf("[shared prompt: %u tokens in %u KV pages, shared by %zu characters]\n", st.n_tokens, st.kv_pages,
              npcs.size());

  // Workers take characters in turn: worker w serves characters w, w+W, ...
  Mailbox mail;
  std::atomic<int> lines_left{int(npcs.size()) * turns};
  const int n_workers = 2;
  std::vector<std::thread> workers;
  for (int w = 0; w < n_workers; ++w) {
    workers.emplace_back([&, w] {
      for (int turn = 0; turn < turns; ++turn)
        for (size_t i = size_t(w); i < npcs.size(); i += n_workers) {
          std::string line = speak(model, npcs[i], tokens_per_line, info.bos, 1000 * i + uint64_t(turn));
          {
            std::lock_guard<std::mutex> lk(mail.mu);
            mail.lines.push_back(std::move(line));
          }
          --lines_left;
        }
    });
  }

  // The game's frame loop: 60 Hz, never blocks on the model.
  using clock = std::chrono::steady_clock;
  const auto frame = std::chrono::microseconds(16667);
  double worst_work_ms = 0;
  long frames = 0;
  auto next = clock::now();
  while (lines_left.load() > 0 || !mail.lines.empty()) {
    const auto t0 = clock::now();
    std::deque<std::string> ready;
    {
      std::unique_lock<std::mutex> lk(mail.mu, std::try_to_lock);  // never wait for a worker
      if (lk.owns_lock()) ready.swap(mail.lines);
    }
    for (const auto& l : ready) std::printf("  %s\n", l.c_str());
    const double work_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if (work_ms > worst_work_ms) worst_work_ms = work_ms;
    ++frames;
    next += frame;
    std::this_thread::sleep_until(next);
  }
  for (auto& t : workers) t.join();
  std::printf("[%ld frames at 60 Hz; longest frame work %.3f ms (budget 16.667 ms)]\n", frames, worst_work_ms);
  for (auto& n : npcs) llm_session_free(n.session);
  llm_session_free(base);
  llm_model_free(model);
  return worst_work_ms < 16.667 ? 0 : 1;
}
