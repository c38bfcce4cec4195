#include "backend/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_kernels.h"
#include "backend/cpu/matmul_ggml.h"

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace llm::cpu {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void check_weight(const WeightView& w) {
  LLM_CHECK(w.rows >= 0 && w.cols >= 0, LLM_ERR_INVALID_ARGUMENT, "matmul: negative shape");
  const size_t rb = dtype_row_bytes(w.dtype, w.cols, w.group);
  LLM_CHECK(rb != 0 || w.cols == 0, LLM_ERR_INVALID_ARGUMENT,
            "matmul: invalid weight %s group %u cols %lld", dtype_name(w.dtype), w.group,
            static_cast<long long>(w.cols));
  LLM_CHECK(w.row_bytes == rb, LLM_ERR_INVALID_ARGUMENT,
            "matmul: row_bytes %zu != %zu for %s [%lld, %lld]", w.row_bytes, rb,
            dtype_name(w.dtype), static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  LLM_CHECK(w.data != nullptr || w.rows == 0 || w.cols == 0, LLM_ERR_INVALID_ARGUMENT,
            "matmul: null weight data");
  LLM_CHECK(w.layout == WeightLayout::Rows ||
                (w.layout == WeightLayout::X8 && ((w.dtype == DType::Q4 && w.group == 32) || w.dtype == DType::Q8)),
            LLM_ERR_INVALID_ARGUMENT, "matmul: layout %u does not hold %s", unsigned(w.layout), dtype_name(w.dtype));
}

// Rows of w that lie in the X8 groups (the rest lie as Rows puts them).
int64_t x8_rows(const WeightView& w) { return w.layout == WeightLayout::X8 ? w.rows / 8 * 8 : 0; }

// Rows [r0, r1) of y = x . W^T, dequantizing each row once and applying it to
// all n activation rows.
void ref_rows(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1,
              float* row /* [cols] scratch */) {
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(w, r, row);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * w.cols;
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc += row[k] * xi[k];
      y[i * w.rows + r] = acc;
    }
  }
}

}  // namespace

void dequantize_row(const WeightView& w, int64_t r, float* dst) {
  const uint8_t* src = w.data + size_t(r) * w.row_bytes;
  const int64_t cols = w.cols;
  if (r < x8_rows(w)) {
    const uint8_t* g = w.data + size_t(r / 8) * 8 * w.row_bytes;
    const int i = int(r % 8);
    const bool q8 = w.dtype == DType::Q8;
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint8_t* blk = g + size_t(b) * x8_block_bytes(w.dtype);
      const float d = f16_to_f32(load_u16(blk + 2 * i));
      for (int k = 0; q8 && k < 32; ++k) dst[b * 32 + k] = d * float(int8_t(blk[16 + 32 * (k / 4) + 4 * i + k % 4]));
      for (int s = 0; !q8 && s < 4; ++s) {
        for (int j = 0; j < 4; ++j) {
          const uint8_t byte = blk[16 + 32 * s + 4 * i + j];
          dst[b * 32 + 4 * s + j] = d * float(int(byte & 0x0f) - 8);
          dst[b * 32 + 16 + 4 * s + j] = d * float(int(byte >> 4) - 8);
        }
      }
    }
    return;
  }
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(dst, src, size_t(cols) * 4);
      return;
    case DType::F16:
      for (int64_t k = 0; k < cols; ++k) dst[k] = f16_to_f32(load_u16(src + 2 * k));
      return;
    case DType::BF16:
      for (int64_t k = 0; k < cols; ++k) dst[k] = bf16_to_f32(load_u16(src + 2 * k));
      return;
    case DType::Q8:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t* blk = src + b * 34;  // [f16 d][32 x int8]
        const float d = f16_to_f32(load_u16(blk));
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = d * float(int8_t(blk[2 + j]));
      }
      return;
    case DType::Q4: {
      const int64_t g = w.group, half = g / 2;
      for (int64_t b = 0; b < cols / g; ++b) {
        const uint8_t* blk = src + b * (2 + half);  // [f16 d][g/2 bytes]
        const float d = f16_to_f32(load_u16(blk));
        float* out = dst + b * g;
        for (int64_t j = 0; j < half; ++j) {
          const uint8_t byte = blk[2 + j];
          out[j] = d * float(int(byte & 0x0f) - 8);
          out[j + half] = d * float(int(byte >> 4) - 8);
        }
      }
      return;
    }
    case DType::Q4M: {
      const int64_t g = w.group, half = g / 2;
      for (int64_t b = 0; b < cols / g; ++b) {
        const uint8_t* blk = src + b * (4 + half);  // [f16 d][f16 m][g/2 bytes]
        const float d = f16_to_f32(load_u16(blk)), m = f16_to_f32(load_u16(blk + 2));
        float* out = dst + b * g;
        for (int64_t j = 0; j < half; ++j) {
          const uint8_t byte = blk[4 + j];
          out[j] = float(byte & 0x0f) * d + m;
          out[j + half] = float(byte >> 4) * d + m;
        }
      }
      return;
    }
    default:
      if (dtype_is_ggml_block(w.dtype)) {
        llm::dequantize_row(w.dtype, w.group, src, dst, cols);  // ggml's to_float, bit for bit
        return;
      }
      break;
  }
  fail(LLM_ERR_INVALID_ARGUMENT, "dequantize_row: unknown dtype %u", unsigned(w.dtype));
}

bool x8_eligible(const WeightView& w) {
  return w.layout == WeightLayout::Rows && ((w.dtype == DType::Q4 && w.group == 32) || w.dtype == DType::Q8) &&
         w.rows >= 8 && w.cols >= 32 && w.row_bytes == dtype_row_bytes(w.dtype, w.cols, w.group);
}

bool x8_preferred(DType t, MatmulMode mode) {
  // Q8 stays in rows: its X8 kernels are twice as fast under AVX-512, but on
  // Gemma 3 270M (Q8_0 and Q5_0 matrices beside the K-quants) they moved the
  // fast path's agreement with exact math from 190 to 187 of 192 steps, for a
  // reason not yet found (docs/PERFORMANCE.md, thirteenth session).
  return mode == MatmulMode::Fast && t == DType::Q4 && use_avx2_kernels();
}

WeightView repack_x8(const WeightView& w, uint8_t* dst, int64_t r0, int64_t r1) {
  LLM_CHECK(x8_eligible(w), LLM_ERR_INVALID_ARGUMENT, "repack_x8: %s group %u [%lld, %lld] cannot be interleaved",
            dtype_name(w.dtype), w.group, static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  if (r1 < 0) r1 = w.rows;
  LLM_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows && r0 % 8 == 0 && (r1 % 8 == 0 || r1 == w.rows),
            LLM_ERR_INVALID_ARGUMENT, "repack_x8: rows [%lld, %lld) are not whole groups", static_cast<long long>(r0),
            static_cast<long long>(r1));
  const int64_t nb = w.cols / 32, full = std::min(r1, w.rows / 8 * 8);
  const size_t bb = x8_block_bytes(w.dtype) / 8;  // one stored block: [f16 d][bb - 2 quant bytes]
  for (int64_t g0 = r0; g0 < full; g0 += 8) {
    uint8_t* out = dst + size_t(g0) * w.row_bytes;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* row = w.data + size_t(g0 + i) * w.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * bb;
        uint8_t* o = out + b * 8 * bb;
        std::memcpy(o + 2 * i, blk, 2);
        for (size_t k = 0; k < (bb - 2) / 4; ++k) std::memcpy(o + 16 + 32 * k + 4 * i, blk + 2 + 4 * k, 4);
      }
    }
  }
  const int64_t tail = std::max(full, r0);  // plain rows of the range
  std::memcpy(dst + size_t(tail) * w.row_bytes, w.data + size_t(tail) * w.row_bytes, size_t(r1 - tail) * w.row_bytes);
  WeightView v = w;
  v.layout = WeightLayout::X8;
  v.data = dst;
  return v;
}

void matmul_ref(const WeightView& w, const float* x, int64_t n, float* y) {
  check_weight(w);
  if (n <= 0 || w.rows == 0) return;
  std::vector<float> row(size_t(w.cols));
  ref_rows(w, x, n, y, 0, w.rows, row.data());
}

namespace kern {

void quantize_x_scalar(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s) {
  const int64_t nb = cols / 32;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * cols + b * 32;
      int8_t* qb = q + i * cols + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float dd = amax / 127.0f;
      const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
      d[i * nb + b] = dd;
      // nearbyint rounds half to even, like vcvtps2dq in the AVX2 version.
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        qb[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
        sum += qb[j];
      }
      s[i * nb + b] = float(sum);
    }
  }
}

void matmul_q_scalar(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0,
                     int64_t r1) {
  const int64_t nbx = w.cols / 32;  // activation blocks per row
  const int64_t g = w.dtype == DType::Q8 ? 32 : w.group;
  const int64_t hb = w.dtype == DType::Q8 ? 2 : q4_header_bytes(w.dtype);
  const int64_t gb = w.dtype == DType::Q8 ? 34 : hb + g / 2;
  const bool with_min = w.dtype == DType::Q4M;
  const int64_t per = g / 32;  // activation blocks per weight group
  int8_t wq[32];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + size_t(r) * w.row_bytes;
    for (int64_t i = 0; i < n; ++i) {
      const int8_t* xq = x.q + i * x.cols;
      const float* xd = x.d + i * nbx;
      float acc = 0.0f;
      for (int64_t b = 0; b < nbx; ++b) {
        const uint8_t* blk = row + (b / per) * gb;
        const float dw = f16_to_f32(load_u16(blk));
        const int64_t j0 = (b % per) * 32;  // first value of this block within its group
        for (int t = 0; t < 32; ++t) {
          if (w.dtype == DType::Q8) {
            wq[t] = int8_t(blk[2 + t]);
          } else {
            const int64_t v = j0 + t, half = g / 2;
            const uint8_t byte = blk[hb + (v < half ? v : v - half)];
            wq[t] = int8_t((v < half ? (byte & 0x0f) : (byte >> 4)) - (with_min ? 0 : 8));
          }
        }
        int32_t dot = 0;
        for (int t = 0; t < 32; ++t) dot += int32_t(wq[t]) * int32_t(xq[b * 32 + t]);
        acc += (dw * xd[b]) * float(dot);
        // Q4M: value = d * q + m, so the minimum adds m * d_x * sum(x_q).
        if (with_min) acc += (f16_to_f32(load_u16(blk + 2)) * xd[b]) * x.s[i * nbx + b];
      }
      y[i * w.rows + r] = acc;
    }
  }
}

void matmul_x8_scalar(const WeightView& w, const QuantX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / 32;
  const bool q8 = w.dtype == DType::Q8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* g = w.data + size_t(r / 8) * 8 * w.row_bytes;
    const int lane = int(r % 8);
    for (int64_t i = 0; i < n; ++i) {
      const int8_t* xq = x.q + i * x.cols;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = g + size_t(b) * x8_block_bytes(w.dtype);
        const int8_t* xb = xq + b * 32;
        int32_t dot = 0;
        for (int k = 0; q8 && k < 32; ++k) dot += int32_t(int8_t(blk[16 + 32 * (k / 4) + 4 * lane + k % 4])) * xb[k];
        for (int s = 0; !q8 && s < 4; ++s) {
          for (int j = 0; j < 4; ++j) {
            const uint8_t byte = blk[16 + 32 * s + 4 * lane + j];
            dot += int32_t(byte & 0x0f) * xb[4 * s + j] + int32_t(byte >> 4) * xb[16 + 4 * s + j];
          }
        }
        // Q4: both terms are integers below 2^24, so the difference is exact.
        const float v = q8 ? float(dot) : float(dot) - 8.0f * x.s[i * nb + b];
        acc = std::fma(v, f16_to_f32(load_u16(blk + 2 * lane)) * x.d[i * nb + b], acc);
      }
      y[i * w.rows + r] = acc;
    }
  }
}

void pack_x8_x(const QuantX& x, int tile, int64_t t0, int64_t t1, int8_t* q, float* d, float* s) {
  const int64_t cols = x.cols, nb = cols / 32;
  for (int64_t t = t0; t < t1; ++t) {
    for (int c = 0; c < tile; ++c) {
      const int64_t row = t * tile + c;
      for (int64_t b = 0; b < nb; ++b) {
        int8_t* out = q + t * tile * cols + b * 32 * tile;
        for (int j = 0; j < 8; ++j) std::memcpy(out + (j * tile + c) * 4, x.q + row * cols + b * 32 + 4 * j, 4);
        d[t * tile * nb + b * tile + c] = x.d[row * nb + b];
        s[t * tile * nb + b * tile + c] = x.s[row * nb + b];
      }
    }
  }
}

}  // namespace kern

namespace {

// Activation scratch of the calling thread: grows to the largest call seen,
// then no allocation per call.
struct QuantScratch {
  std::vector<int8_t> q;
  std::vector<float> d, s;
};

// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kMinParallelMacs = int64_t(1) << 16;

}  // namespace

namespace {

// x as the kernels of one weight format read it, quantized once per call
// (the scratch belongs to the calling thread; the workers only read it).
struct PreparedX {
  bool int8 = false, avx2 = false, avx512 = false;
  bool x8_vnni = false;            // an X8 matrix under the AVX-512 family (x as for AVX2)
  kern::QuantX xq;
  const uint8_t* xq512 = nullptr;  // the AVX-512 kernels' quad layout
  bool ggml = false;               // a GGUF block type in Fast mode: gx
  kern::GgmlX gx;
};

// Grows v to at least n elements and returns its data, 64-byte aligned
// (v keeps 64 bytes of slack for that).
template <class T>
T* aligned_scratch(std::vector<uint8_t>& v, size_t n) {
  const size_t bytes = n * sizeof(T) + 64;
  if (v.size() < bytes) v.resize(bytes);
  uint8_t* p = v.data();
  return reinterpret_cast<T*>(p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64);
}

// Runs f(r0, r1) over row ranges of [0, n) on the pool when n is a prefill's
// worth of rows (quantizing x is per row, so the split changes no byte), else
// on the calling thread.
template <class F>
void over_rows(int64_t n, ThreadPool* pool, F&& f) {
  constexpr int64_t kMinParallelRows = 64;
  if (pool != nullptr && pool->size() > 1 && n >= kMinParallelRows) {
    pool->parallel([&](int ith, int nth) {
      int64_t r0, r1;
      ThreadPool::split(n, ith, nth, &r0, &r1);
      if (r0 < r1) f(r0, r1);
    });
  } else {
    f(int64_t(0), n);
  }
}

// GGUF block types in Fast mode: x quantized as ggml does for the type
// (matmul_ggml.h), plus the quad layout where the AVX-512 family wants it.
PreparedX prepare_ggml_x(const WeightView& w, const float* x, int64_t n, ThreadPool* pool) {
  PreparedX p;
  p.ggml = true;
  p.avx2 = use_avx2_kernels();
  kern::GgmlX& g = p.gx;
  g.act = kern::ggml_act_of(w.dtype);
  g.cols = w.cols;
  const size_t nq = size_t(n) * size_t(w.cols), nb = nq / size_t(kern::ggml_act_block(g.act));
#if defined(LLM_AVX512_KERNELS)
  p.avx512 = use_avx512_kernels() && kern::ggml_avx512_runs(w.dtype);
#endif
  thread_local std::vector<uint8_t> q, d, s, bs, e;
  int8_t* qp = aligned_scratch<int8_t>(q, nq);
  float* dp = aligned_scratch<float>(d, nb);
  float* sp = g.act == kern::GgmlAct::Q8_1 ? aligned_scratch<float>(s, nb) : nullptr;
  int16_t* bp = g.act == kern::GgmlAct::Q8_K ? aligned_scratch<int16_t>(bs, nq / 16) : nullptr;
  // The AVX-512 family's K-quant activations: Q8_K with sub-scales.
  uint8_t* ep = p.avx512 && g.act == kern::GgmlAct::Q8_K ? aligned_scratch<uint8_t>(e, nq / 32) : nullptr;
  const int64_t cols = w.cols, nbr = cols / kern::ggml_act_block(g.act);
  over_rows(n, pool, [&](int64_t r0, int64_t r1) {
    int8_t* q = qp + r0 * cols;
    float* d = dp + r0 * nbr;
    float* s = sp ? sp + r0 * nbr : nullptr;
    int16_t* b = bp ? bp + r0 * (cols / 16) : nullptr;
#if defined(LLM_AVX512_KERNELS)
    if (ep) return kern::quantize_q8_ks_avx512(x + r0 * cols, r1 - r0, cols, q, d, ep + r0 * (cols / 32), b);
#endif
#if defined(__x86_64__) || defined(_M_X64)
    if (p.avx2)
      kern::quantize_ggml_x_avx2(g.act, x + r0 * cols, r1 - r0, cols, q, d, s, b);
    else
#endif
      kern::quantize_ggml_x(g.act, x + r0 * cols, r1 - r0, cols, q, d, s, b);
  });
  g.q = qp;
  g.d = dp;
  g.s = sp;
  g.bsums = bp;
  g.e = ep;
#if defined(LLM_AVX512_KERNELS)
  if (p.avx512 && g.act == kern::GgmlAct::Q8_0) {
    thread_local std::vector<uint8_t> quads;
    uint8_t* qd = aligned_scratch<uint8_t>(quads, size_t(n) * size_t(kern::quad_count(w.cols) * kern::kQuadBytes));
    const int64_t row_bytes = kern::quad_count(w.cols) * kern::kQuadBytes;
    over_rows(n, pool, [&](int64_t r0, int64_t r1) {
      kern::GgmlX part = g;
      part.q += r0 * cols;
      part.d += r0 * nbr;
      kern::ggml_quads_avx512(w.dtype, part, r1 - r0, qd + r0 * row_bytes);
    });
    g.quads = qd;
  }
#endif
  return p;
}

PreparedX prepare_x(const WeightView& w, const float* x, int64_t n, MatmulMode mode, ThreadPool* pool) {
  if (mode == MatmulMode::Fast && dtype_is_ggml_block(w.dtype)) return prepare_ggml_x(w, x, n, pool);
  PreparedX p;
  p.avx2 = use_avx2_kernels();
  // The AVX-512 family has no Q4M kernels yet: Q4M takes the AVX2 ones (for
  // decode and prefill alike, so batch invariance holds).
  // An X8 matrix takes x as the AVX2 kernels do under the AVX-512 family too.
  p.avx512 = use_avx512_kernels() && w.dtype != DType::Q4M && w.layout == WeightLayout::Rows;  // implies avx2
#if defined(LLM_AVX512_KERNELS)
  p.x8_vnni = use_avx512_kernels() && w.layout == WeightLayout::X8;
#endif
  p.int8 = mode == MatmulMode::Fast && dtype_is_quantized(w.dtype);
#if defined(LLM_AVX512_KERNELS)
  if (p.int8 && p.avx512) {
    // Grows to the largest call seen, then no allocation per call; 64-byte
    // aligned so every quad is one cache line per part.
    thread_local std::vector<uint8_t> quads;
    const size_t bytes = size_t(n) * size_t(kern::quad_count(w.cols)) * size_t(kern::kQuadBytes);
    if (quads.size() < bytes + 64) quads.resize(bytes + 64);
    uint8_t* q = quads.data();
    q += (64 - reinterpret_cast<uintptr_t>(q) % 64) % 64;
    const int64_t row_bytes = kern::quad_count(w.cols) * kern::kQuadBytes;
    over_rows(n, pool, [&](int64_t r0, int64_t r1) {
      kern::quantize_x_avx512(x + r0 * w.cols, r1 - r0, w.cols, q + r0 * row_bytes, w.dtype == DType::Q8);
    });
    p.xq512 = q;
  }
#endif
  if (p.int8 && p.xq512 == nullptr) {
    thread_local QuantScratch scratch;
    const size_t nq = size_t(n) * size_t(w.cols);
    if (scratch.q.size() < nq) scratch.q.resize(nq);
    if (scratch.d.size() < nq / 32) {
      scratch.d.resize(nq / 32);
      scratch.s.resize(nq / 32);
    }
#if defined(__x86_64__) || defined(_M_X64)
    if (p.avx2)
      kern::quantize_x_avx2(x, n, w.cols, scratch.q.data(), scratch.d.data(), scratch.s.data(),
                            kern::q_pair_layout(w));
    else
#endif
      kern::quantize_x_scalar(x, n, w.cols, scratch.q.data(), scratch.d.data(), scratch.s.data());
    p.xq.q = scratch.q.data();
    p.xq.d = scratch.d.data();
    p.xq.s = scratch.s.data();
    p.xq.cols = w.cols;
    // X8 with whole tiles of x rows for the family's kernels: the tiles too.
    const int tile = p.x8_vnni ? kern::kX8ColsAvx512 : kern::kX8ColsAvx2;
    if (w.layout == WeightLayout::X8 && p.avx2 && n >= tile) {
      thread_local QuantScratch tiles;
      const int64_t nt = n / tile;
      const size_t tq = size_t(nt * tile) * size_t(w.cols);
      if (tiles.q.size() < tq) tiles.q.resize(tq);
      if (tiles.d.size() < tq / 32) {
        tiles.d.resize(tq / 32);
        tiles.s.resize(tq / 32);
      }
      // (The workers must get this thread's buffers, not their own thread_local ones.)
      int8_t* const tq_out = tiles.q.data();
      float* const td_out = tiles.d.data();
      float* const ts_out = tiles.s.data();
      over_rows(nt, pool, [&](int64_t t0, int64_t t1) { kern::pack_x8_x(p.xq, tile, t0, t1, tq_out, td_out, ts_out); });
      p.xq.tile = tile;
      p.xq.tq = tq_out;
      p.xq.td = td_out;
      p.xq.ts = ts_out;
    }
  }
  return p;
}

// ref_rows with the calling thread's row buffer.
void ref_rows_scratch(const WeightView& w, const float* x, int64_t n, float* y, int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  if (row.size() < size_t(w.cols)) row.resize(size_t(w.cols));
  ref_rows(w, x, n, y, r0, r1, row.data());
}

// W rows [r0, r1) for every x row. Each output is computed whole by one call,
// in the same order whatever the range: how rows are split never changes a bit.
void run_rows(const WeightView& w, const PreparedX& p, const float* x, int64_t n, float* y, int64_t r0,
              int64_t r1) {
  if (p.ggml) {
#if defined(LLM_AVX512_KERNELS)
    if (p.avx512) return kern::matmul_ggml_avx512(w, p.gx, n, y, r0, r1);
#endif
#if defined(__x86_64__) || defined(_M_X64)
    if (p.avx2) return kern::matmul_ggml_avx2(w, p.gx, n, y, r0, r1);
#endif
    return kern::matmul_ggml_scalar(w, p.gx, n, y, r0, r1);
  }
  if (w.layout == WeightLayout::X8) {
    if (!p.int8) return ref_rows_scratch(w, x, n, y, r0, r1);  // Reference mode (no repack is made for it)
    // The 8-row groups take the family's X8 kernel, the plain tail rows its
    // row kernel (x is plain: q_pair_layout is false for X8).
    const int64_t full = x8_rows(w), g1 = std::min(r1, full), t0 = std::max(r0, full);
#if defined(__x86_64__) || defined(_M_X64)
    if (p.avx2) {
      if (r0 < g1) {
#if defined(LLM_AVX512_KERNELS)
        if (p.x8_vnni)
          kern::matmul_x8_avx512(w, p.xq, n, y, r0, g1);
        else
#endif
          kern::matmul_x8_avx2(w, p.xq, n, y, r0, g1);
      }
      if (t0 < r1) kern::matmul_q_avx2(w, p.xq, n, y, t0, r1);
      return;
    }
#endif
    if (r0 < g1) kern::matmul_x8_scalar(w, p.xq, n, y, r0, g1);
    if (t0 < r1) kern::matmul_q_scalar(w, p.xq, n, y, t0, r1);
    return;
  }
#if defined(LLM_AVX512_KERNELS)
  if (p.avx512) {
    if (p.int8)
      kern::matmul_q_avx512(w, p.xq512, n, y, r0, r1);
    else
      kern::matmul_f_avx512(w, x, n, y, r0, r1);
    return;
  }
#endif
#if defined(__x86_64__) || defined(_M_X64)
  if (p.avx2) {
    if (p.int8)
      kern::matmul_q_avx2(w, p.xq, n, y, r0, r1);
    else
      kern::matmul_f_avx2(w, x, n, y, r0, r1);
    return;
  }
#endif
  if (p.int8) {
    kern::matmul_q_scalar(w, p.xq, n, y, r0, r1);
  } else {
    ref_rows_scratch(w, x, n, y, r0, r1);
  }
}

int64_t tiles_of(const WeightView& w) { return (w.rows + kern::kRowTile - 1) / kern::kRowTile; }

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool,
            MatmulMode mode) {
  matmul_many(&w, &y, 1, x, n, pool, mode);
}

void matmul_many(const WeightView* ws, float* const* ys, int count, const float* x, int64_t n, ThreadPool* pool,
                 MatmulMode mode) {
  LLM_CHECK(count >= 1 && ws != nullptr && ys != nullptr, LLM_ERR_INVALID_ARGUMENT, "matmul: no weights");
  bool shared = true;  // one quantized x serves every matrix
  for (int i = 0; i < count; ++i) {
    check_weight(ws[i]);
    shared = shared && ws[i].dtype == ws[0].dtype && ws[i].group == ws[0].group && ws[i].cols == ws[0].cols &&
             ws[i].layout == ws[0].layout;
  }
  if (!shared) {
    for (int i = 0; i < count; ++i) matmul_many(&ws[i], &ys[i], 1, x, n, pool, mode);
    return;
  }
  if (n <= 0) return;
  int64_t tiles = 0, macs = 0;
  for (int i = 0; i < count; ++i) {
    if (ws[i].rows == 0) continue;
    LLM_CHECK(ys[i] != nullptr, LLM_ERR_INVALID_ARGUMENT, "matmul: null y");
    tiles += tiles_of(ws[i]);
    macs += n * ws[i].rows * ws[i].cols;
  }
  if (tiles == 0) return;
  if (ws[0].cols == 0) {
    for (int i = 0; i < count; ++i) std::fill(ys[i], ys[i] + n * ws[i].rows, 0.0f);
    return;
  }
  LLM_CHECK(x != nullptr, LLM_ERR_INVALID_ARGUMENT, "matmul: null x");
  const PreparedX p = prepare_x(ws[0], x, n, mode, pool);
  // The matrices' row tiles, end to end, split evenly between the threads: one
  // hand-off and one wait for all of them.
  auto tile_range = [&](int64_t t0, int64_t t1) {
    int64_t base = 0;
    for (int i = 0; i < count && t0 < t1; ++i) {
      const int64_t nt = tiles_of(ws[i]);
      const int64_t a = std::max(t0, base), b = std::min(t1, base + nt);
      if (a < b)
        run_rows(ws[i], p, x, n, ys[i], (a - base) * kern::kRowTile, std::min(ws[i].rows, (b - base) * kern::kRowTile));
      base += nt;
    }
  };
  if (pool != nullptr && pool->size() > 1 && tiles > 1 && macs >= kMinParallelMacs) {
    pool->parallel([&](int ith, int nth) {
      int64_t t0, t1;
      ThreadPool::split(tiles, ith, nth, &t0, &t1);
      tile_range(t0, t1);
    });
  } else {
    tile_range(0, tiles);
  }
}

}  // namespace llm::cpu
