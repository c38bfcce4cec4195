// The native .llm container: writer (streaming, zstd where it pays) and
// reader (validating, zero-copy for raw tensors, parallel verification and
// decompression). The byte layout is specified in docs/FORMAT.md; this file
// must agree with it field for field.
#include "format/llm_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .llm reader/writer assumes a little-endian host"
#endif

namespace llm {

namespace {

// ---------------------------------------------------------------------------
// Constants of the format (docs/FORMAT.md)

const uint8_t kMagic[8] = {0x89, 'L', 'L', 'M', '\r', '\n', 0x1A, '\n'};

// Flag bits 16..31 are "required": a reader that does not know one must refuse
// the file. Bits 0..15 are optional hints. Version 1 defines none.
constexpr uint32_t kRequiredFlagMask = 0xFFFF0000u;
constexpr uint32_t kKnownRequiredFlags = 0;

constexpr uint32_t kMaxDims = 8;
// Absurd sizes are refused before anything is allocated: no real tensor has
// a dimension of 2^31 or more, or more than 64 GiB of raw bytes (the largest
// models' embedding matrices are a few GiB).
constexpr uint64_t kMaxDimSize = (1ull << 31) - 1;
constexpr uint64_t kMaxTensorBytes = 1ull << 36;
// A zstd block holds at most 128 KiB and costs at least 4 bytes (header +
// RLE byte), so no valid frame expands more than 32768x.
constexpr uint64_t kMaxZstdRatio = 32768;
constexpr uint32_t kMaxNameLen = 1024;
constexpr uint32_t kMinChunkBytes = 64;
constexpr uint32_t kMaxChunkBytes = 1u << 30;
constexpr uint64_t kChunkIndexEntryBytes = 16;     // u64 frame size, u64 XXH3-64 of the frame
constexpr uint64_t kEntryFixedBytes = 64;          // table entry bytes before dims and name
constexpr uint32_t kMaxHeaderSize = 1u << 16;

enum MetaType : uint32_t {
  kMetaI64 = 1,
  kMetaF64 = 2,
  kMetaStr = 3,
  kMetaStrArray = 4,
  kMetaF32Array = 5,
  kMetaI32Array = 6,
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t xxh3(const void* p, size_t n) { return XXH3_64bits(p, n); }

// Bytes per element for the byte-plane codec; 0 when the dtype has no
// fixed-width elements (quantized blocks).
uint32_t plane_width(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    default: return 0;
  }
}

// Byte-plane split of little-endian elements: the most significant byte of
// every element first, then the next one, ... For f16/bf16 the high plane
// holds sign+exponent(+top mantissa bits), which compresses far better on
// its own than interleaved with the noisy low bytes.
void split_planes(const uint8_t* src, size_t n_bytes, uint32_t width, uint8_t* dst) {
  const size_t n = n_bytes / width;
  for (uint32_t p = 0; p < width; ++p) {
    const uint32_t b = width - 1 - p;
    uint8_t* out = dst + p * n;
    for (size_t i = 0; i < n; ++i) out[i] = src[i * width + b];
  }
}

void join_planes(const uint8_t* src, size_t n_bytes, uint32_t width, uint8_t* dst) {
  const size_t n = n_bytes / width;
  for (uint32_t p = 0; p < width; ++p) {
    const uint32_t b = width - 1 - p;
    const uint8_t* in = src + p * n;
    for (size_t i = 0; i < n; ++i) dst[i * width + b] = in[i];
  }
}

// ---------------------------------------------------------------------------
// Little-endian serialisation

class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u16(uint16_t v) { put(&v, 2); }
  void u32(uint32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void i64(int64_t v) { put(&v, 8); }
  void f32(float v) { put(&v, 4); }
  void f64(double v) { put(&v, 8); }
  void bytes(const void* p, size_t n) { put(p, n); }
  void zeros(size_t n) { buf_.resize(buf_.size() + n, 0); }
  void patch_u32(size_t at, uint32_t v) { std::memcpy(buf_.data() + at, &v, 4); }
  void patch_u64(size_t at, uint64_t v) { std::memcpy(buf_.data() + at, &v, 8); }
  size_t size() const { return buf_.size(); }
  std::vector<uint8_t>& buf() { return buf_; }

 private:
  void put(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<uint8_t> buf_;
};

// Bounds-checked reader over an untrusted byte range; every overrun is
// LLM_ERR_FORMAT naming the section.
class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n, const char* what) : p_(p), n_(n), what_(what) {}
  size_t remaining() const { return n_ - pos_; }
  size_t pos() const { return pos_; }
  const uint8_t* here() const { return p_ + pos_; }
  void need(uint64_t k) const {
    if (k > remaining())
      fail(LLM_ERR_FORMAT, ".llm %s: truncated (need %llu bytes at offset %zu, %zu left)", what_,
           (unsigned long long)k, pos_, remaining());
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  const uint8_t* take(uint64_t k) {
    need(k);
    const uint8_t* r = p_ + pos_;
    pos_ += size_t(k);
    return r;
  }
  void skip(uint64_t k) { take(k); }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const char* what_;
};

// ---------------------------------------------------------------------------
// Metadata

struct MetaEncoder {
  ByteWriter w;
  uint32_t count = 0;
  MetaEncoder() { w.u32(0); }
  size_t begin(const std::string& key, MetaType type) {
    ++count;
    w.u32(uint32_t(key.size()));
    w.bytes(key.data(), key.size());
    w.u32(type);
    const size_t at = w.size();
    w.u64(0);  // payload size, patched by end()
    return at;
  }
  void end(size_t at) { w.patch_u64(at, uint64_t(w.size() - at - 8)); }
  void i64(const std::string& k, int64_t v) {
    size_t at = begin(k, kMetaI64);
    w.i64(v);
    end(at);
  }
  void f64(const std::string& k, double v) {
    size_t at = begin(k, kMetaF64);
    w.f64(v);
    end(at);
  }
  void str(const std::string& k, const std::string& v) {
    size_t at = begin(k, kMetaStr);
    w.bytes(v.data(), v.size());
    end(at);
  }
  void strs(const std::string& k, const std::vector<std::string>& v) {
    size_t at = begin(k, kMetaStrArray);
    w.u64(v.size());
    for (const auto& s : v) {
      w.u32(uint32_t(s.size()));
      w.bytes(s.data(), s.size());
    }
    end(at);
  }
  void f32s(const std::string& k, const std::vector<float>& v) {
    size_t at = begin(k, kMetaF32Array);
    w.u64(v.size());
    w.bytes(v.data(), v.size() * 4);
    end(at);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    size_t at = begin(k, kMetaI32Array);
    w.u64(v.size());
    w.bytes(v.data(), v.size() * 4);
    end(at);
  }
  std::vector<uint8_t> finish() {
    w.patch_u32(0, count);
    return std::move(w.buf());
  }
};

std::vector<uint8_t> encode_metadata(const ModelConfig& c, const VocabData& v,
                                     const std::map<std::string, std::string>& meta) {
  for (const auto& s : v.tokens)
    LLM_CHECK(s.size() <= 0xFFFFFFFFu, LLM_ERR_INVALID_ARGUMENT, "token too long");
  MetaEncoder e;
  e.str("config.arch", c.arch);
  e.i64("config.dim", c.dim);
  e.i64("config.hidden_dim", c.hidden_dim);
  e.i64("config.n_layers", c.n_layers);
  e.i64("config.n_heads", c.n_heads);
  e.i64("config.n_kv_heads", c.n_kv_heads);
  e.i64("config.head_dim", c.head_dim);
  e.i64("config.vocab_size", c.vocab_size);
  e.i64("config.seq_len", c.seq_len);
  e.f64("config.rope_theta", c.rope_theta);
  e.f64("config.norm_eps", c.norm_eps);
  // The block spec (model/family.h). Readers before these keys existed refuse
  // every family but llama by config.arch; a llama with a non-default spec
  // (RoPE factors, biases) is refused by its extra tensors there.
  const BlockSpec& b = c.spec;
  e.i64("spec.rope_kind", int64_t(b.rope_kind));
  e.i64("spec.rope_dims", b.rope_dims);
  e.f64("spec.rope_base_local", b.rope_base_local);
  e.f64("spec.rope_freq_scale", b.rope_freq_scale);
  e.f64("spec.rope_freq_scale_local", b.rope_freq_scale_local);
  e.i64("spec.rope_factors", b.rope_factors ? 1 : 0);
  e.f64("spec.attn_scale", b.attn_scale);
  e.f64("spec.attn_softcap", b.attn_softcap);
  e.f64("spec.final_softcap", b.final_softcap);
  e.i64("spec.act", int64_t(b.act));
  e.f64("spec.embed_scale", b.embed_scale);
  e.f64("spec.norm_offset", b.norm_offset);
  e.i64("spec.qk_norm", b.qk_norm ? 1 : 0);
  e.i64("spec.post_norms", b.post_norms ? 1 : 0);
  e.i32s("spec.window", b.window);
  e.str("vocab.model", v.model);
  e.str("vocab.pre", v.pre);
  e.strs("vocab.tokens", v.tokens);
  e.f32s("vocab.scores", v.scores);
  e.i32s("vocab.types", v.types);
  e.strs("vocab.merges", v.merges);
  e.i64("vocab.bos", v.bos);
  e.i64("vocab.eos", v.eos);
  e.i64("vocab.unk", v.unk);
  e.i64("vocab.pad", v.pad);
  e.i64("vocab.eot", v.eot);
  e.i64("vocab.eom", v.eom);
  e.i64("vocab.add_bos", v.add_bos ? 1 : 0);
  e.i64("vocab.add_space_prefix", v.add_space_prefix ? 1 : 0);
  if (!v.chat_template.empty()) e.str("vocab.chat_template", v.chat_template);
  for (const auto& kv : meta) e.str("meta." + kv.first, kv.second);
  return e.finish();
}

// Decodes the metadata section into src's config, vocab and meta. Unknown
// keys (and unknown value types of unknown keys) are skipped.
void decode_metadata(const uint8_t* data, size_t size, ModelSource* src) {
  ByteReader r(data, size, "metadata");
  const uint32_t n = r.u32();
  LLM_CHECK(uint64_t(n) * 16 <= r.remaining(), LLM_ERR_FORMAT, ".llm metadata: %u entries cannot fit in %zu bytes",
            n, r.remaining());
  ModelConfig& c = src->config;
  VocabData& v = src->vocab;
  std::set<std::string> seen;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t key_len = r.u32();
    LLM_CHECK(key_len > 0 && key_len <= 4096, LLM_ERR_FORMAT, ".llm metadata: entry %u has key length %u", i,
              key_len);
    const std::string key(reinterpret_cast<const char*>(r.take(key_len)), key_len);
    const uint32_t type = r.u32();
    const uint64_t payload_size = r.u64();
    ByteReader p(r.take(payload_size), size_t(payload_size), "metadata value");
    const char* k = key.c_str();

    auto want = [&](MetaType t) {
      LLM_CHECK(type == t, LLM_ERR_FORMAT, ".llm metadata: '%s' has type %u, expected %u", k, type, unsigned(t));
    };
    auto get_i64 = [&]() {
      want(kMetaI64);
      LLM_CHECK(payload_size == 8, LLM_ERR_FORMAT, ".llm metadata: '%s' has size %llu", k,
                (unsigned long long)payload_size);
      return p.get<int64_t>();
    };
    auto get_i32 = [&](int64_t lo) {
      const int64_t x = get_i64();
      LLM_CHECK(x >= lo && x <= std::numeric_limits<int32_t>::max(), LLM_ERR_FORMAT,
                ".llm metadata: '%s' = %lld out of range", k, (long long)x);
      return int32_t(x);
    };
    auto get_f32 = [&]() {
      want(kMetaF64);
      LLM_CHECK(payload_size == 8, LLM_ERR_FORMAT, ".llm metadata: '%s' has size %llu", k,
                (unsigned long long)payload_size);
      const double d = p.get<double>();
      LLM_CHECK(std::isfinite(d), LLM_ERR_FORMAT, ".llm metadata: '%s' is not finite", k);
      return float(d);
    };
    auto get_str = [&]() {
      want(kMetaStr);
      return std::string(reinterpret_cast<const char*>(p.take(payload_size)), size_t(payload_size));
    };
    auto get_strs = [&]() {
      want(kMetaStrArray);
      const uint64_t count = p.u64();
      LLM_CHECK(count <= p.remaining() / 4, LLM_ERR_FORMAT, ".llm metadata: '%s' claims %llu strings", k,
                (unsigned long long)count);
      std::vector<std::string> out;
      out.reserve(size_t(count));
      for (uint64_t j = 0; j < count; ++j) {
        const uint32_t len = p.u32();
        out.emplace_back(reinterpret_cast<const char*>(p.take(len)), len);
      }
      LLM_CHECK(p.remaining() == 0, LLM_ERR_FORMAT, ".llm metadata: '%s' has trailing bytes", k);
      return out;
    };
    auto get_arr32 = [&](MetaType t) {  // returns the element count; values follow in p
      want(t);
      const uint64_t count = p.u64();
      LLM_CHECK(count == p.remaining() / 4 && p.remaining() % 4 == 0, LLM_ERR_FORMAT,
                ".llm metadata: '%s' claims %llu values in %zu bytes", k, (unsigned long long)count, p.remaining());
      return count;
    };

    if (key.compare(0, 5, "meta.") == 0) {
      if (type == kMetaStr) src->meta[key.substr(5)] = get_str();
      continue;
    }
    LLM_CHECK(seen.insert(key).second, LLM_ERR_FORMAT, ".llm metadata: duplicate key '%s'", k);
    if (key == "config.arch") c.arch = get_str();
    else if (key == "config.dim") c.dim = get_i32(0);
    else if (key == "config.hidden_dim") c.hidden_dim = get_i32(0);
    else if (key == "config.n_layers") c.n_layers = get_i32(0);
    else if (key == "config.n_heads") c.n_heads = get_i32(0);
    else if (key == "config.n_kv_heads") c.n_kv_heads = get_i32(0);
    else if (key == "config.head_dim") c.head_dim = get_i32(0);
    else if (key == "config.vocab_size") c.vocab_size = get_i32(0);
    else if (key == "config.seq_len") c.seq_len = get_i32(0);
    else if (key == "config.rope_theta") c.rope_theta = get_f32();
    else if (key == "config.norm_eps") c.norm_eps = get_f32();
    else if (key == "spec.rope_kind") c.spec.rope_kind = RopeKind(get_i32(0));
    else if (key == "spec.rope_dims") c.spec.rope_dims = get_i32(0);
    else if (key == "spec.rope_base_local") c.spec.rope_base_local = get_f32();
    else if (key == "spec.rope_freq_scale") c.spec.rope_freq_scale = get_f32();
    else if (key == "spec.rope_freq_scale_local") c.spec.rope_freq_scale_local = get_f32();
    else if (key == "spec.rope_factors") c.spec.rope_factors = get_i64() != 0;
    else if (key == "spec.attn_scale") c.spec.attn_scale = get_f32();
    else if (key == "spec.attn_softcap") c.spec.attn_softcap = get_f32();
    else if (key == "spec.final_softcap") c.spec.final_softcap = get_f32();
    else if (key == "spec.act") c.spec.act = Activation(get_i32(0));
    else if (key == "spec.embed_scale") c.spec.embed_scale = get_f32();
    else if (key == "spec.norm_offset") c.spec.norm_offset = get_f32();
    else if (key == "spec.qk_norm") c.spec.qk_norm = get_i64() != 0;
    else if (key == "spec.post_norms") c.spec.post_norms = get_i64() != 0;
    else if (key == "spec.window") {
      const uint64_t count = get_arr32(kMetaI32Array);
      c.spec.window.resize(size_t(count));
      if (count) std::memcpy(c.spec.window.data(), p.take(count * 4), size_t(count) * 4);
    }
    else if (key == "vocab.model") v.model = get_str();
    else if (key == "vocab.pre") v.pre = get_str();
    else if (key == "vocab.tokens") v.tokens = get_strs();
    else if (key == "vocab.merges") v.merges = get_strs();
    else if (key == "vocab.scores") {
      const uint64_t count = get_arr32(kMetaF32Array);
      v.scores.resize(size_t(count));
      if (count) std::memcpy(v.scores.data(), p.take(count * 4), size_t(count) * 4);
    } else if (key == "vocab.types") {
      const uint64_t count = get_arr32(kMetaI32Array);
      v.types.resize(size_t(count));
      if (count) std::memcpy(v.types.data(), p.take(count * 4), size_t(count) * 4);
    }
    else if (key == "vocab.bos") v.bos = get_i32(-1);
    else if (key == "vocab.eos") v.eos = get_i32(-1);
    else if (key == "vocab.unk") v.unk = get_i32(-1);
    else if (key == "vocab.pad") v.pad = get_i32(-1);
    else if (key == "vocab.eot") v.eot = get_i32(-1);
    else if (key == "vocab.eom") v.eom = get_i32(-1);
    else if (key == "vocab.add_bos") v.add_bos = get_i64() != 0;
    else if (key == "vocab.add_space_prefix") v.add_space_prefix = get_i64() != 0;
    else if (key == "vocab.chat_template") v.chat_template = get_str();
    // Anything else: a key from a later writer; ignored.
  }
  LLM_CHECK(r.remaining() == 0, LLM_ERR_FORMAT, ".llm metadata: %zu trailing bytes", r.remaining());
  static const char* const kRequired[] = {"config.arch",     "config.dim",        "config.hidden_dim",
                                          "config.n_layers", "config.n_heads",    "config.n_kv_heads",
                                          "config.head_dim", "config.vocab_size", "config.seq_len"};
  for (const char* key : kRequired)
    LLM_CHECK(seen.count(key), LLM_ERR_FORMAT, ".llm metadata: required key '%s' is missing", key);
  const size_t nt = v.tokens.size();
  LLM_CHECK(v.scores.empty() || v.scores.size() == nt, LLM_ERR_FORMAT,
            ".llm metadata: %zu scores for %zu tokens", v.scores.size(), nt);
  LLM_CHECK(v.types.empty() || v.types.size() == nt, LLM_ERR_FORMAT, ".llm metadata: %zu token types for %zu tokens",
            v.types.size(), nt);
  for (int32_t id : {v.bos, v.eos, v.unk, v.pad, v.eot, v.eom})
    LLM_CHECK(id < 0 || size_t(id) < nt, LLM_ERR_FORMAT, ".llm metadata: special token id %d outside the vocab (%zu)",
              id, nt);
}

// ---------------------------------------------------------------------------
// Tensor table

uint64_t entry_size(size_t n_dims, size_t name_len) {
  return align_up(kEntryFixedBytes + 8 * n_dims + 4 + name_len, 8);
}

void encode_entry(ByteWriter& w, const LlmTableEntry& e) {
  const size_t start = w.size();
  const uint64_t size = entry_size(e.shape.size(), e.name.size());
  w.u32(uint32_t(size));
  w.u32(uint32_t(e.dtype));
  w.u32(e.group);
  w.u32(uint32_t(e.codec));
  w.u32(uint32_t(e.shape.size()));
  w.u32(e.chunk_bytes);
  w.u64(e.n_chunks);
  w.u64(e.offset);
  w.u64(e.stored_size);
  w.u64(e.raw_size);
  w.u64(e.checksum);
  for (int64_t d : e.shape) w.u64(uint64_t(d));
  w.u32(uint32_t(e.name.size()));
  w.bytes(e.name.data(), e.name.size());
  w.zeros(size_t(start + size - w.size()));
}

// Expected bytes of a tensor: 0 if the dtype/group/shape combination is invalid.
uint64_t tensor_raw_bytes(DType dtype, uint32_t group, const std::vector<int64_t>& shape) {
  if (shape.empty()) return 0;
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0 || uint64_t(d) > kMaxDimSize) return 0;
    if (numel > kMaxTensorBytes / uint64_t(d)) return 0;
    numel *= uint64_t(d);
  }
  const int64_t cols = shape.back();
  const uint64_t rows = numel / uint64_t(cols);
  const size_t row = dtype_row_bytes(dtype, cols, group);
  if (row == 0 || rows > kMaxTensorBytes / row) return 0;
  return rows * row;
}

struct Header {
  uint16_t major = 0, minor = 0;
  uint32_t header_size = 0, flags = 0, alignment = 0;
  uint64_t file_size = 0;
  uint64_t meta_offset = 0, meta_size = 0, meta_checksum = 0;
  uint64_t table_offset = 0, table_size = 0, table_checksum = 0;
  uint64_t n_tensors = 0;
  uint64_t data_offset = 0, data_size = 0;
};

std::vector<uint8_t> encode_header(const Header& h) {
  ByteWriter w;
  w.bytes(kMagic, 8);
  w.u16(h.major);
  w.u16(h.minor);
  w.u32(kLlmHeaderSize);
  w.u32(h.flags);
  w.u32(h.alignment);
  w.u64(h.file_size);
  w.u64(h.meta_offset);
  w.u64(h.meta_size);
  w.u64(h.meta_checksum);
  w.u64(h.table_offset);
  w.u64(h.table_size);
  w.u64(h.table_checksum);
  w.u64(h.n_tensors);
  w.u64(h.data_offset);
  w.u64(h.data_size);
  w.zeros(kLlmHeaderSize - 8 - w.size());
  w.u64(xxh3(w.buf().data(), w.size()));
  return std::move(w.buf());
}

bool region_ok(uint64_t off, uint64_t len, uint64_t lo, uint64_t hi) {
  return off >= lo && off <= hi && len <= hi - off;
}

// Validates header, metadata and table; fills info. Parses the metadata into
// `src` when given.
LlmFileInfo inspect_impl(const uint8_t* d, size_t n, bool with_table, ModelSource* src) {
  LLM_CHECK(n >= 8 && std::memcmp(d, kMagic, 8) == 0, LLM_ERR_FORMAT, "not a .llm file (bad magic)");
  LLM_CHECK(n >= 16, LLM_ERR_FORMAT, ".llm: file truncated inside the header");
  ByteReader pre(d, n, "header");
  pre.skip(8);
  Header h;
  h.major = pre.get<uint16_t>();
  h.minor = pre.get<uint16_t>();
  h.header_size = pre.u32();
  // The prefix (magic, version, header_size) and the trailing header checksum
  // are the same in every version, so corruption is told apart from a newer file.
  LLM_CHECK(h.header_size >= 24 && h.header_size <= kMaxHeaderSize && h.header_size % 8 == 0, LLM_ERR_FORMAT,
            ".llm: bad header size %u", h.header_size);
  LLM_CHECK(h.header_size <= n, LLM_ERR_FORMAT, ".llm: file truncated inside the header (%zu bytes)", n);
  uint64_t stored_sum;
  std::memcpy(&stored_sum, d + h.header_size - 8, 8);
  LLM_CHECK(xxh3(d, h.header_size - 8) == stored_sum, LLM_ERR_CHECKSUM, ".llm: header checksum mismatch");
  LLM_CHECK(h.major != 0, LLM_ERR_FORMAT, ".llm: version 0 does not exist");
  LLM_CHECK(h.major <= kLlmVersionMajor, LLM_ERR_UNSUPPORTED,
            ".llm: file format version %u.%u is newer than this library reads (%u.x)", h.major, h.minor,
            kLlmVersionMajor);
  LLM_CHECK(h.header_size >= kLlmHeaderSize, LLM_ERR_FORMAT, ".llm: header size %u < %u", h.header_size,
            kLlmHeaderSize);
  ByteReader r(d, h.header_size, "header");
  r.skip(16);
  h.flags = r.u32();
  h.alignment = r.u32();
  h.file_size = r.u64();
  h.meta_offset = r.u64();
  h.meta_size = r.u64();
  h.meta_checksum = r.u64();
  h.table_offset = r.u64();
  h.table_size = r.u64();
  h.table_checksum = r.u64();
  h.n_tensors = r.u64();
  h.data_offset = r.u64();
  h.data_size = r.u64();
  LLM_CHECK((h.flags & kRequiredFlagMask & ~kKnownRequiredFlags) == 0, LLM_ERR_UNSUPPORTED,
            ".llm: file needs features this library lacks (flags 0x%08x)", h.flags);
  LLM_CHECK(h.file_size == n, LLM_ERR_FORMAT, ".llm: file is %zu bytes but its header says %llu (%s)", n,
            (unsigned long long)h.file_size, n < h.file_size ? "truncated" : "trailing bytes");
  LLM_CHECK(h.alignment >= 16 && h.alignment <= 65536 && (h.alignment & (h.alignment - 1)) == 0, LLM_ERR_FORMAT,
            ".llm: bad alignment %u", h.alignment);
  LLM_CHECK(region_ok(h.meta_offset, h.meta_size, h.header_size, n), LLM_ERR_FORMAT,
            ".llm: metadata [%llu, +%llu) outside the file", (unsigned long long)h.meta_offset,
            (unsigned long long)h.meta_size);
  LLM_CHECK(region_ok(h.table_offset, h.table_size, h.header_size, n), LLM_ERR_FORMAT,
            ".llm: tensor table [%llu, +%llu) outside the file", (unsigned long long)h.table_offset,
            (unsigned long long)h.table_size);
  LLM_CHECK(region_ok(h.data_offset, h.data_size, h.header_size, n) && h.data_offset % h.alignment == 0,
            LLM_ERR_FORMAT, ".llm: data region [%llu, +%llu) outside the file or misaligned",
            (unsigned long long)h.data_offset, (unsigned long long)h.data_size);

  LlmFileInfo info;
  info.version_major = h.major;
  info.version_minor = h.minor;
  info.flags = h.flags;
  info.meta_offset = h.meta_offset;
  info.meta_size = h.meta_size;
  info.table_offset = h.table_offset;
  info.table_size = h.table_size;
  info.data_offset = h.data_offset;
  info.data_size = h.data_size;

  LLM_CHECK(xxh3(d + h.meta_offset, size_t(h.meta_size)) == h.meta_checksum, LLM_ERR_CHECKSUM,
            ".llm: metadata checksum mismatch");
  ModelSource scratch;
  decode_metadata(d + h.meta_offset, size_t(h.meta_size), src ? src : &scratch);
  if (!with_table) return info;

  LLM_CHECK(xxh3(d + h.table_offset, size_t(h.table_size)) == h.table_checksum, LLM_ERR_CHECKSUM,
            ".llm: tensor table checksum mismatch");
  LLM_CHECK(h.n_tensors <= h.table_size / entry_size(1, 1), LLM_ERR_FORMAT,
            ".llm: %llu tensors cannot fit in a %llu-byte table", (unsigned long long)h.n_tensors,
            (unsigned long long)h.table_size);
  ByteReader t(d + h.table_offset, size_t(h.table_size), "tensor table");
  info.tensors.reserve(size_t(h.n_tensors));
  std::set<std::string> names;
  for (uint64_t i = 0; i < h.n_tensors; ++i) {
    const size_t start = t.pos();
    const uint32_t esize = t.u32();
    LLM_CHECK(esize >= kEntryFixedBytes && esize - 4 <= t.remaining(), LLM_ERR_FORMAT,
              ".llm: tensor table entry %llu has bad size %u", (unsigned long long)i, esize);
    ByteReader e(d + h.table_offset + start, esize, "tensor table entry");
    e.skip(4);
    LlmTableEntry te;
    const uint32_t dtype = e.u32();
    te.group = e.u32();
    const uint32_t codec = e.u32();
    const uint32_t n_dims = e.u32();
    te.chunk_bytes = e.u32();
    te.n_chunks = e.u64();
    te.offset = e.u64();
    te.stored_size = e.u64();
    te.raw_size = e.u64();
    te.checksum = e.u64();
    LLM_CHECK(n_dims >= 1 && n_dims <= kMaxDims, LLM_ERR_FORMAT, ".llm: tensor %llu has %u dimensions",
              (unsigned long long)i, n_dims);
    te.shape.resize(n_dims);
    for (uint32_t j = 0; j < n_dims; ++j) {
      const uint64_t dim = e.u64();
      LLM_CHECK(dim >= 1 && dim <= kMaxDimSize, LLM_ERR_FORMAT, ".llm: tensor %llu has dimension %llu",
                (unsigned long long)i, (unsigned long long)dim);
      te.shape[j] = int64_t(dim);
    }
    const uint32_t name_len = e.u32();
    LLM_CHECK(name_len >= 1 && name_len <= kMaxNameLen, LLM_ERR_FORMAT, ".llm: tensor %llu has name length %u",
              (unsigned long long)i, name_len);
    te.name.assign(reinterpret_cast<const char*>(e.take(name_len)), name_len);
    t.skip(esize - 4);
    const char* nm = te.name.c_str();
    LLM_CHECK(names.insert(te.name).second, LLM_ERR_FORMAT, ".llm: duplicate tensor '%s'", nm);
    LLM_CHECK(dtype < kDTypeCount, LLM_ERR_UNSUPPORTED, ".llm: tensor '%s' has unknown dtype %u", nm, dtype);
    LLM_CHECK(codec <= uint32_t(LlmCodec::ZstdPlanes), LLM_ERR_UNSUPPORTED, ".llm: tensor '%s' has unknown codec %u",
              nm, codec);
    te.dtype = DType(dtype);
    te.codec = LlmCodec(codec);
    LLM_CHECK(dtype_is_quantized(te.dtype) || te.group == 0, LLM_ERR_FORMAT, ".llm: float tensor '%s' has group %u",
              nm, te.group);
    const uint64_t raw = tensor_raw_bytes(te.dtype, te.group, te.shape);
    LLM_CHECK(raw != 0, LLM_ERR_FORMAT, ".llm: tensor '%s': invalid shape/group for %s, or over 64 GiB", nm,
              dtype_name(te.dtype));
    LLM_CHECK(raw == te.raw_size, LLM_ERR_FORMAT, ".llm: tensor '%s' raw size %llu, its shape needs %llu", nm,
              (unsigned long long)te.raw_size, (unsigned long long)raw);
    LLM_CHECK(region_ok(te.offset, te.stored_size, h.data_offset, h.data_offset + h.data_size), LLM_ERR_FORMAT,
              ".llm: tensor '%s' [%llu, +%llu) lies outside the data region", nm, (unsigned long long)te.offset,
              (unsigned long long)te.stored_size);
    if (te.codec == LlmCodec::Raw) {
      LLM_CHECK(te.stored_size == te.raw_size && te.chunk_bytes == 0 && te.n_chunks == 0, LLM_ERR_FORMAT,
                ".llm: raw tensor '%s' has inconsistent sizes", nm);
      LLM_CHECK(te.offset % h.alignment == 0, LLM_ERR_FORMAT, ".llm: raw tensor '%s' is not aligned", nm);
    } else {
      LLM_CHECK(te.chunk_bytes >= kMinChunkBytes && te.chunk_bytes <= kMaxChunkBytes, LLM_ERR_FORMAT,
                ".llm: tensor '%s' has chunk size %u", nm, te.chunk_bytes);
      if (te.codec == LlmCodec::ZstdPlanes) {
        const uint32_t w = plane_width(te.dtype);
        LLM_CHECK(w != 0 && te.chunk_bytes % w == 0, LLM_ERR_FORMAT,
                  ".llm: tensor '%s': byte planes need a float dtype and whole elements per chunk", nm);
      }
      const uint64_t want_chunks = (te.raw_size + te.chunk_bytes - 1) / te.chunk_bytes;
      LLM_CHECK(te.n_chunks == want_chunks, LLM_ERR_FORMAT, ".llm: tensor '%s' has %llu chunks, expected %llu", nm,
                (unsigned long long)te.n_chunks, (unsigned long long)want_chunks);
      // Each chunk needs its index entry plus at least one frame byte.
      LLM_CHECK(te.n_chunks <= te.stored_size / (kChunkIndexEntryBytes + 1), LLM_ERR_FORMAT,
                ".llm: tensor '%s': %llu chunks cannot fit in %llu stored bytes", nm, (unsigned long long)te.n_chunks,
                (unsigned long long)te.stored_size);
    }
    info.tensors.push_back(std::move(te));
  }
  LLM_CHECK(t.remaining() == 0, LLM_ERR_FORMAT, ".llm: %zu bytes after the last table entry", t.remaining());

  // Bytes outside every checksummed region (alignment padding) must be zero,
  // so that no byte of the file can change unnoticed.
  std::vector<std::pair<uint64_t, uint64_t>> regions;  // [begin, end)
  regions.reserve(info.tensors.size() + 3);
  regions.emplace_back(0, h.header_size);
  regions.emplace_back(h.meta_offset, h.meta_offset + h.meta_size);
  regions.emplace_back(h.table_offset, h.table_offset + h.table_size);
  for (const auto& te : info.tensors) regions.emplace_back(te.offset, te.offset + te.stored_size);
  std::sort(regions.begin(), regions.end());
  uint64_t covered = 0;
  for (const auto& rg : regions) {
    for (uint64_t i = covered; i < rg.first; ++i)
      LLM_CHECK(d[i] == 0, LLM_ERR_FORMAT, ".llm: non-zero byte in padding at offset %llu", (unsigned long long)i);
    covered = std::max(covered, rg.second);
  }
  for (uint64_t i = covered; i < n; ++i)
    LLM_CHECK(d[i] == 0, LLM_ERR_FORMAT, ".llm: non-zero byte in padding at offset %llu", (unsigned long long)i);
  return info;
}

// ---------------------------------------------------------------------------
// Parallel task runner with progress, cancellation and error capture. The
// embedder's progress callback is only ever called from the calling thread.

class TaskRunner {
 public:
  TaskRunner(ThreadPool* pool, std::function<bool(float)> progress, uint64_t total_work)
      : pool_(pool), progress_(std::move(progress)), total_(total_work ? total_work : 1) {}

  int max_threads() const { return pool_ ? pool_->size() : 1; }

  // fn(i, ith) for every i in [0, n); weight(i) is added to the progress.
  template <typename Fn, typename Weight>
  void run(size_t n, Fn&& fn, Weight&& weight) {
    std::atomic<size_t> next{0};
    auto body = [&](int ith, int /*nth*/) {
      for (;;) {
        if (stop_.load(std::memory_order_relaxed)) return;
        const size_t i = next.fetch_add(1);
        if (i >= n) return;
        try {
          fn(i, ith);
        } catch (const Error& e) {
          record(e.status(), e.what());
          return;
        } catch (const std::bad_alloc&) {
          record(LLM_ERR_OUT_OF_MEMORY, "out of memory");
          return;
        } catch (const std::exception& e) {
          record(LLM_ERR_INTERNAL, e.what());
          return;
        }
        done_.fetch_add(weight(i));
        if (ith == 0) report();
      }
    };
    if (pool_ && n > 1)
      pool_->parallel(body);
    else
      body(0, 1);
    if (status_ != LLM_OK) throw Error(status_, message_);
    report();
    if (status_ != LLM_OK) throw Error(status_, message_);
  }

 private:
  void record(llm_status s, const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_ == LLM_OK) {
      status_ = s;
      message_ = msg;
    }
    stop_.store(true);
  }
  void report() {
    if (!progress_ || stop_.load()) return;
    const float f = float(std::min<double>(1.0, double(done_.load()) / double(total_)));
    if (!progress_(f)) record(LLM_ERR_CANCELLED, "loading cancelled by the progress callback");
  }

  ThreadPool* pool_;
  std::function<bool(float)> progress_;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  llm_status status_ = LLM_OK;
  std::string message_;
};

struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// One chunk of a compressed tensor, located and checked against the index.
struct ChunkTask {
  size_t tensor;
  const uint8_t* frame;
  uint64_t frame_size;
  uint64_t frame_checksum;
  uint8_t* dst;
  uint64_t raw_size;
};

// ---------------------------------------------------------------------------
// File output

class OutFile {
 public:
  explicit OutFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(LLM_ERR_IO, "cannot create '%s': %s", path.c_str(), std::strerror(errno));
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  void pwrite_all(const void* p, size_t n, uint64_t off) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, b, n, off_t(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(LLM_ERR_IO, "write to '%s' failed: %s", path_.c_str(), std::strerror(errno));
      b += w;
      n -= size_t(w);
      off += uint64_t(w);
    }
  }
  void truncate(uint64_t size) {
    if (::ftruncate(fd_, off_t(size)) != 0)
      fail(LLM_ERR_IO, "cannot resize '%s': %s", path_.c_str(), std::strerror(errno));
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(LLM_ERR_IO, "closing '%s' failed: %s", path_.c_str(), std::strerror(errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

const char* llm_codec_name(LlmCodec c) {
  switch (c) {
    case LlmCodec::Raw: return "raw";
    case LlmCodec::Zstd: return "zstd";
    case LlmCodec::ZstdPlanes: return "zstd-planes";
  }
  return "?";
}

bool is_llm_file(const uint8_t* data, size_t size) { return size >= 8 && std::memcmp(data, kMagic, 8) == 0; }

LlmFileInfo inspect_llm(const uint8_t* data, size_t size) { return inspect_impl(data, size, true, nullptr); }

// ===========================================================================
// Writer

struct LlmWriter::Impl {
  std::string path, tmp_path;
  std::unique_ptr<OutFile> out;
  bool finished = false;
  LlmWriteOptions opts;
  uint32_t chunk_bytes = 0;
  std::vector<LlmTableEntry> entries;
  size_t next = 0;
  uint64_t meta_offset = 0, meta_size = 0, meta_checksum = 0;
  uint64_t table_offset = 0, table_size = 0;
  uint64_t data_offset = 0;
  uint64_t end = 0;  // end of the data written so far
  uint64_t total_raw = 0, done_raw = 0;
  float last_progress = 0;
  std::vector<std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter>> cctx;
  std::vector<std::vector<uint8_t>> scratch;  // per thread: byte-plane buffers
  LlmWriteReport report;

  int threads() const { return opts.pool ? opts.pool->size() : 1; }

  void progress(uint64_t done) {
    if (!opts.progress) return;
    const float f = float(std::min<double>(1.0, double(done) / double(total_raw ? total_raw : 1)));
    if (f > last_progress) {
      last_progress = f;
      opts.progress(f);
    }
  }

  ZSTD_CCtx* ctx(int ith) {
    if (!cctx[size_t(ith)]) {
      cctx[size_t(ith)].reset(ZSTD_createCCtx());
      if (!cctx[size_t(ith)]) throw std::bad_alloc();
    }
    return cctx[size_t(ith)].get();
  }

  // Compresses src (raw chunk bytes) into dst; returns the frame size.
  size_t compress(int ith, LlmCodec codec, uint32_t width, const uint8_t* src, size_t n, uint8_t* dst,
                  size_t cap) {
    const uint8_t* in = src;
    if (codec == LlmCodec::ZstdPlanes) {
      std::vector<uint8_t>& s = scratch[size_t(ith)];
      if (s.size() < n) s.resize(n);
      split_planes(src, n, width, s.data());
      in = s.data();
    }
    const size_t r = ZSTD_compressCCtx(ctx(ith), dst, cap, in, n, opts.zstd_level);
    if (ZSTD_isError(r)) fail(LLM_ERR_INTERNAL, "zstd compression failed: %s", ZSTD_getErrorName(r));
    return r;
  }

  void write_raw(LlmTableEntry& e, const LlmRowSource& rows, int64_t n_rows, size_t row_bytes) {
    XXH3_state_t* st = XXH3_createState();
    if (!st) throw std::bad_alloc();
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);
    const int64_t batch = std::max<int64_t>(1, int64_t((16u << 20) / row_bytes));
    std::vector<uint8_t> buf(size_t(std::min<int64_t>(batch, n_rows)) * row_bytes);
    uint64_t off = e.offset;
    for (int64_t r = 0; r < n_rows; r += batch) {
      const int64_t k = std::min<int64_t>(batch, n_rows - r);
      const size_t nb = size_t(k) * row_bytes;
      rows(r, k, buf.data());
      XXH3_64bits_update(st, buf.data(), nb);
      out->pwrite_all(buf.data(), nb, off);
      off += nb;
      progress(done_raw + (off - e.offset));
    }
    e.codec = LlmCodec::Raw;
    e.chunk_bytes = 0;
    e.n_chunks = 0;
    e.stored_size = e.raw_size;
    e.checksum = XXH3_64bits_digest(st);
  }

  // Streams the tensor as zstd frames. Returns false (and leaves garbage
  // past e.offset, to be overwritten) when the result would not save
  // min_saving of the raw size.
  bool write_compressed(LlmTableEntry& e, const LlmRowSource& rows, int64_t n_rows, size_t row_bytes,
                        bool try_planes) {
    const uint64_t raw = e.raw_size;
    const uint64_t chunk = chunk_bytes;
    const uint64_t n_chunks = (raw + chunk - 1) / chunk;
    const uint64_t index_bytes = n_chunks * kChunkIndexEntryBytes;
    const double keep_limit = double(raw) * (1.0 - opts.min_saving);
    if (double(index_bytes) >= keep_limit) return false;
    const size_t nth = size_t(threads());
    const uint64_t batch_chunks = std::min<uint64_t>(n_chunks, 4 * nth);
    const size_t bound = ZSTD_compressBound(size_t(chunk));
    std::vector<std::vector<uint8_t>> frames(static_cast<size_t>(batch_chunks), std::vector<uint8_t>(bound));
    std::vector<size_t> frame_sizes(static_cast<size_t>(batch_chunks));
    std::vector<uint64_t> frame_sums(static_cast<size_t>(batch_chunks));
    std::vector<uint8_t> stage;
    size_t stage_len = 0;
    int64_t next_row = 0;
    ByteWriter index;
    XXH3_state_t* st = XXH3_createState();
    if (!st) throw std::bad_alloc();
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> guard(st, XXH3_freeState);
    XXH3_64bits_reset(st);

    LlmCodec codec = LlmCodec::Zstd;
    const uint32_t width = plane_width(e.dtype);
    bool codec_chosen = !try_planes;
    uint64_t pos = e.offset, consumed = 0;
    for (uint64_t c0 = 0; c0 < n_chunks; c0 += batch_chunks) {
      const uint64_t k = std::min<uint64_t>(batch_chunks, n_chunks - c0);
      const uint64_t want = std::min<uint64_t>(k * chunk, raw - c0 * chunk);
      while (stage_len < want) {
        const int64_t need_rows = int64_t((want - stage_len + row_bytes - 1) / row_bytes);
        const int64_t nr = std::min<int64_t>(n_rows - next_row, need_rows);
        LLM_CHECK(nr > 0, LLM_ERR_INTERNAL, "llm writer: ran out of rows");
        if (stage.size() < stage_len + size_t(nr) * row_bytes) stage.resize(stage_len + size_t(nr) * row_bytes);
        rows(next_row, nr, stage.data() + stage_len);
        next_row += nr;
        stage_len += size_t(nr) * row_bytes;
      }
      auto chunk_len = [&](uint64_t c) { return size_t(std::min<uint64_t>(chunk, raw - c * chunk)); };
      if (!codec_chosen) {
        // Pick plain or byte-plane zstd by trying both on the first chunk.
        const size_t n0 = chunk_len(0);
        const size_t a = compress(0, LlmCodec::Zstd, width, stage.data(), n0, frames[0].data(), bound);
        const size_t b = compress(0, LlmCodec::ZstdPlanes, width, stage.data(), n0, frames[0].data(), bound);
        codec = b < a ? LlmCodec::ZstdPlanes : LlmCodec::Zstd;
        codec_chosen = true;
      }
      TaskRunner runner(opts.pool, nullptr, 0);
      runner.run(
          size_t(k),
          [&](size_t j, int ith) {
            const uint8_t* src = stage.data() + j * chunk;
            frame_sizes[j] = compress(ith, codec, width, src, chunk_len(c0 + j), frames[j].data(), bound);
            frame_sums[j] = xxh3(frames[j].data(), frame_sizes[j]);
          },
          [](size_t) { return uint64_t(0); });
      for (uint64_t j = 0; j < k; ++j) {
        out->pwrite_all(frames[j].data(), frame_sizes[j], pos);
        XXH3_64bits_update(st, frames[j].data(), frame_sizes[j]);
        pos += frame_sizes[j];
        index.u64(frame_sizes[j]);
        index.u64(frame_sums[j]);
        consumed += chunk_len(c0 + j);
      }
      if (double(pos - e.offset + index_bytes) >= keep_limit) return false;  // cannot pay off any more
      const size_t used = size_t(want);
      std::memmove(stage.data(), stage.data() + used, stage_len - used);
      stage_len -= used;
      progress(done_raw + consumed);
    }
    out->pwrite_all(index.buf().data(), index.size(), pos);
    XXH3_64bits_update(st, index.buf().data(), index.size());
    pos += index.size();
    e.codec = codec;
    e.chunk_bytes = uint32_t(chunk);
    e.n_chunks = n_chunks;
    e.stored_size = pos - e.offset;
    e.checksum = XXH3_64bits_digest(st);
    return true;
  }
};

LlmWriter::LlmWriter(const std::string& path, const ModelConfig& config, const VocabData& vocab,
                     const std::map<std::string, std::string>& meta, std::vector<LlmTensorSpec> tensors,
                     const LlmWriteOptions& opts)
    : impl_(new Impl) {
  Impl& m = *impl_;
  m.path = path;
  m.tmp_path = path + ".tmp";
  m.opts = opts;
  LLM_CHECK(opts.min_saving >= 0 && opts.min_saving < 1, LLM_ERR_INVALID_ARGUMENT, "min_saving must be in [0, 1)");
  LLM_CHECK(opts.chunk_bytes >= 4096 && opts.chunk_bytes <= kMaxChunkBytes, LLM_ERR_INVALID_ARGUMENT,
            "chunk_bytes %u out of range [4096, 2^30]", opts.chunk_bytes);
  m.chunk_bytes = opts.chunk_bytes / 64 * 64;  // whole f32/f16 elements in every chunk
  std::set<std::string> names;
  for (auto& s : tensors) {
    const char* nm = s.name.c_str();
    LLM_CHECK(!s.name.empty() && s.name.size() <= kMaxNameLen, LLM_ERR_INVALID_ARGUMENT, "bad tensor name '%s'", nm);
    LLM_CHECK(names.insert(s.name).second, LLM_ERR_INVALID_ARGUMENT, "duplicate tensor name '%s'", nm);
    LLM_CHECK(!s.shape.empty() && s.shape.size() <= kMaxDims, LLM_ERR_INVALID_ARGUMENT, "tensor '%s': %zu dimensions",
              nm, s.shape.size());
    if (!dtype_is_quantized(s.dtype)) s.group = 0;
    LlmTableEntry e;
    e.name = s.name;
    e.dtype = s.dtype;
    e.group = s.group;
    e.shape = s.shape;
    e.raw_size = tensor_raw_bytes(s.dtype, s.group, s.shape);
    LLM_CHECK(e.raw_size != 0, LLM_ERR_INVALID_ARGUMENT, "tensor '%s': invalid shape/group for %s", nm,
              dtype_name(s.dtype));
    m.total_raw += e.raw_size;
    m.entries.push_back(std::move(e));
  }
  m.cctx.resize(size_t(m.threads()));
  m.scratch.resize(size_t(m.threads()));

  const std::vector<uint8_t> md = encode_metadata(config, vocab, meta);
  m.meta_offset = kLlmHeaderSize;
  m.meta_size = md.size();
  m.meta_checksum = xxh3(md.data(), md.size());
  m.table_offset = align_up(m.meta_offset + m.meta_size, 8);
  for (const auto& e : m.entries) m.table_size += entry_size(e.shape.size(), e.name.size());
  m.data_offset = align_up(m.table_offset + m.table_size, kLlmAlignment);
  m.end = m.data_offset;

  m.out.reset(new OutFile(m.tmp_path));
  // Header and table are written by finish(); the metadata is final now.
  try {
    m.out->pwrite_all(md.data(), md.size(), m.meta_offset);
  } catch (...) {
    m.out.reset();
    ::unlink(m.tmp_path.c_str());
    throw;
  }
}

LlmWriter::~LlmWriter() {
  if (impl_ && !impl_->finished) {
    impl_->out.reset();
    ::unlink(impl_->tmp_path.c_str());
  }
}

void LlmWriter::write_tensor(const LlmRowSource& rows) {
  Impl& m = *impl_;
  LLM_CHECK(m.next < m.entries.size(), LLM_ERR_INVALID_ARGUMENT, "write_tensor: all %zu tensors already written",
            m.entries.size());
  LlmTableEntry& e = m.entries[m.next];
  const int64_t cols = e.shape.back();
  const size_t row_bytes = dtype_row_bytes(e.dtype, cols, e.group);
  const int64_t n_rows = int64_t(e.raw_size / row_bytes);
  e.offset = align_up(m.end, kLlmAlignment);
  bool done = false;
  if (m.opts.allow_zstd) done = m.write_compressed(e, rows, n_rows, row_bytes, plane_width(e.dtype) != 0);
  if (!done) m.write_raw(e, rows, n_rows, row_bytes);
  m.end = e.offset + e.stored_size;
  m.done_raw += e.raw_size;
  m.progress(m.done_raw);

  LlmTensorReport tr;
  tr.name = e.name;
  tr.dtype = e.dtype;
  tr.codec = e.codec;
  tr.raw_bytes = e.raw_size;
  tr.stored_bytes = e.stored_size;
  m.report.raw_bytes += e.raw_size;
  m.report.stored_bytes += e.stored_size;
  auto& bd = m.report.by_dtype[dtype_name(e.dtype)];
  bd.first += e.raw_size;
  bd.second += e.stored_size;
  m.report.tensors.push_back(std::move(tr));
  ++m.next;
}

LlmWriteReport LlmWriter::finish() {
  Impl& m = *impl_;
  LLM_CHECK(!m.finished, LLM_ERR_INVALID_ARGUMENT, "finish: already finished");
  LLM_CHECK(m.next == m.entries.size(), LLM_ERR_INVALID_ARGUMENT, "finish: %zu of %zu tensors written", m.next,
            m.entries.size());
  ByteWriter table;
  for (const auto& e : m.entries) encode_entry(table, e);
  Header h;
  h.major = kLlmVersionMajor;
  h.minor = kLlmVersionMinor;
  h.flags = 0;
  h.alignment = kLlmAlignment;
  h.file_size = m.end;
  h.meta_offset = m.meta_offset;
  h.meta_size = m.meta_size;
  h.meta_checksum = m.meta_checksum;
  h.table_offset = m.table_offset;
  h.table_size = table.size();
  h.table_checksum = xxh3(table.buf().data(), table.size());
  h.n_tensors = m.entries.size();
  h.data_offset = m.data_offset;
  h.data_size = m.end - m.data_offset;
  const std::vector<uint8_t> hdr = encode_header(h);
  // Zero the gaps (alignment padding) so the file is reproducible byte for byte.
  const std::vector<uint8_t> zeros(kLlmAlignment, 0);
  const uint64_t meta_end = m.meta_offset + m.meta_size, table_end = m.table_offset + m.table_size;
  m.out->pwrite_all(zeros.data(), size_t(m.table_offset - meta_end), meta_end);
  m.out->pwrite_all(zeros.data(), size_t(m.data_offset - table_end), table_end);
  uint64_t prev_end = m.data_offset;
  for (const auto& e : m.entries) {
    m.out->pwrite_all(zeros.data(), size_t(e.offset - prev_end), prev_end);
    prev_end = e.offset + e.stored_size;
  }
  m.out->pwrite_all(table.buf().data(), table.size(), m.table_offset);
  m.out->pwrite_all(hdr.data(), hdr.size(), 0);
  m.out->truncate(m.end);
  m.out->close();
  m.out.reset();
  if (std::rename(m.tmp_path.c_str(), m.path.c_str()) != 0)
    fail(LLM_ERR_IO, "cannot rename '%s' to '%s': %s", m.tmp_path.c_str(), m.path.c_str(), std::strerror(errno));
  m.finished = true;
  m.report.file_bytes = m.end;
  if (m.opts.progress && m.last_progress < 1.0f) m.opts.progress(1.0f);
  return m.report;
}

LlmWriteReport write_llm(const ModelSource& src, const std::string& path, const LlmWriteOptions& opts) {
  std::vector<LlmTensorSpec> specs;
  specs.reserve(src.tensors.size());
  for (const auto& t : src.tensors) {
    LlmTensorSpec s;
    s.name = t.name;
    s.dtype = t.dtype;
    s.group = dtype_is_quantized(t.dtype) ? t.group : 0;
    s.shape = t.shape;
    const uint64_t want = tensor_raw_bytes(s.dtype, s.group, s.shape);
    LLM_CHECK(want != 0 && want == t.nbytes && t.data != nullptr, LLM_ERR_INVALID_ARGUMENT,
              "tensor '%s': %zu bytes, its dtype and shape need %llu", t.name.c_str(), t.nbytes,
              (unsigned long long)want);
    specs.push_back(std::move(s));
  }
  LlmWriter w(path, src.config, src.vocab, src.meta, specs, opts);
  for (const auto& t : src.tensors) {
    const size_t row_bytes = dtype_row_bytes(t.dtype, t.cols(), dtype_is_quantized(t.dtype) ? t.group : 0);
    w.write_tensor([&](int64_t row0, int64_t n, uint8_t* dst) {
      std::memcpy(dst, t.data + size_t(row0) * row_bytes, size_t(n) * row_bytes);
    });
  }
  return w.finish();
}

// ===========================================================================
// Conversion

std::string layer_tensor_kind(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return "";
  size_t i = 4;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == 4 || i >= name.size() || name[i] != '.') return "";
  return name.substr(i + 1);
}

DType wanted_llm_dtype(const std::string& name, const LlmConvertOptions& opts) {
  if (const auto over = opts.overrides.find(name); over != opts.overrides.end()) return over->second;
  if (const auto kind = opts.kind_overrides.find(layer_tensor_kind(name)); kind != opts.kind_overrides.end())
    return kind->second;
  return opts.dtype;
}

namespace {

// The group a planned format is stored with (0: not grouped).
uint32_t planned_group(DType t, uint32_t q4_group) {
  if (t == DType::Q8) return 32;
  if (dtype_is_q4(t)) return q4_group;
  return uint32_t(ggml_block_values(t));
}

// llama.cpp's format for a row that is not whole 256-value blocks
// (tensor_type_fallback in llama-quant.cpp); t itself when it has none.
DType block_fallback(DType t) {
  switch (t) {
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q5_K: return DType::Q5_1;
    case DType::Q6_K: return DType::Q8;
    default: return t;
  }
}

}  // namespace

LlmTensorSpec plan_llm_tensor(const std::string& name, const std::vector<int64_t>& shape, DType src_dtype,
                              uint32_t src_group, const LlmConvertOptions& opts, std::vector<std::string>* notes) {
  LlmTensorSpec s;
  s.name = name;
  s.shape = shape;
  if (!opts.requantize) {
    s.dtype = src_dtype;
    s.group = dtype_is_quantized(src_dtype) ? src_group : 0;
    return s;
  }
  if (shape.size() < 2) {
    s.dtype = DType::F32;
    return s;
  }
  const int64_t cols = shape.back();
  const DType want = wanted_llm_dtype(name, opts);
  const uint32_t group = planned_group(want, opts.group);
  if (dtype_row_bytes(want, cols, group) != 0) {
    s.dtype = want;
    s.group = group;
    return s;
  }
  const DType fallback = block_fallback(want);
  if (fallback != want && dtype_row_bytes(fallback, cols, planned_group(fallback, 32)) != 0) {
    s.dtype = fallback;
    s.group = planned_group(fallback, 32);
  } else {
    s.dtype = want == DType::F32 ? DType::F32 : DType::F16;
  }
  if (notes) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s: %lld columns are not a multiple of %u, stored as %s", name.c_str(),
                  (long long)cols, group, dtype_name(s.dtype));
    notes->push_back(buf);
  }
  return s;
}

LlmWriteReport convert_to_llm(const ModelSource& src, const std::string& path, const LlmConvertOptions& opts,
                              const LlmWriteOptions& w, std::vector<std::string>* notes) {
  std::vector<LlmTensorSpec> specs;
  specs.reserve(src.tensors.size());
  for (const auto& t : src.tensors) {
    const uint32_t sg = dtype_is_quantized(t.dtype) ? t.group : 0;
    const uint64_t want = tensor_raw_bytes(t.dtype, sg, t.shape);
    LLM_CHECK(want != 0 && want == t.nbytes && t.data != nullptr, LLM_ERR_INVALID_ARGUMENT,
              "tensor '%s': %zu bytes, its dtype and shape need %llu", t.name.c_str(), t.nbytes,
              (unsigned long long)want);
    specs.push_back(plan_llm_tensor(t.name, t.shape, t.dtype, sg, opts, notes));
  }
  LlmWriter writer(path, src.config, src.vocab, src.meta, specs, w);
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    const TensorData& t = src.tensors[i];
    const LlmTensorSpec& s = specs[i];
    const int64_t cols = t.cols();
    const uint32_t sg = dtype_is_quantized(t.dtype) ? t.group : 0;
    const size_t src_row = dtype_row_bytes(t.dtype, cols, sg);
    const size_t dst_row = dtype_row_bytes(s.dtype, cols, s.group);
    const bool same = t.dtype == s.dtype && sg == s.group;
    writer.write_tensor([&](int64_t r0, int64_t n, uint8_t* dst) {
      if (same) {
        std::memcpy(dst, t.data + size_t(r0) * src_row, size_t(n) * src_row);
        return;
      }
      TaskRunner runner(w.pool, nullptr, 0);
      const int nth = runner.max_threads();
      std::vector<std::vector<float>> rows(static_cast<size_t>(nth));
      // Blocks of rows per task: few enough tasks to keep scheduling cheap.
      const int64_t per = std::max<int64_t>(1, n / (int64_t(nth) * 4));
      const size_t n_tasks = size_t((n + per - 1) / per);
      runner.run(
          n_tasks,
          [&](size_t task, int ith) {
            std::vector<float>& row = rows[size_t(ith)];
            row.resize(size_t(cols));
            const int64_t b = int64_t(task) * per, e = std::min<int64_t>(n, b + per);
            for (int64_t r = b; r < e; ++r) {
              dequantize_row(t.dtype, sg, t.data + size_t(r0 + r) * src_row, row.data(), cols);
              quantize_row(s.dtype, s.group, row.data(), dst + size_t(r) * dst_row, cols);
            }
          },
          [](size_t) { return uint64_t(0); });
    });
  }
  return writer.finish();
}

// ===========================================================================
// Reader

ModelSource parse_llm(std::shared_ptr<MappedFile> file, const LlmReadOptions& opts) {
  LLM_CHECK(file != nullptr, LLM_ERR_INVALID_ARGUMENT, "parse_llm: no file");
  const uint8_t* base = file->data();
  ModelSource src;
  const LlmFileInfo info = inspect_impl(base, file->size(), !opts.vocab_only, &src);
  if (opts.vocab_only) return src;

  // Work: hash every stored byte (if verifying), then decompress.
  uint64_t verify_work = 0, inflate_work = 0;
  for (const auto& e : info.tensors) {
    if (opts.verify_checksums) verify_work += e.stored_size;
    if (e.codec != LlmCodec::Raw) inflate_work += e.raw_size;
  }
  // Progress counts both passes; a compressed byte is worth ~30x a hashed one.
  const uint64_t inflate_weight = 32;
  TaskRunner runner(opts.pool, opts.progress, verify_work + inflate_work * inflate_weight);

  if (opts.verify_checksums && !info.tensors.empty()) {
    // Largest first so one huge tensor does not start last.
    std::vector<size_t> order(info.tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return info.tensors[a].stored_size > info.tensors[b].stored_size; });
    runner.run(
        order.size(),
        [&](size_t i, int) {
          const LlmTableEntry& e = info.tensors[order[i]];
          const uint64_t got = xxh3(base + e.offset, size_t(e.stored_size));
          if (got != e.checksum)
            fail(LLM_ERR_CHECKSUM, ".llm: tensor '%s' checksum mismatch (stored %016llx, computed %016llx)",
                 e.name.c_str(), (unsigned long long)e.checksum, (unsigned long long)got);
        },
        [&](size_t i) { return info.tensors[order[i]].stored_size; });
  }

  // Locate every chunk (bounds-checked against the index) before allocating.
  std::vector<ChunkTask> chunks;
  for (size_t ti = 0; ti < info.tensors.size(); ++ti) {
    const LlmTableEntry& e = info.tensors[ti];
    if (e.codec == LlmCodec::Raw) continue;
    const uint64_t index_bytes = e.n_chunks * kChunkIndexEntryBytes;
    const uint8_t* index = base + e.offset + e.stored_size - index_bytes;
    const uint64_t frames_bytes = e.stored_size - index_bytes;
    uint64_t at = 0;
    for (uint64_t c = 0; c < e.n_chunks; ++c) {
      ChunkTask t;
      t.tensor = ti;
      std::memcpy(&t.frame_size, index + c * kChunkIndexEntryBytes, 8);
      std::memcpy(&t.frame_checksum, index + c * kChunkIndexEntryBytes + 8, 8);
      LLM_CHECK(t.frame_size > 0 && t.frame_size <= frames_bytes - at, LLM_ERR_FORMAT,
                ".llm: tensor '%s' chunk %llu runs past its frames", e.name.c_str(), (unsigned long long)c);
      t.raw_size = std::min<uint64_t>(e.chunk_bytes, e.raw_size - c * e.chunk_bytes);
      LLM_CHECK(t.raw_size <= t.frame_size * kMaxZstdRatio, LLM_ERR_FORMAT,
                ".llm: tensor '%s' chunk %llu: %llu-byte frame cannot hold %llu bytes", e.name.c_str(),
                (unsigned long long)c, (unsigned long long)t.frame_size, (unsigned long long)t.raw_size);
      t.frame = base + e.offset + at;
      at += t.frame_size;
      t.dst = nullptr;
      chunks.push_back(t);
    }
    LLM_CHECK(at == frames_bytes, LLM_ERR_FORMAT, ".llm: tensor '%s' has %llu unindexed bytes", e.name.c_str(),
              (unsigned long long)(frames_bytes - at));
  }

  src.tensors.resize(info.tensors.size());
  for (size_t ti = 0; ti < info.tensors.size(); ++ti) {
    const LlmTableEntry& e = info.tensors[ti];
    TensorData& t = src.tensors[ti];
    t.name = e.name;
    t.dtype = e.dtype;
    t.group = e.group;
    t.shape = e.shape;
    t.nbytes = size_t(e.raw_size);
    if (e.codec == LlmCodec::Raw) t.data = base + e.offset;
  }
  // Decoded tensors: allocated (and zero-filled, which is where the page
  // faults happen) in parallel, largest first.
  std::vector<size_t> packed;
  for (size_t ti = 0; ti < info.tensors.size(); ++ti)
    if (info.tensors[ti].codec != LlmCodec::Raw) packed.push_back(ti);
  std::sort(packed.begin(), packed.end(),
            [&](size_t a, size_t b) { return info.tensors[a].raw_size > info.tensors[b].raw_size; });
  runner.run(
      packed.size(),
      [&](size_t i, int) {
        TensorData& t = src.tensors[packed[i]];
        t.owned = std::make_shared<std::vector<uint8_t>>(t.nbytes);
        t.data = t.owned->data();
      },
      [](size_t) { return uint64_t(0); });
  {
    std::vector<uint64_t> next_raw(info.tensors.size(), 0);
    for (auto& c : chunks) {
      c.dst = src.tensors[c.tensor].owned->data() + next_raw[c.tensor];
      next_raw[c.tensor] += c.raw_size;
    }
  }

  if (!chunks.empty()) {
    const int nth = runner.max_threads();
    std::vector<std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter>> dctx(static_cast<size_t>(nth));
    std::vector<std::vector<uint8_t>> scratch(static_cast<size_t>(nth));
    const bool verify = opts.verify_checksums;
    runner.run(
        chunks.size(),
        [&](size_t i, int ith) {
          const ChunkTask& c = chunks[i];
          const LlmTableEntry& e = info.tensors[c.tensor];
          if (verify && xxh3(c.frame, size_t(c.frame_size)) != c.frame_checksum)
            fail(LLM_ERR_CHECKSUM, ".llm: tensor '%s': chunk checksum mismatch", e.name.c_str());
          const unsigned long long content = ZSTD_getFrameContentSize(c.frame, size_t(c.frame_size));
          LLM_CHECK(content == c.raw_size, LLM_ERR_FORMAT,
                    ".llm: tensor '%s': zstd frame holds %lld bytes, expected %llu", e.name.c_str(), (long long)content,
                    (unsigned long long)c.raw_size);
          auto& d = dctx[size_t(ith)];
          if (!d) {
            d.reset(ZSTD_createDCtx());
            if (!d) throw std::bad_alloc();
          }
          uint8_t* out = c.dst;
          if (e.codec == LlmCodec::ZstdPlanes) {
            if (scratch[size_t(ith)].size() < c.raw_size) scratch[size_t(ith)].resize(size_t(c.raw_size));
            out = scratch[size_t(ith)].data();
          }
          const size_t r = ZSTD_decompressDCtx(d.get(), out, size_t(c.raw_size), c.frame, size_t(c.frame_size));
          LLM_CHECK(!ZSTD_isError(r) && r == c.raw_size, LLM_ERR_FORMAT, ".llm: tensor '%s': bad zstd frame (%s)",
                    e.name.c_str(), ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short");
          if (e.codec == LlmCodec::ZstdPlanes) join_planes(out, size_t(c.raw_size), plane_width(e.dtype), c.dst);
        },
        [&](size_t i) { return chunks[i].raw_size * inflate_weight; });
  } else if (opts.progress) {
    LLM_CHECK(opts.progress(1.0f), LLM_ERR_CANCELLED, "loading cancelled by the progress callback");
  }
  src.file = std::move(file);
  return src;
}

ModelSource read_llm(const std::string& path, const LlmReadOptions& opts) {
  return parse_llm(MappedFile::open(path), opts);
}

}  // namespace llm
