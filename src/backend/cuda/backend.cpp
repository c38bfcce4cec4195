// The CUDA backend: weight upload, device KV pages, prefill (cuBLASLt GEMM +
// tiled attention) and batched decode steps (fused dequant-GEMV + split
// attention) replayed as CUDA graphs. docs/CUDA.md has the design.
//
// Host code compiled by the C++ compiler; empty without LLM_WITH_CUDA.
// Every public method takes the mutex, makes its device current, and ends
// with a stream synchronisation, so no work is in flight between calls and
// pinned staging buffers and released pages are free for reuse.
#ifdef LLM_WITH_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_util.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/plan.h"
#include "backend/cuda/weight_layout.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace llm::cuda {

namespace {

constexpr size_t kStagingBytes = size_t(32) << 20;      // each of the two upload staging buffers
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;
constexpr int64_t kDequantElems = int64_t(32) << 20;    // f16 tile buffer of q8/q4 prefill GEMMs
constexpr size_t kKvChunkBytes = size_t(256) << 20;     // KV memory is allocated in chunks of about this
// Rows (prefill tokens, sequences of a decode batch) up to which a linear
// layer runs as GEMV passes, each streaming the weights once per 8 rows;
// above, the weights are converted or dequantized to f16 tiles and multiplied
// by cuBLASLt. Measured on an H200 with tests/gpu/gemv_crossover.sh at 1, 2,
// 4, 8, 16 and 32 rows (docs/CUDA.md, "Batched decode"): the GEMM wins at 2
// rows for float weights, at 4 for q4 (TinyLlama and Llama-3-8B shapes), at 8
// for q8 and the GGUF blocks (Q4_K_M).
int64_t default_gemv_max_rows(WFormat f) {
  switch (f) {
    case WFormat::Q4: return 2;
    case WFormat::Q8:
    case WFormat::Ggml: return 4;
    default: return 1;
  }
}
constexpr int kMaxSplits = 64;             // plan_decode_splits never exceeds this

class BackendImpl;

class SequenceImpl final : public Sequence {
 public:
  explicit SequenceImpl(BackendImpl* owner) : owner_(owner) {}
  ~SequenceImpl() override;
  uint32_t length() const override { return length_; }
  size_t n_pages() const override { return pages_.size(); }

  BackendImpl* owner_;
  PageList pages_;
  uint32_t length_ = 0;
};

struct LayerW {
  const float* attn_norm = nullptr;   // device [dim]
  const float* ffn_norm = nullptr;    // device [dim]
  // Block-spec extras (format/family_spec.h), null when the layer has none:
  const float* qkv_bias = nullptr;    // [q_dim + 2 kv_dim]: bq | bk | bv, zeros for a missing part
  const float* bo = nullptr;          // [dim]
  const float* q_norm = nullptr;      // [head_dim]  QK-norm
  const float* k_norm = nullptr;      // [head_dim]
  const float* post_attn_norm = nullptr;  // [dim]
  const float* post_ffn_norm = nullptr;   // [dim]
  const float* inv_freq = nullptr;    // [rope_dims / 2]: this layer's RoPE frequencies (in rope_table_)
  int32_t window = 0;                 // sliding window (0: every position)
  std::vector<DeviceMatrix> qkv;      // one stacked [q_dim + 2 kv_dim, dim] matrix, or wq, wk, wv
  DeviceMatrix wo;                    // [dim, q_dim]
  std::vector<DeviceMatrix> gate_up;  // one stacked [2 hidden, dim] matrix, or w_gate, w_up
  DeviceMatrix down;                  // [dim, hidden]
};

// Shape of one forward pass over n rows.
struct StepShape {
  int64_t n = 0;
  bool decode = false;          // rows are distinct sequences (else one sequence, consecutive positions)
  int64_t rows_per_seq = 1;
  int32_t rows_per_block = 1;   // attention rows per block
  int32_t split_tokens = 1 << 30;
  int32_t n_splits = 1;
};

class BackendImpl final : public Backend {
 public:
  BackendImpl(const Model& model, const BackendOptions& opts);
  ~BackendImpl() override;

  std::unique_ptr<Sequence> new_sequence() override;
  std::unique_ptr<Sequence> fork(const Sequence& src) override;
  void prefill(Sequence& s, const int32_t* tokens, size_t n, float* logits,
               const std::function<bool()>& cancel) override;
  void decode(Sequence* const* seqs, const int32_t* tokens, size_t n, const DecodeOutput& out) override;
  void truncate(Sequence& s, uint32_t n_tokens) override;
  void evict(Sequence& s, uint32_t n_keep, uint32_t n_discard) override;
  size_t page_bytes() const override { return alloc_.page_bytes(); }
  llm_kv_type kv_type() const override { return kv_type_; }
  void read_pages(const Sequence& s, uint8_t* out) override;
  void write_pages(Sequence& s, const uint8_t* pages, size_t n_pages, uint32_t length) override;
  void kv_row(const Sequence& s, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) override;
  MemoryStats memory() const override;
  std::string device_name() const override { return device_name_; }

  void release_sequence(SequenceImpl& s);

 private:
  SequenceImpl& own(const Sequence& s) const;
  void set_device() const { check(cudaSetDevice(device_), "cudaSetDevice"); }
  void sync(const char* what) { check(cudaStreamSynchronize(stream_), what); }

  // ---- setup
  DeviceMatrix upload(const std::vector<const cpu::WeightView*>& parts, const char* what);
  const float* upload_vector(const float* host, int64_t n);
  DeviceBuffer scratch(size_t bytes, const char* what);

  // ---- pages
  uint8_t* page_ptr(int32_t id) const {
    return chunks_[size_t(alloc_.chunk_of(id))].as<uint8_t>() + size_t(alloc_.index_in_chunk(id)) * alloc_.page_bytes();
  }
  void ensure_chunks(int32_t n);
  // Reserves `need` pages' worth of chunks or throws CONTEXT_FULL / OUT_OF_MEMORY.
  void reserve_pages(size_t need);
  void copy_pages(const std::vector<PageCopy>& copies);
  void ensure_table_capacity(int32_t pages);
  void upload_table_row(int32_t row, const PageList& pages);

  // ---- compute
  struct Exec;  // block_pass's executor (block_pass.h)
  void linear(const DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy, float beta);
  void linear_parts(const std::vector<DeviceMatrix>& parts, const float* x, int64_t n, float* y, int64_t ldy);
  void forward(const StepShape& s, const std::function<bool()>* cancel);
  void run_decode_step(const GraphKey& key, const StepShape& s);
  bool capture(int slot, const StepShape& s);
  void destroy_graph(int slot);
  void invalidate_graphs();
  void prefill_chunk(SequenceImpl& s, const int32_t* tokens, int64_t n, float* logits,
                     const std::function<bool()>& cancel);

  // Recursive: a Sequence destroyed while a method holds the lock (an
  // exception in fork) releases its pages through release_sequence().
  mutable std::recursive_mutex mu_;
  int device_ = 0;
  std::string device_name_;
  int sm_count_ = 1;
  // Declared before every device buffer, so it is destroyed after them
  // (also when the constructor throws half-way).
  struct StreamOwner {
    cudaStream_t s = nullptr;
    ~StreamOwner() {
      if (s) {
        (void)cudaStreamSynchronize(s);
        (void)cudaStreamDestroy(s);
      }
    }
  } stream_owner_;
  cudaStream_t stream_ = nullptr;
  Logger log_;

  // model shape
  ModelConfig cfg_;
  KvGeom geom_;
  llm_kv_type kv_type_ = LLM_KV_F16;
  int64_t q_dim_ = 0, kv_dim_ = 0, qkv_dim_ = 0;
  int32_t max_batch_ = 32, max_chunk_ = 512, prefill_rows_ = 1;
  int64_t gemv_max_rows_ = 0, gemv_max_rows_quant_ = 0;  // BackendOptions; 0: default_gemv_max_rows
  int64_t rows_ = 0;  // scratch rows = max(max_chunk, max_batch)

  // weights
  std::vector<DeviceBuffer> owned_;
  DeviceMatrix tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerW> layers_;
  DeviceBuffer rope_table_;  // [n_layers][rope_dims / 2] RoPE frequencies (also eviction's re-rotation)
  uint64_t weight_bytes_ = 0;
  uint64_t scratch_bytes_ = 0;

  // activations and staging (see forward() for shapes)
  DeviceBuffer x_, xb_, qkv_, att_, gu_, h_, gemm_in_, deq_, gemv_x_, logits_;
  DeviceBuffer tokens_d_, pos_d_, argmax_d_, topk_v_d_, topk_i_d_, topk_sv_d_, topk_si_d_, part_ml_, part_acc_;
  PinnedBuffer tokens_h_, pos_h_, logits_h_, argmax_h_, topk_v_h_, topk_i_h_;
  std::unique_ptr<Gemm> gemm_;
  PinnedBuffer stage_[2];  // weight upload staging (setup only)

  // KV pages: chunks of device memory, ids handed out by alloc_
  PageAllocator alloc_;
  std::vector<DeviceBuffer> chunks_;
  DeviceBuffer tables_d_;   // [max_batch][tables_cap_] page pointers
  PinnedBuffer tables_h_;
  int32_t tables_cap_ = 0;
  TableMirror mirror_;

  // decode graphs
  bool use_graphs_ = true;
  DecodeGraphs graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

SequenceImpl::~SequenceImpl() {
  // Destructors must not throw (that would terminate the host): a failure to
  // return the pages leaves them counted in the pool, nothing worse.
  try {
    owner_->release_sequence(*this);
  } catch (...) {
  }
}

uint64_t default_budget(uint64_t page_bytes) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const uint64_t margin = uint64_t(256) << 20;  // cuBLASLt, graphs, driver
  // Half of what is free after the weights: the GPU is shared with the host
  // app (a game's renderer, say), so the library never takes "90%".
  const uint64_t b = uint64_t(double(free_b) * 0.5);
  return b > margin + page_bytes ? b - margin : 0;
}

// ---------------------------------------------------------------- setup

BackendImpl::BackendImpl(const Model& model, const BackendOptions& opts)
    : device_(opts.device),
      log_(opts.log),
      cfg_(model.config()),
      kv_type_(opts.kv_type),
      alloc_(1, 0, 1),
      graphs_(8, 2) {
  check_device();
  int n_dev = 0;
  check(cudaGetDeviceCount(&n_dev), "cudaGetDeviceCount");
  LLM_CHECK(opts.device >= 0 && opts.device < n_dev, LLM_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist (%d found)",
            opts.device, n_dev);
  set_device();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  device_name_ = prop.name;
  sm_count_ = std::max(prop.multiProcessorCount, 1);

  const ModelConfig& c = cfg_;
  LLM_CHECK(!model.vocab_only(), LLM_ERR_UNSUPPORTED, "the model was loaded vocab-only");
  LLM_CHECK(kv_type_ == LLM_KV_F16 || kv_type_ == LLM_KV_F32, LLM_ERR_UNSUPPORTED,
            "the CUDA backend keeps the KV cache in f16 or f32 (kv_type %d requested)", int(kv_type_));
  LLM_CHECK(c.head_dim % 2 == 0 && c.head_dim <= kAttnMaxHeadDim, LLM_ERR_UNSUPPORTED,
            "the CUDA attention needs an even head_dim <= %d (got %d)", kAttnMaxHeadDim, c.head_dim);
  const int32_t rope_dims = c.spec.rope_dims > 0 ? c.spec.rope_dims : c.head_dim;
  LLM_CHECK(rope_dims % 2 == 0 && rope_dims <= c.head_dim, LLM_ERR_INTERNAL, "rope_dims %d of head_dim %d", rope_dims,
            c.head_dim);
  prefill_rows_ = prefill_rows_per_block(c.n_heads / c.n_kv_heads, c.head_dim);
  LLM_CHECK(prefill_rows_ >= 1, LLM_ERR_UNSUPPORTED, "the CUDA attention cannot hold %d query heads per KV head at head_dim %d",
            c.n_heads / c.n_kv_heads, c.head_dim);
  LLM_CHECK(opts.page_tokens >= 1 && opts.page_tokens <= 4096, LLM_ERR_INVALID_ARGUMENT, "page_tokens %d",
            opts.page_tokens);
  LLM_CHECK(opts.max_batch >= 1 && opts.max_batch <= 1024 && opts.max_chunk >= 1 && opts.max_chunk <= 8192,
            LLM_ERR_INVALID_ARGUMENT, "max_batch %d / max_chunk %d out of range", opts.max_batch, opts.max_chunk);
  max_batch_ = opts.max_batch;
  max_chunk_ = opts.max_chunk;
  LLM_CHECK(opts.gemv_max_rows >= 0 && opts.gemv_max_rows_quant >= 0, LLM_ERR_INVALID_ARGUMENT,
            "gemv_max_rows %d / gemv_max_rows_quant %d", opts.gemv_max_rows, opts.gemv_max_rows_quant);
  gemv_max_rows_ = opts.gemv_max_rows;
  gemv_max_rows_quant_ = opts.gemv_max_rows_quant;
  rows_ = std::max<int64_t>(max_batch_, max_chunk_);
  use_graphs_ = opts.use_graphs;
  geom_.n_layers = c.n_layers;
  geom_.n_kv_heads = c.n_kv_heads;
  geom_.head_dim = c.head_dim;
  geom_.page_tokens = opts.page_tokens;
  q_dim_ = int64_t(c.n_heads) * c.head_dim;
  kv_dim_ = int64_t(c.n_kv_heads) * c.head_dim;
  qkv_dim_ = q_dim_ + 2 * kv_dim_;

  check(cudaStreamCreateWithFlags(&stream_owner_.s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream_owner_.s;
  check(attention_setup(), "attention kernel setup (is the library built for this GPU's architecture?)");

  // ---- weights, through two pinned staging buffers freed afterwards
  stage_[0] = PinnedBuffer(kStagingBytes);
  stage_[1] = PinnedBuffer(kStagingBytes);
  tok_embd_ = upload({&model.tok_embd()}, "token embeddings");
  output_ = model.output().data == model.tok_embd().data ? tok_embd_ : upload({&model.output()}, "output");
  output_norm_ = upload_vector(model.output_norm(), c.dim);
  layers_.resize(size_t(c.n_layers));
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model.layers()[size_t(l)];
    LayerW& d = layers_[size_t(l)];
    d.attn_norm = upload_vector(w.attn_norm, c.dim);
    d.ffn_norm = upload_vector(w.ffn_norm, c.dim);
    if (can_stack({&w.wq, &w.wk, &w.wv}))
      d.qkv.push_back(upload({&w.wq, &w.wk, &w.wv}, "wq|wk|wv"));
    else
      d.qkv = {upload({&w.wq}, "wq"), upload({&w.wk}, "wk"), upload({&w.wv}, "wv")};
    d.wo = upload({&w.wo}, "wo");
    if (can_stack({&w.w_gate, &w.w_up}))
      d.gate_up.push_back(upload({&w.w_gate, &w.w_up}, "w_gate|w_up"));
    else
      d.gate_up = {upload({&w.w_gate}, "w_gate"), upload({&w.w_up}, "w_up")};
    d.down = upload({&w.w_down}, "w_down");
    if (w.bq || w.bk || w.bv) {
      std::vector<float> b(size_t(qkv_dim_), 0.0f);
      if (w.bq) std::copy(w.bq, w.bq + q_dim_, b.begin());
      if (w.bk) std::copy(w.bk, w.bk + kv_dim_, b.begin() + q_dim_);
      if (w.bv) std::copy(w.bv, w.bv + kv_dim_, b.begin() + q_dim_ + kv_dim_);
      d.qkv_bias = upload_vector(b.data(), qkv_dim_);
    }
    if (w.bo) d.bo = upload_vector(w.bo, c.dim);
    if (w.q_norm) d.q_norm = upload_vector(w.q_norm, c.head_dim);
    if (w.k_norm) d.k_norm = upload_vector(w.k_norm, c.head_dim);
    if (w.post_attn_norm) d.post_attn_norm = upload_vector(w.post_attn_norm, c.dim);
    if (w.post_ffn_norm) d.post_ffn_norm = upload_vector(w.post_ffn_norm, c.dim);
    d.window = w.window;
  }
  {  // every layer's RoPE frequencies in one table
    const size_t half = size_t(rope_dims / 2);
    std::vector<float> t(size_t(c.n_layers) * half);
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const float* f = model.layers()[size_t(l)].inv_freq;
      LLM_CHECK(f != nullptr || half == 0, LLM_ERR_INTERNAL, "layer %d has no RoPE table", l);
      std::copy(f, f + half, t.begin() + ptrdiff_t(size_t(l) * half));
    }
    rope_table_ = scratch(std::max<size_t>(t.size(), 1) * 4, "RoPE frequencies");
    check(cudaMemcpy(rope_table_.get(), t.data(), t.size() * 4, cudaMemcpyHostToDevice), "upload RoPE frequencies");
    for (int32_t l = 0; l < c.n_layers; ++l) layers_[size_t(l)].inv_freq = rope_table_.as<float>() + size_t(l) * half;
  }

  stage_[0] = PinnedBuffer();
  stage_[1] = PinnedBuffer();

  // ---- activations
  const int64_t R = rows_;
  const int64_t max_in = std::max<int64_t>({c.dim, q_dim_, c.hidden_dim});
  x_ = scratch(size_t(R * c.dim) * 4, "activations x");
  xb_ = scratch(size_t(R * c.dim) * 4, "activations xb");
  qkv_ = scratch(size_t(R * qkv_dim_) * 4, "activations qkv");
  att_ = scratch(size_t(R * q_dim_) * 4, "activations att");
  gu_ = scratch(size_t(R * 2 * c.hidden_dim) * 4, "activations gate|up");
  h_ = scratch(size_t(R * c.hidden_dim) * 4, "activations h");
  gemm_in_ = scratch(size_t(R * max_in) * 2, "GEMM input");
  int64_t deq_elems = 0, gemv_x_floats = 0;
  auto want_deq = [&](const DeviceMatrix& m) {
    if (is_quantized(m.layout.format)) deq_elems = std::max(deq_elems, std::min(kDequantElems, m.layout.rows * m.layout.cols));
    gemv_x_floats = std::max(gemv_x_floats, gemv_scratch_floats(m.layout));
  };
  for (const LayerW& l : layers_) {
    for (const auto& m : l.qkv) want_deq(m);
    for (const auto& m : l.gate_up) want_deq(m);
    want_deq(l.wo);
    want_deq(l.down);
  }
  gemv_x_floats = std::max(gemv_x_floats, gemv_scratch_floats(output_.layout));
  gemv_x_ = scratch(size_t(gemv_x_floats) * 4, "GEMV activations");
  // Tiles hold a multiple of 64 rows (keeps GEMM output pointers aligned).
  if (deq_elems) deq_ = scratch(size_t(deq_elems + 64 * max_in) * 2, "dequantized weight tile");
  const int64_t vocab = c.vocab_size;
  logits_ = scratch(size_t(max_batch_ * vocab) * 4, "logits");
  tokens_d_ = scratch(size_t(R) * 4, "tokens");
  pos_d_ = scratch(size_t(R) * 4, "positions");
  argmax_d_ = scratch(size_t(max_batch_) * 4, "argmax");
  topk_v_d_ = scratch(size_t(max_batch_) * kMaxTopK * 4, "top-k");
  topk_i_d_ = scratch(size_t(max_batch_) * kMaxTopK * 4, "top-k");
  const int64_t tk = topk_scratch_elems(max_batch_, vocab, kMaxTopK);
  topk_sv_d_ = scratch(size_t(tk) * 4, "top-k scratch");
  topk_si_d_ = scratch(size_t(tk) * 4, "top-k scratch");
  const size_t parts = size_t(max_batch_) * size_t(c.n_heads) * kMaxSplits;
  part_ml_ = scratch(parts * 2 * 4, "attention partials");
  part_acc_ = scratch(parts * size_t(c.head_dim) * 4, "attention partials");
  tokens_h_ = PinnedBuffer(size_t(R) * 4);
  pos_h_ = PinnedBuffer(size_t(R) * 4);
  logits_h_ = PinnedBuffer(size_t(max_batch_ * vocab) * 4);
  argmax_h_ = PinnedBuffer(size_t(max_batch_) * 4);
  topk_v_h_ = PinnedBuffer(size_t(max_batch_) * kMaxTopK * 4);
  topk_i_h_ = PinnedBuffer(size_t(max_batch_) * kMaxTopK * 4);
  gemm_ = std::make_unique<Gemm>(kGemmWorkspaceBytes);
  scratch_bytes_ += kGemmWorkspaceBytes;

  // ---- KV pages
  kv::Geometry g;
  g.n_layers = c.n_layers;
  g.n_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim;
  g.page_tokens = opts.page_tokens;
  const size_t pb = kv::page_bytes(g, kv_type_);
  const uint64_t budget = opts.kv_budget_bytes ? opts.kv_budget_bytes : default_budget(pb);
  alloc_ = PageAllocator(pb, budget, int32_t(std::max<size_t>(1, kKvChunkBytes / pb)));
  ensure_table_capacity(table_bucket((max_chunk_ + opts.page_tokens - 1) / opts.page_tokens));
  execs_.assign(8, nullptr);
  sync("backend setup");
  log_.log(LLM_LOG_INFO, "cuda: %s (%d SMs): weights %.1f MiB, scratch %.1f MiB, KV budget %.1f MiB (%d pages of %zu bytes)",
           device_name_.c_str(), sm_count_, double(weight_bytes_) / 1048576.0, double(scratch_bytes_) / 1048576.0,
           double(budget) / 1048576.0, alloc_.max_pages(), pb);
}

BackendImpl::~BackendImpl() {
  (void)cudaSetDevice(device_);
  if (stream_) (void)cudaStreamSynchronize(stream_);
  for (cudaGraphExec_t e : execs_)
    if (e) (void)cudaGraphExecDestroy(e);
}

DeviceBuffer BackendImpl::scratch(size_t bytes, const char* what) {
  scratch_bytes_ += bytes;
  return DeviceBuffer(bytes, what);
}

const float* BackendImpl::upload_vector(const float* host, int64_t n) {
  DeviceBuffer b(size_t(n) * 4, "norm weights");
  check(cudaMemcpy(b.get(), host, size_t(n) * 4, cudaMemcpyHostToDevice), "upload norm weights");
  const float* p = b.as<float>();
  weight_bytes_ += b.bytes();
  owned_.push_back(std::move(b));
  return p;
}

// Repacks into the device layout through two pinned staging buffers, so
// repacking slab i + 1 on the CPU overlaps the copy of slab i.
DeviceMatrix BackendImpl::upload(const std::vector<const cpu::WeightView*>& parts, const char* what) {
  int64_t rows = 0;
  for (const cpu::WeightView* p : parts) rows += p->rows;
  const MatrixLayout l = matrix_layout(parts[0]->dtype, parts[0]->group, rows, parts[0]->cols);
  const size_t scale_off = (l.data_bytes() + 255) / 256 * 256;
  DeviceBuffer buf(scale_off + l.scale_count() * 2, what);
  uint8_t* data = buf.as<uint8_t>();
  uint16_t* scales = reinterpret_cast<uint16_t*>(data + scale_off);

  const size_t row_stage = l.pitch + size_t(l.groups_per_row) * 2;
  const int64_t slab = int64_t(kStagingBytes / row_stage);
  LLM_CHECK(slab >= 1, LLM_ERR_UNSUPPORTED, "%s: a row of %zu bytes exceeds the upload staging buffer", what, row_stage);
  PinnedBuffer* stage = stage_;
  cudaEvent_t done[2] = {nullptr, nullptr};
  struct Events {
    cudaEvent_t* e;
    ~Events() {
      for (int i = 0; i < 2; ++i)
        if (e[i]) (void)cudaEventDestroy(e[i]);
    }
  } guard{done};
  for (auto& e : done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  bool used[2] = {false, false};
  int k = 0;
  int64_t row0 = 0;
  for (const cpu::WeightView* p : parts) {
    for (int64_t r = 0; r < p->rows; r += slab) {
      const int64_t n = std::min(slab, p->rows - r);
      if (used[k]) check(cudaEventSynchronize(done[k]), "weight upload");
      uint8_t* sd = stage[k].as<uint8_t>();
      uint16_t* ss = reinterpret_cast<uint16_t*>(sd + size_t(slab) * l.pitch);
      repack_rows(*p, l, r, n, sd, ss);
      check(cudaMemcpyAsync(data + size_t(row0 + r) * l.pitch, sd, size_t(n) * l.pitch, cudaMemcpyHostToDevice,
                            stream_),
            "weight upload");
      if (l.groups_per_row)
        check(cudaMemcpyAsync(scales + size_t(row0 + r) * size_t(l.groups_per_row), ss,
                              size_t(n) * size_t(l.groups_per_row) * 2, cudaMemcpyHostToDevice, stream_),
              "weight upload");
      check(cudaEventRecord(done[k], stream_), "cudaEventRecord");
      used[k] = true;
      k ^= 1;
    }
    row0 += p->rows;
  }
  sync("weight upload");
  DeviceMatrix m;
  m.layout = l;
  m.data = data;
  m.scales = l.groups_per_row ? scales : nullptr;
  weight_bytes_ += buf.bytes();
  owned_.push_back(std::move(buf));
  return m;
}

// ---------------------------------------------------------------- sequences and pages

SequenceImpl& BackendImpl::own(const Sequence& s) const {
  auto* impl = dynamic_cast<const SequenceImpl*>(&s);
  LLM_CHECK(impl && impl->owner_ == this, LLM_ERR_INVALID_ARGUMENT, "the sequence belongs to another backend");
  return *const_cast<SequenceImpl*>(impl);
}

std::unique_ptr<Sequence> BackendImpl::new_sequence() {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  return std::make_unique<SequenceImpl>(this);
}

std::unique_ptr<Sequence> BackendImpl::fork(const Sequence& src) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  SequenceImpl& s = own(src);
  auto f = std::make_unique<SequenceImpl>(this);
  f->pages_ = s.pages_.share(alloc_);
  f->length_ = s.length_;
  return f;
}

void BackendImpl::release_sequence(SequenceImpl& s) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  s.pages_.release_all(alloc_);
}

void BackendImpl::ensure_chunks(int32_t n) {
  while (int32_t(chunks_.size()) < n) {
    const int32_t pages = alloc_.chunk_pages(int32_t(chunks_.size()));
    LLM_CHECK(pages > 0, LLM_ERR_CONTEXT_FULL, "device KV budget exhausted");
    chunks_.emplace_back(size_t(pages) * alloc_.page_bytes(), "KV page chunk");
  }
}

void BackendImpl::reserve_pages(size_t need) {
  LLM_CHECK(int64_t(alloc_.pages_in_use()) + int64_t(need) <= int64_t(alloc_.max_pages()), LLM_ERR_CONTEXT_FULL,
            "device KV page pool is full (%d of %d pages in use, %zu more needed)", alloc_.pages_in_use(),
            alloc_.max_pages(), need);
  ensure_chunks(alloc_.chunks_needed_for(need));
}

void BackendImpl::copy_pages(const std::vector<PageCopy>& copies) {
  for (const PageCopy& c : copies)
    check(cudaMemcpyAsync(page_ptr(c.dst), page_ptr(c.src), alloc_.page_bytes(), cudaMemcpyDeviceToDevice, stream_),
          "KV copy-on-write");
}

// The table buffer's stride is baked into captured graphs: growing it
// invalidates them (O(log length) times per model).
void BackendImpl::ensure_table_capacity(int32_t pages) {
  if (pages <= tables_cap_) return;
  const int32_t cap = table_bucket(pages);
  const size_t bytes = size_t(max_batch_) * size_t(cap) * sizeof(uint8_t*);
  DeviceBuffer d(bytes, "page tables");
  PinnedBuffer h(bytes);
  invalidate_graphs();
  scratch_bytes_ += bytes;
  scratch_bytes_ -= tables_d_.bytes();
  tables_d_ = std::move(d);
  tables_h_ = std::move(h);
  tables_cap_ = cap;
  mirror_.reset(max_batch_);
}

void BackendImpl::upload_table_row(int32_t row, const PageList& pages) {
  const std::vector<int32_t>& ids = pages.ids();
  const size_t first = mirror_.sync_row(row, ids);
  if (first >= ids.size()) return;
  uint8_t** h = tables_h_.as<uint8_t*>() + size_t(row) * size_t(tables_cap_);
  for (size_t i = first; i < ids.size(); ++i) h[i] = page_ptr(ids[i]);
  uint8_t** d = tables_d_.as<uint8_t*>() + size_t(row) * size_t(tables_cap_);
  check(cudaMemcpyAsync(d + first, h + first, (ids.size() - first) * sizeof(uint8_t*), cudaMemcpyHostToDevice, stream_),
        "page table upload");
}

// ---------------------------------------------------------------- forward

void BackendImpl::linear(const DeviceMatrix& w, const float* x, int64_t n, float* y, int64_t ldy, float beta) {
  const MatrixLayout& l = w.layout;
  const bool quant = is_quantized(l.format);
  const int64_t gemv_rows = quant ? gemv_max_rows_quant_ : gemv_max_rows_;
  if (n <= (gemv_rows ? gemv_rows : default_gemv_max_rows(l.format))) {
    check(launch_gemv(w, x, l.cols, n, y, ldy, beta, gemv_x_.as<float>(), sm_count_, stream_), "gemv");
    return;
  }
  const GemmType t = l.format == WFormat::F32 ? GemmType::F32 : l.format == WFormat::BF16 ? GemmType::BF16 : GemmType::F16;
  const void* b = x;
  if (t != GemmType::F32) {
    check(launch_convert(x, n * l.cols, gemm_in_.as<uint16_t>(), t == GemmType::BF16, stream_), "convert");
    b = gemm_in_.get();
  }
  if (!quant) {
    const int64_t lda = int64_t(l.pitch) / (t == GemmType::F32 ? 4 : 2);
    gemm_->run(t, l.rows, n, l.cols, w.data, lda, b, l.cols, y, ldy, beta, stream_);
    return;
  }
  // q8/q4/GGUF blocks (is_quantized): dequantize a tile of rows to f16, GEMM it, next tile.
  const int64_t cap = int64_t(deq_.bytes() / 2);
  int64_t tile = std::max<int64_t>(64, cap / l.cols / 64 * 64);
  tile = std::min(tile, l.rows);
  for (int64_t r0 = 0; r0 < l.rows; r0 += tile) {
    const int64_t nr = std::min(tile, l.rows - r0);
    check(launch_dequant(w, r0, nr, deq_.as<uint16_t>(), false, stream_), "dequantize");
    gemm_->run(GemmType::F16, nr, n, l.cols, deq_.get(), l.cols, b, l.cols, y + r0, ldy, beta, stream_);
  }
}

void BackendImpl::linear_parts(const std::vector<DeviceMatrix>& parts, const float* x, int64_t n, float* y,
                               int64_t ldy) {
  int64_t col = 0;
  for (const DeviceMatrix& p : parts) {
    linear(p, x, n, y + col, ldy, 0.f);
    col += p.layout.rows;
  }
}

// block_pass's executor on the device: each step is a kernel launch on the
// backend's stream (see block_pass.h for the contract).
struct BackendImpl::Exec {
  using Layer = LayerW;
  BackendImpl& b;
  const StepShape& s;
  float* x = b.x_.as<float>();
  float* xb = b.xb_.as<float>();
  float* qkv = b.qkv_.as<float>();
  float* att = b.att_.as<float>();
  float* gu = b.gu_.as<float>();
  float* h = b.h_.as<float>();
  float* logits = b.logits_.as<float>();
  const float* output_norm = b.output_norm_;
  const DeviceMatrix& output = b.output_;

  PageTables tables() const { return PageTables{b.tables_d_.as<uint8_t*>(), b.tables_cap_, s.rows_per_seq}; }
  void embed(int64_t n, float* out) {
    check(launch_embed(b.tok_embd_, b.tokens_d_.as<int32_t>(), n, out, b.stream_), "embedding");
  }
  void scale(float* v, int64_t n, float f) { check(launch_scale(v, n, f, b.stream_), "scale"); }
  void softcap(float* v, int64_t n, float cap) { check(launch_softcap(v, n, cap, b.stream_), "softcap"); }
  void rmsnorm(const float* in, const float* w, int64_t rows, int64_t dim, float* out) {
    check(launch_rmsnorm(in, w, rows, dim, b.cfg_.norm_eps, out, b.stream_), "rmsnorm");
  }
  void head_rmsnorm(float* v, int64_t ld, int64_t n, int32_t heads, const float* w) {
    check(launch_head_rmsnorm(v, ld, n, heads, b.cfg_.head_dim, w, b.cfg_.norm_eps, b.stream_), "q/k norm");
  }
  void add_bias(float* y, int64_t ld, int64_t n, const float* bias, int64_t cols) {
    check(launch_add_bias(y, ld, n, bias, cols, b.stream_), "bias");
  }
  void linear(const DeviceMatrix& w, const float* in, int64_t n, float* y, int64_t ldy, float beta) {
    b.linear(w, in, n, y, ldy, beta);
  }
  void linear_parts(const std::vector<DeviceMatrix>& parts, const float* in, int64_t n, float* y, int64_t ldy) {
    b.linear_parts(parts, in, n, y, ldy);
  }
  void rope_store_kv(int32_t layer, const RopeSpec& r, float* q, int64_t n) {
    RopeKvArgs rk;
    rk.qkv = q;
    rk.ld = b.qkv_dim_;
    rk.n = n;
    rk.n_heads = b.cfg_.n_heads;
    rk.n_kv_heads = b.cfg_.n_kv_heads;
    rk.head_dim = b.cfg_.head_dim;
    rk.rope = r;
    rk.pos = b.pos_d_.as<int32_t>();
    rk.pages = tables();
    rk.geom = b.geom_;
    rk.layer = layer;
    rk.kv_f32 = b.kv_type_ == LLM_KV_F32;
    check(launch_rope_store_kv(rk, b.stream_), "rope / KV store");
  }
  void attention(int32_t layer, const AttnSpec& spec, const float* q, int64_t n, float* out) {
    AttnArgs a;
    a.q = q;
    a.q_ld = b.qkv_dim_;
    a.pos = b.pos_d_.as<int32_t>();
    a.pages = tables();
    a.geom = b.geom_;
    a.layer = layer;
    a.kv_f32 = b.kv_type_ == LLM_KV_F32;
    a.n_heads = b.cfg_.n_heads;
    a.scale = spec.scale;
    a.softcap = spec.softcap;
    a.window = spec.window;
    a.n_rows = n;
    a.rows_per_block = s.rows_per_block;
    a.split_tokens = s.split_tokens;
    a.n_splits = s.n_splits;
    a.out = out;
    a.out_ld = b.q_dim_;
    a.part_ml = b.part_ml_.as<float>();
    a.part_acc = b.part_acc_.as<float>();
    check(launch_attention(a, b.stream_), "attention");
  }
  void residual(const float* y, const float* bias, const float* w, int64_t rows, float* out) {
    check(launch_residual(y, bias, w, rows, b.cfg_.dim, b.cfg_.norm_eps, out, b.stream_), "residual");
  }
  void gated(const float* in, int64_t n, bool gelu, float* out) {
    check(launch_gated(in, n, b.cfg_.hidden_dim, gelu, out, b.stream_), "gated activation");
  }
};

// One forward pass of s.n rows whose tokens/positions are in tokens_d_/pos_d_
// and whose page tables are uploaded. Leaves logits in logits_ (decode: one
// row per sequence; prefill: the last row only, in row 0).
void BackendImpl::forward(const StepShape& s, const std::function<bool()>* cancel) {
  Exec e{*this, s};
  block_pass(e, cfg_, layers_, s.n, s.decode ? 0 : s.n - 1, s.decode ? s.n : 1, cancel);
}

// ---------------------------------------------------------------- prefill

void BackendImpl::prefill(Sequence& sq, const int32_t* tokens, size_t n, float* logits,
                          const std::function<bool()>& cancel) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  SequenceImpl& s = own(sq);
  LLM_CHECK(tokens != nullptr || n == 0, LLM_ERR_INVALID_ARGUMENT, "prefill: tokens is NULL");
  for (size_t i = 0; i < n; ++i)
    LLM_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, LLM_ERR_INVALID_ARGUMENT,
              "token %zu has id %d outside [0, %d)", i, tokens[i], cfg_.vocab_size);
  LLM_CHECK(uint64_t(s.length_) + n < uint64_t(INT32_MAX), LLM_ERR_CONTEXT_FULL, "sequence too long");
  if (n == 0) return;
  set_device();
  const uint32_t len0 = s.length_;
  const size_t pages0 = s.pages_.size();
  try {
    for (size_t done = 0; done < n;) {
      const size_t chunk = std::min(n - done, size_t(max_chunk_));
      prefill_chunk(s, tokens + done, int64_t(chunk), done + chunk == n ? logits : nullptr, cancel);
      done += chunk;
    }
  } catch (...) {
    (void)cudaStreamSynchronize(stream_);  // nothing may still write into pages we give back
    (void)cudaGetLastError();
    s.pages_.shrink_to(alloc_, pages0);
    s.length_ = len0;
    throw;
  }
}

void BackendImpl::prefill_chunk(SequenceImpl& s, const int32_t* tokens, int64_t n, float* logits,
                                const std::function<bool()>& cancel) {
  const uint32_t p0 = s.length_;
  const int32_t pt = geom_.page_tokens;
  reserve_pages(s.pages_.pages_needed(alloc_, pt, p0, p0 + uint32_t(n)));
  std::vector<PageCopy> copies;
  LLM_CHECK(s.pages_.prepare_write(alloc_, pt, p0, p0 + uint32_t(n), copies), LLM_ERR_CONTEXT_FULL,
            "device KV page pool is full");
  copy_pages(copies);
  ensure_table_capacity(int32_t(s.pages_.size()));
  upload_table_row(0, s.pages_);
  int32_t* th = tokens_h_.as<int32_t>();
  int32_t* ph = pos_h_.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    th[i] = tokens[i];
    ph[i] = int32_t(p0 + uint32_t(i));
  }
  check(cudaMemcpyAsync(tokens_d_.get(), th, size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "token upload");
  check(cudaMemcpyAsync(pos_d_.get(), ph, size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "position upload");

  StepShape shape;
  shape.n = n;
  shape.decode = false;
  shape.rows_per_seq = n;
  shape.rows_per_block = prefill_rows_;
  forward(shape, &cancel);
  const size_t vb = size_t(cfg_.vocab_size) * 4;
  if (logits) check(cudaMemcpyAsync(logits_h_.get(), logits_.get(), vb, cudaMemcpyDeviceToHost, stream_), "logits");
  sync("prefill");
  if (logits) std::memcpy(logits, logits_h_.get(), vb);
  s.length_ = p0 + uint32_t(n);
}

// ---------------------------------------------------------------- decode

void BackendImpl::decode(Sequence* const* seqs, const int32_t* tokens, size_t n, const DecodeOutput& out) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  LLM_CHECK(n >= 1 && n <= size_t(max_batch_), LLM_ERR_INVALID_ARGUMENT, "decode of %zu sequences (max_batch %d)", n,
            max_batch_);
  LLM_CHECK(seqs && tokens, LLM_ERR_INVALID_ARGUMENT, "decode: NULL argument");
  LLM_CHECK(out.top_k >= 0 && out.top_k <= kMaxTopK && out.top_k <= cfg_.vocab_size, LLM_ERR_INVALID_ARGUMENT,
            "top_k %d outside [0, %d]", out.top_k, std::min(kMaxTopK, cfg_.vocab_size));
  LLM_CHECK(out.top_k == 0 || (out.topk_logits && out.topk_ids), LLM_ERR_INVALID_ARGUMENT, "top-k outputs are NULL");
  std::vector<SequenceImpl*> ss(n);
  for (size_t i = 0; i < n; ++i) {
    LLM_CHECK(seqs[i] != nullptr, LLM_ERR_INVALID_ARGUMENT, "decode: sequence %zu is NULL", i);
    ss[i] = &own(*seqs[i]);
    LLM_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, LLM_ERR_INVALID_ARGUMENT, "token %d outside [0, %d)",
              tokens[i], cfg_.vocab_size);
    LLM_CHECK(ss[i]->length_ < uint32_t(INT32_MAX - 1), LLM_ERR_CONTEXT_FULL, "sequence too long");
  }
  {
    std::vector<SequenceImpl*> sorted = ss;
    std::sort(sorted.begin(), sorted.end());
    LLM_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), LLM_ERR_INVALID_ARGUMENT,
              "decode: a sequence appears twice in one batch");
  }
  set_device();
  const int32_t pt = geom_.page_tokens;
  size_t need = 0;
  for (SequenceImpl* s : ss) need += s->pages_.pages_needed(alloc_, pt, s->length_, s->length_ + 1);
  reserve_pages(need);
  std::vector<size_t> old_pages(n);
  size_t prepared = 0;
  try {
    std::vector<PageCopy> copies;
    for (; prepared < n; ++prepared) {
      SequenceImpl* s = ss[prepared];
      old_pages[prepared] = s->pages_.size();
      LLM_CHECK(s->pages_.prepare_write(alloc_, pt, s->length_, s->length_ + 1, copies), LLM_ERR_CONTEXT_FULL,
                "device KV page pool is full");
    }
    copy_pages(copies);
    size_t max_pages = 0;
    for (SequenceImpl* s : ss) max_pages = std::max(max_pages, s->pages_.size());
    const int32_t bucket = table_bucket(int64_t(max_pages));
    ensure_table_capacity(bucket);
    int32_t* th = tokens_h_.as<int32_t>();
    int32_t* ph = pos_h_.as<int32_t>();
    for (size_t i = 0; i < n; ++i) {
      th[i] = tokens[i];
      ph[i] = int32_t(ss[i]->length_);
      upload_table_row(int32_t(i), ss[i]->pages_);
    }
    check(cudaMemcpyAsync(tokens_d_.get(), th, n * 4, cudaMemcpyHostToDevice, stream_), "token upload");
    check(cudaMemcpyAsync(pos_d_.get(), ph, n * 4, cudaMemcpyHostToDevice, stream_), "position upload");

    const SplitPlan sp = plan_decode_splits(int64_t(bucket) * pt, int32_t(n), cfg_.n_kv_heads, sm_count_);
    StepShape shape;
    shape.n = int64_t(n);
    shape.decode = true;
    shape.rows_per_seq = 1;
    shape.rows_per_block = 1;
    shape.split_tokens = sp.split_tokens;
    shape.n_splits = sp.n_splits;
    GraphKey key;
    key.batch = int32_t(n);
    key.table_pages = bucket;
    run_decode_step(key, shape);

    const int64_t vocab = cfg_.vocab_size;
    if (out.argmax) {
      check(launch_argmax(logits_.as<float>(), int64_t(n), vocab, argmax_d_.as<int32_t>(), stream_), "argmax");
      check(cudaMemcpyAsync(argmax_h_.get(), argmax_d_.get(), n * 4, cudaMemcpyDeviceToHost, stream_), "argmax");
    }
    if (out.top_k > 0) {
      check(launch_topk(logits_.as<float>(), int64_t(n), vocab, out.top_k, topk_sv_d_.as<float>(),
                        topk_si_d_.as<int32_t>(), topk_v_d_.as<float>(), topk_i_d_.as<int32_t>(), stream_),
            "top-k");
      const size_t kb = n * size_t(out.top_k) * 4;
      check(cudaMemcpyAsync(topk_v_h_.get(), topk_v_d_.get(), kb, cudaMemcpyDeviceToHost, stream_), "top-k");
      check(cudaMemcpyAsync(topk_i_h_.get(), topk_i_d_.get(), kb, cudaMemcpyDeviceToHost, stream_), "top-k");
    }
    if (out.logits)
      check(cudaMemcpyAsync(logits_h_.get(), logits_.get(), n * size_t(vocab) * 4, cudaMemcpyDeviceToHost, stream_),
            "logits");
    sync("decode step");
    if (out.argmax) std::memcpy(out.argmax, argmax_h_.get(), n * 4);
    if (out.top_k > 0) {
      std::memcpy(out.topk_logits, topk_v_h_.get(), n * size_t(out.top_k) * 4);
      std::memcpy(out.topk_ids, topk_i_h_.get(), n * size_t(out.top_k) * 4);
    }
    if (out.logits) std::memcpy(out.logits, logits_h_.get(), n * size_t(vocab) * 4);
  } catch (...) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
    for (size_t i = 0; i < prepared; ++i) ss[i]->pages_.shrink_to(alloc_, old_pages[i]);
    throw;
  }
  for (SequenceImpl* s : ss) ++s->length_;
}

void BackendImpl::run_decode_step(const GraphKey& key, const StepShape& s) {
  if (!use_graphs_) return forward(s, nullptr);
  const DecodeGraphs::Decision d = graphs_.lookup(key);
  if (d.destroy_slot >= 0) destroy_graph(d.destroy_slot);
  if (d.action == DecodeGraphs::Action::Eager) return forward(s, nullptr);
  if (d.action == DecodeGraphs::Action::Capture) {
    if (!capture(d.slot, s)) {
      graphs_.capture_failed();
      invalidate_graphs();
      log_.log(LLM_LOG_WARN, "cuda: decode graph capture failed; running decode steps without graphs");
      return forward(s, nullptr);
    }
    graphs_.captured(d.slot);
  }
  const cudaError_t e = cudaGraphLaunch(execs_[size_t(d.slot)], stream_);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    graphs_.disable();
    invalidate_graphs();
    log_.log(LLM_LOG_WARN, "cuda: decode graph launch failed (%s); running without graphs", cudaGetErrorString(e));
    forward(s, nullptr);
  }
}

bool BackendImpl::capture(int slot, const StepShape& s) {
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  bool ok = true;
  try {
    forward(s, nullptr);
  } catch (const Error&) {
    ok = false;
  }
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &g);
  if (e != cudaSuccess || !ok || !g) {
    (void)cudaGetLastError();
    if (g) (void)cudaGraphDestroy(g);
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ei = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);
  if (ei != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (size_t(slot) >= execs_.size()) execs_.resize(size_t(slot) + 1, nullptr);
  if (execs_[size_t(slot)]) (void)cudaGraphExecDestroy(execs_[size_t(slot)]);
  execs_[size_t(slot)] = exec;
  return true;
}

void BackendImpl::destroy_graph(int slot) {
  if (slot < 0 || size_t(slot) >= execs_.size() || !execs_[size_t(slot)]) return;
  (void)cudaGraphExecDestroy(execs_[size_t(slot)]);
  execs_[size_t(slot)] = nullptr;
}

void BackendImpl::invalidate_graphs() {
  for (int slot : graphs_.invalidate_all()) destroy_graph(slot);
  for (size_t i = 0; i < execs_.size(); ++i) destroy_graph(int(i));
}

// ---------------------------------------------------------------- truncate / evict / snapshot

void BackendImpl::truncate(Sequence& sq, uint32_t n_tokens) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  SequenceImpl& s = own(sq);
  LLM_CHECK(n_tokens <= s.length_, LLM_ERR_INVALID_ARGUMENT, "truncate to %u of %u tokens", n_tokens, s.length_);
  const size_t pt = size_t(geom_.page_tokens);
  s.length_ = n_tokens;
  s.pages_.shrink_to(alloc_, (size_t(n_tokens) + pt - 1) / pt);
}

void BackendImpl::evict(Sequence& sq, uint32_t n_keep, uint32_t n_discard) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  SequenceImpl& s = own(sq);
  LLM_CHECK(uint64_t(n_keep) + n_discard <= s.length_, LLM_ERR_INVALID_ARGUMENT, "evict [%u, %llu) outside %u tokens",
            n_keep, (unsigned long long)(uint64_t(n_keep) + n_discard), s.length_);
  if (n_discard == 0) return;
  set_device();
  const int32_t pt = geom_.page_tokens;
  const uint32_t moved = s.length_ - n_keep - n_discard;
  if (moved > 0) {
    reserve_pages(s.pages_.pages_needed(alloc_, pt, n_keep, n_keep + moved));
    std::vector<PageCopy> copies;
    LLM_CHECK(s.pages_.prepare_write(alloc_, pt, n_keep, n_keep + moved, copies), LLM_ERR_CONTEXT_FULL,
              "device KV page pool is full (copy-on-write)");
    copy_pages(copies);
    ensure_table_capacity(int32_t(s.pages_.size()));
    upload_table_row(0, s.pages_);
    KvShiftArgs a;
    a.table = tables_d_.as<uint8_t*>();
    a.geom = geom_;
    a.kv_f32 = kv_type_ == LLM_KV_F32;
    a.first_moved = int32_t(n_keep + n_discard);
    a.n_moved = int32_t(moved);
    a.delta = int32_t(n_discard);
    a.inv_freq = rope_table_.as<float>();
    a.rope_kind = int32_t(cfg_.spec.rope_kind);
    a.rope_dims = cfg_.spec.rope_dims > 0 ? cfg_.spec.rope_dims : cfg_.head_dim;
    check(launch_kv_shift(a, stream_), "KV eviction shift");
    sync("KV eviction");
  }
  s.length_ -= n_discard;
  s.pages_.shrink_to(alloc_, (size_t(s.length_) + size_t(pt) - 1) / size_t(pt));
}

void BackendImpl::read_pages(const Sequence& sq, uint8_t* out) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  const SequenceImpl& s = own(sq);
  set_device();
  const size_t pb = alloc_.page_bytes();
  for (size_t i = 0; i < s.pages_.size(); ++i)
    check(cudaMemcpyAsync(out + i * pb, page_ptr(s.pages_.ids()[i]), pb, cudaMemcpyDeviceToHost, stream_),
          "KV page download");
  sync("KV page download");
  // Slots past the sequence in its last page hold stale rows (a pass undone
  // by truncate, a recycled page): written as zeros, as the host backend does,
  // so a snapshot holds this sequence's state and nothing else.
  const int32_t pt = geom_.page_tokens, used = int32_t(s.length_ % uint32_t(pt));
  if (used == 0 || s.pages_.size() == 0) return;
  uint8_t* last = out + (s.pages_.size() - 1) * pb;
  const size_t rb = size_t(geom_.head_dim) * (kv_type_ == LLM_KV_F32 ? 4 : 2);
  for (int32_t l = 0; l < geom_.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int32_t h = 0; h < geom_.n_kv_heads; ++h)
        for (int32_t slot = used; slot < pt; ++slot)
          std::memset(last + size_t(kv_row_index(geom_, l, kv, h, slot)) * rb, 0, rb);
}

void BackendImpl::write_pages(Sequence& sq, const uint8_t* pages, size_t n_pages, uint32_t length) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  SequenceImpl& s = own(sq);
  const int32_t pt = geom_.page_tokens;
  LLM_CHECK(s.length_ == 0 && s.pages_.size() == 0, LLM_ERR_INVALID_ARGUMENT, "write_pages needs an empty sequence");
  LLM_CHECK(n_pages == (size_t(length) + size_t(pt) - 1) / size_t(pt) && (pages || n_pages == 0),
            LLM_ERR_INVALID_ARGUMENT, "%zu pages cannot hold exactly %u tokens", n_pages, length);
  set_device();
  reserve_pages(n_pages);
  std::vector<PageCopy> copies;
  LLM_CHECK(s.pages_.prepare_write(alloc_, pt, 0, length, copies), LLM_ERR_CONTEXT_FULL, "device KV page pool is full");
  try {
    const size_t pb = alloc_.page_bytes();
    for (size_t i = 0; i < n_pages; ++i)
      check(cudaMemcpyAsync(page_ptr(s.pages_.ids()[i]), pages + i * pb, pb, cudaMemcpyHostToDevice, stream_),
            "KV page upload");
    sync("KV page upload");
  } catch (...) {
    (void)cudaStreamSynchronize(stream_);
    s.pages_.release_all(alloc_);
    throw;
  }
  s.length_ = length;
}

void BackendImpl::kv_row(const Sequence& sq, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  const SequenceImpl& s = own(sq);
  LLM_CHECK(slot < s.length_ && layer >= 0 && layer < geom_.n_layers && (kv == 0 || kv == 1) && head >= 0 &&
                head < geom_.n_kv_heads,
            LLM_ERR_INVALID_ARGUMENT, "kv_row out of range");
  set_device();
  const int32_t pt = geom_.page_tokens, hd = geom_.head_dim;
  const size_t es = kv_type_ == LLM_KV_F32 ? 4 : 2;
  const uint8_t* src = page_ptr(s.pages_.ids()[slot / uint32_t(pt)]) +
                       size_t(kv_row_index(geom_, layer, kv, head, int32_t(slot % uint32_t(pt)))) * size_t(hd) * es;
  std::vector<uint8_t> raw(size_t(hd) * es);
  check(cudaMemcpy(raw.data(), src, raw.size(), cudaMemcpyDeviceToHost), "KV row download");
  for (int32_t i = 0; i < hd; ++i) {
    if (es == 4) {
      std::memcpy(&out[i], raw.data() + size_t(i) * 4, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + size_t(i) * 2, 2);
      out[i] = f16_bits_to_float(h);
    }
  }
}

MemoryStats BackendImpl::memory() const {
  std::lock_guard<std::recursive_mutex> lk(mu_);
  MemoryStats m;
  m.weight_bytes = weight_bytes_;
  m.scratch_bytes = scratch_bytes_;
  m.kv_budget_bytes = uint64_t(alloc_.max_pages()) * alloc_.page_bytes();
  for (const DeviceBuffer& c : chunks_) m.kv_reserved_bytes += c.bytes();
  m.kv_in_use_bytes = alloc_.bytes_in_use();
  m.kv_pages_in_use = alloc_.pages_in_use();
  m.graphs_ready = graphs_.n_ready();
  return m;
}

}  // namespace

std::unique_ptr<Backend> Backend::create(const Model& model, const BackendOptions& opts) {
  return std::make_unique<BackendImpl>(model, opts);
}

}  // namespace llm::cuda

#endif  // LLM_WITH_CUDA
