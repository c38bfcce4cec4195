// The CPU forward pass of one model block spec (format/family_spec.h) over a
// session's paged KV cache: embeddings, every layer, final norm and logits.
// The session decides which tokens, pages and positions; this file holds
// all of the model math it runs on the CPU. forward_batch runs the tokens of
// several sessions as one pass (batched decode).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/alloc.h"
#include "kv/kv_cache.h"

namespace llm {
class Model;
}

namespace llm::cpu {

// Activations of one forward pass, grown on demand and kept by the session
// (never allocated per token).
struct ForwardScratch {
  int64_t rows = 0;
  Buffer<float> x, xb, q, k, v, att, hb, hb2;
  std::vector<int32_t> pos;
  std::vector<std::vector<float>> att_rows;  // per-thread attention workspace
  // forward_batch only: the sequence of each row, the first row of each
  // sequence, the sequences' logits [n_seqs, vocab] and one attention
  // workspace per thread when threads take whole sequences.
  std::vector<int32_t> seq_of;
  std::vector<int64_t> row0;
  Buffer<float> logits;
  std::vector<std::vector<std::vector<float>>> att_seq;
  std::vector<size_t> single_row_seqs;
  void ensure(const Model& m, int64_t n);
};

struct ForwardArgs {
  const int32_t* tokens = nullptr;  // [n]
  int64_t n = 0;
  uint32_t p0 = 0;                  // position (= cache slot) of tokens[0]
  // Page tables of the model's two KV groups (LayerWeights::kv_group; the
  // second only when Model::kv_pool_local() exists), covering slots
  // [first_slot[g], p0 + n) and private where written.
  kv::Page* const* pages[2] = {nullptr, nullptr};
  uint32_t first_slot[2] = {0, 0};  // slots before it are not held (attention starts there at the earliest)
  float* logits = nullptr;          // [vocab]: the last row's
  std::function<bool()> cancel;     // polled between layers; true -> Error(LLM_ERR_CANCELLED)
};

// Runs tokens[0..n) at positions p0.. : their K/V rows go into the pages and
// the last row's logits into args.logits. Throws Error(LLM_ERR_CANCELLED)
// (the pages may then hold partial rows past p0, which the caller drops).
void forward(const Model& m, const ForwardArgs& args, ForwardScratch& s);

// forward() of n_seqs sequences (each with its own tokens, positions, page
// tables, first slots, logits and cancel) in one pass: the rows of all of
// them go through each matmul together, so every weight is read once for the
// whole batch; attention runs per sequence over its own pages. Every K/V row
// and logit is bit-identical to forward() of each sequence alone, because
// each matmul output row does not depend on the other rows (matmul.h: batch
// invariance) and every other step is per row or per sequence. Each cancel
// is polled between layers; any true -> Error(LLM_ERR_CANCELLED) for the
// whole batch. On any throw the pages of every sequence may hold partial
// rows past its p0, which the caller drops.
void forward_batch(const Model& m, const ForwardArgs* seqs, size_t n_seqs, ForwardScratch& s);

// Rotates the cached key of (layer, head) at a slot by delta positions
// (eviction moves rows down by delta < 0), with the layer's RoPE.
void rerotate_key(const Model& m, int32_t layer, float* key, int64_t delta);

}  // namespace llm::cpu
