// Gemma 3 (text): Gemma 2's block (NeoX RoPE, GELU(tanh) FFN, sqrt(dim)
// embedding scale, post-norms) plus per-head q/k RMSNorm, no attention
// softcap, an optional final softcap, and a sliding window (512 on 270M/1B)
// on five of every six layers (pattern 6: layer l is global when
// l % 6 == 5). Local layers use RoPE base 10000 (rope.freq_base_swa) and no
// linear scaling; global layers use rope.freq_base (1e6) and the file's
// scaling (linear 8 on 4B+). head_dim is independent of dim / n_heads
// (270M: 4 heads of 256 on a 640-wide model).
#include "format/model_source.h"
#include "format/family_spec.h"
#include "model/gemma_common.h"

namespace llm {

static void configure_gemma3(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  configure_gemma_block(hp, c, /*default_window=*/0, /*pattern=*/6);
  c.spec.qk_norm = true;
  c.spec.final_softcap = float(hp.number("final_logit_softcapping", false, 0.0));
  c.spec.rope_base_local = float(hp.number("rope.freq_base_swa", false, 10000.0));
  c.spec.rope_freq_scale_local = 1.0f;
}

extern const Family kGemma3Family = {"gemma3", configure_gemma3};

}  // namespace llm
