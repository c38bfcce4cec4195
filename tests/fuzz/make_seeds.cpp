// llm_fuzz_make_seeds OUT_DIR: writes the seed corpus of every fuzz target
// into OUT_DIR/<target>/, made at build/test time from the shared test
// models (nothing big is committed). Small synthetic models (dim 32, one
// layer, the 512-token stories vocabulary) keep each fuzz iteration fast;
// one real file per format keeps the deep paths reachable.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "llm.h"
#include "quant/quant.h"
#include "convert/llm_file_writer.h"

namespace {

using Bytes = std::vector<uint8_t>;

std::string g_out;
std::string g_models;
int g_written = 0;

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) llm::fail(LLM_ERR_IO, "cannot read %s", path.c_str());
  return Bytes(std::istreambuf_iterator<char>(f), {});
}

void write_seed(const std::string& target, const std::string& name, const Bytes& prefix, const Bytes& body) {
  const std::string dir = g_out + "/" + target;
  ::mkdir(g_out.c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(prefix.data()), std::streamsize(prefix.size()));
  f.write(reinterpret_cast<const char*>(body.data()), std::streamsize(body.size()));
  if (!f) llm::fail(LLM_ERR_IO, "cannot write seed %s/%s", dir.c_str(), name.c_str());
  ++g_written;
}

template <typename T>
void put(Bytes& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

// ---------------------------------------------------------------- tiny model

struct Tiny {
  int32_t dim = 32, hidden = 64, layers = 1, heads = 4, kv_heads = 2, seq_len = 64;
  llm::VocabData vocab;
};

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 0.1f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// The llama tensors of a tiny model, as (name, shape outermost first, is_matrix).
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<Spec> tiny_specs(const Tiny& t, bool with_output) {
  const int64_t V = int64_t(t.vocab.tokens.size()), hd = t.dim / t.heads;
  std::vector<Spec> s = {{"token_embd.weight", {V, t.dim}}, {"output_norm.weight", {t.dim}}};
  if (with_output) s.push_back({"output.weight", {V, t.dim}});
  for (int l = 0; l < t.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    s.push_back({b + "attn_norm.weight", {t.dim}});
    s.push_back({b + "attn_q.weight", {t.heads * hd, t.dim}});
    s.push_back({b + "attn_k.weight", {t.kv_heads * hd, t.dim}});
    s.push_back({b + "attn_v.weight", {t.kv_heads * hd, t.dim}});
    s.push_back({b + "attn_output.weight", {t.dim, t.heads * hd}});
    s.push_back({b + "ffn_norm.weight", {t.dim}});
    s.push_back({b + "ffn_gate.weight", {t.hidden, t.dim}});
    s.push_back({b + "ffn_up.weight", {t.hidden, t.dim}});
    s.push_back({b + "ffn_down.weight", {t.dim, t.hidden}});
  }
  return s;
}

Bytes encode_rows(llm::DType dt, uint32_t group, const std::vector<float>& v, int64_t rows, int64_t cols) {
  const size_t rb = llm::dtype_row_bytes(dt, cols, group);
  Bytes out(rb * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) llm::quantize_row(dt, group, v.data() + r * cols, out.data() + r * rb, cols);
  return out;
}

// A ModelSource of the tiny model with matrices in `dt` (norms f32).
llm::ModelSource tiny_source(const Tiny& t, llm::DType dt, uint32_t group, bool with_output) {
  llm::ModelSource src;
  llm::ModelConfig& c = src.config;
  c.dim = t.dim;
  c.hidden_dim = t.hidden;
  c.n_layers = t.layers;
  c.n_heads = t.heads;
  c.n_kv_heads = t.kv_heads;
  c.head_dim = t.dim / t.heads;
  c.vocab_size = int32_t(t.vocab.tokens.size());
  c.seq_len = t.seq_len;
  src.vocab = t.vocab;
  uint32_t seed = 1;
  for (const Spec& s : tiny_specs(t, with_output)) {
    llm::TensorData td;
    td.name = s.name;
    td.shape = s.shape;
    const bool matrix = s.shape.size() == 2;
    const int64_t rows = matrix ? s.shape[0] : 1, cols = s.shape.back();
    std::vector<float> v = random_floats(size_t(rows * cols), seed++, matrix ? 0.2f : 1.0f);
    if (!matrix)
      for (auto& x : v) x = 1.0f + 0.1f * x;
    td.dtype = matrix ? dt : llm::DType::F32;
    td.group = matrix && llm::dtype_is_quantized(dt) ? group : 0;
    if (llm::dtype_row_bytes(td.dtype, cols, td.group) == 0) {  // q4 g64 on 32-wide rows: f16 instead
      td.dtype = llm::DType::F16;
      td.group = 0;
    }
    td.owned = std::make_shared<Bytes>(encode_rows(td.dtype, td.group, v, rows, cols));
    td.data = td.owned->data();
    td.nbytes = td.owned->size();
    src.tensors.push_back(std::move(td));
  }
  return src;
}

// ---------------------------------------------------------------- GGUF writer

class GgufWriter {
 public:
  void u32(const std::string& k, uint32_t v) { key(k, 4); put(kv_, v); }
  void f32(const std::string& k, float v) { key(k, 6); put(kv_, v); }
  void boolean(const std::string& k, bool v) { key(k, 7); put(kv_, uint8_t(v)); }
  void str(const std::string& k, const std::string& v) { key(k, 8); string(kv_, v); }
  void strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    put(kv_, uint32_t(8));
    put(kv_, uint64_t(v.size()));
    for (const auto& s : v) string(kv_, s);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    key(k, 9);
    put(kv_, uint32_t(6));
    put(kv_, uint64_t(v.size()));
    for (float x : v) put(kv_, x);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9);
    put(kv_, uint32_t(5));
    put(kv_, uint64_t(v.size()));
    for (int32_t x : v) put(kv_, x);
  }
  // shape outermost first (written innermost first, as ggml does)
  void tensor(const std::string& name, const std::vector<int64_t>& shape, uint32_t type, Bytes data) {
    tensors_.push_back(T{name, shape, type, std::move(data)});
  }
  void vocab(const llm::VocabData& v) {
    str("tokenizer.ggml.model", v.model);
    if (v.model == "gpt2") str("tokenizer.ggml.pre", v.pre);
    strs("tokenizer.ggml.tokens", v.tokens);
    if (!v.scores.empty()) f32s("tokenizer.ggml.scores", v.scores);
    if (!v.types.empty()) i32s("tokenizer.ggml.token_type", v.types);
    if (!v.merges.empty()) strs("tokenizer.ggml.merges", v.merges);
    if (v.bos >= 0) u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
    if (v.eos >= 0) u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
    if (v.unk >= 0) u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk));
  }
  Bytes build() const {
    Bytes b = {'G', 'G', 'U', 'F'};
    put(b, uint32_t(3));
    put(b, uint64_t(tensors_.size()));
    put(b, uint64_t(n_kv_));
    b.insert(b.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    for (const T& t : tensors_) {
      string(b, t.name);
      put(b, uint32_t(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put(b, uint64_t(*it));
      put(b, t.type);
      put(b, off);
      off += (t.data.size() + 31) / 32 * 32;
    }
    if (tensors_.empty()) return b;  // vocab-only files end after the metadata
    while (b.size() % 32) b.push_back(0);
    for (const T& t : tensors_) {
      b.insert(b.end(), t.data.begin(), t.data.end());
      while (b.size() % 32) b.push_back(0);
    }
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    Bytes data;
  };
  static void string(Bytes& b, const std::string& s) {
    put(b, uint64_t(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    string(kv_, k);
    put(kv_, type);
    ++n_kv_;
  }
  Bytes kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

enum Ggml : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10,
                       Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, BF16 = 30 };

// The tiny model as GGUF with matrices of ggml type `mt`. Native types are
// encoded properly; the others get random block bytes (any bytes are a valid
// block; f16 scales may come out as Inf/NaN, which is the point).
Bytes tiny_gguf(const Tiny& t, uint32_t mt, bool with_output) {
  GgufWriter w;
  w.str("general.architecture", "llama");
  w.str("general.name", "fuzz-seed-tiny");
  w.u32("llama.embedding_length", uint32_t(t.dim));
  w.u32("llama.feed_forward_length", uint32_t(t.hidden));
  w.u32("llama.block_count", uint32_t(t.layers));
  w.u32("llama.attention.head_count", uint32_t(t.heads));
  w.u32("llama.attention.head_count_kv", uint32_t(t.kv_heads));
  w.u32("llama.context_length", uint32_t(t.seq_len));
  w.u32("llama.rope.dimension_count", uint32_t(t.dim / t.heads));
  w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.f32("llama.rope.freq_base", 10000.0f);
  w.vocab(t.vocab);
  uint32_t seed = 100;
  for (const Spec& s : tiny_specs(t, with_output)) {
    const bool matrix = s.shape.size() == 2;
    const int64_t rows = matrix ? s.shape[0] : 1, cols = s.shape.back();
    std::vector<float> v = random_floats(size_t(rows * cols), seed++, matrix ? 0.2f : 1.0f);
    if (!matrix) {
      for (auto& x : v) x = 1.0f + 0.1f * x;
      w.tensor(s.name, s.shape, F32, encode_rows(llm::DType::F32, 0, v, rows, cols));
      continue;
    }
    uint32_t type = mt;
    if (llm::ggml_type_size(llm::GgmlType(type), cols) == 0) type = F16;  // K-quants need 256-wide rows
    Bytes data;
    switch (type) {
      case F32: data = encode_rows(llm::DType::F32, 0, v, rows, cols); break;
      case F16: data = encode_rows(llm::DType::F16, 0, v, rows, cols); break;
      case BF16: data = encode_rows(llm::DType::BF16, 0, v, rows, cols); break;
      case Q8_0: data = encode_rows(llm::DType::Q8, 32, v, rows, cols); break;
      case Q4_0: data = encode_rows(llm::DType::Q4, 32, v, rows, cols); break;
      default: {
        data.resize(llm::ggml_type_size(llm::GgmlType(type), cols) * size_t(rows));
        std::mt19937 rng(seed);
        for (auto& b : data) b = uint8_t(rng());
        // Keep block scales finite and small most of the time: f16 0x2000 ~ 0.0078.
        break;
      }
    }
    w.tensor(s.name, s.shape, type, std::move(data));
  }
  return w.build();
}

// A small byte-level BPE vocabulary cut from the real GPT-2 one: the first
// `keep` tokens and the merges that stay inside them.
llm::VocabData small_gpt2_vocab(size_t keep) {
  llm::ModelSource full = llm::read_gguf(g_models + "/ggml-vocab-gpt-2.gguf", true, nullptr);
  llm::VocabData v = full.vocab;
  std::vector<std::string> tokens(v.tokens.begin(), v.tokens.begin() + long(std::min(keep, v.tokens.size())));
  std::set<std::string> have(tokens.begin(), tokens.end());
  std::vector<std::string> merges;
  for (const auto& m : v.merges) {
    const size_t sp = m.find(' ');
    if (sp == std::string::npos) continue;
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    if (have.count(a) && have.count(b) && have.count(a + b)) merges.push_back(m);
  }
  tokens.push_back("<|endoftext|>");
  llm::VocabData out;
  out.model = "gpt2";
  out.pre = v.pre;
  out.tokens = tokens;
  out.types.assign(tokens.size(), 1);
  out.types.back() = 3;
  out.merges = merges;
  out.bos = out.eos = int32_t(tokens.size() - 1);
  out.add_bos = false;
  out.add_space_prefix = false;
  return out;
}

std::string tmp_path(const std::string& name) { return g_out + "/" + name; }

// ---------------------------------------------------------------- per target

void seeds_gguf(const Tiny& t) {
  const struct {
    const char* name;
    uint32_t type;
  } types[] = {{"f32", F32},   {"f16", F16},   {"bf16", BF16}, {"q8_0", Q8_0}, {"q4_0", Q4_0},
               {"q4_1", Q4_1}, {"q5_0", Q5_0}, {"q5_1", Q5_1}, {"q8_1", Q8_1}, {"iq4_nl", IQ4_NL}};
  for (const auto& ty : types)
    write_seed("gguf", std::string("tiny-") + ty.name + ".gguf", {0}, tiny_gguf(t, ty.type, ty.type == F16));
  // K-quants need rows of 256: a model whose FFN is 256 wide gets them in ffn_down.
  Tiny wide = t;
  wide.dim = 256;
  wide.hidden = 32;
  wide.heads = 8;
  wide.kv_heads = 4;
  wide.vocab.tokens.resize(260);  // specials + 256 byte tokens + one piece
  wide.vocab.scores.resize(260);
  wide.vocab.types.resize(260);
  for (uint32_t k : {Q3_K, Q6_K})
    write_seed("gguf", "wide-k" + std::to_string(k) + ".gguf", {0}, tiny_gguf(wide, k, false));
  // vocab-only
  GgufWriter v;
  v.str("general.architecture", "llama");
  v.vocab(t.vocab);
  write_seed("gguf", "vocab-spm.gguf", {1}, v.build());
  GgufWriter g;
  g.str("general.architecture", "gpt2");
  g.vocab(small_gpt2_vocab(600));
  write_seed("gguf", "vocab-gpt2.gguf", {1}, g.build());
  write_seed("gguf", "stories260K-q4_0.gguf", {0}, read_file(g_models + "/stories260K-q4_0.gguf"));
  // One tiny model per family (tests/data/families): the metadata keys and
  // tensors of every block spec (windows, softcaps, RoPE factors and bases,
  // biases, QK-norm, post-norms, fused projections, partial rotary, YaRN, LongRoPE).
  for (const char* family :
       {"llama", "llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2_yarn", "phi3_longrope"})
    write_seed("gguf", std::string("family-") + family + ".gguf", {0},
               read_file(std::string(LLM_TEST_DATA_DIR) + "/families/" + family + ".gguf"));
}

void seeds_llm_file(const Tiny& t) {
  const struct {
    const char* name;
    llm::DType dt;
    uint32_t group;
  } types[] = {{"f32", llm::DType::F32, 0}, {"f16", llm::DType::F16, 0}, {"bf16", llm::DType::BF16, 0},
               {"q8", llm::DType::Q8, 32},  {"q4g32", llm::DType::Q4, 32}, {"q4g64", llm::DType::Q4, 64}};
  for (const auto& ty : types) {
    llm::LlmWriteOptions raw;
    raw.allow_zstd = false;
    const std::string path = tmp_path(std::string("tiny-") + ty.name + ".llm");
    llm::write_llm(tiny_source(t, ty.dt, ty.group, ty.dt == llm::DType::F16), path, raw);
    const Bytes b = read_file(path);
    std::remove(path.c_str());
    write_seed("llm_file", std::string("tiny-") + ty.name + ".repair", {1}, b);
    if (ty.dt == llm::DType::F32) {
      write_seed("llm_file", "tiny-f32.plain", {0}, b);
      write_seed("llm_file", "tiny-f32.vocab", {3}, b);
      write_seed("llm_file", "tiny-f32.inspect", {5}, b);
    }
  }
  // zstd chunks (byte planes for f16/f32), small chunks so there are many
  llm::LlmWriteOptions z;
  z.allow_zstd = true;
  z.min_saving = 0.0;  // keep zstd wherever it saves anything
  z.chunk_bytes = 4096;
  for (const auto& ty : types) {
    if (ty.dt != llm::DType::F16 && ty.dt != llm::DType::Q8) continue;
    const std::string path = tmp_path(std::string("tiny-z-") + ty.name + ".llm");
    llm::write_llm(tiny_source(t, ty.dt, ty.group, false), path, z);
    const Bytes b = read_file(path);
    std::remove(path.c_str());
    write_seed("llm_file", std::string("tiny-zstd-") + ty.name + ".repair", {1}, b);
    write_seed("llm_file", std::string("tiny-zstd-") + ty.name + ".plain", {0}, b);
  }
  // the real model, converted from llama2.c
  const std::string path = tmp_path("stories260K.llm");
  llm::write_llm(llm::read_llama2c(g_models + "/stories260K.bin", g_models + "/tok512.bin"), path);
  write_seed("llm_file", "stories260K.repair", {1}, read_file(path));
  std::remove(path.c_str());
}

void seeds_llama2c(const Tiny& t) {
  // Checkpoints: 7 x int32 header, then float32 weights in llama2.c order.
  const struct {
    int32_t dim, hidden, layers, heads, kv_heads, vocab, seq;
  } shapes[] = {{8, 16, 1, 2, 1, 512, 4}, {8, 12, 2, 2, 2, -512, 2}, {16, 8, 1, 4, 2, 300, 8}, {4, 4, 1, 1, 1, 64, 1}};
  int k = 0;
  for (const auto& s : shapes) {
    Bytes b;
    for (int32_t v : {s.dim, s.hidden, s.layers, s.heads, s.kv_heads, s.vocab, s.seq}) put(b, v);
    const int64_t V = s.vocab < 0 ? -s.vocab : s.vocab, kv = s.dim / s.heads * s.kv_heads, hd = s.dim / s.heads;
    const int64_t n = V * s.dim + s.layers * (2 * s.dim + 2 * s.dim * s.dim + 2 * kv * s.dim + 3 * s.hidden * s.dim) +
                      s.dim + 2 * s.seq * (hd / 2) + (s.vocab < 0 ? V * s.dim : 0);
    const std::vector<float> w = random_floats(size_t(n), uint32_t(7 + k), 0.5f);
    for (float x : w) put(b, x);
    write_seed("llama2c_checkpoint", "tiny" + std::to_string(k) + ".fit", {1}, b);
    write_seed("llama2c_checkpoint", "tiny" + std::to_string(k++) + ".bin", {0}, b);
  }
  write_seed("llama2c_checkpoint", "stories260K.bin", {0}, read_file(g_models + "/stories260K.bin"));

  // Tokenizer files: u16 vocab_size, u8 text length, text, file bytes.
  const std::string text = "Once upon a time, there was a little girl named Lily. caf\xC3\xA9 \xF0\x9F\x98\x80";
  auto tok_seed = [&](const char* name, uint16_t vocab, const Bytes& file) {
    Bytes prefix;
    put(prefix, uint16_t(vocab - 1));
    prefix.push_back(uint8_t(text.size()));
    prefix.insert(prefix.end(), text.begin(), text.end());
    write_seed("llama2c_tokenizer", name, prefix, file);
  };
  const Bytes tok512 = read_file(g_models + "/tok512.bin");
  tok_seed("tok512", 512, tok512);
  tok_seed("tok512-prefix", 300, Bytes(tok512.begin(), tok512.begin() + 3000));
  const Bytes llama2 = read_file(g_models + "/llama2_tokenizer.bin");
  tok_seed("llama2-4096", 4096, Bytes(llama2.begin(), llama2.begin() + 60000));
  (void)t;
}

std::vector<std::string> vocab_test_texts(const char* file) {
  const Bytes b = read_file(g_models + "/" + file);
  const std::string all(b.begin(), b.end()), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t p; (p = all.find(sep, at)) != std::string::npos; at = p + sep.size()) out.push_back(all.substr(at, p - at));
  return out;
}

void seeds_tokenize() {
  for (const char* target : {"tokenize_spm", "tokenize_gpt2"}) {
    std::vector<std::string> texts = vocab_test_texts("ggml-vocab-llama-spm.gguf.inp");
    texts.push_back("<s>Hello</s> <|endoftext|> <unk> [INST] hi [/INST]");
    static const char kOdd[] = "\xFF\xFE\xC3\x28 \xE2\x96\x81\xE2\x96\x81x \x00 tail";
    texts.push_back(std::string(kOdd, sizeof kOdd - 1));
    int k = 0;
    for (const auto& s : texts) {
      const uint8_t flags = uint8_t(k % 4);
      write_seed(target, "text" + std::to_string(k++), {flags}, Bytes(s.begin(), s.end()));
    }
  }
}

void seeds_detokenize() {
  // Id sequences from real tokenizations (and raw ones with bad ids).
  llm_load_params p;
  llm_load_params_init(&p);
  p.flags = LLM_LOAD_VOCAB_ONLY;
  p.n_threads = 1;
  const char* files[3] = {"stories260K.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"};
  const std::vector<std::string> texts = vocab_test_texts("ggml-vocab-gpt-2.gguf.inp");
  for (int which = 0; which < 3; ++which) {
    llm_model* m = nullptr;
    if (llm_load((g_models + "/" + files[which]).c_str(), &p, &m) != LLM_OK)
      llm::fail(LLM_ERR_IO, "seed generator: cannot load %s: %s", files[which], llm_last_error());
    for (size_t k = 0; k < texts.size(); k += 5) {
      std::vector<llm_token> ids(4096);
      size_t n = 0;
      if (llm_tokenize(m, texts[k].data(), texts[k].size(), LLM_TOKENIZE_ADD_BOS, ids.data(), ids.size(), &n) != LLM_OK)
        continue;
      Bytes body;
      for (size_t i = 0; i < n; ++i) put(body, ids[i]);
      write_seed("detokenize", std::string(files[which]) + "-" + std::to_string(k), {uint8_t(which), uint8_t(k * 7)},
                 body);
    }
    Bytes bad;
    for (int32_t v : {1, 5, -1, 70000, 3, 200, 2}) put(bad, v);
    write_seed("detokenize", std::string(files[which]) + "-bad", {uint8_t(which | 4), 3}, bad);
    llm_model_free(m);
  }
}

void seeds_sessions() {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = 1;
  llm_model* m = nullptr;
  if (llm_load((g_models + "/stories260K.gguf").c_str(), &p, &m) != LLM_OK)
    llm::fail(LLM_ERR_IO, "seed generator: cannot load stories260K.gguf: %s", llm_last_error());
  const llm_token prompt[] = {1, 403, 407, 261, 378};
  int k = 0;
  auto snap = [&](llm_session* s, const char* what) {
    size_t n = 0;
    llm_session_save(s, nullptr, 0, &n);
    Bytes b(n);
    llm_session_save(s, b.data(), b.size(), &n);
    write_seed("session_restore", std::string(what) + ".repair", {1}, b);
    write_seed("session_restore", std::string(what) + ".sample", {3}, b);
    if (k++ < 2) write_seed("session_restore", std::string(what) + ".plain", {0}, b);
  };
  const struct {
    const char* name;
    llm_kv_type kv;
    uint32_t max_tokens, window, n_sink;
  } kinds[] = {{"f16", LLM_KV_F16, 0, 0, 4},
               {"f32", LLM_KV_F32, 64, 0, 4},
               {"int8", LLM_KV_INT8, 0, 0, 4},
               {"int4-window", LLM_KV_INT4, 0, 40, 4},
               // A window one page above its sinks: one eviction takes most of the sequence.
               {"f16-window", LLM_KV_F16, 0, 24, 7}};
  for (const auto& kd : kinds) {
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.kv_type = kd.kv;
    sp.max_tokens = kd.max_tokens;
    sp.window = kd.window;
    sp.n_sink = kd.n_sink;
    llm_session* s = nullptr;
    if (llm_session_create(m, &sp, &s) != LLM_OK) llm::fail(LLM_ERR_INTERNAL, "seed session: %s", llm_last_error());
    const std::string base = kd.name;
    snap(s, (base + "-empty").c_str());
    llm_prefill(s, prompt, 5);
    snap(s, (base + "-prefilled").c_str());
    llm_token t;
    for (int i = 0; i < 20; ++i) llm_decode_step(s, nullptr, &t);
    snap(s, (base + "-pending").c_str());
    llm_kv_evict(s, 1, 3);
    snap(s, (base + "-evicted").c_str());
    if (kd.window) {
      // The window full with a token pending: its forward pass evicts first
      // (found by running it on a fork). A window that never gets there is a
      // broken generator, not a seed to leave out quietly.
      bool found = false;
      for (int i = 0; i < 200 && !found; ++i) {
        llm_session* f = nullptr;
        const float* lg = nullptr;
        size_t nv = 0;
        llm_session_stats_t st;
        st.struct_size = sizeof st;
        const bool evicts = llm_session_fork(s, &f) == LLM_OK && llm_logits(f, &lg, &nv) == LLM_OK &&
                            llm_session_stats(f, &st) == LLM_OK && st.n_evicted > 0;
        llm_session_free(f);
        if (evicts) {
          snap(s, (base + "-full").c_str());
          found = true;
        } else {
          llm_decode_step(s, nullptr, &t);
        }
      }
      if (!found) llm::fail(LLM_ERR_INTERNAL, "seed session %s: the window never evicted", kd.name);
    }
    llm_session_free(s);
  }
  llm_model_free(m);

  // session_ops: op byte sequences (see fuzz_session_ops.cpp for the encoding).
  const Bytes ops[] = {
      {0x00, 0, 0, 4, 0, 0x01, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0x03, 0, 0x03, 1, 3, 200, 1, 1, 1, 5, 1, 2, 3, 4,
       0x04, 1, 2, 0x05, 0x08, 0x09, 0x13, 0, 0x03, 0},
      {0x00, 48, 60, 4, 2, 0x01, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0x01, 20,
       1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 0x03, 0, 0x03, 0, 0x07, 0x01, 3, 1, 2, 3},
      {0x00, 0, 0, 0, 3, 0x02, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 2, 1, 3, 0x0a, 0x05, 0x16, 0x04, 0, 3},
      {0x00, 0, 0, 0, 1, 0x01, 255, 7, 0x03, 0x0b, 0x13, 0, 0x03, 0},
  };
  int j = 0;
  for (const Bytes& b : ops) write_seed("session_ops", "ops" + std::to_string(j++), {}, b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR  (models from $LLM_MODELS_DIR or the build's LLM_MODELS_DIR)\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  const char* env = std::getenv("LLM_MODELS_DIR");
  g_models = env && *env ? env : LLM_MODELS_DIR;
  try {
    Tiny t;
    const Bytes tok = read_file(g_models + "/tok512.bin");
    t.vocab = llm::parse_llama2c_tokenizer(tok.data(), tok.size(), 512);
    seeds_gguf(t);
    seeds_llm_file(t);
    seeds_llama2c(t);
    seeds_tokenize();
    seeds_detokenize();
    seeds_sessions();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm_fuzz_make_seeds: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %d seeds under %s\n", g_written, g_out.c_str());
  return 0;
}
