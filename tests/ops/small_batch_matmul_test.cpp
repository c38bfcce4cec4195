// Batched decode (llm_decode_batch) runs matmuls of 2..16 rows, one per
// session, through the small-batch paths of the kernels: the f32 tiles
// streamed one W row at a time (F32/F16/BF16), the integer tiles with the
// decode prefetch distance (Q8/Q4, GGUF blocks). Each row must come out
// bit-identical to the same row multiplied alone (n == 1, the decode
// kernels) and to the same row inside a prefill-sized batch (n > 16), for
// every batch size around the kernels' column tiles (3 and 4), every kernel
// family and 1 or 2 threads.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "core/thread_pool.h"
#include "gguf_blocks.h"
#include "quant/quant.h"

namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  llm::cpu::WeightView view;
};

Weights make(llm::DType t, uint32_t group, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  const size_t rb = llm::dtype_row_bytes(t, cols, group);
  if (llm::dtype_is_ggml_block(t)) {
    w.bytes = llm::testing::random_gguf_rows(t, rows, cols, rng);
  } else {
    w.bytes.resize(rb * size_t(rows));
    std::normal_distribution<float> nd(0.f, 0.05f);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& v : row) v = nd(rng);
      llm::quantize_row(t, group, row.data(), w.bytes.data() + size_t(r) * rb, cols);
    }
  }
  w.view = {t, group, rows, cols, w.bytes.data(), rb};
  return w;
}

}  // namespace

TEST(SmallBatchMatmul, EveryRowEqualsItAloneAndInAPrefillBatch) {
  struct Restore {
    llm::cpu::Isa saved = llm::cpu::max_isa();
    ~Restore() { llm::cpu::set_max_isa(saved); }
  } restore;
  struct T {
    llm::DType t;
    uint32_t g;
  };
  const T types[] = {{llm::DType::F32, 0},    {llm::DType::F16, 0},     {llm::DType::BF16, 0},
                     {llm::DType::Q8, 32},    {llm::DType::Q4, 32},     {llm::DType::Q4, 128},
                     {llm::DType::Q4M, 32},   {llm::DType::Q5_0, 32},   {llm::DType::Q5_1, 32},
                     {llm::DType::IQ4_NL, 32}, {llm::DType::Q4_K, 256}, {llm::DType::Q6_K, 256}};
  std::mt19937 rng(21);
  llm::ThreadPool pool1(1), pool2(2);
  const int64_t n_max = 20, rows = 37;
  for (llm::cpu::Isa isa : {llm::cpu::Isa::Scalar, llm::cpu::Isa::Avx2, llm::cpu::Isa::Avx512}) {
    if (isa > llm::cpu::best_isa()) continue;
    llm::cpu::set_max_isa(isa);
    for (const T& tt : types) {
      // Q4 g128 and K-quants need whole groups; 1056 = 33 blocks of 32 (a
      // partial AVX-512 quad) and more than one K block of the f32 tiles.
      const int64_t cols = tt.g == 256 ? 1280 : tt.g == 128 ? 1152 : 1056;
      Weights w = make(tt.t, tt.g, rows, cols, rng);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(size_t(n_max * cols));
      for (auto& v : x) v = nd(rng);
      std::vector<float> prefill(size_t(n_max * rows));
      llm::cpu::matmul(w.view, x.data(), n_max, prefill.data(), &pool2);
      for (int64_t n : {2, 3, 4, 5, 7, 8, 9, 16}) {
        for (llm::ThreadPool* pool : {&pool1, &pool2}) {
          SCOPED_TRACE(testing::Message() << llm::cpu::isa_name(isa) << " " << llm::dtype_name(tt.t) << " g" << tt.g
                                          << " n " << n << " threads " << pool->size());
          std::vector<float> batch(size_t(n * rows));
          llm::cpu::matmul(w.view, x.data(), n, batch.data(), pool);
          for (int64_t i = 0; i < n; ++i) {
            std::vector<float> one(static_cast<size_t>(rows));
            llm::cpu::matmul(w.view, x.data() + i * cols, 1, one.data(), pool);
            ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + i * rows, size_t(rows) * 4)) << "row " << i << " vs alone";
            ASSERT_EQ(0, std::memcmp(prefill.data() + i * rows, batch.data() + i * rows, size_t(rows) * 4))
                << "row " << i << " vs prefill";
          }
        }
      }
    }
  }
}
