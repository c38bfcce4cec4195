// Every CUDA kernel against the CPU reference, through its launcher.
// Labelled "cuda"; each test skips when no CUDA device is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_util.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/weight_layout.h"
#include "convert/ggml_quantize.h"
#include "core/half.h"
#include "kv/kv_cache.h"
#include "quant/quant.h"

namespace {

using namespace llm;
using namespace llm::cuda;

struct HostMatrix;

class CudaKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&st_), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    ASSERT_EQ(attention_setup(), cudaSuccess);
  }
  void TearDown() override {
    if (st_) {
      EXPECT_EQ(cudaStreamSynchronize(st_), cudaSuccess);
      cudaStreamDestroy(st_);
    }
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(st_), cudaSuccess); }

  // launch_gemv of h for each batch n, with beta 0 and 1, against matmul_ref.
  void expect_gemv_matches_ref(const HostMatrix& h, std::initializer_list<int64_t> batches);
  // launch_dequant (f16 and bf16) and launch_embed of h, bit for bit
  // against cpu::dequantize_row; h has 70 rows.
  void expect_dequant_and_embed_exact(const HostMatrix& h);

  cudaStream_t st_ = nullptr;
  int sms_ = 1;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

struct HostMatrix {
  std::vector<uint8_t> bytes;
  cpu::WeightView view;
};

HostMatrix make_matrix(DType t, uint32_t group, int64_t rows, int64_t cols, uint32_t seed) {
  HostMatrix m;
  m.view.dtype = t;
  m.view.group = group;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.row_bytes = dtype_row_bytes(t, cols, group);
  m.bytes.resize(m.view.row_bytes * size_t(rows));
  const std::vector<float> w = randn(size_t(rows * cols), seed, 0.5f);
  uint8_t* dst = m.bytes.data();
  for (int64_t r = 0; r < rows; ++r, dst += m.view.row_bytes) {
    if (dtype_is_ggml_block(t))  // the project's GGUF block quantizers (offline code)
      quantize_ggml_row(t, w.data() + r * cols, nullptr, dst, cols);
    else
      quantize_row(t, group, w.data() + r * cols, dst, cols);
  }
  m.view.data = m.bytes.data();
  return m;
}

// The matrix in device layout, owning its memory.
struct DevMatrix {
  DeviceBuffer data, scales;
  DeviceMatrix m;
};

DevMatrix upload(const HostMatrix& h) {
  DevMatrix d;
  d.m.layout = matrix_layout(h.view.dtype, h.view.group, h.view.rows, h.view.cols);
  std::vector<uint8_t> data(d.m.layout.data_bytes());
  std::vector<uint16_t> scales(std::max<size_t>(d.m.layout.scale_count(), 1));
  repack_rows(h.view, d.m.layout, 0, h.view.rows, data.data(), scales.data());
  d.data = to_device(data);
  d.scales = to_device(scales);
  d.m.data = d.data.as<uint8_t>();
  d.m.scales = d.m.layout.groups_per_row ? d.scales.as<uint16_t>() : nullptr;
  return d;
}

struct MatCase {
  DType t;
  uint32_t group;
  int64_t cols;
};
const MatCase kMatCases[] = {
    {DType::F32, 0, 172}, {DType::F16, 0, 172},  {DType::BF16, 0, 96},   {DType::Q8, 32, 4096},
    {DType::Q4, 32, 4096}, {DType::Q4, 64, 192}, {DType::Q4, 128, 1024},
};

double tol_for(double want, int64_t cols) { return 1e-5 * std::sqrt(double(cols)) * (1 + std::fabs(want)); }

// ---------------------------------------------------------------- weights

void CudaKernel::expect_gemv_matches_ref(const HostMatrix& h, std::initializer_list<int64_t> batches) {
  const int64_t rows = h.view.rows, cols = h.view.cols;
  const DevMatrix d = upload(h);
  for (int64_t n : batches) {
    for (float beta : {0.f, 1.f}) {
      SCOPED_TRACE(std::string(dtype_name(h.view.dtype)) + " rows " + std::to_string(rows) + " n " +
                   std::to_string(n) + " beta " + std::to_string(beta));
      const std::vector<float> x = randn(size_t(n * cols), 3);
      const std::vector<float> y0 = randn(size_t(n * rows), 4);
      std::vector<float> want(size_t(n * rows));
      cpu::matmul_ref(h.view, x.data(), n, want.data());
      if (beta != 0.f)
        for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
      DeviceBuffer dx = to_device(x), dy = to_device(y0), scratch(size_t(gemv_scratch_floats(d.m.layout)) * 4);
      ASSERT_EQ(launch_gemv(d.m, dx.as<float>(), cols, n, dy.as<float>(), rows, beta, scratch.as<float>(), sms_, st_),
                cudaSuccess);
      sync();
      const std::vector<float> got = to_host<float>(dy, size_t(n * rows));
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol_for(want[i], cols)) << i;
    }
  }
}

void CudaKernel::expect_dequant_and_embed_exact(const HostMatrix& h) {
  SCOPED_TRACE(dtype_name(h.view.dtype));
  const int64_t rows = h.view.rows, cols = h.view.cols;
  ASSERT_EQ(rows, 70);
  const DevMatrix d = upload(h);
  std::vector<float> ref(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) cpu::dequantize_row(h.view, r, ref.data() + r * cols);
  for (bool bf16 : {false, true}) {
    const int64_t r0 = 5, n = 60;
    DeviceBuffer out(size_t(n * cols) * 2);
    ASSERT_EQ(launch_dequant(d.m, r0, n, out.as<uint16_t>(), bf16, st_), cudaSuccess);
    sync();
    const std::vector<uint16_t> got = to_host<uint16_t>(out, size_t(n * cols));
    for (int64_t i = 0; i < n * cols; ++i) {
      const float v = ref[size_t(r0 * cols + i)];
      ASSERT_EQ(got[size_t(i)], bf16 ? f32_to_bf16(v) : f32_to_f16(v)) << i;
    }
  }
  const std::vector<int32_t> toks = {0, int32_t(rows - 1), 3, 3};
  DeviceBuffer dt = to_device(toks), dx(toks.size() * size_t(cols) * 4);
  ASSERT_EQ(launch_embed(d.m, dt.as<int32_t>(), int64_t(toks.size()), dx.as<float>(), st_), cudaSuccess);
  sync();
  const std::vector<float> x = to_host<float>(dx, toks.size() * size_t(cols));
  for (size_t i = 0; i < toks.size(); ++i)
    for (int64_t k = 0; k < cols; ++k) {
      uint32_t a, b;
      std::memcpy(&a, &x[i * size_t(cols) + size_t(k)], 4);
      std::memcpy(&b, &ref[size_t(toks[i] * cols + k)], 4);
      ASSERT_EQ(a, b) << "token " << i << " value " << k;
    }
}

TEST_F(CudaKernel, GemvMatchesMatmulRefForEveryFormatAndBatch) {
  for (const MatCase& mc : kMatCases)
    for (int64_t rows : {1, 37, 1000})
      ASSERT_NO_FATAL_FAILURE(
          expect_gemv_matches_ref(make_matrix(mc.t, mc.group, rows, mc.cols, uint32_t(rows)), {1, 3, 8, 13, 40}));
}

TEST_F(CudaKernel, DequantAndEmbedAreExact) {
  for (const MatCase& mc : kMatCases)
    ASSERT_NO_FATAL_FAILURE(expect_dequant_and_embed_exact(make_matrix(mc.t, mc.group, 70, mc.cols, 9)));
}

// GGUF block weights kept as stored (WFormat::Ggml, gemv_ggml.cu), made by
// the project's block quantizers: GEMV against matmul_ref of the dequantized
// rows, dequant and embedding equal to the host decoders bit for bit. Row
// lengths of 33 and 9 blocks leave lanes idle in the last stride.
TEST_F(CudaKernel, GgmlBlockWeightsGemvDequantEmbedMatchTheHostDecoders) {
  const DType types[] = {DType::Q5_0, DType::Q5_1, DType::Q2_K,   DType::Q3_K,  DType::Q4_K,
                         DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
  for (DType t : types) {
    const uint32_t group = uint32_t(ggml_block_values(t));
    const int64_t cols = group == 32 ? 1056 : 2304;
    for (int64_t rows : {1, 37, 300}) {
      const HostMatrix h = make_matrix(t, group, rows, cols, uint32_t(rows));
      ASSERT_EQ(matrix_layout(t, group, rows, cols).format, WFormat::Ggml);
      ASSERT_NO_FATAL_FAILURE(expect_gemv_matches_ref(h, {1, 3, 8, 9, 40}));
    }
    ASSERT_NO_FATAL_FAILURE(expect_dequant_and_embed_exact(make_matrix(t, group, 70, cols, 9)));
  }
}

TEST_F(CudaKernel, CublasLtGemmMatchesMatmulRef) {
  Gemm gemm(size_t(32) << 20);
  for (GemmType t : {GemmType::F32, GemmType::F16, GemmType::BF16}) {
    const int64_t m = 300, n = 77, k = 256;
    const DType dt = t == GemmType::F32 ? DType::F32 : t == GemmType::F16 ? DType::F16 : DType::BF16;
    const HostMatrix h = make_matrix(dt, 0, m, k, 5);
    // The GEMM sees x rounded to the weight type; the reference gets the same rounding.
    std::vector<float> x = randn(size_t(n * k), 6);
    std::vector<uint16_t> xh(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (t == GemmType::F16) x[i] = f16_to_f32(xh[i] = f32_to_f16(x[i]));
      if (t == GemmType::BF16) x[i] = bf16_to_f32(xh[i] = f32_to_bf16(x[i]));
    }
    std::vector<float> want(size_t(n * m));
    cpu::matmul_ref(h.view, x.data(), n, want.data());
    DeviceBuffer dw = to_device(h.bytes);
    DeviceBuffer dx = t == GemmType::F32 ? to_device(x) : to_device(xh);
    // Output written at a column offset and ld > m, as the stacked qkv buffer is; beta = 1 adds.
    const int64_t ldd = m + 13, off = 5;
    const std::vector<float> y0 = randn(size_t(n * ldd), 8);
    DeviceBuffer dy = to_device(y0);
    gemm.run(t, m, n, k, dw.get(), k, dx.get(), k, dy.as<float>() + off, ldd, 1.f, st_);
    sync();
    const std::vector<float> got = to_host<float>(dy, size_t(n * ldd));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t r = 0; r < m; ++r) {
        const float w = want[size_t(b * m + r)] + y0[size_t(b * ldd + off + r)];
        ASSERT_NEAR(got[size_t(b * ldd + off + r)], w, 1e-3 * (1 + std::fabs(w))) << b << "," << r;
      }
  }
}

// ---------------------------------------------------------------- element-wise

TEST_F(CudaKernel, RmsNormSwigluConvertMatchCpu) {
  for (int64_t dim : {64, 172, 4096}) {
    const std::vector<float> x = randn(size_t(3 * dim), 1, 3.f), w = randn(size_t(dim), 2);
    std::vector<float> want(x.size());
    cpu::rmsnorm(want.data(), x.data(), w.data(), 3, dim, 1e-5f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dy(x.size() * 4);
    ASSERT_EQ(launch_rmsnorm(dx.as<float>(), dw.as<float>(), 3, dim, 1e-5f, dy.as<float>(), st_), cudaSuccess);
    sync();
    const std::vector<float> got = to_host<float>(dy, x.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
  }
  const int64_t n = 3, hidden = 172;
  const std::vector<float> gu = randn(size_t(n * 2 * hidden), 3, 4.f);
  std::vector<float> want(size_t(n * hidden)), up(size_t(n * hidden));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < hidden; ++j) {
      want[size_t(r * hidden + j)] = gu[size_t(r * 2 * hidden + j)];
      up[size_t(r * hidden + j)] = gu[size_t(r * 2 * hidden + hidden + j)];
    }
  cpu::silu_mul(want.data(), up.data(), n * hidden);
  DeviceBuffer dgu = to_device(gu), dh(want.size() * 4);
  ASSERT_EQ(launch_gated(dgu.as<float>(), n, hidden, false, dh.as<float>(), st_), cudaSuccess);
  sync();
  const std::vector<float> h = to_host<float>(dh, want.size());
  for (size_t i = 0; i < h.size(); ++i) ASSERT_NEAR(h[i], want[i], 1e-6 * (1 + std::fabs(want[i])));
  // GELU: the device tanh may differ from the host's in the last bit, which
  // the f16 rounding of the result almost always absorbs.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < hidden; ++j) want[size_t(r * hidden + j)] = gu[size_t(r * 2 * hidden + j)];
  cpu::gelu_tanh_mul(want.data(), up.data(), n * hidden);
  ASSERT_EQ(launch_gated(dgu.as<float>(), n, hidden, true, dh.as<float>(), st_), cudaSuccess);
  sync();
  const std::vector<float> hg = to_host<float>(dh, want.size());
  for (size_t i = 0; i < hg.size(); ++i) ASSERT_NEAR(hg[i], want[i], 1e-3 * (1 + std::fabs(want[i])));

  std::vector<float> v = randn(1001, 4, 100.f);
  v[0] = 70000.f;  // f16 overflow -> inf, as the CPU conversion
  DeviceBuffer dv = to_device(v), dc(v.size() * 2);
  for (bool bf16 : {false, true}) {
    ASSERT_EQ(launch_convert(dv.as<float>(), int64_t(v.size()), dc.as<uint16_t>(), bf16, st_), cudaSuccess);
    sync();
    const std::vector<uint16_t> c = to_host<uint16_t>(dc, v.size());
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(c[i], bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]));
  }
}

// The block-spec extras: QK-norm (per head, strided rows), biases, the
// residual with bias and post-norm, embedding scale and final softcap.
TEST_F(CudaKernel, SpecElementwiseKernelsMatchCpu) {
  const int64_t n = 5, n_heads = 3, hd = 32, ld = n_heads * hd + 24;  // heads inside a wider qkv row
  const float eps = 1e-6f;
  std::vector<float> x = randn(size_t(n * ld), 21, 2.f);
  const std::vector<float> w = randn(size_t(hd), 22);
  std::vector<float> want = x;
  for (int64_t r = 0; r < n; ++r) cpu::rmsnorm(&want[size_t(r * ld)], &x[size_t(r * ld)], w.data(), n_heads, hd, eps);
  DeviceBuffer dx = to_device(x), dw = to_device(w);
  ASSERT_EQ(launch_head_rmsnorm(dx.as<float>(), ld, n, int32_t(n_heads), int32_t(hd), dw.as<float>(), eps, st_),
            cudaSuccess);
  sync();
  std::vector<float> got = to_host<float>(dx, x.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;

  const std::vector<float> b = randn(size_t(ld - 8), 23);
  want = x;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < ld - 8; ++c) want[size_t(r * ld + c)] += b[size_t(c)];
  DeviceBuffer dx2 = to_device(x), db = to_device(b);
  ASSERT_EQ(launch_add_bias(dx2.as<float>(), ld, n, db.as<float>(), ld - 8, st_), cudaSuccess);
  sync();
  got = to_host<float>(dx2, x.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;

  const int64_t dim = 640;
  const std::vector<float> y = randn(size_t(n * dim), 24, 3.f), res = randn(size_t(n * dim), 25),
                           bias = randn(size_t(dim), 26), nw = randn(size_t(dim), 27);
  for (int variant = 0; variant < 3; ++variant) {  // bias only, norm only, both
    const bool with_bias = variant != 1, with_norm = variant != 0;
    std::vector<float> o = y, expect = res;
    if (with_bias) cpu::add_bias(o.data(), bias.data(), n, dim);
    if (with_norm) cpu::rmsnorm(o.data(), o.data(), nw.data(), n, dim, eps);
    for (size_t i = 0; i < o.size(); ++i) expect[i] += o[i];
    DeviceBuffer dy = to_device(y), dres = to_device(res), dbias = to_device(bias), dnw = to_device(nw);
    ASSERT_EQ(launch_residual(dy.as<float>(), with_bias ? dbias.as<float>() : nullptr,
                              with_norm ? dnw.as<float>() : nullptr, n, dim, eps, dres.as<float>(), st_),
              cudaSuccess);
    sync();
    got = to_host<float>(dres, expect.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], expect[i], 1e-5 * (1 + std::fabs(expect[i]))) << "variant " << variant << " " << i;
  }

  std::vector<float> v = randn(3000, 28, 40.f), sv = v, cv = v;
  for (float& e : sv) e *= 25.2982f;
  cpu::softcap(cv.data(), int64_t(cv.size()), 30.f);
  DeviceBuffer ds = to_device(v), dc = to_device(v);
  ASSERT_EQ(launch_scale(ds.as<float>(), int64_t(v.size()), 25.2982f, st_), cudaSuccess);
  ASSERT_EQ(launch_softcap(dc.as<float>(), int64_t(v.size()), 30.f, st_), cudaSuccess);
  sync();
  const std::vector<float> gs = to_host<float>(ds, v.size()), gc = to_host<float>(dc, v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(gs[i], sv[i]) << i;
    ASSERT_NEAR(gc[i], cv[i], 1e-5 * (1 + std::fabs(cv[i]))) << i;
  }
}

TEST_F(CudaKernel, ArgmaxAndTopKMatchTheSampler) {
  const int64_t rows = 3, vocab = 50000;
  std::mt19937 rng(5);
  std::vector<float> logits(size_t(rows * vocab));
  for (float& v : logits) v = float(int(rng() % 200)) * 0.25f;  // many ties
  logits[7] = NAN;                                             // counts as -inf
  DeviceBuffer dl = to_device(logits), da(size_t(rows) * 4);
  ASSERT_EQ(launch_argmax(dl.as<float>(), rows, vocab, da.as<int32_t>(), st_), cudaSuccess);
  sync();
  const std::vector<int32_t> am = to_host<int32_t>(da, size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits.data() + r * vocab;
    // The sampler's greedy rule (largest, lowest id on ties), with NaN as -inf.
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i) {
      const float a = std::isnan(l[i]) ? -INFINITY : l[i], b = std::isnan(l[best]) ? -INFINITY : l[best];
      if (a > b) best = i;
    }
    EXPECT_EQ(am[size_t(r)], best) << "row " << r;
  }
  for (int k : {1, 40, 256}) {
    const int64_t sc = topk_scratch_elems(rows, vocab, k);
    DeviceBuffer sv(size_t(sc) * 4), si(size_t(sc) * 4), ov(size_t(rows * k) * 4), oi(size_t(rows * k) * 4);
    ASSERT_EQ(launch_topk(dl.as<float>(), rows, vocab, k, sv.as<float>(), si.as<int32_t>(), ov.as<float>(),
                          oi.as<int32_t>(), st_),
              cudaSuccess);
    sync();
    const std::vector<int32_t> ids = to_host<int32_t>(oi, size_t(rows * k));
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits.data() + r * vocab;
      std::vector<int32_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return logit_better(l[a], a, l[b], b);
      });
      for (int i = 0; i < k; ++i) ASSERT_EQ(ids[size_t(r * k + i)], order[size_t(i)]) << "k " << k << " rank " << i;
    }
  }
}

// ---------------------------------------------------------------- KV pages on the device

// Host pages (kv::PagePool) mirrored byte for byte into one device buffer.
struct DevPages {
  DeviceBuffer mem, table;
  std::vector<uint8_t*> ptrs;
  size_t pb = 0;

  DevPages(const kv::Geometry& g, llm_kv_type t, size_t n, std::mt19937& rng) {
    pb = kv::page_bytes(g, t);
    mem = DeviceBuffer(pb * (n + 3));
    std::vector<size_t> slot(n + 3);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);  // table order != memory order
    for (size_t i = 0; i < n; ++i) ptrs.push_back(mem.as<uint8_t>() + slot[i] * pb);
    table = to_device(ptrs);
  }
  void upload(const std::vector<kv::Page*>& host) {
    for (size_t i = 0; i < ptrs.size(); ++i)
      ASSERT_EQ(cudaMemcpy(ptrs[i], host[i]->data, pb, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download(const std::vector<kv::Page*>& host) {
    for (size_t i = 0; i < ptrs.size(); ++i)
      ASSERT_EQ(cudaMemcpy(host[i]->data, ptrs[i], pb, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

KvGeom dev_geom(const kv::Geometry& g) { return KvGeom{g.n_layers, g.n_kv_heads, g.head_dim, g.page_tokens}; }

TEST_F(CudaKernel, RopeAndKvStoreMatchCpu) {
  struct RopeCase {
    llm_kv_type kt;
    int32_t kind, rope_dims;
    float mscale;
  };
  for (const RopeCase rc : {RopeCase{LLM_KV_F16, 0, 16, 1.0f}, RopeCase{LLM_KV_F32, 0, 16, 1.0f},
                            RopeCase{LLM_KV_F16, 1, 12, 1.2f}, RopeCase{LLM_KV_F32, 1, 16, 1.0f}}) {
    SCOPED_TRACE("kind " + std::to_string(rc.kind) + " rope_dims " + std::to_string(rc.rope_dims));
    const llm_kv_type kt = rc.kt;
    std::vector<float> inv_freq(size_t(rc.rope_dims / 2));
    for (size_t j = 0; j < inv_freq.size(); ++j) inv_freq[j] = 1.0f / std::pow(10000.f, float(2 * j) / float(rc.rope_dims));
    const cpu::Rope rope{rc.kind, 16, rc.rope_dims, inv_freq.data(), rc.mscale};
    DeviceBuffer dfreq = to_device(inv_freq);
    kv::Geometry g;
    g.n_layers = 2;
    g.n_kv_heads = 2;
    g.head_dim = 16;
    g.page_tokens = 4;
    const int n_heads = 8, hd = 16;
    const int64_t n = 6, p0 = 9, ld = (n_heads + 2 * 2) * hd;
    kv::PagePool pool(g, uint64_t(1) << 26);
    std::vector<kv::Page*> host, dev_copy;
    const size_t np = size_t((p0 + n + 3) / 4);
    ASSERT_TRUE(pool.acquire(kt, np, host));
    ASSERT_TRUE(pool.acquire(kt, np, dev_copy));
    std::mt19937 rng(3);
    DevPages dp(g, kt, np, rng);
    std::vector<uint8_t> zero(dp.pb, 0);
    for (kv::Page* p : host) std::memcpy(p->data, zero.data(), dp.pb);
    dp.upload(host);

    const std::vector<float> qkv = randn(size_t(n * ld), 11);
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
    // CPU: rope q and k, store k and v.
    std::vector<float> q(size_t(n * n_heads * hd)), k(size_t(n * 2 * hd)), v(size_t(n * 2 * hd));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(qkv.begin() + i * ld, n_heads * hd, q.begin() + i * n_heads * hd);
      std::copy_n(qkv.begin() + i * ld + n_heads * hd, 2 * hd, k.begin() + i * 2 * hd);
      std::copy_n(qkv.begin() + i * ld + (n_heads + 2) * hd, 2 * hd, v.begin() + i * 2 * hd);
    }
    cpu::rope(q.data(), n, n_heads, rope, pos.data());
    cpu::rope(k.data(), n, 2, rope, pos.data());
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < 2; ++h) {
        kv::store_row(g, host[size_t(pos[size_t(i)] / 4)], 1, 0, h, pos[size_t(i)] % 4, k.data() + (i * 2 + h) * hd);
        kv::store_row(g, host[size_t(pos[size_t(i)] / 4)], 1, 1, h, pos[size_t(i)] % 4, v.data() + (i * 2 + h) * hd);
      }
    DeviceBuffer dqkv = to_device(qkv), dpos = to_device(pos);
    RopeKvArgs a;
    a.qkv = dqkv.as<float>();
    a.ld = ld;
    a.n = n;
    a.n_heads = n_heads;
    a.n_kv_heads = 2;
    a.head_dim = hd;
    a.rope = RopeSpec{dfreq.as<float>(), rc.kind, rc.rope_dims, rc.mscale};
    a.pos = dpos.as<int32_t>();
    a.pages = PageTables{dp.table.as<uint8_t*>(), int32_t(np), n};
    a.geom = dev_geom(g);
    a.layer = 1;
    a.kv_f32 = kt == LLM_KV_F32;
    ASSERT_EQ(launch_rope_store_kv(a, st_), cudaSuccess);
    sync();
    const std::vector<float> got = to_host<float>(dqkv, qkv.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n_heads * hd; ++j)
        ASSERT_NEAR(got[size_t(i * ld + j)], q[size_t(i * n_heads * hd + j)], 1e-5);
    dp.download(dev_copy);
    std::vector<float> a_row(static_cast<size_t>(hd)), b_row(static_cast<size_t>(hd));
    for (int64_t t = 0; t < p0 + n; ++t)
      for (int l = 0; l < 2; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < 2; ++h) {
            kv::load_row(g, dev_copy[size_t(t / 4)], l, kvi, h, int32_t(t % 4), a_row.data());
            kv::load_row(g, host[size_t(t / 4)], l, kvi, h, int32_t(t % 4), b_row.data());
            for (int d = 0; d < hd; ++d) ASSERT_NEAR(a_row[size_t(d)], b_row[size_t(d)], 2e-3 * (1 + std::fabs(b_row[size_t(d)])));
          }
    for (kv::Page* p : host) pool.release(p);
    for (kv::Page* p : dev_copy) pool.release(p);
  }
}

TEST_F(CudaKernel, AttentionPrefillTilesAndDecodeSplitsMatchCpu) {
  struct Case {
    int n_heads, n_kv, hd, pt;
    int64_t p0, n;
    bool decode;
    llm_kv_type kv;
    int32_t window = 0;
    float softcap = 0.f, scale = 0.f;
  };
  const Case cases[] = {
      {8, 2, 16, 16, 0, 37, false, LLM_KV_F16},   {8, 2, 16, 16, 40, 70, false, LLM_KV_F32},
      {4, 4, 8, 5, 100, 3, true, LLM_KV_F16},     {32, 8, 128, 16, 300, 2, true, LLM_KV_F16},
      {6, 1, 32, 7, 700, 1, true, LLM_KV_F32},    {2, 2, 4, 16, 20, 5, false, LLM_KV_F16},  // head_dim 4: scalar loads
      {32, 8, 128, 16, 0, 512, false, LLM_KV_F16},
      // sliding windows, softcaps and query scales (Gemma 2 / 3)
      {8, 4, 32, 16, 0, 70, false, LLM_KV_F16, 24, 50.f, 0.0625f},
      {8, 4, 32, 16, 100, 40, false, LLM_KV_F32, 8, 0.f, 0.f},
      {4, 1, 256, 16, 0, 600, false, LLM_KV_F16, 512, 0.f, 0.0625f},  // Gemma 3 270M shape, prompt past the window
      {4, 1, 256, 16, 1500, 3, true, LLM_KV_F16, 512, 0.f, 0.0625f},
      {4, 2, 16, 16, 900, 2, true, LLM_KV_F32, 1, 30.f, 0.f},
  };
  std::mt19937 rng(21);
  for (const Case& c : cases) {
    SCOPED_TRACE("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) + " hd " + std::to_string(c.hd) +
                 " p0 " + std::to_string(c.p0) + " n " + std::to_string(c.n) + (c.decode ? " decode" : " prefill"));
    kv::Geometry g;
    g.n_layers = 2;
    g.n_kv_heads = c.n_kv;
    g.head_dim = c.hd;
    g.page_tokens = c.pt;
    kv::PagePool pool(g, uint64_t(1) << 32);
    const int64_t len = c.p0 + c.n;
    const size_t np = size_t((len + c.pt - 1) / c.pt);
    std::vector<kv::Page*> pages;
    ASSERT_TRUE(pool.acquire(c.kv, np, pages));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> row(size_t(c.hd));
    for (int64_t t = 0; t < len; ++t)
      for (int l = 0; l < 2; ++l)
        for (int kvi = 0; kvi < 2; ++kvi)
          for (int h = 0; h < c.n_kv; ++h) {
            for (float& x : row) x = nd(rng);
            kv::store_row(g, pages[size_t(t / c.pt)], l, kvi, h, int32_t(t % c.pt), row.data());
          }
    const std::vector<float> q = randn(size_t(c.n * c.n_heads * c.hd), 5, 2.f);
    std::vector<float> want(q.size());
    std::vector<const kv::Page*> cp(pages.begin(), pages.end());
    cpu::AttentionArgs ca;
    ca.geom = &g;
    ca.pages = cp.data();
    ca.layer = 1;
    ca.n_heads = c.n_heads;
    ca.q = q.data();
    ca.n = c.n;
    ca.p0 = c.p0;
    ca.out = want.data();
    ca.window = c.window;
    ca.softcap = c.softcap;
    ca.scale = c.scale;
    std::vector<std::vector<float>> scratch;
    cpu::attention(ca, scratch, nullptr);

    DevPages dp(g, c.kv, np, rng);
    dp.upload(pages);
    // Decode rows are separate "sequences" here sharing one page table.
    std::vector<uint8_t*> tables;
    for (int64_t r = 0; r < (c.decode ? c.n : 1); ++r) tables.insert(tables.end(), dp.ptrs.begin(), dp.ptrs.end());
    DeviceBuffer dtab = to_device(tables);
    std::vector<int32_t> pos(size_t(c.n));
    for (int64_t i = 0; i < c.n; ++i) pos[size_t(i)] = int32_t(c.p0 + i);
    DeviceBuffer dq = to_device(q), dpos = to_device(pos), dout(q.size() * 4);
    AttnArgs a;
    a.q = dq.as<float>();
    a.q_ld = int64_t(c.n_heads) * c.hd;
    a.pos = dpos.as<int32_t>();
    a.pages = PageTables{dtab.as<uint8_t*>(), int32_t(np), c.decode ? 1 : c.n};
    a.geom = dev_geom(g);
    a.layer = 1;
    a.kv_f32 = c.kv == LLM_KV_F32;
    a.n_heads = c.n_heads;
    a.scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(float(c.hd));
    a.softcap = c.softcap;
    a.window = c.window;
    a.n_rows = c.n;
    a.out = dout.as<float>();
    a.out_ld = a.q_ld;
    DeviceBuffer pml, pacc;
    if (c.decode) {
      const SplitPlan sp = plan_decode_splits(int64_t(table_bucket(int64_t(np))) * c.pt, int32_t(c.n), c.n_kv, sms_);
      a.rows_per_block = 1;
      a.split_tokens = sp.split_tokens;
      a.n_splits = sp.n_splits;
      pml = DeviceBuffer(size_t(c.n * c.n_heads * sp.n_splits * 2) * 4);
      pacc = DeviceBuffer(size_t(c.n * c.n_heads * sp.n_splits * c.hd) * 4);
      a.part_ml = pml.as<float>();
      a.part_acc = pacc.as<float>();
    } else {
      a.rows_per_block = prefill_rows_per_block(c.n_heads / c.n_kv, c.hd);
    }
    ASSERT_EQ(launch_attention(a, st_), cudaSuccess);
    sync();
    const std::vector<float> got = to_host<float>(dout, q.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
    for (kv::Page* p : pages) pool.release(p);
  }
}

TEST_F(CudaKernel, KvShiftMatchesRowByRowEviction) {
  kv::Geometry g;
  g.n_layers = 2;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.page_tokens = 8;
  const int32_t len = 50, n_keep = 4, n_discard = 7;
  kv::PagePool pool(g, uint64_t(1) << 24);
  const size_t np = 7;
  std::vector<kv::Page*> pages, got;
  ASSERT_TRUE(pool.acquire(LLM_KV_F16, np, pages));
  ASSERT_TRUE(pool.acquire(LLM_KV_F16, np, got));
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
  DevPages dp(g, LLM_KV_F16, np, rng);
  dp.upload(pages);
  KvShiftArgs a;
  a.table = dp.table.as<uint8_t*>();
  a.geom = dev_geom(g);
  a.first_moved = n_keep + n_discard;
  a.n_moved = len - n_keep - n_discard;
  a.delta = n_discard;
  // NeoX pairs over 6 of 8 dimensions, a table per layer (as the backend's).
  const int32_t rope_dims = 6;
  std::vector<float> table(size_t(2 * rope_dims / 2));
  for (int l = 0; l < 2; ++l)
    for (int j = 0; j < rope_dims / 2; ++j)
      table[size_t(l * rope_dims / 2 + j)] = 1.0f / std::pow(l == 0 ? 1e4f : 1e6f, float(2 * j) / float(rope_dims));
  DeviceBuffer dtable = to_device(table);
  a.inv_freq = dtable.as<float>();
  a.rope_kind = 1;
  a.rope_dims = rope_dims;
  ASSERT_EQ(launch_kv_shift(a, st_), cudaSuccess);
  sync();
  dp.download(got);
  std::vector<float> want(8), have(8);
  for (int32_t dst = n_keep; dst < len - n_discard; ++dst)
    for (int l = 0; l < 2; ++l)
      for (int kvi = 0; kvi < 2; ++kvi)
        for (int h = 0; h < 2; ++h) {
          const int32_t src = dst + n_discard;
          kv::load_row(g, pages[size_t(src / 8)], l, kvi, h, src % 8, want.data());
          const cpu::Rope r{1, 8, rope_dims, table.data() + l * rope_dims / 2, 1.0f};
          if (kvi == 0) cpu::rope_head(want.data(), r, -int64_t(n_discard));
          kv::load_row(g, got[size_t(dst / 8)], l, kvi, h, dst % 8, have.data());
          for (int d = 0; d < 8; ++d) ASSERT_NEAR(have[size_t(d)], want[size_t(d)], 2e-3 * (1 + std::fabs(want[size_t(d)])));
        }
  for (int32_t t = 0; t < n_keep; ++t) {  // kept prefix untouched
    kv::load_row(g, pages[0], 0, 0, 0, t, want.data());
    kv::load_row(g, got[0], 0, 0, 0, t, have.data());
    for (int d = 0; d < 8; ++d) ASSERT_EQ(have[size_t(d)], want[size_t(d)]);
  }
  for (kv::Page* p : pages) pool.release(p);
  for (kv::Page* p : got) pool.release(p);
}

}  // namespace
