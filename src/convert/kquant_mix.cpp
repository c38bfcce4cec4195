#include "convert/kquant_mix.h"

namespace llm {

namespace {

// The mix's base type and the type of its "more bits" matrices.
bool mix_types(const std::string& mix, DType* base, DType* more) {
  if (mix == "q4_K_M" || mix == "q4_k_m") {
    *base = DType::Q4_K, *more = DType::Q6_K;
  } else if (mix == "q5_K_M" || mix == "q5_k_m") {
    *base = DType::Q5_K, *more = DType::Q6_K;
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool kquant_more_bits_layer(int32_t layer, int32_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

bool kquant_mix_base(const std::string& mix, DType* base) {
  DType more;
  return mix_types(mix, base, &more);
}

bool kquant_mix_options(const std::string& mix, int32_t n_layers, bool tied, LlmConvertOptions* opts) {
  DType base, more;
  if (!mix_types(mix, &base, &more)) return false;
  opts->requantize = true;
  opts->dtype = base;
  opts->overrides[tied ? "token_embd.weight" : "output.weight"] = more;
  for (int32_t l = 0; l < n_layers; ++l) {
    if (!kquant_more_bits_layer(l, n_layers)) continue;
    const std::string b = "blk." + std::to_string(l) + ".";
    opts->overrides[b + "attn_v.weight"] = more;
    opts->overrides[b + "ffn_down.weight"] = more;
  }
  return true;
}

}  // namespace llm
