#include "model/model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/half.h"
#include "format/gguf.h"
#include "format/llm_file.h"
#include "format/family_spec.h"
#include "quant/quant.h"

namespace llm {

uint64_t default_kv_budget_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  uint64_t phys = (pages > 0 && page_size > 0) ? uint64_t(pages) * uint64_t(page_size) : (uint64_t(4) << 30);
  return std::min<uint64_t>(phys / 4, uint64_t(8) << 30);
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  auto file = MappedFile::open(path);
  const uint8_t* d = file->data();
  const size_t n = file->size();
  ModelSource src;
  if (n >= 4 && std::memcmp(d, "GGUF", 4) == 0) {
    src = gguf_to_model_source(parse_gguf(d, n, opts.vocab_only), file, opts.vocab_only, &opts.log);
  } else if (is_llm_file(d, n)) {
    // Decompression and checksum verification use the model's own threads.
    ThreadPool load_pool(opts.n_threads);
    LlmReadOptions ro;
    ro.vocab_only = opts.vocab_only;
    ro.pool = &load_pool;
    if (opts.progress) {
      ro.progress = [&](float p) { return opts.progress(p, opts.progress_user) == 0; };
    }
    src = parse_llm(file, ro);
  } else {
    fail(LLM_ERR_FORMAT, "'%s' is neither a .llm nor a GGUF file (convert llama2.c checkpoints with llm-convert)",
         path.c_str());
  }
  return from_source(std::move(src), opts);
}

std::unique_ptr<Model> Model::from_source(ModelSource src, const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->src_ = std::move(src);
  m->log_ = opts.log;
  m->vocab_only_ = opts.vocab_only;
  m->build(opts);
  return m;
}

const float* Model::f32_vector(const std::string& name, int64_t n, float offset) {
  const TensorData* t = src_.find(name);
  LLM_CHECK(t, LLM_ERR_FORMAT, "missing tensor '%s'", name.c_str());
  LLM_CHECK(t->numel() == n && t->shape.size() == 1, LLM_ERR_FORMAT, "tensor '%s' has %lld values, expected %lld",
            name.c_str(), (long long)t->numel(), (long long)n);
  used_.insert(name);
  n_params_ += uint64_t(n);
  weight_bytes_ += uint64_t(n) * 4;
  if (offset == 0.0f && t->dtype == DType::F32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0) {
    LLM_CHECK(t->nbytes >= size_t(n) * 4, LLM_ERR_FORMAT, "tensor '%s' is truncated", name.c_str());
    return reinterpret_cast<const float*>(t->data);
  }
  const size_t rb = dtype_row_bytes(t->dtype, n, t->group);
  LLM_CHECK(rb != 0 && t->nbytes >= rb, LLM_ERR_FORMAT, "tensor '%s' has a bad size", name.c_str());
  converted_.emplace_back(size_t(n));
  float* v = converted_.back().data();
  dequantize_row(t->dtype, t->group, t->data, v, n);
  for (int64_t i = 0; i < n; ++i) v[i] += offset;
  return v;
}

const float* Model::optional_vector(const std::string& name, int64_t n) {
  return src_.find(name) ? f32_vector(name, n) : nullptr;
}

cpu::WeightView Model::matrix(const std::string& name, int64_t rows, int64_t cols) {
  const TensorData* t = src_.find(name);
  LLM_CHECK(t, LLM_ERR_FORMAT, "missing tensor '%s'", name.c_str());
  LLM_CHECK(t->shape.size() == 2 && t->shape[0] == rows && t->shape[1] == cols, LLM_ERR_FORMAT,
            "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name.c_str(),
            (long long)(t->shape.size() > 0 ? t->shape[0] : 0), (long long)(t->shape.size() > 1 ? t->shape[1] : 0),
            (long long)rows, (long long)cols);
  cpu::WeightView w;
  w.dtype = t->dtype;
  w.group = t->group;
  w.rows = rows;
  w.cols = cols;
  w.data = t->data;
  w.row_bytes = dtype_row_bytes(t->dtype, cols, t->group);
  LLM_CHECK(w.row_bytes != 0, LLM_ERR_FORMAT, "tensor '%s': %s with group %u cannot hold rows of %lld", name.c_str(),
            dtype_name(t->dtype), t->group, (long long)cols);
  LLM_CHECK(t->nbytes >= w.row_bytes * size_t(rows), LLM_ERR_FORMAT, "tensor '%s' is truncated", name.c_str());
  used_.insert(name);
  n_params_ += uint64_t(rows) * uint64_t(cols);
  weight_bytes_ += uint64_t(w.row_bytes) * uint64_t(rows);
  return w;
}

cpu::WeightView Model::matrix_rows(const std::string& name, int64_t total_rows, int64_t cols, int64_t first,
                                   int64_t rows) {
  cpu::WeightView w = matrix(name, total_rows, cols);
  // matrix() counted the whole tensor; each part counts only itself.
  n_params_ -= uint64_t(total_rows - rows) * uint64_t(cols);
  weight_bytes_ -= uint64_t(w.row_bytes) * uint64_t(total_rows - rows);
  w.data += size_t(first) * w.row_bytes;
  w.rows = rows;
  return w;
}

// Frequencies of the RoPE pairs: inv_freq[j] = scale / (base^(2j / rope_dims) * factor[j]),
// with exactly the float expressions of cpu::rope (so a plain Llama's angles
// do not change with this table). Under YaRN (format/family_spec.h) pair j's scale is
// blended with 1 by m_j = ext * ramp(j): scale (1 - m_j) + m_j.
static std::vector<float> rope_inv_freq(int32_t rope_dims, float base, float scale, const float* factors,
                                        const BlockSpec& s) {
  float lo = 0.0f, hi = 0.0f;
  if (s.rope_yarn_ext != 0.0f) {
    // The pair index whose wavelength fits `turns` times into the original
    // context: rope_dims ln(orig / (2 pi turns)) / (2 ln base).
    auto pair_at = [&](float turns) {
      return float(rope_dims) * std::log(float(s.rope_orig_ctx) / (turns * 2.0f * 3.14159265358979f)) /
             (2.0f * std::log(base));
    };
    lo = std::max(0.0f, std::floor(pair_at(s.rope_yarn_beta_fast)));
    hi = std::min(float(rope_dims - 1), std::ceil(pair_at(s.rope_yarn_beta_slow)));
  }
  std::vector<float> f(size_t(rope_dims / 2));
  for (int32_t j = 0; j < rope_dims / 2; ++j) {
    float v = 1.0f / std::pow(base, float(2 * j) / float(rope_dims));
    if (factors) v /= factors[j];
    if (s.rope_yarn_ext != 0.0f) {
      const float y = (float(j) - lo) / std::max(0.001f, hi - lo);
      const float m = (1.0f - std::min(1.0f, std::max(0.0f, y))) * s.rope_yarn_ext;
      f[size_t(j)] = v * (scale * (1.0f - m) + m);
    } else {
      f[size_t(j)] = v * scale;
    }
  }
  return f;
}

void Model::build_rope() {
  const ModelConfig& c = src_.config;
  const BlockSpec& s = c.spec;
  const int32_t rd = s.rope_dims;
  auto read_factors = [&](const char* name) {
    const float* f = f32_vector(name, rd / 2);
    for (int32_t j = 0; j < rd / 2; ++j)
      LLM_CHECK(std::isfinite(f[j]) && f[j] > 0.0f, LLM_ERR_FORMAT,
                "tensor '%s' holds %g at %d (factors must be finite and positive)", name, double(f[j]), j);
    return f;
  };
  const float* factors = nullptr;
  if (s.rope_factors) factors = read_factors("rope_freqs.weight");
  if (s.rope_longrope) {
    LLM_CHECK(!s.rope_factors, LLM_ERR_FORMAT, "rope_freqs.weight and LongRoPE factors in one file");
    // Both are validated (and so counted as used); the long ones apply when
    // the model's context reaches past the original one (llama.cpp picks the
    // same at its default context size).
    const float* lng = read_factors("rope_factors_long.weight");
    const float* sht = read_factors("rope_factors_short.weight");
    factors = c.seq_len > s.rope_orig_ctx ? lng : sht;
  }
  inv_freq_global_ = rope_inv_freq(rd, c.rope_theta, s.rope_freq_scale, factors, s);
  const float base_local = s.rope_base_local > 0 ? s.rope_base_local : c.rope_theta;
  const float scale_local = s.rope_freq_scale_local > 0 ? s.rope_freq_scale_local : s.rope_freq_scale;
  inv_freq_local_ = rope_inv_freq(rd, base_local, scale_local, factors, s);
}

void Model::build_layer(int32_t i) {
  const ModelConfig& c = src_.config;
  const BlockSpec& s = c.spec;
  const int64_t q_dim = int64_t(c.n_heads) * c.head_dim, kv_dim = int64_t(c.n_kv_heads) * c.head_dim;
  const std::string p = "blk." + std::to_string(i) + ".";
  LayerWeights& l = layers_[size_t(i)];
  l.attn_norm = norm_vector(p + "attn_norm.weight", c.dim);
  if (src_.find(p + "attn_qkv.weight")) {  // fused (Phi-3): q rows, then k, then v
    const int64_t all = q_dim + 2 * kv_dim;
    l.wq = matrix_rows(p + "attn_qkv.weight", all, c.dim, 0, q_dim);
    l.wk = matrix_rows(p + "attn_qkv.weight", all, c.dim, q_dim, kv_dim);
    l.wv = matrix_rows(p + "attn_qkv.weight", all, c.dim, q_dim + kv_dim, kv_dim);
  } else {
    l.wq = matrix(p + "attn_q.weight", q_dim, c.dim);
    l.wk = matrix(p + "attn_k.weight", kv_dim, c.dim);
    l.wv = matrix(p + "attn_v.weight", kv_dim, c.dim);
  }
  l.wo = matrix(p + "attn_output.weight", c.dim, q_dim);
  l.bq = optional_vector(p + "attn_q.bias", q_dim);
  l.bk = optional_vector(p + "attn_k.bias", kv_dim);
  l.bv = optional_vector(p + "attn_v.bias", kv_dim);
  l.bo = optional_vector(p + "attn_output.bias", c.dim);
  if (s.qk_norm) {
    l.q_norm = norm_vector(p + "attn_q_norm.weight", c.head_dim);
    l.k_norm = norm_vector(p + "attn_k_norm.weight", c.head_dim);
  }
  if (s.post_norms) {
    l.post_attn_norm = norm_vector(p + "post_attention_norm.weight", c.dim);
    l.post_ffn_norm = norm_vector(p + "post_ffw_norm.weight", c.dim);
  }
  l.ffn_norm = norm_vector(p + "ffn_norm.weight", c.dim);
  if (src_.find(p + "ffn_gate.weight")) {
    l.w_gate = matrix(p + "ffn_gate.weight", c.hidden_dim, c.dim);
    l.w_up = matrix(p + "ffn_up.weight", c.hidden_dim, c.dim);
  } else {  // fused (Phi-3): gate rows, then up rows
    l.w_gate = matrix_rows(p + "ffn_up.weight", 2 * int64_t(c.hidden_dim), c.dim, 0, c.hidden_dim);
    l.w_up = matrix_rows(p + "ffn_up.weight", 2 * int64_t(c.hidden_dim), c.dim, c.hidden_dim, c.hidden_dim);
  }
  l.w_down = matrix(p + "ffn_down.weight", c.dim, c.hidden_dim);
  l.window = s.windowed(i) ? s.window[size_t(i)] : 0;
  l.inv_freq = l.window ? inv_freq_local_.data() : inv_freq_global_.data();
}

void Model::build(const LoadOptions& opts) {
  const ModelConfig& c = src_.config;
  // The tokenizer keeps the vocabulary; src_ keeps no second copy of it
  // (262,144 strings, scores and types for Gemma 3).
  tokenizer_ = Tokenizer::create(std::move(src_.vocab));
  src_.vocab = VocabData();
  if (vocab_only_) return;

  LLM_CHECK(find_family(c.arch) != nullptr, LLM_ERR_UNSUPPORTED, "architecture '%s' is not supported (%s)",
            c.arch.c_str(), family_names().c_str());
  LLM_CHECK(c.dim > 0 && c.hidden_dim > 0 && c.n_layers > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0 &&
                c.vocab_size > 0,
            LLM_ERR_FORMAT, "model hyper-parameters are missing or not positive");
  LLM_CHECK(c.dim <= (1 << 16) && c.hidden_dim <= (1 << 18) && c.n_layers <= 1024 && c.n_heads <= 1024 &&
                c.head_dim <= 1024 && c.vocab_size <= (1 << 22),
            LLM_ERR_FORMAT, "model hyper-parameters are out of range");
  LLM_CHECK(c.n_heads % c.n_kv_heads == 0, LLM_ERR_FORMAT, "n_heads %d is not a multiple of n_kv_heads %d",
            c.n_heads, c.n_kv_heads);
  LLM_CHECK(c.head_dim % 2 == 0, LLM_ERR_FORMAT, "head_dim %d is odd", c.head_dim);
  LLM_CHECK(c.vocab_size == tokenizer_->n_vocab(), LLM_ERR_FORMAT, "vocab size %d != tokenizer size %d", c.vocab_size,
            tokenizer_->n_vocab());
  if (src_.config.spec.rope_dims == 0) src_.config.spec.rope_dims = c.head_dim;
  validate_spec(c);

  tok_embd_ = matrix("token_embd.weight", c.vocab_size, c.dim);
  output_norm_ = norm_vector("output_norm.weight", c.dim);
  if (src_.find("output.weight")) {
    output_ = matrix("output.weight", c.vocab_size, c.dim);
  } else {
    output_ = tok_embd_;  // tied
  }
  build_rope();
  layers_.resize(size_t(c.n_layers));
  for (int32_t i = 0; i < c.n_layers; ++i) build_layer(i);
  // A tensor the spec did not use could change the math (a bias, a norm,
  // RoPE factors of another scheme): refuse rather than ignore it.
  for (const TensorData& t : src_.tensors)
    LLM_CHECK(used_.count(t.name), LLM_ERR_UNSUPPORTED,
              "tensor '%s' is not used by the '%s' model block; refusing a model it would change", t.name.c_str(),
              c.arch.c_str());
  used_.clear();

  // The dominant weight type (most bytes among the layer matrices).
  std::map<DType, uint64_t> bytes_by_type;
  for (const auto& l : layers_)
    for (const cpu::WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      bytes_by_type[w->dtype] += w->row_bytes * uint64_t(w->rows);
  weight_type_ = std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; })
                     ->first;

  mode_ = opts.reference_math ? cpu::MatmulMode::Reference : cpu::MatmulMode::Fast;
  pool_ = std::make_unique<ThreadPool>(opts.n_threads);
  // KV pages: the global layers' and, when the model also has sliding-window
  // layers, theirs in a second pool (same budget), so that pages only those
  // layers used can go once every window has left them.
  int32_t n_local = 0;
  for (const LayerWeights& l : layers_) n_local += l.window > 0 ? 1 : 0;
  const bool split = opts.kv_prune_windows && n_local > 0 && n_local < c.n_layers;
  int32_t next[2] = {0, 0};
  for (LayerWeights& l : layers_) {
    l.kv_group = split && l.window > 0 ? 1 : 0;
    l.kv_layer = next[l.kv_group]++;
    if (l.kv_group == 1) kv_local_window_ = std::max(kv_local_window_, uint32_t(l.window));
  }
  kv::Geometry g;
  g.n_layers = next[0];
  g.n_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim;
  g.page_tokens = int32_t(opts.kv_page_tokens ? opts.kv_page_tokens : 16);
  auto budget = std::make_shared<kv::Budget>(opts.kv_budget_bytes ? opts.kv_budget_bytes : default_kv_budget_bytes());
  kv_pool_ = std::make_unique<kv::PagePool>(g, budget);
  if (split) {
    kv::Geometry gl = g;
    gl.n_layers = next[1];
    kv_pool_local_ = std::make_unique<kv::PagePool>(gl, budget);
  }

  cpu_backend_ = cpu::make_backend(*this);

  // Device: CUDA on request (errors propagate), or under AUTO when a device
  // exists (a failure there, such as a weight type the device cannot hold,
  // logs a warning and stays on the CPU). The CUDA forward honours every
  // block-spec field, as the CPU one does.
  const bool want_cuda =
      opts.device == LLM_DEVICE_CUDA || (opts.device == LLM_DEVICE_AUTO && cuda::device_count(nullptr) > 0);
  if (want_cuda) {
    cuda::BackendOptions bo;
    bo.kv_budget_bytes = opts.kv_budget_bytes;
    bo.page_tokens = g.page_tokens;
    bo.log = log_;
    try {
      cuda_ = cuda::Backend::create(*this, bo);
      gpu_backend_ = cuda::as_backend(*cuda_, size_t(c.vocab_size), size_t(bo.max_batch), size_t(bo.max_chunk));
    } catch (const Error& e) {
      if (opts.device == LLM_DEVICE_CUDA) throw;
      log_.log(LLM_LOG_WARN, "CUDA backend unavailable, running on the CPU: %s", e.what());
    }
  }
  if (!cuda_ && opts.huge_pages) move_weights_to_huge_pages();
  release_metadata_pages();
}

// The file's bytes before its first tensor (the header and the metadata: a
// GGUF vocabulary of 262,144 tokens is 7 MB of it) were read by the parse and
// are not needed in memory any more; the mapping stays valid (the pages come
// back from the page cache if something reads them, such as scores the
// tokenizer uses in place).
void Model::release_metadata_pages() {
  const MappedFile* f = src_.file.get();
  if (f == nullptr) return;
  const uint8_t* first = f->data() + f->size();
  for (const TensorData& t : src_.tensors)
    if (t.data != nullptr && !t.owned && t.data >= f->data() && t.data < first) first = t.data;
  f->drop_pages(f->data(), size_t(first - f->data()));
}

// Memory the kernel could hand out now without swapping (Linux MemAvailable);
// 0 when unknown.
static uint64_t available_memory_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return uint64_t(kib) * 1024;
}

// Decode streams every matrix once per token. Read through 4 KiB pages (a file
// mapping, or buffers from the allocator) that walk misses the TLB every 4 KiB;
// copied into one block on 2 MiB pages it misses every 2 MiB, and decode runs
// about 14% faster on the machines in docs/PERFORMANCE.md. The copy is skipped,
// leaving the weights where they are, when the kernel takes no huge-page
// advice, when memory is short, or when the block cannot be had. The bytes
// the copy replaces are then given back: decompressed buffers are freed and
// the file mapping's pages dropped (the kernel may still cache the file).
//
// The copy is also where Q4_0 matrices take the X8 layout when the kernels
// that run want it (cpu::x8_preferred, backend/cpu/matmul.h: 1.4-1.8x
// faster prefill); for that it is made even without huge pages. Same bytes,
// permuted: no memory is added.
void Model::move_weights_to_huge_pages() {
  struct Item {
    cpu::WeightView* view;
    size_t offset, bytes;
    bool x8;
  };
  std::vector<Item> items;
  size_t total = 0;
  bool any_x8 = false;
  auto add = [&](cpu::WeightView* w, bool matmul) {
    const size_t bytes = w->row_bytes * size_t(w->rows);
    const bool repack = matmul && cpu::x8_eligible(*w) && cpu::x8_preferred(w->dtype, mode_);
    items.push_back({w, total, bytes, repack});
    any_x8 = any_x8 || repack;
    total += (bytes + 63) / 64 * 64;
  };
  for (auto& l : layers_)
    for (cpu::WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) add(w, true);
  const bool tied = output_.data == tok_embd_.data;
  add(&output_, true);  // tied: the embedding rows read it through dequantize_row, which knows its layout
  if (!tied) add(&tok_embd_, false);

  const uint64_t avail = available_memory_bytes();
  if (avail != 0 && uint64_t(total) + (uint64_t(256) << 20) > avail) {
    log_.log(LLM_LOG_INFO, "weights stay on the file's pages: %.1f MiB to copy, %.1f MiB available",
             double(total) / (1 << 20), double(avail) / (1 << 20));
    return;
  }
  HugePageBlock block;
  try {
    block = HugePageBlock(total);
  } catch (const Error& e) {
    if (e.status() != LLM_ERR_OUT_OF_MEMORY) throw;
    log_.log(LLM_LOG_INFO, "weights stay on the file's pages: %s", e.what());
    return;
  }
  if (!block.advised() && !any_x8) return;  // no huge pages here: a copy would gain nothing

  uint8_t* base = block.data();
  pool_->parallel([&](int ith, int nth) {
    // Every thread copies its share of each matrix: 4 KiB-granular slices.
    for (const Item& it : items) {
      int64_t b, e;
      if (it.x8) {  // whole 8-row groups per thread
        const int64_t rows = it.view->rows, groups = (rows + 7) / 8;
        ThreadPool::split(groups, ith, nth, &b, &e);
        if (b < e) cpu::repack_x8(*it.view, base + it.offset, b * 8, std::min(rows, e * 8));
        continue;
      }
      ThreadPool::split(int64_t((it.bytes + 4095) / 4096), ith, nth, &b, &e);
      const size_t lo = std::min(it.bytes, size_t(b) * 4096), hi = std::min(it.bytes, size_t(e) * 4096);
      if (hi > lo) std::memcpy(base + it.offset + lo, it.view->data + lo, hi - lo);
    }
  });

  // Give back what the copy replaces, then point the views at the block.
  for (const Item& it : items) {
    for (TensorData& t : src_.tensors) {
      if (t.data != it.view->data) continue;
      if (t.owned) {
        t.owned.reset();
      } else if (src_.file) {
        src_.file->drop_pages(t.data, t.nbytes);
      }
      t.data = nullptr;  // nothing reads a matrix's source bytes after this
      t.nbytes = 0;
    }
    it.view->data = base + it.offset;
    if (it.x8) it.view->layout = cpu::WeightLayout::X8;
  }
  if (tied) {
    tok_embd_.data = output_.data;
    tok_embd_.layout = output_.layout;
  }
  weight_block_ = std::move(block);
}

}  // namespace llm
