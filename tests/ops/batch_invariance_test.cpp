// Each output row of matmul must not depend on how many rows are computed
// together or on the thread count: a token's logits and K/V are then the same
// whether it was part of a prefill batch or decoded alone. Session features
// rely on it (evicting the tail reproduces a fresh prefill bit for bit).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  llm::cpu::WeightView view;
};

Weights make(llm::DType t, uint32_t group, int64_t rows, int64_t cols, std::mt19937& rng) {
  Weights w;
  const size_t rb = llm::dtype_row_bytes(t, cols, group);
  w.bytes.resize(rb * size_t(rows));
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = nd(rng);
    llm::quantize_row(t, group, row.data(), w.bytes.data() + size_t(r) * rb, cols);
  }
  w.view = {t, group, rows, cols, w.bytes.data(), rb};
  return w;
}

// Runs f() once per kernel family this CPU has (each must be invariant with
// itself), then restores the family that was chosen before.
template <typename F>
void for_each_isa(F f) {
  struct Restore {  // also when f throws
    llm::cpu::Isa saved = llm::cpu::max_isa();
    ~Restore() { llm::cpu::set_max_isa(saved); }
  } restore;
  for (llm::cpu::Isa isa : {llm::cpu::Isa::Scalar, llm::cpu::Isa::Avx2, llm::cpu::Isa::Avx512}) {
    if (isa > llm::cpu::best_isa()) continue;
    llm::cpu::set_max_isa(isa);
    f(isa);
  }
}

}  // namespace

TEST(MatmulBatchInvariance, RowResultsDoNotDependOnBatchOrThreads) {
  std::mt19937 rng(11);
  llm::ThreadPool pool1(1), pool2(2);
  struct T {
    llm::DType t;
    uint32_t g;
  };
  for_each_isa([&](llm::cpu::Isa isa) {
    for (const T& tt : {T{llm::DType::F32, 0}, T{llm::DType::F16, 0}, T{llm::DType::BF16, 0}, T{llm::DType::Q8, 32},
                        T{llm::DType::Q4, 32}, T{llm::DType::Q4, 64}, T{llm::DType::Q4, 128},
                        T{llm::DType::Q4M, 32}, T{llm::DType::Q4M, 64}, T{llm::DType::Q4M, 128}})
      for (llm::cpu::MatmulMode mode : {llm::cpu::MatmulMode::Reference, llm::cpu::MatmulMode::Fast}) {
        SCOPED_TRACE(testing::Message() << llm::cpu::isa_name(isa) << " " << llm::dtype_name(tt.t) << " g" << tt.g
                                        << " mode " << int(mode));
        // 33 (34) blocks of 32, so the AVX-512 kernels' last quad of 4 is partial.
        const int64_t rows = 67, cols = tt.g == 128 ? 1152 : tt.g == 64 ? 1088 : 1056, n = 13;
        Weights w = make(tt.t, tt.g, rows, cols, rng);
        std::normal_distribution<float> nd(0.f, 1.f);
        std::vector<float> x(size_t(n * cols));
        for (auto& v : x) v = nd(rng);
        std::vector<float> batch(size_t(n * rows));
        llm::cpu::matmul(w.view, x.data(), n, batch.data(), &pool2, mode);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<float> one(static_cast<size_t>(rows));
          llm::cpu::matmul(w.view, x.data() + i * cols, 1, one.data(), (i % 2) ? &pool1 : &pool2, mode);
          ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + i * rows, size_t(rows) * 4)) << "row " << i;
        }
      }
  });
}

// matmul_many (q, k, v and gate, up in one parallel region, x quantized
// once) must give every matrix exactly what matmul gives it alone, for every
// kernel family, with matrices of unequal heights (the threads' shares then
// cross from one matrix into the next), an empty one, and a group of mixed
// formats (done one by one).
TEST(MatmulBatchInvariance, ManyMatricesEqualOneByOne) {
  std::mt19937 rng(12);
  llm::ThreadPool pool2(2);
  for_each_isa([&](llm::cpu::Isa isa) {
    for (llm::DType t : {llm::DType::F16, llm::DType::Q8, llm::DType::Q4, llm::DType::Q4M})
      for (llm::cpu::MatmulMode mode : {llm::cpu::MatmulMode::Reference, llm::cpu::MatmulMode::Fast})
        for (int64_t n : {1, 5}) {
          SCOPED_TRACE(testing::Message() << llm::cpu::isa_name(isa) << " " << llm::dtype_name(t) << " mode "
                                          << int(mode) << " n " << n);
          const int64_t cols = 1056;
          const uint32_t g = t == llm::DType::F16 ? 0 : 32;
          const llm::DType other = t == llm::DType::Q8 ? llm::DType::Q4 : llm::DType::Q8;
          Weights w[4] = {make(t, g, 67, cols, rng), make(t, g, 13, cols, rng), make(t, g, 0, cols, rng),
                          make(t, g, 37, cols, rng)};
          Weights mixed = make(other, 32, 21, cols, rng);
          std::normal_distribution<float> nd(0.f, 1.f);
          std::vector<float> x(size_t(n * cols));
          for (auto& v : x) v = nd(rng);
          for (bool mix : {false, true}) {
            llm::cpu::WeightView views[4];
            for (int i = 0; i < 4; ++i) views[i] = w[i].view;
            if (mix) views[1] = mixed.view;
            std::vector<float> alone[4], many[4];
            float* outs[4];
            for (int i = 0; i < 4; ++i) {
              alone[i].assign(size_t(n * views[i].rows), 0.f);
              many[i].assign(size_t(n * views[i].rows), -1.f);
              outs[i] = many[i].data();
              llm::cpu::matmul(views[i], x.data(), n, alone[i].data(), &pool2, mode);
            }
            llm::cpu::matmul_many(views, outs, 4, x.data(), n, &pool2, mode);
            for (int i = 0; i < 4; ++i) {
              if (alone[i].empty()) continue;  // memcmp takes no null pointer, even for 0 bytes
              ASSERT_EQ(0, std::memcmp(alone[i].data(), many[i].data(), alone[i].size() * 4))
                  << "matrix " << i << (mix ? " (mixed formats)" : "");
            }
          }
        }
  });
}
