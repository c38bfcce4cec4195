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
//   Q4M            : Q4 with a minimum: per group an fp16 scale d, an fp16
//                    minimum m, then G/2 bytes of nibbles laid out as in Q4;
//                    value = d * nibble + m (nibble 0..15). 5 bits / value at
//                    G = 32, byte-identical to GGUF Q4_1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llm {

enum class DType : uint32_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4, Q4M = 5 };

constexpr uint32_t kDTypeCount = 6;  // one past the largest DType value

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8: return "q8";
    case DType::Q4: return "q4";
    case DType::Q4M: return "q4m";
  }
  return "?";
}

inline bool dtype_is_quantized(DType t) { return t == DType::Q8 || t == DType::Q4 || t == DType::Q4M; }

// Q4 and Q4M: 4-bit nibbles in groups of 32, 64 or 128.
inline bool dtype_is_q4(DType t) { return t == DType::Q4 || t == DType::Q4M; }

// Bytes before the nibbles of one Q4/Q4M group (the fp16 scale, and the minimum).
inline int64_t q4_header_bytes(DType t) { return t == DType::Q4M ? 4 : 2; }

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
    case DType::Q4M:
      if ((group != 32 && group != 64 && group != 128) || cols % group) return 0;
      return size_t(cols / group) * (4 + group / 2);
  }
  return 0;
}

}  // namespace llm
