// The native .llm container: reader (validating, zero-copy for raw tensors,
// parallel verification and decompression). The writer is offline code,
// convert/llm_file_writer.cpp; the byte layout both follow is specified in
// docs/FORMAT.md, and this file must agree with it field for field.
#include "format/llm_file.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "format/llm_file_internal.h"

namespace llm {

using namespace llm_file;

namespace {

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

// Decodes the metadata section into src's config, vocab and meta. Unknown
// keys (and unknown value types of unknown keys) are skipped, but for those
// under config. and spec., which are refused (LLM_ERR_UNSUPPORTED).
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
    else if (key == "spec.rope_longrope") c.spec.rope_longrope = get_i64() != 0;
    else if (key == "spec.rope_yarn_ext") c.spec.rope_yarn_ext = get_f32();
    else if (key == "spec.rope_yarn_beta_fast") c.spec.rope_yarn_beta_fast = get_f32();
    else if (key == "spec.rope_yarn_beta_slow") c.spec.rope_yarn_beta_slow = get_f32();
    else if (key == "spec.rope_orig_ctx") c.spec.rope_orig_ctx = get_i32(0);
    else if (key == "spec.rope_mscale") c.spec.rope_mscale = get_f32();
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
    else {
      // A key from a later writer. The config. and spec. keys describe the
      // math: one this reader does not know would be computed without, so
      // the file is refused; any other is ignored.
      LLM_CHECK(key.compare(0, 7, "config.") != 0 && key.compare(0, 5, "spec.") != 0, LLM_ERR_UNSUPPORTED,
                ".llm metadata: '%s' is from a later format version and changes the model's math; this reader "
                "cannot honour it",
                k);
    }
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

struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
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
