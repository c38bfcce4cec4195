// CUDA backend entry points visible to the rest of the library (no CUDA
// types here: this header compiles everywhere). Without CUDA
// (LLM_WITH_CUDA undefined) device_count() is 0 and Backend::create throws
// LLM_ERR_UNSUPPORTED. docs/CUDA.md describes the design.
//
// Errors: every method throws llm::Error — LLM_ERR_DEVICE (driver, launch,
// kernel fault; the CUDA message is in the text), LLM_ERR_OUT_OF_MEMORY
// (cudaMalloc / pinned memory), LLM_ERR_CONTEXT_FULL (device KV budget),
// LLM_ERR_INVALID_ARGUMENT, LLM_ERR_UNSUPPORTED, LLM_ERR_CANCELLED — and
// leaves the sequences it was given unchanged on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/log.h"
#include "llm.h"

namespace llm {
class Model;
class Backend;
}

namespace llm::cuda {

// Number of usable CUDA devices (0 if none or no driver); `why` gets the
// driver's message when there are none.
int device_count(std::string* why);

// Returns if a CUDA device is usable; throws Error(LLM_ERR_UNSUPPORTED) if
// built without CUDA, Error(LLM_ERR_DEVICE) with the driver's message if no
// device is usable.
void check_device();

// check_device(), then Error(LLM_ERR_UNSUPPORTED) — the behaviour of builds
// where no model path uses the GPU. Kept until Model is wired to Backend.
void require_device();

struct BackendOptions {
  int device = 0;                    // CUDA device ordinal
  uint64_t kv_budget_bytes = 0;      // hard cap of the device KV pages; 0 = half of the memory free after the weights
  int32_t page_tokens = 16;          // tokens per KV page (same page layout as kv/kv_cache.h)
  llm_kv_type kv_type = LLM_KV_F16;  // LLM_KV_F16 or LLM_KV_F32 on the device
  int32_t max_batch = 32;            // most sequences in one decode() call
  int32_t max_chunk = 512;           // prefill tokens per forward pass (longer prompts run in chunks)
  bool use_graphs = true;            // capture decode steps as CUDA graphs
  // Rows (prefill tokens, or sequences of a decode batch) up to which a linear
  // layer runs as GEMV passes rather than as a cuBLASLt GEMM, for float and
  // for quantized weights; 0 = the measured default of each weight format
  // (docs/CUDA.md, "Batched decode"). For tuning.
  int32_t gemv_max_rows = 0;
  int32_t gemv_max_rows_quant = 0;
  Logger log;
};

// Device memory in use, for stats and llm-bench.
struct MemoryStats {
  uint64_t weight_bytes = 0;     // uploaded weights (device layout)
  uint64_t scratch_bytes = 0;    // activations, staging, cuBLASLt workspace, page tables
  uint64_t kv_budget_bytes = 0;  // hard cap of the KV pool
  uint64_t kv_reserved_bytes = 0;  // KV chunks allocated so far (grows on demand, up to the budget)
  uint64_t kv_in_use_bytes = 0;    // pages held by sequences
  int32_t kv_pages_in_use = 0;
  size_t graphs_ready = 0;       // captured decode graphs
};

// The device KV cache of one sequence: its page table and length. Created
// by a Backend and used only with it; destroy every Sequence before the Backend.
class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual uint32_t length() const = 0;  // tokens whose K/V are on the device (slot i = position i)
  virtual size_t n_pages() const = 0;
};

// What decode() returns to the host, all optional. Row i is sequence i.
struct DecodeOutput {
  float* logits = nullptr;      // [n, vocab] f32
  int32_t* argmax = nullptr;    // [n] greedy ids (lowest id on ties), computed on the device
  int32_t top_k = 0;            // > 0: the k best per row, best first, computed on the device
  float* topk_logits = nullptr;  // [n, top_k]
  int32_t* topk_ids = nullptr;   // [n, top_k]
};

// The CUDA backend of one model on one device: weights in device memory,
// a device KV page pool under a hard byte budget, cuBLASLt GEMMs for
// prefill, fused dequant-GEMV + CUDA-graph decode steps batched across
// sequences. Calls are serialised internally (one device, one stream); the
// object may be shared by the sessions of a model on any threads.
class Backend {
 public:
  virtual ~Backend() = default;

  // Uploads the model's weights. Throws UNSUPPORTED (no CUDA build, shape
  // or dtype the kernels do not handle), DEVICE, OUT_OF_MEMORY.
  static std::unique_ptr<Backend> create(const Model& model, const BackendOptions& opts);

  virtual std::unique_ptr<Sequence> new_sequence() = 0;
  // A sequence sharing every page of src (copy-on-write on the first write).
  virtual std::unique_ptr<Sequence> fork(const Sequence& src) = 0;

  // Appends tokens[0..n) at positions s.length().. (chunks of max_chunk).
  // logits (optional, host [vocab]) gets the last row's logits. `cancel` is
  // polled between layers; true -> Error(LLM_ERR_CANCELLED), s unchanged.
  virtual void prefill(Sequence& s, const int32_t* tokens, size_t n, float* logits,
                       const std::function<bool()>& cancel = {}) = 0;

  // One token per sequence (seqs distinct, n <= max_batch): tokens[i] is
  // appended to seqs[i] at position seqs[i]->length(). All or nothing.
  virtual void decode(Sequence* const* seqs, const int32_t* tokens, size_t n, const DecodeOutput& out) = 0;

  // Drops cached tokens past n_tokens (n_tokens <= length).
  virtual void truncate(Sequence& s, uint32_t n_tokens) = 0;
  // Removes tokens [n_keep, n_keep + n_discard); later ones move down and
  // their keys are re-rotated to their new positions (as Session::evict_cached).
  virtual void evict(Sequence& s, uint32_t n_keep, uint32_t n_discard) = 0;

  // Page bytes in the host layout of kv/kv_cache.h for kv_type(): the
  // snapshot of a sequence is n_pages() pages, byte-identical to CPU pages.
  virtual size_t page_bytes() const = 0;
  virtual llm_kv_type kv_type() const = 0;
  virtual void read_pages(const Sequence& s, uint8_t* out) = 0;  // n_pages() * page_bytes()
  // Replaces s's content (s must be empty) with n_pages pages holding `length` tokens.
  virtual void write_pages(Sequence& s, const uint8_t* pages, size_t n_pages, uint32_t length) = 0;
  // The cached K (kv = 0) or V (kv = 1) row of (layer, head) at slot, as f32.
  virtual void kv_row(const Sequence& s, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) = 0;

  virtual MemoryStats memory() const = 0;
  virtual std::string device_name() const = 0;
};

// The Backend interface of backend/backend.h over `device` (which must
// outlive it): what sessions run on. Batched passes take up to max_batch
// sequences of one row each (BackendOptions::max_batch); prompt passes up to
// max_rows rows (the device splits longer ones itself).
std::unique_ptr<llm::Backend> as_backend(Backend& device, size_t vocab, size_t max_batch, size_t max_rows);

}  // namespace llm::cuda
