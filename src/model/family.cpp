#include "format/family_spec.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "format/model_source.h"

namespace llm {

// One entry per family file (src/model/<family>.cpp).
extern const Family kLlamaFamily, kQwen2Family, kQwen3Family, kGemma2Family, kGemma3Family, kPhi3Family;

static const Family* const kFamilies[] = {&kLlamaFamily,  &kQwen2Family,  &kQwen3Family,
                                          &kGemma2Family, &kGemma3Family, &kPhi3Family};

const Family* find_family(const std::string& arch) {
  for (const Family* f : kFamilies)
    if (arch == f->arch) return f;
  return nullptr;
}

std::string family_names() {
  std::string s;
  for (const Family* f : kFamilies) s += (s.empty() ? "" : ", ") + std::string(f->arch);
  return s;
}

void read_common_hparams(const HParams& hp, ModelConfig& c) {
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  const std::string& a = hp.arch();
  c.arch = a;
  c.dim = int32_t(hp.integer("embedding_length", 1, kMaxI32, true, 0));
  c.hidden_dim = int32_t(hp.integer("feed_forward_length", 1, kMaxI32, true, 0));
  c.n_layers = int32_t(hp.integer("block_count", 1, 1 << 16, true, 0));
  c.n_heads = int32_t(hp.integer("attention.head_count", 1, 1 << 16, true, 0));
  c.n_kv_heads = int32_t(hp.integer("attention.head_count_kv", 1, c.n_heads, false, c.n_heads));
  LLM_CHECK(c.n_heads % c.n_kv_heads == 0, LLM_ERR_FORMAT,
            "%s.attention.head_count %d is not a multiple of %s.attention.head_count_kv %d", a.c_str(), c.n_heads,
            a.c_str(), c.n_kv_heads);
  c.seq_len = int32_t(hp.integer("context_length", 1, kMaxI32, false, 2048));
  c.rope_theta = float(hp.number("rope.freq_base", false, 10000.0));
  c.norm_eps = float(hp.number("attention.layer_norm_rms_epsilon", false, 1e-5));
  LLM_CHECK(c.rope_theta > 0, LLM_ERR_FORMAT, "%s.rope.freq_base must be positive", a.c_str());
  LLM_CHECK(c.norm_eps > 0, LLM_ERR_FORMAT, "%s.attention.layer_norm_rms_epsilon must be positive", a.c_str());
  // head_dim is independent of dim / n_heads (Gemma 3 270M: 4 heads of 256 on 640).
  const bool has_key_length = hp.has("attention.key_length");
  LLM_CHECK(has_key_length || c.dim % c.n_heads == 0, LLM_ERR_FORMAT,
            "%s.embedding_length %d is not a multiple of %d heads and %s.attention.key_length is absent", a.c_str(),
            c.dim, c.n_heads, a.c_str());
  const int64_t head_dim = hp.integer("attention.key_length", 1, 1 << 14, false, c.dim / c.n_heads);
  const int64_t v_len = hp.integer("attention.value_length", 1, 1 << 14, false, head_dim);
  LLM_CHECK(v_len == head_dim, LLM_ERR_UNSUPPORTED, "%s.attention.value_length %lld != key_length %lld", a.c_str(),
            (long long)v_len, (long long)head_dim);
  LLM_CHECK(head_dim % 2 == 0, LLM_ERR_FORMAT, "%s.attention.key_length %lld is odd", a.c_str(), (long long)head_dim);
  c.head_dim = int32_t(head_dim);
  const int64_t n_rot = hp.integer("rope.dimension_count", 2, head_dim, false, head_dim);
  LLM_CHECK(n_rot % 2 == 0, LLM_ERR_FORMAT, "%s.rope.dimension_count %lld is odd", a.c_str(), (long long)n_rot);
  c.spec.rope_dims = int32_t(n_rot);

  // RoPE scaling (llama.cpp's keys and meaning): linear is a position scale;
  // YaRN blends scaled and unscaled frequencies per pair (family.h) and
  // scales q and k; LongRoPE's factors are tensors (the model builder reads
  // them), its attention factor is rope.scaling.attn_factor. A key that
  // would change the math in a way not implemented here is refused.
  const std::string scaling = hp.text("rope.scaling.type");
  double factor = hp.number("rope.scaling.factor", false, 0.0);
  if (factor == 0.0) factor = hp.number("rope.scale_linear", false, 0.0);
  LLM_CHECK(scaling.empty() || scaling == "none" || scaling == "linear" || scaling == "yarn" || scaling == "longrope",
            LLM_ERR_UNSUPPORTED, "%s.rope.scaling.type '%s' is not supported (none, linear, yarn, longrope)", a.c_str(),
            scaling.c_str());
  LLM_CHECK(std::isfinite(factor) && factor >= 0.0, LLM_ERR_FORMAT, "%s.rope.scaling.factor %g must be positive",
            a.c_str(), factor);
  if (scaling != "none" && factor != 0.0) c.spec.rope_freq_scale = float(1.0 / factor);
  const int64_t orig = hp.integer("rope.scaling.original_context_length", 1, kMaxI32, false, c.seq_len);
  c.spec.rope_orig_ctx = int32_t(orig);
  double mscale = hp.number("rope.scaling.attn_factor", false, 1.0);
  LLM_CHECK(std::isfinite(mscale) && mscale > 0.0, LLM_ERR_FORMAT, "%s.rope.scaling.attn_factor %g must be positive",
            a.c_str(), mscale);
  const double log_mul = hp.number("rope.scaling.yarn_log_multiplier", false, 0.0);
  LLM_CHECK(log_mul == 0.0, LLM_ERR_UNSUPPORTED, "%s.rope.scaling.yarn_log_multiplier %g is not supported", a.c_str(),
            log_mul);
  if (scaling == "yarn") {
    const double ext = hp.number("rope.scaling.yarn_ext_factor", false, 1.0);
    const double fast = hp.number("rope.scaling.yarn_beta_fast", false, 32.0);
    const double slow = hp.number("rope.scaling.yarn_beta_slow", false, 1.0);
    LLM_CHECK(std::isfinite(ext) && ext >= 0.0 && ext <= 1.0, LLM_ERR_FORMAT,
              "%s.rope.scaling.yarn_ext_factor %g is outside [0, 1]", a.c_str(), ext);
    LLM_CHECK(std::isfinite(fast) && std::isfinite(slow) && fast > 0.0 && slow > 0.0 && fast >= slow, LLM_ERR_FORMAT,
              "%s.rope.scaling.yarn_beta_fast %g / yarn_beta_slow %g must be positive, fast >= slow", a.c_str(), fast,
              slow);
    c.spec.rope_yarn_ext = float(ext);
    c.spec.rope_yarn_beta_fast = float(fast);
    c.spec.rope_yarn_beta_slow = float(slow);
    // The magnitude correction: the file's own value when it has one (HF's
    // attention_factor), else 1 + 0.1 ln(factor).
    double m = factor > 1.0 ? 1.0 + 0.1 * std::log(factor) : 1.0;
    if (hp.has("rope.scaling.yarn_attn_factor")) {
      m = hp.number("rope.scaling.yarn_attn_factor", true, 1.0);
      LLM_CHECK(std::isfinite(m) && m > 0.0, LLM_ERR_FORMAT, "%s.rope.scaling.yarn_attn_factor %g must be positive",
                a.c_str(), m);
    }
    mscale *= m;
  }
  c.spec.rope_mscale = float(mscale);
}

void set_window_pattern(ModelConfig& c, int64_t w, bool (*on)(int32_t, int32_t)) {
  LLM_CHECK(w > 0 && w <= std::numeric_limits<int32_t>::max(), LLM_ERR_FORMAT,
            "%s.attention.sliding_window = %lld must be positive", c.arch.c_str(), (long long)w);
  c.spec.window.assign(size_t(c.n_layers), 0);
  for (int32_t l = 0; l < c.n_layers; ++l)
    if (on(l, c.n_layers)) c.spec.window[size_t(l)] = int32_t(w);
}

void validate_spec(const ModelConfig& c) {
  const BlockSpec& s = c.spec;
  const char* a = c.arch.c_str();
  LLM_CHECK(s.rope_dims >= 0 && s.rope_dims <= c.head_dim && s.rope_dims % 2 == 0, LLM_ERR_FORMAT,
            "%s: rope dimension count %d does not fit head_dim %d", a, s.rope_dims, c.head_dim);
  LLM_CHECK(s.window.empty() || s.window.size() == size_t(c.n_layers), LLM_ERR_FORMAT,
            "%s: %zu sliding-window entries for %d layers", a, s.window.size(), c.n_layers);
  for (int32_t w : s.window) LLM_CHECK(w >= 0, LLM_ERR_FORMAT, "%s: sliding window %d is negative", a, w);
  const float fs[] = {s.rope_base_local, s.rope_freq_scale, s.attn_scale,         s.attn_softcap,
                      s.final_softcap,   s.embed_scale,     s.norm_offset,        s.rope_yarn_ext,
                      s.rope_yarn_beta_fast, s.rope_yarn_beta_slow, s.rope_mscale};
  for (float f : fs) LLM_CHECK(std::isfinite(f), LLM_ERR_FORMAT, "%s: a model constant is not finite", a);
  LLM_CHECK(s.rope_base_local >= 0 && s.rope_freq_scale > 0 && s.attn_scale >= 0 && s.attn_softcap >= 0 &&
                s.final_softcap >= 0 && s.embed_scale > 0,
            LLM_ERR_FORMAT, "%s: a RoPE base, scale or softcap is negative", a);
  LLM_CHECK(s.rope_yarn_ext >= 0 && s.rope_yarn_ext <= 1 && s.rope_yarn_beta_slow > 0 &&
                s.rope_yarn_beta_fast >= s.rope_yarn_beta_slow && s.rope_mscale > 0,
            LLM_ERR_FORMAT, "%s: a YaRN parameter or RoPE attention factor is out of range", a);
  LLM_CHECK((s.rope_yarn_ext == 0 && !s.rope_longrope) || s.rope_orig_ctx > 0, LLM_ERR_FORMAT,
            "%s: YaRN and LongRoPE need the original context length", a);
  LLM_CHECK(int32_t(s.act) >= 0 && int32_t(s.act) <= int32_t(Activation::GeluTanh), LLM_ERR_FORMAT,
            "%s: unknown activation %d", a, int(s.act));
  LLM_CHECK(int32_t(s.rope_kind) >= 0 && int32_t(s.rope_kind) <= int32_t(RopeKind::NeoX), LLM_ERR_FORMAT,
            "%s: unknown RoPE kind %d", a, int(s.rope_kind));
}

}  // namespace llm

namespace llm {

std::string non_llama_feature(const ModelSource& src) {
  const ModelConfig& c = src.config;
  const BlockSpec& s = c.spec;
  if (s.rope_kind != RopeKind::Interleaved) return "NeoX RoPE";
  if (s.rope_dims != 0 && s.rope_dims != c.head_dim) return "partial rotary dimensions";
  if (s.rope_factors || s.rope_longrope || s.rope_freq_scale != 1.0f || s.rope_yarn_ext != 0 || s.rope_mscale != 1.0f)
    return "RoPE frequency factors or scaling";
  if (s.any_window()) return "sliding-window attention";
  if (s.attn_softcap > 0 || s.final_softcap > 0) return "logit softcaps";
  if (s.attn_scale > 0 && s.attn_scale != 1.0f / std::sqrt(float(c.head_dim))) return "a query scale";
  if (s.act != Activation::SiLU) return "GELU";
  if (s.embed_scale != 1.0f || s.norm_offset != 0.0f) return "an embedding scale or norm offset";
  if (s.qk_norm || s.post_norms) return "QK-norm or post-norms";
  for (const TensorData& t : src.tensors) {
    const std::string& n = t.name;
    if (n.find(".bias") != std::string::npos) return "bias '" + n + "'";
    if (n.find("attn_qkv") != std::string::npos) return "fused q/k/v";
  }
  if (c.n_layers > 0 && !src.find("blk.0.ffn_gate.weight")) return "fused gate/up";
  return std::string();
}

}  // namespace llm
