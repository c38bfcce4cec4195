// Writing .llm files (docs/FORMAT.md): write_llm for a model in memory, the
// streaming LlmWriter for models that do not fit, and convert_to_llm, which
// re-encodes tensors into other weight formats while writing. Offline code:
// llm-convert and the tests link it (llm_tools); libllm.so only reads .llm
// files (format/llm_file.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "format/llm_file.h"
#include "format/model_source.h"

namespace llm {

class ThreadPool;

struct LlmWriteOptions {
  bool allow_zstd = true;       // try zstd per tensor; kept only where it saves >= min_saving
  // Fraction of the raw size zstd must save to be kept. Decompressing costs
  // load time (TinyLlama q4: 0.1 s raw vs 0.65 s zstd on 2 cores), so a few
  // percent is not worth it: random-like q8/q4 blocks (3-5%) stay raw and
  // mmap-able, float tensors (15-30% with byte planes) are compressed.
  double min_saving = 0.08;
  int zstd_level = 3;
  uint32_t chunk_bytes = 1u << 20;  // independent zstd frames of this raw size
  std::function<void(float)> progress;  // optional, 0..1
  ThreadPool* pool = nullptr;   // parallel compression (nullptr: the calling thread only)
};

struct LlmTensorReport {
  std::string name;
  DType dtype = DType::F32;
  LlmCodec codec = LlmCodec::Raw;
  uint64_t raw_bytes = 0, stored_bytes = 0;
};

struct LlmWriteReport {
  uint64_t raw_bytes = 0, stored_bytes = 0;
  uint64_t file_bytes = 0;
  // per dtype name: {raw, stored}
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;
  std::vector<LlmTensorReport> tensors;  // in file order
};

// Writes `src` to `path`. Throws Error(LLM_ERR_IO) on write failure,
// Error(LLM_ERR_INVALID_ARGUMENT) if a tensor's size does not match its
// dtype and shape. The file appears under `path` only when complete.
LlmWriteReport write_llm(const ModelSource& src, const std::string& path, const LlmWriteOptions& opts = {});

// --- Streaming writer: for models that do not fit in memory (conversion
// with quantization, synthetic weights). Tensor bytes are produced row by row.

struct LlmTensorSpec {
  std::string name;
  DType dtype = DType::F32;
  uint32_t group = 0;
  std::vector<int64_t> shape;  // outermost first
};

// Writes rows [row0, row0 + n_rows) of the current tensor, in its stored
// dtype, to dst (n_rows * row_bytes bytes). A "row" is the innermost
// dimension. It may be asked for the same rows twice (when zstd does not pay
// off the writer rewrites the tensor raw), so it must be deterministic.
using LlmRowSource = std::function<void(int64_t row0, int64_t n_rows, uint8_t* dst)>;

class LlmWriter {
 public:
  // Validates the specs (LLM_ERR_INVALID_ARGUMENT) and opens `path`.tmp.
  LlmWriter(const std::string& path, const ModelConfig& config, const VocabData& vocab,
            const std::map<std::string, std::string>& meta, std::vector<LlmTensorSpec> tensors,
            const LlmWriteOptions& opts = {});
  ~LlmWriter();  // an unfinished file is removed
  LlmWriter(const LlmWriter&) = delete;
  LlmWriter& operator=(const LlmWriter&) = delete;

  // Writes the next tensor (in spec order).
  void write_tensor(const LlmRowSource& rows);
  // Writes table and header, renames the file into place.
  LlmWriteReport finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// --- Conversion: re-encode tensors into other weight formats while writing.

struct LlmConvertOptions {
  bool requantize = false;   // false: every tensor keeps its dtype
  DType dtype = DType::F32;  // format of the 2-D matrices
  uint32_t group = 32;       // q4 group size (q8 is always 32; GGUF block types: their block)
  // Matrices (by exact name) that take another format than `dtype`, e.g.
  // token_embd.weight -> Q8 in a q4 model; the same fallback rules apply.
  std::map<std::string, DType> overrides;
  // Layer matrices by kind, the name after "blk.N." (e.g. "attn_v.weight" ->
  // Q8 in every layer); an entry in `overrides` wins over one here.
  std::map<std::string, DType> kind_overrides;
};

// The kind of a layer tensor: "blk.12.attn_v.weight" -> "attn_v.weight";
// names outside the blk.N. scheme -> "".
std::string layer_tensor_kind(const std::string& name);

// The format a matrix asks for before its row length is checked: its entry in
// opts.overrides, else in opts.kind_overrides, else opts.dtype.
DType wanted_llm_dtype(const std::string& name, const LlmConvertOptions& opts);

// The stored format of one tensor: 1-D tensors (norms) become f32; matrices
// take wanted_llm_dtype unless their rows do not split into whole groups.
// Then a 256-value K type falls back to llama.cpp's 32-value choice (Q4_K ->
// Q5_0, Q5_K -> Q5_1, Q6_K -> Q8) and anything else, or a row that is not
// whole 32-blocks either, to f16 (f32 when the format is f32); either way a
// line is appended to `notes`.
LlmTensorSpec plan_llm_tensor(const std::string& name, const std::vector<int64_t>& shape, DType src_dtype,
                              uint32_t src_group, const LlmConvertOptions& opts, std::vector<std::string>* notes);

// Writes src to path with every tensor converted as planned (dequantize_row
// then quantize_any_row, rows in parallel on w.pool; tensors whose format does
// not change are copied bit for bit).
LlmWriteReport convert_to_llm(const ModelSource& src, const std::string& path, const LlmConvertOptions& opts,
                              const LlmWriteOptions& w = {}, std::vector<std::string>* notes = nullptr);

}  // namespace llm
