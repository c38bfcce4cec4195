// .llm container: round trips (raw, zstd, byte planes), corruption,
// truncation, hostile tables, versions, progress and cancellation.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "format/llama2c.h"
#include "format/llm_file.h"
#include "tmp.h"
#include "status_of.h"
#include "convert/llm_file_writer.h"

namespace {

using llm::DType;
using llm::LlmCodec;

using llm::testing::tmp_path;
std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

using llm::testing::status_of;

llm_status parse_status(const std::vector<uint8_t>& bytes, std::string* msg = nullptr) {
  return status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(bytes)); }, msg);
}

template <typename T>
T get(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}
template <typename T>
void put(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof v);
}

// Recomputes the metadata, table and header checksums after a test edited
// the bytes on purpose (header layout: docs/FORMAT.md).
void reseal(std::vector<uint8_t>& b) {
  const uint64_t meta_off = get<uint64_t>(b, 32), meta_size = get<uint64_t>(b, 40);
  const uint64_t table_off = get<uint64_t>(b, 56), table_size = get<uint64_t>(b, 64);
  // Regions a test moved outside the file keep their old checksums.
  if (meta_off <= b.size() && meta_size <= b.size() - meta_off)
    put<uint64_t>(b, 48, XXH3_64bits(b.data() + meta_off, meta_size));
  if (table_off <= b.size() && table_size <= b.size() - table_off)
    put<uint64_t>(b, 72, XXH3_64bits(b.data() + table_off, table_size));
  put<uint64_t>(b, 120, XXH3_64bits(b.data(), 120));
}

// Offset of table entry i (entries are self-sized).
size_t entry_offset(const std::vector<uint8_t>& b, size_t i) {
  size_t off = size_t(get<uint64_t>(b, 56));
  for (size_t k = 0; k < i; ++k) off += get<uint32_t>(b, off);
  return off;
}
// Field offsets inside an entry.
constexpr size_t kEntDtype = 4, kEntCodec = 12, kEntChunkBytes = 20, kEntOffset = 32, kEntStored = 40, kEntRaw = 48,
                 kEntDims = 64;

// --- A small model with every dtype and data that compresses in different ways.

struct Fixture {
  llm::ModelSource src;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;

  void add(const std::string& name, DType t, uint32_t group, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
    llm::TensorData td;
    td.name = name;
    td.dtype = t;
    td.group = group;
    td.shape = std::move(shape);
    td.owned = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    td.data = td.owned->data();
    td.nbytes = td.owned->size();
    src.tensors.push_back(td);
  }
};

Fixture make_fixture() {
  Fixture f;
  llm::ModelConfig& c = f.src.config;
  c.arch = "llama";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 300;
  c.seq_len = 128;
  c.rope_theta = 500000.0f;
  c.norm_eps = 1e-6f;
  llm::VocabData& v = f.src.vocab;
  v.model = "gpt2";
  v.pre = "llama3";
  for (int i = 0; i < 300; ++i) {
    v.tokens.push_back(i == 7 ? std::string() : "tok" + std::to_string(i) + (i % 3 ? "\xE2\x96\x81" : ""));
    v.scores.push_back(-0.5f * float(i));
    v.types.push_back(i < 3 ? 3 : 1);
  }
  v.tokens[5] = std::string("a\0b", 3);  // embedded NUL survives
  v.merges = {"a b", "\xC4\xA0 t", "th e"};
  v.bos = 1;
  v.eos = 2;
  v.unk = -1;
  v.pad = 0;
  v.eot = 299;
  v.add_bos = false;
  v.add_space_prefix = false;
  f.src.meta["source"] = "unit test";
  f.src.meta["quant.recipe"] = "mixed";

  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  // f32 [300, 64]: N(0, 0.02) -> byte planes pay off.
  {
    std::vector<uint8_t> b(300 * 64 * 4);
    for (size_t i = 0; i < b.size() / 4; ++i) {
      const float x = normal(rng);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
    f.add("token_embd.weight", DType::F32, 0, {300, 64}, std::move(b));
  }
  // f32 [64] of random bits: incompressible, stays raw.
  {
    std::vector<uint8_t> b(64 * 4);
    for (auto& x : b) x = uint8_t(rng());
    f.add("output_norm.weight", DType::F32, 0, {64}, std::move(b));
  }
  // f16 [96, 64] and bf16 [64, 96].
  {
    std::vector<uint8_t> b(96 * 64 * 2);
    for (size_t i = 0; i < b.size() / 2; ++i) {
      const uint16_t h = llm::f32_to_f16(normal(rng));
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    f.add("blk.0.ffn_gate.weight", DType::F16, 0, {96, 64}, std::move(b));
    std::vector<uint8_t> c2(64 * 96 * 2);
    for (size_t i = 0; i < c2.size() / 2; ++i) {
      const uint16_t h = llm::f32_to_bf16(normal(rng));
      std::memcpy(c2.data() + 2 * i, &h, 2);
    }
    f.add("blk.0.ffn_down.weight", DType::BF16, 0, {64, 96}, std::move(c2));
  }
  // q8 [64, 64]: mostly zero blocks -> plain zstd wins.
  {
    std::vector<uint8_t> b(64 * 2 * 34, 0);
    for (size_t i = 0; i < b.size(); i += 97) b[i] = uint8_t(rng());
    f.add("blk.0.attn_q.weight", DType::Q8, 32, {64, 64}, std::move(b));
  }
  // q4 g32 / g64 / g128 with random bytes: incompressible -> raw.
  for (uint32_t g : {32u, 64u, 128u}) {
    const size_t row = size_t(128 / g) * (2 + g / 2);
    std::vector<uint8_t> b(32 * row);
    for (auto& x : b) x = uint8_t(rng());
    f.add("blk.0.attn_k.weight.g" + std::to_string(g), DType::Q4, g, {32, 128}, std::move(b));
  }
  return f;
}

void expect_same_model(const llm::ModelSource& a, const llm::ModelSource& b) {
  EXPECT_EQ(a.config.arch, b.config.arch);
  EXPECT_EQ(a.config.dim, b.config.dim);
  EXPECT_EQ(a.config.hidden_dim, b.config.hidden_dim);
  EXPECT_EQ(a.config.n_layers, b.config.n_layers);
  EXPECT_EQ(a.config.n_heads, b.config.n_heads);
  EXPECT_EQ(a.config.n_kv_heads, b.config.n_kv_heads);
  EXPECT_EQ(a.config.head_dim, b.config.head_dim);
  EXPECT_EQ(a.config.vocab_size, b.config.vocab_size);
  EXPECT_EQ(a.config.seq_len, b.config.seq_len);
  EXPECT_EQ(a.config.rope_theta, b.config.rope_theta);
  EXPECT_EQ(a.config.norm_eps, b.config.norm_eps);
  EXPECT_EQ(a.vocab.model, b.vocab.model);
  EXPECT_EQ(a.vocab.pre, b.vocab.pre);
  EXPECT_EQ(a.vocab.tokens, b.vocab.tokens);
  EXPECT_EQ(a.vocab.scores, b.vocab.scores);
  EXPECT_EQ(a.vocab.types, b.vocab.types);
  EXPECT_EQ(a.vocab.merges, b.vocab.merges);
  EXPECT_EQ(a.vocab.bos, b.vocab.bos);
  EXPECT_EQ(a.vocab.eos, b.vocab.eos);
  EXPECT_EQ(a.vocab.unk, b.vocab.unk);
  EXPECT_EQ(a.vocab.pad, b.vocab.pad);
  EXPECT_EQ(a.vocab.eot, b.vocab.eot);
  EXPECT_EQ(a.vocab.add_bos, b.vocab.add_bos);
  EXPECT_EQ(a.vocab.add_space_prefix, b.vocab.add_space_prefix);
  EXPECT_EQ(a.meta, b.meta);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(llm::dtype_is_quantized(x.dtype) ? x.group : 0u, y.group) << x.name;
    EXPECT_EQ(x.shape, y.shape) << x.name;
    ASSERT_EQ(x.nbytes, y.nbytes) << x.name;
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes)) << x.name;
  }
}

const llm::LlmTableEntry* entry(const llm::LlmFileInfo& info, const std::string& name) {
  for (const auto& e : info.tensors)
    if (e.name == name) return &e;
  return nullptr;
}

// Writes the fixture with small chunks so the zstd tensors have several.
std::vector<uint8_t> fixture_file(bool zstd, const std::string& name, llm::LlmWriteReport* rep = nullptr) {
  Fixture f = make_fixture();
  llm::LlmWriteOptions o;
  o.allow_zstd = zstd;
  o.chunk_bytes = 4096;
  o.min_saving = 0.03;  // low enough that every codec appears in the fixture
  const std::string path = tmp_path(name);
  llm::LlmWriteReport r = llm::write_llm(f.src, path, o);
  if (rep) *rep = r;
  return slurp(path);
}

}  // namespace

// ---------------------------------------------------------------------------

TEST(LlmFile, RoundTripRaw) {
  Fixture f = make_fixture();
  llm::LlmWriteOptions o;
  o.allow_zstd = false;
  const std::string path = tmp_path("rt_raw.llm");
  const llm::LlmWriteReport rep = llm::write_llm(f.src, path, o);
  EXPECT_EQ(rep.raw_bytes, rep.stored_bytes);
  EXPECT_EQ(rep.tensors.size(), f.src.tensors.size());

  const llm::ModelSource back = llm::read_llm(path);
  expect_same_model(f.src, back);
  // Raw tensors are zero-copy views of the mapping at aligned offsets.
  ASSERT_TRUE(back.file);
  for (const auto& t : back.tensors) {
    EXPECT_FALSE(t.owned) << t.name;
    EXPECT_GE(t.data, back.file->data());
    EXPECT_LE(t.data + t.nbytes, back.file->data() + back.file->size());
    EXPECT_EQ(size_t(t.data - back.file->data()) % llm::kLlmAlignment, 0u) << t.name;
  }
  const std::vector<uint8_t> bytes = slurp(path);
  EXPECT_EQ(rep.file_bytes, bytes.size());
  EXPECT_TRUE(llm::is_llm_file(bytes.data(), bytes.size()));
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  EXPECT_EQ(info.version_major, 1);
  for (const auto& e : info.tensors) EXPECT_EQ(e.codec, LlmCodec::Raw);
}

TEST(LlmFile, RoundTripZstdPicksCodecPerTensor) {
  llm::LlmWriteReport rep;
  const std::vector<uint8_t> bytes = fixture_file(true, "rt_zstd.llm", &rep);
  EXPECT_LT(rep.stored_bytes, rep.raw_bytes);
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  // Normal f32 / f16 / bf16: byte planes; sparse q8: plain zstd; random q4 and
  // the tiny norm: raw.
  EXPECT_EQ(entry(info, "token_embd.weight")->codec, LlmCodec::ZstdPlanes);
  EXPECT_EQ(entry(info, "blk.0.ffn_gate.weight")->codec, LlmCodec::ZstdPlanes);
  EXPECT_EQ(entry(info, "blk.0.ffn_down.weight")->codec, LlmCodec::ZstdPlanes);
  EXPECT_EQ(entry(info, "blk.0.attn_q.weight")->codec, LlmCodec::Zstd);
  EXPECT_EQ(entry(info, "blk.0.attn_k.weight.g32")->codec, LlmCodec::Raw);
  EXPECT_EQ(entry(info, "output_norm.weight")->codec, LlmCodec::Raw);
  // Several chunks: 300*64*4 bytes in 4096-byte chunks.
  EXPECT_EQ(entry(info, "token_embd.weight")->n_chunks, uint64_t(300 * 64 * 4 / 4096 + 1));
  for (const auto& e : info.tensors) {
    if (e.codec != LlmCodec::Raw) {
      EXPECT_LE(double(e.stored_size), double(e.raw_size) * 0.97) << e.name;  // min_saving respected
    }
  }
  // Reports agree with the table.
  for (const auto& t : rep.tensors) {
    const llm::LlmTableEntry* e = entry(info, t.name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->codec, t.codec);
    EXPECT_EQ(e->stored_size, t.stored_bytes);
  }

  Fixture f = make_fixture();
  const llm::ModelSource serial = llm::parse_llm(llm::MappedFile::from_bytes(bytes));
  expect_same_model(f.src, serial);
  llm::ThreadPool pool(3);
  llm::LlmReadOptions ro;
  ro.pool = &pool;
  const llm::ModelSource par = llm::parse_llm(llm::MappedFile::from_bytes(bytes), ro);
  expect_same_model(f.src, par);
  EXPECT_TRUE(par.find("token_embd.weight")->owned);   // decompressed
  EXPECT_FALSE(par.find("output_norm.weight")->owned);  // zero copy
}

TEST(LlmFile, WriterIsDeterministicAndParallelSafe) {
  const std::vector<uint8_t> a = fixture_file(true, "det_a.llm");
  Fixture f = make_fixture();
  llm::ThreadPool pool(4);
  llm::LlmWriteOptions o;
  o.chunk_bytes = 4096;
  o.min_saving = 0.03;  // as fixture_file
  o.pool = &pool;
  llm::write_llm(f.src, tmp_path("det_b.llm"), o);
  EXPECT_EQ(a, slurp(tmp_path("det_b.llm")));
}

TEST(LlmFile, MinSavingForcesRaw) {
  Fixture f = make_fixture();
  llm::LlmWriteOptions o;
  o.chunk_bytes = 4096;
  o.min_saving = 0.999;
  const llm::LlmWriteReport rep = llm::write_llm(f.src, tmp_path("minsave.llm"), o);
  for (const auto& t : rep.tensors) EXPECT_EQ(t.codec, LlmCodec::Raw) << t.name;
  expect_same_model(f.src, llm::read_llm(tmp_path("minsave.llm")));
}

TEST(LlmFile, Stories260KRoundTrip) {
  const llm::ModelSource src = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  for (bool zstd : {false, true}) {
    llm::LlmWriteOptions o;
    o.allow_zstd = zstd;
    const std::string path = tmp_path(zstd ? "s260_z.llm" : "s260_raw.llm");
    llm::write_llm(src, path, o);
    expect_same_model(src, llm::read_llm(path));
  }
}

// The GGUF block types (Q5_0 .. IQ4_NL, stored as ggml lays them out) round
// trip byte for byte, raw and through zstd, and the reader checks their
// group and row size like any other quantized type.
TEST(LlmFile, GgufBlockTypesRoundTrip) {
  Fixture f = make_fixture();
  std::mt19937 rng(77);
  const DType types[] = {DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::Q2_K, DType::Q3_K,
                         DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::IQ4_XS};
  for (DType t : types) {
    const uint32_t g = uint32_t(llm::ggml_block_values(t));
    const int64_t rows = 6, cols = 512;
    const size_t rb = llm::dtype_row_bytes(t, cols, g);
    ASSERT_EQ(rb, size_t(cols / g) * llm::ggml_block_bytes(t)) << llm::dtype_name(t);
    std::vector<uint8_t> b(rb * rows);
    // Half the rows random (raw pays), half mostly zero (zstd pays).
    for (size_t i = 0; i < b.size(); ++i) b[i] = i < b.size() / 2 ? uint8_t(rng()) : (i % 53 ? 0 : uint8_t(rng()));
    f.add(std::string("gguf.") + llm::dtype_name(t), t, g, {rows, cols}, std::move(b));
  }
  for (bool zstd : {false, true}) {
    llm::LlmWriteOptions o;
    o.allow_zstd = zstd;
    o.chunk_bytes = 4096;
    const std::string path = tmp_path(zstd ? "gguf_z.llm" : "gguf_raw.llm");
    llm::write_llm(f.src, path, o);
    const llm::ModelSource back = llm::read_llm(path);
    expect_same_model(f.src, back);
    for (DType t : types) {
      const llm::TensorData* td = back.find(std::string("gguf.") + llm::dtype_name(t));
      ASSERT_NE(td, nullptr);
      EXPECT_EQ(td->dtype, t);
      EXPECT_EQ(td->group, uint32_t(llm::ggml_block_values(t)));
    }
  }
  // A block type with another group, or a row that is not whole blocks, is
  // refused by the writer (and by the reader: the table's raw size no longer
  // matches).
  llm::LlmTensorSpec bad;
  bad.name = "bad";
  bad.dtype = DType::Q4_K;
  bad.group = 32;
  bad.shape = {2, 512};
  EXPECT_EQ(status_of([&] { llm::LlmWriter w(tmp_path("bad_group.llm"), f.src.config, f.src.vocab, f.src.meta, {bad}, {}); }),
            LLM_ERR_INVALID_ARGUMENT);
  bad.group = 256;
  bad.shape = {2, 320};
  EXPECT_EQ(status_of([&] { llm::LlmWriter w(tmp_path("bad_row.llm"), f.src.config, f.src.vocab, f.src.meta, {bad}, {}); }),
            LLM_ERR_INVALID_ARGUMENT);
  llm::LlmWriteOptions o;
  o.allow_zstd = false;
  const std::string path = tmp_path("gguf_edit.llm");
  llm::write_llm(f.src, path, o);
  const std::vector<uint8_t> bytes = slurp(path);
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  size_t idx = 0;
  while (info.tensors[idx].name != "gguf.q4_K") ++idx;
  const size_t e = entry_offset(bytes, idx);
  std::vector<uint8_t> b = bytes;
  put<uint32_t>(b, e + 8, 32);  // group
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_FORMAT);
  b = bytes;
  put<uint32_t>(b, e + kEntDtype, uint32_t(DType::Q5_K));  // same group, other block size
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_FORMAT);
  b = bytes;
  put<uint32_t>(b, e + kEntDtype, llm::kDTypeCount);  // the first unknown dtype
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_UNSUPPORTED);
}

TEST(LlmFile, StreamingWriterRegeneratesRowsWhenZstdDoesNotPay) {
  // Incompressible rows: the writer tries zstd, gives up and asks for the
  // rows again to store them raw.
  llm::LlmTensorSpec spec;
  spec.name = "noise";
  spec.dtype = DType::F32;
  spec.shape = {64, 1000};
  auto gen = [](int64_t row0, int64_t n, uint8_t* dst) {
    for (int64_t r = row0; r < row0 + n; ++r) {
      std::mt19937 rng(static_cast<uint32_t>(r));
      for (int c = 0; c < 4000; ++c) *dst++ = uint8_t(rng());
    }
  };
  int64_t calls = 0;
  llm::LlmWriteOptions o;
  o.chunk_bytes = 8192;
  std::vector<float> seen;
  o.progress = [&](float p) { seen.push_back(p); };
  {
    llm::LlmWriter w(tmp_path("stream.llm"), llm::ModelConfig{}, llm::VocabData{}, {}, {spec}, o);
    w.write_tensor([&](int64_t row0, int64_t n, uint8_t* dst) {
      ++calls;
      gen(row0, n, dst);
    });
    const llm::LlmWriteReport rep = w.finish();
    EXPECT_EQ(rep.tensors[0].codec, LlmCodec::Raw);
  }
  EXPECT_GE(calls, 2);
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i], seen[i - 1]);
  EXPECT_EQ(seen.back(), 1.0f);
  const llm::ModelSource back = llm::read_llm(tmp_path("stream.llm"));
  ASSERT_EQ(back.tensors.size(), 1u);
  std::vector<uint8_t> want(64 * 4000);
  gen(0, 64, want.data());
  EXPECT_EQ(0, std::memcmp(back.tensors[0].data, want.data(), want.size()));
}

TEST(LlmFile, WriterRejectsBadInputAndLeavesNoFile) {
  Fixture f = make_fixture();
  f.src.tensors[0].nbytes -= 4;
  EXPECT_EQ(status_of([&] { llm::write_llm(f.src, tmp_path("bad.llm")); }), LLM_ERR_INVALID_ARGUMENT);
  Fixture g = make_fixture();
  g.src.tensors[5].group = 48;  // q4 group must be 32/64/128
  EXPECT_EQ(status_of([&] { llm::write_llm(g.src, tmp_path("bad.llm")); }), LLM_ERR_INVALID_ARGUMENT);
  Fixture h = make_fixture();
  h.src.tensors[1].name = h.src.tensors[0].name;
  EXPECT_EQ(status_of([&] { llm::write_llm(h.src, tmp_path("bad.llm")); }), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(slurp(tmp_path("bad.llm")).empty());
  EXPECT_TRUE(slurp(tmp_path("bad.llm.tmp")).empty());
  Fixture ok = make_fixture();
  EXPECT_EQ(status_of([&] { llm::write_llm(ok.src, tmp_path("no_such_dir/x.llm")); }), LLM_ERR_IO);
  // An abandoned streaming writer removes its temporary file.
  {
    llm::LlmTensorSpec s;
    s.name = "t";
    s.shape = {4};
    llm::LlmWriter w(tmp_path("abandoned.llm"), {}, {}, {}, {s});
  }
  EXPECT_TRUE(slurp(tmp_path("abandoned.llm.tmp")).empty());
  EXPECT_TRUE(slurp(tmp_path("abandoned.llm")).empty());
}

TEST(LlmFile, VocabOnlyAndNoVerify) {
  const std::vector<uint8_t> bytes = fixture_file(true, "vo.llm");
  llm::LlmReadOptions ro;
  ro.vocab_only = true;
  const llm::ModelSource v = llm::parse_llm(llm::MappedFile::from_bytes(bytes), ro);
  Fixture f = make_fixture();
  EXPECT_TRUE(v.tensors.empty());
  EXPECT_EQ(v.vocab.tokens, f.src.vocab.tokens);
  EXPECT_EQ(v.config.dim, 64);
  // vocab_only does not read the table: a broken table still loads the vocab.
  std::vector<uint8_t> broken = bytes;
  broken[size_t(get<uint64_t>(broken, 56)) + 3] ^= 0x40;
  EXPECT_EQ(parse_status(broken), LLM_ERR_CHECKSUM);
  EXPECT_EQ(status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(broken), ro); }), LLM_OK);

  // verify_checksums = false skips the hashing of tensor bytes.
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  const llm::LlmTableEntry* raw = entry(info, "blk.0.attn_k.weight.g64");
  ASSERT_EQ(raw->codec, LlmCodec::Raw);
  std::vector<uint8_t> flipped = bytes;
  flipped[size_t(raw->offset + 5)] ^= 1;
  EXPECT_EQ(parse_status(flipped), LLM_ERR_CHECKSUM);
  llm::LlmReadOptions nv;
  nv.verify_checksums = false;
  EXPECT_EQ(status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(flipped), nv); }), LLM_OK);
}

TEST(LlmFile, FlippedByteInEveryTensorIsChecksumError) {
  const std::vector<uint8_t> bytes = fixture_file(true, "flip.llm");
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  llm::ThreadPool pool(2);
  for (const auto& e : info.tensors) {
    // First byte, last byte (the chunk index for zstd tensors), a middle byte.
    for (uint64_t at : {e.offset, e.offset + e.stored_size - 1, e.offset + e.stored_size / 2}) {
      std::vector<uint8_t> b = bytes;
      b[size_t(at)] ^= 0x10;
      std::string msg;
      EXPECT_EQ(parse_status(b, &msg), LLM_ERR_CHECKSUM) << e.name << " @" << at << ": " << msg;
      llm::LlmReadOptions ro;
      ro.pool = &pool;
      EXPECT_EQ(status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(b), ro); }), LLM_ERR_CHECKSUM);
    }
  }
}

TEST(LlmFile, FlippedByteInHeaderMetadataTableOrPadding) {
  const std::vector<uint8_t> bytes = fixture_file(true, "flip_hdr.llm");
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  // Every header byte.
  for (size_t i = 0; i < llm::kLlmHeaderSize; ++i) {
    std::vector<uint8_t> b = bytes;
    b[i] ^= 0x01;
    const llm_status s = parse_status(b);
    EXPECT_TRUE(s == LLM_ERR_CHECKSUM || s == LLM_ERR_FORMAT) << "header byte " << i << " -> " << s;
  }
  // Every byte of metadata and table (strided to stay fast).
  for (uint64_t i = info.meta_offset; i < info.table_offset + info.table_size; i += 7) {
    std::vector<uint8_t> b = bytes;
    b[size_t(i)] ^= 0x80;
    const llm_status s = parse_status(b);
    EXPECT_TRUE(s == LLM_ERR_CHECKSUM || s == LLM_ERR_FORMAT) << "byte " << i << " -> " << s;
  }
  // Every byte that belongs to no region (padding) must be zero.
  std::vector<bool> covered(bytes.size(), false);
  auto cover = [&](uint64_t a, uint64_t n) {
    for (uint64_t i = a; i < a + n; ++i) covered[size_t(i)] = true;
  };
  cover(0, llm::kLlmHeaderSize);
  cover(info.meta_offset, info.meta_size);
  cover(info.table_offset, info.table_size);
  for (const auto& e : info.tensors) cover(e.offset, e.stored_size);
  int n_pad = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (covered[i]) continue;
    ++n_pad;
    std::vector<uint8_t> b = bytes;
    b[i] = 0xAA;
    EXPECT_EQ(parse_status(b), LLM_ERR_FORMAT) << "padding byte " << i;
  }
  EXPECT_GT(n_pad, 0);
}

TEST(LlmFile, TruncationIsFormatError) {
  const std::vector<uint8_t> bytes = fixture_file(true, "trunc.llm");
  std::vector<size_t> cuts;
  for (size_t c = 0; c < 300; ++c) cuts.push_back(c);
  for (size_t c = 300; c < bytes.size(); c += bytes.size() / 61) cuts.push_back(c);
  cuts.push_back(bytes.size() - 1);
  for (size_t c : cuts) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + long(c));
    std::string msg;
    EXPECT_EQ(parse_status(b, &msg), LLM_ERR_FORMAT) << "cut at " << c << ": " << msg;
  }
  // Trailing garbage is refused too (the header records the file size).
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(parse_status(longer), LLM_ERR_FORMAT);
  // Empty file and a foreign file.
  EXPECT_EQ(parse_status({}), LLM_ERR_FORMAT);
  EXPECT_EQ(parse_status(slurp(model_path("stories260K.gguf"))), LLM_ERR_FORMAT);
}

TEST(LlmFile, HostileTableEntries) {
  const std::vector<uint8_t> bytes = fixture_file(true, "hostile.llm");
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  ASSERT_EQ(info.tensors[0].name, "token_embd.weight");
  ASSERT_EQ(info.tensors[0].codec, LlmCodec::ZstdPlanes);
  const size_t e0 = entry_offset(bytes, 0);
  const size_t e1 = entry_offset(bytes, 1);  // output_norm.weight, raw
  ASSERT_EQ(info.tensors[1].codec, LlmCodec::Raw);
  auto edited = [&](const std::function<void(std::vector<uint8_t>&)>& edit) {
    std::vector<uint8_t> b = bytes;
    edit(b);
    reseal(b);
    std::string msg;
    const llm_status s = parse_status(b, &msg);
    if (std::getenv("LLM_TEST_VERBOSE")) std::printf("  -> %d %s\n", int(s), msg.c_str());
    return s;
  };
  // Offsets/sizes pointing outside the file or the data region.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntOffset, b.size() - 8); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntOffset, ~0ull - 16); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e1 + kEntOffset, 0); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntStored, 1ull << 40); }), LLM_ERR_FORMAT);
  // Raw tensor moved off its alignment.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e1 + kEntOffset, get<uint64_t>(b, e1 + kEntOffset) + 4); }),
            LLM_ERR_FORMAT);
  // Sizes inconsistent with dtype/shape.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntRaw, get<uint64_t>(b, e0 + kEntRaw) + 4); }),
            LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e1 + kEntDtype, uint32_t(DType::F16)); }), LLM_ERR_FORMAT);
  // Absurd dimensions: rejected before any allocation.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntDims, 1ull << 62); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntDims, 1ull << 31); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) {
              // [2^30, 64] f32 = 256 GiB, with a raw size to match: beyond the per-tensor limit.
              put<uint64_t>(b, e0 + kEntDims, 1ull << 30);
              put<uint64_t>(b, e0 + kEntRaw, (1ull << 30) * 256);
            }),
            LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) {
              // 16 GiB claimed through a few frames: more than zstd can expand.
              put<uint64_t>(b, e0 + kEntDims, 1ull << 26);
              put<uint64_t>(b, e0 + kEntRaw, (1ull << 26) * 256);
              put<uint32_t>(b, e0 + kEntChunkBytes, 1u << 30);
              put<uint64_t>(b, e0 + 24, 16);  // n_chunks
            }),
            LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, e0 + kEntDims, 0); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + 16, 0); }), LLM_ERR_FORMAT);    // n_dims 0
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + 16, 200); }), LLM_ERR_FORMAT);  // n_dims 200
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0, 8); }), LLM_ERR_FORMAT);         // entry size
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0, 0x7fffffff); }), LLM_ERR_FORMAT);
  // Chunking inconsistent with the sizes.
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + kEntChunkBytes, 8192); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + kEntChunkBytes, 0); }), LLM_ERR_FORMAT);
  // Tensor count larger than the table.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, 80, 1ull << 40); }), LLM_ERR_FORMAT);
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, 80, get<uint64_t>(b, 80) + 1); }), LLM_ERR_FORMAT);
  // Header regions outside the file.
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, 64, 1ull << 50); }), LLM_ERR_FORMAT);  // table size
  EXPECT_EQ(edited([&](auto& b) { put<uint64_t>(b, 32, b.size()); }), LLM_ERR_FORMAT);    // meta offset
  // Unknown dtype / codec: unsupported, not malformed.
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + kEntDtype, 77); }), LLM_ERR_UNSUPPORTED);
  EXPECT_EQ(edited([&](auto& b) { put<uint32_t>(b, e0 + kEntCodec, 9); }), LLM_ERR_UNSUPPORTED);
  // The edit helper itself produces loadable files when nothing changes.
  EXPECT_EQ(edited([](auto&) {}), LLM_OK);
}

TEST(LlmFile, CorruptChunkIndexOrFrameWithoutChecksums) {
  // With verification off the structure checks still stop bad frames.
  const std::vector<uint8_t> bytes = fixture_file(true, "chunks.llm");
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  const llm::LlmTableEntry* e = entry(info, "token_embd.weight");
  llm::LlmReadOptions nv;
  nv.verify_checksums = false;
  auto st = [&](const std::vector<uint8_t>& b) {
    return status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(b), nv); });
  };
  const size_t index = size_t(e->offset + e->stored_size - e->n_chunks * 16);
  std::vector<uint8_t> b = bytes;
  put<uint64_t>(b, index, get<uint64_t>(b, index) + 1);  // frame 0 one byte longer
  EXPECT_EQ(st(b), LLM_ERR_FORMAT);
  b = bytes;
  put<uint64_t>(b, index, 1ull << 60);
  EXPECT_EQ(st(b), LLM_ERR_FORMAT);
  b = bytes;
  put<uint64_t>(b, index, 0);
  EXPECT_EQ(st(b), LLM_ERR_FORMAT);
  b = bytes;
  for (size_t i = 0; i < 8; ++i) b[size_t(e->offset) + i] ^= 0xFF;  // zstd magic of frame 0
  EXPECT_EQ(st(b), LLM_ERR_FORMAT);
  b = bytes;
  b[size_t(e->offset) + 40] ^= 0xFF;  // inside the compressed data
  const llm_status s = st(b);
  EXPECT_TRUE(s == LLM_ERR_FORMAT || s == LLM_OK) << s;  // zstd may or may not notice; must not crash
}

TEST(LlmFile, VersionsAndFlags) {
  const std::vector<uint8_t> bytes = fixture_file(false, "ver.llm");
  std::vector<uint8_t> b = bytes;
  put<uint16_t>(b, 8, 2);  // major 2
  reseal(b);
  std::string msg;
  EXPECT_EQ(parse_status(b, &msg), LLM_ERR_UNSUPPORTED) << msg;
  b = bytes;
  put<uint16_t>(b, 8, 0);
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_FORMAT);
  b = bytes;
  put<uint16_t>(b, 10, 7);  // newer minor: readable
  put<uint32_t>(b, 16, 0x1);  // unknown optional flag: ignored
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_OK);
  b = bytes;
  put<uint32_t>(b, 16, 0x10000);  // unknown required flag
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_UNSUPPORTED);
  // A flipped version byte without resealing is corruption, not a new version.
  b = bytes;
  b[9] ^= 0x01;
  EXPECT_EQ(parse_status(b), LLM_ERR_CHECKSUM);
}

TEST(LlmFile, UnknownMetadataKeysAreIgnored) {
  const std::vector<uint8_t> bytes = fixture_file(false, "meta.llm");
  // Rename "vocab.pre" to "vocab.prX" and give it an unknown type: a later
  // writer's key. Same length, so nothing moves.
  std::vector<uint8_t> b = bytes;
  const uint64_t mo = get<uint64_t>(b, 32), ms = get<uint64_t>(b, 40);
  const std::string key = "vocab.pre";
  auto it = std::search(b.begin() + long(mo), b.begin() + long(mo + ms), key.begin(), key.end());
  ASSERT_NE(it, b.begin() + long(mo + ms));
  const size_t at = size_t(it - b.begin());
  b[at + 8] = 'X';
  put<uint32_t>(b, at + key.size(), 999);  // value type
  reseal(b);
  const llm::ModelSource m = llm::parse_llm(llm::MappedFile::from_bytes(b));
  EXPECT_EQ(m.vocab.pre, "default");  // not read from the unknown key
  EXPECT_EQ(m.vocab.model, "gpt2");
  // A known key with the wrong type is malformed.
  b = bytes;
  put<uint32_t>(b, at + key.size(), 1);  // i64 instead of string
  reseal(b);
  EXPECT_EQ(parse_status(b), LLM_ERR_FORMAT);
  // A required key missing (renamed out of the config. namespace) is malformed.
  b = bytes;
  const std::string dimkey = "config.dim";
  auto it2 = std::search(b.begin() + long(mo), b.begin() + long(mo + ms), dimkey.begin(), dimkey.end());
  ASSERT_NE(it2, b.begin() + long(mo + ms));
  *it2 = 'X';
  reseal(b);
  std::string msg;
  EXPECT_EQ(parse_status(b, &msg), LLM_ERR_FORMAT);
  EXPECT_NE(msg.find("'config.dim' is missing"), std::string::npos) << msg;
}

TEST(LlmFile, UnknownConfigAndSpecKeysAreRefused) {
  // A later writer's key under config. or spec. changes the math: running the
  // model without it would be wrong without a word, so the file is refused,
  // naming the key. Keys are renamed in place (same length).
  const std::vector<uint8_t> bytes = fixture_file(false, "meta-spec.llm");
  const uint64_t mo = get<uint64_t>(bytes, 32), ms = get<uint64_t>(bytes, 40);
  for (const std::string key : {"spec.post_norms", "config.norm_eps"}) {
    std::vector<uint8_t> b = bytes;
    auto it = std::search(b.begin() + long(mo), b.begin() + long(mo + ms), key.begin(), key.end());
    ASSERT_NE(it, b.begin() + long(mo + ms)) << key;
    *(it + long(key.size()) - 1) = 'X';
    reseal(b);
    std::string msg;
    EXPECT_EQ(parse_status(b, &msg), LLM_ERR_UNSUPPORTED) << key;
    const std::string renamed = key.substr(0, key.size() - 1) + "X";
    EXPECT_NE(msg.find("'" + renamed + "' is from a later format version"), std::string::npos) << msg;
  }
}

TEST(LlmFile, ProgressAndCancel) {
  const std::vector<uint8_t> bytes = fixture_file(true, "progress.llm");
  std::vector<float> seen;
  llm::LlmReadOptions ro;
  ro.progress = [&](float p) {
    seen.push_back(p);
    return true;
  };
  llm::parse_llm(llm::MappedFile::from_bytes(bytes), ro);
  ASSERT_GE(seen.size(), 3u);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
  EXPECT_EQ(seen.back(), 1.0f);
  for (int stop_after : {0, 1, 3}) {
    int calls = 0;
    llm::LlmReadOptions rc;
    rc.progress = [&](float) { return calls++ < stop_after; };
    EXPECT_EQ(status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(bytes), rc); }), LLM_ERR_CANCELLED);
    llm::ThreadPool pool(2);
    rc.pool = &pool;
    calls = 0;
    EXPECT_EQ(status_of([&] { llm::parse_llm(llm::MappedFile::from_bytes(bytes), rc); }), LLM_ERR_CANCELLED);
  }
}

TEST(LlmFile, RandomMutationsNeverCrash) {
  // Random byte edits, half of them with the checksums recomputed so the
  // structural checks (not only the checksums) get exercised.
  const std::vector<uint8_t> bytes = fixture_file(true, "mutate.llm");
  const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
  std::mt19937 rng(99);
  int n_ok = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<uint8_t> b = bytes;
    const int n_edits = 1 + int(rng() % 4);
    for (int k = 0; k < n_edits; ++k) {
      // Aim most edits at the header and table, where the structure lives.
      size_t at;
      switch (rng() % 3) {
        case 0: at = rng() % llm::kLlmHeaderSize; break;
        case 1: at = size_t(info.table_offset + rng() % info.table_size); break;
        default: at = rng() % b.size(); break;
      }
      b[at] = uint8_t(rng());
    }
    if (iter % 2) reseal(b);
    std::string msg;
    const llm_status s = parse_status(b, &msg);
    EXPECT_TRUE(s == LLM_OK || s == LLM_ERR_FORMAT || s == LLM_ERR_CHECKSUM || s == LLM_ERR_UNSUPPORTED)
        << "iteration " << iter << ": " << s << " " << msg;
    n_ok += s == LLM_OK;
  }
  EXPECT_LT(n_ok, 40);  // nearly every edit is caught
}
