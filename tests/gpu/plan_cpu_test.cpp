// CPU tests of the CUDA backend's host-side decisions (src/backend/cuda/
// plan.h): launch shapes, device KV page bookkeeping with copy-on-write,
// page-table upload tracking and CUDA-graph bookkeeping. Not labelled cuda.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "backend/cuda/plan.h"
#include "core/error.h"

namespace {

using namespace llm::cuda;

// ---------------------------------------------------------------- launch shapes

TEST(CudaPlan, GemvWarpsPerRowKeepsBlocksInFlightWithoutIdleLanes) {
  for (int sms : {1, 8, 132}) {
    for (int64_t rows : {1, 7, 64, 1024, 4096, 14336, 128256}) {
      for (int64_t chunks : {1, 22, 64, 128, 256, 512, 1792}) {
        const int w = gemv_warps_per_row(rows, chunks, sms);
        ASSERT_TRUE(w == 1 || w == 2 || w == 4 || w == 8);
        if (w > 1) {
          // Only split a row when it has lanes' worth of chunks for every warp...
          EXPECT_GE(chunks, 32 * w);
          // ...and when fewer rows would leave the GPU short of blocks.
          const int64_t blocks_before = (rows + (8 / (w / 2)) - 1) / (8 / (w / 2));
          EXPECT_LT(blocks_before, 2 * sms);
        }
      }
    }
  }
  // Llama-3-8B wk/wv (1024 rows, q4: 4096 / 32 = 128 chunks) on 132 SMs: 4 warps
  // per row (512 blocks; 128 chunks keep all 4 x 32 lanes busy).
  EXPECT_EQ(gemv_warps_per_row(1024, 128, 132), 4);
  // The LM head has blocks to spare: one warp per row.
  EXPECT_EQ(gemv_warps_per_row(128256, 128, 132), 1);
}

TEST(CudaPlan, GemvTwoRowsPerWarpOnlyForSingleRowPassesWithBlocksToSpare) {
  EXPECT_EQ(gemv_rows_per_warp(28672, 1, 1, 132), 2);  // Llama-3-8B gate|up: 1792 blocks of 16 rows
  EXPECT_EQ(gemv_rows_per_warp(28672, 1, 8, 132), 1);  // batched passes: one row per warp
  EXPECT_EQ(gemv_rows_per_warp(1024, 4, 1, 132), 1);   // a row split over warps
  EXPECT_EQ(gemv_rows_per_warp(4096, 1, 1, 132), 1);   // 256 blocks of 16 would be < 2 per SM
  EXPECT_EQ(gemv_rows_per_warp(4096, 1, 1, 8), 2);
}

TEST(CudaPlan, GemvBatchTilesCoverEveryRowOnce) {
  for (int64_t n = 1; n <= 70; ++n) {
    int64_t done = 0, passes = 0;
    while (done < n) {
      const int t = gemv_batch_tile(n - done);
      ASSERT_TRUE(t == 1 || t == 2 || t == 4 || t == 8);
      ASSERT_GE(t, std::min<int64_t>(n - done, 8)) << "a pass must take every row it can";
      done += std::min<int64_t>(t, n - done);
      ++passes;
    }
    EXPECT_EQ(done, n);
    EXPECT_EQ(passes, (n + 7) / 8);
  }
}

TEST(CudaPlan, DecodeSplitsCoverTheCapacityInWholeTiles) {
  for (int64_t cap : {int64_t(1), int64_t(16), int64_t(256), int64_t(4096), int64_t(131072), int64_t(1) << 22}) {
    for (int32_t n_seqs : {1, 8, 32}) {
      for (int32_t kvh : {1, 8, 32}) {
        const SplitPlan p = plan_decode_splits(cap, n_seqs, kvh, 132);
        ASSERT_EQ(p.split_tokens % kAttnTile, 0);
        ASSERT_GE(p.split_tokens, 4 * kAttnTile);
        ASSERT_GE(p.n_splits, 1);
        ASSERT_LE(p.n_splits, 64);
        ASSERT_GE(int64_t(p.split_tokens) * p.n_splits, cap);
        ASSERT_LT(int64_t(p.split_tokens) * (p.n_splits - 1), std::max<int64_t>(cap, 1));  // no split fully past the end
      }
    }
  }
  // One sequence, 8 KV heads, 4096 keys on 132 SMs: splits put >= 2 blocks per SM in flight.
  const SplitPlan one = plan_decode_splits(4096, 1, 8, 132);
  EXPECT_GE(int64_t(one.n_splits) * 8, 132);
  // A big batch already fills the GPU: no split.
  EXPECT_EQ(plan_decode_splits(512, 64, 8, 132).n_splits, 1);
}

TEST(CudaPlan, SplitRangeClampsToTheKeys) {
  int32_t b, e;
  split_range(0, 128, 300, &b, &e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 128);
  split_range(2, 128, 300, &b, &e);
  EXPECT_EQ(b, 256);
  EXPECT_EQ(e, 300);
  split_range(3, 128, 300, &b, &e);
  EXPECT_EQ(b, e);  // empty: the block only writes an empty partial
  split_range(0, 1 << 30, 5, &b, &e);
  EXPECT_EQ(e, 5);
}

TEST(CudaPlan, PrefillRowsAndSharedMemoryFitTheKernel) {
  for (int32_t group : {1, 2, 4, 8, 16, 32, 64}) {
    for (int32_t hd : {8, 64, 80, 128, 256}) {
      const int32_t r = prefill_rows_per_block(group, hd);
      if (group * hd > kAttnThreads * kAttnMaxAcc || group > kAttnMaxQueries) {
        EXPECT_EQ(r, 0);
        continue;
      }
      ASSERT_GE(r, 1);
      EXPECT_LE(int64_t(r) * group * hd, kAttnThreads * kAttnMaxAcc);
      EXPECT_LE(r * group, kAttnMaxQueries);
      const AttnSmem s = attention_smem(r * group, hd);
      // Regions in order, no overlap, K rows padded by one float.
      EXPECT_EQ(s.k_stride, hd + 1);
      EXPECT_EQ(s.k - s.q, r * group * hd);
      EXPECT_EQ(s.v - s.k, kAttnTile * (hd + 1));
      EXPECT_EQ(s.p - s.v, kAttnTile * hd);
      EXPECT_EQ(s.m - s.p, r * group * kAttnTile);
      EXPECT_EQ(s.total, s.alpha + r * group);
      // Within what every targeted GPU (sm_80..sm_90) can give one block.
      EXPECT_LE(s.bytes(), size_t(99 * 1024));
    }
  }
  EXPECT_EQ(prefill_rows_per_block(4, 128), 8);   // Llama-3-8B: 8 rows x 4 heads per block
  EXPECT_EQ(prefill_rows_per_block(8, 300), 0);   // head_dim beyond the kernel
}

TEST(CudaPlan, TableBucketsArePowersOfTwoFromSixteen) {
  EXPECT_EQ(table_bucket(0), 16);
  EXPECT_EQ(table_bucket(16), 16);
  EXPECT_EQ(table_bucket(17), 32);
  EXPECT_EQ(table_bucket(1000), 1024);
  for (int64_t p = 1; p < 5000; p += 37) {
    const int32_t b = table_bucket(p);
    EXPECT_GE(b, p);
    EXPECT_EQ(b & (b - 1), 0);
    EXPECT_LT(b, 2 * std::max<int64_t>(p, 16));
  }
}

// ---------------------------------------------------------------- PageAllocator

TEST(CudaPages, AllocatorHonoursTheBudgetAllOrNothing) {
  PageAllocator a(1000, 10500, 4);  // 10 pages, chunks of 4 (last chunk cut to 2)
  EXPECT_EQ(a.max_pages(), 10);
  EXPECT_EQ(a.chunk_pages(0), 4);
  EXPECT_EQ(a.chunk_pages(2), 2);
  EXPECT_EQ(a.chunk_pages(3), 0);
  EXPECT_EQ(a.chunks_needed_for(5), 2);
  std::vector<int32_t> got;
  ASSERT_TRUE(a.acquire(7, got));
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(a.bytes_in_use(), 7000u);
  std::vector<int32_t> more;
  EXPECT_FALSE(a.acquire(4, more));  // 11 > 10: nothing taken
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(a.pages_in_use(), 7);
  EXPECT_EQ(a.high_water(), 7);
  // Freed ids come back lowest first.
  a.release(5);
  a.release(2);
  EXPECT_EQ(a.chunks_needed_for(2), 2);  // both reuse freed ids in chunks 0/1
  EXPECT_EQ(a.chunks_needed_for(3), 2);  // one fresh id (7) still in chunk 1
  EXPECT_EQ(a.chunks_needed_for(4), 3);  // fresh id 8 needs chunk 2
  ASSERT_TRUE(a.acquire(3, more));
  EXPECT_EQ(more, (std::vector<int32_t>{2, 5, 7}));
  // Reference counts: a shared page is freed by its last holder only.
  a.retain(0);
  EXPECT_EQ(a.refs(0), 2);
  a.release(0);
  EXPECT_EQ(a.pages_in_use(), 8);
  a.release(0);
  EXPECT_EQ(a.pages_in_use(), 7);
  EXPECT_THROW(a.release(0), llm::Error);  // double free is a bug, reported
}

TEST(CudaPages, PageListAppendsAndCopiesSharedPagesOnWrite) {
  PageAllocator a(64, 64 * 8, 8);
  PageList s;
  std::vector<PageCopy> copies;
  ASSERT_TRUE(s.prepare_write(a, 4, 0, 9, copies));  // 9 tokens -> 3 pages
  EXPECT_EQ(s.size(), 3u);
  EXPECT_TRUE(copies.empty());
  PageList f = s.share(a);
  EXPECT_EQ(a.pages_in_use(), 3);
  EXPECT_EQ(a.refs(s.ids()[2]), 2);
  // Appending token 9 writes page 2 (shared) -> one copy; token 9 fits page 2.
  EXPECT_EQ(f.pages_needed(a, 4, 9, 10), 1u);
  size_t appended = 99;
  ASSERT_TRUE(f.prepare_write(a, 4, 9, 10, copies, &appended));
  EXPECT_EQ(appended, 0u);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, s.ids()[2]);
  EXPECT_EQ(copies[0].dst, f.ids()[2]);
  EXPECT_NE(f.ids()[2], s.ids()[2]);
  EXPECT_EQ(f.ids()[0], s.ids()[0]);  // untouched pages stay shared
  EXPECT_EQ(a.refs(s.ids()[2]), 1);
  EXPECT_EQ(a.refs(s.ids()[0]), 2);
  // Writing a range over pages 0..3 (two shared + one new page).
  copies.clear();
  EXPECT_EQ(f.pages_needed(a, 4, 2, 13), 3u);  // pages 0, 1 shared; page 3 new
  ASSERT_TRUE(f.prepare_write(a, 4, 2, 13, copies, &appended));
  EXPECT_EQ(appended, 1u);
  EXPECT_EQ(copies.size(), 2u);
  EXPECT_EQ(f.size(), 4u);
  EXPECT_EQ(a.pages_in_use(), 3 + 4);
  // Out of pages: nothing changes.
  PageList g = s.share(a);
  const std::vector<int32_t> before = g.ids();
  copies.clear();
  EXPECT_FALSE(g.prepare_write(a, 4, 0, 20, copies));  // 3 copies + 2 new > 1 free
  EXPECT_EQ(g.ids(), before);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(a.pages_in_use(), 7);
  g.release_all(a);
  f.shrink_to(a, 1);
  EXPECT_EQ(f.size(), 1u);
  f.release_all(a);
  s.release_all(a);
  EXPECT_EQ(a.pages_in_use(), 0);
}

TEST(CudaPages, TableMirrorUploadsOnlyWhatChanged) {
  TableMirror m;
  m.reset(2);
  std::vector<int32_t> ids = {4, 9, 2};
  EXPECT_EQ(m.sync_row(0, ids), 0u);  // fresh: whole row
  EXPECT_EQ(m.sync_row(0, ids), 3u);  // unchanged: nothing
  ids.push_back(7);
  EXPECT_EQ(m.sync_row(0, ids), 3u);  // appended: the new tail only
  ids[1] = 11;                        // copy-on-write replaced page 1
  EXPECT_EQ(m.sync_row(0, ids), 1u);
  ids.resize(2);                      // truncated: nothing to upload
  EXPECT_EQ(m.sync_row(0, ids), 2u);
  EXPECT_EQ(m.sync_row(1, {4, 11}), 0u);  // another row is independent
  m.reset(2);
  EXPECT_EQ(m.sync_row(0, ids), 0u);  // after a reallocation everything is dirty
  EXPECT_THROW(m.sync_row(2, ids), llm::Error);
}

// ---------------------------------------------------------------- DecodeGraphs

TEST(CudaGraphs, CaptureOnSecondUseThenReplay) {
  DecodeGraphs g(4, 2);
  const GraphKey k{1, 16, 0};
  auto d = g.lookup(k);
  EXPECT_EQ(d.action, DecodeGraphs::Action::Eager);  // one-off shapes never pay a capture
  d = g.lookup(k);
  ASSERT_EQ(d.action, DecodeGraphs::Action::Capture);
  EXPECT_EQ(d.destroy_slot, -1);
  const int slot = d.slot;
  g.captured(slot);
  for (int i = 0; i < 3; ++i) {
    d = g.lookup(k);
    EXPECT_EQ(d.action, DecodeGraphs::Action::Replay);
    EXPECT_EQ(d.slot, slot);
  }
  // A longer page table is another key (the grid and buffer stride differ).
  EXPECT_EQ(g.lookup(GraphKey{1, 32, 0}).action, DecodeGraphs::Action::Eager);
  EXPECT_EQ(g.n_ready(), 1u);
}

TEST(CudaGraphs, LeastRecentlyUsedGraphIsDestroyedWhenFull) {
  DecodeGraphs g(2, 1);  // capture on first use, two slots
  auto a = g.lookup(GraphKey{1, 16, 0});
  ASSERT_EQ(a.action, DecodeGraphs::Action::Capture);
  g.captured(a.slot);
  auto b = g.lookup(GraphKey{2, 16, 0});
  ASSERT_EQ(b.action, DecodeGraphs::Action::Capture);
  g.captured(b.slot);
  EXPECT_EQ(g.lookup(GraphKey{1, 16, 0}).action, DecodeGraphs::Action::Replay);  // a is now the most recent
  auto c = g.lookup(GraphKey{4, 16, 0});
  ASSERT_EQ(c.action, DecodeGraphs::Action::Capture);
  EXPECT_EQ(c.destroy_slot, b.slot);  // b was least recently used
  EXPECT_EQ(c.slot, b.slot);
  g.captured(c.slot);
  EXPECT_EQ(g.lookup(GraphKey{2, 16, 0}).action, DecodeGraphs::Action::Capture);  // b must be captured again
}

TEST(CudaGraphs, FailureDisablesGraphsAndInvalidateListsReadySlots) {
  DecodeGraphs g(4, 1);
  auto a = g.lookup(GraphKey{1, 16, 0});
  g.captured(a.slot);
  auto b = g.lookup(GraphKey{2, 16, 0});
  g.captured(b.slot);
  auto c = g.lookup(GraphKey{3, 16, 0});  // capture started, not finished
  (void)c;
  std::vector<int> slots = g.invalidate_all();
  std::sort(slots.begin(), slots.end());
  EXPECT_EQ(slots, (std::vector<int>{a.slot, b.slot}));
  EXPECT_EQ(g.n_ready(), 0u);
  EXPECT_EQ(g.lookup(GraphKey{1, 16, 0}).action, DecodeGraphs::Action::Capture);  // recaptured after invalidation
  g.capture_failed();
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(g.lookup(GraphKey{1, 16, 0}).action, DecodeGraphs::Action::Eager);
}

}  // namespace
