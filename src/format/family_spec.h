// What makes one model family differ from another, as data.
//
// Every supported family is the same pre-norm decoder block with different
// fields (ARCHITECTURE.md §1):
//
//   x = embed(token) * embed_scale
//   per layer l:
//     h = rmsnorm(x) ; q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)
//     [qk_norm]  q, k = rmsnorm_per_head(q), rmsnorm_per_head(k)
//     q, k = rope(q, k; kind, rope_dims, base of layer l, scaling)
//     a = softmax(softcap(q k^T * attn_scale)) v   over the last window[l] positions (0: all)
//     a = a Wo (+bo) ; [post_norms] a = rmsnorm(a)
//     x = x + a
//     h = rmsnorm(x) ; f = (act(h Wgate) * h Wup) Wdown ; [post_norms] f = rmsnorm(f)
//     x = x + f
//   logits = softcap(rmsnorm(x) Wout, final_softcap)
//
// A family file (src/model/<family>.cpp) reads its metadata keys into a
// ModelConfig (which holds this spec) and registers itself in family.cpp.
// Tensor names are GGUF's (format/model_source.h lists them); the model
// builder asks for exactly the tensors the spec implies and refuses a file
// that holds others, so nothing that changes the math is silently ignored.
//
// This header sits in format/, beside ModelConfig, because both sides use
// it: the readers (gguf.cpp, hf_families.cpp) call a family's configure()
// through it, and the family files in model/ implement it. So format/ needs
// nothing from model/ (tests/check_layering.sh); the functions declared here
// are defined in src/model/family.cpp and src/model/<family>.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {

// How RoPE pairs the dimensions of a head.
//   Interleaved: (2i, 2i + 1)              (GGUF llama, llama2.c)
//   NeoX:        (i, i + rope_dims / 2)    (Qwen, Gemma, Phi-3; "half rotation")
enum class RopeKind : int32_t { Interleaved = 0, NeoX = 1 };

// The gated feed-forward's activation: act(gate) * up.
enum class Activation : int32_t { SiLU = 0, GeluTanh = 1 };

struct BlockSpec {
  RopeKind rope_kind = RopeKind::Interleaved;
  int32_t rope_dims = 0;           // rotated dimensions of each head (0 = head_dim); the rest pass through
  float rope_base_local = 0.0f;    // RoPE base of sliding-window layers (0 = the model's rope_theta)
  float rope_freq_scale = 1.0f;    // linear position scaling: angle = pos * freq_scale * inv_freq
  float rope_freq_scale_local = 0.0f;  // the same for sliding-window layers (0 = rope_freq_scale)
  bool rope_factors = false;       // tensor rope_freqs.weight [rope_dims / 2] divides each frequency (Llama 3)
  // LongRoPE (Phi-3 128k): tensors rope_factors_long / rope_factors_short [rope_dims / 2] divide
  // each frequency; the long ones when the model's context is over rope_orig_ctx.
  bool rope_longrope = false;
  // YaRN: pair j's frequency is blended between the scaled (interpolated) one and the unscaled
  // one: inv_freq * (freq_scale (1 - m) + m), m = ext * ramp(j), ramp 1 for pairs that turn more
  // than beta_fast times over rope_orig_ctx, 0 below beta_slow turns, linear in j between.
  float rope_yarn_ext = 0.0f;      // 0 = off (plain linear scaling)
  float rope_yarn_beta_fast = 32.0f;
  float rope_yarn_beta_slow = 1.0f;
  int32_t rope_orig_ctx = 0;       // the context the model was trained at before extension (YaRN, LongRoPE)
  // RoPE's cos and sin are multiplied by this (YaRN 1 + 0.1 ln(factor), LongRoPE's attention
  // factor): the rotated dimensions of q and k grow by it, the pass-through ones do not.
  float rope_mscale = 1.0f;
  float attn_scale = 0.0f;         // scale of q.k (0 = 1 / sqrt(head_dim))
  float attn_softcap = 0.0f;       // score = c * tanh(score / c) before the softmax (0 = off)
  float final_softcap = 0.0f;      // the same on the logits (0 = off)
  Activation act = Activation::SiLU;
  float embed_scale = 1.0f;        // token embeddings are multiplied by this (Gemma: sqrt(dim))
  float norm_offset = 0.0f;        // RMSNorm multiplies by (w + norm_offset) (HF Gemma stores w for 1 + w)
  bool qk_norm = false;            // per-head RMSNorm of q and k: attn_q_norm / attn_k_norm [head_dim]
  bool post_norms = false;         // post_attention_norm / post_ffw_norm [dim] before each residual add
  std::vector<int32_t> window;     // per layer: attend to the last window[l] positions (0 = all)

  // True when layer l attends to a sliding window.
  bool windowed(int32_t l) const { return size_t(l) < window.size() && window[size_t(l)] > 0; }
  bool any_window() const {
    for (int32_t w : window)
      if (w > 0) return true;
    return false;
  }
};

struct ModelConfig;

// Reads one family's metadata. Keys are given without the "<arch>." prefix
// that GGUF puts before them. Numbers are range-checked by the reader
// (LLM_ERR_FORMAT naming the key); absent optional keys give `def`.
class HParams {
 public:
  virtual ~HParams() = default;
  virtual bool has(const std::string& key) const = 0;
  virtual int64_t integer(const std::string& key, int64_t lo, int64_t hi, bool required, int64_t def) const = 0;
  virtual double number(const std::string& key, bool required, double def) const = 0;
  // An array of integers or bools (empty when absent).
  virtual std::vector<int64_t> integers(const std::string& key) const = 0;
  // A string value ("" when absent).
  virtual std::string text(const std::string& key) const = 0;
  virtual const std::string& arch() const = 0;
};

struct Family {
  const char* arch;  // GGUF general.architecture
  // Fills c (dimensions and spec) from the file's metadata. Throws
  // LLM_ERR_FORMAT / LLM_ERR_UNSUPPORTED naming the key.
  void (*configure)(const HParams& hp, ModelConfig& c);
};

// The family registered for a GGUF architecture name, or nullptr.
const Family* find_family(const std::string& arch);
// "llama, mistral, qwen2, ..." for messages.
std::string family_names();

// The keys every family shares (embedding_length, block_count, heads,
// context, rope base, RMS epsilon, key/value length, rope dimension count).
void read_common_hparams(const HParams& hp, ModelConfig& c);
// A sliding window of w on every layer for which `on(l)` holds; w must be > 0.
void set_window_pattern(ModelConfig& c, int64_t w, bool (*on)(int32_t layer, int32_t n_layers));
// Validates the spec against the dimensions (LLM_ERR_FORMAT / UNSUPPORTED).
void validate_spec(const ModelConfig& c);

struct ModelSource;
// Empty when src is the plain Llama-2 block (interleaved full RoPE, no
// scaling or factors, no biases, QK-norm, post-norms, windows, softcaps,
// SiLU, unscaled embeddings, separate q/k/v and gate/up); otherwise the
// first feature that is not. The offline calibration passes (AWQ, GPTQ,
// QAT) run only that block.
std::string non_llama_feature(const ModelSource& src);

}  // namespace llm
