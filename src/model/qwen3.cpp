// Qwen 3 (dense): NeoX RoPE, per-head RMSNorm of q and k before RoPE
// (attn_q_norm / attn_k_norm [head_dim]), head_dim from attention.key_length
// (128 on every size, not dim / n_heads), no biases.
#include "format/model_source.h"
#include "format/family_spec.h"

namespace llm {

static void configure_qwen3(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  c.spec.rope_kind = RopeKind::NeoX;
  c.spec.qk_norm = true;
}

extern const Family kQwen3Family = {"qwen3", configure_qwen3};

}  // namespace llm
