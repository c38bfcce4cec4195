#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

TEST(ThreadPool, EveryThreadRunsOncePerJob) {
  llm::ThreadPool pool(4);
  for (int job = 0; job < 200; ++job) {
    std::vector<std::atomic<int>> hits(4);
    pool.parallel([&](int ith, int nth) {
      ASSERT_EQ(nth, 4);
      hits[size_t(ith)]++;
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, SplitCoversRangeExactly) {
  for (int64_t n : {0, 1, 7, 64, 1001}) {
    for (int nth = 1; nth <= 5; ++nth) {
      int64_t covered = 0, prev_end = 0;
      for (int i = 0; i < nth; ++i) {
        int64_t b, e;
        llm::ThreadPool::split(n, i, nth, &b, &e);
        EXPECT_EQ(b, prev_end);
        covered += e - b;
        prev_end = e;
      }
      EXPECT_EQ(covered, n);
    }
  }
}

TEST(ThreadPool, ConcurrentCallersDoNotBlockOrCorrupt) {
  llm::ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto worker = [&] {
    for (int i = 0; i < 500; ++i) {
      std::atomic<int64_t> local{0};
      pool.parallel([&](int ith, int nth) {
        int64_t b, e;
        llm::ThreadPool::split(100, ith, nth, &b, &e);
        local += e - b;
      });
      ASSERT_EQ(local.load(), 100);
      total += local.load();
    }
  };
  std::thread a(worker), b(worker);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 500 * 100);
}
