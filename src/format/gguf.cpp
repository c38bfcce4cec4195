// GGUF reader: parse_gguf() turns an untrusted byte buffer into a GgufFile,
// gguf_to_model_source() maps the llama architecture onto ModelSource.
//
// File layout (all little-endian):
//   "GGUF" | version u32 (2 or 3) | n_tensors u64 | n_kv u64
//   n_kv x { key: string | type u32 | value }          string = u64 len + bytes
//            value of an ARRAY = elem type u32 | count u64 | count x value
//   n_tensors x { name: string | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64 }
//   padding to general.alignment (default 32) | tensor data
// A vocab-only file (n_tensors == 0) may end right after the metadata.
#include "format/gguf.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "format/family_spec.h"
#include "quant/ggml_quants.h"
#include "quant/quant.h"

namespace llm {

namespace {

// Caps that keep a hostile header from making us allocate far more memory
// than the file holds. Every count is also checked against the bytes left.
constexpr uint32_t kMaxDims = 4;                 // GGML_MAX_DIMS
constexpr uint32_t kMaxArrayDepth = 4;           // arrays of arrays (legal, never used by llama)
constexpr uint64_t kMaxArrayElements = 1u << 22; // all arrays together: > 4x the largest real vocab + merges

// --- bounded little-endian cursor -----------------------------------------
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(LLM_ERR_FORMAT, "gguf: truncated %s at offset %zu (need %llu bytes, %zu left)", what, pos_,
           (unsigned long long)n, left());
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // the host is little-endian (x86-64, aarch64)
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one value of a kind (for bounding array counts).
uint64_t min_value_bytes(uint32_t kind) {
  switch (kind) {
    case GgufValue::U8: case GgufValue::I8: case GgufValue::BOOL: return 1;
    case GgufValue::U16: case GgufValue::I16: return 2;
    case GgufValue::U32: case GgufValue::I32: case GgufValue::F32: return 4;
    case GgufValue::U64: case GgufValue::I64: case GgufValue::F64: return 8;
    case GgufValue::STRING: return 8;
    case GgufValue::ARRAY: return 12;
  }
  return 0;  // unknown kind
}

const char* kind_name(GgufValue::Kind k) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  return unsigned(k) <= GgufValue::F64 ? names[k] : "?";
}

struct Parser {
  Cursor cur;
  uint64_t array_elements = 0;

  void read_value(GgufValue& v, uint32_t kind, uint32_t depth) {
    if (min_value_bytes(kind) == 0) fail(LLM_ERR_FORMAT, "gguf: unknown value type %u at offset %zu", kind, cur.pos());
    v.kind = GgufValue::Kind(kind);
    switch (v.kind) {
      case GgufValue::U8: v.u = cur.read<uint8_t>("u8"); break;
      case GgufValue::I8: v.i = cur.read<int8_t>("i8"); break;
      case GgufValue::U16: v.u = cur.read<uint16_t>("u16"); break;
      case GgufValue::I16: v.i = cur.read<int16_t>("i16"); break;
      case GgufValue::U32: v.u = cur.read<uint32_t>("u32"); break;
      case GgufValue::I32: v.i = cur.read<int32_t>("i32"); break;
      case GgufValue::U64: v.u = cur.read<uint64_t>("u64"); break;
      case GgufValue::I64: v.i = cur.read<int64_t>("i64"); break;
      case GgufValue::F32: v.f = cur.read<float>("f32"); break;
      case GgufValue::F64: v.f = cur.read<double>("f64"); break;
      case GgufValue::BOOL: {
        const uint8_t b = cur.read<uint8_t>("bool");
        LLM_CHECK(b <= 1, LLM_ERR_FORMAT, "gguf: bool value %u at offset %zu", b, cur.pos() - 1);
        v.u = b;
        break;
      }
      case GgufValue::STRING: v.s = cur.read_string("string"); break;
      case GgufValue::ARRAY: {
        LLM_CHECK(depth < kMaxArrayDepth, LLM_ERR_FORMAT, "gguf: arrays nested too deep at offset %zu", cur.pos());
        const uint32_t elem = cur.read<uint32_t>("array type");
        const uint64_t min_bytes = min_value_bytes(elem);
        LLM_CHECK(min_bytes != 0, LLM_ERR_FORMAT, "gguf: unknown array element type %u at offset %zu", elem,
                  cur.pos() - 4);
        const uint64_t count = cur.read<uint64_t>("array count");
        // Bound before allocating: each element takes at least min_bytes.
        LLM_CHECK(count <= cur.left() / min_bytes, LLM_ERR_FORMAT,
                  "gguf: array of %llu %s at offset %zu does not fit in the %zu bytes left",
                  (unsigned long long)count, kind_name(GgufValue::Kind(elem)), cur.pos(), cur.left());
        array_elements += count;
        LLM_CHECK(array_elements <= kMaxArrayElements, LLM_ERR_FORMAT,
                  "gguf: metadata arrays hold more than %llu elements", (unsigned long long)kMaxArrayElements);
        v.elem_kind = GgufValue::Kind(elem);
        v.arr.resize(size_t(count));
        for (auto& e : v.arr) read_value(e, elem, depth + 1);
        break;
      }
    }
  }
};

bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0) return false;
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

struct TypeTraits {
  int64_t block;  // values per block
  size_t bytes;   // bytes per block
  const char* name;
};

bool type_traits(GgmlType t, TypeTraits* tt) {
  switch (t) {
    case GgmlType::F32: *tt = {1, 4, "f32"}; return true;
    case GgmlType::F16: *tt = {1, 2, "f16"}; return true;
    case GgmlType::BF16: *tt = {1, 2, "bf16"}; return true;
    case GgmlType::Q4_0: *tt = {32, 18, "q4_0"}; return true;
    case GgmlType::Q4_1: *tt = {32, 20, "q4_1"}; return true;
    case GgmlType::Q5_0: *tt = {32, 22, "q5_0"}; return true;
    case GgmlType::Q5_1: *tt = {32, 24, "q5_1"}; return true;
    case GgmlType::Q8_0: *tt = {32, 34, "q8_0"}; return true;
    case GgmlType::Q8_1: *tt = {32, 36, "q8_1"}; return true;
    case GgmlType::Q2_K: *tt = {256, 84, "q2_K"}; return true;
    case GgmlType::Q3_K: *tt = {256, 110, "q3_K"}; return true;
    case GgmlType::Q4_K: *tt = {256, 144, "q4_K"}; return true;
    case GgmlType::Q5_K: *tt = {256, 176, "q5_K"}; return true;
    case GgmlType::Q6_K: *tt = {256, 210, "q6_K"}; return true;
    case GgmlType::Q8_K: *tt = {256, 292, "q8_K"}; return true;
    case GgmlType::IQ4_NL: *tt = {32, 18, "iq4_nl"}; return true;
    case GgmlType::IQ4_XS: *tt = {256, 136, "iq4_xs"}; return true;
  }
  return false;
}

}  // namespace

// --- GgufValue --------------------------------------------------------------

int64_t GgufValue::as_int() const {
  switch (kind) {
    case U8: case U16: case U32: case U64: case BOOL:
      LLM_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), LLM_ERR_FORMAT, "gguf: integer %llu out of range",
                (unsigned long long)u);
      return int64_t(u);
    case I8: case I16: case I32: case I64: return i;
    default: fail(LLM_ERR_FORMAT, "gguf: expected an integer, found %s", kind_name(kind));
  }
}

double GgufValue::as_float() const {
  switch (kind) {
    case F32: case F64: return f;
    case U8: case U16: case U32: case U64: return double(u);
    case I8: case I16: case I32: case I64: return double(i);
    default: fail(LLM_ERR_FORMAT, "gguf: expected a number, found %s", kind_name(kind));
  }
}

size_t ggml_type_size(GgmlType type, int64_t n) {
  TypeTraits tt;
  if (!type_traits(type, &tt) || n < 0 || n % tt.block) return 0;
  const uint64_t blocks = uint64_t(n / tt.block);
  if (blocks > std::numeric_limits<size_t>::max() / tt.bytes) return 0;
  return size_t(blocks * tt.bytes);
}

const char* ggml_type_name(GgmlType type) {
  TypeTraits tt;
  return type_traits(type, &tt) ? tt.name : "?";
}

// --- parse_gguf -------------------------------------------------------------

GgufFile parse_gguf(const uint8_t* data, size_t size, bool vocab_only) {
  LLM_CHECK(data != nullptr || size == 0, LLM_ERR_INVALID_ARGUMENT, "gguf: null buffer");
  Parser p{Cursor(data, size)};
  Cursor& cur = p.cur;
  GgufFile g;

  cur.need(4, "magic");
  LLM_CHECK(std::memcmp(data, "GGUF", 4) == 0, LLM_ERR_FORMAT, "gguf: bad magic");
  cur.read<uint32_t>("magic");
  g.version = cur.read<uint32_t>("version");
  // v1 used 32-bit counts and lengths; big-endian files show up as a huge version.
  LLM_CHECK(g.version == 2 || g.version == 3, g.version == 1 ? LLM_ERR_UNSUPPORTED : LLM_ERR_FORMAT,
            "gguf: unsupported version %u (2 and 3 are read)", g.version);
  const uint64_t n_tensors = cur.read<uint64_t>("tensor count");
  const uint64_t n_kv = cur.read<uint64_t>("kv count");
  // A kv pair takes >= 8 (key len) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 8 + 4 + 8.
  LLM_CHECK(n_kv <= cur.left() / 13, LLM_ERR_FORMAT, "gguf: kv count %llu exceeds the file size",
            (unsigned long long)n_kv);
  LLM_CHECK(n_tensors <= cur.left() / 32, LLM_ERR_FORMAT, "gguf: tensor count %llu exceeds the file size",
            (unsigned long long)n_tensors);

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = cur.read_string("kv key");
    LLM_CHECK(!key.empty(), LLM_ERR_FORMAT, "gguf: empty key in kv pair %llu", (unsigned long long)k);
    const uint32_t type = cur.read<uint32_t>("kv type");
    GgufValue v;
    p.read_value(v, type, 0);
    LLM_CHECK(g.kv.emplace(key, std::move(v)).second, LLM_ERR_FORMAT, "gguf: duplicate key '%s'", key.c_str());
  }

  if (const GgufValue* a = g.get("general.alignment")) {
    LLM_CHECK(a->kind == GgufValue::U32, LLM_ERR_FORMAT, "gguf: general.alignment must be u32");
    LLM_CHECK(a->u != 0 && (a->u & (a->u - 1)) == 0 && a->u <= (1u << 20), LLM_ERR_FORMAT,
              "gguf: general.alignment %llu is not a power of two", (unsigned long long)a->u);
    g.alignment = uint32_t(a->u);
  }

  g.tensors.reserve(size_t(n_tensors));
  std::set<std::string> names;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo ti;
    ti.name = cur.read_string("tensor name");
    LLM_CHECK(names.insert(ti.name).second, LLM_ERR_FORMAT, "gguf: duplicate tensor '%s'", ti.name.c_str());
    const uint32_t n_dims = cur.read<uint32_t>("tensor dims");
    LLM_CHECK(n_dims >= 1 && n_dims <= kMaxDims, LLM_ERR_FORMAT, "gguf: tensor '%s' has %u dims",
              ti.name.c_str(), n_dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = cur.read<uint64_t>("tensor shape");
      LLM_CHECK(ne >= 1 && ne <= uint64_t(std::numeric_limits<int64_t>::max()), LLM_ERR_FORMAT,
                "gguf: tensor '%s' dim %u is %llu", ti.name.c_str(), d, (unsigned long long)ne);
      LLM_CHECK(checked_mul(numel, int64_t(ne), &numel), LLM_ERR_FORMAT, "gguf: tensor '%s' size overflows",
                ti.name.c_str());
      ti.ne.push_back(int64_t(ne));
    }
    const uint32_t type = cur.read<uint32_t>("tensor type");
    ti.type = GgmlType(type);
    TypeTraits tt;
    LLM_CHECK(type_traits(ti.type, &tt), LLM_ERR_UNSUPPORTED, "gguf: tensor '%s' has unsupported type %u",
              ti.name.c_str(), type);
    LLM_CHECK(ti.ne[0] % tt.block == 0, LLM_ERR_FORMAT, "gguf: tensor '%s' row of %lld is not a multiple of the %s block %lld",
              ti.name.c_str(), (long long)ti.ne[0], tt.name, (long long)tt.block);
    ti.nbytes = ggml_type_size(ti.type, numel);
    LLM_CHECK(ti.nbytes != 0, LLM_ERR_FORMAT, "gguf: tensor '%s' byte size overflows", ti.name.c_str());
    ti.offset = cur.read<uint64_t>("tensor offset");
    LLM_CHECK(ti.offset % g.alignment == 0, LLM_ERR_FORMAT, "gguf: tensor '%s' offset %llu is not aligned to %u",
              ti.name.c_str(), (unsigned long long)ti.offset, g.alignment);
    ti.data = nullptr;
    g.tensors.push_back(std::move(ti));
  }

  // Data section: the first aligned offset after the tensor infos.
  const size_t info_end = cur.pos();
  const size_t data_start = info_end + (g.alignment - info_end % g.alignment) % g.alignment;
  if (n_tensors == 0) return g;  // vocab-only files may stop right after the metadata
  const bool have_data = data_start <= size;
  LLM_CHECK(have_data || vocab_only, LLM_ERR_FORMAT, "gguf: data section at %zu is past the end (%zu bytes)",
            data_start, size);
  const uint64_t data_size = have_data ? size - data_start : 0;
  for (auto& ti : g.tensors) {
    const bool inside = ti.offset <= data_size && ti.nbytes <= data_size - ti.offset;
    if (!inside) {
      // A vocab-only reader does not need the weights; leave them unresolved.
      LLM_CHECK(vocab_only, LLM_ERR_FORMAT, "gguf: tensor '%s' (%zu bytes at %llu) lies outside the %llu-byte data section",
                ti.name.c_str(), ti.nbytes, (unsigned long long)ti.offset, (unsigned long long)data_size);
      continue;
    }
    ti.data = data + data_start + ti.offset;
  }
  return g;
}

// --- gguf_to_model_source ----------------------------------------------------

namespace {

const GgufValue* find_kind(const GgufFile& g, const std::string& key, bool (*ok)(const GgufValue&),
                           const char* expected) {
  const GgufValue* v = g.get(key);
  if (v && !ok(*v)) fail(LLM_ERR_FORMAT, "gguf: '%s' should be %s, found %s", key.c_str(), expected, kind_name(v->kind));
  return v;
}

bool is_int(const GgufValue& v) {
  switch (v.kind) {
    case GgufValue::U8: case GgufValue::I8: case GgufValue::U16: case GgufValue::I16: case GgufValue::U32:
    case GgufValue::I32: case GgufValue::U64: case GgufValue::I64: return true;
    default: return false;
  }
}
bool is_number(const GgufValue& v) { return is_int(v) || v.kind == GgufValue::F32 || v.kind == GgufValue::F64; }
bool is_string(const GgufValue& v) { return v.kind == GgufValue::STRING; }
bool is_bool(const GgufValue& v) { return v.kind == GgufValue::BOOL; }
bool is_array(const GgufValue& v) { return v.kind == GgufValue::ARRAY; }

// Integer in [lo, hi]; `def` when absent and not required.
int64_t get_int(const GgufFile& g, const std::string& key, int64_t lo, int64_t hi, bool required, int64_t def) {
  const GgufValue* v = find_kind(g, key, is_int, "an integer");
  if (!v) {
    LLM_CHECK(!required, LLM_ERR_FORMAT, "gguf: missing '%s'", key.c_str());
    return def;
  }
  const int64_t x = v->as_int();
  LLM_CHECK(x >= lo && x <= hi, LLM_ERR_FORMAT, "gguf: '%s' = %lld is out of range [%lld, %lld]", key.c_str(),
            (long long)x, (long long)lo, (long long)hi);
  return x;
}

double get_float(const GgufFile& g, const std::string& key, bool required, double def) {
  const GgufValue* v = find_kind(g, key, is_number, "a number");
  if (!v) {
    LLM_CHECK(!required, LLM_ERR_FORMAT, "gguf: missing '%s'", key.c_str());
    return def;
  }
  const double x = v->as_float();
  LLM_CHECK(std::isfinite(x), LLM_ERR_FORMAT, "gguf: '%s' is not finite", key.c_str());
  return x;
}

const GgufValue* get_array(const GgufFile& g, const std::string& key, GgufValue::Kind elem, bool numeric_ok) {
  const GgufValue* v = find_kind(g, key, is_array, "an array");
  if (!v) return nullptr;
  if (numeric_ok) {
    GgufValue probe;
    probe.kind = v->elem_kind;
    LLM_CHECK(is_number(probe), LLM_ERR_FORMAT, "gguf: '%s' should hold numbers, holds %s", key.c_str(),
              kind_name(v->elem_kind));
  } else {
    LLM_CHECK(v->elem_kind == elem, LLM_ERR_FORMAT, "gguf: '%s' should hold %s, holds %s", key.c_str(),
              kind_name(elem), kind_name(v->elem_kind));
  }
  return v;
}

VocabData read_vocab(const GgufFile& g, const Logger* log) {
  VocabData vd;
  const GgufValue* model = find_kind(g, "tokenizer.ggml.model", is_string, "a string");
  LLM_CHECK(model != nullptr, LLM_ERR_FORMAT, "gguf: missing 'tokenizer.ggml.model'");
  vd.model = model->s;
  LLM_CHECK(vd.model == "llama" || vd.model == "gpt2" || vd.model == "gemma4", LLM_ERR_UNSUPPORTED,
            "gguf: tokenizer model '%s' is not supported (llama, gpt2, gemma4)", vd.model.c_str());
  if (const GgufValue* pre = find_kind(g, "tokenizer.ggml.pre", is_string, "a string")) vd.pre = pre->s;

  const GgufValue* tokens = get_array(g, "tokenizer.ggml.tokens", GgufValue::STRING, false);
  LLM_CHECK(tokens != nullptr && !tokens->arr.empty(), LLM_ERR_FORMAT, "gguf: missing 'tokenizer.ggml.tokens'");
  LLM_CHECK(tokens->arr.size() <= size_t(std::numeric_limits<int32_t>::max()), LLM_ERR_FORMAT, "gguf: vocabulary too large");
  const size_t n = tokens->arr.size();
  vd.tokens.reserve(n);
  for (const auto& t : tokens->arr) vd.tokens.push_back(t.s);

  if (const GgufValue* scores = get_array(g, "tokenizer.ggml.scores", GgufValue::F32, true)) {
    LLM_CHECK(scores->arr.size() == n, LLM_ERR_FORMAT, "gguf: %zu scores for %zu tokens", scores->arr.size(), n);
    vd.scores.reserve(n);
    for (const auto& s : scores->arr) vd.scores.push_back(float(s.as_float()));
  }
  if (const GgufValue* types = get_array(g, "tokenizer.ggml.token_type", GgufValue::I32, true)) {
    LLM_CHECK(types->arr.size() == n, LLM_ERR_FORMAT, "gguf: %zu token types for %zu tokens", types->arr.size(), n);
    vd.types.reserve(n);
    for (const auto& t : types->arr) {
      const int64_t x = t.as_int();
      LLM_CHECK(x >= 0 && x <= int64_t(TokenType::Byte), LLM_ERR_FORMAT, "gguf: token type %lld", (long long)x);
      vd.types.push_back(int32_t(x));
    }
  }
  if (const GgufValue* merges = get_array(g, "tokenizer.ggml.merges", GgufValue::STRING, false)) {
    vd.merges.reserve(merges->arr.size());
    for (const auto& m : merges->arr) vd.merges.push_back(m.s);
  }

  const int64_t hi = int64_t(n) - 1;
  auto special = [&](const char* key) {
    // Some converters write -1 (as a wrapped u32) for "none"; anything else must be a valid id.
    const GgufValue* v = find_kind(g, key, is_int, "an integer");
    if (!v) return int32_t(-1);
    if (v->kind == GgufValue::U32 && v->u == 0xffffffffu) return int32_t(-1);
    const int64_t x = v->as_int();
    if (x == -1) return int32_t(-1);
    if (x < 0 || x > hi) {
      // Real files carry ids past the vocabulary (a pad id == vocab size);
      // llama.cpp ignores them with a warning, and so do we.
      if (log) log->log(LLM_LOG_WARN, "gguf: ignoring '%s' = %lld (vocabulary of %zu)", key, (long long)x, n);
      return int32_t(-1);
    }
    return int32_t(x);
  };
  vd.bos = special("tokenizer.ggml.bos_token_id");
  vd.eos = special("tokenizer.ggml.eos_token_id");
  vd.unk = special("tokenizer.ggml.unknown_token_id");
  vd.pad = special("tokenizer.ggml.padding_token_id");
  vd.eot = special("tokenizer.ggml.eot_token_id");
  vd.eom = special("tokenizer.ggml.eom_token_id");

  // Defaults follow llama.cpp: SentencePiece models add BOS and a dummy
  // space prefix; byte-level BPE does neither unless the file says so.
  const bool spm = vd.model == "llama";
  const GgufValue* add_bos = find_kind(g, "tokenizer.ggml.add_bos_token", is_bool, "a bool");
  vd.add_bos = add_bos ? add_bos->u != 0 : spm;
  const GgufValue* add_space = find_kind(g, "tokenizer.ggml.add_space_prefix", is_bool, "a bool");
  vd.add_space_prefix = add_space ? add_space->u != 0 : spm;
  if (const GgufValue* tpl = find_kind(g, "tokenizer.chat_template", is_string, "a string")) vd.chat_template = tpl->s;
  return vd;
}

// Closest native storage for a ggml type that libllm does not execute
// directly (only Q8_1 and Q8_K are left: ggml's activation formats, which
// real model files do not use for weights). The rule: never store with less
// precision than the file had.
//   Q8_1, Q8_K                  -> Q8 (int8 per 32 keeps them within ~0.4% of a step)
//   any type, cols % 32 != 0    -> F32 (never happens for block-32/256 types, kept as a guard)
// Every other type is stored as it is (see the switch in gguf_to_model_source).
DType convert_target(GgmlType t, int64_t cols, uint32_t* group) {
  (void)t;
  *group = 32;
  if (cols % 32 != 0) {
    *group = 0;
    return DType::F32;
  }
  return DType::Q8;
}


// The family files' view of a GGUF's metadata: "<arch>.<key>".
class GgufHParams final : public HParams {
 public:
  GgufHParams(const GgufFile& g, std::string arch) : g_(g), arch_(std::move(arch)) {}
  bool has(const std::string& key) const override { return g_.get(full(key)) != nullptr; }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi, bool required, int64_t def) const override {
    return get_int(g_, full(key), lo, hi, required, def);
  }
  double number(const std::string& key, bool required, double def) const override {
    return get_float(g_, full(key), required, def);
  }
  std::vector<int64_t> integers(const std::string& key) const override {
    const std::string k = full(key);
    const GgufValue* v = g_.get(k);
    std::vector<int64_t> out;
    if (!v) return out;
    if (v->kind != GgufValue::ARRAY) {
      LLM_CHECK(is_int(*v) || is_bool(*v), LLM_ERR_FORMAT, "gguf: '%s' should be an integer or an array", k.c_str());
      out.push_back(is_bool(*v) ? int64_t(v->u != 0) : v->as_int());
      return out;
    }
    for (const GgufValue& e : v->arr) {
      LLM_CHECK(is_int(e) || is_bool(e), LLM_ERR_FORMAT, "gguf: '%s' should hold integers or bools", k.c_str());
      out.push_back(is_bool(e) ? int64_t(e.u != 0) : e.as_int());
    }
    return out;
  }
  std::string text(const std::string& key) const override {
    const GgufValue* v = find_kind(g_, full(key), is_string, "a string");
    return v ? v->s : std::string();
  }
  const std::string& arch() const override { return arch_; }

 private:
  std::string full(const std::string& key) const { return arch_ + "." + key; }
  const GgufFile& g_;
  std::string arch_;
};

}  // namespace

ModelSource gguf_to_model_source(const GgufFile& gguf, std::shared_ptr<MappedFile> file, bool vocab_only,
                                 const Logger* log) {
  ModelSource src;
  src.file = std::move(file);
  src.vocab = read_vocab(gguf, log);
  const int64_t vocab_size = int64_t(src.vocab.tokens.size());

  const GgufValue* arch_v = find_kind(gguf, "general.architecture", is_string, "a string");
  const std::string arch = arch_v ? arch_v->s : "";
  src.meta["gguf.version"] = std::to_string(gguf.version);
  for (const auto& kv : gguf.kv)
    if (kv.first.compare(0, 8, "general.") == 0 && kv.second.kind == GgufValue::STRING)
      src.meta[kv.first] = kv.second.s;

  ModelConfig& c = src.config;
  c.vocab_size = int32_t(vocab_size);
  if (vocab_only) {
    c.arch = arch.empty() ? c.arch : arch;
    return src;
  }
  LLM_CHECK(arch_v != nullptr, LLM_ERR_FORMAT, "gguf: missing 'general.architecture'");
  const Family* family = find_family(arch);
  LLM_CHECK(family != nullptr, LLM_ERR_UNSUPPORTED, "gguf: architecture '%s' is not supported (%s)", arch.c_str(),
            family_names().c_str());
  family->configure(GgufHParams(gguf, arch), c);
  if (const GgufValue* vs = gguf.get(arch + ".vocab_size")) {
    LLM_CHECK(is_int(*vs) && vs->as_int() == vocab_size, LLM_ERR_FORMAT,
              "gguf: %s.vocab_size disagrees with the %lld tokens", arch.c_str(), (long long)vocab_size);
  }

  // Every tensor is passed on; the model builder checks names and shapes
  // against the spec and refuses any tensor it would not use.
  std::unique_ptr<ThreadPool> pool;  // made only when a tensor needs converting
  for (const GgufTensorInfo& ti : gguf.tensors) {
    LLM_CHECK(ti.data != nullptr, LLM_ERR_FORMAT, "gguf: tensor '%s' has no data", ti.name.c_str());
    // ggml ne is innermost first; drop trailing 1s, then reverse.
    std::vector<int64_t> ne = ti.ne;
    while (ne.size() > 1 && ne.back() == 1) ne.pop_back();
    TensorData td;
    td.name = ti.name;
    td.shape.assign(ne.rbegin(), ne.rend());
    switch (ti.type) {
      case GgmlType::F32: td.dtype = DType::F32; break;
      case GgmlType::F16: td.dtype = DType::F16; break;
      case GgmlType::BF16: td.dtype = DType::BF16; break;
      case GgmlType::Q8_0: td.dtype = DType::Q8; td.group = 32; break;
      case GgmlType::Q4_0: td.dtype = DType::Q4; td.group = 32; break;
      case GgmlType::Q4_1: td.dtype = DType::Q4M; td.group = 32; break;
      // GGUF blocks run as stored (quant/dtype.h); group = the block. parse_gguf
      // has already refused rows that are not whole blocks (LLM_ERR_FORMAT).
      case GgmlType::Q5_0: td.dtype = DType::Q5_0; td.group = 32; break;
      case GgmlType::Q5_1: td.dtype = DType::Q5_1; td.group = 32; break;
      case GgmlType::IQ4_NL: td.dtype = DType::IQ4_NL; td.group = 32; break;
      case GgmlType::Q2_K: td.dtype = DType::Q2_K; td.group = 256; break;
      case GgmlType::Q3_K: td.dtype = DType::Q3_K; td.group = 256; break;
      case GgmlType::Q4_K: td.dtype = DType::Q4_K; td.group = 256; break;
      case GgmlType::Q5_K: td.dtype = DType::Q5_K; td.group = 256; break;
      case GgmlType::Q6_K: td.dtype = DType::Q6_K; td.group = 256; break;
      case GgmlType::IQ4_XS: td.dtype = DType::IQ4_XS; td.group = 256; break;
      default: {
        // Not a native layout: decode exactly as ggml does, re-encode.
        const int64_t cols = td.cols(), rows = td.numel() / cols;
        uint32_t group = 0;
        const DType target = convert_target(ti.type, cols, &group);
        const size_t row_bytes = dtype_row_bytes(target, cols, group);
        const size_t src_row = ggml_type_size(ti.type, cols);
        LLM_CHECK(row_bytes != 0 && src_row != 0, LLM_ERR_INTERNAL, "gguf: cannot convert '%s'", ti.name.c_str());
        LLM_CHECK(uint64_t(rows) <= std::numeric_limits<size_t>::max() / row_bytes, LLM_ERR_FORMAT,
                  "gguf: tensor '%s' too large", ti.name.c_str());
        auto owned = std::make_shared<std::vector<uint8_t>>(size_t(rows) * row_bytes);
        // Rows are independent; the arguments were validated above, so
        // neither call can throw inside a worker.
        if (!pool) pool = std::make_unique<ThreadPool>(0);
        uint8_t* out = owned->data();
        const uint8_t* in = ti.data;
        const GgmlType type = ti.type;
        pool->parallel([&](int ith, int nth) {
          int64_t r0, r1;
          ThreadPool::split(rows, ith, nth, &r0, &r1);
          std::vector<float> tmp(static_cast<size_t>(cols));
          for (int64_t r = r0; r < r1; ++r) {
            dequantize_ggml(type, in + size_t(r) * src_row, tmp.data(), cols);
            quantize_row(target, group, tmp.data(), out + size_t(r) * row_bytes, cols);
          }
        });
        if (log)
          log->log(LLM_LOG_WARN, "gguf: tensor '%s' is %s; converted to %s%s", ti.name.c_str(),
                   ggml_type_name(ti.type), dtype_name(target), group ? " (group 32)" : "");
        td.dtype = target;
        td.group = group;
        td.data = owned->data();
        td.nbytes = owned->size();
        td.owned = std::move(owned);
        src.tensors.push_back(std::move(td));
        continue;
      }
    }
    td.data = ti.data;  // zero copy: src.file keeps the mapping alive
    td.nbytes = ti.nbytes;
    LLM_CHECK(td.nbytes == size_t(td.rows()) * dtype_row_bytes(td.dtype, td.cols(), td.group) ||
                  (td.shape.size() == 1 && td.nbytes == dtype_row_bytes(td.dtype, td.cols(), td.group)),
              LLM_ERR_FORMAT, "gguf: size mismatch for '%s'", ti.name.c_str());
    src.tensors.push_back(std::move(td));
  }
  c.spec.rope_factors = src.find("rope_freqs.weight") != nullptr;
  c.spec.rope_longrope = src.find("rope_factors_long.weight") != nullptr || src.find("rope_factors_short.weight") != nullptr;
  return src;
}

ModelSource read_gguf(const std::string& path, bool vocab_only, const Logger* log) {
  std::shared_ptr<MappedFile> f = MappedFile::open(path);
  GgufFile g = parse_gguf(f->data(), f->size(), vocab_only);
  return gguf_to_model_source(g, std::move(f), vocab_only, log);
}

}  // namespace llm
