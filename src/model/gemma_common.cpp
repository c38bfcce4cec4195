#include "model/gemma_common.h"

#include <cmath>

#include "core/error.h"
#include "format/model_source.h"

namespace llm {

void configure_gemma_block(const HParams& hp, ModelConfig& c, int64_t default_window, int64_t pattern) {
  BlockSpec& s = c.spec;
  s.rope_kind = RopeKind::NeoX;
  s.act = Activation::GeluTanh;
  s.embed_scale = std::sqrt(float(c.dim));
  s.post_norms = true;
  s.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
  const int64_t w = hp.integer("attention.sliding_window", 0, 1ll << 31, false, default_window);
  if (!hp.has("attention.sliding_window") && w == 0) return;
  const char* a = c.arch.c_str();
  LLM_CHECK(w > 0, LLM_ERR_FORMAT, "%s.attention.sliding_window is 0", a);
  std::vector<int64_t> marks = hp.integers("attention.sliding_window_pattern");
  s.window.assign(size_t(c.n_layers), 0);
  if (marks.size() > 1) {
    LLM_CHECK(marks.size() == size_t(c.n_layers), LLM_ERR_FORMAT,
              "%s.attention.sliding_window_pattern has %zu entries for %d layers", a, marks.size(), c.n_layers);
    for (size_t l = 0; l < marks.size(); ++l) s.window[l] = marks[l] ? int32_t(w) : 0;
    return;
  }
  if (marks.size() == 1) pattern = marks[0];
  LLM_CHECK(pattern >= 0 && pattern <= (1 << 16), LLM_ERR_FORMAT, "%s.attention.sliding_window_pattern %lld", a,
            (long long)pattern);
  for (int32_t l = 0; l < c.n_layers; ++l)
    if (pattern == 0 || l % pattern < pattern - 1) s.window[size_t(l)] = int32_t(w);
}

}  // namespace llm
