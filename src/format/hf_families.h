// A Hugging Face config.json seen through the model families (format/family_spec.h):
// the family's own configure() reads it through an HParams that maps the
// GGUF-style keys to config.json's, so one spec per family serves both
// formats. Also the plan of the folder's tensors: HF name -> GGUF name,
// expected shape, which rows need RoPE re-pairing, and tensors that HF keeps
// in config.json rather than in the weights (Llama 3 and LongRoPE factors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/json.h"
#include "format/model_source.h"

namespace llm {

struct HfTensor {
  std::string hf;
  std::string gguf;
  std::vector<int64_t> shape;
  int64_t rope_heads = 0;  // > 0: rows re-paired from rotate-half to adjacent pairs (interleaved RoPE)
  bool optional = false;
};

struct HfModelPlan {
  ModelConfig config;
  std::vector<HfTensor> tensors;
  std::vector<TensorData> extra;  // F32 tensors made from config.json (owned)
  bool tied = false;              // tie_word_embeddings
};

// model_type (or architectures) -> family; the family's configure() over the
// config; the tensor list. LLM_ERR_UNSUPPORTED for other model types and for
// settings the engine does not implement, LLM_ERR_FORMAT for bad values
// (naming the config.json key).
HfModelPlan hf_model_plan(const json::Value& config);

// Llama 3 RoPE frequency factors (rope_scaling rope_type "llama3"): pair i of
// rope_dims divides its frequency by the returned factor.
std::vector<float> llama3_rope_factors(int32_t rope_dims, double base, double factor, double low_freq_factor,
                                       double high_freq_factor, double original_context);

}  // namespace llm
