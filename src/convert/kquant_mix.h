// llama.cpp's quantization mixes as llm-convert plans: which matrix of a
// Llama model gets which GGUF block type (the rules of llama_tensor_get_type
// in llama.cpp's llama-quant.cpp, for a dense model without fused QKV and
// without an importance matrix). n = layers, gqa = n_heads / n_kv_heads.
//
//   q4_K_M : Q4_K; Q6_K for attn_v and ffn_down in the layers that
//            kquant_more_bits_layer picks (about half of them).
//   q5_K_M : the same with Q5_K in place of Q4_K.
//   q3_K_M : Q3_K; Q4_K for attn_output; attn_v Q5_K in layers 0 and 1,
//            Q4_K elsewhere; ffn_down Q5_K in layers < n/16, Q4_K elsewhere.
//   q2_K   : Q2_K; Q3_K for attn_output and ffn_down; attn_v Q4_K when
//            gqa >= 4, Q3_K otherwise.
//   iq4_xs : IQ4_XS; ffn_down Q5_K in layers < n/8; attn_v Q5_K when gqa >= 4.
//   iq4_nl : the same with IQ4_NL in place of IQ4_XS.
//
// Every mix gives the output matrix (the token embedding when it is tied)
// Q6_K. (llama.cpp's Q6_K is Q6_K everywhere, the output included: a plain
// format.) Left out: llama.cpp's rules for 70B models (attn_v Q3_K/Q4_K ->
// Q5_K), mixtures of experts and Falcon. A row that is not whole blocks falls
// back as plan_llm_tensor says (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8,
// Q2_K and Q3_K -> Q4 (ggml's Q4_0), IQ4_XS -> IQ4_NL, as llama.cpp does).
#pragma once

#include <cstdint>
#include <string>

#include "convert/llm_file_writer.h"

namespace llm {

// llama.cpp's use_more_bits: the first and last eighth of the layers, and
// every third layer in between.
bool kquant_more_bits_layer(int32_t layer, int32_t n_layers);

// Sets opts (requantize, dtype, overrides) for the mix named `mix` ("q4_K_M",
// "q5_K_M", "q3_K_M", "q2_K", "iq4_xs", "iq4_nl"; the K names also spelt in
// lower case) on a model of n_layers layers; tied: token_embd is the output
// matrix too; n_gqa: query heads per KV head (n_heads / n_kv_heads), which
// the q2_K and iq4 mixes read. Returns false for another name.
bool kquant_mix_options(const std::string& mix, int32_t n_layers, bool tied, LlmConvertOptions* opts,
                        int32_t n_gqa = 1);

// The base type of the mix named `mix` (Q4_K for "q4_K_M"); false for another name.
bool kquant_mix_base(const std::string& mix, DType* base);

}  // namespace llm
