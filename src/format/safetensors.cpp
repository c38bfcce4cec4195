// safetensors parsing and Hugging Face model folders -> ModelSource.
#include "format/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "format/hf_families.h"
#include "format/json.h"

namespace llm {

namespace {

namespace fs = std::filesystem;

// Generous caps: far beyond any real model, small enough that products of
// them never overflow 64 bits.
constexpr int64_t kMaxDimValue = int64_t(1) << 40;
constexpr size_t kMaxRank = 8;
constexpr size_t kMaxTensors = 1 << 20;
constexpr int64_t kMaxVocab = int64_t(1) << 22;

uint64_t read_u64le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// safetensors container

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size) {
  LLM_CHECK(data != nullptr || size == 0, LLM_ERR_INVALID_ARGUMENT, "safetensors: null buffer");
  LLM_CHECK(size >= 8, LLM_ERR_FORMAT, "safetensors: %zu bytes, shorter than the 8-byte header length", size);
  const uint64_t n = read_u64le(data);
  LLM_CHECK(n <= kSafetensorsMaxHeader, LLM_ERR_FORMAT, "safetensors: header of %llu bytes exceeds the %llu-byte limit",
            (unsigned long long)n, (unsigned long long)kSafetensorsMaxHeader);
  LLM_CHECK(n <= size - 8, LLM_ERR_FORMAT, "safetensors: header of %llu bytes runs past the end of the %zu-byte file",
            (unsigned long long)n, size);
  const uint8_t* body = data + 8 + n;
  const uint64_t body_size = uint64_t(size) - 8 - n;
  const json::Value header = json::parse(reinterpret_cast<const char*>(data + 8), size_t(n), "safetensors header");
  const auto& members = header.as_object("safetensors header");
  LLM_CHECK(members.size() <= kMaxTensors, LLM_ERR_FORMAT, "safetensors: %zu entries", members.size());

  SafetensorsFile f;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of non-empty tensors
  for (const auto& kv : members) {
    const std::string& name = kv.first;
    const json::Value& v = kv.second;
    if (name == "__metadata__") {
      for (const auto& m : v.as_object("safetensors __metadata__"))
        f.metadata[m.first] = m.second.as_string("safetensors __metadata__ value");
      continue;
    }
    LLM_CHECK(v.is_object(), LLM_ERR_FORMAT, "safetensors: entry '%.128s' is not an object", name.c_str());
    const json::Value* dt = v.find("dtype");
    const json::Value* sh = v.find("shape");
    const json::Value* off = v.find("data_offsets");
    LLM_CHECK(dt && sh && off, LLM_ERR_FORMAT, "safetensors: tensor '%.128s' lacks dtype, shape or data_offsets",
              name.c_str());
    SafetensorsTensor t;
    t.name = name;
    t.dtype = dt->as_string("safetensors dtype");
    const auto& dims = sh->as_array("safetensors shape");
    LLM_CHECK(dims.size() <= kMaxRank, LLM_ERR_FORMAT, "safetensors: tensor '%.128s' has rank %zu", name.c_str(),
              dims.size());
    uint64_t numel = 1;
    for (const auto& d : dims) {
      const int64_t x = d.as_int("safetensors shape entry");
      LLM_CHECK(x >= 0 && x <= kMaxDimValue, LLM_ERR_FORMAT, "safetensors: tensor '%.128s' has dimension %lld",
                name.c_str(), (long long)x);
      t.shape.push_back(x);
      // Checked before multiplying, so the product never wraps.
      LLM_CHECK(x == 0 || numel <= (uint64_t(1) << 62) / uint64_t(x), LLM_ERR_FORMAT,
                "safetensors: tensor '%.128s' is too large", name.c_str());
      numel *= uint64_t(x);
    }
    const auto& o = off->as_array("safetensors data_offsets");
    LLM_CHECK(o.size() == 2, LLM_ERR_FORMAT, "safetensors: tensor '%.128s' data_offsets needs 2 entries",
              name.c_str());
    const int64_t b = o[0].as_int("safetensors data_offsets"), e = o[1].as_int("safetensors data_offsets");
    LLM_CHECK(b >= 0 && e >= b && uint64_t(e) <= body_size, LLM_ERR_FORMAT,
              "safetensors: tensor '%.128s' data_offsets [%lld, %lld] outside the %llu data bytes", name.c_str(),
              (long long)b, (long long)e, (unsigned long long)body_size);
    const size_t es = safetensors_dtype_size(t.dtype);
    if (es != 0) {
      LLM_CHECK(numel <= body_size / es && numel * es == uint64_t(e - b), LLM_ERR_FORMAT,
                "safetensors: tensor '%.128s' (%s) holds %lld bytes, its shape needs %llu", name.c_str(),
                t.dtype.c_str(), (long long)(e - b), (unsigned long long)(numel <= body_size / es ? numel * es : 0));
    }
    t.data = body + b;
    t.nbytes = size_t(e - b);
    if (e > b) ranges.emplace_back(uint64_t(b), uint64_t(e));
    f.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    LLM_CHECK(ranges[i].first >= ranges[i - 1].second, LLM_ERR_FORMAT, "safetensors: tensor data ranges overlap");
  return f;
}

void permute_rope_rows(const uint8_t* in, uint8_t* out, int64_t n_heads, int64_t head_dim, size_t row_bytes,
                       bool inverse) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * head_dim + 2 * i + j;
        const int64_t hf_row = h * head_dim + j * half + i;
        const int64_t src = inverse ? gguf_row : hf_row, dst = inverse ? hf_row : gguf_row;
        std::memcpy(out + size_t(dst) * row_bytes, in + size_t(src) * row_bytes, row_bytes);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// SentencePiece tokenizer.model (protobuf wire format)

namespace {

class PbReader {
 public:
  PbReader(const uint8_t* p, size_t n, const char* what) : p_(p), n_(n), what_(what) {}
  bool done() const { return i_ >= n_; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      LLM_CHECK(i_ < n_, LLM_ERR_FORMAT, "%s: truncated varint at byte %zu", what_, i_);
      const uint8_t b = p_[i_++];
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(LLM_ERR_FORMAT, "%s: varint longer than 10 bytes at byte %zu", what_, i_);
  }

  // Reads a tag; returns the field number and sets *wire.
  uint32_t tag(uint32_t* wire) {
    const uint64_t t = varint();
    *wire = uint32_t(t & 7);
    LLM_CHECK((t >> 3) > 0 && (t >> 3) < (1u << 29), LLM_ERR_FORMAT, "%s: bad field number at byte %zu", what_, i_);
    return uint32_t(t >> 3);
  }

  PbReader bytes() {
    const uint64_t len = varint();
    LLM_CHECK(len <= n_ - i_, LLM_ERR_FORMAT, "%s: length %llu runs past the end at byte %zu", what_,
              (unsigned long long)len, i_);
    PbReader sub(p_ + i_, size_t(len), what_);
    i_ += size_t(len);
    return sub;
  }

  std::string string() {
    PbReader s = bytes();
    return std::string(reinterpret_cast<const char*>(s.p_), s.n_);
  }

  float fixed32_float() {
    LLM_CHECK(n_ - i_ >= 4, LLM_ERR_FORMAT, "%s: truncated fixed32 at byte %zu", what_, i_);
    float f;
    std::memcpy(&f, p_ + i_, 4);
    i_ += 4;
    return f;
  }

  void skip(uint32_t wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1:
        LLM_CHECK(n_ - i_ >= 8, LLM_ERR_FORMAT, "%s: truncated fixed64 at byte %zu", what_, i_);
        i_ += 8;
        return;
      case 2: bytes(); return;
      case 5:
        LLM_CHECK(n_ - i_ >= 4, LLM_ERR_FORMAT, "%s: truncated fixed32 at byte %zu", what_, i_);
        i_ += 4;
        return;
      default: fail(LLM_ERR_FORMAT, "%s: unsupported wire type %u at byte %zu", what_, wire, i_);
    }
  }

  void expect(uint32_t wire, uint32_t want, const char* field) {
    LLM_CHECK(wire == want, LLM_ERR_FORMAT, "%s: field %s has wire type %u, expected %u", what_, field, wire, want);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
  const char* what_;
};

int32_t pb_int32(uint64_t v) { return int32_t(uint32_t(v)); }  // protobuf int32: two's complement, sign-extended

}  // namespace

VocabData parse_sentencepiece_model(const uint8_t* data, size_t size) {
  const char* what = "tokenizer.model";
  PbReader r(data, size, what);
  VocabData v;
  v.model = "llama";
  int32_t model_type = 1;  // proto default: UNIGRAM
  int32_t unk = 0, bos = 1, eos = 2, pad = -1;
  bool add_dummy_prefix = true;
  while (!r.done()) {
    uint32_t wire;
    const uint32_t field = r.tag(&wire);
    if (field == 1) {  // repeated SentencePiece pieces
      r.expect(wire, 2, "pieces");
      LLM_CHECK(v.tokens.size() < size_t(kMaxVocab), LLM_ERR_FORMAT, "%s: more than %lld pieces", what,
                (long long)kMaxVocab);
      PbReader p = r.bytes();
      std::string piece;
      float score = 0.0f;
      int32_t type = 1;  // NORMAL
      while (!p.done()) {
        uint32_t w;
        const uint32_t f = p.tag(&w);
        if (f == 1) {
          p.expect(w, 2, "piece");
          piece = p.string();
        } else if (f == 2) {
          p.expect(w, 5, "score");
          score = p.fixed32_float();
        } else if (f == 3) {
          p.expect(w, 0, "type");
          type = pb_int32(p.varint());
        } else {
          p.skip(w);
        }
      }
      LLM_CHECK(type >= 1 && type <= 6, LLM_ERR_FORMAT, "%s: piece %zu has unknown type %d", what, v.tokens.size(),
                int(type));
      // SentencePiece's type numbers are GGUF's token types.
      v.tokens.push_back(std::move(piece));
      v.scores.push_back(score);
      v.types.push_back(type);
    } else if (field == 2) {  // TrainerSpec
      r.expect(wire, 2, "trainer_spec");
      PbReader t = r.bytes();
      while (!t.done()) {
        uint32_t w;
        const uint32_t f = t.tag(&w);
        if (f == 3 || f == 40 || f == 41 || f == 42 || f == 43) {
          t.expect(w, 0, "trainer_spec id");
          const int32_t x = pb_int32(t.varint());
          if (f == 3) model_type = x;
          else if (f == 40) unk = x;
          else if (f == 41) bos = x;
          else if (f == 42) eos = x;
          else pad = x;
        } else {
          t.skip(w);
        }
      }
    } else if (field == 3) {  // NormalizerSpec
      r.expect(wire, 2, "normalizer_spec");
      PbReader ns = r.bytes();
      while (!ns.done()) {
        uint32_t w;
        const uint32_t f = ns.tag(&w);
        if (f == 3) {
          ns.expect(w, 0, "add_dummy_prefix");
          add_dummy_prefix = ns.varint() != 0;
        } else {
          ns.skip(w);
        }
      }
    } else {
      r.skip(wire);
    }
  }
  LLM_CHECK(!v.tokens.empty(), LLM_ERR_FORMAT, "%s: no pieces", what);
  LLM_CHECK(model_type == 2, LLM_ERR_UNSUPPORTED,
            "%s: SentencePiece model type %d is not supported (BPE = 2 only; unigram models need another tokenizer)",
            what, int(model_type));
  const int32_t n = int32_t(v.tokens.size());
  auto id_or_none = [n](int32_t id) { return id >= 0 && id < n ? id : -1; };
  v.unk = id_or_none(unk);
  v.bos = id_or_none(bos);
  v.eos = id_or_none(eos);
  v.pad = id_or_none(pad);
  v.add_bos = true;
  v.add_space_prefix = add_dummy_prefix;
  return v;
}

// ---------------------------------------------------------------------------
// tokenizer.json

namespace {

const char* const kSpaceMark = "\xE2\x96\x81";  // U+2581

// Split regexes as they appear (JSON-decoded) in tokenizer.json files.
const char* const kRegexGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";
const char* const kRegexLlama3 =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kRegexQwen2 =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kRegexTekken =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Visits a pre-tokenizer / normalizer / decoder / post-processor node and
// the members of a "Sequence" node (keys "pretokenizers", "normalizers",
// "decoders", "processors").
template <typename Fn>
void visit_nodes(const json::Value* node, Fn&& fn, int depth = 0) {
  if (!node || !node->is_object() || depth > 8) return;
  fn(*node);
  for (const char* key : {"pretokenizers", "normalizers", "decoders", "processors"}) {
    const json::Value* seq = node->find(key);
    if (seq && seq->is_array())
      for (const auto& child : seq->as_array(key)) visit_nodes(&child, fn, depth + 1);
  }
}

std::string node_type(const json::Value& n) {
  const json::Value* t = n.find("type");
  return t && t->is_string() ? t->as_string("type") : std::string();
}

// The text of a special token in tokenizer_config.json: a string, or an
// AddedToken object {"content": ...}.
std::string special_text(const json::Value* cfg, const char* key) {
  if (!cfg) return std::string();
  const json::Value* v = cfg->find(key);
  if (!v) return std::string();
  if (v->is_string()) return v->as_string(key);
  if (v->is_object()) return v->get_string("content", "");
  return std::string();
}

// config.json ids: an integer or a list of integers (first wins); -1 if none.
int64_t config_id(const json::Value* cfg, const char* key) {
  if (!cfg) return -1;
  const json::Value* v = cfg->find(key);
  if (!v) return -1;
  if (v->is_int()) return v->as_int(key);
  if (v->is_array() && !v->as_array(key).empty() && v->as_array(key)[0].is_int()) return v->as_array(key)[0].as_int(key);
  return -1;
}

}  // namespace

VocabData parse_hf_tokenizer_json(const json::Value& tok, const json::Value* tcfg, const json::Value* config,
                                  std::string* warning) {
  tok.as_object("tokenizer.json");
  const json::Value* model = tok.find("model");
  LLM_CHECK(model && model->is_object(), LLM_ERR_FORMAT, "tokenizer.json: missing 'model'");
  const std::string mtype = model->get_string("type", "BPE");
  LLM_CHECK(mtype == "BPE", LLM_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported (BPE only)",
            mtype.c_str());
  const json::Value* vocab_v = model->find("vocab");
  LLM_CHECK(vocab_v, LLM_ERR_FORMAT, "tokenizer.json: missing model.vocab");
  const auto& vocab_obj = vocab_v->as_object("tokenizer.json model.vocab");

  // Ids -> text; added tokens may extend (or repeat) the vocabulary.
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<bool> present;
  auto place = [&](int64_t id, const std::string& text, int32_t type) {
    LLM_CHECK(id >= 0 && id < kMaxVocab, LLM_ERR_FORMAT, "tokenizer.json: token id %lld is out of range",
              (long long)id);
    if (size_t(id) >= tokens.size()) {
      tokens.resize(size_t(id) + 1);
      types.resize(size_t(id) + 1, int32_t(TokenType::Unused));
      present.resize(size_t(id) + 1, false);
    }
    tokens[size_t(id)] = text;
    types[size_t(id)] = type;
    present[size_t(id)] = true;
  };
  for (const auto& kv : vocab_obj) place(kv.second.as_int("tokenizer.json vocab id"), kv.first, int32_t(TokenType::Normal));

  const std::string unk_text = model->get_string("unk_token", "");
  const bool byte_fallback = model->get_bool("byte_fallback", false);
  const json::Value* added = tok.find("added_tokens");
  if (added && !added->is_null()) {
    for (const auto& a : added->as_array("tokenizer.json added_tokens")) {
      const int64_t id = a.get_int("id", -1);
      const std::string content = a.get_string("content", "");
      const bool special = a.get_bool("special", false);
      int32_t type = special ? int32_t(TokenType::Control) : int32_t(TokenType::UserDefined);
      if (!unk_text.empty() && content == unk_text) type = int32_t(TokenType::Unknown);
      place(id, content, type);
    }
  }
  LLM_CHECK(!tokens.empty(), LLM_ERR_FORMAT, "tokenizer.json: empty vocabulary");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (present[i]) continue;
    tokens[i] = "[PAD" + std::to_string(i) + "]";  // a hole in the id space
  }

  // Which flavour of BPE: byte-level (GPT-2 / Llama 3) or SentencePiece-style.
  bool byte_level = false, metaspace = false, prepend_space = false;
  std::string split_regex;
  int n_splits = 0;
  bool bl_use_regex = false, bl_prefix_space = false;
  visit_nodes(tok.find("pre_tokenizer"), [&](const json::Value& n) {
    const std::string t = node_type(n);
    if (t == "ByteLevel") {
      byte_level = true;
      bl_use_regex = n.get_bool("use_regex", true);
      bl_prefix_space = n.get_bool("add_prefix_space", false);
    } else if (t == "Split") {
      ++n_splits;
      const json::Value* pat = n.find("pattern");
      if (pat && pat->is_object()) split_regex = pat->get_string("Regex", "");
    } else if (t == "Metaspace") {
      metaspace = true;
      const std::string scheme = n.get_string("prepend_scheme", "");
      if (scheme == "first" || scheme == "always" || (scheme.empty() && n.get_bool("add_prefix_space", true)))
        prepend_space = true;
    }
  });
  visit_nodes(tok.find("normalizer"), [&](const json::Value& n) {
    const std::string t = node_type(n);
    if (t == "Prepend" && n.get_string("prepend", "") == kSpaceMark) prepend_space = true;
    if (t == "Replace") {
      const json::Value* c = n.find("content");
      if (c && c->is_string() && c->as_string("content") == kSpaceMark) metaspace = true;
    }
  });
  visit_nodes(tok.find("decoder"), [&](const json::Value& n) {
    if (node_type(n) == "ByteLevel" && !metaspace && !byte_fallback) byte_level = true;
  });

  VocabData v;
  const int32_t n = int32_t(tokens.size());
  auto find_id = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    for (int32_t i = 0; i < n; ++i)
      if (present[size_t(i)] && tokens[size_t(i)] == text) return i;
    return -1;
  };
  auto note = [&](const std::string& s) {
    if (warning) *warning += (warning->empty() ? "" : "; ") + s;
  };

  // Merges: "a b" strings, or [a, b] pairs in newer files.
  std::vector<std::string> merges;
  const json::Value* mv = model->find("merges");
  if (mv && !mv->is_null()) {
    const auto& arr = mv->as_array("tokenizer.json model.merges");
    merges.reserve(arr.size());
    for (const auto& m : arr) {
      if (m.is_string()) {
        merges.push_back(m.as_string("merge"));
      } else {
        const auto& pair = m.as_array("merge");
        LLM_CHECK(pair.size() == 2, LLM_ERR_FORMAT, "tokenizer.json: a merge pair needs 2 entries");
        merges.push_back(pair[0].as_string("merge") + " " + pair[1].as_string("merge"));
      }
    }
  }

  if (byte_level && !byte_fallback && !metaspace) {
    v.model = "gpt2";
    v.merges = std::move(merges);
    if (n_splits == 0) {
      v.pre = "gpt-2";
      if (!bl_use_regex) note("byte-level tokenizer without a split regex: using GPT-2's");
    } else if (n_splits > 1) {
      v.pre = "default";
      note("several split regexes: using GPT-2's pre-tokenizer, tokenization may differ");
    } else if (split_regex == kRegexLlama3) {
      v.pre = "llama3";
    } else if (split_regex == kRegexQwen2) {
      v.pre = "qwen2";
    } else if (split_regex == kRegexTekken) {
      v.pre = "tekken";
    } else if (split_regex == kRegexGpt2) {
      v.pre = "gpt-2";
    } else if (split_regex.find("\\p{N}{1,3}") != std::string::npos) {
      v.pre = "llama3";
      note("unrecognised split regex with \\p{N}{1,3}: using Llama 3's pre-tokenizer");
    } else {
      v.pre = "default";
      note("unrecognised split regex: using GPT-2's pre-tokenizer, tokenization may differ");
    }
    if (bl_prefix_space) note("ByteLevel add_prefix_space is not supported: no space is prepended");
    v.tokens = tokens;  // copies: find_id still reads tokens
    v.types = types;
    v.add_space_prefix = false;
    // BOS only where the post-processor or tokenizer_config says so.
    bool add_bos = false;
    int32_t template_bos = -1;
    visit_nodes(tok.find("post_processor"), [&](const json::Value& p) {
      if (node_type(p) != "TemplateProcessing") return;
      const json::Value* single = p.find("single");
      if (!single || !single->is_array() || single->as_array("single").empty()) return;
      const json::Value* st = single->as_array("single")[0].find("SpecialToken");
      if (st && st->is_object()) {
        add_bos = true;
        template_bos = find_id(st->get_string("id", ""));
      }
    });
    v.add_bos = add_bos;
    v.bos = template_bos;
  } else {
    LLM_CHECK(byte_fallback || metaspace, LLM_ERR_UNSUPPORTED,
              "tokenizer.json: a BPE model that is neither byte-level nor SentencePiece-style is not supported");
    v.model = "llama";
    v.add_space_prefix = prepend_space;
    v.add_bos = true;
    // tokenizer.json has no scores. SentencePiece merges the adjacent pair
    // whose concatenation scores highest; HF BPE merges the pair of lowest
    // rank. They agree when a piece scores -(rank of the first merge that
    // produces it). Pieces no merge produces score lowest.
    v.scores.assign(size_t(n), -1e9f);
    std::vector<std::pair<std::string, int32_t>> by_text;
    by_text.reserve(size_t(n));
    for (int32_t i = 0; i < n; ++i)
      if (present[size_t(i)]) by_text.emplace_back(tokens[size_t(i)], i);
    std::sort(by_text.begin(), by_text.end());
    std::vector<bool> scored(size_t(n), false);
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& m = merges[rank];
      const size_t sp = m.find(' ');
      if (sp == std::string::npos) continue;
      const std::string joined = m.substr(0, sp) + m.substr(sp + 1);
      auto it = std::lower_bound(by_text.begin(), by_text.end(), std::make_pair(joined, int32_t(-1)));
      if (it == by_text.end() || it->first != joined) continue;
      if (!scored[size_t(it->second)]) {
        scored[size_t(it->second)] = true;
        v.scores[size_t(it->second)] = -float(rank);
      }
    }
    for (int32_t i = 0; i < n; ++i) {
      const std::string& t = tokens[size_t(i)];
      if (types[size_t(i)] == int32_t(TokenType::Normal) && t.size() == 6 && t.compare(0, 3, "<0x") == 0 &&
          t[5] == '>')
        types[size_t(i)] = int32_t(TokenType::Byte);
    }
    v.tokens = tokens;  // copies: find_id still reads tokens
    v.types = types;
    v.unk = find_id(unk_text);
    v.bos = find_id("<s>");
    v.eos = find_id("</s>");
  }

  // tokenizer_config.json and config.json refine the special tokens.
  const std::string bos_text = special_text(tcfg, "bos_token"), eos_text = special_text(tcfg, "eos_token");
  const std::string pad_text = special_text(tcfg, "pad_token");
  if (find_id(bos_text) >= 0) v.bos = find_id(bos_text);
  else if (v.bos < 0 && config_id(config, "bos_token_id") >= 0 && config_id(config, "bos_token_id") < n)
    v.bos = int32_t(config_id(config, "bos_token_id"));
  if (find_id(eos_text) >= 0) v.eos = find_id(eos_text);
  else if (config_id(config, "eos_token_id") >= 0 && config_id(config, "eos_token_id") < n)
    v.eos = int32_t(config_id(config, "eos_token_id"));
  if (find_id(pad_text) >= 0) v.pad = find_id(pad_text);
  if (tcfg && tcfg->find("add_bos_token") && tcfg->find("add_bos_token")->is_bool())
    v.add_bos = tcfg->find("add_bos_token")->as_bool("add_bos_token");
  if (v.add_bos && v.bos < 0) v.add_bos = false;
  v.eot = find_id("<|eot_id|>");
  return v;
}

// ---------------------------------------------------------------------------
// The folder

namespace {

std::shared_ptr<MappedFile> open_in(const fs::path& dir, const std::string& name) {
  return MappedFile::open((dir / name).string());
}

json::Value parse_json_file(const fs::path& path, const char* what) {
  auto f = MappedFile::open(path.string());
  return json::parse(reinterpret_cast<const char*>(f->data()), f->size(), what);
}

bool exists_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The chat template of a Hugging Face folder: chat_template.jinja when it
// exists (newer transformers write it there), else tokenizer_config.json's
// "chat_template", a string or a list of {"name", "template"} of which the
// one named "default" is taken. Empty when there is none.
std::string hf_chat_template(const fs::path& dir, const json::Value* tcfg) {
  if (exists_file(dir / "chat_template.jinja")) {
    auto f = open_in(dir, "chat_template.jinja");
    return std::string(reinterpret_cast<const char*>(f->data()), f->size());
  }
  const json::Value* t = tcfg ? tcfg->find("chat_template") : nullptr;
  if (!t) return {};
  if (t->is_string()) return t->as_string("chat_template");
  if (t->is_array()) {
    for (const json::Value& e : t->as_array("chat_template")) {
      const json::Value* name = e.find("name");
      const json::Value* text = e.find("template");
      if (name && text && name->is_string() && name->as_string("name") == "default")
        return text->as_string("chat_template template");
    }
  }
  return {};
}

struct Shard {
  std::shared_ptr<MappedFile> file;
  SafetensorsFile st;
};

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && exists_file(fs::path(path) / "config.json");
}

ModelSource read_hf_folder(const std::string& dir_str, const Logger* log) {
  const fs::path dir(dir_str);
  std::error_code ec;
  LLM_CHECK(fs::is_directory(dir, ec), LLM_ERR_IO, "'%s' is not a directory", dir_str.c_str());
  LLM_CHECK(exists_file(dir / "config.json"), LLM_ERR_IO, "'%s' has no config.json", dir_str.c_str());
  const json::Value config = parse_json_file(dir / "config.json", "config.json");
  HfModelPlan plan = hf_model_plan(config);
  ModelSource src;
  src.config = plan.config;
  const ModelConfig& c = src.config;

  // --- weights: which files
  std::vector<std::string> shard_names;
  if (exists_file(dir / "model.safetensors.index.json")) {
    const json::Value index = parse_json_file(dir / "model.safetensors.index.json", "model.safetensors.index.json");
    const json::Value* wm = index.find("weight_map");
    LLM_CHECK(wm, LLM_ERR_FORMAT, "model.safetensors.index.json: missing weight_map");
    std::set<std::string> names;
    for (const auto& kv : wm->as_object("weight_map")) {
      const std::string& f = kv.second.as_string("weight_map file");
      // Shard names come from an untrusted file: plain names in this folder only.
      LLM_CHECK(!f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos && f[0] != '.',
                LLM_ERR_FORMAT, "model.safetensors.index.json: bad shard name '%.128s'", f.c_str());
      names.insert(f);
    }
    shard_names.assign(names.begin(), names.end());
  } else if (exists_file(dir / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0 && exists_file(e.path()))
        shard_names.push_back(name);
    }
    std::sort(shard_names.begin(), shard_names.end());
  }
  LLM_CHECK(!shard_names.empty(), LLM_ERR_IO, "'%s' holds no *.safetensors weights", dir_str.c_str());

  std::vector<Shard> shards;
  for (const auto& name : shard_names) {
    Shard s;
    s.file = open_in(dir, name);
    try {
      s.st = parse_safetensors(s.file->data(), s.file->size());
    } catch (const Error& e) {
      fail(e.status(), "%s: %s", name.c_str(), e.what());
    }
    shards.push_back(std::move(s));
  }

  // --- weights: the family's plan (format/hf_families.cpp)
  const int64_t hd = c.head_dim, V = c.vocab_size;
  const bool tie = plan.tied;

  // Where each HF tensor lives (a name in two shards is an error).
  std::map<std::string, std::pair<size_t, const SafetensorsTensor*>> where;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const auto& t : shards[s].st.tensors) {
      LLM_CHECK(where.emplace(t.name, std::make_pair(s, &t)).second, LLM_ERR_FORMAT,
                "tensor '%.128s' appears in two weight files", t.name.c_str());
    }
  }
  std::set<std::string> used;
  for (const HfTensor& want : plan.tensors) {
    const std::string& hf = want.hf;
    auto it = where.find(hf);
    if (it == where.end()) {
      LLM_CHECK(want.optional, LLM_ERR_FORMAT, "missing tensor '%s'", hf.c_str());
      if (want.gguf == "output.weight" && !tie && log)
        log->log(LLM_LOG_WARN, "no lm_head.weight: the output layer is tied to the embeddings");
      continue;
    }
    used.insert(hf);
    if (want.gguf == "output.weight" && tie) {
      if (log) log->log(LLM_LOG_INFO, "tie_word_embeddings: lm_head.weight is ignored");
      continue;
    }
    const size_t shard = it->second.first;
    const SafetensorsTensor& st = *it->second.second;
    DType dt;
    if (st.dtype == "F32") dt = DType::F32;
    else if (st.dtype == "F16") dt = DType::F16;
    else if (st.dtype == "BF16") dt = DType::BF16;
    else fail(LLM_ERR_UNSUPPORTED, "tensor '%s' has dtype %s (F32, F16 and BF16 are supported)", hf.c_str(),
              st.dtype.c_str());
    if (want.shape.size() == 1) {
      LLM_CHECK(st.shape.size() == 1 && st.shape[0] == want.shape[0], LLM_ERR_FORMAT,
                "tensor '%s' should have shape [%lld]", hf.c_str(), (long long)want.shape[0]);
    } else {
      LLM_CHECK(st.shape == want.shape, LLM_ERR_FORMAT, "tensor '%s' should have shape [%lld, %lld]", hf.c_str(),
                (long long)want.shape[0], (long long)want.shape[1]);
    }
    TensorData t;
    t.name = want.gguf;
    t.dtype = dt;
    t.shape = want.shape;
    t.nbytes = st.nbytes;
    const size_t esize = safetensors_dtype_size(st.dtype);
    const bool aligned = reinterpret_cast<uintptr_t>(st.data) % esize == 0;
    if (want.rope_heads > 0 || !aligned) {
      auto owned = std::make_shared<std::vector<uint8_t>>(st.nbytes);
      if (want.rope_heads > 0)
        permute_rope_rows(st.data, owned->data(), want.rope_heads, hd,
                          size_t(want.shape.size() == 2 ? want.shape[1] : 1) * esize, false);
      else
        std::memcpy(owned->data(), st.data, st.nbytes);
      t.data = owned->data();
      t.owned = std::move(owned);
    } else {
      t.data = st.data;
      // The tensor keeps its shard mapped: an aliasing shared_ptr shares the
      // mapping's ownership while pointing at nothing (so `owned` reads as
      // empty to code that copies from it).
      if (shard != 0) t.owned = std::shared_ptr<std::vector<uint8_t>>(shards[shard].file, nullptr);
    }
    src.tensors.push_back(std::move(t));
  }
  for (TensorData& t : plan.extra) src.tensors.push_back(std::move(t));
  for (const auto& kv : where) {
    if (used.count(kv.first)) continue;
    if (kv.first.find("rotary_emb.inv_freq") != std::string::npos) continue;  // recomputed by the engine
    // Inside the decoder an unknown tensor would change the math: refused,
    // never ignored. Elsewhere (a vision tower, a value head) it is not ours.
    LLM_CHECK(kv.first.compare(0, 6, "model.") != 0 || kv.first.compare(0, 13, "model.vision_") == 0,
              LLM_ERR_UNSUPPORTED, "tensor '%.128s' is not used by the %s block; refusing a model it would change",
              kv.first.c_str(), c.arch.c_str());
    if (log) log->log(LLM_LOG_WARN, "tensor '%s' is not used", kv.first.c_str());
  }
  src.file = shards[0].file;

  // --- tokenizer
  std::unique_ptr<json::Value> tcfg;
  if (exists_file(dir / "tokenizer_config.json"))
    tcfg = std::make_unique<json::Value>(parse_json_file(dir / "tokenizer_config.json", "tokenizer_config.json"));
  std::unique_ptr<json::Value> tok_json;
  if (exists_file(dir / "tokenizer.json"))
    tok_json = std::make_unique<json::Value>(parse_json_file(dir / "tokenizer.json", "tokenizer.json"));
  if (exists_file(dir / "tokenizer.model")) {
    auto f = open_in(dir, "tokenizer.model");
    src.vocab = parse_sentencepiece_model(f->data(), f->size());
    src.meta["tokenizer.source"] = "tokenizer.model";
    if (tcfg && tcfg->find("add_bos_token") && tcfg->find("add_bos_token")->is_bool())
      src.vocab.add_bos = tcfg->find("add_bos_token")->as_bool("add_bos_token");
  } else if (tok_json) {
    std::string warning;
    src.vocab = parse_hf_tokenizer_json(*tok_json, tcfg.get(), &config, &warning);
    src.meta["tokenizer.source"] = "tokenizer.json";
    if (!warning.empty() && log) log->log(LLM_LOG_WARN, "tokenizer.json: %s", warning.c_str());
  } else {
    fail(LLM_ERR_IO, "'%s' has neither tokenizer.model nor tokenizer.json", dir_str.c_str());
  }
  VocabData& v = src.vocab;
  v.chat_template = hf_chat_template(dir, tcfg.get());
  LLM_CHECK(int64_t(v.tokens.size()) <= V, LLM_ERR_FORMAT,
            "the tokenizer has %zu tokens but the embedding only %lld rows", v.tokens.size(), (long long)V);
  if (int64_t(v.tokens.size()) < V) {
    // Embedding rows beyond the tokenizer (padding to a multiple of 64 etc.).
    v.types.resize(v.tokens.size(), int32_t(TokenType::Normal));
    if (!v.scores.empty()) v.scores.resize(size_t(V), -1e9f);
    for (int64_t id = int64_t(v.tokens.size()); id < V; ++id) {
      v.tokens.push_back("[PAD" + std::to_string(id) + "]");
      v.types.push_back(int32_t(TokenType::Unused));
    }
  }
  src.meta["source.format"] = "safetensors";
  return src;
}

}  // namespace llm
