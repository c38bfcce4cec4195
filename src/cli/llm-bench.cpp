// llm-bench: prefill and decode speed of a model through the public API only,
// measured the way llama.cpp's llama-bench measures, plus the decode "speed
// of light" (memory bandwidth / bytes read per token) and the fraction of it
// reached.
//
//   llm-bench -m MODEL[,MODEL...] [-p 512[,128...]] [-n 128] [-t 1,2] [-r 5]
//             [--kv f16|f32|int8|int4[,...]] [--depth 0[,2048...]] [--json]
//             [--warmup N] [--device auto|cpu|cuda] [--bw-mib 1024] [--seed S]
//             [--exact] [--progress] [--batch 1,2,4,8,16]
//
// Tests, each repeated -r times (after --warmup untimed runs):
//   ppN  one llm_prefill of N random valid token ids into a fresh session
//        (after an untimed D-token prompt with --depth D); tokens/s = N / time
//        of that call. TTFT = that prefill + the first llm_decode_step.
//   tgN  a fresh session holding BOS (or a D-token prompt starting with BOS),
//        one untimed llm_decode_step (it only samples the prompt's logits),
//        then N timed llm_decode_step calls, each one forward pass + greedy
//        sampling; EOS is ignored. tokens/s = N / their total time; ITL
//        median and p95 pooled over all steps of all repetitions.
//   tgN xB  (--batch B[,...], in place of tgN) B sessions, session i
//        prefilled with a (D + 8 + i)-token prompt (BOS first; the lengths
//        differ so the sessions' attention does too), one untimed
//        llm_decode_batch (it only samples), then N timed llm_decode_batch
//        calls over all B sessions (one batched forward pass each on the
//        CPU and on CUDA). tokens/s = B * N / their total time (aggregate
//        over the sessions); ITL = the time of one batch step.
//   tgN +grammar (--grammar-file F.gbnf or --json-schema F.json) the tgN
//        test constrained by that grammar, next to a free tgN from the same
//        context: a chat prompt (--grammar-prompt, through the model's chat
//        template when it has one) instead of BOS. One grammar is compiled
//        per model (compile time: best and median of the repetitions'
//        recompiles, reported on stderr) and shared by every repetition, as
//        an app shares one for many requests; "+grammar cold" compiles a
//        fresh one per repetition, so its mask caches start empty. Greedy;
//        where the grammar ends (EOG), the EOG token is prefilled and the
//        grammar starts over, so every test decodes N tokens.
// Figures are mean +- sample stddev over repetitions (the median is also
// given, as this is usually run on shared, noisy machines).
//
// Threads: each -t value reloads the model with llm_load_params.n_threads.
// Speed of light for tgN: read bandwidth (best of 5 sums over a --bw-mib
// array on that many threads) / (weight bytes read per token + the average
// KV bytes held during the run, from llm_session_stats.kv_bytes). On Linux
// the probe array is advised for transparent huge pages, as the library's
// weights are, so the figure is the best read rate this machine gives.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLM_BENCH_X86 1
#endif

#include "llm.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: llm-bench -m MODEL[,MODEL...] [options]\n"
               "  -m, --model LIST       model files (.llm or GGUF); repeatable\n"
               "  -p, --n-prompt LIST    prompt lengths for ppN tests (default 512; 0 = none)\n"
               "  -n, --n-gen LIST       generated tokens for tgN tests (default 128; 0 = none)\n"
               "  -t, --threads LIST     thread counts (default: all cores); the model is reloaded per count\n"
               "  -r, --repetitions N    timed repetitions per test (default 5)\n"
               "  --kv LIST              KV cache types f16|f32|int8|int4 (default f16)\n"
               "  -d, --depth LIST       tokens already in the context before the test (default 0)\n"
               "  --warmup N             untimed runs before each test (default 1)\n"
               "  --device auto|cpu|cuda where to run (default auto)\n"
               "  --bw-mib N             bandwidth probe array size in MiB (default 1024; 0 = no probe)\n"
               "  --seed S               seed of the random prompt tokens (default 42)\n"
               "  --exact                load with LLM_LOAD_REFERENCE_MATH\n"
               "  --no-huge-pages        load with LLM_LOAD_NO_HUGE_PAGES (weights stay on the file's pages)\n"
               "  --batch LIST           tgN as B sessions stepped together by llm_decode_batch (aggregate t/s)\n"
               "  --grammar-file F       also tgN constrained by the GBNF grammar in F (and a free tgN from the same prompt)\n"
               "  --json-schema F        the same with the JSON Schema in F\n"
               "  --grammar-prompt TEXT  the user message those tests start from (default: asks for JSON)\n"
               "  --json                 JSON instead of a markdown table\n"
               "  --progress             progress lines on stderr\n"
               "LIST is comma-separated, e.g. -t 1,2 -p 128,512.\n");
}

[[noreturn]] void usage_error(const char* fmt, const char* arg) {
  std::fprintf(stderr, "llm-bench: ");
  std::fprintf(stderr, fmt, arg);
  std::fprintf(stderr, "\n");
  usage(stderr);
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::vector<int> int_list(const std::string& s, const char* what, int min_value) {
  std::vector<int> out;
  for (const std::string& item : split_list(s)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v < min_value || v > (1 << 24)) usage_error(what, item.c_str());
    out.push_back(int(v));
  }
  if (out.empty()) usage_error(what, s.c_str());
  return out;
}

const char* kv_name(llm_kv_type t) {
  switch (t) {
    case LLM_KV_F16: return "f16";
    case LLM_KV_F32: return "f32";
    case LLM_KV_INT8: return "int8";
    case LLM_KV_INT4: return "int4";
    default: return "?";
  }
}

const char* device_name(llm_device d) {
  return d == LLM_DEVICE_CUDA ? "CUDA" : d == LLM_DEVICE_CPU ? "CPU" : "auto";
}

// ---------------------------------------------------------------- statistics

struct Summary {
  double mean = 0, stddev = 0, median = 0, min = 0, max = 0;
};

double percentile_sorted(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  // Nearest rank: the smallest value with at least q of the samples at or below it.
  size_t k = size_t(std::ceil(q * double(v.size())));
  k = std::min(std::max<size_t>(k, 1), v.size());
  return v[k - 1];
}

double median_sorted(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(ss / double(v.size() - 1)) : 0;
  s.median = median_sorted(v);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// ---------------------------------------------------------------- bandwidth probe

// Sums 64-bit words so the loads cannot be optimised away; four independent
// accumulators keep several cache lines in flight.
uint64_t sum_plain(const uint64_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  for (; i < n; ++i) a0 += p[i];
  return a0 + a1 + a2 + a3;
}

#ifdef LLM_BENCH_X86
// p is 32-byte aligned; n is a multiple of 16 words (the caller splits so).
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

struct Bandwidth {
  double gbps = 0;  // best of the runs, 1e9 bytes/s
  std::vector<double> runs;
  bool avx2 = false;
  bool huge_pages = false;  // the array was advised for transparent huge pages
};

// The probe array: on Linux an anonymous mapping advised for huge pages
// before it is touched (as libllm places CPU weights); elsewhere aligned_alloc.
struct ProbeArray {
  explicit ProbeArray(size_t bytes) : bytes(bytes) {
#ifdef __linux__
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      words = static_cast<uint64_t*>(p);
      mapped = true;
      huge = madvise(p, bytes, MADV_HUGEPAGE) == 0;
      return;
    }
#endif
    words = static_cast<uint64_t*>(std::aligned_alloc(64, bytes));
  }
  ~ProbeArray() {
#ifdef __linux__
    if (mapped) {
      munmap(words, bytes);
      return;
    }
#endif
    std::free(words);
  }
  ProbeArray(const ProbeArray&) = delete;
  ProbeArray& operator=(const ProbeArray&) = delete;
  size_t bytes;
  uint64_t* words = nullptr;
  bool mapped = false, huge = false;
};

// Read bandwidth of `threads` threads each summing its share of one array.
Bandwidth probe_bandwidth(size_t mib, int threads, int runs) {
  Bandwidth bw;
  if (mib == 0) return bw;
  const size_t bytes = mib << 20, words = bytes / 8;
  ProbeArray array(bytes);
  uint64_t* a = array.words;
  if (!a) {
    std::fprintf(stderr, "llm-bench: cannot allocate %zu MiB for the bandwidth probe\n", mib);
    return bw;
  }
  bw.huge_pages = array.huge;
  for (size_t i = 0; i < words; ++i) a[i] = i * 0x9E3779B97F4A7C15ull;  // touch every page, no zero pages
#ifdef LLM_BENCH_X86
  bw.avx2 = __builtin_cpu_supports("avx2");
#endif
  std::atomic<uint64_t> sink{0};
  for (int r = 0; r < runs; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    const size_t per = (words / size_t(threads)) & ~size_t(15);
    auto body = [&](int ith) {
      const uint64_t* p = a + size_t(ith) * per;
      const size_t n = ith == threads - 1 ? words - size_t(ith) * per : per;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      uint64_t s;
#ifdef LLM_BENCH_X86
      s = bw.avx2 ? sum_avx2(p, n & ~size_t(15)) + sum_plain(p + (n & ~size_t(15)), n & 15) : sum_plain(p, n);
#else
      s = sum_plain(p, n);
#endif
      sink.fetch_add(s, std::memory_order_relaxed);
    };
    for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
    while (ready.load() != threads - 1) std::this_thread::yield();
    const auto t0 = Clock::now();
    go.store(true, std::memory_order_release);
    body(0);
    for (auto& th : pool) th.join();
    const double s = ms_since(t0) / 1e3;
    bw.runs.push_back(double(bytes) / s / 1e9);
  }
  if (sink.load() == 42) std::fprintf(stderr, " ");  // keep the sums observable
  bw.gbps = *std::max_element(bw.runs.begin(), bw.runs.end());
  return bw;
}

// ---------------------------------------------------------------- machine info

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  }
  return "unknown";
}

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

// ---------------------------------------------------------------- model facts

struct ModelFacts {
  llm_model_properties info{};
  uint64_t bytes_per_token = 0;  // weight bytes one decode step reads
  bool tied = false;
  uint64_t file_bytes = 0;       // size of the model file
  uint64_t rss_after_load = 0;   // the process's VmRSS right after llm_load, no session yet (Linux; else 0)
};

// The process's resident set (VmRSS) in bytes, 0 where /proc is missing.
uint64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.compare(0, 6, "VmRSS:") == 0) return uint64_t(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;
  return 0;
}

uint64_t file_size(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  return f ? uint64_t(f.tellg()) : 0;
}

// A decode step reads every matrix once, the norms, and one row of the token
// embedding. The public API gives total weight_bytes and n_params; the
// embedding's share is estimated at the model's average bytes per matrix
// parameter (exact when all matrices share one format, as in our benchmark
// models). A tied embedding is read whole as the output matrix.
ModelFacts model_facts(const llm_model* m) {
  ModelFacts f;
  f.info.struct_size = sizeof f.info;
  llm_model_info(m, &f.info);
  const llm_model_properties& p = f.info;
  const uint64_t q_dim = uint64_t(p.n_heads) * p.head_dim, kv_dim = uint64_t(p.n_kv_heads) * p.head_dim;
  const uint64_t layer_mat = uint64_t(p.dim) * q_dim * 2 + uint64_t(p.dim) * kv_dim * 2 + uint64_t(p.dim) * p.hidden_dim * 3;
  const uint64_t norms = (2ull * p.n_layers + 1) * p.dim;
  const uint64_t embd = uint64_t(p.vocab_size) * p.dim;
  const uint64_t body = layer_mat * p.n_layers;
  f.tied = p.n_params < body + norms + embd + embd / 2;
  const uint64_t mat_params = p.n_params > norms ? p.n_params - norms : 1;
  const double bytes_per_param = double(p.weight_bytes - std::min(p.weight_bytes, norms * 4)) / double(mat_params);
  f.bytes_per_token = p.weight_bytes;
  if (!f.tied && p.n_params >= embd) {
    const double unread = bytes_per_param * double(embd - p.dim);
    f.bytes_per_token = uint64_t(std::max(0.0, double(p.weight_bytes) - unread));
  }
  return f;
}

// ---------------------------------------------------------------- one test

struct TestSpec {
  int n_prompt = 0, n_gen = 0, depth = 0;
  llm_kv_type kv = LLM_KV_F16;
  int batch = 0;  // tgN: > 0 = that many sessions through llm_decode_batch
  int grammar = 0;  // tgN from the grammar prompt: 0 = not, 1 = free, 2 = constrained, 3 = constrained, cold
};

struct TestResult {
  std::string model_path, model_type;
  ModelFacts facts;
  llm_device device = LLM_DEVICE_CPU;
  int threads = 0;
  TestSpec spec;
  std::vector<double> tps;       // tokens/s per repetition
  std::vector<double> ttft_ms;   // per repetition
  std::vector<double> itl_ms;    // all decode steps of all repetitions
  std::vector<double> kv_bytes;  // average KV bytes held during each tg repetition
  double bw_gbps = 0;
  std::string error;

  std::string name() const {
    std::string n = spec.n_prompt ? "pp" + std::to_string(spec.n_prompt) : "tg" + std::to_string(spec.n_gen);
    if (spec.batch) n += " x" + std::to_string(spec.batch);
    if (spec.grammar == 1) n += " free";
    if (spec.grammar == 2) n += " +grammar";
    if (spec.grammar == 3) n += " +grammar cold";
    if (spec.depth) n += " @ d" + std::to_string(spec.depth);
    return n;
  }
  double sol_tps() const {
    if (spec.n_gen == 0 || bw_gbps <= 0) return 0;
    double kv = 0;
    for (double k : kv_bytes) kv += k;
    if (!kv_bytes.empty()) kv /= double(kv_bytes.size());
    // A batch step reads the weights once for all its sessions' tokens.
    return bw_gbps * 1e9 * double(std::max(spec.batch, 1)) / (double(facts.bytes_per_token) + kv);
  }
};

// The grammar mode's inputs (--grammar-file / --json-schema).
struct GrammarMode {
  std::string text;  // GBNF or JSON Schema
  bool schema = false;
  std::string prompt = "Describe a cat as a JSON object.";
};

class Runner {
 public:
  Runner(llm_model* m, const llm_model_properties& info, uint64_t seed) : model_(m), info_(info), rng_(seed) {}
  ~Runner() { llm_grammar_free(grammar_); }

  // Compiles the grammar mode's grammar (fresh each call); its time in ms.
  bool compile(const GrammarMode& g, llm_grammar** out, double* ms, std::string* err) {
    const auto t0 = Clock::now();
    const llm_status st = g.schema ? llm_grammar_from_json_schema(model_, g.text.c_str(), out)
                                   : llm_grammar_create(model_, g.text.c_str(), nullptr, out);
    *ms = ms_since(t0);
    return st == LLM_OK || fail(st, "grammar", err);
  }
  // Sets up the grammar mode: the prompt's tokens and the shared grammar.
  bool set_grammar(const GrammarMode& g, std::string* err) {
    mode_ = g;
    double ms = 0;
    if (!compile(g, &grammar_, &ms, err)) return false;
    const llm_chat_message msg = {"user", g.prompt.c_str()};
    std::string text = g.prompt;
    size_t len = 0;
    if (llm_chat_render(model_, &msg, 1, nullptr, nullptr, 0, &len) == LLM_ERR_BUFFER_TOO_SMALL) {
      std::vector<char> buf(len + 1);
      if (llm_chat_render(model_, &msg, 1, nullptr, buf.data(), buf.size(), &len) == LLM_OK) text.assign(buf.data(), len);
    }
    const bool templated = text != g.prompt;
    const uint32_t flags = templated ? LLM_TOKENIZE_PARSE_SPECIAL : LLM_TOKENIZE_ADD_BOS;
    size_t n = 0;
    llm_tokenize(model_, text.data(), text.size(), flags, nullptr, 0, &n);
    prompt_.resize(n);
    const llm_status st = llm_tokenize(model_, text.data(), text.size(), flags, prompt_.data(), n, &n);
    return st == LLM_OK || fail(st, "tokenize the grammar prompt", err);
  }
  std::vector<double> compile_ms;  // one per repetition of the cold test

  // Fills `out` with n random valid ids; the first is BOS when with_bos.
  void random_tokens(size_t n, bool with_bos, std::vector<llm_token>& out) {
    out.resize(n);
    std::uniform_int_distribution<int32_t> dist(0, int32_t(info_.vocab_size) - 1);
    for (auto& t : out) t = dist(rng_);
    if (with_bos && n > 0 && info_.bos >= 0) out[0] = info_.bos;
  }

  // One repetition; returns false and sets err on failure.
  bool run_once(const TestSpec& s, TestResult* r, bool timed, std::string* err) {
    if (s.batch > 0) return run_batch(s, r, timed, err);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.kv_type = s.kv;
    sp.max_tokens = uint32_t(s.depth + s.n_prompt + s.n_gen + 2);
    if (s.grammar) sp.max_tokens = uint32_t(prompt_.size() + 2 * size_t(s.n_gen) + 2);  // + an EOG per restart
    llm_session* ses = nullptr;
    llm_status st = llm_session_create(model_, &sp, &ses);
    if (st != LLM_OK) return fail(st, "session", err);
    struct Guard {
      llm_session* s;
      ~Guard() { llm_session_free(s); }
    } guard{ses};

    std::vector<llm_token> toks;
    if (s.n_prompt > 0) {
      if (s.depth > 0) {
        random_tokens(size_t(s.depth), true, toks);
        if ((st = llm_prefill(ses, toks.data(), toks.size())) != LLM_OK) return fail(st, "depth prefill", err);
      }
      random_tokens(size_t(s.n_prompt), s.depth == 0, toks);
      const auto t0 = Clock::now();
      st = llm_prefill(ses, toks.data(), toks.size());
      const double pre_ms = ms_since(t0);
      if (st != LLM_OK) return fail(st, "prefill", err);
      llm_token next;
      const auto t1 = Clock::now();
      if ((st = llm_decode_step(ses, nullptr, &next)) != LLM_OK) return fail(st, "first decode step", err);
      const double first_ms = ms_since(t1);
      if (timed) {
        r->tps.push_back(1e3 * double(s.n_prompt) / pre_ms);
        r->ttft_ms.push_back(pre_ms + first_ms);
      }
      return true;
    }

    // tgN: context = BOS, or a depth-token prompt starting with BOS; the
    // grammar tests start from the grammar prompt.
    random_tokens(size_t(std::max(s.depth, 1)), true, toks);
    if (s.grammar) toks = prompt_;
    llm_grammar* cold = nullptr;
    struct GrammarGuard {
      llm_grammar*& g;
      ~GrammarGuard() { llm_grammar_free(g); }
    } cold_guard{cold};
    if (s.grammar == 3) {
      double ms = 0;
      if (!compile(mode_, &cold, &ms, err)) return false;
      if (timed) compile_ms.push_back(ms);
    }
    const llm_grammar* g = s.grammar == 2 ? grammar_ : s.grammar == 3 ? cold : nullptr;
    const auto t0 = Clock::now();
    if ((st = llm_prefill(ses, toks.data(), toks.size())) != LLM_OK) return fail(st, "prompt prefill", err);
    llm_token tok;
    if ((st = llm_decode_step(ses, nullptr, &tok)) != LLM_OK) return fail(st, "first decode step", err);
    const double ttft = ms_since(t0);
    llm_session_stats_t before;
    before.struct_size = sizeof before;
    llm_session_stats(ses, &before);
    llm_sampling samp;
    llm_sampling_init(&samp);  // greedy
    samp.seed = 1234;
    samp.grammar = g;
    std::vector<double> steps(size_t(s.n_gen));
    const auto g0 = Clock::now();
    for (int i = 0; i < s.n_gen; ++i) {
      const auto ti = Clock::now();
      if ((st = llm_decode_step(ses, &samp, &tok)) != LLM_OK) return fail(st, "decode step", err);
      // EOS is ignored: always decode n_gen tokens. A grammar that ended
      // starts over after its EOG token (prefilled as the next step).
      if (g && llm_token_is_eog(model_, tok) && (st = llm_prefill(ses, &tok, 1)) != LLM_OK)
        return fail(st, "prefill after the grammar ended", err);
      steps[size_t(i)] = ms_since(ti);
    }
    const double gen_ms = ms_since(g0);
    llm_session_stats_t after;
    after.struct_size = sizeof after;
    llm_session_stats(ses, &after);
    if (timed) {
      r->tps.push_back(1e3 * double(s.n_gen) / gen_ms);
      r->ttft_ms.push_back(ttft);
      r->itl_ms.insert(r->itl_ms.end(), steps.begin(), steps.end());
      r->kv_bytes.push_back(0.5 * (double(before.kv_bytes) + double(after.kv_bytes)));
    }
    return true;
  }

  // tgN xB: one repetition of B sessions stepped together.
  bool run_batch(const TestSpec& s, TestResult* r, bool timed, std::string* err) {
    const size_t b = size_t(s.batch);
    std::vector<llm_session*> ses(b, nullptr);
    struct Guard {
      std::vector<llm_session*>& s;
      ~Guard() {
        for (llm_session* x : s) llm_session_free(x);
      }
    } guard{ses};
    std::vector<llm_token> toks, out(b);
    llm_status st;
    for (size_t i = 0; i < b; ++i) {
      const size_t prompt = size_t(s.depth) + 8 + i;
      llm_session_params sp;
      llm_session_params_init(&sp);
      sp.kv_type = s.kv;
      sp.max_tokens = uint32_t(prompt + size_t(s.n_gen) + 2);
      if ((st = llm_session_create(model_, &sp, &ses[i])) != LLM_OK) return fail(st, "session", err);
      random_tokens(prompt, true, toks);
      if ((st = llm_prefill(ses[i], toks.data(), toks.size())) != LLM_OK) return fail(st, "prompt prefill", err);
    }
    const auto t0 = Clock::now();
    if ((st = llm_decode_batch(ses.data(), b, nullptr, out.data())) != LLM_OK) return fail(st, "first decode batch", err);
    const double ttft = ms_since(t0);
    auto kv_held = [&] {
      double sum = 0;
      for (llm_session* x : ses) {
        llm_session_stats_t stt;
        stt.struct_size = sizeof stt;
        llm_session_stats(x, &stt);
        sum += double(stt.kv_bytes);
      }
      return sum;
    };
    const double kv0 = kv_held();
    std::vector<double> steps(size_t(s.n_gen));
    const auto g0 = Clock::now();
    for (int i = 0; i < s.n_gen; ++i) {
      const auto ti = Clock::now();
      if ((st = llm_decode_batch(ses.data(), b, nullptr, out.data())) != LLM_OK) return fail(st, "decode batch", err);
      steps[size_t(i)] = ms_since(ti);
    }
    const double gen_ms = ms_since(g0);
    if (timed) {
      r->tps.push_back(1e3 * double(b) * double(s.n_gen) / gen_ms);
      r->ttft_ms.push_back(ttft);
      r->itl_ms.insert(r->itl_ms.end(), steps.begin(), steps.end());
      r->kv_bytes.push_back(0.5 * (kv0 + kv_held()));
    }
    return true;
  }

 private:
  static bool fail(llm_status st, const char* what, std::string* err) {
    *err = std::string(what) + ": " + llm_status_string(st) + " (" + llm_last_error() + ")";
    return false;
  }

  llm_model* model_;
  llm_model_properties info_;
  GrammarMode mode_;
  llm_grammar* grammar_ = nullptr;
  std::vector<llm_token> prompt_;
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------- output

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o;
}

std::string json_array(const std::vector<double>& v, const char* f) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + fmt(f, v[i]);
  return o + "]";
}

std::string model_label(const TestResult& r) {
  std::string base = r.model_path;
  const size_t slash = base.find_last_of('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  return base;
}

void print_markdown(const std::vector<TestResult>& results) {
  std::printf(
      "| model | type | size MiB | params M | backend | threads | kv | test | t/s (mean ± sd) | t/s median | TTFT ms | ITL p50 ms "
      "| ITL p95 ms | bytes/tok GB | BW GB/s | SoL t/s | of SoL |\n");
  std::printf("|---|---|---:|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const TestResult& r : results) {
    const llm_model_properties& p = r.facts.info;
    std::printf("| %s | %s | %.1f | %.1f | %s | %d | %s | %s | ", model_label(r).c_str(), p.weight_type,
                double(p.weight_bytes) / double(1ull << 20), double(p.n_params) / 1e6, device_name(r.device), r.threads,
                kv_name(r.spec.kv), r.name().c_str());
    if (!r.error.empty()) {
      std::printf("error: %s | | | | | | | | |\n", r.error.c_str());
      continue;
    }
    const Summary t = summarize(r.tps);
    const Summary ttft = summarize(r.ttft_ms);
    std::printf("%.2f ± %.2f | %.2f | %.1f | ", t.mean, t.stddev, t.median, ttft.median);
    if (r.spec.n_gen > 0) {
      std::vector<double> itl = r.itl_ms;
      std::sort(itl.begin(), itl.end());
      double kv = 0;
      for (double k : r.kv_bytes) kv += k / double(r.kv_bytes.size());
      const double sol = r.sol_tps();
      std::printf("%.2f | %.2f | %.3f | ", median_sorted(itl), percentile_sorted(itl, 0.95),
                  (double(r.facts.bytes_per_token) + kv) / 1e9);
      if (sol > 0)
        std::printf("%.1f | %.1f | %.0f%% |\n", r.bw_gbps, sol, 100.0 * t.median / sol);
      else
        std::printf(" | | |\n");
    } else {
      std::printf(" | | | | | |\n");
    }
  }
}

void print_json(const std::vector<TestResult>& results, const std::string& cpu, double load0, double load1) {
  std::printf("{\n  \"machine\": {\"cpu\": \"%s\", \"hardware_threads\": %u, \"loadavg_start\": %.2f, \"loadavg_end\": %.2f},\n",
              json_escape(cpu).c_str(), std::thread::hardware_concurrency(), load0, load1);
  std::printf("  \"libllm\": \"%s\",\n  \"results\": [\n", llm_version_string());
  for (size_t i = 0; i < results.size(); ++i) {
    const TestResult& r = results[i];
    const llm_model_properties& p = r.facts.info;
    const Summary t = summarize(r.tps);
    std::vector<double> itl = r.itl_ms;
    std::sort(itl.begin(), itl.end());
    double kv = 0;
    for (double k : r.kv_bytes) kv += k / double(r.kv_bytes.size());
    std::printf("    {\"model\": \"%s\", \"architecture\": \"%s\", \"weight_type\": \"%s\", \"weight_bytes\": %llu, "
                "\"n_params\": %llu, \"weight_bytes_per_token\": %llu, \"tied_embedding\": %s, \"file_bytes\": %llu, "
                "\"rss_after_load_bytes\": %llu,\n",
                json_escape(r.model_path).c_str(), p.architecture, p.weight_type, (unsigned long long)p.weight_bytes,
                (unsigned long long)p.n_params, (unsigned long long)r.facts.bytes_per_token,
                r.facts.tied ? "true" : "false", (unsigned long long)r.facts.file_bytes,
                (unsigned long long)r.facts.rss_after_load);
    std::printf("     \"device\": \"%s\", \"threads\": %d, \"kv_type\": \"%s\", \"test\": \"%s\", \"n_prompt\": %d, "
                "\"n_gen\": %d, \"depth\": %d, \"sessions\": %d,\n",
                device_name(r.device), r.threads, kv_name(r.spec.kv), r.name().c_str(), r.spec.n_prompt, r.spec.n_gen,
                r.spec.depth, std::max(r.spec.batch, 1));
    if (!r.error.empty()) {
      std::printf("     \"error\": \"%s\"}%s\n", json_escape(r.error).c_str(), i + 1 < results.size() ? "," : "");
      continue;
    }
    std::printf("     \"tps_mean\": %.4f, \"tps_stddev\": %.4f, \"tps_median\": %.4f, \"tps_min\": %.4f, \"tps_max\": %.4f, "
                "\"samples_tps\": %s, \"ttft_ms\": %s,\n",
                t.mean, t.stddev, t.median, t.min, t.max, json_array(r.tps, "%.4f").c_str(),
                json_array(r.ttft_ms, "%.3f").c_str());
    std::printf("     \"itl_median_ms\": %.4f, \"itl_p95_ms\": %.4f, \"kv_bytes_avg\": %.0f, \"bandwidth_gbps\": %.3f, "
                "\"sol_tps\": %.4f, \"sol_fraction\": %.4f}%s\n",
                median_sorted(itl), percentile_sorted(itl, 0.95), kv, r.bw_gbps, r.sol_tps(),
                r.sol_tps() > 0 ? t.median / r.sol_tps() : 0.0, i + 1 < results.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> prompts = {512}, gens = {128}, depths = {0}, batches;
  std::vector<int> threads = {int(std::max(1u, std::thread::hardware_concurrency()))};
  std::vector<llm_kv_type> kvs = {LLM_KV_F16};
  int reps = 5, warmup = 1;
  size_t bw_mib = 1024;
  uint64_t seed = 42;
  bool json = false, progress = false, exact = false, no_huge_pages = false;
  GrammarMode grammar_mode;
  std::string grammar_path;
  llm_device device = LLM_DEVICE_AUTO;

  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error("option %s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "-m" || a == "--model") {
      for (const std::string& m : split_list(next())) models.push_back(m);
    } else if (a == "-p" || a == "--n-prompt") {
      prompts = int_list(next(), "bad prompt length '%s'", 0);
    } else if (a == "-n" || a == "--n-gen") {
      gens = int_list(next(), "bad generation length '%s'", 0);
    } else if (a == "-t" || a == "--threads") {
      threads = int_list(next(), "bad thread count '%s'", 1);
    } else if (a == "-r" || a == "--repetitions") {
      reps = int_list(next(), "bad repetition count '%s'", 1)[0];
    } else if (a == "-d" || a == "--depth") {
      depths = int_list(next(), "bad depth '%s'", 0);
    } else if (a == "--warmup") {
      warmup = int_list(next(), "bad warmup count '%s'", 0)[0];
    } else if (a == "--bw-mib") {
      bw_mib = size_t(int_list(next(), "bad --bw-mib '%s'", 0)[0]);
    } else if (a == "--seed") {
      seed = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--kv") {
      kvs.clear();
      for (const std::string& k : split_list(next())) {
        if (k == "f16") kvs.push_back(LLM_KV_F16);
        else if (k == "f32") kvs.push_back(LLM_KV_F32);
        else if (k == "int8") kvs.push_back(LLM_KV_INT8);
        else if (k == "int4") kvs.push_back(LLM_KV_INT4);
        else usage_error("unknown KV type '%s' (f16, f32, int8, int4)", k.c_str());
      }
      if (kvs.empty()) usage_error("--kv needs a type%s", "");
    } else if (a == "--device") {
      const std::string d = next();
      if (d == "auto") device = LLM_DEVICE_AUTO;
      else if (d == "cpu") device = LLM_DEVICE_CPU;
      else if (d == "cuda") device = LLM_DEVICE_CUDA;
      else usage_error("unknown device '%s'", d.c_str());
    } else if (a == "--grammar-file" || a == "--json-schema") {
      grammar_path = next();
      grammar_mode.schema = a == "--json-schema";
      std::ifstream f(grammar_path, std::ios::binary);
      if (!f) usage_error("cannot read '%s'", grammar_path.c_str());
      grammar_mode.text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } else if (a == "--grammar-prompt") {
      grammar_mode.prompt = next();
    } else if (a == "--batch") {
      batches = int_list(next(), "bad session count '%s'", 1);
    } else if (a == "--json") {
      json = true;
    } else if (a == "--progress") {
      progress = true;
    } else if (a == "--exact") {
      exact = true;
    } else if (a == "--no-huge-pages") {
      no_huge_pages = true;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      usage_error("unknown option '%s'", a.c_str());
    }
  }
  if (models.empty()) usage_error("no model given (-m MODEL)%s", "");

  const std::string cpu = cpu_model();
  const double load0 = load_average();
  std::vector<TestResult> results;
  std::vector<std::pair<int, Bandwidth>> bandwidths;
  auto bandwidth_for = [&](int t) -> double {
    if (bw_mib == 0) return 0;
    for (const auto& b : bandwidths)
      if (b.first == t) return b.second.gbps;
    if (progress) std::fprintf(stderr, "llm-bench: bandwidth probe, %d thread(s), %zu MiB\n", t, bw_mib);
    bandwidths.emplace_back(t, probe_bandwidth(bw_mib, t, 5));
    return bandwidths.back().second.gbps;
  };

  int exit_code = 0;
  for (const std::string& path : models) {
    for (int nt : threads) {
      llm_load_params lp;
      llm_load_params_init(&lp);
      lp.n_threads = nt;
      lp.device = device;
      if (exact) lp.flags |= LLM_LOAD_REFERENCE_MATH;
      if (no_huge_pages) lp.flags |= LLM_LOAD_NO_HUGE_PAGES;
      if (progress) std::fprintf(stderr, "llm-bench: loading %s with %d thread(s)\n", path.c_str(), nt);
      llm_model* m = nullptr;
      const llm_status st = llm_load(path.c_str(), &lp, &m);
      if (st != LLM_OK) {
        std::fprintf(stderr, "llm-bench: cannot load '%s': %s (%s)\n", path.c_str(), llm_status_string(st),
                     llm_last_error());
        exit_code = 1;
        break;
      }
      ModelFacts facts = model_facts(m);
      facts.rss_after_load = resident_bytes();
      facts.file_bytes = file_size(path);
      if (progress)
        std::fprintf(stderr, "llm-bench: resident %.1f MiB after the load (file %.1f MiB)\n",
                     double(facts.rss_after_load) / double(1 << 20), double(facts.file_bytes) / double(1 << 20));
      Runner runner(m, facts.info, seed);
      if (!grammar_path.empty()) {
        std::string err;
        if (!runner.set_grammar(grammar_mode, &err)) {
          std::fprintf(stderr, "llm-bench: %s: %s\n", grammar_path.c_str(), err.c_str());
          exit_code = 1;
          llm_model_free(m);
          break;
        }
      }
      std::vector<TestSpec> specs;
      for (llm_kv_type kv : kvs)
        for (int d : depths) {
          for (int p : prompts)
            if (p > 0) specs.push_back(TestSpec{p, 0, d, kv});
          for (int g : gens) {
            if (g <= 0) continue;
            if (batches.empty()) specs.push_back(TestSpec{0, g, d, kv});
            for (int b : batches) specs.push_back(TestSpec{0, g, d, kv, b});
            if (!grammar_path.empty())
              for (int mode : {1, 2, 3}) specs.push_back(TestSpec{0, g, 0, kv, 0, mode});
          }
        }
      for (const TestSpec& s : specs) {
        TestResult r;
        r.model_path = path;
        r.facts = facts;
        r.device = facts.info.device;
        r.threads = nt;
        r.spec = s;
        if (progress) std::fprintf(stderr, "llm-bench: %s, %d thread(s), kv %s\n", r.name().c_str(), nt, kv_name(s.kv));
        std::string err;
        bool ok = true;
        for (int w = 0; w < warmup && ok; ++w) ok = runner.run_once(s, &r, false, &err);
        for (int k = 0; k < reps && ok; ++k) ok = runner.run_once(s, &r, true, &err);
        if (!ok) {
          r.error = err;
          exit_code = 1;
          std::fprintf(stderr, "llm-bench: %s: %s\n", r.name().c_str(), err.c_str());
        }
        if (s.n_gen > 0 && ok && facts.info.device == LLM_DEVICE_CPU) r.bw_gbps = bandwidth_for(nt);
        results.push_back(std::move(r));
      }
      if (!runner.compile_ms.empty()) {
        std::vector<double> c = runner.compile_ms;
        std::sort(c.begin(), c.end());
        std::fprintf(stderr, "llm-bench: %s: grammar compile %.2f ms best, %.2f ms median (%zu compiles)\n",
                     grammar_path.c_str(), c.front(), median_sorted(c), c.size());
      }
      llm_model_free(m);
    }
  }
  const double load1 = load_average();

  if (json) {
    print_json(results, cpu, load0, load1);
  } else {
    std::printf("libllm %s | %s | %u hardware threads | load average %.2f at start, %.2f at end\n\n",
                llm_version_string(), cpu.c_str(), std::thread::hardware_concurrency(), load0, load1);
    print_markdown(results);
    if (!bandwidths.empty()) {
      std::printf("\nread bandwidth (%s sum over %zu MiB%s, best of 5):", bandwidths[0].second.avx2 ? "AVX2" : "scalar",
                  bw_mib, bandwidths[0].second.huge_pages ? " on huge pages" : "");
      for (const auto& b : bandwidths) std::printf(" %d thread(s) %.1f GB/s;", b.first, b.second.gbps);
      std::printf("\nSoL t/s = BW / bytes read per token (weights a decode step reads + average KV bytes held);"
                  " 'of SoL' uses the median t/s.\n");
    }
  }
  return exit_code;
}
