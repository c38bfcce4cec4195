// llama2.c legacy checkpoints and tokenizer files -> ModelSource.
//
// Checkpoint (version 0, "legacy"): 7 x int32 header, then float32 arrays in
// this order (L = n_layers, kv_dim = dim * n_kv_heads / n_heads):
//   token_embedding [vocab][dim]
//   rms_att  [L][dim]          wq [L][dim][dim]      wk [L][kv_dim][dim]
//   wv [L][kv_dim][dim]        wo [L][dim][dim]      rms_ffn [L][dim]
//   w1 [L][hidden][dim]        w2 [L][dim][hidden]   w3 [L][hidden][dim]
//   rms_final [dim]            freq_cis_real [seq_len][head_dim/2]
//   freq_cis_imag [seq_len][head_dim/2]
//   wcls [vocab][dim]          only when the header's vocab_size is negative
// The tensors are exposed zero-copy: every pointer points into the mapping.
#include "format/llama2c.h"

#include <climits>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace llm {

namespace {

// Limits far beyond any real llama2.c model, low enough that every size
// computation below fits easily in 64 bits.
constexpr int32_t kMaxDim = 1 << 16;
constexpr int32_t kMaxLayers = 1 << 10;
constexpr int32_t kMaxVocab = 1 << 22;
constexpr int32_t kMaxSeqLen = 1 << 24;

struct Llama2cHeader {
  int32_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  int32_t head_dim() const { return dim / n_heads; }
  int32_t kv_dim() const { return head_dim() * n_kv_heads; }
  int32_t vocab() const { return vocab_size; }
};

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Parses and validates the header; returns an empty message when valid.
std::string parse_header(const uint8_t* data, size_t size, Llama2cHeader* h) {
  if (size < 28) return "file shorter than the 28-byte header";
  h->dim = read_i32(data + 0);
  h->hidden_dim = read_i32(data + 4);
  h->n_layers = read_i32(data + 8);
  h->n_heads = read_i32(data + 12);
  h->n_kv_heads = read_i32(data + 16);
  const int32_t v = read_i32(data + 20);
  h->seq_len = read_i32(data + 24);
  if (v == INT32_MIN) return "vocab_size out of range";
  h->shared_classifier = v > 0;
  h->vocab_size = v < 0 ? -v : v;
  char msg[256];
  auto in = [](int32_t x, int32_t hi) { return x > 0 && x <= hi; };
  if (!in(h->dim, kMaxDim) || !in(h->hidden_dim, kMaxDim * 8) || !in(h->n_layers, kMaxLayers) ||
      !in(h->n_heads, kMaxDim) || !in(h->n_kv_heads, kMaxDim) || !in(h->vocab_size, kMaxVocab) ||
      !in(h->seq_len, kMaxSeqLen)) {
    std::snprintf(msg, sizeof msg,
                  "implausible header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                  "vocab_size %d, seq_len %d)",
                  h->dim, h->hidden_dim, h->n_layers, h->n_heads, h->n_kv_heads, v, h->seq_len);
    return msg;
  }
  if (h->dim % h->n_heads != 0) return "dim is not a multiple of n_heads";
  if (h->n_kv_heads > h->n_heads || h->n_heads % h->n_kv_heads != 0)
    return "n_heads is not a multiple of n_kv_heads";
  if (h->head_dim() % 2 != 0) return "head_dim is odd (RoPE rotates pairs)";
  return std::string();
}

// Number of float32 values the checkpoint must hold after the header.
uint64_t expected_floats(const Llama2cHeader& h) {
  const uint64_t dim = uint64_t(h.dim), hid = uint64_t(h.hidden_dim), L = uint64_t(h.n_layers);
  const uint64_t kv = uint64_t(h.kv_dim()), V = uint64_t(h.vocab_size);
  uint64_t n = V * dim;                         // token_embedding
  n += L * dim;                                 // rms_att
  n += L * dim * dim;                           // wq
  n += 2 * L * kv * dim;                        // wk, wv
  n += L * dim * dim;                           // wo
  n += L * dim;                                 // rms_ffn
  n += 3 * L * hid * dim;                       // w1, w2, w3
  n += dim;                                     // rms_final
  n += 2 * uint64_t(h.seq_len) * uint64_t(h.head_dim() / 2);  // freq_cis_real, freq_cis_imag
  if (!h.shared_classifier) n += V * dim;       // wcls
  return n;
}

bool is_byte_token(const std::string& s) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return s.size() == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && hex(s[3]) && hex(s[4]) && s[5] == '>';
}

}  // namespace

bool looks_like_llama2c(const uint8_t* data, size_t size) {
  Llama2cHeader h;
  if (!parse_header(data, size, &h).empty()) return false;
  return uint64_t(size) == 28 + 4 * expected_floats(h);
}

VocabData parse_llama2c_tokenizer(const uint8_t* data, size_t size, int32_t vocab_size) {
  LLM_CHECK(vocab_size > 0 && vocab_size <= kMaxVocab, LLM_ERR_FORMAT, "llama2.c tokenizer: bad vocab_size %d",
            vocab_size);
  LLM_CHECK(size >= 4, LLM_ERR_FORMAT, "llama2.c tokenizer: file shorter than its 4-byte header");
  const int32_t max_token_length = read_i32(data);
  LLM_CHECK(max_token_length > 0 && max_token_length <= (1 << 16), LLM_ERR_FORMAT,
            "llama2.c tokenizer: implausible max_token_length %d", max_token_length);

  static const char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space
  VocabData v;
  v.model = "llama";
  v.add_bos = true;
  v.add_space_prefix = true;
  v.bos = 1;
  v.eos = 2;
  // Reserve no more than the file can hold (each entry takes at least 8 bytes).
  const size_t cap = std::min<size_t>(size_t(vocab_size), (size - 4) / 8);
  v.tokens.reserve(cap);
  v.scores.reserve(cap);
  v.types.reserve(cap);
  size_t pos = 4;
  for (int32_t id = 0; id < vocab_size; ++id) {
    LLM_CHECK(size - pos >= 8, LLM_ERR_FORMAT, "llama2.c tokenizer: truncated at token %d of %d", id, vocab_size);
    const float score = read_f32(data + pos);
    const int32_t len = read_i32(data + pos + 4);
    pos += 8;
    LLM_CHECK(len >= 0 && size_t(len) <= size - pos, LLM_ERR_FORMAT,
              "llama2.c tokenizer: token %d has length %d, past the end of the file", id, len);
    std::string raw(reinterpret_cast<const char*>(data + pos), size_t(len));
    pos += size_t(len);

    std::string text;
    TokenType type = TokenType::Normal;
    if (raw == "\n<s>\n") {
      text = "<s>";
      type = TokenType::Control;
      v.bos = id;
    } else if (raw == "\n</s>\n") {
      text = "</s>";
      type = TokenType::Control;
      v.eos = id;
    } else if (raw == "<unk>") {
      text = raw;
      type = TokenType::Unknown;
      v.unk = id;
    } else if (is_byte_token(raw)) {
      text = raw;
      type = TokenType::Byte;
    } else {
      text.reserve(raw.size());
      for (char c : raw) {
        if (c == ' ')
          text += kSpace;
        else
          text += c;
      }
    }
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(int32_t(type));
  }
  // Extra bytes after vocab_size tokens are ignored, as run.c does: a
  // tokenizer exported with more pieces than the model uses is still valid.
  return v;
}

ModelSource read_llama2c(const std::string& checkpoint_path, const std::string& tokenizer_path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(checkpoint_path);
  Llama2cHeader h;
  const std::string err = parse_header(file->data(), file->size(), &h);
  LLM_CHECK(err.empty(), LLM_ERR_FORMAT, "'%s' is not a llama2.c checkpoint: %s", checkpoint_path.c_str(),
            err.c_str());
  const uint64_t want = 28 + 4 * expected_floats(h);
  LLM_CHECK(uint64_t(file->size()) == want, LLM_ERR_FORMAT,
            "'%s': llama2.c checkpoint is %zu bytes, its header implies %llu", checkpoint_path.c_str(),
            file->size(), (unsigned long long)want);

  ModelSource src;
  ModelConfig& c = src.config;
  c.arch = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.head_dim();
  c.vocab_size = h.vocab_size;
  c.seq_len = h.seq_len;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;

  // Walks the float arrays in file order; each call takes the next one.
  const uint8_t* p = file->data() + 28;
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    TensorData t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = std::move(shape);
    t.data = p;
    t.nbytes = size_t(t.numel()) * 4;
    p += t.nbytes;
    src.tensors.push_back(std::move(t));
  };
  auto skip = [&](uint64_t n_floats) { p += n_floats * 4; };

  const int64_t dim = h.dim, hid = h.hidden_dim, kv = h.kv_dim(), V = h.vocab_size, L = h.n_layers;
  take("token_embd.weight", {V, dim});
  // Per-kind arrays are stacked over layers; tensors are per layer.
  auto per_layer = [&](const char* kind, std::vector<int64_t> shape) {
    for (int64_t l = 0; l < L; ++l) take("blk." + std::to_string(l) + "." + kind + ".weight", shape);
  };
  per_layer("attn_norm", {dim});
  per_layer("attn_q", {dim, dim});
  per_layer("attn_k", {kv, dim});
  per_layer("attn_v", {kv, dim});
  per_layer("attn_output", {dim, dim});
  per_layer("ffn_norm", {dim});
  per_layer("ffn_gate", {hid, dim});  // w1
  per_layer("ffn_down", {dim, hid});  // w2
  per_layer("ffn_up", {hid, dim});    // w3
  take("output_norm.weight", {dim});
  skip(2 * uint64_t(h.seq_len) * uint64_t(h.head_dim() / 2));  // freq_cis: RoPE is recomputed
  if (!h.shared_classifier) take("output.weight", {V, dim});
  LLM_CHECK(p == file->data() + file->size(), LLM_ERR_INTERNAL, "llama2.c: tensor walk ended off the file end");

  auto tok = MappedFile::open(tokenizer_path);
  src.vocab = parse_llama2c_tokenizer(tok->data(), tok->size(), h.vocab_size);
  src.file = std::move(file);
  src.meta["source.format"] = "llama2.c";
  return src;
}

}  // namespace llm
