// ModelSource: what every reader (GGUF, llama2.c, .llm) produces and what the
// .llm writer and the model builder consume. One description, many formats.
//
// Tensor names follow GGUF's llama convention:
//   token_embd.weight            [vocab_size, dim]
//   output_norm.weight           [dim]
//   output.weight                [vocab_size, dim]       (absent when tied to token_embd)
//   blk.{i}.attn_norm.weight     [dim]
//   blk.{i}.attn_q.weight        [n_heads * head_dim, dim]
//   blk.{i}.attn_k.weight        [n_kv_heads * head_dim, dim]
//   blk.{i}.attn_v.weight        [n_kv_heads * head_dim, dim]
//   blk.{i}.attn_output.weight   [dim, n_heads * head_dim]
//   blk.{i}.ffn_norm.weight      [dim]
//   blk.{i}.ffn_gate.weight      [hidden_dim, dim]       (w1)
//   blk.{i}.ffn_up.weight        [hidden_dim, dim]       (w3)
//   blk.{i}.ffn_down.weight      [dim, hidden_dim]       (w2)
// and, where the family's spec (format/family_spec.h) uses them:
//   rope_freqs.weight            [rope_dims / 2]         (Llama 3 frequency divisors)
//   blk.{i}.attn_{q,k,v,output}.bias                     (optional biases, e.g. Qwen 2)
//   blk.{i}.attn_qkv.weight      [q_dim + 2 kv_dim, dim] (fused q/k/v, split at load)
//   blk.{i}.ffn_up.weight        [2 hidden_dim, dim]     (with no ffn_gate: gate rows, then up rows)
//   blk.{i}.attn_q_norm.weight, attn_k_norm.weight [head_dim]   (QK-norm)
//   blk.{i}.post_attention_norm.weight, post_ffw_norm.weight [dim]  (post-norms)
// Shapes are outermost first (row-major): a matrix is [rows = out, cols = in].
// RoPE pairs dimensions as config.spec.rope_kind says: adjacent pairs for
// GGUF llama / llama2.c (Hugging Face Q/K weights are permuted into that
// layout by the converter), halves (NeoX) for Qwen, Gemma and Phi-3.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "format/family_spec.h"
#include "quant/dtype.h"

namespace llm {

struct ModelConfig {
  std::string arch = "llama";
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;  // usually dim / n_heads
  int32_t vocab_size = 0;
  int32_t seq_len = 0;   // trained context length
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  BlockSpec spec;        // what the family changes in the block (format/family_spec.h)
};

// Token types as in GGUF tokenizer.ggml.token_type.
enum class TokenType : int32_t { Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct VocabData {
  std::string model = "llama";      // "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE)
  std::string pre = "default";      // byte-level pre-tokenizer name (tokenizer.ggml.pre)
  std::vector<std::string> tokens;  // token text as GGUF stores it ('▁' for space in SPM)
  std::vector<float> scores;        // SPM merge scores (may be empty for gpt2)
  std::vector<int32_t> types;       // TokenType per token (may be empty: all Normal)
  std::vector<std::string> merges;  // gpt2: "a b" per line, rank = index
  int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1;
  bool add_bos = true;
  bool add_space_prefix = true;     // SPM dummy prefix
  std::string chat_template;        // the model's Jinja chat template (empty: none in the file)
};

struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  uint32_t group = 0;               // quant group size along the row (cols); 0 for float types
  std::vector<int64_t> shape;       // outermost first
  const uint8_t* data = nullptr;    // points into `owned` or into the mapped file
  size_t nbytes = 0;
  std::shared_ptr<std::vector<uint8_t>> owned;  // set when the reader had to produce the bytes

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.size() >= 2 ? shape[0] : 1; }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
};

struct ModelSource {
  ModelConfig config;
  VocabData vocab;
  std::vector<TensorData> tensors;
  std::map<std::string, std::string> meta;  // extra string metadata (provenance, quant recipe)
  std::shared_ptr<MappedFile> file;         // keeps mapped tensor bytes alive

  const TensorData* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

}  // namespace llm
