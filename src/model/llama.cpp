// Llama 2, Llama 3.0-3.2, SmolLM2, TinyLlama, Mistral 7B (stored as llama).
//   interleaved RoPE (GGUF's converter permutes Hugging Face q/k into it);
//   Llama 3.1+: rope_freqs.weight divides each frequency (the model builder
//   finds the tensor); optional q/k/v/o biases are used when present;
//   SiLU-gated FFN; output tied when output.weight is absent.
//   llama.attention.sliding_window (Mistral 7B v0.1 style, every layer) is
//   honoured when a file carries it.
#include "format/model_source.h"
#include "format/family_spec.h"

namespace llm {

static void configure_llama(const HParams& hp, ModelConfig& c) {
  read_common_hparams(hp, c);
  c.spec.rope_kind = RopeKind::Interleaved;
  if (hp.has("attention.sliding_window"))
    set_window_pattern(c, hp.integer("attention.sliding_window", 0, 1ll << 31, true, 0),
                       [](int32_t, int32_t) { return true; });
}

extern const Family kLlamaFamily = {"llama", configure_llama};

}  // namespace llm
