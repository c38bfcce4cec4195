// Qwen 2 / Qwen 2.5: the Llama block with q/k/v biases (attn_{q,k,v}.bias,
// used when present) and NeoX ("half") RoPE.
#include "format/model_source.h"
#include "format/family_spec.h"

namespace llm {

static void configure_qwen2(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  c.spec.rope_kind = RopeKind::NeoX;
}

extern const Family kQwen2Family = {"qwen2", configure_qwen2};

}  // namespace llm
