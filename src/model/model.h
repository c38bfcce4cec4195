// A loaded model: configuration, tokenizer, weights laid out for the CPU
// backend, worker threads and the shared KV page pool. Immutable after
// load (the page pool and thread pool synchronise internally), so one Model
// serves many sessions on many threads.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda_backend.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "format/model_source.h"
#include "kv/kv_cache.h"
#include "tokenizer/tokenizer.h"

namespace llm {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [dim]
  cpu::WeightView wq;                // [n_heads * head_dim, dim]
  cpu::WeightView wk;                // [n_kv_heads * head_dim, dim]
  cpu::WeightView wv;                // [n_kv_heads * head_dim, dim]
  cpu::WeightView wo;                // [dim, n_heads * head_dim]
  const float* bq = nullptr;         // [n_heads * head_dim]     optional biases
  const float* bk = nullptr;         // [n_kv_heads * head_dim]
  const float* bv = nullptr;         // [n_kv_heads * head_dim]
  const float* bo = nullptr;         // [dim]
  const float* q_norm = nullptr;     // [head_dim]  spec.qk_norm
  const float* k_norm = nullptr;     // [head_dim]
  const float* post_attn_norm = nullptr;  // [dim]  spec.post_norms
  const float* ffn_norm = nullptr;   // [dim]
  cpu::WeightView w_gate;            // [hidden_dim, dim]  (w1)
  cpu::WeightView w_up;              // [hidden_dim, dim]  (w3)
  cpu::WeightView w_down;            // [dim, hidden_dim]  (w2)
  const float* post_ffn_norm = nullptr;   // [dim]  spec.post_norms
  // RoPE of this layer: angle of pair j at position p = p * inv_freq[j]
  // (base, linear scale and frequency factors folded in); [rope_dims / 2].
  const float* inv_freq = nullptr;
  int32_t window = 0;                // attend to the last `window` positions (0 = all)
  // Where its K/V rows live: group 0 (kv_pool()) or 1 (kv_pool_local(), the
  // sliding-window layers of a model that also has global ones), and its
  // layer index within that group's pages.
  int32_t kv_group = 0;
  int32_t kv_layer = 0;
};

struct LoadOptions {
  llm_device device = LLM_DEVICE_AUTO;
  int32_t n_threads = 0;
  bool vocab_only = false;
  bool reference_math = false;  // MatmulMode::Reference everywhere
  bool huge_pages = true;       // CPU: copy the matrices into a HugePageBlock (Linux)
  uint64_t kv_budget_bytes = 0;
  uint32_t kv_page_tokens = 16;
  // Keep the sliding-window layers' K/V in their own pool and drop what every
  // window has left (false: one pool, every page kept; for tests).
  bool kv_prune_windows = true;
  llm_progress_fn progress = nullptr;
  void* progress_user = nullptr;
  Logger log;
};

class Model {
 public:
  // Throws llm::Error.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts);
  // Builds from an already-read source (tests, converters).
  static std::unique_ptr<Model> from_source(ModelSource src, const LoadOptions& opts);

  const ModelConfig& config() const { return src_.config; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  bool vocab_only() const { return vocab_only_; }
  llm_device device() const { return cuda_ ? LLM_DEVICE_CUDA : LLM_DEVICE_CPU; }
  // The CUDA backend when the model runs on a GPU (else nullptr). Sessions
  // whose kv_type the device cache holds (cuda()->kv_type()) run on it; the
  // others use the CPU path with the same host weights.
  cuda::Backend* cuda() const { return cuda_.get(); }
  // The backend a session with this kv_type runs on: the CUDA one when the
  // model runs on a GPU whose cache holds kv_type, else the CPU one. Not for
  // a vocab-only model.
  Backend& backend_for(llm_kv_type kv_type) const {
    return gpu_backend_ && cuda_->kv_type() == kv_type ? *gpu_backend_ : *cpu_backend_;
  }
  ThreadPool* pool() const { return pool_.get(); }
  kv::PagePool& kv_pool() const { return *kv_pool_; }
  // The pages of the sliding-window layers when the model mixes windowed and
  // global layers (Gemma 2/3), else nullptr. A session keeps only the pages
  // of this pool that the last kv_local_window() positions touch. Both pools
  // draw on one byte budget.
  kv::PagePool* kv_pool_local() const { return kv_pool_local_.get(); }
  uint32_t kv_local_window() const { return kv_local_window_; }
  const Logger& log() const { return log_; }
  cpu::MatmulMode matmul_mode() const { return mode_; }

  const cpu::WeightView& tok_embd() const { return tok_embd_; }  // [vocab, dim]
  const cpu::WeightView& output() const { return output_; }      // [vocab, dim]
  const float* output_norm() const { return output_norm_; }      // [dim]
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const BlockSpec& spec() const { return src_.config.spec; }
  uint64_t n_params() const { return n_params_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  DType weight_type() const { return weight_type_; }
  // The matrices live in a block advised for transparent huge pages.
  bool weights_on_huge_pages() const { return weight_block_.advised(); }

 private:
  Model() = default;
  void build(const LoadOptions& opts);
  const float* f32_vector(const std::string& name, int64_t n, float offset = 0.0f);
  const float* norm_vector(const std::string& name, int64_t n) { return f32_vector(name, n, src_.config.spec.norm_offset); }
  const float* optional_vector(const std::string& name, int64_t n);
  cpu::WeightView matrix(const std::string& name, int64_t rows, int64_t cols);
  // Rows [first, first + rows) of matrix `name` [total_rows, cols] (a fused tensor's part), zero copy.
  cpu::WeightView matrix_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t first, int64_t rows);
  void build_layer(int32_t l);
  void build_rope();
  void move_weights_to_huge_pages();
  void release_metadata_pages();

  ModelSource src_;
  std::unique_ptr<Tokenizer> tokenizer_;
  bool vocab_only_ = false;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<kv::PagePool> kv_pool_, kv_pool_local_;
  uint32_t kv_local_window_ = 0;
  Logger log_;
  cpu::MatmulMode mode_ = cpu::MatmulMode::Fast;
  cpu::WeightView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<Buffer<float>> converted_;  // norm vectors converted to f32
  std::vector<float> inv_freq_global_, inv_freq_local_;  // [rope_dims / 2] each
  std::set<std::string> used_;            // tensors the spec consumed
  HugePageBlock weight_block_;            // the matrices, when copied for CPU decode
  uint64_t n_params_ = 0, weight_bytes_ = 0;
  DType weight_type_ = DType::F32;
  std::unique_ptr<Backend> cpu_backend_;
  std::unique_ptr<cuda::Backend> cuda_;
  std::unique_ptr<Backend> gpu_backend_;  // over cuda_; declared last: destroyed first
};

// Default KV budget on the CPU: a quarter of physical memory, at most 8 GiB.
uint64_t default_kv_budget_bytes();

}  // namespace llm
