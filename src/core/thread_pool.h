// Persistent worker pool with low wake-up latency. A decode step issues a
// few hundred parallel regions, so workers spin briefly before sleeping and
// no thread is ever created per token.
//
// run(fn) calls fn(ith, nth) once on each of nth threads (the caller is
// thread 0) and returns when all are done. If a call throws (on any thread),
// run() still waits for the others and then rethrows the first exception on
// the caller's thread: nothing escapes a worker (that would terminate the
// process). If another thread is already
// using the pool (two sessions decoding at once), the caller does the whole
// job alone (nth = 1) instead of waiting: sessions never block each other.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace llm {

class ThreadPool {
 public:
  using TaskFn = void (*)(void* ctx, int ith, int nth);

  // n_threads <= 0: hardware concurrency. Throws Error(LLM_ERR_OUT_OF_MEMORY)
  // if a worker thread cannot be started (the ones already started are joined).
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  void run(TaskFn fn, void* ctx);

  template <typename F>
  void parallel(F&& f) {
    run([](void* c, int ith, int nth) { (*static_cast<std::remove_reference_t<F>*>(c))(ith, nth); },
        const_cast<void*>(static_cast<const void*>(&f)));
  }

  // Splits [0, n) into nth contiguous ranges; returns thread ith's [begin, end).
  static void split(int64_t n, int ith, int nth, int64_t* begin, int64_t* end) {
    const int64_t per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
  }

 private:
  void worker(int ith);
  void stop_and_join() noexcept;

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex busy_;  // held by the thread that owns the current job
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex error_mu_;
  std::exception_ptr worker_error_;  // first exception thrown by a worker in the current job
};

}  // namespace llm
