#include "convert/kquant_mix.h"

namespace llm {

namespace {

enum class Mix { Q4KM, Q5KM, Q3KM, Q2K, IQ4XS, IQ4NL };

bool mix_of(const std::string& name, Mix* mix, DType* base) {
  struct Name {
    const char* upper;  // as llama.cpp spells the K part
    const char* lower;
    Mix mix;
    DType base;
  };
  static const Name kNames[] = {
      {"q4_K_M", "q4_k_m", Mix::Q4KM, DType::Q4_K}, {"q5_K_M", "q5_k_m", Mix::Q5KM, DType::Q5_K},
      {"q3_K_M", "q3_k_m", Mix::Q3KM, DType::Q3_K}, {"q2_K", "q2_k", Mix::Q2K, DType::Q2_K},
      {"iq4_xs", "iq4_xs", Mix::IQ4XS, DType::IQ4_XS}, {"iq4_nl", "iq4_nl", Mix::IQ4NL, DType::IQ4_NL},
  };
  for (const Name& n : kNames) {
    if (name == n.upper || name == n.lower) {
      *mix = n.mix, *base = n.base;
      return true;
    }
  }
  return false;
}

// The type of layer l's attn_v, attn_output and ffn_down in a mix (its base
// type where the mix keeps it).
struct LayerTypes {
  DType attn_v, attn_output, ffn_down;
};

LayerTypes layer_types(Mix mix, DType base, int32_t l, int32_t n, int32_t n_gqa) {
  LayerTypes t{base, base, base};
  switch (mix) {
    case Mix::Q4KM:
    case Mix::Q5KM:
      if (kquant_more_bits_layer(l, n)) t.attn_v = t.ffn_down = DType::Q6_K;
      break;
    case Mix::Q3KM:
      t.attn_v = l < 2 ? DType::Q5_K : DType::Q4_K;
      t.attn_output = DType::Q4_K;
      t.ffn_down = l < n / 16 ? DType::Q5_K : DType::Q4_K;
      break;
    case Mix::Q2K:
      t.attn_v = n_gqa >= 4 ? DType::Q4_K : DType::Q3_K;
      t.attn_output = t.ffn_down = DType::Q3_K;
      break;
    case Mix::IQ4XS:
    case Mix::IQ4NL:
      if (n_gqa >= 4) t.attn_v = DType::Q5_K;
      if (l < n / 8) t.ffn_down = DType::Q5_K;
      break;
  }
  return t;
}

}  // namespace

bool kquant_more_bits_layer(int32_t layer, int32_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

bool kquant_mix_base(const std::string& mix, DType* base) {
  Mix m;
  return mix_of(mix, &m, base);
}

bool kquant_mix_options(const std::string& mix, int32_t n_layers, bool tied, LlmConvertOptions* opts,
                        int32_t n_gqa) {
  Mix m;
  DType base;
  if (!mix_of(mix, &m, &base)) return false;
  opts->requantize = true;
  opts->dtype = base;
  opts->overrides[tied ? "token_embd.weight" : "output.weight"] = DType::Q6_K;
  for (int32_t l = 0; l < n_layers; ++l) {
    const LayerTypes t = layer_types(m, base, l, n_layers, n_gqa);
    const std::string b = "blk." + std::to_string(l) + ".";
    if (t.attn_v != base) opts->overrides[b + "attn_v.weight"] = t.attn_v;
    if (t.attn_output != base) opts->overrides[b + "attn_output.weight"] = t.attn_output;
    if (t.ffn_down != base) opts->overrides[b + "ffn_down.weight"] = t.ffn_down;
  }
  return true;
}

}  // namespace llm
