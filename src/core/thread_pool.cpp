#include "core/thread_pool.h"

#include <exception>

#include "core/error.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLM_CPU_RELAX() _mm_pause()
#else
#define LLM_CPU_RELAX() ((void)0)
#endif

namespace llm {

// Waiting is three-staged: spin with pause (the gap between the parallel
// regions of one decode step is microseconds), then yield the core (so an
// oversubscribed machine, e.g. several sessions or other processes, still
// makes progress), then sleep on the condition variable (an idle pool costs
// nothing).
static constexpr int kSpinIterations = 1 << 11;
static constexpr int kYieldIterations = 1 << 9;

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  threads_.reserve(size_t(n_threads - 1));
  try {
    for (int i = 1; i < n_threads; ++i) threads_.emplace_back([this, i] { worker(i); });
  } catch (const std::exception& e) {
    // Out of threads or of memory for their stacks (std::system_error), or
    // bad_alloc for a thread's state. Destroying a joinable
    // std::thread would call std::terminate: stop and join the started ones.
    const size_t started = threads_.size();
    stop_and_join();
    fail(LLM_ERR_OUT_OF_MEMORY, "cannot start worker thread %zu of %d: %s", started + 1, n_threads - 1, e.what());
  }
}

ThreadPool::~ThreadPool() { stop_and_join(); }

void ThreadPool::stop_and_join() noexcept {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    // join() only fails for a thread that is not joinable or is this one;
    // neither can happen here, and a destructor must not throw.
    try {
      if (t.joinable()) t.join();
    } catch (...) {
    }
  }
  threads_.clear();
}

void ThreadPool::run(TaskFn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock()) {  // another session owns the pool: do it alone
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under mu_ pairs with the sleeper's predicate check.
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) cv_.notify_all();
  // Whatever happens on this thread, the workers are still using ctx (which
  // lives in the caller's frame): wait for them before leaving.
  std::exception_ptr error;
  try {
    fn(ctx, 0, n_threads_);
  } catch (...) {
    error = std::current_exception();
  }
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations)
      LLM_CPU_RELAX();
    else
      std::this_thread::yield();
  }
  {
    std::lock_guard<std::mutex> lk(error_mu_);
    if (!error) error = worker_error_;
    worker_error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations + kYieldIterations; ++spin) {
      if (spin < kSpinIterations)
        LLM_CPU_RELAX();
      else
        std::this_thread::yield();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    try {
      fn_(ctx_, ith, n_threads_);
    } catch (...) {  // handed to the caller of run(); escaping here would terminate
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!worker_error_) worker_error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace llm
