// GGUF (v2/v3) reader. parse_gguf() validates everything against the buffer
// bounds and never reads outside it: the file is untrusted input.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/model_source.h"
#include "quant/ggml_types.h"

namespace llm {

struct GgufValue {
  enum Kind { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 } kind = U32;
  // Scalars are widened into one of these.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  Kind elem_kind = U32;              // for ARRAY
  std::vector<GgufValue> arr;        // for ARRAY of non-strings/strings

  int64_t as_int() const;            // throws Error(LLM_ERR_FORMAT) if not numeric
  double as_float() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;   // ggml order: innermost first
  GgmlType type;
  uint64_t offset;           // relative to the data section
  const uint8_t* data;       // absolute pointer into the buffer
  size_t nbytes;
};

struct GgufFile {
  uint32_t version = 0;
  uint32_t alignment = 32;
  std::map<std::string, GgufValue> kv;
  std::vector<GgufTensorInfo> tensors;

  const GgufValue* get(const std::string& key) const {
    auto it = kv.find(key);
    return it == kv.end() ? nullptr : &it->second;
  }
};

// Parses a whole GGUF buffer. Throws Error(LLM_ERR_FORMAT) on any
// inconsistency (bad magic, truncation, tensor outside the data, absurd
// counts), Error(LLM_ERR_UNSUPPORTED) for unknown tensor types.
// vocab_only: tensors may be absent or the data section missing (their
// `data` is then null). Metadata arrays are capped at 4M elements in total
// (each element becomes a GgufValue), far above any real vocabulary.
GgufFile parse_gguf(const uint8_t* data, size_t size, bool vocab_only = false);

// Bytes of n values of `type` (n must be a multiple of the block size); 0 if unknown.
size_t ggml_type_size(GgmlType type, int64_t n);
const char* ggml_type_name(GgmlType type);

// Maps a parsed GGUF to a ModelSource. general.architecture names the family
// (format/family_spec.h; unknown -> LLM_ERR_UNSUPPORTED naming it), whose file reads
// the hyper-parameters and the block spec. Tensors are kept as they are, zero
// copy: F32/F16/BF16, Q8_0 -> DType::Q8, Q4_0 -> DType::Q4 g32, Q4_1 ->
// DType::Q4M g32, and Q5_0, Q5_1, IQ4_NL, Q2_K .. Q6_K -> the DType of the
// same name (quant/dtype.h). Only Q8_1 and Q8_K are dequantized (bit-exactly
// like ggml) and re-quantized to Q8, with a warning through `log` (may be
// null; see convert_target in gguf.cpp); those tensors own their bytes. Every tensor is returned; the model builder checks each one's
// name and shape against the spec and refuses those it would not use.
// vocab_only: only config.arch/vocab_size and the vocabulary are filled.
struct Logger;
ModelSource gguf_to_model_source(const GgufFile& gguf, std::shared_ptr<MappedFile> file, bool vocab_only,
                                 const Logger* log);

// Convenience: map + parse + convert.
ModelSource read_gguf(const std::string& path, bool vocab_only, const Logger* log);

}  // namespace llm
