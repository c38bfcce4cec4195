// GGUF reader tests: the shared model files (README numbers), a byte-level
// comparison with the llama2.c checkpoint, hostile headers and truncations,
// and synthetic files built here to reach every validation branch.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/log.h"
#include "format/gguf.h"
#include "model/model.h"
#include "quant/ggml_quants.h"
#include "quant/quant.h"
#include "status_of.h"

namespace llm {
namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// Runs fn and returns the llm_status it threw (LLM_OK if it returned).
using llm::testing::status_of;

const TensorData& tensor(const ModelSource& m, const std::string& name) {
  const TensorData* t = m.find(name);
  if (!t) throw std::runtime_error("missing tensor " + name);
  return *t;
}

// ---------------------------------------------------------------------------
// A minimal GGUF writer, for synthetic files.
class GgufBuilder {
 public:
  void kv_u32(const std::string& k, uint32_t v) { key(k, 4); put(v); ++n_kv_; }
  void kv_i32(const std::string& k, int32_t v) { key(k, 5); put(v); ++n_kv_; }
  void kv_f32(const std::string& k, float v) { key(k, 6); put(v); ++n_kv_; }
  void kv_bool(const std::string& k, bool v) { key(k, 7); put(uint8_t(v)); ++n_kv_; }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8); str(v); ++n_kv_; }
  void kv_strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put(uint32_t(8));
    put(uint64_t(v.size()));
    for (const auto& s : v) str(s);
    ++n_kv_;
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9);
    put(uint32_t(6));
    put(uint64_t(v.size()));
    for (float f : v) put(f);
    ++n_kv_;
  }
  // ne innermost first, like ggml.
  void tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type, std::vector<uint8_t> bytes) {
    tensors_.push_back({name, std::move(ne), type, std::move(bytes)});
  }
  std::vector<uint8_t> build(uint32_t alignment = 32) const {
    Bytes out;
    out.insert(out.end(), {'G', 'G', 'U', 'F'});
    append(out, uint32_t(3));
    append(out, uint64_t(tensors_.size()));
    append(out, uint64_t(n_kv_));
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      append(out, uint64_t(t.name.size()));
      out.insert(out.end(), t.name.begin(), t.name.end());
      append(out, uint32_t(t.ne.size()));
      for (int64_t d : t.ne) append(out, uint64_t(d));
      append(out, uint32_t(t.type));
      append(out, off);
      offsets.push_back(off);
      off += (t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    if (tensors_.empty()) return out;
    while (out.size() % alignment) out.push_back(0);
    const size_t base = out.size();
    out.resize(base + off, 0);
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (!tensors_[i].bytes.empty())
        std::memcpy(out.data() + base + offsets[i], tensors_[i].bytes.data(), tensors_[i].bytes.size());
    return out;
  }

 private:
  using Bytes = std::vector<uint8_t>;
  struct T {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    Bytes bytes;
  };
  template <typename V>
  static void append(Bytes& b, V v) {
    const size_t n = b.size();
    b.resize(n + sizeof(V));
    std::memcpy(b.data() + n, &v, sizeof(V));
  }
  template <typename V>
  void put(V v) { append(kv_, v); }
  void str(const std::string& s) {
    put(uint64_t(s.size()));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    str(k);
    put(type);
  }
  Bytes kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

std::vector<uint8_t> f32_bytes(size_t n, float scale = 0.01f) {
  std::vector<uint8_t> b(n * 4);
  for (size_t i = 0; i < n; ++i) {
    const float v = scale * float(int(i % 17) - 8);
    std::memcpy(b.data() + 4 * i, &v, 4);
  }
  return b;
}

// A complete tiny llama: dim 32, 2 heads (head_dim 16), 1 kv head, ffn 64, 2 layers, vocab 4.
struct TinyLlama {
  int64_t dim = 32, hid = 64, vocab = 4, layers = 2, heads = 2, kv_heads = 1;
  GgmlType matrix_type = GgmlType::F32;
  std::string skip;          // tensor to leave out
  std::string bad_shape;     // tensor to give a wrong shape
  std::string arch = "llama";
  uint32_t pad_id = 3;
  // When set, matrices of matrix_type take their rows (of `dim` values) from
  // here, cycling through `source_rows` encoded rows.
  const uint8_t* row_source = nullptr;
  int64_t source_rows = 0;
  // Adds metadata or tensors of a test's own (after the standard ones).
  std::function<void(GgufBuilder&)> extra;

  std::vector<uint8_t> build() const {
    GgufBuilder b;
    b.kv_str("general.architecture", arch);
    b.kv_u32("llama.embedding_length", uint32_t(dim));
    b.kv_u32("llama.feed_forward_length", uint32_t(hid));
    b.kv_u32("llama.block_count", uint32_t(layers));
    b.kv_u32("llama.attention.head_count", uint32_t(heads));
    b.kv_u32("llama.attention.head_count_kv", uint32_t(kv_heads));
    b.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
    b.kv_f32("llama.rope.freq_base", 500000.0f);
    b.kv_str("tokenizer.ggml.model", "llama");
    b.kv_strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\xe2\x96\x81" "a"});
    b.kv_f32s("tokenizer.ggml.scores", {0, 0, 0, -1});
    b.kv_u32("tokenizer.ggml.bos_token_id", 1);
    b.kv_u32("tokenizer.ggml.eos_token_id", 2);
    b.kv_bool("tokenizer.ggml.add_bos_token", false);
    b.kv_u32("tokenizer.ggml.padding_token_id", pad_id);
    const int64_t hd = dim / heads;
    auto add = [&](const std::string& name, std::vector<int64_t> ne, bool matrix) {
      if (name == skip) return;
      if (name == bad_shape) ne[0] += 32;
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      const GgmlType t = matrix ? matrix_type : GgmlType::F32;
      std::vector<uint8_t> bytes;
      if (t == GgmlType::F32) {
        bytes = f32_bytes(size_t(n));
      } else if (row_source) {
        const size_t rb = ggml_type_size(t, ne[0]);
        for (int64_t r = 0; r < n / ne[0]; ++r) {
          const uint8_t* p = row_source + size_t(r % source_rows) * rb;
          bytes.insert(bytes.end(), p, p + rb);
        }
      } else {
        bytes.resize(ggml_type_size(t, n));
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 37 + 11);
        // Keep every fp16 scale finite and small: zero the high byte of each block's first half.
        if (t == GgmlType::Q8_0 || t == GgmlType::Q4_0)
          for (size_t i = 0; i < bytes.size(); i += t == GgmlType::Q8_0 ? 34 : 18) bytes[i + 1] = 0x20;
      }
      b.tensor(name, ne, t, bytes);
    };
    add("token_embd.weight", {dim, vocab}, false);
    add("output_norm.weight", {dim}, false);
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", {dim}, false);
      add(p + "attn_q.weight", {dim, heads * hd}, true);
      add(p + "attn_k.weight", {dim, kv_heads * hd}, true);
      add(p + "attn_v.weight", {dim, kv_heads * hd}, true);
      add(p + "attn_output.weight", {heads * hd, dim}, true);
      add(p + "ffn_norm.weight", {dim}, false);
      add(p + "ffn_gate.weight", {dim, hid}, true);
      add(p + "ffn_up.weight", {dim, hid}, true);
      add(p + "ffn_down.weight", {hid, dim}, true);
    }
    if (extra) extra(b);
    return b.build();
  }
};

ModelSource load_bytes(std::vector<uint8_t> bytes, bool vocab_only = false, const Logger* log = nullptr) {
  auto f = MappedFile::from_bytes(std::move(bytes));
  GgufFile g = parse_gguf(f->data(), f->size(), vocab_only);
  return gguf_to_model_source(g, f, vocab_only, log);
}

// ---------------------------------------------------------------------------
// The shared model files.

TEST(GgufFiles, Stories260KConfigVocabAndShapes) {
  const ModelSource m = read_gguf(model_path("stories260K.gguf"), false, nullptr);
  EXPECT_EQ(m.config.arch, "llama");
  EXPECT_EQ(m.config.dim, 64);
  EXPECT_EQ(m.config.hidden_dim, 172);
  EXPECT_EQ(m.config.n_layers, 5);
  EXPECT_EQ(m.config.n_heads, 8);
  EXPECT_EQ(m.config.n_kv_heads, 4);
  EXPECT_EQ(m.config.head_dim, 8);
  EXPECT_EQ(m.config.vocab_size, 512);
  EXPECT_EQ(m.config.seq_len, 2048);
  EXPECT_FLOAT_EQ(m.config.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(m.config.norm_eps, 1e-5f);

  EXPECT_EQ(m.vocab.model, "llama");
  ASSERT_EQ(m.vocab.tokens.size(), 512u);
  ASSERT_EQ(m.vocab.scores.size(), 512u);
  ASSERT_EQ(m.vocab.types.size(), 512u);
  EXPECT_EQ(m.vocab.tokens[1], "<s>");
  EXPECT_EQ(m.vocab.tokens[3], "<0x00>");
  EXPECT_EQ(m.vocab.types[0], int32_t(TokenType::Unknown));
  EXPECT_EQ(m.vocab.types[1], int32_t(TokenType::Control));
  EXPECT_EQ(m.vocab.types[3], int32_t(TokenType::Byte));
  EXPECT_EQ(m.vocab.types[258], int32_t(TokenType::Byte));
  EXPECT_EQ(m.vocab.types[259], int32_t(TokenType::Normal));
  // Merge scores count down from 0 at id 259 (README, tok512).
  EXPECT_FLOAT_EQ(m.vocab.scores[259], 0.0f);
  EXPECT_FLOAT_EQ(m.vocab.scores[260], -1.0f);
  EXPECT_EQ(m.vocab.bos, 1);
  EXPECT_EQ(m.vocab.eos, 2);
  EXPECT_EQ(m.vocab.unk, 0);
  EXPECT_EQ(m.vocab.pad, -1);  // stored as u32 0xffffffff
  EXPECT_TRUE(m.vocab.add_bos);
  EXPECT_TRUE(m.vocab.add_space_prefix);

  EXPECT_EQ(m.tensors.size(), 48u);  // 3 + 5 layers x 9, output.weight stored separately
  EXPECT_EQ(tensor(m, "token_embd.weight").shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(tensor(m, "output.weight").shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(tensor(m, "output_norm.weight").shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(tensor(m, "blk.4.attn_q.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(tensor(m, "blk.4.attn_k.weight").shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(tensor(m, "blk.4.attn_v.weight").shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(tensor(m, "blk.4.ffn_gate.weight").shape, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(tensor(m, "blk.4.ffn_down.weight").shape, (std::vector<int64_t>{64, 172}));
  for (const auto& t : m.tensors) {
    EXPECT_EQ(t.dtype, DType::F32) << t.name;
    EXPECT_EQ(t.nbytes, size_t(t.numel()) * 4) << t.name;
    // Zero copy: the bytes live inside the mapped file.
    EXPECT_GE(t.data, m.file->data()) << t.name;
    EXPECT_LE(t.data + t.nbytes, m.file->data() + m.file->size()) << t.name;
    EXPECT_EQ(t.owned, nullptr) << t.name;
  }
}

// stories260K.gguf holds the same f32 weights as the llama2.c checkpoint.
TEST(GgufFiles, Stories260KWeightsEqualLlama2cCheckpoint) {
  const ModelSource m = read_gguf(model_path("stories260K.gguf"), false, nullptr);
  const std::vector<uint8_t> bin = read_all(model_path("stories260K.bin"));
  ASSERT_EQ(bin.size(), 1056540u);
  // llama2.c layout after the 28-byte header, in floats.
  const int64_t dim = 64, hid = 172, L = 5, V = 512, kv = 32;
  const size_t tok = 28, rms_att = tok + 4 * V * dim, wq = rms_att + 4 * L * dim, wk = wq + 4 * L * dim * dim,
               wv = wk + 4 * L * kv * dim, wo = wv + 4 * L * kv * dim, rms_ffn = wo + 4 * L * dim * dim,
               w1 = rms_ffn + 4 * L * dim, w2 = w1 + 4 * L * hid * dim, w3 = w2 + 4 * L * dim * hid,
               rms_final = w3 + 4 * L * hid * dim;
  auto same = [&](const char* name, size_t off) {
    const TensorData& t = tensor(m, name);
    ASSERT_LE(off + t.nbytes, bin.size());
    EXPECT_EQ(std::memcmp(t.data, bin.data() + off, t.nbytes), 0) << name;
  };
  same("token_embd.weight", tok);
  same("output.weight", tok);
  same("blk.0.attn_norm.weight", rms_att);
  same("blk.0.attn_q.weight", wq);
  same("blk.3.attn_q.weight", wq + 3 * 4 * dim * dim);
  same("blk.1.attn_k.weight", wk + 1 * 4 * kv * dim);
  same("blk.2.attn_v.weight", wv + 2 * 4 * kv * dim);
  same("blk.4.attn_output.weight", wo + 4 * 4 * dim * dim);
  same("blk.4.ffn_norm.weight", rms_ffn + 4 * 4 * dim);
  same("blk.2.ffn_gate.weight", w1 + 2 * 4 * hid * dim);
  same("blk.2.ffn_down.weight", w2 + 2 * 4 * dim * hid);
  same("blk.2.ffn_up.weight", w3 + 2 * 4 * hid * dim);
  same("output_norm.weight", rms_final);
}

// The derived Q8_0 / Q4_0 files: quantized matrices keep their bytes, and
// decode to within a quantization step of the F32 original.
void check_quantized_file(const char* file, DType dt, size_t block_bytes, float steps) {
  const ModelSource q = read_gguf(model_path(file), false, nullptr);
  const ModelSource f = read_gguf(model_path("stories260K.gguf"), false, nullptr);
  EXPECT_EQ(q.config.dim, 64);
  EXPECT_EQ(q.config.vocab_size, 512);
  ASSERT_EQ(q.tensors.size(), 48u);
  EXPECT_EQ(tensor(q, "blk.0.ffn_down.weight").dtype, DType::F32);  // rows of 172
  EXPECT_EQ(tensor(q, "output_norm.weight").dtype, DType::F32);
  for (const char* name : {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.4.ffn_up.weight"}) {
    const TensorData& t = tensor(q, name);
    const TensorData& r = tensor(f, name);
    ASSERT_EQ(t.dtype, dt) << name;
    EXPECT_EQ(t.group, 32u);
    EXPECT_EQ(t.shape, r.shape);
    EXPECT_EQ(t.nbytes, size_t(t.numel() / 32) * block_bytes);
    EXPECT_EQ(t.owned, nullptr);
    EXPECT_GE(t.data, q.file->data());
    EXPECT_LE(t.data + t.nbytes, q.file->data() + q.file->size());
    std::vector<float> row(size_t(t.cols()));
    const size_t rb = dtype_row_bytes(t.dtype, t.cols(), t.group);
    for (int64_t i = 0; i < t.rows(); ++i) {
      dequantize_row(t.dtype, t.group, t.data + size_t(i) * rb, row.data(), t.cols());
      const float* ref = reinterpret_cast<const float*>(r.data) + i * t.cols();
      for (int64_t g = 0; g < t.cols() / 32; ++g) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(ref[g * 32 + j]));
        for (int j = 0; j < 32; ++j)
          ASSERT_LE(std::fabs(row[size_t(g * 32 + j)] - ref[g * 32 + j]), amax * steps * 1.01f + 1e-7f)
              << name << " row " << i;
      }
    }
  }
}

// Bounds: half a step plus the fp16 rounding of the scale (2^-11 relative, times
// |q| <= 127); Q4_0 clamps +8 to 7, so a full step is possible there.
TEST(GgufFiles, Stories260KQ8_0) {
  check_quantized_file("stories260K-q8_0.gguf", DType::Q8, 34, (0.5f + 127.0f / 2048) / 127);
}
TEST(GgufFiles, Stories260KQ4_0) { check_quantized_file("stories260K-q4_0.gguf", DType::Q4, 18, (1.0f + 8.0f / 2048) / 8); }

TEST(GgufFiles, LlamaTinyRandomF16) {
  const ModelSource m = read_gguf(model_path("llama-2-tiny-random.gguf"), false, nullptr);
  EXPECT_EQ(m.config.dim, 8);
  EXPECT_EQ(m.config.hidden_dim, 32);
  EXPECT_EQ(m.config.n_layers, 1);
  EXPECT_EQ(m.config.n_heads, 2);
  EXPECT_EQ(m.config.n_kv_heads, 2);
  EXPECT_EQ(m.config.head_dim, 4);
  EXPECT_EQ(m.config.vocab_size, 32000);
  EXPECT_EQ(m.config.seq_len, 4096);
  EXPECT_EQ(m.vocab.tokens.size(), 32000u);
  EXPECT_EQ(m.vocab.bos, 1);
  EXPECT_EQ(m.vocab.eos, 2);
  EXPECT_EQ(m.tensors.size(), 12u);
  EXPECT_EQ(tensor(m, "token_embd.weight").dtype, DType::F16);
  EXPECT_EQ(tensor(m, "token_embd.weight").shape, (std::vector<int64_t>{32000, 8}));
  EXPECT_EQ(tensor(m, "output.weight").shape, (std::vector<int64_t>{32000, 8}));
  EXPECT_EQ(tensor(m, "blk.0.attn_q.weight").dtype, DType::F16);
  EXPECT_EQ(tensor(m, "blk.0.ffn_down.weight").shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(tensor(m, "blk.0.attn_norm.weight").dtype, DType::F32);
  EXPECT_EQ(tensor(m, "blk.0.attn_q.weight").nbytes, 8u * 8 * 2);
}

TEST(GgufFiles, VocabOnlyLlamaSpm) {
  const ModelSource m = read_gguf(model_path("ggml-vocab-llama-spm.gguf"), true, nullptr);
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_EQ(m.config.vocab_size, 32000);
  EXPECT_EQ(m.vocab.model, "llama");
  EXPECT_EQ(m.vocab.pre, "default");
  EXPECT_EQ(m.vocab.tokens.size(), 32000u);
  EXPECT_EQ(m.vocab.scores.size(), 32000u);
  EXPECT_EQ(m.vocab.types.size(), 32000u);
  EXPECT_TRUE(m.vocab.merges.empty());
  EXPECT_EQ(m.vocab.bos, 1);
  EXPECT_EQ(m.vocab.eos, 2);
  EXPECT_EQ(m.vocab.unk, 0);
  EXPECT_TRUE(m.vocab.add_bos);
  EXPECT_TRUE(m.vocab.add_space_prefix);
  // The same vocabulary as the tiny random model.
  const ModelSource r = read_gguf(model_path("llama-2-tiny-random.gguf"), true, nullptr);
  EXPECT_EQ(r.vocab.tokens, m.vocab.tokens);
  EXPECT_EQ(r.vocab.scores, m.vocab.scores);
  EXPECT_TRUE(r.tensors.empty());
  // Without vocab_only the file has no weights: the model builder finds none.
  EXPECT_EQ(status_of([&] { Model::load(model_path("ggml-vocab-llama-spm.gguf"), LoadOptions()); }), LLM_ERR_FORMAT);
}

TEST(GgufFiles, VocabOnlyGpt2) {
  const ModelSource m = read_gguf(model_path("ggml-vocab-gpt-2.gguf"), true, nullptr);
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_EQ(m.config.arch, "gpt2");
  EXPECT_EQ(m.config.vocab_size, 50257);
  EXPECT_EQ(m.vocab.model, "gpt2");
  EXPECT_EQ(m.vocab.pre, "gpt-2");
  EXPECT_EQ(m.vocab.tokens.size(), 50257u);
  EXPECT_TRUE(m.vocab.scores.empty());
  ASSERT_EQ(m.vocab.merges.size(), 50000u);
  EXPECT_EQ(m.vocab.merges[0], "\xc4\xa0 t");  // "Ġ t"
  EXPECT_EQ(m.vocab.bos, 50256);
  EXPECT_EQ(m.vocab.eos, 50256);
  EXPECT_FALSE(m.vocab.add_bos);
  EXPECT_FALSE(m.vocab.add_space_prefix);
  // Not a llama model.
  EXPECT_EQ(status_of([&] { read_gguf(model_path("ggml-vocab-gpt-2.gguf"), false, nullptr); }), LLM_ERR_UNSUPPORTED);
}

TEST(GgufFiles, ParseKeepsRawTensorInfo) {
  const std::vector<uint8_t> b = read_all(model_path("ggml-quant-vectors.gguf"));
  const GgufFile g = parse_gguf(b.data(), b.size());
  EXPECT_EQ(g.version, 3u);
  EXPECT_EQ(g.alignment, 32u);
  ASSERT_EQ(g.tensors.size(), 27u);
  EXPECT_EQ(g.tensors[0].name, "source.f32");
  EXPECT_EQ(g.tensors[0].ne, (std::vector<int64_t>{256, 129}));
  ASSERT_NE(g.get("general.architecture"), nullptr);
  EXPECT_EQ(g.get("general.architecture")->s, "quant-test-vectors");
  for (const auto& t : g.tensors) {
    EXPECT_EQ(t.nbytes, ggml_type_size(t.type, 256 * 129)) << t.name;
    EXPECT_NE(t.data, nullptr);
  }
  EXPECT_EQ(ggml_type_size(GgmlType::Q6_K, 256), 210u);
  EXPECT_EQ(ggml_type_size(GgmlType::Q4_0, 33), 0u);
  EXPECT_STREQ(ggml_type_name(GgmlType::Q4_K), "q4_K");
}

// ---------------------------------------------------------------------------
// Hostile input.

// Every prefix of a file that cuts into metadata or tensor data is rejected
// with LLM_ERR_FORMAT (never a crash, never another status).
void check_truncations(const std::vector<uint8_t>& full, bool vocab_only, size_t stride_after_header) {
  const GgufFile g = parse_gguf(full.data(), full.size(), vocab_only);
  size_t needed = full.size();  // vocab-only files end at the metadata
  size_t header_end = full.size();
  if (!g.tensors.empty()) {
    needed = 0;
    header_end = size_t(g.tensors[0].data - full.data() - g.tensors[0].offset);
    for (const auto& t : g.tensors) needed = std::max(needed, size_t(t.data - full.data()) + t.nbytes);
  }
  std::vector<size_t> cuts;
  for (size_t c = 0; c < std::min(header_end, size_t(4096)); ++c) cuts.push_back(c);
  for (size_t c = 4096; c < needed; c += stride_after_header) cuts.push_back(c);
  cuts.push_back(needed - 1);
  for (size_t c : cuts) {
    // Copy into an exact-size buffer so any overread is caught by ASan.
    std::vector<uint8_t> cut(full.begin(), full.begin() + ptrdiff_t(c));
    const llm_status s = status_of([&] { parse_gguf(cut.data(), cut.size(), false); });
    ASSERT_EQ(s, LLM_ERR_FORMAT) << "cut at " << c << " of " << full.size();
  }
}

TEST(GgufHostile, TruncatedModelFiles) {
  check_truncations(read_all(model_path("stories260K-q4_0.gguf")), false, 211);
  check_truncations(read_all(model_path("llama-2-tiny-random.gguf")), false, 15013);
}

TEST(GgufHostile, TruncatedVocabOnlyFile) {
  check_truncations(read_all(model_path("ggml-vocab-llama-spm.gguf")), true, 5003);
}

// A vocab-only read tolerates a missing data section; a full read does not.
TEST(GgufHostile, VocabOnlyWithoutData) {
  std::vector<uint8_t> b = read_all(model_path("stories260K.gguf"));
  b.resize(20000);  // metadata + tensor infos end at 14152
  EXPECT_EQ(status_of([&] { parse_gguf(b.data(), b.size(), false); }), LLM_ERR_FORMAT);
  const ModelSource m = load_bytes(b, true);
  EXPECT_EQ(m.vocab.tokens.size(), 512u);
  EXPECT_TRUE(m.tensors.empty());
  b.resize(14000);  // inside the tensor infos: still an error
  EXPECT_EQ(status_of([&] { parse_gguf(b.data(), b.size(), true); }), LLM_ERR_FORMAT);
}

std::vector<uint8_t> header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F'};
  auto put = [&](const void* p, size_t n) { b.insert(b.end(), (const uint8_t*)p, (const uint8_t*)p + n); };
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv, 8);
  b.resize(b.size() + 64, 0);
  return b;
}

TEST(GgufHostile, AbsurdCountsFailFast) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t n : {uint64_t(1) << 62, ~uint64_t(0), uint64_t(1000000)}) {
    auto a = header(3, n, 0);
    EXPECT_EQ(status_of([&] { parse_gguf(a.data(), a.size()); }), LLM_ERR_FORMAT) << n;
    auto b = header(3, 0, n);
    EXPECT_EQ(status_of([&] { parse_gguf(b.data(), b.size()); }), LLM_ERR_FORMAT) << n;
  }
  // An array claiming 2^40 elements and a string claiming 2^63 bytes.
  GgufBuilder arr;
  arr.kv_strs("x", {});
  std::vector<uint8_t> f = arr.build();
  const uint64_t big = uint64_t(1) << 40;
  std::memcpy(f.data() + f.size() - 8, &big, 8);
  f.resize(f.size() + 100, 0);
  EXPECT_EQ(status_of([&] { parse_gguf(f.data(), f.size()); }), LLM_ERR_FORMAT);
  GgufBuilder str;
  str.kv_str("y", "");
  std::vector<uint8_t> s = str.build();
  const uint64_t huge = uint64_t(1) << 63;
  std::memcpy(s.data() + s.size() - 8, &huge, 8);
  EXPECT_EQ(status_of([&] { parse_gguf(s.data(), s.size()); }), LLM_ERR_FORMAT);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.0);
}

TEST(GgufHostile, BadHeaders) {
  auto ok = header(3, 0, 0);
  EXPECT_EQ(status_of([&] { parse_gguf(ok.data(), ok.size()); }), LLM_OK);
  auto v2 = header(2, 0, 0);
  EXPECT_EQ(status_of([&] { parse_gguf(v2.data(), v2.size()); }), LLM_OK);
  auto v1 = header(1, 0, 0);
  EXPECT_EQ(status_of([&] { parse_gguf(v1.data(), v1.size()); }), LLM_ERR_UNSUPPORTED);
  auto v9 = header(0x03000000, 0, 0);  // a big-endian v3 file
  EXPECT_EQ(status_of([&] { parse_gguf(v9.data(), v9.size()); }), LLM_ERR_FORMAT);
  auto magic = header(3, 0, 0);
  magic[0] = 'X';
  EXPECT_EQ(status_of([&] { parse_gguf(magic.data(), magic.size()); }), LLM_ERR_FORMAT);
  EXPECT_EQ(status_of([&] { parse_gguf(nullptr, 0); }), LLM_ERR_FORMAT);
}

// Tensor info checks, each reached with a one-tensor file.
llm_status one_tensor(std::vector<int64_t> ne, uint32_t type, uint64_t offset_delta, size_t data_bytes,
                      uint32_t alignment_kv = 0) {
  GgufBuilder b;
  if (alignment_kv) b.kv_u32("general.alignment", alignment_kv);
  b.tensor("t", ne, GgmlType(type), std::vector<uint8_t>(data_bytes, 0));
  std::vector<uint8_t> f = b.build(alignment_kv ? alignment_kv : 32);
  if (offset_delta) {
    // The offset is the last u64 of the (single) tensor info, right before the padding.
    const size_t info_end = 4 + 4 + 8 + 8 + (alignment_kv ? 8 + 17 + 4 + 4 : 0) + 8 + 1 + 4 + 8 * ne.size() + 4 + 8;
    uint64_t off;
    std::memcpy(&off, f.data() + info_end - 8, 8);
    off += offset_delta;
    std::memcpy(f.data() + info_end - 8, &off, 8);
  }
  return status_of([&] { parse_gguf(f.data(), f.size()); });
}

TEST(GgufHostile, TensorInfoValidation) {
  EXPECT_EQ(one_tensor({32, 2}, 0, 0, 256), LLM_OK);
  EXPECT_EQ(one_tensor({32, 0}, 0, 0, 0), LLM_ERR_FORMAT);               // zero dim
  EXPECT_EQ(one_tensor({1, 1, 1, 1, 1}, 0, 0, 4), LLM_ERR_FORMAT);       // 5 dims
  EXPECT_EQ(one_tensor({int64_t(1) << 40, int64_t(1) << 40}, 0, 0, 4), LLM_ERR_FORMAT);  // overflow
  EXPECT_EQ(one_tensor({16}, uint32_t(GgmlType::Q4_0), 0, 18), LLM_ERR_FORMAT);  // row not a block multiple
  EXPECT_EQ(one_tensor({32}, 99, 0, 18), LLM_ERR_UNSUPPORTED);                   // unknown type
  EXPECT_EQ(one_tensor({32}, 0, 4, 128), LLM_ERR_FORMAT);                        // misaligned offset
  EXPECT_EQ(one_tensor({32}, 0, 32, 128), LLM_ERR_FORMAT);                       // data past the end
  EXPECT_EQ(one_tensor({32}, 0, uint64_t(-32), 128), LLM_ERR_FORMAT);            // offset wraps
  EXPECT_EQ(one_tensor({32}, 0, 0, 128, 64), LLM_OK);
  EXPECT_EQ(one_tensor({32}, 0, 0, 128, 48), LLM_ERR_FORMAT);  // alignment not a power of two
}

TEST(GgufHostile, RandomByteFlipsNeverCrash) {
  const std::vector<uint8_t> orig = read_all(model_path("stories260K-q8_0.gguf"));
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  int failures = 0;
  for (int it = 0; it < 300; ++it) {
    std::vector<uint8_t> b = orig;
    for (int k = 0; k < 4; ++k) b[next() % 14200] ^= uint8_t(1u << (next() % 8));  // hit the metadata
    const llm_status s = status_of([&] { load_bytes(b); });
    EXPECT_TRUE(s == LLM_OK || s == LLM_ERR_FORMAT || s == LLM_ERR_UNSUPPORTED) << s;
    failures += s != LLM_OK;
  }
  EXPECT_GT(failures, 0);
}

// ---------------------------------------------------------------------------
// gguf_to_model_source on synthetic llamas.

TEST(GgufModel, TinyLlamaSynthetic) {
  TinyLlama tl;
  const ModelSource m = load_bytes(tl.build());
  EXPECT_EQ(m.config.dim, 32);
  EXPECT_EQ(m.config.n_heads, 2);
  EXPECT_EQ(m.config.n_kv_heads, 1);
  EXPECT_EQ(m.config.head_dim, 16);
  EXPECT_EQ(m.config.seq_len, 2048);  // absent: default
  EXPECT_FLOAT_EQ(m.config.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(m.config.norm_eps, 1e-6f);
  EXPECT_FALSE(m.vocab.add_bos);
  EXPECT_TRUE(m.vocab.add_space_prefix);  // default for an SPM vocabulary
  EXPECT_EQ(m.vocab.pad, 3);
  EXPECT_EQ(m.find("output.weight"), nullptr);  // tied
  // A special id past the vocabulary is dropped with a warning, as llama.cpp does.
  tl.pad_id = 4;
  int warnings = 0;
  Logger log;
  log.fn = [](llm_log_level, const char*, void* user) { ++*static_cast<int*>(user); };
  log.user = &warnings;
  EXPECT_EQ(load_bytes(tl.build(), false, &log).vocab.pad, -1);
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(m.tensors.size(), 2u + 2 * 9);
  EXPECT_EQ(tensor(m, "blk.1.attn_k.weight").shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(tensor(m, "blk.1.ffn_down.weight").shape, (std::vector<int64_t>{32, 64}));
}

// The tensors are checked against the family's spec when the model is built.
std::string build_error(std::vector<uint8_t> bytes, llm_status* st) {
  try {
    LoadOptions o;
    o.n_threads = 1;
    o.huge_pages = false;
    Model::from_source(load_bytes(std::move(bytes)), o);
    *st = LLM_OK;
    return "";
  } catch (const Error& e) {
    *st = e.status();
    return e.what();
  }
}

TEST(GgufModel, MissingOrMisshapedTensors) {
  for (const char* name : {"token_embd.weight", "output_norm.weight", "blk.1.attn_v.weight", "blk.0.ffn_norm.weight",
                           "blk.1.ffn_down.weight"}) {
    llm_status st;
    TinyLlama a;
    a.skip = name;
    EXPECT_NE(build_error(a.build(), &st).find(name), std::string::npos);
    EXPECT_EQ(st, LLM_ERR_FORMAT) << name;
    TinyLlama b;
    b.bad_shape = name;
    EXPECT_NE(build_error(b.build(), &st).find(name), std::string::npos);
    EXPECT_EQ(st, LLM_ERR_FORMAT) << name;
  }
  TinyLlama c;
  c.arch = "falcon";
  EXPECT_EQ(status_of([&] { load_bytes(c.build()); }), LLM_ERR_UNSUPPORTED);
  try {
    load_bytes(c.build());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'falcon'"), std::string::npos) << e.what();
  }
  llm_status st;
  EXPECT_EQ(build_error(TinyLlama().build(), &st), "");
  EXPECT_EQ(st, LLM_OK);
}

// A tensor that would change the math and that the spec does not use is
// refused, never ignored; bad values of the new metadata are format errors
// naming the key or tensor.
TEST(GgufModel, FamilyMetadataAndTensorsAreCheckedNotIgnored) {
  auto f32_tensor = [](GgufBuilder& b, const std::string& name, std::vector<float> v) {
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    b.tensor(name, {int64_t(v.size())}, GgmlType::F32, bytes);
  };
  struct Case {
    const char* what;
    std::function<void(GgufBuilder&)> extra;
    llm_status want;
    const char* named;
  };
  const std::vector<float> factors(8, 1.5f);  // head_dim 16 -> 8 pairs
  std::vector<float> nan_factors = factors;
  nan_factors[3] = std::nanf("");
  const Case cases[] = {
      {"unused norm", [&](GgufBuilder& b) { f32_tensor(b, "blk.0.attn_q_norm.weight", std::vector<float>(16, 1)); },
       LLM_ERR_UNSUPPORTED, "blk.0.attn_q_norm.weight"},
      {"unknown tensor", [&](GgufBuilder& b) { f32_tensor(b, "blk.1.attn_rot_embd", std::vector<float>(16, 1)); },
       LLM_ERR_UNSUPPORTED, "blk.1.attn_rot_embd"},
      {"LongRoPE without short factors", [&](GgufBuilder& b) { f32_tensor(b, "rope_factors_long.weight", factors); },
       LLM_ERR_FORMAT, "rope_factors_short.weight"},
      {"LongRoPE",
       [&](GgufBuilder& b) {
         f32_tensor(b, "rope_factors_long.weight", factors);
         f32_tensor(b, "rope_factors_short.weight", factors);
         b.kv_u32("llama.rope.scaling.original_context_length", 64);
         b.kv_f32("llama.rope.scaling.attn_factor", 1.2f);
       },
       LLM_OK, ""},
      {"NaN LongRoPE factor",
       [&](GgufBuilder& b) {
         f32_tensor(b, "rope_factors_long.weight", factors);
         f32_tensor(b, "rope_factors_short.weight", nan_factors);
       },
       LLM_ERR_FORMAT, "rope_factors_short.weight"},
      {"LongRoPE and Llama 3 factors",
       [&](GgufBuilder& b) {
         f32_tensor(b, "rope_factors_long.weight", factors);
         f32_tensor(b, "rope_factors_short.weight", factors);
         f32_tensor(b, "rope_freqs.weight", factors);
       },
       LLM_ERR_FORMAT, "rope_freqs.weight"},
      {"NaN attention factor", [&](GgufBuilder& b) { b.kv_f32("llama.rope.scaling.attn_factor", std::nanf("")); },
       LLM_ERR_FORMAT, "rope.scaling.attn_factor"},
      {"NaN RoPE factor", [&](GgufBuilder& b) { f32_tensor(b, "rope_freqs.weight", nan_factors); }, LLM_ERR_FORMAT,
       "rope_freqs.weight"},
      {"short RoPE factors", [&](GgufBuilder& b) { f32_tensor(b, "rope_freqs.weight", {1.f, 2.f}); }, LLM_ERR_FORMAT,
       "rope_freqs.weight"},
      {"good RoPE factors", [&](GgufBuilder& b) { f32_tensor(b, "rope_freqs.weight", factors); }, LLM_OK, ""},
      {"window 0", [&](GgufBuilder& b) { b.kv_u32("llama.attention.sliding_window", 0); }, LLM_ERR_FORMAT,
       "sliding_window"},
      {"window 8", [&](GgufBuilder& b) { b.kv_u32("llama.attention.sliding_window", 8); }, LLM_OK, ""},
      {"YaRN",
       [&](GgufBuilder& b) {
         b.kv_str("llama.rope.scaling.type", "yarn");
         b.kv_f32("llama.rope.scaling.factor", 4.0f);
         b.kv_u32("llama.rope.scaling.original_context_length", 512);
       },
       LLM_OK, ""},
      {"dynamic RoPE scaling", [&](GgufBuilder& b) { b.kv_str("llama.rope.scaling.type", "dynamic"); },
       LLM_ERR_UNSUPPORTED, "rope.scaling.type"},
      {"YaRN log multiplier",
       [&](GgufBuilder& b) {
         b.kv_str("llama.rope.scaling.type", "yarn");
         b.kv_f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
       },
       LLM_ERR_UNSUPPORTED, "yarn_log_multiplier"},
      {"YaRN betas crossed",
       [&](GgufBuilder& b) {
         b.kv_str("llama.rope.scaling.type", "yarn");
         b.kv_f32("llama.rope.scaling.yarn_beta_fast", 0.5f);
       },
       LLM_ERR_FORMAT, "yarn_beta_fast"},
      {"negative RoPE scaling factor", [&](GgufBuilder& b) { b.kv_f32("llama.rope.scaling.factor", -2.0f); },
       LLM_ERR_FORMAT, "rope.scaling.factor"},
      {"original context 0", [&](GgufBuilder& b) { b.kv_u32("llama.rope.scaling.original_context_length", 0); },
       LLM_ERR_FORMAT, "original_context_length"},
      {"odd rotary dims", [&](GgufBuilder& b) { b.kv_u32("llama.rope.dimension_count", 7); }, LLM_ERR_FORMAT,
       "rope.dimension_count"},
      {"rotary dims > head_dim", [&](GgufBuilder& b) { b.kv_u32("llama.rope.dimension_count", 18); },
       LLM_ERR_FORMAT, "rope.dimension_count"},
      {"bias of the wrong size", [&](GgufBuilder& b) { f32_tensor(b, "blk.0.attn_q.bias", {1.f, 2.f}); },
       LLM_ERR_FORMAT, "blk.0.attn_q.bias"},
      {"bias", [&](GgufBuilder& b) { f32_tensor(b, "blk.0.attn_q.bias", std::vector<float>(32, 0.5f)); }, LLM_OK,
       ""},
  };
  for (const Case& k : cases) {
    TinyLlama t;
    t.extra = k.extra;
    llm_status st = LLM_OK;
    std::string msg;
    try {
      msg = build_error(t.build(), &st);
    } catch (...) {
      ADD_FAILURE() << k.what << ": not an llm::Error";
    }
    EXPECT_EQ(st, k.want) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.named), std::string::npos) << k.what << ": " << msg;
  }
  // Query heads that are not a multiple of the KV heads: a format error naming the key.
  TinyLlama h;
  h.heads = 4;
  h.kv_heads = 3;
  try {
    load_bytes(h.build());
    ADD_FAILURE() << "4 heads over 3 KV heads loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("head_count_kv"), std::string::npos) << e.what();
  }
}

TEST(GgufModel, QuantizedMatricesKeptZeroCopy) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::BF16}) {
    TinyLlama tl;
    tl.matrix_type = t;
    const ModelSource m = load_bytes(tl.build());
    const TensorData& q = tensor(m, "blk.0.attn_q.weight");
    EXPECT_EQ(q.owned, nullptr);
    EXPECT_EQ(q.nbytes, ggml_type_size(t, 32 * 32));
    const DType want = t == GgmlType::Q8_0 ? DType::Q8 : t == GgmlType::Q4_0 ? DType::Q4
                       : t == GgmlType::Q4_1 ? DType::Q4M : t == GgmlType::F16 ? DType::F16 : DType::BF16;
    EXPECT_EQ(q.dtype, want);
    EXPECT_EQ(q.group, dtype_is_quantized(want) ? 32u : 0u);
  }
}

// The GGUF block types are kept as stored (zero copy, no warning): their
// rows decode to ggml's own floats bit for bit. (Before they were run
// natively, they were decoded and re-encoded to q8 / q4.)
TEST(GgufModel, BlockTypesAreKeptAsStored) {
  const std::vector<uint8_t> vec = read_all(model_path("ggml-quant-vectors.gguf"));
  const GgufFile vg = parse_gguf(vec.data(), vec.size());
  auto find = [&](const std::string& name) -> const GgufTensorInfo& {
    for (const auto& t : vg.tensors)
      if (t.name == name) return t;
    throw std::runtime_error("missing " + name);
  };
  struct Case {
    const char* name;
    GgmlType type;
    DType want;
  };
  const Case cases[] = {
      {"iq4_nl", GgmlType::IQ4_NL, DType::IQ4_NL},
      {"q5_0", GgmlType::Q5_0, DType::Q5_0},   {"q5_1", GgmlType::Q5_1, DType::Q5_1},
      {"q2_K", GgmlType::Q2_K, DType::Q2_K},   {"q3_K", GgmlType::Q3_K, DType::Q3_K},
      {"q4_K", GgmlType::Q4_K, DType::Q4_K},   {"q5_K", GgmlType::Q5_K, DType::Q5_K},
      {"q6_K", GgmlType::Q6_K, DType::Q6_K},
  };
  for (const Case& c : cases) {
    const GgufTensorInfo& q = find(std::string("q.") + c.name);
    const GgufTensorInfo& deq = find(std::string("deq.") + c.name);
    ASSERT_EQ(q.type, c.type);
    TinyLlama tl;
    tl.dim = 256;
    tl.hid = 256;
    tl.heads = 2;
    tl.kv_heads = 2;
    tl.layers = 1;
    tl.matrix_type = c.type;
    tl.row_source = q.data;
    tl.source_rows = 129;
    int warnings = 0;
    Logger log;
    log.fn = [](llm_log_level level, const char*, void* user) {
      if (level == LLM_LOG_WARN) ++*static_cast<int*>(user);
    };
    log.user = &warnings;
    const ModelSource m = load_bytes(tl.build(), false, &log);
    EXPECT_EQ(warnings, 0) << c.name;
    const TensorData& t = tensor(m, "blk.0.ffn_up.weight");
    ASSERT_EQ(t.dtype, c.want) << c.name;
    EXPECT_EQ(t.group, uint32_t(ggml_block_values(c.want)));
    EXPECT_EQ(t.shape, (std::vector<int64_t>{256, 256}));
    EXPECT_EQ(t.owned, nullptr);  // zero copy
    const size_t rb = dtype_row_bytes(t.dtype, 256, t.group);
    ASSERT_EQ(rb, ggml_type_size(c.type, 256));
    ASSERT_EQ(t.nbytes, 256 * rb);
    // Row r is source row r % 129: the same bytes, and the same floats as ggml's.
    const float* ref = reinterpret_cast<const float*>(deq.data);
    std::vector<float> row(256);
    for (int64_t r = 0; r < 256; ++r) {
      ASSERT_EQ(std::memcmp(t.data + size_t(r) * rb, q.data + size_t(r % 129) * rb, rb), 0) << c.name << " row " << r;
      dequantize_row(t.dtype, t.group, t.data + size_t(r) * rb, row.data(), 256);
      ASSERT_EQ(std::memcmp(row.data(), ref + (r % 129) * 256, 256 * 4), 0) << c.name << " row " << r;
    }
  }
  // IQ4_XS (not in the vectors file; its decoder has GgmlQuants.Iq4XsBlocks).
  TinyLlama tl;
  tl.dim = 256;
  tl.hid = 256;
  tl.heads = 2;
  tl.kv_heads = 2;
  tl.layers = 1;
  tl.matrix_type = GgmlType::IQ4_XS;
  const ModelSource m = load_bytes(tl.build());
  const TensorData& t = tensor(m, "blk.0.ffn_up.weight");
  EXPECT_EQ(t.dtype, DType::IQ4_XS);
  EXPECT_EQ(t.group, 256u);
  EXPECT_EQ(t.owned, nullptr);
  EXPECT_EQ(t.nbytes, 256u * 136u);
}

// A row that is not a whole number of blocks is a format error naming the
// tensor, never a crash; so is a 256-block type on rows of 32.
TEST(GgufModel, BlockTypeRowsMustBeWholeBlocks) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::Q5_0}) {
    TinyLlama tl;
    tl.dim = t == GgmlType::Q5_0 ? 48 : 32;
    tl.hid = 64;
    tl.heads = 1;
    tl.kv_heads = 1;
    tl.matrix_type = t;
    std::string msg;
    const llm_status s = status_of([&] { load_bytes(tl.build()); }, &msg);
    EXPECT_EQ(s, LLM_ERR_FORMAT) << ggml_type_name(t) << ": " << msg;
    EXPECT_NE(msg.find("not a multiple"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace llm
