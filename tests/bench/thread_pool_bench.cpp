// Cost of one parallel region of llm::ThreadPool, the fork/join that every
// matmul and attention call of a decode step pays (TinyLlama: 22 layers x
// (7 matmuls + attention) + the output matmul = 177 regions per token).
//
//   BM_ParallelEmpty/threads        back-to-back regions with an empty body:
//                                   the round trip while workers spin.
//   BM_ParallelAfterGap/threads/us  a region after `us` microseconds of
//                                   caller-only work (the serial norm, RoPE
//                                   and residual code between matmuls), so
//                                   workers may have moved from spinning to
//                                   yielding or to sleeping on the condvar.
//   BM_ParallelSplitWork/threads    a region doing ~100 us of work split in
//                                   nth parts: time vs 100 us / nth shows the
//                                   overhead when there is real work.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

llm::ThreadPool* pool_for(int threads) {
  static llm::ThreadPool p1(1), p2(2), p4(4);
  return threads >= 4 ? &p4 : threads >= 2 ? &p2 : &p1;
}

// Busy work the compiler cannot drop: ~1 ns per iteration.
uint64_t spin_work(uint64_t iters, uint64_t seed) {
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < iters; ++i) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

void busy_for_us(int us) {
  const auto end = Clock::now() + std::chrono::microseconds(us);
  uint64_t x = 1;
  while (Clock::now() < end) x = spin_work(64, x);
  benchmark::DoNotOptimize(x);
}

void BM_ParallelEmpty(benchmark::State& state) {
  llm::ThreadPool* pool = pool_for(int(state.range(0)));
  std::atomic<int> hits{0};
  for (auto _ : state) pool->parallel([&](int, int) { hits.fetch_add(1, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(hits.load());
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ParallelEmpty)->Arg(1)->Arg(2)->Arg(4)->UseRealTime();

void BM_ParallelAfterGap(benchmark::State& state) {
  llm::ThreadPool* pool = pool_for(int(state.range(0)));
  const int gap_us = int(state.range(1));
  std::atomic<int> hits{0};
  for (auto _ : state) {
    busy_for_us(gap_us);
    const auto t0 = Clock::now();
    pool->parallel([&](int, int) { hits.fetch_add(1, std::memory_order_relaxed); });
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  benchmark::DoNotOptimize(hits.load());
}
BENCHMARK(BM_ParallelAfterGap)
    ->ArgsProduct({{2}, {0, 10, 100, 1000, 10000}})
    ->UseManualTime();

void BM_ParallelSplitWork(benchmark::State& state) {
  llm::ThreadPool* pool = pool_for(int(state.range(0)));
  constexpr uint64_t kIters = 100000;  // ~100 us on one core
  std::atomic<uint64_t> sink{0};
  for (auto _ : state) {
    pool->parallel([&](int ith, int nth) {
      int64_t b, e;
      llm::ThreadPool::split(int64_t(kIters), ith, nth, &b, &e);
      sink.fetch_add(spin_work(uint64_t(e - b), uint64_t(ith)), std::memory_order_relaxed);
    });
  }
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_ParallelSplitWork)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
