// CPU tests of the CUDA backend's GGUF block weights (WFormat::Ggml): the
// per-block math of src/backend/cuda/ggml_blocks.h against the bit-exact
// host decoders (quant/ggml_quants.h), the device layout and repacking of
// weight_layout.h, and replays of gemv_ggml.cu's work split and dequant
// indexing with the kernels' own helpers. Not labelled cuda: runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cuda/ggml_blocks.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/weight_layout.h"
#include "convert/ggml_quantize.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/ggml_quants.h"

namespace {

using namespace llm;
using namespace llm::cuda;

constexpr DType kTypes[] = {DType::Q5_0, DType::Q5_1, DType::Q2_K,   DType::Q3_K,  DType::Q4_K,
                            DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Run-time dispatch to the kernels' templates.
void decode_any(DType t, const uint8_t* b, int s, float* y) {
  with_ggml_type(
      t, [&](auto k) { ggml_decode32<decltype(k)::value>(b, s, y); }, [] { FAIL() << "not a GGUF block type"; });
}

float dot_any(DType t, const uint8_t* b, int s, const float* x) {
  return with_ggml_type(
      t, [&](auto k) { return ggml_dot32<decltype(k)::value>(b, s, x); },
      [] {
        ADD_FAILURE() << "not a GGUF block type";
        return 0.f;
      });
}

// The kernels' unit addressing (ggml_unit_block / ggml_unit_sub) at run time.
const uint8_t* unit_block(DType t, const uint8_t* row, int64_t u) {
  return with_ggml_type(
      t, [&](auto k) { return ggml_unit_block<decltype(k)::value>(row, u); },
      [&] {
        ADD_FAILURE() << "not a GGUF block type";
        return row;
      });
}
int unit_sub(DType t, int64_t u) {
  return with_ggml_type(
      t, [&](auto k) { return ggml_unit_sub<decltype(k)::value>(u); },
      [] {
        ADD_FAILURE() << "not a GGUF block type";
        return 0;
      });
}

// Byte offsets of a block's f16 scales (d, and dmin / m where the type has one).
std::vector<size_t> f16_fields(DType t) {
  switch (t) {
    case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS: return {0};
    case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: return {};
  }
}

// n blocks of random bytes (every code, scale and high-bit pattern), with
// f16 scales of random sign and magnitude 2^-14 .. 2^2 (normal f16 values).
std::vector<uint8_t> random_blocks(DType t, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> mag(-14.f, 2.f);
  const size_t bb = ggml_block_bytes(t);
  std::vector<uint8_t> v(bb * size_t(n));
  for (uint8_t& c : v) c = uint8_t(byte(rng));
  for (int b = 0; b < n; ++b)
    for (size_t off : f16_fields(t)) {
      const float d = std::exp2(mag(rng)) * ((byte(rng) & 1) ? -1.f : 1.f);
      const uint16_t h = f32_to_f16(d);
      std::memcpy(v.data() + size_t(b) * bb + off, &h, 2);
    }
  return v;
}

// A stored matrix of N(0, sd) weights (a few outliers) made with the
// project's GGUF block quantizers.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  cpu::WeightView view;
};

HostMatrix make_matrix(DType t, int64_t rows, int64_t cols, uint32_t seed, float sd = 0.5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  HostMatrix m;
  m.view.dtype = t;
  m.view.group = uint32_t(ggml_block_values(t));
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.row_bytes = dtype_row_bytes(t, cols, m.view.group);
  EXPECT_GT(m.view.row_bytes, 0u);
  m.bytes.resize(m.view.row_bytes * size_t(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = nd(rng);
    row[size_t(r) % row.size()] *= 8.f;  // an outlier per row
    quantize_ggml_row(t, row.data(), nullptr, m.bytes.data() + size_t(r) * m.view.row_bytes, cols);
  }
  m.view.data = m.bytes.data();
  return m;
}

struct Packed {
  MatrixLayout layout;
  std::vector<uint8_t> data;
};

Packed pack(const HostMatrix& m) {
  Packed p;
  p.layout = matrix_layout(m.view.dtype, m.view.group, m.view.rows, m.view.cols);
  p.data.assign(p.layout.data_bytes(), 0xAA);
  repack_rows(m.view, p.layout, 0, m.view.rows, p.data.data(), nullptr);
  return p;
}

std::vector<float> dequant_rows(const HostMatrix& m) {
  std::vector<float> v(size_t(m.view.rows * m.view.cols));
  for (int64_t r = 0; r < m.view.rows; ++r) cpu::dequantize_row(m.view, r, v.data() + r * m.view.cols);
  return v;
}

// ---------------------------------------------------------------- per-block math

TEST(CudaGgmlBlocks, GeometryMatchesTheDtypeTables) {
  for (DType t : kTypes) {
    EXPECT_EQ(ggml_values_of(t), ggml_block_values(t)) << dtype_name(t);
    EXPECT_EQ(size_t(ggml_bytes_of(t)), ggml_block_bytes(t)) << dtype_name(t);
    EXPECT_EQ(ggml_values_of(t), ggml_block_size(ggml_type_of(t))) << dtype_name(t);
    EXPECT_EQ(ggml_subs_of(t) * 32, ggml_values_of(t));
  }
  EXPECT_EQ(ggml_values_of(DType::Q4), 0);
  EXPECT_EQ(ggml_bytes_of(DType::F16), 0);
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(iq4_value(i), table[i]) << i;
}

// Every sub-block of random-byte blocks and of quantizer-made blocks decodes
// to exactly dequantize_ggml's floats.
TEST(CudaGgmlBlocks, Decode32IsBitExactWithDequantizeGgml) {
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int nv = ggml_values_of(t), bb = ggml_bytes_of(t);
    std::vector<uint8_t> blocks = random_blocks(t, 200, 17);
    const HostMatrix q = make_matrix(t, 4, 4 * 256, 23, 0.3f);
    blocks.insert(blocks.end(), q.bytes.begin(), q.bytes.end());
    const int n_blocks = int(blocks.size() / size_t(bb));
    std::vector<float> ref(size_t(n_blocks) * size_t(nv));
    dequantize_ggml(ggml_type_of(t), blocks.data(), ref.data(), int64_t(ref.size()));
    float got[32];
    for (int b = 0; b < n_blocks; ++b)
      for (int s = 0; s < nv / 32; ++s) {
        decode_any(t, blocks.data() + size_t(b) * size_t(bb), s, got);
        for (int l = 0; l < 32; ++l) {
          const float want = ref[size_t(b) * size_t(nv) + size_t(32 * s + l)];
          ASSERT_EQ(bits(got[l]), bits(want)) << "block " << b << " sub " << s << " value " << l << ": " << got[l]
                                              << " vs " << want;
        }
      }
  }
}

// The factored dot (the GEMV's one-row path) and dot32 of decoded values (its
// batched path) against the exact dot of the dequantized values. The bound
// is f32 rounding over the run sums: scale and min are at most the
// sub-block's largest magnitude.
TEST(CudaGgmlBlocks, Dot32MatchesTheDequantizedDot) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int nv = ggml_values_of(t), bb = ggml_bytes_of(t);
    std::vector<uint8_t> blocks = random_blocks(t, 100, 31);
    const HostMatrix q = make_matrix(t, 2, 512, 37);
    blocks.insert(blocks.end(), q.bytes.begin(), q.bytes.end());
    const int n_blocks = int(blocks.size() / size_t(bb));
    std::vector<float> ref(size_t(n_blocks) * size_t(nv));
    dequantize_ggml(ggml_type_of(t), blocks.data(), ref.data(), int64_t(ref.size()));
    float x[32];
    for (int b = 0; b < n_blocks; ++b)
      for (int s = 0; s < nv / 32; ++s) {
        for (float& v : x) v = ud(rng);
        const float* w = ref.data() + size_t(b) * size_t(nv) + size_t(32 * s);
        double want = 0, wmax = 0, mag = 0;
        for (int l = 0; l < 32; ++l) {
          want += double(w[l]) * x[l];
          wmax = std::max(wmax, double(std::fabs(w[l])));
        }
        for (int l = 0; l < 32; ++l) mag += (std::fabs(w[l]) + wmax) * std::fabs(x[l]);
        const double tol = 2e-6 * mag + 1e-30;
        const uint8_t* blk = blocks.data() + size_t(b) * size_t(bb);
        ASSERT_NEAR(dot_any(t, blk, s, x), want, tol) << "block " << b << " sub " << s;
        ASSERT_NEAR(dot32(w, x), want, tol) << "block " << b << " sub " << s;
      }
  }
}

// ---------------------------------------------------------------- layout

TEST(CudaGgmlLayout, RepackedRowsAreTheStoredBlocksAndDecodeExactly) {
  for (DType t : kTypes) {
    const int nv = ggml_values_of(t);
    const std::vector<int64_t> cols_cases =
        nv == 32 ? std::vector<int64_t>{32, 96, 160, 4096} : std::vector<int64_t>{256, 768, 2304};
    for (int64_t cols : cols_cases) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " cols " + std::to_string(cols));
      const int64_t rows = 6;
      const HostMatrix m = make_matrix(t, rows, cols, uint32_t(cols));
      const MatrixLayout l = matrix_layout(t, m.view.group, rows, cols);
      EXPECT_EQ(l.format, WFormat::Ggml);
      EXPECT_EQ(l.block, t);
      EXPECT_TRUE(is_quantized(l.format));  // prefill dequantizes tiles; the quantized GEMV row limit applies
      EXPECT_EQ(l.group, 0);
      EXPECT_EQ(l.groups_per_row, 0);
      EXPECT_EQ(l.scale_count(), 0u);
      EXPECT_EQ(l.pitch % kChunkBytes, 0u);
      EXPECT_GE(l.pitch, m.view.row_bytes);
      EXPECT_LT(l.pitch, m.view.row_bytes + kChunkBytes);
      EXPECT_EQ(matrix_layout(t, 0, rows, cols).pitch, l.pitch);  // group 0 means "the block"

      // Rows [r0, r0 + n) only, into a dirty buffer: the rows' bytes then zeros.
      const int64_t r0 = 2, n = 3;
      std::vector<uint8_t> data(size_t(n) * l.pitch, 0xAA);
      repack_rows(m.view, l, r0, n, data.data(), nullptr);
      std::vector<float> ref(static_cast<size_t>(cols));
      float got[32];
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = data.data() + size_t(i) * l.pitch;
        ASSERT_EQ(std::memcmp(row, m.view.data + size_t(r0 + i) * m.view.row_bytes, m.view.row_bytes), 0);
        for (size_t k = m.view.row_bytes; k < l.pitch; ++k) ASSERT_EQ(row[k], 0) << "padding byte " << k;
        cpu::dequantize_row(m.view, r0 + i, ref.data());
        for (int64_t u = 0; u < cols / 32; ++u) {
          decode_any(t, unit_block(t, row, u), unit_sub(t, u), got);
          for (int l2 = 0; l2 < 32; ++l2)
            ASSERT_EQ(bits(got[l2]), bits(ref[size_t(u * 32 + l2)])) << "row " << i << " value " << u * 32 + l2;
        }
      }
    }
  }
}

TEST(CudaGgmlLayout, RefusesRowsOfPartialBlocks) {
  struct Bad {
    DType t;
    uint32_t group;
    int64_t cols;
  };
  const Bad bad[] = {
      {DType::Q4_K, 256, 288},   {DType::Q6_K, 256, 128},  {DType::Q2_K, 256, 512 + 64}, {DType::Q3_K, 0, 100},
      {DType::Q5_K, 256, 32},    {DType::IQ4_XS, 256, 96}, {DType::Q5_0, 32, 48},      {DType::Q5_1, 32, 16},
      {DType::IQ4_NL, 32, 100},  {DType::Q4_K, 32, 256},   {DType::Q5_0, 256, 256},    {DType::Q4M, 32, 64},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(std::string(dtype_name(b.t)) + " group " + std::to_string(b.group) + " cols " +
                 std::to_string(b.cols));
    try {
      matrix_layout(b.t, b.group, 4, b.cols);
      ADD_FAILURE() << "expected LLM_ERR_UNSUPPORTED";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), LLM_ERR_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find(dtype_name(b.t)), std::string::npos) << e.what();
    }
  }
  // The existing formats keep their layouts.
  const MatrixLayout q4 = matrix_layout(DType::Q4, 64, 3, 192);
  EXPECT_EQ(q4.format, WFormat::Q4);
  EXPECT_EQ(q4.group, 64);
  EXPECT_EQ(q4.groups_per_row, 3);
  EXPECT_EQ(q4.pitch, 96u);
  const MatrixLayout q8 = matrix_layout(DType::Q8, 32, 3, 96);
  EXPECT_EQ(q8.format, WFormat::Q8);
  EXPECT_EQ(q8.pitch, 96u);
  EXPECT_EQ(matrix_layout(DType::F16, 0, 2, 172).pitch, 352u);

  const HostMatrix a = make_matrix(DType::Q4_K, 2, 256, 1), b = make_matrix(DType::Q4_K, 3, 256, 2);
  const HostMatrix c = make_matrix(DType::Q6_K, 2, 256, 3);
  EXPECT_TRUE(can_stack({&a.view, &b.view}));
  EXPECT_FALSE(can_stack({&a.view, &c.view}));
}

// ---------------------------------------------------------------- kernels, replayed

// gemv_ggml_kernel's split: 8 / wpr rows per block of 8 warps; the wpr warps
// of a row take sub-blocks sub * 32 + lane, stepping 32 * wpr; each lane
// accumulates in f32; passes of gemv_batch_tile activation rows, NB = 1 with
// the factored dot, NB > 1 decoding once and dotting each row. Every
// sub-block and every row is used exactly once, and the sums match
// matmul_ref of the dequantized rows.
TEST(CudaGgmlGemv, KernelWorkSplitMatchesMatmulRef) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (DType t : kTypes) {
    const int nv = ggml_values_of(t);
    const std::vector<int64_t> cols_cases =
        nv == 32 ? std::vector<int64_t>{160, 1088} : std::vector<int64_t>{256, 2304};
    for (int64_t cols : cols_cases) {
      for (int64_t rows : {1, 3, 40, 77}) {
        const HostMatrix m = make_matrix(t, rows, cols, uint32_t(rows * 7 + cols));
        const Packed p = pack(m);
        const std::vector<float> deq = dequant_rows(m);
        const int64_t units = cols / 32;
        for (int sms : {1, 2, 132}) {
          for (int64_t n : {1, 3, 8, 9}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " cols " + std::to_string(cols) + " rows " +
                         std::to_string(rows) + " sms " + std::to_string(sms) + " n " + std::to_string(n));
            std::vector<float> x(size_t(n * cols));
            for (float& v : x) v = ud(rng);
            std::vector<float> want(size_t(n * rows)), got(size_t(n * rows), -1.f);
            cpu::matmul_ref(m.view, x.data(), n, want.data());

            const int wpr = gemv_warps_per_row(rows, units, sms);
            ASSERT_TRUE(wpr == 1 || wpr == 2 || wpr == 4 || wpr == 8);
            const int rows_per_block = (kGemvThreads / 32) / wpr;
            const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
            std::vector<int> xrow_hits(size_t(n), 0);
            for (int64_t b0 = 0; b0 < n;) {
              const int tile = gemv_batch_tile(n - b0);
              ASSERT_TRUE(tile == 1 || tile == 2 || tile == 4 || tile == 8);
              const int nb = int(std::min<int64_t>(tile, n - b0));
              for (int b = 0; b < nb; ++b) ++xrow_hits[size_t(b0 + b)];
              std::vector<int> row_hits(size_t(rows), 0);
              for (int64_t blk = 0; blk < blocks; ++blk) {
                for (int warp = 0; warp < kGemvThreads / 32; ++warp) {
                  const int64_t row = blk * rows_per_block + warp / wpr;
                  if (row >= rows || warp % wpr != 0) continue;  // sub 0 writes the row
                  ++row_hits[size_t(row)];
                  const uint8_t* wrow = p.data.data() + size_t(row) * p.layout.pitch;
                  std::vector<int> unit_hits(size_t(units), 0);
                  std::vector<double> total(size_t(nb), 0.0);
                  for (int sub = 0; sub < wpr; ++sub)
                    for (int lane = 0; lane < 32; ++lane) {
                      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                      for (int64_t u = int64_t(sub) * 32 + lane; u < units; u += 32 * int64_t(wpr)) {
                        ++unit_hits[size_t(u)];
                        const uint8_t* bp = unit_block(t, wrow, u);
                        const int s = unit_sub(t, u);
                        if (tile == 1) {
                          acc[0] += dot_any(t, bp, s, x.data() + b0 * cols + u * 32);
                        } else {
                          float wv[32];
                          decode_any(t, bp, s, wv);
                          for (int b = 0; b < nb; ++b) acc[b] += dot32(wv, x.data() + (b0 + b) * cols + u * 32);
                        }
                      }
                      for (int b = 0; b < nb; ++b) total[size_t(b)] += acc[b];
                    }
                  for (int64_t u = 0; u < units; ++u) ASSERT_EQ(unit_hits[size_t(u)], 1) << "sub-block " << u;
                  for (int b = 0; b < nb; ++b) got[size_t((b0 + b) * rows + row)] = float(total[size_t(b)]);
                }
              }
              for (int h : row_hits) ASSERT_EQ(h, 1) << "every output row exactly once per pass";
              b0 += nb;
            }
            for (int h : xrow_hits) ASSERT_EQ(h, 1);
            for (int64_t b = 0; b < n; ++b)
              for (int64_t r = 0; r < rows; ++r) {
                double mag = 0;
                for (int64_t k = 0; k < cols; ++k)
                  mag += std::fabs(double(deq[size_t(r * cols + k)]) * x[size_t(b * cols + k)]);
                const size_t i = size_t(b * rows + r);
                ASSERT_NEAR(got[i], want[i], 1e-5 * mag + 1e-6) << "x row " << b << " out row " << r;
              }
          }
        }
      }
    }
  }
}

// dequant_ggml_kernel's grid-stride indexing (thread idx -> row i, sub-block
// u -> 16 f16/bf16 pairs at (i * units + u) * 16) writes every value of rows
// r0 .. r0 + n exactly once, as f16 / bf16 of the host decode.
TEST(CudaGgmlGemv, DequantIndexingGivesHalvesOfDequantizeRow) {
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t rows = 9, cols = ggml_values_of(t) == 32 ? 160 : 512, r0 = 3, n = 5;
    const HostMatrix m = make_matrix(t, rows, cols, 43);
    const Packed p = pack(m);
    const std::vector<float> deq = dequant_rows(m);
    const int64_t units = cols / 32;
    for (bool bf16 : {false, true}) {
      std::vector<uint32_t> out(size_t(n * cols / 2), 0xdeadbeefu);
      std::vector<int> hits(out.size(), 0);
      const int64_t total = n * units, threads = 256, grid = 1;  // grid-stride with one block: every idx still taken
      for (int64_t tid = 0; tid < threads * grid; ++tid)
        for (int64_t idx = tid; idx < total; idx += threads * grid) {
          const int64_t i = idx / units, u = idx % units;
          float v[32];
          decode_any(t, unit_block(t, p.data.data() + size_t(r0 + i) * p.layout.pitch, u), unit_sub(t, u), v);
          uint32_t* o = out.data() + (i * units + u) * 16;
          for (int k = 0; k < 32; k += 2) {
            const uint32_t lo = bf16 ? float_to_bf16_bits(v[k]) : float_to_f16_bits(v[k]);
            const uint32_t hi = bf16 ? float_to_bf16_bits(v[k + 1]) : float_to_f16_bits(v[k + 1]);
            o[k / 2] = lo | (hi << 16);
            ++hits[size_t(o - out.data()) + size_t(k / 2)];
          }
        }
      for (int h : hits) ASSERT_EQ(h, 1);
      for (int64_t k = 0; k < n * cols; ++k) {
        const float v = deq[size_t(r0 * cols + k)];
        const uint16_t want = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
        ASSERT_EQ(uint16_t(out[size_t(k / 2)] >> (16 * (k % 2))), want) << k;
      }
    }
  }
}

}  // namespace
