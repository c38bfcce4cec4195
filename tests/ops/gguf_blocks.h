// Random but well-formed rows of the GGUF block types (quant/dtype.h: Q5_0
// .. IQ4_NL) for the kernel tests. Every bit pattern of codes, high bits and
// packed scales is a valid block, so the bytes are random; only the fp16
// super-scales (d, and the minimum scale where there is one) are set to
// finite values of a realistic size, with both signs and an occasional zero.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "quant/dtype.h"

namespace llm::testing {

// Offsets of the fp16 scale and of the fp16 minimum scale (-1: none) in one block.
inline int gguf_d_offset(DType t) {
  switch (t) {
    case DType::Q2_K: return 80;
    case DType::Q3_K: return 108;
    case DType::Q6_K: return 208;
    default: return 0;
  }
}
inline int gguf_dmin_offset(DType t) {
  switch (t) {
    case DType::Q5_1: return 2;
    case DType::Q2_K: return 82;
    case DType::Q4_K: case DType::Q5_K: return 2;
    default: return -1;
  }
}

inline void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

inline std::vector<uint8_t> random_gguf_rows(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const uint32_t g = uint32_t(ggml_block_values(t));
  const size_t rb = dtype_row_bytes(t, cols, g), bb = ggml_block_bytes(t);
  std::vector<uint8_t> out(rb * size_t(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = uint8_t(byte(rng));
  // Scales so that values are around 0.05: per unit code, d times the
  // largest code magnitude times the sub-scale (K-quants, up to 63) ~ 1.
  const float d_size = g == 32 ? 0.005f : t == DType::Q6_K || t == DType::IQ4_XS ? 0.0002f : 0.0008f;
  std::uniform_real_distribution<float> mag(0.25f, 1.0f);
  std::uniform_int_distribution<int> coin(0, 15);
  for (size_t blk = 0; blk < out.size() / bb; ++blk) {
    uint8_t* p = out.data() + blk * bb;
    const int c = coin(rng);
    const float d = c == 0 ? 0.0f : (c % 2 ? -1.0f : 1.0f) * d_size * mag(rng);
    put_half(p + gguf_d_offset(t), d);
    if (gguf_dmin_offset(t) >= 0) put_half(p + gguf_dmin_offset(t), (coin(rng) % 4 ? 1.0f : -1.0f) * d_size * mag(rng));
  }
  return out;
}

}  // namespace llm::testing
