// llm-server: an OpenAI-compatible HTTP server over the public C API.
//
//   llm-server -m MODEL [--host 127.0.0.1] [--port 8080] [--threads N] [--parallel N] [--queue N]
//              [--ctx N] [--api-key KEY] [--max-body BYTES] [--model-name NAME]
//              [--chat-template-file T] [--prefill-chunk N] [--prefill-chunk-decoding N]
//              [--kv-budget-mib N] [--seed S] [--prompt-cache N]
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
// GET /health, GET /metrics (docs/SERVER.md).
//
// Threads. cpp-httplib's pool runs the HTTP handlers; they parse the body
// (server/request.cpp, fuzzed by tests/fuzz/fuzz_server_request.cpp), render
// the chat and compile any grammar, then hand a Job to the Scheduler and wait
// on the job's condition variable for text. One scheduler thread owns every
// llm_session and does the tokenizing (so only its thread holds a tokenizer
// word cache): each step it admits queued jobs (up to --parallel), then makes
// one llm_decode_batch_prefill call that advances every decoding job by a
// token and, in the same forward pass, prefills a bounded number of prompt
// tokens of the new jobs (so prompts neither stall running streams nor cost
// a pass of their own). Each job keeps its own sampling settings, seed and
// grammar. A job whose client went away is cancelled and its session freed
// at the start of the next step.
//
// Prompt cache. A finished request's session is kept (up to --prompt-cache
// of them, least recently used dropped first). A new request forks the kept
// session that shares the longest prefix with its prompt (the fork shares
// its KV pages copy-on-write), cuts it back to that prefix and prefills only
// the rest: a system prompt or a conversation's history is not computed
// again. The results are those of a fresh session (llm_prefill restarts the
// seed's stream; every K/V row is the same bits). When the KV pool runs
// short, the kept sessions are freed before any request fails.
#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api_strings.h"
#include "server/request.h"
#include "llm.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- options

struct Options {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed on stderr)
  int threads = 0;
  int parallel = 4;
  int queue = 32;
  uint32_t ctx = 0;  // 0: min(trained context, 4096)
  std::string api_key;
  size_t max_body = 1u << 20;
  std::string model_name;  // default: the file name without its extension
  std::string template_file;
  uint32_t prefill_chunk = 256;  // prompt tokens prefilled per scheduler step
  uint32_t prefill_chunk_decoding = 0;  // the same while a stream is decoding; 0: prefill_chunk
  uint64_t kv_budget_mib = 0;    // 0: the library's default
  bool have_seed = false;
  uint64_t seed = 0;  // for requests without a seed (else random per request)
  int prompt_cache = 16;  // finished sessions kept for their prompts' prefixes; 0: off
};

void usage() {
  std::fprintf(stderr,
               "usage: llm-server -m MODEL [--host H] [--port P] [--threads N] [--parallel N] [--queue N]\n"
               "                  [--ctx N] [--api-key KEY] [--max-body BYTES] [--model-name NAME]\n"
               "                  [--chat-template-file T] [--prefill-chunk N] [--prefill-chunk-decoding N]\n"
               "                  [--kv-budget-mib N] [--seed S] [--prompt-cache N]\n");
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

// JSON text of j; invalid UTF-8 (never expected) becomes U+FFFD instead of throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// ---------------------------------------------------------------- errors

using llm_server::ApiError;
using llm_server::bad_request;

json error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}};
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return json{{"error", err}};
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

// ---------------------------------------------------------------- metrics

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
  }
  void write(std::string& out, const char* name, const char* help) const {
    char line[256];
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, bounds_[i], cum);
      out += line;
    }
    std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n%s_sum %.6f\n%s_count %" PRIu64 "\n", name,
                  count_, name, sum_, name, count_);
    out += line;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  std::mutex mu;  // guards everything but the atomics
  std::map<std::pair<std::string, int>, uint64_t> requests;  // (endpoint, status) -> count
  uint64_t prompt_tokens = 0, generated_tokens = 0, cancelled = 0, reused_tokens = 0;
  Histogram ttft{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram batch{{1, 2, 4, 8, 16, 32, 64}};
  Histogram step_prompt{{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}};
  std::atomic<int64_t> queue_depth{0}, active{0}, kv_pages{0}, kv_bytes{0}, cached_sessions{0};

  std::string render() {
    std::string out;
    char line[256];
    std::lock_guard<std::mutex> l(mu);
    out += "# HELP llm_requests_total HTTP requests answered, by endpoint and status.\n"
           "# TYPE llm_requests_total counter\n";
    for (const auto& kv : requests) {
      std::snprintf(line, sizeof line, "llm_requests_total{endpoint=\"%s\",status=\"%d\"} %" PRIu64 "\n",
                    kv.first.first.c_str(), kv.first.second, kv.second);
      out += line;
    }
    auto scalar = [&](const char* name, const char* type, const char* help, double v) {
      std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
      out += line;
    };
    scalar("llm_prompt_tokens_total", "counter", "Prompt tokens prefilled.", double(prompt_tokens));
    scalar("llm_prompt_cache_tokens_total", "counter", "Prompt tokens taken from a kept session instead of prefilled.",
           double(reused_tokens));
    scalar("llm_prompt_cache_sessions", "gauge", "Finished sessions kept for their prompts.",
           double(cached_sessions.load()));
    scalar("llm_generated_tokens_total", "counter", "Tokens generated.", double(generated_tokens));
    scalar("llm_requests_cancelled_total", "counter", "Requests whose client went away before the end.",
           double(cancelled));
    scalar("llm_queue_depth", "gauge", "Requests waiting for a slot.", double(queue_depth.load()));
    scalar("llm_requests_active", "gauge", "Requests holding a session.", double(active.load()));
    scalar("llm_kv_pages_in_use", "gauge", "KV pages referenced by the active sessions.", double(kv_pages.load()));
    scalar("llm_kv_bytes_in_use", "gauge", "Bytes of those KV pages.", double(kv_bytes.load()));
    ttft.write(out, "llm_time_to_first_token_seconds", "Arrival of a request to its first generated token.");
    itl.write(out, "llm_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
    batch.write(out, "llm_decode_batch_sessions", "Requests advanced by one llm_decode_batch_prefill call.");
    step_prompt.write(out, "llm_step_prompt_tokens_decoding",
                      "Prompt tokens prefilled by one call that also decoded a running stream.");
    return out;
  }
};

// ---------------------------------------------------------------- jobs

enum class Phase { kQueued, kPrefill, kDecode, kDone };

// One request as the scheduler sees it. The handler fills the inputs before
// submit() and never writes them again; the scheduler owns the session and
// text stream; the rest is shared under mu.
struct Job {
  // Inputs.
  std::string prompt_text;     // tokenized by the scheduler (one thread's tokenizer cache, not one per HTTP thread)
  uint32_t tokenize_flags = 0;
  llm_server::Request req;  // as parsed (sampling, seed, stops, max_tokens, ignore_eos); req.sampling.grammar set
  std::shared_ptr<llm_grammar> grammar;     // kept alive while the job lives
  Clock::time_point arrived = Clock::now();

  // The scheduler's own.
  std::vector<llm_token> prompt;
  uint32_t max_tokens = 0;
  llm_session* session = nullptr;
  llm_text_stream* text = nullptr;
  size_t n_prefilled = 0;                 // prompt tokens in the session (taken from the cache or prefilled)
  std::vector<llm_token> generated;       // the session holds prompt + generated
  Clock::time_point last_token;

  // Shared.
  std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kQueued;
  std::string out;         // text not yet taken by the handler
  uint32_t n_generated = 0;
  std::string finish;      // "stop" or "length" once done without error
  ApiError error;          // status != 0 once failed
  std::atomic<bool> cancelled{false};
};

// ---------------------------------------------------------------- scheduler

class Scheduler {
 public:
  enum class Submit { kOk, kQueueFull, kShuttingDown };

  Scheduler(llm_model* model, const Options& opt, uint32_t ctx, Metrics& metrics)
      : model_(model), opt_(opt), ctx_(ctx), metrics_(metrics) {
    std::random_device rd;
    rng_.seed((uint64_t(rd()) << 32) ^ rd());
  }

  Submit submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_) return Submit::kShuttingDown;
      // Free slots count as room too: with --queue 0 a request still runs when one is free.
      const int64_t free_slots = std::max<int64_t>(0, opt_.parallel - metrics_.active.load());
      if (int64_t(queue_.size()) >= opt_.queue + free_slots) return Submit::kQueueFull;
      queue_.push_back(job);
      metrics_.queue_depth = int64_t(queue_.size());
    }
    cv_.notify_one();
    return Submit::kOk;
  }

  void wake() { cv_.notify_one(); }

  // Ends every job (running streams finish with "stop", the rest fail with
  // 503) and makes run() return once they are gone.
  void shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
  }

  void run();

 private:
  void start(Job& j);
  // Forks the kept session with the longest common prefix into j.session,
  // cut back to that prefix (at most all of the prompt but its last token);
  // returns the prompt tokens it holds (0: nothing kept matched).
  size_t reuse_prefix(Job& j);
  void step();
  void on_step_error(Job& j, llm_status st);
  void free_cache();
  void on_token(Job& j, llm_token tok, Clock::time_point now);
  void finish(Job& j, const char* reason);
  void fail(Job& j, const ApiError& e);
  void release(Job& j);
  void publish(Job& j, const std::string& text);
  void update_kv_gauge();

  llm_model* model_;
  const Options& opt_;
  const uint32_t ctx_;
  Metrics& metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;  // under mu_
  bool stopping_ = false;                   // under mu_

  // The scheduler thread's own.
  std::vector<std::shared_ptr<Job>> active_;
  struct Kept {
    llm_session* session;
    std::vector<llm_token> tokens;  // what the session holds
    uint64_t used;
  };
  std::vector<Kept> cache_;
  uint64_t tick_ = 0;
  std::mt19937_64 rng_;
  std::vector<char> buf_ = std::vector<char>(1 << 16);
};

void Scheduler::run() {
  Clock::time_point last_gauge;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (active_.empty()) {
        update_kv_gauge();
        cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      }
      stopping = stopping_;
      if (stopping) {
        for (auto& j : queue_) fail(*j, {503, "server_error", "shutting_down", "the server is shutting down"});
        queue_.clear();
      }
      while (!stopping && active_.size() < size_t(opt_.parallel) && !queue_.empty()) {
        active_.push_back(queue_.front());
        queue_.pop_front();
        Job& j = *active_.back();
        // A request without a seed gets --seed, or one of its own.
        if (j.req.default_seed) j.req.sampling.seed = opt_.have_seed ? opt_.seed : rng_();
      }
      metrics_.queue_depth = int64_t(queue_.size());
    }
    if (stopping) {
      for (auto& j : active_) {
        if (j->phase == Phase::kDecode) {
          size_t len = 0;
          if (j->text && llm_text_stream_flush(j->text, buf_.data(), buf_.size(), &len) == LLM_OK && len)
            publish(*j, std::string(buf_.data(), len));
          finish(*j, "stop");
        } else if (j->phase != Phase::kDone) {
          fail(*j, {503, "server_error", "shutting_down", "the server is shutting down"});
        }
      }
      active_.clear();
      free_cache();
      metrics_.active = 0;
      update_kv_gauge();
      return;
    }
    for (auto& j : active_) {
      if (j->phase == Phase::kQueued) start(*j);
      if (j->phase != Phase::kDone && j->cancelled.load()) {
        {
          std::lock_guard<std::mutex> l(metrics_.mu);
          ++metrics_.cancelled;
        }
        fail(*j, {499, "invalid_request_error", "cancelled", "the client closed the connection"});
      }
    }
    step();
    const size_t before = active_.size();
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [](const std::shared_ptr<Job>& j) { return j->phase == Phase::kDone; }),
                  active_.end());
    metrics_.active = int64_t(active_.size());
    if (active_.size() != before || Clock::now() - last_gauge > std::chrono::milliseconds(50)) {
      update_kv_gauge();
      last_gauge = Clock::now();
    }
  }
}

void Scheduler::start(Job& j) {
  if (llm_cli::tokenize(model_, j.prompt_text, j.tokenize_flags, j.prompt) != LLM_OK) {
    fail(j, {500, "server_error", "internal_error", std::string("tokenize: ") + llm_last_error()});
    return;
  }
  if (j.prompt.empty()) {
    fail(j, bad_request("the prompt is empty"));
    return;
  }
  if (j.prompt.size() >= ctx_) {
    fail(j, bad_request("the prompt has " + std::to_string(j.prompt.size()) + " tokens; the context holds " +
                            std::to_string(ctx_),
                        "context_length_exceeded"));
    return;
  }
  const uint64_t room = ctx_ - j.prompt.size();
  j.max_tokens = uint32_t(j.req.max_tokens == 0 ? room : std::min(j.req.max_tokens, room));
  // No cancel callback: prefills run in bounded chunks between the steps at
  // which a cancelled job is dropped (and a fork would carry a callback
  // whose job is gone).
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.max_tokens = ctx_;
  llm_status st = LLM_OK;
  j.n_prefilled = reuse_prefix(j);
  if (!j.session) st = llm_session_create(model_, &sp, &j.session);
  if (st == LLM_OK) {
    std::vector<const char*> stops;
    for (const std::string& s : j.req.stops) stops.push_back(s.c_str());
    st = llm_text_stream_create(model_, stops.data(), stops.size(), &j.text);
  }
  if (st != LLM_OK) {
    const bool oom = st == LLM_ERR_OUT_OF_MEMORY;
    fail(j, {oom ? 503 : 500, "server_error", oom ? "out_of_memory" : "internal_error",
             std::string("cannot start the request: ") + llm_status_string(st) + " " + llm_last_error()});
    return;
  }
  std::lock_guard<std::mutex> l(j.mu);
  j.phase = Phase::kPrefill;
}

size_t Scheduler::reuse_prefix(Job& j) {
  Kept* best = nullptr;
  size_t best_n = 0;
  for (Kept& k : cache_) {
    const size_t m = std::min(k.tokens.size(), j.prompt.size() - 1);  // the last prompt token is always run
    size_t n = 0;
    while (n < m && k.tokens[n] == j.prompt[n]) ++n;
    if (n > best_n) {
      best = &k;
      best_n = n;
    }
  }
  if (!best) return 0;
  if (llm_session_fork(best->session, &j.session) != LLM_OK) return 0;
  if (llm_kv_evict(j.session, uint32_t(best_n), uint32_t(best->tokens.size() - best_n)) != LLM_OK) {
    llm_session_free(j.session);
    j.session = nullptr;
    return 0;
  }
  best->used = ++tick_;
  std::lock_guard<std::mutex> l(metrics_.mu);
  metrics_.reused_tokens += best_n;
  return best_n;
}

void Scheduler::free_cache() {
  for (Kept& k : cache_) llm_session_free(k.session);
  cache_.clear();
  metrics_.cached_sessions = 0;
}

// One llm_decode_batch_prefill call: a token for every decoding job and, in
// the same pass, prompt tokens over the jobs still prefilling (admission
// order; a prompt's last chunk also samples its first token): at most
// opt_.prefill_chunk of them, or opt_.prefill_chunk_decoding while a job is
// decoding, since every running stream waits for the whole pass.
void Scheduler::step() {
  struct Entry {
    Job* job;
    size_t n_prompt;
    uint32_t n_tokens;  // the session's before the call (prefilling jobs)
  };
  std::vector<Entry> entries;
  std::vector<llm_session*> sessions;
  std::vector<const llm_sampling*> samplings;
  std::vector<const llm_token*> prompts;
  std::vector<size_t> n_prompts;
  std::vector<int32_t> sample;
  size_t n_decoding = 0;
  for (const auto& jp : active_) n_decoding += jp->phase == Phase::kDecode;
  const uint32_t while_decoding = opt_.prefill_chunk_decoding ? opt_.prefill_chunk_decoding : opt_.prefill_chunk;
  size_t budget = n_decoding > 0 ? std::min(opt_.prefill_chunk, while_decoding) : opt_.prefill_chunk;
  const size_t budget0 = budget;
  for (auto& jp : active_) {
    Job& j = *jp;
    size_t n = 0;
    if (j.phase == Phase::kPrefill && budget > 0) {
      n = std::min(budget, j.prompt.size() - j.n_prefilled);
      budget -= n;
    } else if (j.phase != Phase::kDecode) {
      continue;
    }
    llm_session_stats_t st;
    st.struct_size = sizeof st;
    st.n_tokens = 0;
    if (n > 0) llm_session_stats(j.session, &st);
    entries.push_back({&j, n, st.n_tokens});
    sessions.push_back(j.session);
    samplings.push_back(&j.req.sampling);
    prompts.push_back(n ? j.prompt.data() + j.n_prefilled : nullptr);
    n_prompts.push_back(n);
    sample.push_back(n == 0 || j.n_prefilled + n == j.prompt.size());
  }
  if (entries.empty()) return;
  if (n_decoding > 0) {
    std::lock_guard<std::mutex> l(metrics_.mu);
    metrics_.batch.observe(double(n_decoding));
    if (budget < budget0) metrics_.step_prompt.observe(double(budget0 - budget));
  }
  std::vector<llm_token> out(entries.size(), -1);
  const llm_status st = llm_decode_batch_prefill(sessions.data(), sessions.size(), prompts.data(), n_prompts.data(),
                                                 sample.data(), samplings.data(), out.data());
  const Clock::time_point now = Clock::now();
  // On a failure the jobs before the failing one have advanced (a chunk
  // without sampling shows only in the session's length) and it and those
  // after it have not, except for chunks that already ran in the pass: each
  // job's progress is read from its session, and the first job that did not
  // complete is the failing one.
  bool failed_seen = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    Job& j = *entries[i].job;
    const size_t n = entries[i].n_prompt;
    bool prompt_done = n > 0 && st == LLM_OK;
    if (n > 0 && st != LLM_OK) {
      llm_session_stats_t after;
      after.struct_size = sizeof after;
      prompt_done = llm_session_stats(j.session, &after) == LLM_OK && after.n_tokens == entries[i].n_tokens + n;
    }
    const bool complete = (n == 0 || prompt_done) && (!sample[i] || out[i] >= 0);
    if (prompt_done) {
      j.n_prefilled += n;
      {
        std::lock_guard<std::mutex> l(metrics_.mu);
        metrics_.prompt_tokens += n;
      }
      if (j.n_prefilled == j.prompt.size()) {
        std::lock_guard<std::mutex> l(j.mu);
        j.phase = Phase::kDecode;  // its first token comes now, or from the logits next step
      }
      j.cv.notify_all();
    }
    if (out[i] >= 0) on_token(j, out[i], now);
    if (!complete && !failed_seen && st != LLM_OK) {
      failed_seen = true;
      on_step_error(j, st);
    }
  }
}

// A failed step's job: a full KV pool first frees the kept sessions (the job
// tries again next step); otherwise a decoding job ends with "length" and a
// prefilling one fails.
void Scheduler::on_step_error(Job& j, llm_status st) {
  if ((st == LLM_ERR_CONTEXT_FULL || st == LLM_ERR_OUT_OF_MEMORY) && !cache_.empty()) {
    free_cache();
    return;
  }
  if (j.phase == Phase::kDecode && st == LLM_ERR_CONTEXT_FULL) {
    size_t len = 0;
    if (llm_text_stream_flush(j.text, buf_.data(), buf_.size(), &len) == LLM_OK && len)
      publish(j, std::string(buf_.data(), len));
    finish(j, "length");
  } else if (st == LLM_ERR_CONTEXT_FULL) {
    fail(j, {503, "server_error", "kv_cache_full", "the KV cache is full; retry later"});
  } else if (st == LLM_ERR_OUT_OF_MEMORY) {
    fail(j, {503, "server_error", "out_of_memory", "out of memory"});
  } else {
    fail(j, {500, "server_error", "internal_error",
             std::string(j.phase == Phase::kDecode ? "decode" : "prefill") + " failed: " + llm_status_string(st) + " " +
                 llm_last_error()});
  }
}

void Scheduler::on_token(Job& j, llm_token tok, Clock::time_point now) {
  {
    std::lock_guard<std::mutex> l(metrics_.mu);
    ++metrics_.generated_tokens;
    if (j.n_generated == 0)
      metrics_.ttft.observe(std::chrono::duration<double>(now - j.arrived).count());
    else
      metrics_.itl.observe(std::chrono::duration<double>(now - j.last_token).count());
  }
  j.last_token = now;
  j.generated.push_back(tok);
  uint32_t n_generated;
  {
    std::lock_guard<std::mutex> l(j.mu);
    n_generated = ++j.n_generated;
  }
  size_t len = 0;
  int32_t stopped = 0;
  if (j.req.ignore_eos && llm_token_is_eog(model_, tok)) tok = -1;  // nothing to show, nothing ends
  llm_status st = tok < 0 ? LLM_OK : llm_text_stream_push(j.text, tok, buf_.data(), buf_.size(), &len, &stopped);
  if (st == LLM_ERR_BUFFER_TOO_SMALL) {
    buf_.resize(len);  // tok >= 0 here
    st = llm_text_stream_push(j.text, tok, buf_.data(), buf_.size(), &len, &stopped);
  }
  if (st != LLM_OK) {
    fail(j, {500, "server_error", "internal_error", std::string("detokenize failed: ") + llm_last_error()});
    return;
  }
  std::string text(buf_.data(), len);
  if (stopped) {
    publish(j, text);
    finish(j, "stop");
    return;
  }
  if (n_generated >= j.max_tokens || j.prompt.size() + n_generated >= ctx_) {
    if (llm_text_stream_flush(j.text, buf_.data(), buf_.size(), &len) == LLM_OK) text.append(buf_.data(), len);
    publish(j, text);
    finish(j, "length");
    return;
  }
  if (!text.empty()) publish(j, text);
}

void Scheduler::publish(Job& j, const std::string& text) {
  if (text.empty()) return;
  {
    std::lock_guard<std::mutex> l(j.mu);
    j.out += text;
  }
  j.cv.notify_all();
}

void Scheduler::release(Job& j) {
  llm_session_free(j.session);  // its KV pages go back to the pool now
  j.session = nullptr;
  llm_text_stream_free(j.text);
  j.text = nullptr;
}

void Scheduler::finish(Job& j, const char* reason) {
  if (opt_.prompt_cache > 0 && j.session) {
    // Kept for its prefix if the session holds exactly prompt + generated.
    llm_session_stats_t st;
    st.struct_size = sizeof st;
    std::vector<llm_token> tokens = j.prompt;
    tokens.insert(tokens.end(), j.generated.begin(), j.generated.end());
    if (llm_session_stats(j.session, &st) == LLM_OK && st.n_tokens == tokens.size()) {
      if (cache_.size() >= size_t(opt_.prompt_cache)) {
        auto lru = std::min_element(cache_.begin(), cache_.end(),
                                    [](const Kept& a, const Kept& b) { return a.used < b.used; });
        llm_session_free(lru->session);
        cache_.erase(lru);
      }
      cache_.push_back({j.session, std::move(tokens), ++tick_});
      metrics_.cached_sessions = int64_t(cache_.size());
      j.session = nullptr;
    }
  }
  release(j);
  {
    std::lock_guard<std::mutex> l(j.mu);
    j.finish = reason;
    j.phase = Phase::kDone;
  }
  j.cv.notify_all();
}

void Scheduler::fail(Job& j, const ApiError& e) {
  release(j);
  {
    std::lock_guard<std::mutex> l(j.mu);
    j.error = e;
    j.phase = Phase::kDone;
  }
  j.cv.notify_all();
}

void Scheduler::update_kv_gauge() {
  int64_t pages = 0, bytes = 0;
  for (auto& j : active_) {
    if (!j->session) continue;
    llm_session_stats_t s;
    s.struct_size = sizeof s;
    if (llm_session_stats(j->session, &s) != LLM_OK) continue;
    pages += s.kv_pages;
    bytes += int64_t(s.kv_bytes);
  }
  metrics_.kv_pages = pages;
  metrics_.kv_bytes = bytes;
}

// ---------------------------------------------------------------- the server

class Server;
std::atomic<bool> g_signalled{false};      // SIGINT/SIGTERM arrived
std::atomic<Server*> g_server{nullptr};    // the server to stop, once it exists

class Server {
 public:
  Server(llm_model* model, const Options& opt, uint32_t ctx, std::string tpl)
      : model_(model), opt_(opt), ctx_(ctx), tpl_(std::move(tpl)), sched_(model, opt, ctx, metrics_) {
    std::random_device rd;
    id_rng_.seed((uint64_t(rd()) << 32) ^ rd());
  }

  int run();                // returns the process exit status
  void stop();              // from the signal thread
  Scheduler& scheduler() { return sched_; }

 private:
  bool authorized(const httplib::Request& req) const;
  void completions(const httplib::Request& req, httplib::Response& res, bool chat);
  ApiError build_job(llm_server::Request r, bool chat, Job& job);
  ApiError json_object_grammar(std::shared_ptr<llm_grammar>& out);
  std::string new_id(const char* prefix);

  llm_model* model_;
  const Options& opt_;
  const uint32_t ctx_;
  const std::string tpl_;
  Metrics metrics_;
  Scheduler sched_;
  httplib::Server http_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> listening_done_{false};
  std::atomic<int> in_flight_{0};  // completion requests not yet fully answered
  std::mutex grammar_mu_;
  std::shared_ptr<llm_grammar> json_grammar_;  // {"type":"json_object"}, compiled on first use
  std::mutex id_mu_;
  std::mt19937_64 id_rng_;
  const int64_t created_ = int64_t(std::time(nullptr));
};

bool Server::authorized(const httplib::Request& req) const {
  if (opt_.api_key.empty()) return true;
  const std::string want = "Bearer " + opt_.api_key;
  const std::string got = req.get_header_value("Authorization");
  // Compare in time independent of where the strings differ.
  unsigned diff = unsigned(got.size() ^ want.size());
  for (size_t i = 0; i < want.size(); ++i) diff |= unsigned(uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0));
  return diff == 0;
}

std::string Server::new_id(const char* prefix) {
  std::lock_guard<std::mutex> l(id_mu_);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016" PRIx64 "%08" PRIx64, prefix, id_rng_(), id_rng_() & 0xffffffffu);
  return buf;
}

ApiError Server::json_object_grammar(std::shared_ptr<llm_grammar>& out) {
  std::lock_guard<std::mutex> l(grammar_mu_);
  if (!json_grammar_) {
    llm_grammar* g = nullptr;
    const llm_status st = llm_grammar_from_json_schema(model_, "{\"type\":\"object\"}", &g);
    if (st != LLM_OK)
      return {500, "server_error", "internal_error", std::string("json grammar: ") + llm_last_error()};
    json_grammar_.reset(g, llm_grammar_free);
  }
  out = json_grammar_;
  return {};
}

llm_status render_chat(const llm_model* model, const std::string& tpl, const std::vector<std::string>& roles,
                       const std::vector<std::string>& contents, std::string& out) {
  std::vector<llm_chat_message> msgs;
  for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i].c_str(), contents[i].c_str()});
  return llm_cli::render_chat(model, tpl, msgs, true, out);
}

// Fills job from a parsed request: renders the chat, compiles the grammar.
ApiError Server::build_job(llm_server::Request r, bool chat, Job& job) {
  if (chat) {
    const llm_status st = render_chat(model_, tpl_, r.roles, r.contents, job.prompt_text);
    if (st == LLM_ERR_INVALID_ARGUMENT)
      return bad_request(std::string("chat template: ") + llm_last_error(), "invalid_messages");
    if (st != LLM_OK)
      return {500, "server_error", "chat_template",
              std::string("cannot render the chat (start the server with --chat-template-file?): ") +
                  llm_last_error()};
    job.tokenize_flags = LLM_TOKENIZE_PARSE_SPECIAL;
  } else {
    job.prompt_text = std::move(r.prompt);
    job.tokenize_flags = LLM_TOKENIZE_ADD_BOS | LLM_TOKENIZE_PARSE_SPECIAL;
  }
  if (r.format == llm_server::ResponseFormat::kJsonObject) {
    const ApiError e = json_object_grammar(job.grammar);
    if (e.status) return e;
  } else if (r.format == llm_server::ResponseFormat::kJsonSchema) {
    llm_grammar* g = nullptr;
    const llm_status st = llm_grammar_from_json_schema(model_, r.schema.c_str(), &g);
    if (st != LLM_OK) return bad_request(std::string("json_schema: ") + llm_last_error(), "invalid_schema");
    job.grammar.reset(g, llm_grammar_free);
  }
  r.sampling.grammar = job.grammar.get();
  job.req = std::move(r);
  return {};
}

// Counts a completion request from its handler's start to the end of its
// response (for a stream: until cpp-httplib drops the provider).
struct InFlight {
  explicit InFlight(std::atomic<int>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }
  std::atomic<int>& n_;
};

void Server::completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto in_flight = std::make_shared<InFlight>(in_flight_);  // before reading stopping_: see stop()
  if (stopping_) {
    send_error(res, {503, "server_error", "shutting_down", "the server is shutting down"});
    return;
  }
  llm_server::Request r;
  ApiError err = llm_server::parse_request(req.body, chat, opt_.model_name, r);
  const bool stream = r.stream, include_usage = r.include_usage;
  auto job = std::make_shared<Job>();
  if (!err.status) err = build_job(std::move(r), chat, *job);
  if (err.status) {
    send_error(res, err);
    return;
  }
  switch (sched_.submit(job)) {
    case Scheduler::Submit::kOk:
      break;
    case Scheduler::Submit::kQueueFull:
      res.set_header("Retry-After", "1");
      send_error(res, {429, "rate_limit_error", "queue_full", "too many requests are waiting; retry later"});
      return;
    case Scheduler::Submit::kShuttingDown:
      send_error(res, {503, "server_error", "shutting_down", "the server is shutting down"});
      return;
  }
  // Wait for the prompt to be in the cache (or for a failure): until then
  // an error can still be an HTTP status.
  {
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->phase == Phase::kDecode || job->phase == Phase::kDone; });
    if (job->error.status) {
      send_error(res, job->error);
      return;
    }
  }
  const std::string id = new_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = int64_t(std::time(nullptr));
  const std::string model_name = opt_.model_name;
  const size_t n_prompt = job->prompt.size();
  auto usage = [n_prompt](uint32_t n_gen) {
    return json{{"prompt_tokens", n_prompt}, {"completion_tokens", n_gen}, {"total_tokens", n_prompt + n_gen}};
  };

  if (!stream) {
    std::unique_lock<std::mutex> l(job->mu);
    job->cv.wait(l, [&] { return job->phase == Phase::kDone; });
    if (job->error.status) {
      send_error(res, job->error);
      return;
    }
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", job->finish}};
    if (chat)
      choice["message"] = {{"role", "assistant"}, {"content", job->out}};
    else
      choice["text"] = job->out;
    const json r = {{"id", id},
                    {"object", chat ? "chat.completion" : "text_completion"},
                    {"created", created},
                    {"model", model_name},
                    {"system_fingerprint", nullptr},
                    {"choices", json::array({choice})},
                    {"usage", usage(job->n_generated)}};
    res.set_content(dump(r), "application/json");
    return;
  }

  // Server-sent events; one provider call writes the whole stream.
  auto chunk = [=](const json& delta_or_text, const json& finish) {
    json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    if (chat)
      choice["delta"] = delta_or_text;
    else
      choice["text"] = delta_or_text;
    return json{{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_name},
                {"system_fingerprint", nullptr},
                {"choices", json::array({choice})}};
  };
  Scheduler* sched = &sched_;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [=](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& data) {
          const std::string ev = "data: " + data + "\n\n";
          return sink.write(ev.data(), ev.size());
        };
        auto cancel = [&] {
          job->cancelled = true;
          sched->wake();
          return false;
        };
        if (chat && !send(dump(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr)))) return cancel();
        for (;;) {
          std::string text;
          bool done;
          {
            std::unique_lock<std::mutex> l(job->mu);
            job->cv.wait(l, [&] { return !job->out.empty() || job->phase == Phase::kDone; });
            text.swap(job->out);
            done = job->phase == Phase::kDone;
          }
          if (!text.empty() && !send(dump(chunk(chat ? json{{"content", text}} : json(text), nullptr))))
            return cancel();
          if (done) break;
        }
        std::string finish;
        ApiError error;
        uint32_t n_gen;
        {
          std::lock_guard<std::mutex> l(job->mu);
          finish = job->finish;
          error = job->error;
          n_gen = job->n_generated;
        }
        if (error.status) {
          if (!send(dump(error_json(error)))) return false;
        } else {
          if (!send(dump(chunk(chat ? json::object() : json(""), finish)))) return false;
          if (include_usage) {
            json u = chunk(json::object(), nullptr);
            u["choices"] = json::array();
            u["usage"] = usage(n_gen);
            if (!send(dump(u))) return false;
          }
        }
        if (!send("[DONE]")) return false;
        sink.done();
        return true;
      },
      [job, sched, in_flight](bool success) {
        (void)in_flight;  // released with the provider, once the stream is written
        if (!success) {  // the scheduler ignores it once the job is done
          job->cancelled = true;
          sched->wake();
        }
      });
}

void Server::stop() {
  // New requests get 503 from here on; the scheduler ends the running ones
  // (streams get their last event and [DONE]). Only once every response is
  // written does the listener close: cpp-httplib never starts a chunked
  // provider after stop(), which would cut a stream without its end.
  stopping_ = true;
  sched_.shutdown();
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(15);
  while (in_flight_ > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  while (!http_.is_running() && !listening_done_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (http_.is_running()) http_.stop();
}

int Server::run() {
  const size_t n_http = size_t(opt_.parallel + opt_.queue + 16);
  http_.new_task_queue = [n_http] { return new httplib::ThreadPool(n_http); };
  http_.set_payload_max_length(opt_.max_body);
  http_.set_keep_alive_timeout(5);
  http_.set_read_timeout(30);
  http_.set_write_timeout(30);

  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // cpp-httplib 0.11 does not bound chunked request bodies.
    if (req.method == "POST" && req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
      send_error(res, {411, "invalid_request_error", "length_required", "send a Content-Length"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                  httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "invalid_request_error", "", ""};
    switch (res.status) {
      case 404: e.code = "unknown_url"; e.message = "Unknown request URL: " + req.method + " " + req.path; break;
      case 413: e.code = "request_too_large"; e.message = "the request body is too large"; break;
      case 400: e.code = "bad_request"; e.message = "malformed HTTP request"; break;
      default:
        e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
        e.message = "HTTP status " + std::to_string(res.status);
    }
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, "server_error", "internal_error", what});
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"};
    std::string ep = "other";
    for (const char* k : known)
      if (req.path == k) ep = k;
    if (req.path.rfind("/v1/models/", 0) == 0) ep = "/v1/models";
    std::lock_guard<std::mutex> l(metrics_.mu);
    ++metrics_.requests[{ep, res.status}];
  });

  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  auto guarded = [this](Handler h) {
    return [this, h](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req)) {
        send_error(res, {401, "invalid_request_error", "invalid_api_key", "Incorrect or missing API key"});
        return;
      }
      h(req, res);
    };
  };
  http_.Post("/v1/chat/completions",
             guarded([this](const httplib::Request& q, httplib::Response& r) { completions(q, r, true); }));
  http_.Post("/v1/completions",
             guarded([this](const httplib::Request& q, httplib::Response& r) { completions(q, r, false); }));
  auto model_json = [this] {
    llm_model_properties p;
    p.struct_size = sizeof p;
    llm_model_info(model_, &p);
    return json{{"id", opt_.model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "libllm"},
                {"meta",
                 {{"architecture", p.architecture},
                  {"weight_type", p.weight_type},
                  {"n_params", p.n_params},
                  {"vocab_size", p.vocab_size},
                  {"context_length", ctx_}}}};
  };
  http_.Get("/v1/models", guarded([model_json](const httplib::Request&, httplib::Response& r) {
              r.set_content(dump(json{{"object", "list"}, {"data", json::array({model_json()})}}),
                            "application/json");
            }));
  http_.Get(R"(/v1/models/(.+))", guarded([this, model_json](const httplib::Request& q, httplib::Response& r) {
              if (q.matches[1] != opt_.model_name) {
                send_error(r, {404, "invalid_request_error", "model_not_found",
                               "The model '" + std::string(q.matches[1]) + "' does not exist"});
                return;
              }
              r.set_content(dump(model_json()), "application/json");
            }));
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    if (stopping_) {
      r.status = 503;
      r.set_content("{\"status\":\"shutting down\"}", "application/json");
    } else {
      r.set_content("{\"status\":\"ok\"}", "application/json");
    }
  });
  http_.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& r) {
              r.set_content(metrics_.render(), "text/plain; version=0.0.4");
            }));

  std::thread sched_thread([this] { sched_.run(); });
  int port = opt_.port;
  bool bound;
  if (port == 0) {
    port = http_.bind_to_any_port(opt_.host);
    bound = port > 0;
  } else {
    bound = http_.bind_to_port(opt_.host, port);
  }
  int rc = 0;
  if (!bound) {
    std::fprintf(stderr, "llm-server: cannot listen on %s:%d\n", opt_.host.c_str(), opt_.port);
    rc = 1;
  } else if (!stopping_ && !g_signalled) {
    std::fprintf(stderr, "llm-server: listening on http://%s:%d (model '%s', context %u, parallel %d, queue %d)\n",
                 opt_.host.c_str(), port, opt_.model_name.c_str(), ctx_, opt_.parallel, opt_.queue);
    std::fflush(stderr);
    http_.listen_after_bind();
  }
  listening_done_ = true;
  sched_.shutdown();
  sched_thread.join();
  return rc;
}

bool parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage();
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "llm-server: '%s' needs a value or is unknown\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    char* end = nullptr;
    auto integer = [&](long long lo, long long hi, long long& out) {
      out = std::strtoll(v, &end, 10);
      if (*v == 0 || *end != 0 || out < lo || out > hi) {
        std::fprintf(stderr, "llm-server: bad value '%s' for %s\n", v, a.c_str());
        return false;
      }
      return true;
    };
    long long n = 0;
    if (a == "-m" || a == "--model") o.model_path = v;
    else if (a == "--host") o.host = v;
    else if (a == "--port") { if (!integer(0, 65535, n)) return false; o.port = int(n); }
    else if (a == "--threads" || a == "-t") { if (!integer(0, 1024, n)) return false; o.threads = int(n); }
    else if (a == "--parallel") { if (!integer(1, 256, n)) return false; o.parallel = int(n); }
    else if (a == "--queue") { if (!integer(0, 4096, n)) return false; o.queue = int(n); }
    else if (a == "--ctx") { if (!integer(0, 1 << 24, n)) return false; o.ctx = uint32_t(n); }
    else if (a == "--api-key") o.api_key = v;
    else if (a == "--max-body") { if (!integer(1, 1ll << 32, n)) return false; o.max_body = size_t(n); }
    else if (a == "--model-name") o.model_name = v;
    else if (a == "--chat-template-file") o.template_file = v;
    else if (a == "--prompt-cache") { if (!integer(0, 4096, n)) return false; o.prompt_cache = int(n); }
    else if (a == "--prefill-chunk") { if (!integer(1, 1 << 20, n)) return false; o.prefill_chunk = uint32_t(n); }
    else if (a == "--prefill-chunk-decoding") {
      if (!integer(1, 1 << 20, n)) return false;
      o.prefill_chunk_decoding = uint32_t(n);
    }
    else if (a == "--kv-budget-mib") { if (!integer(0, 1ll << 30, n)) return false; o.kv_budget_mib = uint64_t(n); }
    else if (a == "--seed") { o.seed = std::strtoull(v, nullptr, 10); o.have_seed = true; }
    else {
      std::fprintf(stderr, "llm-server: unknown option '%s'\n", a.c_str());
      return false;
    }
  }
  if (o.model_path.empty()) {
    std::fprintf(stderr, "llm-server: -m MODEL is required\n");
    return false;
  }
  if (o.model_name.empty()) {
    std::string base = o.model_path.substr(o.model_path.find_last_of('/') + 1);
    const size_t dot = base.find_last_of('.');
    o.model_name = dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_args(argc, argv, opt)) {
    usage();
    return 2;
  }
  std::string tpl;
  if (!opt.template_file.empty() && !read_file(opt.template_file, tpl)) {
    std::fprintf(stderr, "llm-server: cannot read '%s'\n", opt.template_file.c_str());
    return 1;
  }

  // SIGINT/SIGTERM are taken by one thread with sigwait; every other thread
  // (created below, so inheriting the mask) leaves them blocked.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  signal(SIGINT, SIG_DFL);  // a shell starts background jobs with SIGINT ignored; sigwait wants it
  signal(SIGTERM, SIG_DFL);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::atomic<bool> exiting{false};
  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (exiting) return;
    std::fprintf(stderr, "llm-server: signal %d, shutting down\n", sig);
    g_signalled = true;
    if (Server* s = g_server.load()) s->stop();
  });
  auto end_sig_thread = [&] {
    exiting = true;
    if (!g_signalled) kill(getpid(), SIGTERM);  // wakes sig_thread's sigwait
    sig_thread.join();
  };

  llm_load_params lp;
  llm_load_params_init(&lp);
  lp.n_threads = opt.threads;
  lp.progress = [](float, void*) { return g_signalled.load() ? 1 : 0; };
  lp.kv_budget_bytes = opt.kv_budget_mib << 20;
  llm_model* model = nullptr;
  llm_status st = llm_load(opt.model_path.c_str(), &lp, &model);
  if (st != LLM_OK) {
    end_sig_thread();
    if (st == LLM_ERR_CANCELLED) return 0;  // a signal during the load
    std::fprintf(stderr, "llm-server: load '%s': %s (%s)\n", opt.model_path.c_str(), llm_status_string(st),
                 llm_last_error());
    return 1;
  }
  llm_model_properties props;
  props.struct_size = sizeof props;
  llm_model_info(model, &props);
  uint32_t ctx = opt.ctx ? opt.ctx : props.context_length ? std::min<uint32_t>(4096, props.context_length) : 4096;
  if (props.context_length && ctx > props.context_length) ctx = props.context_length;

  int rc;
  {
    auto server = std::make_unique<Server>(model, opt, ctx, tpl);
    g_server = server.get();  // before run() reads g_signalled: one of the two sees the other
    rc = server->run();
    end_sig_thread();
    g_server = nullptr;
  }
  llm_model_free(model);
  if (rc == 0) std::fprintf(stderr, "llm-server: stopped\n");
  return rc;
}
