// llama.cpp's K-quant mixes as llm-convert plans: which matrix of a Llama
// model gets which GGUF block type (the rules of llama_tensor_get_type in
// llama.cpp's llama-quant.cpp, for a dense model without fused QKV).
//
//   q4_K_M : Q4_K; Q6_K for the output matrix (the token embedding when it
//            is tied), and for attn_v and ffn_down in the layers that
//            kquant_more_bits_layer picks (about half of them).
//   q5_K_M : the same with Q5_K in place of Q4_K.
//
// (llama.cpp's Q6_K is Q6_K everywhere, the output included: a plain format.)
// A row that is not whole 256-value blocks falls back as plan_llm_tensor
// says (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8).
#pragma once

#include <cstdint>
#include <string>

#include "convert/llm_file_writer.h"

namespace llm {

// llama.cpp's use_more_bits: the first and last eighth of the layers, and
// every third layer in between.
bool kquant_more_bits_layer(int32_t layer, int32_t n_layers);

// Sets opts (requantize, dtype, overrides) for the mix named `mix` ("q4_K_M",
// "q5_K_M"; also spelt in lower case) on a model of n_layers layers; tied:
// token_embd is the output matrix too. Returns false for another name.
bool kquant_mix_options(const std::string& mix, int32_t n_layers, bool tied, LlmConvertOptions* opts);

// The base type of the mix named `mix` (Q4_K for "q4_K_M"); false for another name.
bool kquant_mix_base(const std::string& mix, DType* base);

}  // namespace llm
