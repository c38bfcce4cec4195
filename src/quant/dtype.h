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
//   Q5_0 .. IQ4_NL : GGUF blocks stored byte for byte as ggml lays them out
//                    (ggml-common.h), run natively; `group` is the block
//                    (32 or 256 values) and rows are whole blocks:
//     Q5_0   32 values, 22 B: f16 d | u32 qh (5th bits) | 16 B nibbles; d * (q - 16)
//     Q5_1   32 values, 24 B: f16 d | f16 m | u32 qh | 16 B nibbles; d * q + m
//     Q2_K  256 values, 84 B: 16 B scales/mins (4+4 bits) | 64 B 2-bit | f16 d | f16 dmin
//     Q3_K  256 values, 110 B: 32 B high bits | 64 B 2-bit | 12 B 6-bit scales | f16 d
//     Q4_K  256 values, 144 B: f16 d | f16 dmin | 12 B 6-bit scales/mins | 128 B nibbles
//     Q5_K  256 values, 176 B: f16 d | f16 dmin | 12 B scales/mins | 32 B 5th bits | 128 B nibbles
//     Q6_K  256 values, 210 B: 128 B low 4 bits | 64 B high 2 bits | 16 x int8 scales | f16 d
//     IQ4_NL 32 values, 18 B: f16 d | 16 B nibbles indexing a fixed 16-value table
//     IQ4_XS 256 values, 136 B: f16 d | u16 high scale bits | 4 B low scale bits |
//                    128 B nibbles into IQ4_NL's table; 6-bit scale per 32 (bias 32)
#pragma once

#include <cstddef>
#include <cstdint>

namespace llm {

enum class DType : uint32_t {
  F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4, Q4M = 5,
  Q5_0 = 6, Q5_1 = 7, Q2_K = 8, Q3_K = 9, Q4_K = 10, Q5_K = 11, Q6_K = 12, IQ4_NL = 13,
  IQ4_XS = 14,
};

constexpr uint32_t kDTypeCount = 15;  // one past the largest DType value

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8: return "q8";
    case DType::Q4: return "q4";
    case DType::Q4M: return "q4m";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_K";
    case DType::Q3_K: return "q3_K";
    case DType::Q4_K: return "q4_K";
    case DType::Q5_K: return "q5_K";
    case DType::Q6_K: return "q6_K";
    case DType::IQ4_NL: return "iq4_nl";
    case DType::IQ4_XS: return "iq4_xs";
  }
  return "?";
}

// A GGUF block type kept as stored (Q5_0 .. IQ4_XS above).
inline bool dtype_is_ggml_block(DType t) { return t >= DType::Q5_0 && t <= DType::IQ4_XS; }

// Values per block of a GGUF block type (its only valid group); 0 otherwise.
inline int64_t ggml_block_values(DType t) {
  switch (t) {
    case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: return 32;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_XS: return 256;
    default: return 0;
  }
}

// Bytes per block of a GGUF block type; 0 otherwise.
inline size_t ggml_block_bytes(DType t) {
  switch (t) {
    case DType::Q5_0: return 22;
    case DType::Q5_1: return 24;
    case DType::IQ4_NL: return 18;
    case DType::Q2_K: return 84;
    case DType::Q3_K: return 110;
    case DType::Q4_K: return 144;
    case DType::Q5_K: return 176;
    case DType::Q6_K: return 210;
    case DType::IQ4_XS: return 136;
    default: return 0;
  }
}

// Stored in groups (blocks) with per-group scales: everything but F32/F16/BF16.
inline bool dtype_is_quantized(DType t) {
  return t == DType::Q8 || t == DType::Q4 || t == DType::Q4M || dtype_is_ggml_block(t);
}

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
    case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_XS: {
      const int64_t b = ggml_block_values(t);
      if (group != uint32_t(b) || cols % b) return 0;
      return size_t(cols / b) * ggml_block_bytes(t);
    }
  }
  return 0;
}

}  // namespace llm
