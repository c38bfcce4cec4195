// Quantization-aware distillation: an f32 forward and backward pass of the
// Llama model, a straight-through estimator for the quantized matrices, and
// Adam. See distill.h for the method.
#include "convert/distill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "core/silu.h"
#include "core/thread_pool.h"
#include "format/family_spec.h"
#include "quant/quant.h"
#include "convert/awq.h"
#include "convert/ggml_quantize.h"

namespace llm {
namespace {

// ---------------------------------------------------------------------------
// Dense f32 kernels (row-major; a matrix W is [out, in]).

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// log(sum_e exp(z[e])), in double, shifted by the largest z.
double log_sum_exp(const float* z, int64_t n) {
  float mx = z[0];
  for (int64_t e = 1; e < n; ++e) mx = std::max(mx, z[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) sum += std::exp(double(z[e] - mx));
  return double(mx) + std::log(sum);
}

cpu::WeightView f32_view(const float* W, int64_t rows, int64_t cols) {
  cpu::WeightView v;
  v.dtype = DType::F32;
  v.rows = rows;
  v.cols = cols;
  v.data = reinterpret_cast<const uint8_t*>(W);
  v.row_bytes = size_t(cols) * 4;
  return v;
}

// dst[cols, rows] = src[rows, cols]^T
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// The three products of a linear layer y = x W^T, on the CPU backend's f32
// matmul (SIMD where the CPU has it; one thread: the pass runs a sequence per
// thread). W^T is given pre-transposed (WT [in, out]); `tmp` is scratch.
// y[n, out] = x[n, in] W^T
void mm(const float* x, const float* W, float* y, int64_t n, int64_t in, int64_t out) {
  cpu::matmul(f32_view(W, out, in), x, n, y, nullptr, cpu::MatmulMode::Fast);
}

// dx[n, in] += dy[n, out] W
void mm_dx(const float* dy, const float* WT, float* dx, int64_t n, int64_t in, int64_t out, std::vector<float>& tmp) {
  tmp.resize(size_t(n * in));
  cpu::matmul(f32_view(WT, in, out), dy, n, tmp.data(), nullptr, cpu::MatmulMode::Fast);
  for (int64_t e = 0; e < n * in; ++e) dx[e] += tmp[size_t(e)];
}

// dW[out, in] += dy^T x
void mm_dw(const float* dy, const float* x, float* dW, int64_t n, int64_t in, int64_t out, std::vector<float>& tmp) {
  tmp.resize(size_t(n * (in + out) + in * out));
  float *xT = tmp.data(), *dyT = xT + n * in, *y = dyT + n * out;
  transpose(x, n, in, xT);
  transpose(dy, n, out, dyT);
  cpu::matmul(f32_view(xT, in, n), dyT, out, y, nullptr, cpu::MatmulMode::Fast);
  for (int64_t e = 0; e < in * out; ++e) dW[e] += y[e];
}

// y = w * x * r per row, r = 1 / sqrt(mean(x^2) + eps) kept for the backward pass.
void rms_fwd(const float* x, const float* w, float* y, float* r, int64_t n, int64_t dim, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    const float ri = 1.0f / std::sqrt(dot(xi, xi, dim) / float(dim) + eps);
    r[i] = ri;
    for (int64_t e = 0; e < dim; ++e) y[i * dim + e] = w[e] * (ri * xi[e]);
  }
}

// dx += d(y)/dx^T dy; dw += sum_i dy * x * r.
void rms_bwd(const float* dy, const float* x, const float* w, const float* r, float* dx, float* dw, int64_t n,
             int64_t dim) {
  for (int64_t i = 0; i < n; ++i) {
    const float *xi = x + i * dim, *gi = dy + i * dim;
    const float ri = r[i];
    float s = 0.0f;
    for (int64_t e = 0; e < dim; ++e) s += gi[e] * w[e] * xi[e];
    const float c = ri * ri * ri * s / float(dim);
    for (int64_t e = 0; e < dim; ++e) {
      dx[i * dim + e] += w[e] * ri * gi[e] - c * xi[e];
      dw[e] += gi[e] * ri * xi[e];
    }
  }
}

// ---------------------------------------------------------------------------
// Trained tensors.

// One trained vector with its Adam state.
struct Vec {
  std::vector<float> val, grad, m1, m2;
  float lr_scale = 1.0f;
  void init(std::vector<float> v) {
    val = std::move(v);
    grad.assign(val.size(), 0.0f);
    m1.assign(val.size(), 0.0f);
    m2.assign(val.size(), 0.0f);
    double ss = 0.0;
    for (float x : val) ss += double(x) * double(x);
    const double rms = val.empty() ? 0.0 : std::sqrt(ss / double(val.size()));
    lr_scale = rms > 1e-12 ? float(rms) : 1e-3f;
  }
};

// The codes of a quantized format: w = d * q + m, q in [qmin, qmax].
struct Codes {
  float qmin = 0, qmax = 0;
  bool has_min = false;
};
Codes codes_of(DType t) {
  switch (t) {
    case DType::Q8: return {-127.0f, 127.0f, false};
    case DType::Q4: return {-8.0f, 7.0f, false};
    default: return {0.0f, 15.0f, true};  // Q4M
  }
}

constexpr float kTinyScale = 1e-10f;

// The code of latent weight w in a group with scale d and minimum m: the one
// rounding rule that training (materialize) and storing (pack) share.
float code_of(const Codes& c, float w, float d, float m) {
  if (std::fabs(d) < kTinyScale) return 0.0f;
  return std::min(c.qmax, std::max(c.qmin, std::floor((w - m) / d + 0.5f)));
}

// Bytes of one stored group of a quantized format.
int64_t group_bytes(DType t, int64_t g) { return int64_t(dtype_row_bytes(t, g, uint32_t(g))); }

struct Param {
  std::string name;
  int64_t rows = 1, cols = 0;
  DType dtype = DType::F32;  // Q8/Q4/Q4M: trained through the estimator; F32: trained as is
  uint32_t group = 0;
  size_t off = 0;            // offset of its effective weights in the flat arrays
  Vec w, d, m;               // latent weights; per-group scale and minimum
  bool quantized() const { return dtype_is_quantized(dtype); }
  int64_t numel() const { return rows * cols; }
};

// Writes the weights the forward pass uses. fp16: round d and m as the file
// will store them (and as the result's KL is measured).
void materialize(const Param& p, float* eff, bool fp16) {
  if (!p.quantized()) {
    std::memcpy(eff, p.w.val.data(), size_t(p.numel()) * 4);
    return;
  }
  const Codes c = codes_of(p.dtype);
  const int64_t g = p.group, n = p.numel();
  for (int64_t b = 0; b < n / g; ++b) {
    float d = p.d.val[size_t(b)], m = c.has_min ? p.m.val[size_t(b)] : 0.0f;
    if (fp16) {
      d = f16_to_f32(f32_to_f16(d));
      m = f16_to_f32(f32_to_f16(m));
    }
    const float* w = &p.w.val[size_t(b * g)];
    float* y = eff + b * g;
    for (int64_t e = 0; e < g; ++e) y[e] = d * code_of(c, w[e], d, m) + m;
  }
}

// Straight-through estimator: the gradient of the effective weights (geff)
// onto the latent weights, the scales and the minimums.
void backprop_codes(Param& p, const float* geff) {
  if (!p.quantized()) {
    for (int64_t i = 0; i < p.numel(); ++i) p.w.grad[size_t(i)] += geff[i];
    return;
  }
  const Codes c = codes_of(p.dtype);
  const int64_t g = p.group, n = p.numel();
  for (int64_t b = 0; b < n / g; ++b) {
    const float d = p.d.val[size_t(b)], m = c.has_min ? p.m.val[size_t(b)] : 0.0f;
    const float* w = &p.w.val[size_t(b * g)];
    const float* gy = geff + b * g;
    float* gw = &p.w.grad[size_t(b * g)];
    double gd = 0.0, gm = 0.0;
    for (int64_t e = 0; e < g; ++e) {
      if (std::fabs(d) < kTinyScale) {
        gm += gy[e];
        continue;
      }
      const float x = (w[e] - m) / d;
      const float r = std::floor(x + 0.5f);
      if (r >= c.qmin && r <= c.qmax) {
        gw[e] += gy[e];
        gd += double(gy[e]) * double(r - x);
      } else {
        const float q = r < c.qmin ? c.qmin : c.qmax;
        gd += double(gy[e]) * double(q);
        gm += double(gy[e]);
      }
    }
    p.d.grad[size_t(b)] += float(gd);
    if (c.has_min) p.m.grad[size_t(b)] += float(gm);
  }
}

// The stored bytes of a trained quantized matrix (d, m rounded to fp16, the
// codes exactly those of materialize(..., fp16 = true)).
std::shared_ptr<std::vector<uint8_t>> pack(const Param& p) {
  const Codes c = codes_of(p.dtype);
  const int64_t g = p.group, n = p.numel(), half = g / 2;
  const int64_t hb = p.dtype == DType::Q8 ? 2 : q4_header_bytes(p.dtype), gbytes = group_bytes(p.dtype, g);
  auto out = std::make_shared<std::vector<uint8_t>>(size_t(n / g * gbytes), 0);
  for (int64_t b = 0; b < n / g; ++b) {
    uint8_t* blk = out->data() + b * gbytes;
    const uint16_t hd = f32_to_f16(p.d.val[size_t(b)]);
    const uint16_t hm = f32_to_f16(c.has_min ? p.m.val[size_t(b)] : 0.0f);
    std::memcpy(blk, &hd, 2);
    if (c.has_min) std::memcpy(blk + 2, &hm, 2);
    const float d = f16_to_f32(hd), m = c.has_min ? f16_to_f32(hm) : 0.0f;
    const float* w = &p.w.val[size_t(b * g)];
    for (int64_t e = 0; e < g; ++e) {
      const float q = code_of(c, w[e], d, m);
      if (p.dtype == DType::Q8) {
        reinterpret_cast<int8_t*>(blk + 2)[e] = int8_t(q);
      } else {
        const int nib = int(q) + (p.dtype == DType::Q4 ? 8 : 0);
        if (e < half) blk[hb + e] = uint8_t(blk[hb + e] | nib);
        else blk[hb + e - half] = uint8_t(blk[hb + e - half] | (nib << 4));
      }
    }
  }
  return out;
}

// The per-group (d, m) written in the headers of stored blocks of p's format.
void read_headers(Param& p, const uint8_t* data) {
  const Codes c = codes_of(p.dtype);
  const int64_t g = p.group, ng = p.numel() / g;
  const int64_t gbytes = group_bytes(p.dtype, g);
  std::vector<float> d(static_cast<size_t>(ng)), m(c.has_min ? static_cast<size_t>(ng) : 0);
  for (int64_t b = 0; b < ng; ++b) {
    uint16_t h;
    std::memcpy(&h, data + b * gbytes, 2);
    d[size_t(b)] = f16_to_f32(h);
    if (c.has_min) {
      std::memcpy(&h, data + b * gbytes + 2, 2);
      m[size_t(b)] = f16_to_f32(h);
    }
  }
  p.d.init(std::move(d));
  if (c.has_min) p.m.init(std::move(m));
}

// ---------------------------------------------------------------------------
// The network: indices of its parameters, and one sequence forward/backward.

struct Net {
  ModelConfig c;
  int embd = -1, output = -1, out_norm = -1;  // output == embd when tied
  struct Layer {
    int attn_norm, ffn_norm, wq, wk, wv, wo, gate, up, down;
  };
  std::vector<Layer> layers;
};

// Activations of one sequence, kept for the backward pass.
struct Tape {
  std::vector<float> x_in, x_mid, r1, h1, q, k, v, P, o, r2, h2, a, b, act;  // [layer][...]; k, v: [KVD][n]
  std::vector<float> x_out, rf, hf, z;
  std::vector<float> dx, dh, dq, dk, dv, dkT, dvT, dact, da, db, dz, dP;
  std::vector<float> cs, sn;  // RoPE table [n, head_dim / 2]
  std::vector<float> tmp;     // matmul scratch
};

void resize_tape(Tape& t, const ModelConfig& c, int64_t n) {
  const int64_t L = c.n_layers, D = c.dim, F = c.hidden_dim, QD = int64_t(c.n_heads) * c.head_dim,
                KVD = int64_t(c.n_kv_heads) * c.head_dim, V = c.vocab_size;
  auto rs = [](std::vector<float>& v, int64_t size) { v.resize(size_t(size)); };
  rs(t.x_in, L * n * D), rs(t.x_mid, L * n * D), rs(t.r1, L * n), rs(t.h1, L * n * D), rs(t.q, L * n * QD);
  rs(t.k, L * n * KVD), rs(t.v, L * n * KVD), rs(t.P, L * c.n_heads * n * n), rs(t.o, L * n * QD);
  rs(t.r2, L * n), rs(t.h2, L * n * D), rs(t.a, L * n * F), rs(t.b, L * n * F), rs(t.act, L * n * F);
  rs(t.x_out, n * D), rs(t.rf, n), rs(t.hf, n * D), rs(t.z, n * V);
  rs(t.dx, n * D), rs(t.dh, n * D), rs(t.dq, n * QD), rs(t.dk, n * KVD), rs(t.dv, n * KVD), rs(t.dact, n * F);
  rs(t.da, n * F), rs(t.db, n * F), rs(t.dz, n * V), rs(t.dP, n), rs(t.dkT, n * KVD), rs(t.dvT, n * KVD);
  rs(t.cs, n * (c.head_dim / 2)), rs(t.sn, n * (c.head_dim / 2));
  for (int64_t i = 0; i < n; ++i)
    for (int32_t e = 0; e < c.head_dim; e += 2) {
      // The engine's RoPE angles (cpu::rope), expression for expression.
      const float freq = 1.0f / std::pow(c.rope_theta, float(e) / float(c.head_dim));
      const float val = float(i) * freq;
      t.cs[size_t(i * (c.head_dim / 2) + e / 2)] = std::cos(val);
      t.sn[size_t(i * (c.head_dim / 2) + e / 2)] = std::sin(val);
    }
}

// Rotates (inverse: by the negative angle) the pairs of n rows of `heads` heads.
void rope_rows(float* x, int64_t n, int32_t heads, int32_t hd, const Tape& t, bool inverse) {
  const float sgn = inverse ? -1.0f : 1.0f;
  for (int64_t i = 0; i < n; ++i)
    for (int32_t h = 0; h < heads; ++h) {
      float* xh = x + (i * heads + h) * hd;
      for (int32_t e = 0; e < hd; e += 2) {
        const float c = t.cs[size_t(i * (hd / 2) + e / 2)], s = sgn * t.sn[size_t(i * (hd / 2) + e / 2)];
        const float v0 = xh[e], v1 = xh[e + 1];
        xh[e] = v0 * c - v1 * s;
        xh[e + 1] = v0 * s + v1 * c;
      }
    }
}

// Runs one sequence through the network with weights W (flat, offsets of
// `params`). teacher: log-probabilities [n, vocab]. Returns the sum over
// positions of KL(teacher || student). G (may be null: forward only)
// receives the gradient of (that sum * inv_total) w.r.t. the weights.
double run_sequence(const Net& net, const std::vector<Param>& params, const float* W, const float* WT,
                    const int32_t* tok, int64_t n,
                    const float* teacher, double inv_total, Tape& t, float* G) {
  const ModelConfig& c = net.c;
  const int64_t D = c.dim, F = c.hidden_dim, H = c.n_heads, KH = c.n_kv_heads, hd = c.head_dim, QD = H * hd,
                KVD = KH * hd, V = c.vocab_size, rep = H / KH;
  const float scale = 1.0f / std::sqrt(float(hd)), eps = c.norm_eps;
  auto w = [&](int idx) { return W + params[size_t(idx)].off; };
  auto wt = [&](int idx) { return WT + params[size_t(idx)].off; };
  auto g = [&](int idx) { return G + params[size_t(idx)].off; };
  resize_tape(t, c, n);
  std::vector<float>& x = t.dx;  // the residual stream during the forward pass
  for (int64_t i = 0; i < n; ++i) std::memcpy(&x[size_t(i * D)], w(net.embd) + int64_t(tok[i]) * D, size_t(D) * 4);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Net::Layer& Ly = net.layers[size_t(l)];
    float *x_in = &t.x_in[size_t(l * n * D)], *x_mid = &t.x_mid[size_t(l * n * D)], *h1 = &t.h1[size_t(l * n * D)],
          *q = &t.q[size_t(l * n * QD)], *kT = &t.k[size_t(l * n * KVD)], *vT = &t.v[size_t(l * n * KVD)],
          *P = &t.P[size_t(l * H * n * n)], *o = &t.o[size_t(l * n * QD)], *h2 = &t.h2[size_t(l * n * D)],
          *a = &t.a[size_t(l * n * F)], *b = &t.b[size_t(l * n * F)], *act = &t.act[size_t(l * n * F)];
    std::memcpy(x_in, x.data(), size_t(n * D) * 4);
    rms_fwd(x_in, w(Ly.attn_norm), h1, &t.r1[size_t(l * n)], n, D, eps);
    mm(h1, w(Ly.wq), q, n, D, QD);
    mm(h1, w(Ly.wk), t.dk.data(), n, D, KVD);
    mm(h1, w(Ly.wv), t.dv.data(), n, D, KVD);
    rope_rows(q, n, int32_t(H), int32_t(hd), t, false);
    rope_rows(t.dk.data(), n, int32_t(KH), int32_t(hd), t, false);
    // K and V are kept transposed, [KVD][n]: every loop below then runs
    // along the positions j, not along the (short) head dimension.
    transpose(t.dk.data(), n, KVD, kT);
    transpose(t.dv.data(), n, KVD, vT);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / rep;
      for (int64_t i = 0; i < n; ++i) {
        float* p = P + (h * n + i) * n;
        const float* qi = q + i * QD + h * hd;
        std::fill(p, p + i + 1, 0.0f);
        for (int64_t e = 0; e < hd; ++e) axpy(qi[e] * scale, kT + (kh * hd + e) * n, p, i + 1);
        float mx = p[0];
        for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, p[j]);
        float sum = 0.0f;
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) p[j] *= inv;
        float* oi = o + i * QD + h * hd;
        for (int64_t e = 0; e < hd; ++e) oi[e] = dot(p, vT + (kh * hd + e) * n, i + 1);
      }
    }
    mm(o, w(Ly.wo), t.dh.data(), n, QD, D);
    for (int64_t e = 0; e < n * D; ++e) x_mid[e] = x_in[e] + t.dh[size_t(e)];
    rms_fwd(x_mid, w(Ly.ffn_norm), h2, &t.r2[size_t(l * n)], n, D, eps);
    mm(h2, w(Ly.gate), a, n, D, F);
    mm(h2, w(Ly.up), b, n, D, F);
    // The engine's SiLU (core/silu.h): the student trains through the function it will run.
    for (int64_t e = 0; e < n * F; ++e) act[e] = silu::silu_mul(a[e], b[e]);
    mm(act, w(Ly.down), t.dh.data(), n, F, D);
    for (int64_t e = 0; e < n * D; ++e) x[size_t(e)] = x_mid[e] + t.dh[size_t(e)];
  }
  std::memcpy(t.x_out.data(), x.data(), size_t(n * D) * 4);
  rms_fwd(t.x_out.data(), w(net.out_norm), t.hf.data(), t.rf.data(), n, D, eps);
  mm(t.hf.data(), w(net.output), t.z.data(), n, D, V);
  // KL(teacher || softmax(z)) per position; its gradient is softmax(z) - p_teacher.
  double kl = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = &t.z[size_t(i * V)];
    const float* lt = teacher + i * V;
    const double lse = log_sum_exp(z, V);
    for (int64_t e = 0; e < V; ++e) {
      const double pt = std::exp(double(lt[e])), ls = double(z[e]) - lse;
      kl += pt * (double(lt[e]) - ls);
      t.dz[size_t(i * V + e)] = float((std::exp(ls) - pt) * inv_total);
    }
  }
  if (!G) return kl;

  // Backward.
  std::vector<float>& dx = t.dx;  // d loss / d residual stream
  std::fill(dx.begin(), dx.end(), 0.0f);
  std::fill(t.dh.begin(), t.dh.end(), 0.0f);
  mm_dx(t.dz.data(), wt(net.output), t.dh.data(), n, D, V, t.tmp);
  mm_dw(t.dz.data(), t.hf.data(), g(net.output), n, D, V, t.tmp);
  rms_bwd(t.dh.data(), t.x_out.data(), w(net.out_norm), t.rf.data(), dx.data(), g(net.out_norm), n, D);
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const Net::Layer& Ly = net.layers[size_t(l)];
    const float *x_in = &t.x_in[size_t(l * n * D)], *x_mid = &t.x_mid[size_t(l * n * D)],
                *h1 = &t.h1[size_t(l * n * D)], *q = &t.q[size_t(l * n * QD)], *kT = &t.k[size_t(l * n * KVD)],
                *vT = &t.v[size_t(l * n * KVD)], *P = &t.P[size_t(l * H * n * n)], *o = &t.o[size_t(l * n * QD)],
                *h2 = &t.h2[size_t(l * n * D)], *a = &t.a[size_t(l * n * F)], *b = &t.b[size_t(l * n * F)],
                *act = &t.act[size_t(l * n * F)];
    // x_out = x_mid + down(silu(gate h2) * up h2), h2 = norm(x_mid)
    std::fill(t.dact.begin(), t.dact.end(), 0.0f);
    mm_dx(dx.data(), wt(Ly.down), t.dact.data(), n, F, D, t.tmp);
    mm_dw(dx.data(), act, g(Ly.down), n, F, D, t.tmp);
    for (int64_t e = 0; e < n * F; ++e) {
      const float s = 1.0f / (1.0f + silu::exp(-a[e]));
      t.db[size_t(e)] = t.dact[size_t(e)] * a[e] * s;
      t.da[size_t(e)] = t.dact[size_t(e)] * b[e] * s * (1.0f + a[e] * (1.0f - s));
    }
    std::fill(t.dh.begin(), t.dh.end(), 0.0f);
    mm_dx(t.da.data(), wt(Ly.gate), t.dh.data(), n, D, F, t.tmp);
    mm_dx(t.db.data(), wt(Ly.up), t.dh.data(), n, D, F, t.tmp);
    mm_dw(t.da.data(), h2, g(Ly.gate), n, D, F, t.tmp);
    mm_dw(t.db.data(), h2, g(Ly.up), n, D, F, t.tmp);
    rms_bwd(t.dh.data(), x_mid, w(Ly.ffn_norm), &t.r2[size_t(l * n)], dx.data(), g(Ly.ffn_norm), n, D);
    // x_mid = x_in + wo(attention(q, k, v)), q/k/v from h1 = norm(x_in)
    std::vector<float>& dout = t.dq;  // d o, then reused for d q
    std::fill(dout.begin(), dout.end(), 0.0f);
    mm_dx(dx.data(), wt(Ly.wo), dout.data(), n, QD, D, t.tmp);
    mm_dw(dx.data(), o, g(Ly.wo), n, QD, D, t.tmp);
    std::vector<float> dq(static_cast<size_t>(n * QD), 0.0f);
    std::fill(t.dkT.begin(), t.dkT.end(), 0.0f);  // transposed like kT, vT
    std::fill(t.dvT.begin(), t.dvT.end(), 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = h / rep;
      for (int64_t i = 0; i < n; ++i) {
        const float* p = P + (h * n + i) * n;
        const float* doi = &dout[size_t(i * QD + h * hd)];
        float* dp = t.dP.data();  // d p_j, then d s_j
        std::fill(dp, dp + i + 1, 0.0f);
        for (int64_t e = 0; e < hd; ++e) {
          axpy(doi[e], vT + (kh * hd + e) * n, dp, i + 1);
          axpy(doi[e], p, &t.dvT[size_t((kh * hd + e) * n)], i + 1);
        }
        const float s = dot(p, dp, i + 1);
        for (int64_t j = 0; j <= i; ++j) dp[j] = p[j] * (dp[j] - s) * scale;
        const float* qi = q + i * QD + h * hd;
        float* dqi = &dq[size_t(i * QD + h * hd)];
        for (int64_t e = 0; e < hd; ++e) {
          dqi[e] += dot(dp, kT + (kh * hd + e) * n, i + 1);
          axpy(qi[e], dp, &t.dkT[size_t((kh * hd + e) * n)], i + 1);
        }
      }
    }
    transpose(t.dkT.data(), KVD, n, t.dk.data());
    transpose(t.dvT.data(), KVD, n, t.dv.data());
    rope_rows(dq.data(), n, int32_t(H), int32_t(hd), t, true);
    rope_rows(t.dk.data(), n, int32_t(KH), int32_t(hd), t, true);
    std::fill(t.dh.begin(), t.dh.end(), 0.0f);
    mm_dx(dq.data(), wt(Ly.wq), t.dh.data(), n, D, QD, t.tmp);
    mm_dx(t.dk.data(), wt(Ly.wk), t.dh.data(), n, D, KVD, t.tmp);
    mm_dx(t.dv.data(), wt(Ly.wv), t.dh.data(), n, D, KVD, t.tmp);
    mm_dw(dq.data(), h1, g(Ly.wq), n, D, QD, t.tmp);
    mm_dw(t.dk.data(), h1, g(Ly.wk), n, D, KVD, t.tmp);
    mm_dw(t.dv.data(), h1, g(Ly.wv), n, D, KVD, t.tmp);
    rms_bwd(t.dh.data(), x_in, w(Ly.attn_norm), &t.r1[size_t(l * n)], dx.data(), g(Ly.attn_norm), n, D);
  }
  for (int64_t i = 0; i < n; ++i) axpy(1.0f, &dx[size_t(i * D)], g(net.embd) + int64_t(tok[i]) * D, D);
  return kl;
}

void adam_step(Vec& v, float lr, int32_t t) {
  constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-12f;
  const float c1 = 1.0f - std::pow(b1, float(t)), c2 = 1.0f - std::pow(b2, float(t));
  const float step = lr * v.lr_scale;
  for (size_t i = 0; i < v.val.size(); ++i) {
    const float gi = v.grad[i];
    v.m1[i] = b1 * v.m1[i] + (1.0f - b1) * gi;
    v.m2[i] = b2 * v.m2[i] + (1.0f - b2) * gi * gi;
    v.val[i] -= step * (v.m1[i] / c1) / (std::sqrt(v.m2[i] / c2) + eps);
    v.grad[i] = 0.0f;
  }
}

// The trained parameters, the teacher's log-probabilities and the buffers of
// the forward/backward passes.
class Distiller {
 public:
  Distiller(const ModelSource& teacher, const ModelSource& student, const std::vector<std::vector<int32_t>>& sequences,
            const LlmConvertOptions& co, ThreadPool* pool);

  // Every parameter's effective weights (fp16: d, m as stored), then one
  // pass over every sequence, split over the threads. Returns the mean KL;
  // grad: the gradient of the effective weights lands in grads_[0].
  double pass(bool grad, bool fp16);

  Net net_;
  std::vector<Param> params_;
  std::vector<float> eff_, effT_;  // effective weights, and each matrix transposed
  std::vector<std::vector<float>> grads_;  // per thread; [0] holds the sum after pass(true)
  int64_t n_tokens_ = 0;

 private:
  const std::vector<std::vector<int32_t>>& seqs_;
  ThreadPool* pool_;
  int nth_;
  std::vector<size_t> seq_off_;
  std::vector<float> teacher_lp_;
  std::vector<Tape> tapes_;
};

Distiller::Distiller(const ModelSource& teacher, const ModelSource& student,
                     const std::vector<std::vector<int32_t>>& sequences, const LlmConvertOptions& co, ThreadPool* pool)
    : seqs_(sequences), pool_(pool), nth_(pool ? std::max(1, pool->size()) : 1) {
  const ModelConfig& c = student.config;
  const std::string other = non_llama_feature(teacher);
  LLM_CHECK(other.empty(), LLM_ERR_UNSUPPORTED, "distill: runs the Llama block only; '%s' has %s", c.arch.c_str(),
            other.c_str());
  LLM_CHECK(c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0 &&
                c.head_dim % 2 == 0 && c.n_heads % c.n_kv_heads == 0 && c.vocab_size > 0,
            LLM_ERR_FORMAT, "distill: bad hyper-parameters");
  const ModelConfig& tc = teacher.config;
  LLM_CHECK(tc.dim == c.dim && tc.hidden_dim == c.hidden_dim && tc.n_layers == c.n_layers &&
                tc.n_heads == c.n_heads && tc.n_kv_heads == c.n_kv_heads && tc.head_dim == c.head_dim &&
                tc.vocab_size == c.vocab_size,
            LLM_ERR_INVALID_ARGUMENT, "distill: the teacher and the student have different shapes");
  LLM_CHECK(!sequences.empty(), LLM_ERR_INVALID_ARGUMENT, "distill: no calibration sequences");
  Net& net = net_;
  std::vector<Param>& params = params_;
  net.c = c;
  int64_t total = 0;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols) -> int {
    const TensorData* t = student.find(name);
    LLM_CHECK(t != nullptr, LLM_ERR_FORMAT, "distill: tensor '%s' is missing", name.c_str());
    const bool vec = rows == 0;
    LLM_CHECK(vec ? (t->shape.size() == 1 && t->shape[0] == cols)
                  : (t->shape.size() == 2 && t->shape[0] == rows && t->shape[1] == cols),
              LLM_ERR_FORMAT, "distill: tensor '%s' is misshapen", name.c_str());
    Param p;
    p.name = name;
    p.rows = vec ? 1 : rows;
    p.cols = cols;
    total += p.numel();
    LLM_CHECK(total <= kDistillMaxParams, LLM_ERR_UNSUPPORTED,
              "distill: the model has over %lld parameters; this pass is for small models",
              (long long)kDistillMaxParams);
    if (!vec) {
      const LlmTensorSpec s = plan_llm_tensor(name, t->shape, DType::F32, 0, co, nullptr);
      if (dtype_is_quantized(s.dtype)) {
        p.dtype = s.dtype;
        p.group = s.dtype == DType::Q8 ? 32 : s.group;
      }
    }
    std::vector<float> w = tensor_to_f32(*t);
    if (p.quantized()) {
      // Scales from the student's blocks when it already has this format
      // (GPTQ ran); else from the plain quantizer, latent = the weights as read.
      if (t->dtype == p.dtype && t->group == p.group) {
        read_headers(p, t->data);
      } else {
        const size_t rb = dtype_row_bytes(p.dtype, cols, p.group);
        std::vector<uint8_t> blocks(rb * size_t(p.rows));
        for (int64_t r = 0; r < p.rows; ++r)
          quantize_any_row(p.dtype, p.group, &w[size_t(r * cols)], &blocks[size_t(r) * rb], cols);
        read_headers(p, blocks.data());
      }
    }
    p.w.init(std::move(w));
    p.off = params.empty() ? 0 : params.back().off + size_t(params.back().numel());
    params.push_back(std::move(p));
    return int(params.size() - 1);
  };
  const int64_t D = c.dim, F = c.hidden_dim, QD = int64_t(c.n_heads) * c.head_dim,
                KVD = int64_t(c.n_kv_heads) * c.head_dim, V = c.vocab_size;
  net.embd = add("token_embd.weight", V, D);
  net.output = student.find("output.weight") ? add("output.weight", V, D) : net.embd;
  net.out_norm = add("output_norm.weight", 0, D);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Net::Layer Ly;
    Ly.attn_norm = add(p + "attn_norm.weight", 0, D);
    Ly.ffn_norm = add(p + "ffn_norm.weight", 0, D);
    Ly.wq = add(p + "attn_q.weight", QD, D);
    Ly.wk = add(p + "attn_k.weight", KVD, D);
    Ly.wv = add(p + "attn_v.weight", KVD, D);
    Ly.wo = add(p + "attn_output.weight", D, QD);
    Ly.gate = add(p + "ffn_gate.weight", F, D);
    Ly.up = add(p + "ffn_up.weight", F, D);
    Ly.down = add(p + "ffn_down.weight", D, F);
    net.layers.push_back(Ly);
  }
  const size_t n_eff = params.back().off + size_t(params.back().numel());

  eff_.resize(n_eff);
  effT_.resize(n_eff);
  grads_.resize(size_t(nth_));
  tapes_.resize(size_t(nth_));

  // Teacher log-probabilities.
  for (const auto& s : sequences) {
    LLM_CHECK(!s.empty(), LLM_ERR_INVALID_ARGUMENT, "distill: empty calibration sequence");
    for (int32_t tk : s)
      LLM_CHECK(tk >= 0 && tk < c.vocab_size, LLM_ERR_INVALID_ARGUMENT, "distill: token %d outside the vocabulary",
                int(tk));
    seq_off_.push_back(size_t(n_tokens_) * size_t(V));
    n_tokens_ += int64_t(s.size());
  }
  teacher_lp_.resize(size_t(n_tokens_) * size_t(V));
  {
    ReferenceForward ref(teacher, pool);
    std::vector<float> logits;
    for (size_t si = 0; si < sequences.size(); ++si) {
      ref.run(sequences[si].data(), int64_t(sequences[si].size()), &logits);
      for (size_t i = 0; i < sequences[si].size(); ++i) {
        const float* z = &logits[i * size_t(V)];
        const float lse = float(log_sum_exp(z, V));
        for (int64_t e = 0; e < V; ++e) teacher_lp_[seq_off_[si] + i * size_t(V) + size_t(e)] = z[e] - lse;
      }
    }
  }

}

double Distiller::pass(bool grad, bool fp16) {
  for (const Param& p : params_) {
    materialize(p, eff_.data() + p.off, fp16);
    if (grad) transpose(eff_.data() + p.off, p.rows, p.cols, effT_.data() + p.off);
  }
  const double inv_total = 1.0 / double(n_tokens_);
  std::vector<double> kl(static_cast<size_t>(nth_), 0.0);
  auto body = [&](int ith, int nthreads) {
    int64_t b, e;
    ThreadPool::split(int64_t(seqs_.size()), ith, nthreads, &b, &e);
    float* G = nullptr;
    if (grad) {
      grads_[size_t(ith)].assign(eff_.size(), 0.0f);
      G = grads_[size_t(ith)].data();
    }
    for (int64_t s = b; s < e; ++s)
      kl[size_t(ith)] += run_sequence(net_, params_, eff_.data(), effT_.data(), seqs_[size_t(s)].data(),
                                      int64_t(seqs_[size_t(s)].size()), &teacher_lp_[seq_off_[size_t(s)]], inv_total,
                                      tapes_[size_t(ith)], G);
  };
  if (nth_ > 1) pool_->parallel(body);
  else body(0, 1);
  if (grad)
    for (int th = 1; th < nth_; ++th)
      for (size_t i = 0; i < eff_.size(); ++i) grads_[0][i] += grads_[size_t(th)][i];
  double sum = 0.0;
  for (double k : kl) sum += k;
  return sum * inv_total;
}

}  // namespace

ModelSource distill_quantize(const ModelSource& teacher, const ModelSource& student,
                             const std::vector<std::vector<int32_t>>& sequences, const LlmConvertOptions& co,
                             const DistillOptions& opts, DistillReport* report, ThreadPool* pool) {
  LLM_CHECK(opts.steps >= 0 && opts.steps <= 1000000 && opts.lr > 0.0f && opts.lr < 1.0f, LLM_ERR_INVALID_ARGUMENT,
            "distill: steps %d / lr %g out of range", int(opts.steps), double(opts.lr));
  Distiller dd(teacher, student, sequences, co, pool);
  std::vector<Param>& params = dd.params_;
  const int64_t n_tokens = dd.n_tokens_;
  DistillReport rep;
  rep.n_tokens = n_tokens;
  for (const Param& p : params) rep.n_params += int64_t(p.w.val.size() + p.d.val.size() + p.m.val.size());
  for (int32_t step = 1; step <= opts.steps; ++step) {
    const double kl = dd.pass(true, false);
    LLM_CHECK(std::isfinite(kl), LLM_ERR_INVALID_ARGUMENT,
              "distill: the loss is not finite at step %d (KL %g): non-finite weights, or a step size far too large",
              int(step), kl);
    if (step == 1) rep.kl_start = kl;
    const float lr = opts.lr * 0.5f * (1.0f + std::cos(3.14159265f * float(step) / float(opts.steps)));
    for (Param& p : params) {
      backprop_codes(p, dd.grads_[0].data() + p.off);
      adam_step(p.w, lr, step);
      if (p.quantized()) {
        adam_step(p.d, lr, step);
        for (float& d : p.d.val)  // keep scales away from 0 (a q4m scale also positive)
          if (std::fabs(d) < 1e-7f) d = p.dtype == DType::Q4M || d >= 0.0f ? 1e-7f : -1e-7f;
        if (p.dtype == DType::Q4M) adam_step(p.m, lr, step);
      }
    }
    if (opts.progress) opts.progress(step, kl);
  }
  rep.kl_end = dd.pass(false, true);
  if (opts.steps == 0) rep.kl_start = rep.kl_end;
  if (report) *report = rep;

  ModelSource out = student;
  for (const Param& p : params) {
    std::shared_ptr<std::vector<uint8_t>> bytes;
    if (p.quantized()) {
      bytes = pack(p);
    } else {
      bytes = std::make_shared<std::vector<uint8_t>>(size_t(p.numel()) * 4);
      std::memcpy(bytes->data(), p.w.val.data(), bytes->size());
    }
    for (auto& t : out.tensors) {
      if (t.name != p.name) continue;
      t.dtype = p.quantized() ? p.dtype : DType::F32;
      t.group = p.quantized() ? p.group : 0;
      t.data = bytes->data();
      t.nbytes = bytes->size();
      t.owned = bytes;
    }
  }
  out.meta["quant.distill"] = std::to_string(opts.steps) + " steps, lr " + std::to_string(opts.lr) + ", " +
                              std::to_string(n_tokens) + " calibration tokens, KL " + std::to_string(rep.kl_start) +
                              " -> " + std::to_string(rep.kl_end);
  return out;
}

double distill_kl_and_gradient(const ModelSource& teacher, const ModelSource& student,
                               const std::vector<std::vector<int32_t>>& sequences,
                               std::map<std::string, std::vector<float>>* grad, ThreadPool* pool) {
  LlmConvertOptions co;
  co.requantize = true;
  co.dtype = DType::F32;
  Distiller dd(teacher, student, sequences, co, pool);
  const double kl = dd.pass(grad != nullptr, false);
  if (grad) {
    grad->clear();
    for (const Param& p : dd.params_)
      (*grad)[p.name].assign(dd.grads_[0].begin() + std::ptrdiff_t(p.off),
                             dd.grads_[0].begin() + std::ptrdiff_t(p.off + size_t(p.numel())));
  }
  return kl;
}

}  // namespace llm
