// Phi-3 / Phi-3.5 mini, Phi-4-mini: NeoX RoPE (partial on Phi-4-mini:
// rope.dimension_count < head_dim), q/k/v fused in attn_qkv.weight and
// gate/up fused in ffn_up.weight (both split at load), SiLU.
//   The files' attention.sliding_window is not applied, as in llama.cpp,
//   whose converters do not record which layers it covers (every Phi-3 mini
//   GGUF carries 2047 against a 4096 context). LongRoPE (the 128k models:
//   rope_factors_long / rope_factors_short, rope.scaling.attn_factor) is read
//   by read_common_hparams and the model builder (format/family_spec.h).
#include "format/model_source.h"
#include "format/family_spec.h"

namespace llm {

static void configure_phi3(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  c.spec.rope_kind = RopeKind::NeoX;
}

extern const Family kPhi3Family = {"phi3", configure_phi3};

}  // namespace llm
