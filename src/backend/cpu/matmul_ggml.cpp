// GGUF block types in Fast mode: ggml's activation quantizers, the plain
// unpackers (the oracle of the SIMD ones) and the portable kernels. See
// matmul_ggml.h for the arithmetic every family shares.
//
// Portable family order: per output, blocks in row order, one f32 update per
// block: acc += (d_w * d_x) * float(integer dot) [Q5_1: then + m_w * s_x];
// super-blocks: acc += (d * d_x) * float(S) then acc -= (dm * d_x) * float(M),
// or acc += (d * d_x) * float(S - M) when dm == d. Built without -mfma, so
// these stay a multiply then an add.
#include "backend/cpu/matmul_ggml.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace llm::cpu::kern {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Round half to even for |v| < 2^22, without SSE4.1 (the library's baseline
// has no roundss): adding 1.5 * 2^23 leaves the rounded integer in the low
// mantissa bits. ggml's nearest_int does the same; vroundps / vcvtps2dq
// under the default MXCSR give the same integers.
inline int round_even(float v) {
  const float t = v + 12582912.0f;
  int32_t i;
  std::memcpy(&i, &t, 4);
  return (i & 0x007fffff) - 0x00400000;
}

inline bool finite(float a) { return a <= FLT_MAX; }  // a >= 0 here; false for +Inf and NaN

// Q8_0 / Q8_1 block of 32 as ggml-cpu's AVX2 quantize_row_q8_0/_1, but for
// Q8_0's d, kept in f32.
void quantize_q8_0_block(const float* x, int8_t* q, float* d, float* s, bool q8_1) {
  float amax = 0.0f;
  bool bad = false;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    bad |= !finite(a);
    amax = a > amax ? a : amax;
  }
  if (bad) {
    std::memset(q, 0, 32);
    *d = NAN;
    if (q8_1) *s = NAN;
    return;
  }
  const float dd = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  *d = q8_1 ? f16_to_f32(f32_to_f16(dd)) : dd;  // Q8_0 keeps d in f32 (matmul_ggml.h)
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = int8_t(round_even(x[j] * id));
    sum += q[j];
  }
  if (q8_1) *s = f16_to_f32(f32_to_f16(dd * float(sum)));
}

// Q8_K super-block of 256 as quantize_row_q8_K_ref.
void quantize_q8_k_block(const float* x, int8_t* q, float* d, int16_t* bsums) {
  float amax = 0.0f, max = 0.0f;
  bool bad = false;
  for (int j = 0; j < 256; ++j) {
    const float a = std::fabs(x[j]);
    bad |= !finite(a);
    if (a > amax) {  // strictly greater: the first of equal magnitudes wins
      amax = a;
      max = x[j];
    }
  }
  if (bad || amax == 0.0f) {
    std::memset(q, 0, 256);
    std::memset(bsums, 0, 16 * sizeof(int16_t));
    *d = bad ? NAN : 0.0f;
    return;
  }
  const float iscale = -127.0f / max;
  for (int j = 0; j < 256; ++j) {
    const int v = round_even(iscale * x[j]);
    q[j] = int8_t(v < 127 ? v : 127);
  }
  for (int k = 0; k < 16; ++k) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += q[16 * k + j];
    bsums[k] = int16_t(sum);
  }
  *d = 1.0f / iscale;
}

// Q8_K with sub-scales (matmul_ggml.h) of one super-block.
void quantize_q8_ks_block(const float* x, int8_t* q, float* d, uint8_t* e, int16_t* bsums) {
  float sub[8] = {}, amax = 0.0f;
  bool bad = false;
  for (int k = 0; k < 8; ++k) {
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(x[32 * k + j]);
      bad |= !finite(a);
      sub[k] = a > sub[k] ? a : sub[k];
    }
    amax = sub[k] > amax ? sub[k] : amax;
  }
  const float dd = amax / (127.0f * float(kSubScaleMax));
  if (bad || !(dd >= FLT_MIN)) {
    std::memset(q, 0, 256);
    std::memset(e, 1, 8);
    std::memset(bsums, 0, 16 * sizeof(int16_t));
    *d = bad ? NAN : 0.0f;
    return;
  }
  const float inv = 1.0f / (127.0f * dd);
  for (int k = 0; k < 8; ++k) {
    const int ek = q8_ks_sub_scale(sub[k], inv);
    const float iscale = q8_ks_iscale(dd, ek);
    int sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int v = round_even(x[32 * k + j] * iscale);
      q[32 * k + j] = int8_t(v > 127 ? 127 : v < -127 ? -127 : v);
      sum[j / 16] += q[32 * k + j];
    }
    e[k] = uint8_t(ek);
    bsums[2 * k] = int16_t(ek * sum[0]);
    bsums[2 * k + 1] = int16_t(ek * sum[1]);
  }
  *d = dd;
}

// 6-bit scale and minimum j (0..7) of the Q4_K / Q5_K 12-byte array.
inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

inline void set_scale(KUnpacked* o, int k, int sc) {
  for (int i = 0; i < 8; ++i) o->sv[8 * k + i] = int16_t(sc);
}

const int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

}  // namespace

void quantize_ggml_x(GgmlAct a, const float* x, int64_t n, int64_t cols, int8_t* q, float* d, float* s,
                     int16_t* bsums) {
  const int64_t blk = ggml_act_block(a), nb = cols / blk;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * cols + b * blk;
      int8_t* qb = q + i * cols + b * blk;
      if (a == GgmlAct::Q8_K)
        quantize_q8_k_block(xb, qb, d + i * nb + b, bsums + (i * nb + b) * 16);
      else
        quantize_q8_0_block(xb, qb, d + i * nb + b, a == GgmlAct::Q8_1 ? s + i * nb + b : nullptr,
                            a == GgmlAct::Q8_1);
    }
  }
}

void quantize_q8_ks(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, uint8_t* e, int16_t* bsums) {
  const int64_t nsb = cols / 256;
  for (int64_t i = 0; i < n * nsb; ++i)
    quantize_q8_ks_block(x + 256 * i, q + 256 * i, d + i, e + 8 * i, bsums + 16 * i);
}

void unpack_k_ref(DType t, const uint8_t* b, KUnpacked* o) {
  std::memset(o, 0, sizeof *o);
  switch (t) {
    case DType::Q2_K: {
      // scales[16] (low nibble scale, high nibble min) | qs[64] | f16 d | f16 dmin
      const uint8_t* qs = b + 16;
      for (int k = 0; k < 16; ++k) {
        set_scale(o, k, b[k] & 0x0f);
        o->mn[k] = int16_t(b[k] >> 4);
      }
      // Value i: 128-half n, 2-bit plane j, 16-row half h, l.
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, j = (i % 128) / 32, h = (i % 32) / 16, l = i % 16;
        o->q[i] = uint8_t((qs[32 * n + 16 * h + l] >> (2 * j)) & 3);
      }
      o->d = half_at(b + 80);
      o->dm = half_at(b + 82);
      return;
    }
    case DType::Q3_K: {
      // hmask[32] | qs[64] | scales[12] (16 x 6 bits, bias 32) | f16 d
      const uint8_t* hm = b;
      const uint8_t* qs = b + 32;
      const uint8_t* s = b + 96;
      for (int k = 0; k < 16; ++k) {
        const int lo = k < 8 ? (s[k] & 0x0f) : (s[k - 8] >> 4);
        const int hi = (s[8 + (k % 4)] >> (2 * (k / 4))) & 3;
        const int sc = (lo | (hi << 4)) - 32;
        set_scale(o, k, sc);
        o->mn[k] = int16_t(4 * sc);
      }
      // Value = sc * (2-bit code - (high bit set ? 0 : 4)) = sc * (u - 4).
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, j = (i % 128) / 32, h = (i % 32) / 16, l = i % 16;
        const int q2 = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3;
        const bool high = (hm[16 * h + l] >> (4 * n + j)) & 1;
        o->q[i] = uint8_t(q2 + (high ? 4 : 0));
      }
      o->d = o->dm = half_at(b + 108);
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      // f16 d | f16 dmin | scales[12] | [Q5_K: qh[32]] | qs[128]
      const bool five = t == DType::Q5_K;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        scale_min_k4(j, b + 4, &sc, &mn);
        set_scale(o, 2 * j, sc);
        set_scale(o, 2 * j + 1, sc);
        o->mn[2 * j] = o->mn[2 * j + 1] = int16_t(mn);
      }
      // Sub-block j of 32: the low nibbles (j even) or high nibbles (j odd)
      // of qs[32 * (j / 2) ...]; Q5_K's fifth bit is bit j of qh[l].
      for (int i = 0; i < 256; ++i) {
        const int j = i / 32, l = i % 32;
        const uint8_t byte = qs[32 * (j / 2) + l];
        int v = (j % 2) ? byte >> 4 : byte & 0x0f;
        if (five) v |= ((qh[l] >> j) & 1) << 4;
        o->q[i] = uint8_t(v);
      }
      o->d = half_at(b);
      o->dm = half_at(b + 2);
      return;
    }
    case DType::Q6_K: {
      // ql[128] | qh[64] | int8 scales[16] | f16 d; value = d * sc * (u - 32)
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int k = 0; k < 16; ++k) {
        set_scale(o, k, sc[k]);
        o->mn[k] = int16_t(32 * sc[k]);
      }
      for (int i = 0; i < 256; ++i) {
        const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
        const uint8_t lo = ql[64 * n + l + 32 * (quarter & 1)];
        const int nib = quarter < 2 ? lo & 0x0f : lo >> 4;
        const int hi = (qh[32 * n + l] >> (2 * quarter)) & 3;
        o->q[i] = uint8_t(nib | (hi << 4));
      }
      o->d = o->dm = half_at(b + 208);
      return;
    }
    case DType::IQ4_XS: {
      // f16 d | u16 scales_h | scales_l[4] | qs[128]; value = d * (ls - 32) * table[nibble]
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
        set_scale(o, 2 * ib, ls - 32);
        set_scale(o, 2 * ib + 1, ls - 32);
        const uint8_t* qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; ++j) {
          o->q[32 * ib + j] = uint8_t(kIq4nlValues[qs[j] & 0x0f]);
          o->q[32 * ib + j + 16] = uint8_t(kIq4nlValues[qs[j] >> 4]);
        }
      }
      o->d = o->dm = half_at(b);
      return;
    }
    default: break;
  }
  fail(LLM_ERR_INTERNAL, "unpack_k_ref: %s is not a K-quant", dtype_name(t));
}

void unpack_b32_ref(DType t, const uint8_t* b, int8_t* q, float* d, float* m) {
  switch (t) {
    case DType::Q5_0:
    case DType::Q5_1: {
      // Q5_0: f16 d | u32 qh | qs[16];  Q5_1: f16 d | f16 m | u32 qh | qs[16]
      const int hb = t == DType::Q5_0 ? 2 : 4;
      uint32_t qh;
      std::memcpy(&qh, b + hb, 4);
      const uint8_t* qs = b + hb + 4;
      const int bias = t == DType::Q5_0 ? 16 : 0;
      for (int j = 0; j < 16; ++j) {
        q[j] = int8_t(((qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - bias);
        q[j + 16] = int8_t(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - bias);
      }
      *d = half_at(b);
      *m = t == DType::Q5_1 ? half_at(b + 2) : 0.0f;
      return;
    }
    case DType::IQ4_NL:
      for (int j = 0; j < 16; ++j) {
        q[j] = kIq4nlValues[b[2 + j] & 0x0f];
        q[j + 16] = kIq4nlValues[b[2 + j] >> 4];
      }
      *d = half_at(b);
      *m = 0.0f;
      return;
    default: break;
  }
  fail(LLM_ERR_INTERNAL, "unpack_b32_ref: %s is not a 32-value GGUF block", dtype_name(t));
}

void matmul_ggml_scalar(const WeightView& w, const GgmlX& x, int64_t n, float* y, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols;
  const size_t bb = ggml_block_bytes(w.dtype);
  if (x.act == GgmlAct::Q8_K) {
    const int64_t nsb = cols / 256;
    const bool min_d = k_min_uses_d(w.dtype), sgn = k_signed(w.dtype);
    thread_local std::vector<KUnpacked> row;
    if (row.size() < size_t(nsb)) row.resize(size_t(nsb));
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = w.data + size_t(r) * w.row_bytes;
      for (int64_t sb = 0; sb < nsb; ++sb) unpack_k_ref(w.dtype, src + size_t(sb) * bb, &row[size_t(sb)]);
      for (int64_t i = 0; i < n; ++i) {
        const int8_t* xq = x.q + i * cols;
        const int16_t* bs = x.bsums + i * (cols / 16);
        float acc = 0.0f;
        for (int64_t sb = 0; sb < nsb; ++sb) {
          const KUnpacked& u = row[size_t(sb)];
          int32_t S = 0, M = 0;
          for (int k = 0; k < 16; ++k) {
            int32_t dot = 0;
            for (int j = 0; j < 16; ++j) {
              const int32_t code = sgn ? int32_t(int8_t(u.q[16 * k + j])) : int32_t(u.q[16 * k + j]);
              dot += code * xq[sb * 256 + 16 * k + j];
            }
            S += u.sv[8 * k] * dot;
            M += u.mn[k] * int32_t(bs[sb * 16 + k]);
          }
          const float dx = x.d[i * nsb + sb];
          if (min_d) {
            acc += (u.d * dx) * float(S - M);
          } else {
            acc += (u.d * dx) * float(S);
            acc -= (u.dm * dx) * float(M);
          }
        }
        y[i * w.rows + r] = acc;
      }
    }
    return;
  }
  const int64_t nb = cols / 32;
  const bool with_min = x.act == GgmlAct::Q8_1;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> dm;
  if (q.size() < size_t(cols)) q.resize(size_t(cols));
  if (dm.size() < size_t(2 * nb)) dm.resize(size_t(2 * nb));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.data + size_t(r) * w.row_bytes;
    for (int64_t b = 0; b < nb; ++b)
      unpack_b32_ref(w.dtype, src + size_t(b) * bb, &q[size_t(32 * b)], &dm[size_t(b)], &dm[size_t(nb + b)]);
    for (int64_t i = 0; i < n; ++i) {
      const int8_t* xq = x.q + i * cols;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0;
        for (int j = 0; j < 32; ++j) dot += int32_t(q[size_t(32 * b + j)]) * xq[32 * b + j];
        acc += (dm[size_t(b)] * x.d[i * nb + b]) * float(dot);
        if (with_min) acc += dm[size_t(nb + b)] * x.s[i * nb + b];
      }
      y[i * w.rows + r] = acc;
    }
  }
}

}  // namespace llm::cpu::kern
