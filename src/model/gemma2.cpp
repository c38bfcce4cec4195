// Gemma 2: NeoX RoPE, GELU(tanh)-gated FFN, embeddings scaled by sqrt(dim),
// RMSNorm after attention and after the FFN (post_attention_norm,
// post_ffw_norm) before each residual add, attention-logit softcap (default
// 50) and final-logit softcap (default 30), sliding window (default 4096)
// on even layers (pattern 2: layer l is local when l % 2 == 0). The output
// is always the token embedding. GGUF stores norm weights as 1 + w already.
#include <cmath>

#include "format/model_source.h"
#include "format/family_spec.h"
#include "model/gemma_common.h"

namespace llm {

static void configure_gemma2(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  configure_gemma_block(hp, c, /*default_window=*/4096, /*pattern=*/2);
  c.spec.attn_softcap = float(hp.number("attn_logit_softcapping", false, 50.0));
  c.spec.final_softcap = float(hp.number("final_logit_softcapping", false, 30.0));
  c.spec.rope_base_local = float(hp.number("rope.freq_base_swa", false, c.rope_theta));
  c.spec.rope_freq_scale_local = c.spec.rope_freq_scale;
}

extern const Family kGemma2Family = {"gemma2", configure_gemma2};

}  // namespace llm
