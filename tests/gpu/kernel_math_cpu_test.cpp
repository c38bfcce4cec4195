// CPU tests of the CUDA kernels' per-element work and index math
// (src/backend/cuda/kernel_math.h, weight_layout.h): the functions the
// kernels call are called here on the CPU and compared with the CPU
// backend's reference ops. Where a kernel's work split matters (GEMV lanes,
// attention tiles and splits, top-k stages, in-place KV shift) the test
// replays the kernel's loop structure sequentially with the same helpers.
// Not labelled cuda: runs everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kernel_math.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/weight_layout.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/kv_cache.h"
#include "quant/quant.h"

namespace {

using namespace llm;
using namespace llm::cuda;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A stored matrix of random N(0, 0.5) weights in dtype t.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  cpu::WeightView view;
};

HostMatrix make_matrix(DType t, uint32_t group, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  HostMatrix m;
  m.view.dtype = t;
  m.view.group = group;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.row_bytes = dtype_row_bytes(t, cols, group);
  m.bytes.resize(m.view.row_bytes * size_t(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = nd(rng);
    quantize_row(t, group, row.data(), m.bytes.data() + size_t(r) * m.view.row_bytes, cols);
  }
  m.view.data = m.bytes.data();
  return m;
}

struct Packed {
  MatrixLayout layout;
  std::vector<uint8_t> data;
  std::vector<uint16_t> scales;
};

Packed pack(const HostMatrix& m) {
  Packed p;
  p.layout = matrix_layout(m.view.dtype, m.view.group, m.view.rows, m.view.cols);
  p.data.resize(p.layout.data_bytes());
  p.scales.resize(std::max<size_t>(p.layout.scale_count(), 1));
  repack_rows(m.view, p.layout, 0, m.view.rows, p.data.data(), p.scales.data());
  return p;
}

Chunk chunk_at(const Packed& p, int64_t r, int64_t c) {
  Chunk ch;
  std::memcpy(ch.w, p.data.data() + size_t(r) * p.layout.pitch + size_t(c) * kChunkBytes, kChunkBytes);
  return ch;
}

float chunk_scale(const Packed& p, int64_t r, int64_t c) {
  if (!is_quantized(p.layout.format)) return 1.f;
  const int64_t first = c * chunk_values(p.layout.format);
  return f16_bits_to_float(p.scales[size_t(r * p.layout.groups_per_row + chunk_group(first, p.layout.group))]);
}

void decode_any(WFormat f, const Chunk& c, float scale, float* out) {
  switch (f) {
    case WFormat::F32: decode_chunk<WFormat::F32>(c, scale, out); break;
    case WFormat::F16: decode_chunk<WFormat::F16>(c, scale, out); break;
    case WFormat::BF16: decode_chunk<WFormat::BF16>(c, scale, out); break;
    case WFormat::Q8: decode_chunk<WFormat::Q8>(c, scale, out); break;
    case WFormat::Q4: decode_chunk<WFormat::Q4>(c, scale, out); break;
    case WFormat::Ggml: break;  // no chunks: ggml_blocks_cpu_test.cpp
  }
}

float dot_any(WFormat f, const Chunk& c, float scale, const float* x, int n_valid) {
  switch (f) {
    case WFormat::F32: return dot_chunk<WFormat::F32>(c, scale, x, n_valid);
    case WFormat::F16: return dot_chunk<WFormat::F16>(c, scale, x, n_valid);
    case WFormat::BF16: return dot_chunk<WFormat::BF16>(c, scale, x, n_valid);
    case WFormat::Q8: return dot_chunk<WFormat::Q8>(c, scale, x, n_valid);
    case WFormat::Q4: return dot_chunk<WFormat::Q4>(c, scale, x, n_valid);
    case WFormat::Ggml: break;
  }
  return 0.f;
}

struct MatCase {
  DType t;
  uint32_t group;
  int64_t cols;
};

const MatCase kMatCases[] = {
    {DType::F32, 0, 172},  {DType::F16, 0, 172},   {DType::F16, 0, 64},    {DType::BF16, 0, 172},
    {DType::BF16, 0, 96},  {DType::Q8, 32, 96},    {DType::Q4, 32, 128},   {DType::Q4, 64, 192},
    {DType::Q4, 128, 256},
};

// ---------------------------------------------------------------- weights

TEST(CudaWeightLayout, RepackedChunksDecodeExactlyLikeDequantizeRow) {
  for (const MatCase& mc : kMatCases) {
    SCOPED_TRACE(std::string(dtype_name(mc.t)) + " g" + std::to_string(mc.group) + " cols " + std::to_string(mc.cols));
    const int64_t rows = 5;
    const HostMatrix m = make_matrix(mc.t, mc.group, rows, mc.cols, 7);
    const Packed p = pack(m);
    ASSERT_EQ(p.layout.pitch % 16, 0u);
    const int V = chunk_values(p.layout.format);
    std::vector<float> ref(size_t(mc.cols)), got(static_cast<size_t>(V));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(mc.t, mc.group, m.view.data + size_t(r) * m.view.row_bytes, ref.data(), mc.cols);
      for (int64_t c = 0; c < p.layout.chunks_per_row(); ++c) {
        decode_any(p.layout.format, chunk_at(p, r, c), chunk_scale(p, r, c), got.data());
        for (int k = 0; k < V; ++k) {
          const int64_t i = c * V + k;
          if (i < mc.cols)
            ASSERT_EQ(bits(got[size_t(k)]), bits(ref[size_t(i)])) << "row " << r << " value " << i;
          else
            ASSERT_EQ(got[size_t(k)], 0.f) << "padding past the row must be zero";
        }
      }
    }
  }
}

TEST(CudaWeightLayout, RejectsShapesTheKernelsCannotRead) {
  EXPECT_THROW(matrix_layout(DType::F16, 0, 4, 170), Error);  // cols % 4
  EXPECT_THROW(matrix_layout(DType::Q4, 48, 4, 96), Error);   // bad group
  EXPECT_THROW(matrix_layout(DType::Q8, 32, 4, 48), Error);   // cols % 32
  try {
    matrix_layout(DType::F32, 0, 4, 6);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_UNSUPPORTED);
  }
  const HostMatrix a = make_matrix(DType::Q4, 32, 3, 64, 1), b = make_matrix(DType::Q4, 32, 2, 64, 2);
  const HostMatrix c = make_matrix(DType::Q4, 64, 2, 64, 3), d = make_matrix(DType::Q8, 32, 2, 64, 4);
  EXPECT_TRUE(can_stack({&a.view, &b.view}));
  EXPECT_FALSE(can_stack({&a.view, &c.view}));
  EXPECT_FALSE(can_stack({&a.view, &d.view}));
}

TEST(CudaWeightLayout, DotChunkMatchesDequantizedDot) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (const MatCase& mc : kMatCases) {
    const HostMatrix m = make_matrix(mc.t, mc.group, 1, mc.cols, 11);
    const Packed p = pack(m);
    const int V = chunk_values(p.layout.format);
    std::vector<float> ref(size_t(mc.cols)), x(size_t(p.layout.chunks_per_row() * V), 0.f);
    dequantize_row(mc.t, mc.group, m.view.data, ref.data(), mc.cols);
    for (int64_t i = 0; i < mc.cols; ++i) x[size_t(i)] = ud(rng);
    for (int64_t c = 0; c < p.layout.chunks_per_row(); ++c) {
      const int64_t first = c * V;
      const int n_valid = int(std::min<int64_t>(V, mc.cols - first));
      ASSERT_EQ(n_valid % 4, 0);
      double want = 0;
      for (int k = 0; k < n_valid; ++k) want += double(ref[size_t(first + k)]) * x[size_t(first + k)];
      const float got = dot_any(p.layout.format, chunk_at(p, 0, c), chunk_scale(p, 0, c), x.data() + first, n_valid);
      EXPECT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << dtype_name(mc.t) << " chunk " << c;
    }
  }
}

// The GEMV kernel's split: block = 8 / wpr rows, the wpr warps of a row take
// chunks sub * 32 + lane, stepping 32 * wpr; activation rows in passes of
// gemv_batch_tile. Replayed here: every chunk and every activation row is
// used exactly once, and the sums match matmul_ref.
TEST(CudaGemv, KernelWorkSplitMatchesMatmulRef) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (const MatCase& mc : kMatCases) {
    for (int64_t rows : {3, 40, 77}) {
      for (int sms : {1, 2, 132}) {
        for (int64_t n : {1, 3, 13}) {
          SCOPED_TRACE(std::string(dtype_name(mc.t)) + " rows " + std::to_string(rows) + " sms " + std::to_string(sms) +
                       " n " + std::to_string(n));
          const HostMatrix m = make_matrix(mc.t, mc.group, rows, mc.cols, uint32_t(rows + n));
          const Packed p = pack(m);
          const int V = chunk_values(p.layout.format);
          std::vector<float> x(size_t(n * mc.cols));
          for (float& v : x) v = ud(rng);
          std::vector<float> want(size_t(n * rows)), got(size_t(n * rows), -1.f);
          cpu::matmul_ref(m.view, x.data(), n, want.data());

          const int64_t chunks = p.layout.chunks_per_row();
          const int wpr = gemv_warps_per_row(rows, chunks, sms);
          ASSERT_TRUE(wpr == 1 || wpr == 2 || wpr == 4 || wpr == 8);
          std::vector<int> xrow_hits(size_t(n), 0);
          for (int64_t b0 = 0; b0 < n;) {
            const int tile = gemv_batch_tile(n - b0);
            ASSERT_TRUE(tile == 1 || tile == 2 || tile == 4 || tile == 8);
            const int nb = int(std::min<int64_t>(tile, n - b0));
            const int rpw = gemv_rows_per_warp(rows, wpr, tile, sms);
            ASSERT_TRUE(rpw == 1 || (rpw == 2 && wpr == 1));
            const int rows_per_block = (kGemvThreads / 32) * rpw / wpr;
            const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
            for (int b = 0; b < nb; ++b) ++xrow_hits[size_t(b0 + b)];
            std::vector<int> row_hits(size_t(rows), 0);
            for (int64_t blk = 0; blk < blocks; ++blk) {
              for (int warp = 0; warp < kGemvThreads / 32; ++warp) {
                const int64_t row0 = blk * rows_per_block + int64_t(warp / wpr) * rpw;
                if (row0 >= rows || warp % wpr != 0) continue;  // sub 0 owns the rows' results
                for (int r = 0; r < rpw && row0 + r < rows; ++r) {
                  const int64_t row = row0 + r;
                  ++row_hits[size_t(row)];
                  std::vector<int> chunk_hits(size_t(chunks), 0);
                  std::vector<double> acc(size_t(nb), 0.0);
                  for (int sub = 0; sub < wpr; ++sub)
                    for (int lane = 0; lane < 32; ++lane)
                      for (int64_t c = int64_t(sub) * 32 + lane; c < chunks; c += 32 * int64_t(wpr)) {
                        ++chunk_hits[size_t(c)];
                        const int64_t first = c * V;
                        const int n_valid = int(std::min<int64_t>(V, mc.cols - first));
                        for (int b = 0; b < nb; ++b)
                          acc[size_t(b)] += dot_any(p.layout.format, chunk_at(p, row, c), chunk_scale(p, row, c),
                                                    x.data() + (b0 + b) * mc.cols + first, n_valid);
                      }
                  for (int64_t c = 0; c < chunks; ++c) ASSERT_EQ(chunk_hits[size_t(c)], 1) << "chunk " << c;
                  for (int b = 0; b < nb; ++b) got[size_t((b0 + b) * rows + row)] = float(acc[size_t(b)]);
                }
              }
            }
            for (int h : row_hits) ASSERT_EQ(h, 1) << "every output row exactly once per pass";
            b0 += nb;
          }
          for (int h : xrow_hits) ASSERT_EQ(h, 1);
          for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i])));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- element-wise

TEST(CudaElementMath, RmsNormSiluRopeAreBitExactWithCpuOps) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int64_t dim = 172;
  std::vector<float> x(size_t(3 * dim)), w(static_cast<size_t>(dim)), want(x.size());
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  cpu::rmsnorm(want.data(), x.data(), w.data(), 3, dim, 1e-5f);
  for (int64_t r = 0; r < 3; ++r) {
    float ss = 0.f;
    for (int64_t i = 0; i < dim; ++i) ss += x[size_t(r * dim + i)] * x[size_t(r * dim + i)];
    const float inv = rms_inv(ss, dim, 1e-5f);
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_EQ(bits(w[size_t(i)] * (inv * x[size_t(r * dim + i)])), bits(want[size_t(r * dim + i)]));
  }

  std::vector<float> a(200), b(200), a_ref;
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = nd(rng) * 5;
    b[i] = nd(rng);
  }
  a[0] = -100.f;  // exp overflow side
  a[1] = 100.f;
  a_ref = a;
  cpu::silu_mul(a_ref.data(), b.data(), int64_t(a.size()));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(silu_mul(a[i], b[i])), bits(a_ref[i])) << i;

  // RoPE of every spec kind: interleaved and NeoX pairs, partial rotary
  // dimensions, a per-layer frequency table and YaRN/LongRoPE's mscale.
  std::uniform_real_distribution<float> ud(0.0001f, 1.0f);
  for (int32_t kind : {0, 1}) {
    for (int32_t hd : {8, 16, 64, 128, 256}) {
      for (int32_t rd : {hd, hd * 3 / 4 / 2 * 2}) {
        for (float mscale : {1.0f, 1.2079f}) {
          std::vector<float> f(size_t(rd / 2));
          for (float& v : f) v = ud(rng);
          const cpu::Rope r{kind, hd, rd, f.data(), mscale};
          for (int64_t pos : {int64_t(0), int64_t(1), int64_t(17), int64_t(4095), int64_t(-37), int64_t(100000)}) {
            std::vector<float> h(static_cast<size_t>(hd)), ref;
            for (float& v : h) v = nd(rng);
            ref = h;
            cpu::rope_head(ref.data(), r, pos);
            for (int32_t j = 0; j < rd / 2; ++j) rope_spec_pair(h.data(), kind, rd, f.data(), mscale, j, pos);
            for (int32_t i = 0; i < hd; ++i)
              ASSERT_EQ(bits(h[size_t(i)]), bits(ref[size_t(i)]))
                  << "kind " << kind << " hd " << hd << " rope_dims " << rd << " pos " << pos << " dim " << i;
          }
        }
      }
    }
  }
}

TEST(CudaElementMath, GeluSoftcapAndWindowMaskMatchTheCpuForward) {
  std::mt19937 rng(10);
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<float> a(4000), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = nd(rng);
    b[i] = nd(rng);
  }
  a[0] = 10.0f, a[1] = -10.0f, a[2] = 9.999f, a[3] = -9.999f, a[4] = 0.0f, a[5] = 1e-8f, a[6] = 300.f, a[7] = -300.f;
  std::vector<float> ref = a;
  cpu::gelu_tanh_mul(ref.data(), b.data(), int64_t(a.size()));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(gelu_tanh_mul(a[i], b[i])), bits(ref[i])) << a[i];

  for (float cap : {50.0f, 30.0f, 0.5f}) {
    std::vector<float> x(a), want(a);
    for (float& v : x) v *= 20;
    want = x;
    cpu::softcap(want.data(), int64_t(want.size()), cap);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(softcap_value(x[i], cap)), bits(want[i])) << x[i];
  }

  // cpu::attention's first attended slot is max(0, len - window) for a query
  // at pos = len - 1; every later slot up to pos is attended.
  for (int32_t window : {0, 1, 5, 512}) {
    for (int64_t pos : {int64_t(0), int64_t(3), int64_t(4), int64_t(511), int64_t(512), int64_t(2000)}) {
      const int64_t len = pos + 1, lo = std::max<int64_t>(0, window > 0 ? len - window : 0);
      EXPECT_EQ(attn_first_key(pos, window), lo);
      for (int64_t t = 0; t <= pos + 2; ++t)
        EXPECT_EQ(attn_key_visible(t, pos, window), t >= lo && t <= pos) << "window " << window << " pos " << pos;
    }
  }
}

TEST(CudaElementMath, HalfConversionsMatchHostHelpers) {
  for (float f : {0.f, -0.f, 1.f, 65504.f, 1e-8f, -3.14159f, 70000.f, 6.1e-5f}) {
    EXPECT_EQ(float_to_f16_bits(f), f32_to_f16(f));
    EXPECT_EQ(float_to_bf16_bits(f), f32_to_bf16(f));
    EXPECT_EQ(bits(f16_bits_to_float(f32_to_f16(f))), bits(f16_to_f32(f32_to_f16(f))));
  }
}

TEST(CudaKvLayout, RowIndexMatchesHostPageLayout) {
  kv::Geometry g;
  g.n_layers = 3;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.page_tokens = 5;
  const KvGeom dg{g.n_layers, g.n_kv_heads, g.head_dim, g.page_tokens};
  kv::PagePool pool(g, 1 << 20);
  for (llm_kv_type t : {LLM_KV_F16, LLM_KV_F32}) {
    std::vector<kv::Page*> pages;
    ASSERT_TRUE(pool.acquire(t, 1, pages));
    const size_t es = t == LLM_KV_F32 ? 4 : 2;
    for (int32_t l = 0; l < g.n_layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int32_t h = 0; h < g.n_kv_heads; ++h)
          for (int32_t s = 0; s < g.page_tokens; ++s)
            ASSERT_EQ(size_t(kv::row_ptr(g, pages[0], l, kv, h, s) - pages[0]->data),
                      size_t(kv_row_index(dg, l, kv, h, s)) * size_t(g.head_dim) * es);
    EXPECT_EQ(kv_page_of(11, 5), 2);
    EXPECT_EQ(kv_slot_of(11, 5), 1);
    pool.release(pages[0]);
  }
}

// ---------------------------------------------------------------- softmax merge

TEST(CudaSoftmax, MergedPartialsEqualOneSoftmax) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + int(rng() % 120), hd = 4;
    std::vector<float> s(static_cast<size_t>(n)), v(size_t(n * hd));
    for (float& x : s) x = nd(rng);
    for (float& x : v) x = nd(rng);
    // A masked stretch (-inf), as causal masks produce.
    const int mask_from = int(rng() % size_t(n)), mask_len = int(rng() % 8);
    for (int i = mask_from; i < std::min(n, mask_from + mask_len); ++i) s[size_t(i)] = -INFINITY;
    // Reference in double.
    double mx = -INFINITY;
    for (float x : s) mx = std::max(mx, double(x));
    std::vector<double> want(size_t(hd), 0.0);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const double p = s[size_t(i)] == -INFINITY ? 0 : std::exp(double(s[size_t(i)]) - mx);
      sum += p;
      for (int d = 0; d < hd; ++d) want[size_t(d)] += p * v[size_t(i * hd + d)];
    }
    // Random segments (some empty), merged in random order.
    std::vector<int> cuts = {0, n};
    for (int k = 0; k < 4; ++k) cuts.push_back(int(rng() % size_t(n + 1)));
    std::sort(cuts.begin(), cuts.end());
    std::vector<size_t> order(cuts.size() - 1);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    float m = -INFINITY, l = 0.f;
    std::vector<float> acc(size_t(hd), 0.f);
    for (size_t seg : order) {
      const int b = cuts[seg], e = cuts[seg + 1];
      float ms = -INFINITY;
      for (int i = b; i < e; ++i) ms = std::max(ms, s[size_t(i)]);
      float ls = 0.f;
      std::vector<float> as(size_t(hd), 0.f);
      for (int i = b; i < e; ++i) {
        const float p = exp_or_zero(s[size_t(i)], ms);
        ls += p;
        for (int d = 0; d < hd; ++d) as[size_t(d)] += p * v[size_t(i * hd + d)];
      }
      const MergeFactors f = softmax_merge(m, ms);
      ASSERT_FALSE(std::isnan(f.fa) || std::isnan(f.fb));
      for (int d = 0; d < hd; ++d) acc[size_t(d)] = acc[size_t(d)] * f.fa + as[size_t(d)] * f.fb;
      l = l * f.fa + ls * f.fb;
      m = f.m;
    }
    for (int d = 0; d < hd; ++d)
      ASSERT_NEAR(softmax_finish(acc[size_t(d)], l), want[size_t(d)] / sum, 1e-4 * (1 + std::fabs(want[size_t(d)] / sum)));
  }
  // Nothing visible at all: zeros, not NaN.
  const MergeFactors f = softmax_merge(-INFINITY, -INFINITY);
  EXPECT_EQ(f.fa, 0.f);
  EXPECT_EQ(f.fb, 0.f);
  EXPECT_EQ(softmax_finish(0.f, 0.f), 0.f);
}

// ---------------------------------------------------------------- attention tiles and splits

struct AttnCase {
  int n_heads, n_kv, hd, page_tokens;
  int64_t p0, n;
  bool decode;  // rows as separate sequences (R = 1, splits) vs one prefill sequence
  llm_kv_type kv;
  int32_t window = 0;   // sliding window (0: all keys)
  float softcap = 0;    // attention-logit softcap (0: off)
  float scale = 0;      // query scale (0: 1 / sqrt(head_dim))
};

// Replays attention_kernel + attention_reduce_kernel on the CPU: same block
// decomposition, key tiles, masks, online softmax and split merge.
std::vector<float> attention_emulated(const AttnCase& c, const kv::Geometry& g, const std::vector<kv::Page*>& pages,
                                      const std::vector<float>& q, int sm_count) {
  const int group = c.n_heads / c.n_kv, hd = c.hd;
  const int64_t q_ld = int64_t(c.n_heads) * hd;
  const KvGeom dg{g.n_layers, g.n_kv_heads, g.head_dim, g.page_tokens};
  const int layer = g.n_layers - 1;
  std::vector<int32_t> pos(size_t(c.n));
  for (int64_t i = 0; i < c.n; ++i) pos[size_t(i)] = int32_t(c.p0 + i);
  int32_t rows_per_block = 1, split_tokens = 1 << 30, n_splits = 1;
  if (c.decode) {
    const int64_t cap = int64_t(table_bucket(int64_t(pages.size()))) * c.page_tokens;
    const SplitPlan sp = plan_decode_splits(cap, int32_t(c.n), c.n_kv, sm_count);
    split_tokens = sp.split_tokens;
    n_splits = sp.n_splits;
    EXPECT_GE(int64_t(split_tokens) * n_splits, cap);
  } else {
    rows_per_block = prefill_rows_per_block(group, hd);
    EXPECT_GE(rows_per_block, 1);
  }
  const float scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(float(hd));
  std::vector<float> out(size_t(c.n * q_ld), NAN);
  std::vector<float> part_ml(size_t(c.n * c.n_heads * n_splits * 2)), part_acc(size_t(c.n * c.n_heads * n_splits * hd));
  auto load = [&](int32_t p, int kvi, int kvh, float* dst) {
    const kv::Page* page = pages[size_t(kv_page_of(p, g.page_tokens))];
    const int64_t row = kv_row_index(dg, layer, kvi, kvh, kv_slot_of(p, g.page_tokens));
    for (int d = 0; d < hd; ++d) {
      if (c.kv == LLM_KV_F32) {
        std::memcpy(&dst[d], page->data + (size_t(row) * hd + d) * 4, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, page->data + (size_t(row) * hd + d) * 2, 2);
        dst[d] = f16_bits_to_float(h);
      }
    }
  };
  const int64_t n_tiles = (c.n + rows_per_block - 1) / rows_per_block;
  for (int64_t z = 0; z < n_tiles; ++z)
    for (int kvh = 0; kvh < c.n_kv; ++kvh)
      for (int split = 0; split < n_splits; ++split) {
        const int64_t r0 = z * rows_per_block;
        const int n_rows = int(std::min<int64_t>(rows_per_block, c.n - r0));
        const int nq = n_rows * group;
        EXPECT_LE(nq * hd, kAttnThreads * kAttnMaxAcc);
        EXPECT_LE(nq, kAttnMaxQueries);
        int32_t n_keys = 0, k_first = 0x7fffffff;
        for (int r = 0; r < n_rows; ++r) {
          n_keys = std::max(n_keys, pos[size_t(r0 + r)] + 1);
          k_first = std::min(k_first, int32_t(attn_first_key(pos[size_t(r0 + r)], c.window)));
        }
        int32_t kb, ke;
        split_range(split, split_tokens, n_keys, &kb, &ke);
        std::vector<float> sq(size_t(nq * hd)), m(size_t(nq), -INFINITY), l(size_t(nq), 0.f), acc(size_t(nq * hd), 0.f);
        for (int i = 0; i < nq * hd; ++i) {
          int32_t row, head;
          attn_query_of(i / hd, group, kvh, &row, &head);
          sq[size_t(i)] = q[size_t((r0 + row) * q_ld + head * hd + i % hd)] * scale;
        }
        std::vector<float> kt(size_t(kAttnTile * hd)), vt(size_t(kAttnTile * hd)), sp(static_cast<size_t>(kAttnTile));
        for (int32_t t0 = kb; t0 < ke; t0 += kAttnTile) {
          const int nt = std::min(kAttnTile, ke - t0);
          if (t0 + nt <= k_first) continue;
          for (int tt = 0; tt < nt; ++tt) {
            load(t0 + tt, 0, kvh, kt.data() + tt * hd);
            load(t0 + tt, 1, kvh, vt.data() + tt * hd);
          }
          for (int qi = 0; qi < nq; ++qi) {
            float mt = -INFINITY;
            for (int tt = 0; tt < kAttnTile; ++tt) {
              float s = -INFINITY;
              if (tt < nt && attn_key_visible(t0 + tt, pos[size_t(r0 + qi / group)], c.window)) {
                float dot = 0.f;
                for (int d = 0; d < hd; ++d) dot += sq[size_t(qi * hd + d)] * kt[size_t(tt * hd + d)];
                s = c.softcap > 0 ? softcap_value(dot, c.softcap) : dot;
              }
              sp[size_t(tt)] = s;
              mt = std::max(mt, s);
            }
            const MergeFactors f = softmax_merge(m[size_t(qi)], mt);
            float ls = 0.f;
            for (float& s : sp) ls += (s = exp_or_zero(s, f.m));
            l[size_t(qi)] = l[size_t(qi)] * f.fa + ls;
            m[size_t(qi)] = f.m;
            for (int d = 0; d < hd; ++d) {
              float a = acc[size_t(qi * hd + d)] * f.fa;
              for (int tt = 0; tt < nt; ++tt) a += sp[size_t(tt)] * vt[size_t(tt * hd + d)];
              acc[size_t(qi * hd + d)] = a;
            }
          }
        }
        for (int i = 0; i < nq * hd; ++i) {
          const int qi = i / hd, d = i % hd;
          int32_t row, head;
          attn_query_of(qi, group, kvh, &row, &head);
          if (n_splits == 1) {
            out[size_t((r0 + row) * q_ld + head * hd + d)] = softmax_finish(acc[size_t(i)], l[size_t(qi)]);
          } else {
            const int64_t pi = ((r0 + row) * c.n_heads + head) * n_splits + split;
            part_acc[size_t(pi * hd + d)] = acc[size_t(i)];
            part_ml[size_t(pi * 2)] = m[size_t(qi)];
            part_ml[size_t(pi * 2 + 1)] = l[size_t(qi)];
          }
        }
      }
  if (n_splits > 1) {
    for (int64_t rh = 0; rh < c.n * c.n_heads; ++rh)
      for (int d = 0; d < hd; ++d) {
        float m = -INFINITY, l = 0.f, acc = 0.f;
        for (int s = 0; s < n_splits; ++s) {
          const int64_t pi = rh * n_splits + s;
          const MergeFactors f = softmax_merge(m, part_ml[size_t(pi * 2)]);
          acc = acc * f.fa + part_acc[size_t(pi * hd + d)] * f.fb;
          l = l * f.fa + part_ml[size_t(pi * 2 + 1)] * f.fb;
          m = f.m;
        }
        out[size_t((rh / c.n_heads) * q_ld + (rh % c.n_heads) * hd + d)] = softmax_finish(acc, l);
      }
  }
  return out;
}

TEST(CudaAttention, TiledSplitAlgorithmMatchesCpuAttention) {
  const AttnCase cases[] = {
      {8, 2, 16, 16, 0, 37, false, LLM_KV_F16},   // prefill from empty: 3 row tiles of 16 rows
      {8, 2, 16, 16, 40, 70, false, LLM_KV_F32},  // prefill chunk after a cached prefix
      {4, 4, 8, 5, 100, 3, true, LLM_KV_F16},     // decode, odd page size, MHA
      {32, 8, 128, 16, 300, 2, true, LLM_KV_F16}, // decode, Llama-3 shape, several splits
      {6, 1, 32, 7, 700, 1, true, LLM_KV_F32},    // decode, MQA, split boundary not on a page
      // Gemma-style layers: sliding windows (whole tiles and splits before them
      // hold no visible key), softcapped scores, a query scale of their own.
      {8, 4, 32, 16, 0, 70, false, LLM_KV_F16, 24, 50.f, 0.0625f},     // prefill, window inside the chunk
      {8, 4, 32, 16, 100, 40, false, LLM_KV_F32, 8, 0.f, 0.f},         // chunk after a prefix, window 8
      {4, 1, 256, 16, 1500, 3, true, LLM_KV_F16, 512, 0.f, 0.0625f},   // decode, Gemma 3 270M shape, window 512
      {4, 2, 16, 16, 900, 2, true, LLM_KV_F32, 1, 30.f, 0.f},          // decode, window 1: only itself
  };
  std::mt19937 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const AttnCase& c : cases) {
    SCOPED_TRACE("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) + " hd " + std::to_string(c.hd) +
                 " p0 " + std::to_string(c.p0) + " n " + std::to_string(c.n));
    kv::Geometry g;
    g.n_layers = 2;
    g.n_kv_heads = c.n_kv;
    g.head_dim = c.hd;
    g.page_tokens = c.page_tokens;
    kv::PagePool pool(g, uint64_t(1) << 30);
    const int64_t len = c.p0 + c.n;
    const size_t n_pages = size_t((len + c.page_tokens - 1) / c.page_tokens);
    std::vector<kv::Page*> all;
    ASSERT_TRUE(pool.acquire(c.kv, n_pages + 3, all));
    std::shuffle(all.begin(), all.end(), rng);  // the table is not in allocation order
    std::vector<kv::Page*> pages(all.begin(), all.begin() + std::ptrdiff_t(n_pages));
    std::vector<float> row(size_t(c.hd));
    for (int64_t t = 0; t < len; ++t)
      for (int l = 0; l < g.n_layers; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < c.n_kv; ++h) {
            for (float& v : row) v = nd(rng);
            kv::store_row(g, pages[size_t(t / c.page_tokens)], l, kvi, h, int32_t(t % c.page_tokens), row.data());
          }
    std::vector<float> q(size_t(c.n * c.n_heads * c.hd));
    for (float& v : q) v = nd(rng) * 2;
    std::vector<float> want(q.size());
    cpu::AttentionArgs a;
    a.geom = &g;
    std::vector<const kv::Page*> cpages(pages.begin(), pages.end());
    a.pages = cpages.data();
    a.layer = g.n_layers - 1;
    a.n_heads = c.n_heads;
    a.q = q.data();
    a.n = c.n;
    a.p0 = c.p0;
    a.out = want.data();
    a.window = c.window;
    a.softcap = c.softcap;
    a.scale = c.scale;
    std::vector<std::vector<float>> scratch;
    cpu::attention(a, scratch, nullptr);
    for (int sms : {1, 132}) {
      const std::vector<float> got = attention_emulated(c, g, pages, q, sms);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << "element " << i << " sms " << sms;
    }
    for (kv::Page* p : all) pool.release(p);
  }
}

// ---------------------------------------------------------------- argmax / top-k

TEST(CudaSelect, LogitOrderIsTotalWithLowestIdOnTiesAndNanLast) {
  EXPECT_TRUE(logit_better(2.f, 5, 1.f, 0));
  EXPECT_TRUE(logit_better(1.f, 3, 1.f, 4));
  EXPECT_FALSE(logit_better(1.f, 4, 1.f, 3));
  EXPECT_FALSE(logit_better(1.f, 4, 1.f, 4));
  EXPECT_TRUE(logit_better(-INFINITY, 1, NAN, 0) == false);  // NaN = -inf, lower id wins
  EXPECT_TRUE(logit_better(NAN, 0, -INFINITY, 1));
  EXPECT_TRUE(logit_better(-1e30f, 9, NAN, 0));
  EXPECT_EQ(topk_slices(10), 1);
  EXPECT_EQ(topk_slices(32000), 8);
  EXPECT_EQ(topk_slices(128256), 32);
  EXPECT_EQ(topk_slices(int64_t(1) << 22), 64);
}

// Replays argmax_kernel (strided per-thread best, then pairwise reduction)
// and the two top-k stages (select_k) with the kernels' helpers.
std::pair<float, int32_t> best_of(const std::vector<std::pair<float, int32_t>>& v) {
  std::pair<float, int32_t> b{-INFINITY, 0x7fffffff};
  for (const auto& e : v)
    if (logit_better(e.first, e.second, b.first, b.second)) b = e;
  return b;
}

std::vector<std::pair<float, int32_t>> select_k_emulated(const std::vector<std::pair<float, int32_t>>& cand, int k) {
  std::vector<std::pair<float, int32_t>> out;
  for (int it = 0; it < k; ++it) {
    std::pair<float, int32_t> b{-INFINITY, 0x7fffffff};
    for (const auto& e : cand) {
      if (e.second == 0x7fffffff) continue;
      if (it > 0 && !logit_better(out.back().first, out.back().second, e.first, e.second)) continue;
      if (logit_better(e.first, e.second, b.first, b.second)) b = e;
    }
    out.push_back(b);
  }
  return out;
}

TEST(CudaSelect, ArgmaxAndTwoStageTopKMatchTheSamplerOrder) {
  std::mt19937 rng(17);
  for (int64_t vocab : {int64_t(7), int64_t(512), int64_t(50000)}) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    // Coarse values: many ties.
    for (float& v : logits) v = float(int(rng() % 64)) * 0.5f - 10.f;
    // Argmax: 1024 threads each take a strided subset, then the block reduces.
    std::vector<std::pair<float, int32_t>> per_thread;
    for (int t = 0; t < 1024; ++t) {
      std::vector<std::pair<float, int32_t>> mine;
      for (int64_t i = t; i < vocab; i += 1024) mine.push_back({logits[size_t(i)], int32_t(i)});
      per_thread.push_back(best_of(mine));
    }
    std::shuffle(per_thread.begin(), per_thread.end(), rng);  // reduction order must not matter
    int32_t greedy = 0;
    for (int64_t i = 1; i < vocab; ++i)
      if (logits[size_t(i)] > logits[size_t(greedy)]) greedy = int32_t(i);  // Sampler's greedy loop
    EXPECT_EQ(best_of(per_thread).second, greedy);

    for (int k : {1, 7, 40, 256}) {
      if (k > vocab) continue;
      const int64_t slices = topk_slices(vocab), slice = (vocab + slices - 1) / slices;
      std::vector<std::pair<float, int32_t>> cands;
      for (int64_t s = 0; s < slices; ++s) {
        std::vector<std::pair<float, int32_t>> part;
        for (int64_t i = s * slice; i < std::min(vocab, (s + 1) * slice); ++i) part.push_back({logits[size_t(i)], int32_t(i)});
        const auto best = select_k_emulated(part, k);
        cands.insert(cands.end(), best.begin(), best.end());
      }
      const auto got = select_k_emulated(cands, k);
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
      });
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(got[size_t(i)].second, ids[size_t(i)]) << "vocab " << vocab << " k " << k << " rank " << i;
        ASSERT_EQ(got[size_t(i)].first, logits[size_t(ids[size_t(i)])]);
      }
    }
  }
}

// ---------------------------------------------------------------- eviction shift

// Replays kv_shift_kernel (per (layer, K/V, head) and thread unit, ascending
// slots, in place) and compares with what the CPU engine's eviction does row
// by row (cpu::rerotate_key: rope_head with the layer's table, no mscale),
// for interleaved, NeoX and partially rotated heads with per-layer tables.
TEST(CudaKvShift, InPlaceAscendingShiftEqualsRowByRowEviction) {
  kv::Geometry g;
  g.n_layers = 2;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.page_tokens = 8;
  const KvGeom dg{g.n_layers, g.n_kv_heads, g.head_dim, g.page_tokens};
  const int32_t len = 50, n_keep = 4, n_discard = 7;  // moved ranges overlap (7 < 39)
  struct RopeCase {
    int32_t kind, rope_dims;
  };
  for (const RopeCase rc : {RopeCase{0, 8}, RopeCase{1, 8}, RopeCase{1, 6}, RopeCase{0, 4}}) {
    SCOPED_TRACE("kind " + std::to_string(rc.kind) + " rope_dims " + std::to_string(rc.rope_dims));
    const int32_t rhalf = rc.rope_dims / 2;
    std::vector<float> table(size_t(g.n_layers * rhalf));  // [layer][pair], as the backend uploads it
    for (int32_t l = 0; l < g.n_layers; ++l)
      for (int32_t j = 0; j < rhalf; ++j)
        table[size_t(l * rhalf + j)] = 1.0f / std::pow(l == 0 ? 10000.f : 1e6f, float(2 * j) / float(rc.rope_dims));
    kv::PagePool pool(g, uint64_t(1) << 24);
    std::vector<kv::Page*> pages, expect;
    const size_t np = size_t((len + g.page_tokens - 1) / g.page_tokens);
    ASSERT_TRUE(pool.acquire(LLM_KV_F16, np, pages));
    ASSERT_TRUE(pool.acquire(LLM_KV_F16, np, expect));
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> row(8);
    for (int32_t t = 0; t < len; ++t)
      for (int l = 0; l < 2; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < 2; ++h) {
            for (float& v : row) v = nd(rng);
            kv::store_row(g, pages[size_t(t / 8)], l, kvi, h, t % 8, row.data());
          }
    // Expected, as the CPU engine moves rows (load, re-rotate K, store).
    for (int32_t src = n_keep + n_discard; src < len; ++src) {
      const int32_t dst = src - n_discard;
      for (int l = 0; l < 2; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < 2; ++h) {
            kv::load_row(g, pages[size_t(src / 8)], l, kvi, h, src % 8, row.data());
            const cpu::Rope r{rc.kind, 8, rc.rope_dims, table.data() + l * rhalf, 1.0f};
            if (kvi == 0) cpu::rope_head(row.data(), r, -int64_t(n_discard));
            kv::store_row(g, expect[size_t(dst / 8)], l, kvi, h, dst % 8, row.data());
          }
    }
    // The kernel's loop, in place.
    const int32_t units = rhalf + (g.head_dim - rc.rope_dims);
    for (int32_t blk = 0; blk < g.n_layers * 2 * g.n_kv_heads; ++blk) {
      const int32_t head = blk % g.n_kv_heads, kvi = (blk / g.n_kv_heads) % 2, layer = blk / (2 * g.n_kv_heads);
      const float* inv_freq = table.data() + layer * rhalf;
      for (int32_t u = 0; u < units; ++u) {
        int32_t d0, d1 = -1;
        if (u < rhalf)
          rope_pair_dims(rc.kind, rc.rope_dims, u, &d0, &d1);
        else
          d0 = rc.rope_dims + (u - rhalf);
        for (int32_t t = 0; t < len - n_keep - n_discard; ++t) {
          const int32_t src = n_keep + n_discard + t, dst = src - n_discard;
          uint16_t* ps = reinterpret_cast<uint16_t*>(pages[size_t(kv_page_of(src, 8))]->data);
          uint16_t* pd = reinterpret_cast<uint16_t*>(pages[size_t(kv_page_of(dst, 8))]->data);
          const int64_t rs = kv_row_index(dg, layer, kvi, head, kv_slot_of(src, 8)) * 8;
          const int64_t rd = kv_row_index(dg, layer, kvi, head, kv_slot_of(dst, 8)) * 8;
          float v0 = f16_bits_to_float(ps[rs + d0]);
          if (d1 < 0) {
            pd[rd + d0] = float_to_f16_bits(v0);
            continue;
          }
          float v1 = f16_bits_to_float(ps[rs + d1]);
          if (kvi == 0) rope_rotate_scaled(&v0, &v1, -float(n_discard) * inv_freq[u], 1.0f);
          pd[rd + d0] = float_to_f16_bits(v0);
          pd[rd + d1] = float_to_f16_bits(v1);
        }
      }
    }
    std::vector<float> a(8), b(8);
    for (int32_t dst = n_keep; dst < len - n_discard; ++dst)
      for (int l = 0; l < 2; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < 2; ++h) {
            kv::load_row(g, pages[size_t(dst / 8)], l, kvi, h, dst % 8, a.data());
            kv::load_row(g, expect[size_t(dst / 8)], l, kvi, h, dst % 8, b.data());
            for (int d = 0; d < 8; ++d) ASSERT_EQ(bits(a[size_t(d)]), bits(b[size_t(d)])) << "slot " << dst;
          }
    for (kv::Page* p : pages) pool.release(p);
    for (kv::Page* p : expect) pool.release(p);
  }
}

}  // namespace
