#include "format/hf_families.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "format/family_spec.h"

namespace llm {

namespace {

constexpr double kPi = 3.14159265358979323846;

// Which family reads a model_type, and what HF does differently from GGUF.
struct HfKind {
  const char* model_type;
  const char* architecture;  // the class name in "architectures"
  const char* arch;          // the family (GGUF general.architecture)
  const char* act;           // the activation config.json must name
};

const HfKind kKinds[] = {
    {"llama", "LlamaForCausalLM", "llama", "silu"},
    {"mistral", "MistralForCausalLM", "llama", "silu"},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", "silu"},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", "silu"},
    {"gemma2", "Gemma2ForCausalLM", "gemma2", "gelu_pytorch_tanh"},
    {"gemma3_text", "Gemma3ForCausalLM", "gemma3", "gelu_pytorch_tanh"},
    {"phi3", "Phi3ForCausalLM", "phi3", "silu"},
};

bool names_architecture(const json::Value& c, const char* cls) {
  const json::Value* a = c.find("architectures");
  if (!a || !a->is_array()) return false;
  for (const auto& v : a->as_array("architectures"))
    if (v.is_string() && v.as_string("architectures") == cls) return true;
  return false;
}

const json::Value* member(const json::Value* obj, const char* key) {
  if (!obj) return nullptr;
  const json::Value* v = obj->find(key);
  return v && !v->is_null() ? v : nullptr;
}

// GGUF-style keys (format/family_spec.h) answered from config.json.
class HfHParams final : public HParams {
 public:
  HfHParams(const json::Value& c, std::string arch) : c_(c), arch_(std::move(arch)) {
    rs_ = member(&c_, "rope_scaling");
    if (!rs_) rs_ = member(&c_, "rope_parameters");  // newer transformers
    if (rs_) rs_->as_object("config.json rope_scaling");
  }

  bool has(const std::string& key) const override { return lookup(key) != nullptr || synthesized(key); }

  int64_t integer(const std::string& key, int64_t lo, int64_t hi, bool required, int64_t def) const override {
    if (key == "rope.dimension_count") return rope_dims(lo, hi, def);
    const char* name = nullptr;
    const json::Value* v = lookup(key, &name);
    if (!v) {
      LLM_CHECK(!required, LLM_ERR_FORMAT, "config.json: missing '%s'", name ? name : key.c_str());
      return def;
    }
    const int64_t x = v->as_int(name);
    LLM_CHECK(x >= lo && x <= hi, LLM_ERR_FORMAT, "config.json: '%s' = %lld is out of range [%lld, %lld]", name,
              (long long)x, (long long)lo, (long long)hi);
    return x;
  }

  double number(const std::string& key, bool required, double def) const override {
    if (key == "rope.scaling.attn_factor") return longrope_attn_factor(def);
    const char* name = nullptr;
    const json::Value* v = lookup(key, &name);
    if (!v) {
      LLM_CHECK(!required, LLM_ERR_FORMAT, "config.json: missing '%s'", name ? name : key.c_str());
      return def;
    }
    return v->as_double(name);
  }

  std::vector<int64_t> integers(const std::string& key) const override {
    std::vector<int64_t> out;
    if (key != "attention.sliding_window_pattern") return out;
    if (const json::Value* lt = member(&c_, "layer_types")) {
      for (const auto& t : lt->as_array("layer_types")) {
        const std::string& s = t.as_string("layer_types");
        LLM_CHECK(s == "sliding_attention" || s == "full_attention", LLM_ERR_UNSUPPORTED,
                  "config.json: layer type '%.64s' is not supported", s.c_str());
        out.push_back(s == "sliding_attention");
      }
      return out;
    }
    if (const json::Value* p = member(&c_, "sliding_window_pattern")) out.push_back(p->as_int("sliding_window_pattern"));
    return out;
  }

  std::string text(const std::string& key) const override {
    if (key != "rope.scaling.type" || !rs_) return std::string();
    const std::string t = scaling_type();
    // Llama 3's factors become rope_freqs.weight (hf_model_plan), as GGUF stores them.
    return t == "llama3" || t == "default" ? std::string() : t;
  }

  const std::string& arch() const override { return arch_; }

  std::string scaling_type() const {
    if (!rs_) return std::string();
    std::string t = rs_->get_string("rope_type", "");
    if (t.empty()) t = rs_->get_string("type", "");
    if (t == "su") t = "longrope";  // the name Phi-3's first configs used
    return t;
  }
  const json::Value* scaling() const { return rs_; }

  // The context the model was trained at before extension (config top level
  // for Phi-3, inside rope_scaling for YaRN and Llama 3).
  const json::Value* original_context(const char** name = nullptr) const {
    if (name) *name = "original_max_position_embeddings";
    if (const json::Value* v = member(rs_, "original_max_position_embeddings")) return v;
    return member(&c_, "original_max_position_embeddings");
  }

 private:
  // HF key of a GGUF-style key (nullptr: none), and its value if present.
  const json::Value* lookup(const std::string& key, const char** name_out = nullptr) const {
    struct Map {
      const char* gguf;
      const char* hf;
    };
    static const Map kTop[] = {
        {"embedding_length", "hidden_size"},
        {"feed_forward_length", "intermediate_size"},
        {"block_count", "num_hidden_layers"},
        {"attention.head_count", "num_attention_heads"},
        {"attention.head_count_kv", "num_key_value_heads"},
        {"context_length", "max_position_embeddings"},
        {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
        {"attention.key_length", "head_dim"},
        {"attention.value_length", "head_dim"},
        {"attn_logit_softcapping", "attn_logit_softcapping"},
        {"final_logit_softcapping", "final_logit_softcapping"},
        {"rope.freq_base_swa", "rope_local_base_freq"},
    };
    for (const Map& m : kTop) {
      if (key != m.gguf) continue;
      if (name_out) *name_out = m.hf;
      return member(&c_, m.hf);
    }
    if (key == "rope.freq_base") {
      if (name_out) *name_out = "rope_theta";
      if (const json::Value* v = member(&c_, "rope_theta")) return v;
      return member(rs_, "rope_theta");
    }
    if (key == "attention.sliding_window") {
      if (name_out) *name_out = "sliding_window";
      // Qwen 2 configs carry a window with use_sliding_window false; Phi-3's
      // family does not apply its window (model/phi3.cpp).
      const json::Value* use = member(&c_, "use_sliding_window");
      if (use && !use->as_bool("use_sliding_window")) return nullptr;
      return member(&c_, "sliding_window");
    }
    if (key.compare(0, 13, "rope.scaling.") == 0 && rs_) {
      const std::string k = key.substr(13);
      if (k == "original_context_length") return original_context(name_out);
      const char* hf = k == "factor"                ? "factor"
                       : k == "yarn_beta_fast"      ? "beta_fast"
                       : k == "yarn_beta_slow"      ? "beta_slow"
                       : k == "yarn_attn_factor"    ? "attention_factor"
                       : k == "yarn_ext_factor"     ? "extrapolation_factor"
                       : k == "yarn_log_multiplier" ? "mscale_all_dim"
                                                    : nullptr;
      if (!hf) return nullptr;
      const std::string t = scaling_type();
      // Llama 3's factor shapes rope_freqs.weight, not a linear scale.
      if (t == "llama3" || t == "longrope") return nullptr;
      if (name_out) *name_out = hf;
      if (k == "yarn_attn_factor" && !member(rs_, hf)) return member(rs_, "attn_factor");
      return member(rs_, hf);
    }
    if (name_out) *name_out = nullptr;
    return nullptr;
  }

  bool synthesized(const std::string& key) const {
    return (key == "rope.dimension_count" && member(&c_, "partial_rotary_factor")) ||
           (key == "rope.scaling.attn_factor" && scaling_type() == "longrope");
  }

  // Phi-4-mini: partial_rotary_factor of head_dim (as transformers' Phi3).
  int64_t rope_dims(int64_t lo, int64_t hi, int64_t def) const {
    const json::Value* f = member(&c_, "partial_rotary_factor");
    if (!f) return def;
    const double prf = f->as_double("partial_rotary_factor");
    LLM_CHECK(std::isfinite(prf) && prf > 0.0 && prf <= 1.0, LLM_ERR_FORMAT,
              "config.json: 'partial_rotary_factor' = %g is outside (0, 1]", prf);
    const int64_t n = int64_t(double(hi) * prf);  // hi = head_dim (family.cpp)
    LLM_CHECK(n >= lo && n <= hi, LLM_ERR_FORMAT, "config.json: 'partial_rotary_factor' %g rotates %lld dimensions",
              prf, (long long)n);
    return n;
  }

  // LongRoPE's q/k factor: rope_scaling.attention_factor, else
  // sqrt(1 + ln(s) / ln(original)) with s = max_position_embeddings / original.
  double longrope_attn_factor(double def) const {
    if (scaling_type() != "longrope") return def;
    if (const json::Value* v = member(rs_, "attention_factor")) return v->as_double("attention_factor");
    const json::Value* o = original_context();
    LLM_CHECK(o, LLM_ERR_FORMAT, "config.json: LongRoPE needs 'original_max_position_embeddings'");
    const double orig = double(o->as_int("original_max_position_embeddings"));
    const double ctx = double(c_.get_int("max_position_embeddings", 0));
    LLM_CHECK(orig > 1.0 && ctx > 0.0, LLM_ERR_FORMAT,
              "config.json: original_max_position_embeddings %g / max_position_embeddings %g", orig, ctx);
    const double s = ctx / orig;
    return s > 1.0 ? std::sqrt(1.0 + std::log(s) / std::log(orig)) : 1.0;
  }

  const json::Value& c_;
  std::string arch_;
  const json::Value* rs_ = nullptr;
};

TensorData f32_tensor(const std::string& name, const std::vector<float>& v) {
  TensorData t;
  t.name = name;
  t.dtype = DType::F32;
  t.shape = {int64_t(v.size())};
  auto owned = std::make_shared<std::vector<uint8_t>>(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(owned->data(), v.data(), owned->size());
  t.data = owned->data();
  t.nbytes = owned->size();
  t.owned = std::move(owned);
  return t;
}

std::vector<float> float_array(const json::Value* v, const char* what, size_t n) {
  LLM_CHECK(v, LLM_ERR_FORMAT, "config.json: LongRoPE needs '%s'", what);
  const auto& a = v->as_array(what);
  LLM_CHECK(a.size() == n, LLM_ERR_FORMAT, "config.json: '%s' has %zu entries, RoPE has %zu pairs", what, a.size(), n);
  std::vector<float> out;
  for (const auto& e : a) out.push_back(float(e.as_double(what)));
  return out;
}

}  // namespace

std::vector<float> llama3_rope_factors(int32_t rope_dims, double base, double factor, double low_freq_factor,
                                       double high_freq_factor, double original_context) {
  // Pairs whose wavelength is short against the original context keep their
  // frequency, long ones are divided by `factor`, and in between the two the
  // inverse frequency is interpolated linearly in original_context / wavelength.
  const double low_wavelen = original_context / low_freq_factor;
  const double high_wavelen = original_context / high_freq_factor;
  std::vector<float> f(size_t(rope_dims / 2));
  for (int32_t i = 0; i < rope_dims / 2; ++i) {
    const double inv_freq = 1.0 / std::pow(base, double(2 * i) / double(rope_dims));
    const double wavelen = 2.0 * kPi / inv_freq;
    double div = 1.0;
    if (wavelen > low_wavelen) {
      div = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      div = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    f[size_t(i)] = float(div);
  }
  return f;
}

HfModelPlan hf_model_plan(const json::Value& c) {
  c.as_object("config.json");
  const std::string model_type = c.get_string("model_type", "");
  // By model_type, else by the class named in "architectures".
  const HfKind* kind = nullptr;
  for (const HfKind& k : kKinds)
    if (model_type == k.model_type) kind = &k;
  if (!kind)
    for (const HfKind& k : kKinds)
      if (names_architecture(c, k.architecture)) kind = &k;
  LLM_CHECK(kind != nullptr, LLM_ERR_UNSUPPORTED,
            "config.json: model_type '%s' is not supported (llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3)",
            model_type.c_str());
  const std::string type = kind->model_type;
  const bool gemma = type == "gemma2" || type == "gemma3_text";
  const bool phi3 = type == "phi3";

  std::string act = c.get_string("hidden_activation", "");
  if (act.empty()) act = c.get_string("hidden_act", kind->act);
  LLM_CHECK(act == kind->act, LLM_ERR_UNSUPPORTED,
            "config.json: hidden_act '%s' is not supported for %s (%s)", act.c_str(), type.c_str(), kind->act);
  LLM_CHECK(!c.get_bool("mlp_bias", false), LLM_ERR_UNSUPPORTED, "config.json: MLP biases are not supported");
  if ((type == "qwen2" || type == "qwen3") && c.get_bool("use_sliding_window", false))
    fail(LLM_ERR_UNSUPPORTED, "config.json: Qwen sliding-window layers (use_sliding_window) are not supported");

  HfModelPlan plan;
  ModelConfig& m = plan.config;
  const HfHParams hp(c, kind->arch);
  const std::string scaling = hp.scaling_type();
  LLM_CHECK(scaling.empty() || scaling == "default" || scaling == "linear" || scaling == "yarn" ||
                scaling == "llama3" || scaling == "longrope",
            LLM_ERR_UNSUPPORTED, "config.json: rope_scaling type '%s' is not supported", scaling.c_str());
  const Family* family = find_family(kind->arch);
  LLM_CHECK(family != nullptr, LLM_ERR_UNSUPPORTED, "config.json: no family '%s'", kind->arch);
  family->configure(hp, m);
  const json::Value* vs = member(&c, "vocab_size");
  LLM_CHECK(vs, LLM_ERR_FORMAT, "config.json: missing 'vocab_size'");
  const int64_t vocab = vs->as_int("vocab_size");
  LLM_CHECK(vocab > 0 && vocab <= (int64_t(1) << 22), LLM_ERR_FORMAT, "config.json: 'vocab_size' = %lld",
            (long long)vocab);
  m.vocab_size = int32_t(vocab);
  if (gemma) {
    // HF Gemma's norms hold w and multiply by 1 + w (GGUF's converters store 1 + w).
    m.spec.norm_offset = 1.0f;
    if (const json::Value* q = member(&c, "query_pre_attn_scalar")) {
      const double s = q->as_double("query_pre_attn_scalar");
      LLM_CHECK(std::isfinite(s) && s > 0.0, LLM_ERR_FORMAT, "config.json: 'query_pre_attn_scalar' = %g", s);
      m.spec.attn_scale = float(1.0 / std::sqrt(s));
    }
  }

  // Factors HF keeps in config.json; GGUF has them as tensors.
  const int32_t rd = m.spec.rope_dims;
  if (scaling == "llama3") {
    const json::Value* rs = hp.scaling();
    const char* on = nullptr;
    const json::Value* orig = hp.original_context(&on);
    LLM_CHECK(orig && member(rs, "factor") && member(rs, "low_freq_factor") && member(rs, "high_freq_factor"),
              LLM_ERR_FORMAT,
              "config.json: rope_scaling llama3 needs factor, low_freq_factor, high_freq_factor and "
              "original_max_position_embeddings");
    const double f = member(rs, "factor")->as_double("factor");
    const double lo = member(rs, "low_freq_factor")->as_double("low_freq_factor");
    const double hi = member(rs, "high_freq_factor")->as_double("high_freq_factor");
    const double oc = double(orig->as_int(on));
    LLM_CHECK(std::isfinite(f) && std::isfinite(lo) && std::isfinite(hi) && f >= 1.0 && lo > 0.0 && hi > lo &&
                  oc > 0.0,
              LLM_ERR_FORMAT, "config.json: rope_scaling llama3 factor %g, low %g, high %g, original %g", f, lo, hi,
              oc);
    plan.extra.push_back(f32_tensor("rope_freqs.weight", llama3_rope_factors(rd, m.rope_theta, f, lo, hi, oc)));
    m.spec.rope_factors = true;
  } else if (scaling == "longrope") {
    const json::Value* rs = hp.scaling();
    plan.extra.push_back(
        f32_tensor("rope_factors_long.weight", float_array(member(rs, "long_factor"), "long_factor", size_t(rd / 2))));
    plan.extra.push_back(f32_tensor("rope_factors_short.weight",
                                    float_array(member(rs, "short_factor"), "short_factor", size_t(rd / 2))));
    m.spec.rope_longrope = true;
  }

  // --- tensors
  const int64_t dim = m.dim, hid = m.hidden_dim, V = m.vocab_size, hd = m.head_dim;
  const int64_t q_dim = int64_t(m.n_heads) * hd, kv_dim = int64_t(m.n_kv_heads) * hd;
  // HF keeps q/k in rotate-half order; the interleaved kind pairs adjacent rows.
  const bool repair = m.spec.rope_kind == RopeKind::Interleaved;
  auto add = [&](std::string hf, std::string gguf, std::vector<int64_t> shape, int64_t rope_heads = 0,
                 bool optional = false) {
    plan.tensors.push_back({std::move(hf), std::move(gguf), std::move(shape), rope_heads, optional});
  };
  add("model.embed_tokens.weight", "token_embd.weight", {V, dim});
  for (int32_t l = 0; l < m.n_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    const std::string g = "blk." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", g + "attn_norm.weight", {dim});
    if (phi3) {
      add(h + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", {q_dim + 2 * kv_dim, dim});
    } else {
      add(h + "self_attn.q_proj.weight", g + "attn_q.weight", {q_dim, dim}, repair ? m.n_heads : 0);
      add(h + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_dim, dim}, repair ? m.n_kv_heads : 0);
      add(h + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_dim, dim});
      add(h + "self_attn.q_proj.bias", g + "attn_q.bias", {q_dim}, repair ? m.n_heads : 0, true);
      add(h + "self_attn.k_proj.bias", g + "attn_k.bias", {kv_dim}, repair ? m.n_kv_heads : 0, true);
      add(h + "self_attn.v_proj.bias", g + "attn_v.bias", {kv_dim}, 0, true);
    }
    add(h + "self_attn.o_proj.weight", g + "attn_output.weight", {dim, q_dim});
    add(h + "self_attn.o_proj.bias", g + "attn_output.bias", {dim}, 0, true);
    if (m.spec.qk_norm) {
      add(h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {hd});
      add(h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {hd});
    }
    if (m.spec.post_norms) {
      add(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {dim});
      add(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", {dim});
      add(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", {dim});
    } else {
      add(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {dim});
    }
    if (phi3) {
      add(h + "mlp.gate_up_proj.weight", g + "ffn_up.weight", {2 * hid, dim});  // gate rows, then up
    } else {
      add(h + "mlp.gate_proj.weight", g + "ffn_gate.weight", {hid, dim});
      add(h + "mlp.up_proj.weight", g + "ffn_up.weight", {hid, dim});
    }
    add(h + "mlp.down_proj.weight", g + "ffn_down.weight", {dim, hid});
  }
  add("model.norm.weight", "output_norm.weight", {dim});
  add("lm_head.weight", "output.weight", {V, dim}, 0, true);
  // Gemma ties its head always (no key in its configs); others say so.
  plan.tied = c.get_bool("tie_word_embeddings", gemma);
  return plan;
}

ModelConfig hf_config_to_model_config(const json::Value& config) { return hf_model_plan(config).config; }

}  // namespace llm
