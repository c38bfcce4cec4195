// What Gemma 2 and Gemma 3 share (gemma2.cpp, gemma3.cpp).
#pragma once

#include "format/family_spec.h"

namespace llm {

// NeoX RoPE, GELU(tanh), sqrt(dim) embedding scale, post-norms, query scale
// 1 / sqrt(head_dim) (llama.cpp uses dim / n_heads instead for the 27B
// sizes only, whose query_pre_attn_scalar differs), and the sliding window:
// attention.sliding_window (or default_window when absent; 0 = none) on
// the layers that attention.sliding_window_pattern marks. The pattern key is
// either a number n (layer l is local unless l % n == n - 1) or one bool per
// layer; `pattern` is the family's n when the key is absent.
void configure_gemma_block(const HParams& hp, ModelConfig& c, int64_t default_window, int64_t pattern);

}  // namespace llm
