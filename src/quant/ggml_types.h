// ggml's tensor type numbers, as GGUF files store them. Here rather than in
// format/gguf.h because the block decoders (ggml_quants.h) need them too, and
// quant/ never includes format/ (docs/ARCHITECTURE.md, "Layering").
#pragma once

#include <cstdint>

namespace llm {

// ggml tensor types (values as in the GGUF spec).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};

}  // namespace llm
