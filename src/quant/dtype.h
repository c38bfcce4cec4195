// Weight storage types. Values are stored in .llm files: never renumber.
//
//   F32, F16, BF16 : plain row-major arrays.
//   Q8             : per row, groups of 32 along the row; each group is an fp16
//                    scale d then 32 int8 q; value = d * q. 34 bytes / 32
//                    values, byte-identical to GGUF Q8_0.
//   Q4             : per row, groups of G (32, 64 or 128) along the row; each
//                    group is an fp16 scale d then G/2 bytes; byte j holds
//                    value j in its low nibble and value j + G/2 in its high
//                    nibble; value = d * (nibble - 8). At G = 32 this is
//                    byte-identical to GGUF Q4_0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llm {

enum class DType : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8: return "q8";
    case DType::Q4: return "q4";
  }
  return "?";
}

inline bool dtype_is_quantized(DType t) { return t == DType::Q8 || t == DType::Q4; }

// Bytes of one row of `cols` values (cols must be a multiple of the group
// for quantized types). Returns 0 if the combination is invalid.
inline size_t dtype_row_bytes(DType t, int64_t cols, uint32_t group) {
  if (cols < 0) return 0;
  switch (t) {
    case DType::F32: return size_t(cols) * 4;
    case DType::F16:
    case DType::BF16: return size_t(cols) * 2;
    case DType::Q8:
      if (group != 32 || cols % 32) return 0;
      return size_t(cols / 32) * 34;
    case DType::Q4:
      if ((group != 32 && group != 64 && group != 128) || cols % group) return 0;
      return size_t(cols / group) * (2 + group / 2);
  }
  return 0;
}

}  // namespace llm
