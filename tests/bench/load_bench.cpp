// Load time of one model stored three ways: .llm raw (--no-zstd), .llm with
// zstd chunks, and GGUF (written here from the raw .llm: Q4 g32 is Q4_0
// byte for byte), through llm_load with 1 and 2 threads, warm (file in the
// page cache) and cold-ish (the file's pages dropped with
// posix_fadvise(POSIX_FADV_DONTNEED) before each load; /proc/sys/vm/
// drop_caches needs privileges, and fadvise only drops this file's clean
// pages, which is what matters here); each with the CPU weights copied to
// huge pages (the default) and left where the reader put them
// (LLM_LOAD_NO_HUGE_PAGES).
//
// The models are not made here (they are large): by default
//   DIR=/work/bench-models/tl   (or $LLM_BENCH_MODELS)
//   llm-convert --synthetic tinyllama-1.1b --quant q4 --no-zstd -o $DIR/tl-q4g32-raw.llm
//   llm-convert --synthetic tinyllama-1.1b --quant q4 -o $DIR/tl-q4g32.llm
// and this program writes $DIR/tl-q4g32.gguf on first use.
//   build/bin/llm_load_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "format/llm_file.h"
#include "llm.h"

namespace {

std::string models_dir() {
  const char* d = std::getenv("LLM_BENCH_MODELS");
  return d ? d : "/work/bench-models/tl";
}

bool exists(const std::string& p) { return access(p.c_str(), R_OK) == 0; }

uint64_t file_size(const std::string& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  return f ? uint64_t(f.tellg()) : 0;
}

// Drops the file's cached pages (clean pages only; nothing else is touched).
void drop_cache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Reads the whole file once so that it is in the page cache.
void warm_cache(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  while (f.read(buf.data(), std::streamsize(buf.size())) || f.gcount() > 0) {
  }
}

// --- a minimal GGUF v3 writer (llama architecture, the types libllm reads natively)

class GgufOut {
 public:
  void u32(uint32_t v) { put(&v, 4); }
  void i32(int32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void f32(float v) { put(&v, 4); }
  void str(const std::string& s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  void kv_u32(const std::string& k, uint32_t v) {
    str(k);
    u32(4);
    u32(v);
    ++n_kv;
  }
  void kv_f32(const std::string& k, float v) {
    str(k);
    u32(6);
    f32(v);
    ++n_kv;
  }
  void kv_str(const std::string& k, const std::string& v) {
    str(k);
    u32(8);
    str(v);
    ++n_kv;
  }
  void put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  std::vector<uint8_t> bytes;
  uint64_t n_kv = 0;
};

uint32_t ggml_type(llm::DType t, uint32_t group) {
  switch (t) {
    case llm::DType::F32: return 0;
    case llm::DType::F16: return 1;
    case llm::DType::BF16: return 30;
    case llm::DType::Q8: return 8;
    case llm::DType::Q4:
      if (group == 32) return 2;
      break;
    default:  // Q4M has no GGUF twin; the bench writes no GGUF block types
      break;
  }
  std::fprintf(stderr, "load_bench: %s g%u has no GGUF type\n", llm::dtype_name(t), group);
  std::exit(1);
}

void write_gguf(const llm::ModelSource& src, const std::string& path) {
  const llm::ModelConfig& c = src.config;
  const uint64_t align = 32;
  GgufOut kv;
  kv.kv_str("general.architecture", "llama");
  kv.kv_u32("general.alignment", uint32_t(align));
  kv.kv_u32("llama.context_length", uint32_t(c.seq_len));
  kv.kv_u32("llama.embedding_length", uint32_t(c.dim));
  kv.kv_u32("llama.block_count", uint32_t(c.n_layers));
  kv.kv_u32("llama.feed_forward_length", uint32_t(c.hidden_dim));
  kv.kv_u32("llama.attention.head_count", uint32_t(c.n_heads));
  kv.kv_u32("llama.attention.head_count_kv", uint32_t(c.n_kv_heads));
  kv.kv_u32("llama.rope.dimension_count", uint32_t(c.head_dim));
  kv.kv_f32("llama.rope.freq_base", c.rope_theta);
  kv.kv_f32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  kv.kv_str("tokenizer.ggml.model", src.vocab.model);
  kv.str("tokenizer.ggml.tokens");
  kv.u32(9);
  kv.u32(8);
  kv.u64(src.vocab.tokens.size());
  for (const auto& t : src.vocab.tokens) kv.str(t);
  ++kv.n_kv;
  if (!src.vocab.scores.empty()) {
    kv.str("tokenizer.ggml.scores");
    kv.u32(9);
    kv.u32(6);
    kv.u64(src.vocab.scores.size());
    for (float s : src.vocab.scores) kv.f32(s);
    ++kv.n_kv;
  }
  if (!src.vocab.types.empty()) {
    kv.str("tokenizer.ggml.token_type");
    kv.u32(9);
    kv.u32(5);
    kv.u64(src.vocab.types.size());
    for (int32_t t : src.vocab.types) kv.i32(t);
    ++kv.n_kv;
  }
  if (src.vocab.bos >= 0) kv.kv_u32("tokenizer.ggml.bos_token_id", uint32_t(src.vocab.bos));
  if (src.vocab.eos >= 0) kv.kv_u32("tokenizer.ggml.eos_token_id", uint32_t(src.vocab.eos));

  GgufOut info;
  uint64_t offset = 0;
  for (const auto& t : src.tensors) {
    info.str(t.name);
    info.u32(uint32_t(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) info.u64(uint64_t(t.shape[d]));  // innermost first
    info.u32(ggml_type(t.dtype, t.group));
    info.u64(offset);
    offset += (t.nbytes + align - 1) / align * align;
  }
  GgufOut head;
  head.put("GGUF", 4);
  head.u32(3);
  head.u64(src.tensors.size());
  head.u64(kv.n_kv);
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary);
  f.write(reinterpret_cast<const char*>(head.bytes.data()), std::streamsize(head.bytes.size()));
  f.write(reinterpret_cast<const char*>(kv.bytes.data()), std::streamsize(kv.bytes.size()));
  f.write(reinterpret_cast<const char*>(info.bytes.data()), std::streamsize(info.bytes.size()));
  const uint64_t pos = head.bytes.size() + kv.bytes.size() + info.bytes.size();
  const std::vector<char> zeros(align, 0);
  f.write(zeros.data(), std::streamsize((align - pos % align) % align));
  for (const auto& t : src.tensors) {
    f.write(reinterpret_cast<const char*>(t.data), std::streamsize(t.nbytes));
    f.write(zeros.data(), std::streamsize((align - t.nbytes % align) % align));
  }
  f.close();
  if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "load_bench: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

const char* const kNames[] = {"llm-raw", "llm-zstd", "gguf"};

std::string model_path(int format) {
  const std::string d = models_dir();
  if (format == 0) return d + "/tl-q4g32-raw.llm";
  if (format == 1) return d + "/tl-q4g32.llm";
  const std::string gguf = d + "/tl-q4g32.gguf";
  if (!exists(gguf) && exists(model_path(0))) write_gguf(llm::read_llm(model_path(0)), gguf);
  return gguf;
}

void BM_Load(benchmark::State& state) {
  const int format = int(state.range(0)), threads = int(state.range(1));
  const bool cold = state.range(2) != 0, huge = state.range(3) != 0;
  const std::string path = model_path(format);
  if (!exists(path)) {
    state.SkipWithError(("missing " + path + " (see the comment at the top of load_bench.cpp)").c_str());
    return;
  }
  llm_load_params p;
  llm_load_params_init(&p);
  p.device = LLM_DEVICE_CPU;
  p.n_threads = threads;
  if (!huge) p.flags |= LLM_LOAD_NO_HUGE_PAGES;
  if (!cold) warm_cache(path);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_cache(path);
      state.ResumeTiming();
    }
    llm_model* m = nullptr;
    const llm_status st = llm_load(path.c_str(), &p, &m);
    if (st != LLM_OK) {
      state.SkipWithError(llm_last_error());
      break;
    }
    llm_model_free(m);
  }
  const double bytes = double(file_size(path));
  state.counters["file_MiB"] = bytes / double(1 << 20);
  state.counters["MiB/s"] = benchmark::Counter(bytes / double(1 << 20), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(kNames[format]) + (cold ? " cold" : " warm") + (huge ? "" : " no-huge-pages"));
}

// Load, then one forward pass (BOS): every weight byte has been read, so a
// lazily mapped format pays its page faults here instead of in the load.
void BM_LoadAndFirstToken(benchmark::State& state) {
  const int format = int(state.range(0)), threads = int(state.range(1));
  const bool cold = state.range(2) != 0, huge = state.range(3) != 0;
  const std::string path = model_path(format);
  if (!exists(path)) {
    state.SkipWithError(("missing " + path).c_str());
    return;
  }
  llm_load_params p;
  llm_load_params_init(&p);
  p.device = LLM_DEVICE_CPU;
  p.n_threads = threads;
  if (!huge) p.flags |= LLM_LOAD_NO_HUGE_PAGES;
  if (!cold) warm_cache(path);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_cache(path);
      state.ResumeTiming();
    }
    llm_model* m = nullptr;
    llm_session* s = nullptr;
    if (llm_load(path.c_str(), &p, &m) != LLM_OK || llm_session_create(m, nullptr, &s) != LLM_OK) {
      state.SkipWithError(llm_last_error());
      llm_model_free(m);
      break;
    }
    const llm_token bos = 1;
    const float* logits = nullptr;
    size_t n = 0;
    if (llm_prefill(s, &bos, 1) != LLM_OK || llm_logits(s, &logits, &n) != LLM_OK) state.SkipWithError(llm_last_error());
    benchmark::DoNotOptimize(logits);
    llm_session_free(s);
    llm_model_free(m);
  }
  state.SetLabel(std::string(kNames[format]) + (cold ? " cold" : " warm") + (huge ? "" : " no-huge-pages"));
}

void args(benchmark::internal::Benchmark* b) {
  for (int cold : {0, 1})
    for (int format : {0, 1, 2})
      for (int threads : {1, 2})
        for (int huge : {1, 0}) b->Args({format, threads, cold, huge});
}

BENCHMARK(BM_Load)->Apply(args)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_LoadAndFirstToken)->Apply(args)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
