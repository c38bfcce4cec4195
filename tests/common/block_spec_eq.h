// Field-by-field equality of two block specs (format/family_spec.h), for tests that
// read one model through two paths (GGUF and .llm, GGUF and an HF folder).
// norm_offset is left to the caller: an HF Gemma folder stores its norms as
// w for 1 + w, so that one field differs by design there.
#pragma once

#include <gtest/gtest.h>

#include "format/family_spec.h"

namespace llm::testing {

inline void expect_same_block_spec(const BlockSpec& a, const BlockSpec& b) {
  EXPECT_EQ(int(a.rope_kind), int(b.rope_kind));
  EXPECT_EQ(a.rope_dims, b.rope_dims);
  EXPECT_EQ(a.rope_base_local, b.rope_base_local);
  EXPECT_EQ(a.rope_freq_scale, b.rope_freq_scale);
  EXPECT_EQ(a.rope_freq_scale_local, b.rope_freq_scale_local);
  EXPECT_EQ(a.rope_factors, b.rope_factors);
  EXPECT_EQ(a.rope_longrope, b.rope_longrope);
  EXPECT_EQ(a.rope_yarn_ext, b.rope_yarn_ext);
  EXPECT_EQ(a.rope_yarn_beta_fast, b.rope_yarn_beta_fast);
  EXPECT_EQ(a.rope_yarn_beta_slow, b.rope_yarn_beta_slow);
  EXPECT_EQ(a.rope_orig_ctx, b.rope_orig_ctx);
  EXPECT_FLOAT_EQ(a.rope_mscale, b.rope_mscale);
  EXPECT_EQ(a.attn_scale, b.attn_scale);
  EXPECT_EQ(a.attn_softcap, b.attn_softcap);
  EXPECT_EQ(a.final_softcap, b.final_softcap);
  EXPECT_EQ(int(a.act), int(b.act));
  EXPECT_EQ(a.embed_scale, b.embed_scale);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.post_norms, b.post_norms);
  EXPECT_EQ(a.window, b.window);
}

}  // namespace llm::testing
