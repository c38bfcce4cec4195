// The CUDA forward's orchestration (backend/cuda/block_pass.h: which step
// runs when, on which rows and buffers, with which layer's fields) run on
// the host, with an executor whose steps are plain loops over the kernels'
// own per-element functions (kernel_math.h), against the CPU forward of
// every model family: llama, Llama 3 RoPE factors, Qwen 2 biases (and
// YaRN), Qwen 3 QK-norm, Gemma 2 softcaps and post-norms, Gemma 3 windows
// and per-layer RoPE bases, Phi-3 fused matrices and partial rotary (and
// LongRoPE). The kernels themselves are checked one by one elsewhere
// (kernel_math_cpu_test.cpp on the CPU, kernels_cuda_test.cpp on a GPU);
// this test is what shows, without a GPU, that the device pass puts them
// together as the CPU forward does.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/block_pass.h"
#include "backend/cuda/kernel_math.h"
#include "engine/session.h"
#include "model/model.h"
#include "relative_error.h"

namespace {

using namespace llm;
using llm::testing::relative_error;

struct HostLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* qkv_bias = nullptr;
  const float* bo = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* post_attn_norm = nullptr;
  const float* post_ffn_norm = nullptr;
  const float* inv_freq = nullptr;
  int32_t window = 0;
  std::vector<cpu::WeightView> qkv, gate_up;
  cpu::WeightView wo, down;
  std::vector<float> bias_storage;
};

// block_pass's executor on the host: one sequence, f32 K/V rows per layer
// and position, positions p0, p0 + 1, ... for the rows of a pass.
struct HostExec {
  using Layer = HostLayer;
  const Model& m;
  const ModelConfig& c = m.config();
  const int64_t hd = c.head_dim, q_dim = int64_t(c.n_heads) * hd, kv_dim = int64_t(c.n_kv_heads) * hd;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  static constexpr int64_t kRows = 64;
  std::vector<float> bx = std::vector<float>(size_t(kRows * c.dim)), bxb = bx,
                     bqkv = std::vector<float>(size_t(kRows * qkv_dim)), batt = std::vector<float>(size_t(kRows * q_dim)),
                     bgu = std::vector<float>(size_t(kRows * 2 * c.hidden_dim)),
                     bh = std::vector<float>(size_t(kRows * c.hidden_dim)),
                     blogits = std::vector<float>(size_t(c.vocab_size));
  float *x = bx.data(), *xb = bxb.data(), *qkv = bqkv.data(), *att = batt.data(), *gu = bgu.data(), *h = bh.data(),
        *logits = blogits.data();
  const float* output_norm = m.output_norm();
  const cpu::WeightView& output = m.output();
  // kv[layer][pos * 2 * kv_dim ..]: K row, then V row
  std::vector<std::vector<float>> kv = std::vector<std::vector<float>>(size_t(c.n_layers));
  std::vector<int32_t> tokens;
  int64_t p0 = 0;

  explicit HostExec(const Model& model) : m(model) {}

  void embed(int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) cpu::dequantize_row(m.tok_embd(), tokens[size_t(i)], out + i * c.dim);
  }
  void scale(float* v, int64_t n, float f) {
    for (int64_t i = 0; i < n; ++i) v[i] *= f;
  }
  void softcap(float* v, int64_t n, float cap) {
    for (int64_t i = 0; i < n; ++i) v[i] = cuda::softcap_value(v[i], cap);
  }
  void rmsnorm(const float* in, const float* w, int64_t rows, int64_t dim, float* out) {
    for (int64_t r = 0; r < rows; ++r) {
      float ss = 0.f;
      for (int64_t i = 0; i < dim; ++i) ss += in[r * dim + i] * in[r * dim + i];
      const float inv = cuda::rms_inv(ss, dim, c.norm_eps);
      for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = w[i] * (inv * in[r * dim + i]);
    }
  }
  void head_rmsnorm(float* v, int64_t ld, int64_t n, int32_t heads, const float* w) {
    for (int64_t r = 0; r < n; ++r)
      for (int32_t hh = 0; hh < heads; ++hh) rmsnorm(v + r * ld + hh * hd, w, 1, hd, v + r * ld + hh * hd);
  }
  void add_bias(float* y, int64_t ld, int64_t n, const float* b, int64_t cols) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < cols; ++i) y[r * ld + i] += b[i];
  }
  void linear(const cpu::WeightView& w, const float* in, int64_t n, float* y, int64_t ldy, float beta) {
    std::vector<float> t(size_t(n * w.rows));
    cpu::matmul_ref(w, in, n, t.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < w.rows; ++i) y[r * ldy + i] = t[size_t(r * w.rows + i)] + beta * y[r * ldy + i];
  }
  void linear_parts(const std::vector<cpu::WeightView>& parts, const float* in, int64_t n, float* y, int64_t ldy) {
    int64_t col = 0;
    for (const cpu::WeightView& p : parts) {
      linear(p, in, n, y + col, ldy, 0.f);
      col += p.rows;
    }
  }
  void rope_store_kv(int32_t layer, const cuda::RopeSpec& r, float* q, int64_t n) {
    std::vector<float>& cache = kv[size_t(layer)];
    cache.resize(size_t((p0 + n) * 2 * kv_dim));
    for (int64_t i = 0; i < n; ++i) {
      float* row = q + i * qkv_dim;
      for (int32_t hh = 0; hh < c.n_heads + c.n_kv_heads; ++hh)
        for (int32_t j = 0; j < r.rope_dims / 2; ++j)
          cuda::rope_spec_pair(row + hh * hd, r.kind, r.rope_dims, r.inv_freq, r.mscale, j, p0 + i);
      std::copy(row + q_dim, row + qkv_dim, cache.begin() + std::ptrdiff_t((p0 + i) * 2 * kv_dim));
    }
  }
  void attention(int32_t layer, const cuda::AttnSpec& a, const float* q, int64_t n, float* out) {
    const std::vector<float>& cache = kv[size_t(layer)];
    const int32_t group = c.n_heads / c.n_kv_heads;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = p0 + i;
      for (int32_t hh = 0; hh < c.n_heads; ++hh) {
        const float* qv = q + i * qkv_dim + hh * hd;
        const int64_t kvh = hh / group;
        std::vector<float> s(size_t(pos + 1), -INFINITY);
        float mx = -INFINITY;
        for (int64_t t = 0; t <= pos; ++t) {
          if (!cuda::attn_key_visible(t, pos, a.window)) continue;
          const float* k = &cache[size_t(t * 2 * kv_dim + kvh * hd)];
          float dot = 0.f;
          for (int64_t d = 0; d < hd; ++d) dot += qv[d] * a.scale * k[d];
          s[size_t(t)] = a.softcap > 0 ? cuda::softcap_value(dot, a.softcap) : dot;
          mx = std::max(mx, s[size_t(t)]);
        }
        double sum = 0;
        std::vector<double> acc(size_t(hd), 0.0);
        for (int64_t t = 0; t <= pos; ++t) {
          const double p = cuda::exp_or_zero(s[size_t(t)], mx);
          sum += p;
          const float* v = &cache[size_t(t * 2 * kv_dim + kv_dim + kvh * hd)];
          for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += p * v[d];
        }
        for (int64_t d = 0; d < hd; ++d) out[i * q_dim + hh * hd + d] = float(acc[size_t(d)] / sum);
      }
    }
  }
  void residual(const float* y, const float* bias, const float* w, int64_t rows, float* out) {
    std::vector<float> o(size_t(c.dim));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < c.dim; ++i) o[size_t(i)] = bias ? y[r * c.dim + i] + bias[i] : y[r * c.dim + i];
      if (w) rmsnorm(o.data(), w, 1, c.dim, o.data());
      for (int64_t i = 0; i < c.dim; ++i) out[r * c.dim + i] += o[size_t(i)];
    }
  }
  void gated(const float* in, int64_t n, bool gelu, float* out) {
    const int64_t hidden = c.hidden_dim;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < hidden; ++j) {
        const float g = in[r * 2 * hidden + j], u = in[r * 2 * hidden + hidden + j];
        out[r * hidden + j] = gelu ? cuda::gelu_tanh_mul(g, u) : cuda::silu_mul(g, u);
      }
  }
};

// The device's per-layer upload (backend.cpp): stacked or separate parts,
// one q|k|v bias vector with zeros for a missing part.
std::vector<HostLayer> host_layers(const Model& m) {
  const ModelConfig& c = m.config();
  const int64_t q_dim = int64_t(c.n_heads) * c.head_dim, kv_dim = int64_t(c.n_kv_heads) * c.head_dim;
  std::vector<HostLayer> out(m.layers().size());
  for (size_t l = 0; l < out.size(); ++l) {
    const LayerWeights& w = m.layers()[l];
    HostLayer& d = out[l];
    d.attn_norm = w.attn_norm;
    d.ffn_norm = w.ffn_norm;
    d.qkv = {w.wq, w.wk, w.wv};
    d.wo = w.wo;
    d.gate_up = {w.w_gate, w.w_up};
    d.down = w.w_down;
    if (w.bq || w.bk || w.bv) {
      d.bias_storage.assign(size_t(q_dim + 2 * kv_dim), 0.0f);
      if (w.bq) std::copy(w.bq, w.bq + q_dim, d.bias_storage.begin());
      if (w.bk) std::copy(w.bk, w.bk + kv_dim, d.bias_storage.begin() + q_dim);
      if (w.bv) std::copy(w.bv, w.bv + kv_dim, d.bias_storage.begin() + q_dim + kv_dim);
      d.qkv_bias = d.bias_storage.data();
    }
    d.bo = w.bo;
    d.q_norm = w.q_norm;
    d.k_norm = w.k_norm;
    d.post_attn_norm = w.post_attn_norm;
    d.post_ffn_norm = w.post_ffn_norm;
    d.inv_freq = w.inv_freq;
    d.window = w.window;
  }
  return out;
}

class BlockPass : public ::testing::TestWithParam<const char*> {};

// A 45-token sequence (past every Gemma window of 8) as the device would run
// it: prompt chunks of 7 rows (windows straddle chunks), then one-row decode
// passes; after each pass the last row's logits against a CPU session given
// the same tokens.
TEST_P(BlockPass, HostRunOfTheDevicePassMatchesTheCpuForward) {
  const std::string name = GetParam();
  LoadOptions o;
  o.device = LLM_DEVICE_CPU;
  o.n_threads = 1;
  o.huge_pages = false;
  o.reference_math = true;
  const std::unique_ptr<Model> m = Model::load(std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".gguf", o);
  const std::vector<HostLayer> layers = host_layers(*m);
  SessionOptions so;
  so.kv_type = LLM_KV_F32;
  Session cpu_session(*m, so);
  HostExec e(*m);
  std::vector<int32_t> toks;
  for (int i = 0; i < 45; ++i) toks.push_back(3 + (i * 37) % 500);
  // GELU rounds its input and result through f16 (the CPU's numerics, which
  // the kernels share), so a last-bit difference upstream (another order of
  // a sum) can move a value by 2^-11 of itself; without GELU the host pass
  // and the CPU forward agree to a few ulps.
  const double tol = m->config().spec.act == Activation::GeluTanh ? 1e-3 : 2e-5;
  double worst = 0;
  for (size_t at = 0; at < toks.size();) {
    const size_t n = at < 28 ? std::min<size_t>(7, 28 - at) : 1;  // 4 chunks of 7, then decode steps
    e.tokens.assign(toks.begin() + std::ptrdiff_t(at), toks.begin() + std::ptrdiff_t(at + n));
    e.p0 = int64_t(at);
    cuda::block_pass(e, m->config(), layers, int64_t(n), int64_t(n) - 1, 1, nullptr);
    cpu_session.prefill(toks.data() + at, n);
    const float* want = cpu_session.logits();
    const std::vector<float> ref(want, want + m->config().vocab_size);
    const double err = relative_error(e.logits, ref);
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << name << ": position " << at + n - 1;
    at += n;
  }
  std::printf("%s: worst max|diff| / range over 45 positions = %.2e\n", name.c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Families, BlockPass,
                         ::testing::Values("llama", "llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
                                           "qwen2_yarn", "phi3_longrope"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
