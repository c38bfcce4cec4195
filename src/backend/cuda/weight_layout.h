// Device layout of weight matrices (see kernel_math.h, "weights on the
// device") and the host-side repacking that produces it during upload.
// Plain C++: the CPU tests check that repacked rows decode, through the
// kernels' own decode_chunk, to exactly what llm::dequantize_row gives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cuda/kernel_math.h"
#include "quant/dtype.h"

namespace llm::cuda {

struct MatrixLayout {
  WFormat format = WFormat::F32;
  DType block = DType::F32;    // WFormat::Ggml: the GGUF block type of the rows (Q5_0 .. IQ4_XS)
  int64_t rows = 0, cols = 0;
  int32_t group = 0;           // values per scale (Q8: 32, Q4: 32/64/128); 0 for float and Ggml formats
  int32_t groups_per_row = 0;  // scales per row in the separate array (0 for float and Ggml formats)
  size_t pitch = 0;            // bytes per row, multiple of 16
  int64_t chunks_per_row() const { return int64_t(pitch / kChunkBytes); }
  size_t data_bytes() const { return pitch * size_t(rows); }
  size_t scale_count() const { return size_t(groups_per_row) * size_t(rows); }
};

// Throws Error(LLM_ERR_UNSUPPORTED) for a dtype/group the device cannot hold.
// GGUF block types (dtype_is_ggml_block) become WFormat::Ggml: the stored
// blocks as they are, so rows must hold whole blocks (cols % 256 for the K
// types and IQ4_XS, cols % 32 for Q5_0 / Q5_1 / IQ4_NL); group is the block
// size (or 0).
MatrixLayout matrix_layout(DType t, uint32_t group, int64_t rows, int64_t cols);

// Repacks rows [r0, r0 + n) of w into the device layout `l` (same dtype and
// cols): data gets n * l.pitch bytes, scales n * l.groups_per_row f16 bits
// (may be null for float formats).
void repack_rows(const cpu::WeightView& w, const MatrixLayout& l, int64_t r0, int64_t n, uint8_t* data,
                 uint16_t* scales);

// Whether several matrices can be stacked into one device matrix (same
// dtype, group and cols), e.g. wq|wk|wv or w_gate|w_up.
bool can_stack(const std::vector<const cpu::WeightView*>& parts);

}  // namespace llm::cuda
