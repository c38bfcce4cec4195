// Hugging Face model folders: safetensors weights (single file or sharded
// with model.safetensors.index.json), config.json, and the tokenizer
// (tokenizer.model SentencePiece protobuf, or tokenizer.json).
//
// safetensors layout: u64 little-endian header length N, N bytes of JSON
//   { "__metadata__": {str: str}?, NAME: {"dtype": "F32", "shape": [..],
//     "data_offsets": [begin, end]}, ... }
// then the data; offsets are relative to the first byte after the header.
// Everything is untrusted: every offset, size and count is checked against
// the buffer, and a bad file is LLM_ERR_FORMAT, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/model_source.h"

namespace llm {

struct Logger;

namespace json {
class Value;
}

// --- safetensors container

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // as written: "F32", "F16", "BF16", "I8", ...
  std::vector<int64_t> shape;    // outermost first
  const uint8_t* data = nullptr; // into the parsed buffer; may be unaligned
  size_t nbytes = 0;
};

struct SafetensorsFile {
  std::vector<SafetensorsTensor> tensors;  // in header order
  std::map<std::string, std::string> metadata;
  const SafetensorsTensor* find(const std::string& name) const;
};

// Largest header accepted (the reference implementation's limit).
constexpr uint64_t kSafetensorsMaxHeader = uint64_t(100) << 20;

// Bytes per element of a safetensors dtype name; 0 if unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// Parses and validates a whole safetensors buffer: header length within the
// buffer and the limit, JSON object, each tensor's dtype/shape/offsets
// consistent (end - begin == numel * element size, no overflow, inside the
// data, no two tensors overlapping). Unknown dtype names are kept (their
// size cannot be checked beyond the bounds); the model mapping refuses them.
// Throws Error(LLM_ERR_FORMAT).
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size);

// --- Hugging Face model folder -> ModelSource

// True if `path` is a directory holding a config.json.
bool is_hf_folder(const std::string& path);

// Reads config.json (any family of format/hf_families.h: llama, mistral,
// qwen2, qwen3, gemma2, gemma3_text, phi3), the weights (model.safetensors,
// or the shards named by model.safetensors.index.json, or every
// *.safetensors in the folder) and the tokenizer (tokenizer.model preferred
// for SentencePiece vocabularies, since tokenizer.json has no scores;
// tokenizer.json otherwise). Tensors are renamed to the GGUF names of
// model_source.h; F32/F16/BF16 are kept as stored (zero copy where the bytes
// are aligned); for the interleaved-RoPE family Q and K are permuted from
// HF's rotate-half layout to the adjacent-pair layout (owned copies). A
// missing lm_head means tied embeddings. LLM_ERR_FORMAT for malformed files,
// LLM_ERR_UNSUPPORTED for other architectures, settings the engine does not
// implement, unknown decoder tensors or other dtypes, LLM_ERR_IO for missing
// files. `log` (may be null) receives warnings.
ModelSource read_hf_folder(const std::string& dir, const Logger* log);

// Hyper-parameters from a parsed config.json (exposed for tests; format/hf_families.cpp).
ModelConfig hf_config_to_model_config(const json::Value& config);

// Row permutation of a Q or K weight: HF rotate-half pairs (i, i + hd/2)
// become adjacent rows (2i, 2i+1) within each of n_heads heads:
// out row h*hd + 2i + j = in row h*hd + j*hd/2 + i. `inverse` maps back
// (GGUF -> HF, used by tests to build HF folders). rows = n_heads * head_dim;
// row_bytes bytes per row.
void permute_rope_rows(const uint8_t* in, uint8_t* out, int64_t n_heads, int64_t head_dim, size_t row_bytes,
                       bool inverse);

// --- Tokenizers

// SentencePiece ModelProto (tokenizer.model): pieces with scores and types,
// trainer spec (BPE only; unk/bos/eos/pad ids), normalizer spec
// (add_dummy_prefix). A minimal protobuf wire-format reader; unknown fields
// are skipped. Throws Error(LLM_ERR_FORMAT), LLM_ERR_UNSUPPORTED for unigram
// models.
VocabData parse_sentencepiece_model(const uint8_t* data, size_t size);

// tokenizer.json with a "BPE" model. SentencePiece-style (byte_fallback,
// '▁' pieces, Metaspace) becomes model "llama" with scores derived from the
// merge ranks (a merged piece scores -rank of the first merge producing it);
// byte-level (ByteLevel pre-tokenizer) becomes model "gpt2" with the merges
// and a pre-tokenizer name matched from the split regex (llama3, qwen2,
// tekken, gpt-2). tokenizer_config (tokenizer_config.json, may be null) and
// config (config.json, may be null) supply bos/eos/add_bos when present.
// `warning` (may be null) receives a note when a guess was made.
VocabData parse_hf_tokenizer_json(const json::Value& tokenizer, const json::Value* tokenizer_config,
                                  const json::Value* config, std::string* warning);

}  // namespace llm
