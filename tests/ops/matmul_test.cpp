// CPU matmul: layouts of dequantize_row, matmul_ref against an independent
// double-precision oracle, and every kernel path (each kernel family the CPU
// has: scalar / AVX2 / AVX-512; Fast / Reference, 1 / 2 threads) against
// matmul_ref over awkward shapes; the ISA cap (set_max_isa, LLM_CPU_ISA).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "quant/quant.h"
#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace llm::cpu {
namespace {

struct Config {
  DType dtype;
  uint32_t group;
  const char* name;
  bool x8 = false;  // the view is the X8 repack of the rows (repack_x8)
};

// A weight matrix: its stored bytes plus the exact values those bytes mean,
// computed here from the format definition (dtype.h), not by the library.
struct Weights {
  Config cfg;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> packed;  // the X8 repack of bytes, when cfg.x8
  std::vector<double> values;  // [rows, cols]
  WeightView rows_view() const {
    WeightView w;
    w.dtype = cfg.dtype;
    w.group = cfg.group;
    w.rows = rows;
    w.cols = cols;
    w.data = bytes.data();
    w.row_bytes = dtype_row_bytes(cfg.dtype, cols, cfg.group);
    return w;
  }
  WeightView view() const {
    WeightView w = rows_view();
    if (cfg.x8 && x8_eligible(w)) {
      w.data = packed.data();
      w.layout = WeightLayout::X8;
    }
    return w;
  }
};

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Random weights stored as cfg.dtype through a tiny local quantizer (absmax
// scales). Q8 rows also get a few -128 bytes: legal in GGUF Q8_0 files even
// though absmax quantizers never write them.
Weights make_weights(Config cfg, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Weights w;
  w.cfg = cfg;
  w.rows = rows;
  w.cols = cols;
  const size_t rb = dtype_row_bytes(cfg.dtype, cols, cfg.group);
  w.bytes.assign(rb * size_t(rows), 0);
  w.values.assign(size_t(rows * cols), 0.0);
  std::vector<float> src(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    // Rows of different magnitude so the per-row scales differ.
    const float row_scale = 0.02f * float(1 + r % 5);
    for (auto& v : src) v = nd(rng) * row_scale;
    uint8_t* out = w.bytes.data() + size_t(r) * rb;
    double* val = w.values.data() + r * cols;
    switch (cfg.dtype) {
      case DType::F32:
        std::memcpy(out, src.data(), size_t(cols) * 4);
        for (int64_t k = 0; k < cols; ++k) val[k] = src[size_t(k)];
        break;
      case DType::F16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = f32_to_f16(src[size_t(k)]);
          put_u16(out + 2 * k, h);
          val[k] = f16_to_f32(h);
        }
        break;
      case DType::BF16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = f32_to_bf16(src[size_t(k)]);
          put_u16(out + 2 * k, h);
          val[k] = bf16_to_f32(h);
        }
        break;
      case DType::Q8:
        for (int64_t b = 0; b < cols / 32; ++b) {
          float amax = 0.0f;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[size_t(b * 32 + j)]));
          const uint16_t dh = f32_to_f16(amax / 127.0f);
          const float d = f16_to_f32(dh);
          uint8_t* blk = out + b * 34;
          put_u16(blk, dh);
          for (int j = 0; j < 32; ++j) {
            int q = d > 0 ? int(std::lround(src[size_t(b * 32 + j)] / d)) : 0;
            q = std::clamp(q, -127, 127);
            if (rng() % 61 == 0) q = -128;
            blk[2 + j] = uint8_t(int8_t(q));
            val[b * 32 + j] = double(d) * q;
          }
        }
        break;
      case DType::Q4: {
        const int64_t g = cfg.group, half = g / 2;
        for (int64_t b = 0; b < cols / g; ++b) {
          float amax = 0.0f;
          for (int64_t j = 0; j < g; ++j) amax = std::max(amax, std::fabs(src[size_t(b * g + j)]));
          const uint16_t dh = f32_to_f16(amax / 7.0f);
          const float d = f16_to_f32(dh);
          uint8_t* blk = out + b * (2 + half);
          put_u16(blk, dh);
          for (int64_t j = 0; j < g; ++j) {
            int q = d > 0 ? int(std::lround(src[size_t(b * g + j)] / d)) + 8 : 8;
            q = std::clamp(q, 0, 15);
            // value j: low nibble of byte j; value j + g/2: high nibble of byte j.
            uint8_t& byte = blk[2 + (j < half ? j : j - half)];
            byte = uint8_t(j < half ? (byte & 0xf0) | q : (byte & 0x0f) | (q << 4));
            val[b * g + j] = double(d) * (q - 8);
          }
        }
        break;
      }
      case DType::Q4M: {
        // The library's own fitted quantizer; the oracle values come from
        // the stored bytes (d * nibble + m in double).
        const int64_t g = cfg.group, half = g / 2;
        quantize_row(DType::Q4M, uint32_t(g), src.data(), out, cols);
        for (int64_t b = 0; b < cols / g; ++b) {
          const uint8_t* blk = out + b * (4 + half);
          uint16_t dh, mh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&mh, blk + 2, 2);
          for (int64_t j = 0; j < g; ++j) {
            const uint8_t byte = blk[4 + (j < half ? j : j - half)];
            const int q = j < half ? (byte & 0x0f) : (byte >> 4);
            val[b * g + j] = double(f16_to_f32(dh)) * q + double(f16_to_f32(mh));
          }
        }
        break;
      }
      default:  // the GGUF block types have their own test (gguf_matmul_test.cpp)
        ADD_FAILURE() << "make_weights: " << dtype_name(cfg.dtype);
        break;
    }
  }
  if (cfg.x8 && x8_eligible(w.rows_view())) {
    w.packed.assign(w.bytes.size(), 0);
    const WeightView v = repack_x8(w.rows_view(), w.packed.data());
    EXPECT_EQ(v.layout, WeightLayout::X8);
    EXPECT_EQ(v.data, w.packed.data());
  }
  return w;
}

std::vector<float> make_x(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n * cols));
  for (auto& v : x) v = nd(rng);
  // Odd rows get an all-zero block (d == 0) and a large outlier (a wide
  // block range, like real activations). Even rows stay plain Gaussian: the
  // NMSE checks use only those.
  for (int64_t i = 1; i < n && cols >= 64; i += 2) {
    float* xi = x.data() + i * cols;
    std::fill(xi + 32, xi + 64, 0.0f);
    xi[0] = 40.0f;
  }
  return x;
}

// ---------------------------------------------------------------------------
// Layouts, spelled out by hand from dtype.h.

TEST(Dequantize, Q8BlockLayout) {
  uint8_t row[68];
  put_u16(row, f32_to_f16(0.5f));
  put_u16(row + 34, f32_to_f16(-2.0f));
  for (int j = 0; j < 32; ++j) {
    row[2 + j] = uint8_t(int8_t(j - 16));
    row[36 + j] = uint8_t(int8_t(j == 0 ? -128 : 127 - j));
  }
  WeightView w{DType::Q8, 32, 1, 64, row, 68};
  float out[64];
  dequantize_row(w, 0, out);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], 0.5f * float(j - 16)) << j;
    EXPECT_EQ(out[32 + j], -2.0f * float(j == 0 ? -128 : 127 - j)) << j;
  }
}

TEST(Dequantize, Q4GroupLayouts) {
  for (uint32_t g : {32u, 64u, 128u}) {
    SCOPED_TRACE(g);
    const int half = int(g / 2);
    std::vector<uint8_t> row(2 + g / 2);
    put_u16(row.data(), f32_to_f16(0.25f));
    // byte j: low nibble j % 16, high nibble 15 - j % 16
    for (int j = 0; j < half; ++j) row[size_t(2 + j)] = uint8_t((j % 16) | ((15 - j % 16) << 4));
    WeightView w{DType::Q4, g, 1, int64_t(g), row.data(), row.size()};
    std::vector<float> out(g);
    dequantize_row(w, 0, out.data());
    for (int j = 0; j < half; ++j) {
      EXPECT_EQ(out[size_t(j)], 0.25f * float(j % 16 - 8)) << j;
      EXPECT_EQ(out[size_t(j + half)], 0.25f * float(7 - j % 16)) << j;
    }
  }
}

TEST(Dequantize, HalfTypes) {
  uint8_t f16[6], bf16[6];
  const float vals[3] = {1.5f, -0.0078125f, 65504.0f};
  for (int i = 0; i < 3; ++i) {
    put_u16(f16 + 2 * i, f32_to_f16(vals[i]));
    put_u16(bf16 + 2 * i, f32_to_bf16(vals[i]));
  }
  float out[3];
  dequantize_row(WeightView{DType::F16, 0, 1, 3, f16, 6}, 0, out);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], vals[i]);
  dequantize_row(WeightView{DType::BF16, 0, 1, 3, bf16, 6}, 0, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -0.0078125f);
  EXPECT_EQ(out[2], 65536.0f);  // bf16 keeps 8 mantissa bits: 65504 rounds up
}

// repack_x8 permutes bytes: every row reads back as the same values,
// groups and plain tail rows alike, and the inputs it cannot take are refused.
TEST(Dequantize, X8KeepsEveryRow) {
  for (const Config cfg : {Config{DType::Q4, 32, "q4x8", true}, Config{DType::Q8, 32, "q8x8", true}}) {
    for (int64_t rows : {8, 16, 21}) {
      const Weights w = make_weights(cfg, rows, 96, 3);
      const WeightView plain = w.rows_view(), packed = w.view();
      ASSERT_EQ(packed.layout, WeightLayout::X8);
      ASSERT_NE(0, std::memcmp(w.bytes.data(), w.packed.data(), size_t(8) * plain.row_bytes));
      std::vector<float> a(96), b(96);
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(plain, r, a.data());
        dequantize_row(packed, r, b.data());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << cfg.name << " rows=" << rows << " r=" << r;
      }
    }
  }
  const Weights f16 = make_weights({DType::F16, 0, "f16"}, 8, 64, 4);
  const Weights g64 = make_weights({DType::Q4, 64, "q4g64"}, 8, 64, 5);
  const Weights few = make_weights({DType::Q4, 32, "q4g32"}, 7, 64, 6);
  std::vector<uint8_t> dst(4096);
  for (const Weights* w : {&f16, &g64, &few}) {
    EXPECT_FALSE(x8_eligible(w->rows_view()));
    EXPECT_THROW(repack_x8(w->rows_view(), dst.data()), Error);
  }
  // An X8 view of another dtype is refused by matmul.
  WeightView bad = g64.rows_view();
  bad.layout = WeightLayout::X8;
  std::vector<float> x(64, 1.0f), y(8);
  EXPECT_THROW(matmul(bad, x.data(), 1, y.data(), nullptr), Error);
}

TEST(Matmul, RejectsInvalidViews) {
  std::vector<uint8_t> bytes(1024);
  float x[64] = {}, y[4];
  WeightView w{DType::Q4, 48, 1, 96, bytes.data(), 0};  // unsupported group
  EXPECT_THROW(matmul(w, x, 1, y, nullptr), Error);
  w = WeightView{DType::Q8, 32, 1, 40, bytes.data(), 40};  // cols not a multiple of 32
  EXPECT_THROW(matmul(w, x, 1, y, nullptr), Error);
  w = WeightView{DType::F16, 0, 2, 16, bytes.data(), 16};  // row_bytes != 32
  EXPECT_THROW(matmul_ref(w, x, 1, y), Error);
  w = WeightView{DType::F32, 0, 2, 16, nullptr, 64};
  try {
    matmul(w, x, 1, y, nullptr);
    FAIL() << "null data accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_INVALID_ARGUMENT);
  }
}

TEST(Matmul, ZeroColsGivesZeros) {
  float y[6] = {1, 2, 3, 4, 5, 6};
  WeightView w{DType::F32, 0, 3, 0, nullptr, 0};
  matmul(w, nullptr, 2, y, nullptr);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// ---------------------------------------------------------------------------
// matmul_ref against a double-precision dot of the exact weight values.

TEST(MatmulRef, MatchesDoubleOracle) {
  const Config cfgs[] = {{DType::F32, 0, "f32"}, {DType::F16, 0, "f16"}, {DType::BF16, 0, "bf16"},
                         {DType::Q8, 32, "q8"},  {DType::Q4, 32, "q4g32"}, {DType::Q4, 128, "q4g128"},
                         {DType::Q4M, 32, "q4mg32"}, {DType::Q4M, 64, "q4mg64"}};
  for (const Config& cfg : cfgs) {
    SCOPED_TRACE(cfg.name);
    const int64_t rows = 9, cols = 256, n = 3;
    const Weights w = make_weights(cfg, rows, cols, 7);
    const std::vector<float> x = make_x(n, cols, 8);
    std::vector<float> y(size_t(n * rows));
    matmul_ref(w.view(), x.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        double dot = 0, l1 = 0;
        for (int64_t k = 0; k < cols; ++k) {
          dot += w.values[size_t(r * cols + k)] * x[size_t(i * cols + k)];
          l1 += std::fabs(w.values[size_t(r * cols + k)] * x[size_t(i * cols + k)]);
        }
        EXPECT_NEAR(y[size_t(i * rows + r)], dot, 1e-6 * l1) << "i=" << i << " r=" << r;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The sweep: every path against matmul_ref.

// Per output: l1 = sum |w x| (scale of float rounding error) and qbound = the
// most activation quantization can move the result: each x value is off by at
// most half its block's step amax/127.
struct Bounds {
  std::vector<double> l1, qbound;
};

Bounds make_bounds(const Weights& w, const std::vector<float>& x, int64_t n) {
  Bounds b;
  b.l1.assign(size_t(n * w.rows), 0.0);
  b.qbound.assign(size_t(n * w.rows), 0.0);
  const int64_t cols = w.cols;
  std::vector<double> half_step(static_cast<size_t>(cols));
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x.data() + i * cols;
    for (int64_t k0 = 0; k0 < cols; k0 += 32) {
      double amax = 0;
      for (int64_t k = k0; k < std::min(cols, k0 + 32); ++k) amax = std::max(amax, double(std::fabs(xi[k])));
      for (int64_t k = k0; k < std::min(cols, k0 + 32); ++k) half_step[size_t(k)] = 0.5001 * amax / 127.0;
    }
    for (int64_t r = 0; r < w.rows; ++r) {
      double l1 = 0, qb = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double wv = std::fabs(w.values[size_t(r * cols + k)]);
        l1 += wv * std::fabs(xi[k]);
        qb += wv * half_step[size_t(k)];
      }
      b.l1[size_t(i * w.rows + r)] = l1;
      b.qbound[size_t(i * w.rows + r)] = qb;
    }
  }
  return b;
}

class ScalarGuard {
 public:
  explicit ScalarGuard(bool force) { set_force_scalar(force); }
  ~ScalarGuard() { set_force_scalar(false); }
};

// Caps the kernel family for the scope, restoring the previous cap.
class IsaGuard {
 public:
  explicit IsaGuard(Isa isa) : saved_(max_isa()) { set_max_isa(isa); }
  ~IsaGuard() { set_max_isa(saved_); }

 private:
  Isa saved_;
};

// Every kernel family this build can run here, lowest first.
std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (isa <= best_isa()) out.push_back(isa);
  return out;
}

struct SweepStats {
  double err2 = 0, ref2 = 0;  // Fast mode, summed over all shapes
  int shapes = 0;
};

void run_sweep_isa(const Config& cfg, const std::vector<int64_t>& col_list) {
  ThreadPool pool(2);
  const bool quantized = dtype_is_quantized(cfg.dtype);
  // Fast mode rounds activations only for quantized weights; otherwise it is
  // f32 accumulation like the reference.
  const double ref_tol = 1e-5;
  SweepStats stats;
  uint32_t seed = 1;
  for (int64_t n : {1, 2, 5, 17, 64}) {
    for (int64_t rows : {1, 3, 37, 257}) {
      for (int64_t cols : col_list) {
        if (n * rows * cols > (int64_t(3) << 20)) continue;  // keep the suite fast
        SCOPED_TRACE(std::string(cfg.name) + " n=" + std::to_string(n) +
                     " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols));
        const Weights w = make_weights(cfg, rows, cols, ++seed);
        const std::vector<float> x = make_x(n, cols, ++seed);
        const WeightView wv = w.view();
        const Bounds bnd = make_bounds(w, x, n);
        const size_t ny = size_t(n * rows);
        std::vector<float> ref(ny);
        matmul_ref(wv, x.data(), n, ref.data());
        ++stats.shapes;

        std::vector<float> fast1(ny, NAN), fast2(ny, NAN), exact1(ny, NAN), exact2(ny, NAN),
            fast_scalar(ny, NAN), exact_scalar(ny, NAN);
        matmul(wv, x.data(), n, fast1.data(), nullptr, MatmulMode::Fast);
        matmul(wv, x.data(), n, fast2.data(), &pool, MatmulMode::Fast);
        matmul(wv, x.data(), n, exact1.data(), nullptr, MatmulMode::Reference);
        matmul(wv, x.data(), n, exact2.data(), &pool, MatmulMode::Reference);
        {
          ScalarGuard guard(true);
          matmul(wv, x.data(), n, fast_scalar.data(), &pool, MatmulMode::Fast);
          matmul(wv, x.data(), n, exact_scalar.data(), nullptr, MatmulMode::Reference);
        }

        double err2 = 0, ref2 = 0;
        int bad = 0;
        for (size_t j = 0; j < ny && bad < 5; ++j) {
          const double tol_exact = ref_tol * bnd.l1[j] + 1e-30;
          const double tol_fast = (quantized ? bnd.qbound[j] : 0.0) + tol_exact;
          const double e_fast = std::fabs(double(fast1[j]) - ref[j]);
          if ((int64_t(j) / rows) % 2 == 0) {  // plain activation rows only
            err2 += e_fast * e_fast;
            ref2 += double(ref[j]) * ref[j];
          }
          bool ok = true;
          ok &= std::fabs(double(exact1[j]) - ref[j]) <= tol_exact;
          ok &= std::fabs(double(exact_scalar[j]) - ref[j]) <= tol_exact;
          ok &= e_fast <= tol_fast;
          // Same quantized activations and exact integer dots: the paths only
          // differ in float summation order (X8 rows in a group: not even
          // that; its plain tail rows take the kernels of plain rows).
          ok &= std::fabs(double(fast_scalar[j]) - fast1[j]) <= tol_exact;
          if (wv.layout == WeightLayout::X8 && int64_t(j) % rows < rows / 8 * 8)
            ok &= std::memcmp(&fast_scalar[j], &fast1[j], 4) == 0;
          if (!ok) {
            ++bad;
            ADD_FAILURE() << "j=" << j << " ref=" << ref[j] << " reference=" << exact1[j]
                          << " reference_scalar=" << exact_scalar[j] << " fast=" << fast1[j]
                          << " fast_scalar=" << fast_scalar[j] << " l1=" << bnd.l1[j]
                          << " qbound=" << bnd.qbound[j];
          }
        }
        // Batch invariance: an output depends neither on the thread count nor
        // on how many x rows are computed together (first and last row alone).
        EXPECT_EQ(0, std::memcmp(fast1.data(), fast2.data(), ny * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(exact1.data(), exact2.data(), ny * sizeof(float)));
        for (int64_t i : {int64_t(0), n - 1}) {
          std::vector<float> one(static_cast<size_t>(rows));
          matmul(wv, x.data() + i * cols, 1, one.data(), &pool, MatmulMode::Fast);
          EXPECT_EQ(0, std::memcmp(one.data(), fast1.data() + i * rows, size_t(rows) * 4)) << i;
          matmul(wv, x.data() + i * cols, 1, one.data(), nullptr, MatmulMode::Reference);
          EXPECT_EQ(0, std::memcmp(one.data(), exact1.data() + i * rows, size_t(rows) * 4)) << i;
        }
        if (rows >= 37 && ref2 > 0) {
          EXPECT_LT(err2 / ref2, 1e-4);
        }
        stats.err2 += err2;
        stats.ref2 += ref2;
      }
    }
  }
  EXPECT_GT(stats.shapes, 40);
  const double nmse = stats.err2 / stats.ref2;
  EXPECT_LT(nmse, quantized ? 1e-4 : 1e-10);
  if (quantized) {
    EXPECT_GT(nmse, 1e-8);  // activations really were quantized
  }
  ::testing::Test::RecordProperty("fast_nmse", std::to_string(nmse));
}

// The sweep once per kernel family available (each must be batch invariant
// with itself and close to matmul_ref).
void run_sweep(const Config& cfg, const std::vector<int64_t>& col_list) {
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(isa_name(isa));
    IsaGuard guard(isa);
    ASSERT_EQ(active_isa(), isa);
    run_sweep_isa(cfg, col_list);
  }
}

TEST(MatmulSweep, F32) { run_sweep({DType::F32, 0, "f32"}, {1, 7, 32, 172, 1000, 4096}); }
TEST(MatmulSweep, F16) { run_sweep({DType::F16, 0, "f16"}, {7, 32, 172, 1000, 4096}); }
TEST(MatmulSweep, BF16) { run_sweep({DType::BF16, 0, "bf16"}, {32, 172, 1000, 4096}); }
TEST(MatmulSweep, Q8) { run_sweep({DType::Q8, 32, "q8"}, {32, 96, 1056, 4096}); }
TEST(MatmulSweep, Q4G32) { run_sweep({DType::Q4, 32, "q4g32"}, {32, 96, 1056, 4096}); }
// The X8 layout: row counts with and without a tail of plain rows (1 and 3
// rows stay plain; 37 = 4 groups + 5; 257 = 32 groups + 1), every family
// (each has X8 kernels, whatever layout the load would choose for it).
TEST(MatmulSweep, Q4G32Interleaved) { run_sweep({DType::Q4, 32, "q4x8", true}, {32, 96, 1056, 4096}); }
TEST(MatmulSweep, Q8Interleaved) { run_sweep({DType::Q8, 32, "q8x8", true}, {32, 96, 1056, 4096}); }
TEST(MatmulSweep, Q4G64) { run_sweep({DType::Q4, 64, "q4g64"}, {64, 192, 1088, 4096}); }
TEST(MatmulSweep, Q4G128) { run_sweep({DType::Q4, 128, "q4g128"}, {128, 384, 1152, 4096}); }
TEST(MatmulSweep, Q4MG32) { run_sweep({DType::Q4M, 32, "q4mg32"}, {32, 96, 1056, 4096}); }
TEST(MatmulSweep, Q4MG64) { run_sweep({DType::Q4M, 64, "q4mg64"}, {64, 192, 1088, 4096}); }
TEST(MatmulSweep, Q4MG128) { run_sweep({DType::Q4M, 128, "q4mg128"}, {128, 384, 1152, 4096}); }

// ---------------------------------------------------------------------------
// The activation quantizer: AVX2 and scalar agree bit for bit, and q/d
// reconstruct x to half a step.

// An X8 prefill long enough that x's tiles are packed on the pool's
// threads (>= 64 tiles): every output the same bits with one thread, with
// two, and row by row; every family.
TEST(MatmulX8, LongPrefillOnThePool) {
  const int64_t n = 8 * 64 + 13, rows = 27, cols = 96;
  const std::vector<float> x = make_x(n, cols, 22);
  ThreadPool pool(2);
  for (const Config cfg : {Config{DType::Q4, 32, "q4x8", true}, Config{DType::Q8, 32, "q8x8", true}})
  for (Isa isa : available_isas()) {
    SCOPED_TRACE(std::string(cfg.name) + " " + isa_name(isa));
    const Weights w = make_weights(cfg, rows, cols, 21);
    IsaGuard guard(isa);
    std::vector<float> one(size_t(n * rows), NAN), two(size_t(n * rows), NAN);
    std::vector<float> row(static_cast<size_t>(rows));
    matmul(w.view(), x.data(), n, one.data(), nullptr);
    matmul(w.view(), x.data(), n, two.data(), &pool);
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * 4));
    for (int64_t i : {int64_t(0), int64_t(7), int64_t(8 * 64 - 1), n - 1}) {
      matmul(w.view(), x.data() + i * cols, 1, row.data(), &pool);
      EXPECT_EQ(0, std::memcmp(row.data(), one.data() + i * rows, size_t(rows) * 4)) << "x row " << i;
    }
    std::vector<float> ref(size_t(n * rows));
    matmul_ref(w.rows_view(), x.data(), n, ref.data());
    const Bounds bnd = make_bounds(w, x, n);
    for (size_t j = 0; j < ref.size(); ++j)
      ASSERT_LE(std::fabs(double(two[j]) - ref[j]), bnd.qbound[j] + 1e-5 * bnd.l1[j] + 1e-30) << j;
  }
}

TEST(QuantizeX, ScalarAndSimdAgree) {
  const int64_t n = 3, cols = 256;
  std::vector<float> x = make_x(n, cols, 99);
  x[cols + 70] = 0.5f * (40.0f / 127.0f);  // half a step of row 1's outlier block scale
  std::vector<int8_t> qs(size_t(n * cols)), qv(size_t(n * cols));
  std::vector<float> ds(size_t(n * cols / 32)), dv(size_t(n * cols / 32));
  std::vector<float> ss(size_t(n * cols / 32)), sv(size_t(n * cols / 32));
  kern::quantize_x_scalar(x.data(), n, cols, qs.data(), ds.data(), ss.data());
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += qs[size_t(b * 32 + j)];
    EXPECT_EQ(ss[size_t(b)], float(sum)) << b;
  }
  for (int64_t i = 0; i < n * cols; ++i) {
    const float d = ds[size_t(i / 32)];
    EXPECT_LE(std::fabs(x[size_t(i)] - d * qs[size_t(i)]), 0.5001f * d + 1e-30f) << i;
    EXPECT_LE(std::abs(int(qs[size_t(i)])), 127);
  }
  EXPECT_EQ(ds[cols / 32 + 1], 0.0f);  // row 1's all-zero block
#if defined(__x86_64__) || defined(_M_X64)
  if (!use_avx2_kernels()) GTEST_SKIP() << "no AVX2/FMA/F16C on this CPU";
  kern::quantize_x_avx2(x.data(), n, cols, qv.data(), dv.data(), sv.data(), false);
  EXPECT_EQ(qs, qv);
  EXPECT_EQ(ds, dv);
  EXPECT_EQ(ss, sv);
  // Pair layout: blocks 2k, 2k+1 as [2k lo half][2k+1 lo half][2k hi half][2k+1 hi half].
  const int64_t cols_odd = 96;  // 3 blocks: one pair and a plain last block
  std::vector<int8_t> qp(static_cast<size_t>(cols_odd)), qn(static_cast<size_t>(cols_odd));
  float dd[3], sd[3];
  kern::quantize_x_avx2(x.data(), 1, cols_odd, qn.data(), dd, sd, false);
  kern::quantize_x_avx2(x.data(), 1, cols_odd, qp.data(), dd, sd, true);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(qp[size_t(j)], qn[size_t(j)]);
    EXPECT_EQ(qp[size_t(16 + j)], qn[size_t(32 + j)]);
    EXPECT_EQ(qp[size_t(32 + j)], qn[size_t(16 + j)]);
    EXPECT_EQ(qp[size_t(48 + j)], qn[size_t(48 + j)]);
  }
  for (int j = 64; j < 96; ++j) EXPECT_EQ(qp[size_t(j)], qn[size_t(j)]);
#endif
}

// The AVX-512 quad layout (gemm_kernels.h) holds exactly the scalar
// quantizer's q and d, and the offset corrections of both weight encodings.
TEST(QuantizeX, Avx512QuadLayout) {
  if (best_isa() < Isa::Avx512) GTEST_SKIP() << "no AVX-512 kernels on this CPU/build";
#if defined(__x86_64__) || defined(_M_X64)
  const int64_t n = 2, cols = 224;  // 7 blocks: one full quad and one of 3
  std::vector<float> x = make_x(n, cols, 123);
  std::vector<int8_t> qs(size_t(n * cols));
  std::vector<float> ds(size_t(n * cols / 32)), ss(size_t(n * cols / 32));
  kern::quantize_x_scalar(x.data(), n, cols, qs.data(), ds.data(), ss.data());
  const int64_t nq = kern::quad_count(cols), nb = cols / 32;
  ASSERT_EQ(nq, 2);
  for (bool q8 : {false, true}) {
    SCOPED_TRACE(q8 ? "q8" : "q4");
    std::vector<uint8_t> quads(size_t(n * nq * kern::kQuadBytes), 0xcd);
    kern::quantize_x_avx512(x.data(), n, cols, quads.data(), q8);
    const int k = q8 ? 128 : 8;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t q = 0; q < nq; ++q) {
        const uint8_t* o = quads.data() + (i * nq + q) * kern::kQuadBytes;
        int32_t corr[16];
        float d[16];
        std::memcpy(corr, o + 128, sizeof(corr));
        std::memcpy(d, o + 192, sizeof(d));
        for (int j = 0; j < 4; ++j) {
          const int64_t b = 4 * q + j;
          for (int t = 0; t < 16; ++t) {
            const int8_t lo = int8_t(o[16 * j + t]), hi = int8_t(o[64 + 16 * j + t]);
            EXPECT_EQ(lo, b < nb ? qs[size_t(i * cols + b * 32 + t)] : 0) << i << " " << b << " " << t;
            EXPECT_EQ(hi, b < nb ? qs[size_t(i * cols + b * 32 + 16 + t)] : 0) << i << " " << b << " " << t;
          }
          for (int l = 0; l < 4; ++l) {
            // int32 lane 4j + l meets values 4l..4l+3 and 16+4l..16+4l+3 of block j.
            int32_t sum = 0;
            for (int t = 0; t < 4; ++t) {
              if (b < nb) {
                sum += qs[size_t(i * cols + b * 32 + 4 * l + t)];
                sum += qs[size_t(i * cols + b * 32 + 16 + 4 * l + t)];
              }
            }
            EXPECT_EQ(corr[4 * j + l], -k * sum);
            EXPECT_EQ(d[4 * j + l], b < nb ? ds[size_t(i * nb + b)] : 0.0f);
          }
        }
      }
    }
  }
#endif
}

TEST(CpuFeatures, ForceScalarToggles) {
  IsaGuard uncapped(Isa::Avx512);
  const bool native = use_avx2_kernels();
  const bool native512 = use_avx512_kernels();
  set_force_scalar(true);
  EXPECT_FALSE(use_avx2_kernels());
  EXPECT_FALSE(use_avx512_kernels());
  EXPECT_EQ(active_isa(), Isa::Scalar);
  EXPECT_TRUE(force_scalar());
  set_force_scalar(false);
  EXPECT_EQ(use_avx2_kernels(), native);
  EXPECT_EQ(use_avx512_kernels(), native512);
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(native, f.avx2 && f.fma && f.f16c);
  if (native512) {
    EXPECT_TRUE(native);
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni);
  }
}

TEST(CpuFeatures, ParseIsa) {
  Isa isa = Isa::Avx2;
  EXPECT_TRUE(parse_isa("scalar", &isa));
  EXPECT_EQ(isa, Isa::Scalar);
  EXPECT_TRUE(parse_isa("AVX512", &isa));
  EXPECT_EQ(isa, Isa::Avx512);
  EXPECT_TRUE(parse_isa("Avx2", &isa));
  EXPECT_EQ(isa, Isa::Avx2);
  for (const char* bad : {"", "avx", "avx2 ", "avx5120", "sse", "avx-512"}) {
    EXPECT_FALSE(parse_isa(bad, &isa)) << bad;
    EXPECT_EQ(isa, Isa::Avx2) << "left unchanged on failure";
  }
  EXPECT_FALSE(parse_isa(nullptr, &isa));
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    Isa back;
    ASSERT_TRUE(parse_isa(isa_name(i), &back));
    EXPECT_EQ(back, i);
  }
}

TEST(CpuFeatures, CapIsRespected) {
  const Isa best = best_isa();
  for (Isa cap : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    SCOPED_TRACE(isa_name(cap));
    IsaGuard guard(cap);
    EXPECT_EQ(max_isa(), cap);
    const Isa want = std::min(cap, best);
    EXPECT_EQ(active_isa(), want);
    EXPECT_EQ(use_avx512_kernels(), want == Isa::Avx512);
    EXPECT_EQ(use_avx2_kernels(), want >= Isa::Avx2);
  }
  // Under a cap, a matmul gives exactly what that family gives.
  const Weights w = make_weights({DType::Q4, 32, "q4g32"}, 9, 256, 5);
  const std::vector<float> x = make_x(3, 256, 6);
  for (Isa cap : available_isas()) {
    SCOPED_TRACE(isa_name(cap));
    std::vector<float> a(27), b(27);
    {
      IsaGuard guard(cap);
      matmul(w.view(), x.data(), 3, a.data(), nullptr, MatmulMode::Fast);
    }
    {
      IsaGuard guard(cap);
      matmul(w.view(), x.data(), 3, b.data(), nullptr, MatmulMode::Fast);
    }
    EXPECT_EQ(a, b);
  }
}

// LLM_CPU_ISA is read once, at first detection: checked in child processes
// (this binary again, filtered to this test) that start with it set; a child
// knows it is one by LLM_CPU_ISA_EXPECT.
void env_child(const char* expect) {
  Isa want;
  ASSERT_TRUE(parse_isa(expect, &want));
  EXPECT_EQ(max_isa(), want);
  EXPECT_EQ(active_isa(), std::min(want, best_isa()));
  set_max_isa(Isa::Scalar);  // the API overrides the variable
  EXPECT_EQ(active_isa(), Isa::Scalar);
}

TEST(CpuFeatures, EnvVariable) {
  if (const char* expect = std::getenv("LLM_CPU_ISA_EXPECT")) {
    env_child(expect);
    return;
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) GTEST_SKIP() << "no /proc/self/exe";
  self[len] = '\0';
  struct Case {
    const char* value;
    const char* expect;
  };
  for (const Case& c : {Case{"scalar", "scalar"}, Case{"avx2", "avx2"}, Case{"AVX512", "avx512"},
                        Case{"bogus", "avx512"}, Case{"", "avx512"}}) {
    SCOPED_TRACE(c.value);
    const std::string cmd = std::string("LLM_CPU_ISA='") + c.value + "' LLM_CPU_ISA_EXPECT=" +
                            c.expect + " '" + self +
                            "' --gtest_filter=CpuFeatures.EnvVariable >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

}  // namespace
}  // namespace llm::cpu
