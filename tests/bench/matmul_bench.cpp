// CPU matmul micro-benchmarks with a roofline to compare against.
//
//   BM_ReadBandwidth/threads : streaming read of a 256 MiB array (bytes/s):
//                              the ceiling for decode (GEMV).
//   BM_FmaPeak/threads       : independent 256-bit FMAs (FLOP/s): the f32
//                              ceiling for prefill (GEMM).
//   BM_Gemv/<dtype>/rows/cols/threads : n = 1, Fast mode; bytes/s counts the
//                              weight bytes streamed. Weights rotate through
//                              copies totalling >= 256 MiB so every call reads
//                              DRAM like a real decode step does, not L3.
//   BM_Gemm/<dtype>/rows/cols/threads : n = 128 (prefill), FLOP/s = 2*rows*cols*n.
//
//   BM_FmaPeak512/threads    : the same with 512-bit FMAs (AVX-512 CPUs).
//   BM_GemvGguf, BM_GemmGguf : the same for the GGUF block types run as stored
//                              (q5_0 .. iq4_nl), on square shapes and on Gemma 3
//                              270M's (640 wide: q, gate/up are q5_0 there;
//                              attn_output and ffn_down q4_K / q6_K).
//
// Compare BM_Gemv bytes_per_second with BM_ReadBandwidth at the same thread
// count, and BM_Gemm FLOP/s with BM_FmaPeak (AVX2 kernels) or BM_FmaPeak512
// (AVX-512 kernels). The kernel family is the best the CPU has unless capped:
// LLM_CPU_ISA=avx2 (or scalar) llm_matmul_bench ...; the label names it.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "core/alloc.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/dtype.h"

namespace {

using llm::DType;
using llm::ThreadPool;
using llm::cpu::MatmulMode;
using llm::cpu::WeightView;

constexpr size_t kRotateBytes = size_t(256) << 20;

ThreadPool* pool_for(int threads) {
  static ThreadPool pool1(1), pool2(2);
  return threads >= 2 ? &pool2 : &pool1;
}

// Random but well-formed weights: sane f16 scales, random quants; for F16
// plain normals (no NaN/denormal slow paths).
void fill_weights(DType t, uint32_t group, int64_t rows, int64_t cols, uint8_t* dst,
                  uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t rb = llm::dtype_row_bytes(t, cols, group);
  const size_t total = rb * size_t(rows);
  for (size_t i = 0; i + 4 <= total; i += 4) {
    const uint32_t v = rng();
    std::memcpy(dst + i, &v, 4);
  }
  std::normal_distribution<float> nd(0.0f, 0.05f);
  const uint16_t scale = llm::f32_to_f16(0.003f);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = dst + size_t(r) * rb;
    switch (t) {
      case DType::F16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = llm::f32_to_f16(nd(rng));
          std::memcpy(row + 2 * k, &h, 2);
        }
        break;
      case DType::Q8:
        for (int64_t b = 0; b < cols / 32; ++b) std::memcpy(row + b * 34, &scale, 2);
        break;
      case DType::Q4:
        for (int64_t b = 0; b < cols / group; ++b) std::memcpy(row + b * (2 + group / 2), &scale, 2);
        break;
      case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: case DType::IQ4_XS:
      case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: {
        // The f16 scale (and minimum) fields of each block; the rest stays random.
        const size_t bb = llm::ggml_block_bytes(t);
        const size_t d_at = t == DType::Q2_K ? 80 : t == DType::Q3_K ? 108 : t == DType::Q6_K ? 208 : 0;
        const bool has_min = t == DType::Q5_1 || t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K;
        for (int64_t b = 0; b < cols / int64_t(group); ++b) {
          std::memcpy(row + b * bb + d_at, &scale, 2);
          if (has_min) std::memcpy(row + b * bb + d_at + 2, &scale, 2);
        }
        break;
      }
      default:
        for (int64_t k = 0; k < cols; ++k) {
          const float f = nd(rng);
          std::memcpy(row + 4 * k, &f, 4);
        }
        break;
    }
  }
}

struct WeightSet {
  std::vector<llm::Buffer<uint8_t>> copies;
  WeightView view;
};

WeightSet make_set(DType t, uint32_t group, int64_t rows, int64_t cols, size_t min_total, bool x8 = false) {
  WeightSet s;
  s.view.dtype = t;
  s.view.group = group;
  s.view.rows = rows;
  s.view.cols = cols;
  s.view.row_bytes = llm::dtype_row_bytes(t, cols, group);
  const size_t bytes = s.view.row_bytes * size_t(rows);
  const size_t n = std::max<size_t>(1, (min_total + bytes - 1) / bytes);
  s.copies.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.copies[i].resize(bytes);
    fill_weights(t, group, rows, cols, s.copies[i].data(), uint32_t(i + 1));
    if (x8) {  // the layout the loader gives Q4_0 matrices under the AVX2 family
      llm::Buffer<uint8_t> packed;
      packed.resize(bytes);
      WeightView v = s.view;
      v.data = s.copies[i].data();
      llm::cpu::repack_x8(v, packed.data());
      s.copies[i] = std::move(packed);
    }
  }
  if (x8) s.view.layout = llm::cpu::WeightLayout::X8;
  return s;
}

std::vector<float> make_x(int64_t n, int64_t cols) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n * cols));
  for (auto& v : x) v = nd(rng);
  return x;
}

// ---------------------------------------------------------------------------
// Roofline probes.

__attribute__((target("avx2"))) uint64_t sum_range(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), s);
  uint64_t t = out[0] + out[1] + out[2] + out[3];
  for (; i < n; ++i) t += p[i];
  return t;
}

void BM_ReadBandwidth(benchmark::State& state) {
  if (!llm::cpu::use_avx2_kernels()) {
    state.SkipWithError("needs AVX2");
    return;
  }
  const int threads = int(state.range(0));
  const size_t n = kRotateBytes / 8;
  llm::Buffer<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  ThreadPool* pool = pool_for(threads);
  uint64_t sums[2] = {};
  for (auto _ : state) {
    pool->parallel([&](int ith, int nth) {
      int64_t b, e;
      ThreadPool::split(int64_t(n / 16), ith, nth, &b, &e);
      sums[ith] += sum_range(buf.data() + b * 16, size_t(e - b) * 16);
    });
    benchmark::DoNotOptimize(sums);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kRotateBytes));
}
// One thread is timed by its CPU time (robust on a shared machine), two by
// wall time (the CPU time of the calling thread alone would overstate them).
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ReadBandwidth)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

__attribute__((target("avx2,fma"))) float fma_loop(int64_t iters) {
  // 12 independent chains: more than latency (4) x pipes (2) needs.
  __m256 a[12];
#pragma GCC unroll 12
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

void BM_FmaPeak(benchmark::State& state) {
  if (!llm::cpu::use_avx2_kernels()) {
    state.SkipWithError("needs AVX2");
    return;
  }
  const int threads = int(state.range(0));
  const int64_t iters = 1 << 22;
  ThreadPool* pool = pool_for(threads);
  float sink[2] = {};
  for (auto _ : state) {
    pool->parallel([&](int ith, int) { sink[ith] += fma_loop(iters); });
    benchmark::DoNotOptimize(sink);
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      double(state.iterations()) * double(iters) * 12 * 8 * 2 * threads, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FmaPeak)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

__attribute__((target("avx512f"))) float fma512_loop(int64_t iters) {
  // 16 independent chains, as above; 16 floats per FMA.
  __m512 a[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  // Through memory: GCC 12's _mm512_reduce_add_ps trips -Wuninitialized in its own header.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

void BM_FmaPeak512(benchmark::State& state) {
  if (llm::cpu::best_isa() < llm::cpu::Isa::Avx512) {
    state.SkipWithError("needs AVX-512");
    return;
  }
  const int threads = int(state.range(0));
  const int64_t iters = 1 << 22;
  ThreadPool* pool = pool_for(threads);
  float sink[2] = {};
  for (auto _ : state) {
    pool->parallel([&](int ith, int) { sink[ith] += fma512_loop(iters); });
    benchmark::DoNotOptimize(sink);
  }
  state.counters["FLOP/s"] = benchmark::Counter(
      double(state.iterations()) * double(iters) * 16 * 16 * 2 * threads, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak512)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FmaPeak512)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------
// Kernels. Args: dtype code (0 f32, 1 f16, 3 q8, 4 q4 g32, 5 q4 g128,
// 6 q8 Reference mode, 7 q5_0, 8 q4_K, 9 q6_K, 10 q5_K, 11 q3_K, 12 q2_K,
// 13 q5_1, 14 iq4_nl, 15 q4_K Reference mode, 16 iq4_xs, 17 q4 g32 and 18 q8
// in the X8 layout), rows, cols, threads.

struct Variant {
  DType dtype;
  uint32_t group;
  MatmulMode mode;
  bool x8 = false;
};

Variant variant(int64_t code) {
  switch (code) {
    case 0: return {DType::F32, 0, MatmulMode::Fast};
    case 1: return {DType::F16, 0, MatmulMode::Fast};
    case 2: return {DType::BF16, 0, MatmulMode::Fast};
    case 3: return {DType::Q8, 32, MatmulMode::Fast};
    case 4: return {DType::Q4, 32, MatmulMode::Fast};
    case 5: return {DType::Q4, 128, MatmulMode::Fast};
    case 7: return {DType::Q5_0, 32, MatmulMode::Fast};
    case 8: return {DType::Q4_K, 256, MatmulMode::Fast};
    case 9: return {DType::Q6_K, 256, MatmulMode::Fast};
    case 10: return {DType::Q5_K, 256, MatmulMode::Fast};
    case 11: return {DType::Q3_K, 256, MatmulMode::Fast};
    case 12: return {DType::Q2_K, 256, MatmulMode::Fast};
    case 13: return {DType::Q5_1, 32, MatmulMode::Fast};
    case 14: return {DType::IQ4_NL, 32, MatmulMode::Fast};
    case 15: return {DType::Q4_K, 256, MatmulMode::Reference};
    case 16: return {DType::IQ4_XS, 256, MatmulMode::Fast};
    case 17: return {DType::Q4, 32, MatmulMode::Fast, true};
    case 18: return {DType::Q8, 32, MatmulMode::Fast, true};
    default: return {DType::Q8, 32, MatmulMode::Reference};
  }
}

void run_matmul(benchmark::State& state, int64_t n, size_t rotate) {
  const Variant v = variant(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2);
  const int threads = int(state.range(3));
  WeightSet set = make_set(v.dtype, v.group, rows, cols, rotate, v.x8);
  // Activations 64-byte aligned, as the engine keeps them (core/alloc.h).
  const std::vector<float> x0 = make_x(n, cols);
  std::vector<float> x_storage(x0.size() + 16);
  float* const x = x_storage.data() + (64 - reinterpret_cast<uintptr_t>(x_storage.data()) % 64) % 64 / 4;
  std::copy(x0.begin(), x0.end(), x);
  std::vector<float> y(size_t(n * rows));
  ThreadPool* pool = pool_for(threads);
  size_t next = 0;
  for (auto _ : state) {
    set.view.data = set.copies[next].data();
    next = (next + 1) % set.copies.size();
    llm::cpu::matmul(set.view, x, n, y.data(), pool, v.mode);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double bytes = double(set.view.row_bytes) * double(rows);
  state.SetBytesProcessed(int64_t(state.iterations() * bytes));
  state.counters["FLOP/s"] = benchmark::Counter(
      double(state.iterations()) * 2.0 * double(rows) * double(cols) * double(n),
      benchmark::Counter::kIsRate);
  state.SetLabel(std::string(llm::dtype_name(v.dtype)) + (v.dtype == DType::Q4 && v.group == 128 ? "g128" : "") +
                 (v.x8 ? "x8" : "") +
                 (v.mode == MatmulMode::Reference ? "/ref" : "") + "/" +
                 llm::cpu::isa_name(llm::cpu::active_isa()));
}

void BM_Gemv(benchmark::State& state) { run_matmul(state, 1, kRotateBytes); }
void BM_Gemm(benchmark::State& state) { run_matmul(state, 128, 0); }

const int64_t kShapes[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};

template <int64_t Threads>
void gemv_args(benchmark::internal::Benchmark* b) {
  for (int64_t code : {4, 17, 3, 18, 1, 5})
    for (const auto& s : kShapes) b->Args({code, s[0], s[1], Threads});
}

template <int64_t Threads>
void gemm_args(benchmark::internal::Benchmark* b) {
  for (int64_t code : {4, 17, 3, 18, 1, 0, 6})
    for (const auto& s : kShapes) {
      if (s[0] == 32000 && code != 4 && code != 17) continue;  // the big one once is enough
      b->Args({code, s[0], s[1], Threads});
    }
}

// GGUF block types: every type on 2048 x 2048, then Gemma 3 270M's shapes
// with the types its Q4_K_M file gives them, and q8 (the old import) for
// comparison.
template <int64_t Threads>
void gguf_args(benchmark::internal::Benchmark* b) {
  for (int64_t code : {7, 8, 9, 10, 11, 12, 13, 14, 16}) b->Args({code, 2048, 2048, Threads});
  for (int64_t code : {7, 3}) {
    b->Args({code, 1024, 640, Threads});
    b->Args({code, 2048, 640, Threads});
  }
  for (int64_t code : {8, 9, 3}) b->Args({code, 640, 2048, Threads});
}

// Batched decode of 16 sessions: 16 x rows against weights that come from
// DRAM (rotated copies), where the K-quant panels are built once per call
// for only 16 rows.
template <int64_t Threads>
void batch_args(benchmark::internal::Benchmark* b) {
  for (int64_t code : {8, 9, 10, 16})
    for (const auto& s : {kShapes[1], kShapes[2]}) b->Args({code, s[0], s[1], Threads});
}

void BM_GemvGguf(benchmark::State& state) { run_matmul(state, 1, kRotateBytes); }
void BM_GemmGguf(benchmark::State& state) { run_matmul(state, 128, 0); }
void BM_Batch16Gguf(benchmark::State& state) { run_matmul(state, 16, kRotateBytes); }
// Decode with one copy of the weights, which stays in cache: the kernel's
// compute bound (a kernel as fast here as BM_GemvGguf waits on arithmetic,
// not on memory).
void BM_GemvGgufHot(benchmark::State& state) { run_matmul(state, 1, 0); }

BENCHMARK(BM_GemvGguf)->Apply(gguf_args<1>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemvGguf)->Apply(gguf_args<2>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GemmGguf)->Apply(gguf_args<1>)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemmGguf)->Apply(gguf_args<2>)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GemvGgufHot)->Apply(gguf_args<1>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Batch16Gguf)->Apply(batch_args<1>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Batch16Gguf)->Apply(batch_args<2>)->UseRealTime()->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_Gemv)->Apply(gemv_args<1>)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemv)->Apply(gemv_args<2>)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Gemm)->Apply(gemm_args<1>)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm)->Apply(gemm_args<2>)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
