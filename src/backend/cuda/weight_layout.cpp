// Built with or without CUDA: no CUDA calls here.
#include "backend/cuda/weight_layout.h"

#include <cstring>

#include "core/error.h"

namespace llm::cuda {

namespace {

uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }

}  // namespace

MatrixLayout matrix_layout(DType t, uint32_t group, int64_t rows, int64_t cols) {
  LLM_CHECK(rows >= 0 && cols > 0, LLM_ERR_INTERNAL, "matrix_layout: bad shape [%lld, %lld]", (long long)rows,
            (long long)cols);
  LLM_CHECK(cols % 4 == 0, LLM_ERR_UNSUPPORTED, "the CUDA backend needs row lengths that are multiples of 4 (got %lld)",
            (long long)cols);
  MatrixLayout l;
  l.rows = rows;
  l.cols = cols;
  size_t bytes = 0;
  switch (t) {
    case DType::F32: l.format = WFormat::F32; bytes = size_t(cols) * 4; break;
    case DType::F16: l.format = WFormat::F16; bytes = size_t(cols) * 2; break;
    case DType::BF16: l.format = WFormat::BF16; bytes = size_t(cols) * 2; break;
    case DType::Q8:
      LLM_CHECK(group == 32 && cols % 32 == 0, LLM_ERR_UNSUPPORTED, "q8 with group %u and %lld cols", group,
                (long long)cols);
      l.format = WFormat::Q8;
      l.group = 32;
      bytes = size_t(cols);
      break;
    case DType::Q4:
      LLM_CHECK((group == 32 || group == 64 || group == 128) && cols % group == 0, LLM_ERR_UNSUPPORTED,
                "q4 with group %u and %lld cols", group, (long long)cols);
      l.format = WFormat::Q4;
      l.group = int32_t(group);
      bytes = size_t(cols) / 2;
      break;
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS: {
      const int64_t bv = ggml_block_values(t);
      LLM_CHECK(cols % bv == 0, LLM_ERR_UNSUPPORTED,
                "the CUDA backend runs %s weights as whole blocks of %lld values, but a row has %lld", dtype_name(t),
                (long long)bv, (long long)cols);
      LLM_CHECK(group == 0 || int64_t(group) == bv, LLM_ERR_UNSUPPORTED, "%s with group %u (its block is %lld)",
                dtype_name(t), group, (long long)bv);
      l.format = WFormat::Ggml;
      l.block = t;
      bytes = size_t(cols / bv) * ggml_block_bytes(t);
      break;
    }
    default: fail(LLM_ERR_UNSUPPORTED, "the CUDA backend cannot hold %s weights (dtype %u)", dtype_name(t), unsigned(t));
  }
  l.groups_per_row = l.group ? int32_t(cols / l.group) : 0;
  l.pitch = (bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
  return l;
}

void repack_rows(const cpu::WeightView& w, const MatrixLayout& l, int64_t r0, int64_t n, uint8_t* data,
                 uint16_t* scales) {
  LLM_CHECK(r0 >= 0 && n >= 0 && r0 + n <= w.rows && w.cols == l.cols, LLM_ERR_INTERNAL, "repack_rows: bad range");
  LLM_CHECK(l.format != WFormat::Ggml || (w.dtype == l.block && w.row_bytes <= l.pitch), LLM_ERR_INTERNAL,
            "repack_rows: %s rows into a %s layout", dtype_name(w.dtype), dtype_name(l.block));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = w.data + size_t(r0 + i) * w.row_bytes;
    uint8_t* dst = data + size_t(i) * l.pitch;
    std::memset(dst, 0, l.pitch);
    switch (l.format) {
      case WFormat::F32:
      case WFormat::F16:
      case WFormat::BF16:
      case WFormat::Ggml: std::memcpy(dst, src, w.row_bytes); break;
      case WFormat::Q8: {
        uint16_t* sc = scales + size_t(i) * size_t(l.groups_per_row);
        for (int32_t b = 0; b < l.groups_per_row; ++b) {
          const uint8_t* blk = src + size_t(b) * 34;  // [f16 d][32 x int8]
          sc[b] = load_u16(blk);
          std::memcpy(dst + size_t(b) * 32, blk + 2, 32);
        }
        break;
      }
      case WFormat::Q4: {
        uint16_t* sc = scales + size_t(i) * size_t(l.groups_per_row);
        const int32_t g = l.group, half = g / 2;
        for (int32_t b = 0; b < l.groups_per_row; ++b) {
          const uint8_t* blk = src + size_t(b) * size_t(2 + half);  // [f16 d][g/2 bytes: j | j + g/2]
          sc[b] = load_u16(blk);
          uint8_t* out = dst + size_t(b) * size_t(half);
          // Value v of the group: byte v (low nibble) for v < g/2, byte v - g/2 (high nibble) after.
          auto nib = [&](int32_t v) -> uint8_t {
            return v < half ? uint8_t(blk[2 + v] & 0x0f) : uint8_t(blk[2 + v - half] >> 4);
          };
          for (int32_t k = 0; k < half; ++k) out[k] = uint8_t(nib(2 * k) | (nib(2 * k + 1) << 4));
        }
        break;
      }
    }
  }
}

bool can_stack(const std::vector<const cpu::WeightView*>& parts) {
  if (parts.empty()) return false;
  for (const cpu::WeightView* p : parts)
    if (p->dtype != parts[0]->dtype || p->group != parts[0]->group || p->cols != parts[0]->cols) return false;
  return true;
}

}  // namespace llm::cuda
