// Llama ModelSources of a chosen shape with random f32 weights, for tests
// that need a model other than the real ones.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/model_source.h"

namespace llm::testing {

// Every tensor of a Llama model of config c (tied: no output.weight), in
// file order: token_embd, per layer attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down, then output_norm and
// output. Values are N(mean, sigma^2) from one mt19937 seeded with `seed`,
// mean 1 for the norms and 0 otherwise, sigma = sigma_of(kind) where kind is
// the name without "blk.N." and ".weight" ("attn_q", "output_norm", ...).
inline ModelSource random_llama(const ModelConfig& c, uint32_t seed, bool tied,
                                const std::function<float(const std::string& kind)>& sigma_of) {
  ModelSource src;
  src.config = c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto add = [&](const std::string& prefix, const std::string& kind, std::vector<int64_t> shape) {
    TensorData t;
    t.name = prefix + kind + ".weight";
    t.shape = std::move(shape);
    auto bytes = std::make_shared<std::vector<uint8_t>>(size_t(t.numel()) * 4);
    float* f = reinterpret_cast<float*>(bytes->data());
    const float sigma = sigma_of(kind), mean = kind.find("norm") != std::string::npos ? 1.0f : 0.0f;
    for (int64_t i = 0; i < t.numel(); ++i) f[i] = mean + sigma * nd(rng);
    t.data = bytes->data();
    t.nbytes = bytes->size();
    t.owned = std::move(bytes);
    src.tensors.push_back(std::move(t));
  };
  const int64_t dim = c.dim, hid = c.hidden_dim, qd = int64_t(c.n_heads) * c.head_dim,
                kv = int64_t(c.n_kv_heads) * c.head_dim;
  add("", "token_embd", {c.vocab_size, dim});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p, "attn_norm", {dim});
    add(p, "attn_q", {qd, dim});
    add(p, "attn_k", {kv, dim});
    add(p, "attn_v", {kv, dim});
    add(p, "attn_output", {dim, qd});
    add(p, "ffn_norm", {dim});
    add(p, "ffn_gate", {hid, dim});
    add(p, "ffn_up", {hid, dim});
    add(p, "ffn_down", {dim, hid});
  }
  add("", "output_norm", {dim});
  if (!tied) add("", "output", {c.vocab_size, dim});
  return src;
}

// The writable f32 values of a tensor that random_llama made.
inline float* random_values(ModelSource& src, const std::string& name) {
  for (auto& t : src.tensors)
    if (t.name == name) return reinterpret_cast<float*>(t.owned->data());
  return nullptr;
}

}  // namespace llm::testing
