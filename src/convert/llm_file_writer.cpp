// The .llm writer (streaming, zstd where it pays) and the conversion that
// re-encodes tensors while writing. Offline code: llm-convert and the tests
// link it, libllm.so does not. The byte layout is specified in
// docs/FORMAT.md and shared with the reader (format/llm_file_internal.h).
#include "convert/llm_file_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "format/llm_file_internal.h"
#include "quant/quant.h"
#include "convert/ggml_quantize.h"

namespace llm {

using namespace llm_file;

namespace {

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
  // The block spec (format/family_spec.h). Readers before these keys existed refuse
  // every family but llama by config.arch; a llama with a non-default spec
  // (RoPE factors, biases) is refused by its extra tensors there.
  const BlockSpec& b = c.spec;
  e.i64("spec.rope_kind", int64_t(b.rope_kind));
  e.i64("spec.rope_dims", b.rope_dims);
  e.f64("spec.rope_base_local", b.rope_base_local);
  e.f64("spec.rope_freq_scale", b.rope_freq_scale);
  e.f64("spec.rope_freq_scale_local", b.rope_freq_scale_local);
  e.i64("spec.rope_factors", b.rope_factors ? 1 : 0);
  e.i64("spec.rope_longrope", b.rope_longrope ? 1 : 0);
  e.f64("spec.rope_yarn_ext", b.rope_yarn_ext);
  e.f64("spec.rope_yarn_beta_fast", b.rope_yarn_beta_fast);
  e.f64("spec.rope_yarn_beta_slow", b.rope_yarn_beta_slow);
  e.i64("spec.rope_orig_ctx", b.rope_orig_ctx);
  e.f64("spec.rope_mscale", b.rope_mscale);
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

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
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
    case DType::Q2_K:
    case DType::Q3_K: return DType::Q4;  // ggml's Q4_0
    case DType::IQ4_XS: return DType::IQ4_NL;
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
              quantize_any_row(s.dtype, s.group, row.data(), dst + size_t(r) * dst_row, cols);
            }
          },
          [](size_t) { return uint64_t(0); });
    });
  }
  return writer.finish();
}

}  // namespace llm
