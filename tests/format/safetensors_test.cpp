// JSON reader, safetensors parsing (valid and hostile), Hugging Face folders
// -> ModelSource: stories260K is exported here as an HF Llama folder (weights
// un-permuted to HF's rotate-half layout, config.json, tokenizer.model or a
// tokenizer.json built from the vocabulary), converted back, and must
// reproduce the llama2.c reference generations bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "format/gguf.h"
#include "format/json.h"
#include "format/llama2c.h"
#include "format/hf_families.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "engine/session.h"
#include "llm.h"
#include "reference.h"
#include "tokenizer/tokenizer.h"
#include "tmp.h"
#include "block_spec_eq.h"
#include "relative_error.h"
#include "status_of.h"
#include "convert/llm_file_writer.h"

namespace fs = std::filesystem;
using llm::testing::model_path;

namespace {

std::string tmp_dir(const std::string& name) {
  const std::string d = llm::testing::tmp_path(name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

using llm::testing::status_of;

// ---------------------------------------------------------------------------
// safetensors writing (test side): 8-byte length, JSON header padded with
// spaces to a multiple of 8 (as the reference writer does), data.

struct StEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

std::string make_safetensors(const std::vector<StEntry>& ts, const std::map<std::string, std::string>& meta = {}) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!meta.empty()) h["__metadata__"] = meta;
  uint64_t off = 0;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  out += header;
  for (const auto& t : ts) out += t.bytes;
  return out;
}

std::string floats_as(const float* v, int64_t n, const std::string& dtype) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&v[i]), 4);
    } else {
      const uint16_t h = dtype == "F16" ? llm::f32_to_f16(v[i]) : llm::f32_to_bf16(v[i]);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

// HF's own permutation (convert_llama_weights_to_hf.py): rows viewed as
// [n_heads, head_dim/2, 2] and transposed to [n_heads, 2, head_dim/2], i.e.
// the adjacent pair (2i, 2i+1) of the Meta/GGUF layout goes to (i, i+hd/2).
std::vector<float> to_hf_layout(const float* w, int64_t n_heads, int64_t hd, int64_t cols) {
  std::vector<float> out(size_t(n_heads * hd * cols));
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t pair = 0; pair < hd / 2; ++pair)
      for (int64_t which = 0; which < 2; ++which) {
        const float* src = w + (h * hd + pair * 2 + which) * cols;
        float* dst = &out[size_t((h * hd + which * (hd / 2) + pair) * cols)];
        std::copy(src, src + cols, dst);
      }
  return out;
}

// --- stories260K as an HF folder

struct HfExport {
  std::string dtype = "F32";
  int shards = 1;
  bool tokenizer_model = true;
  bool tokenizer_json = false;
  bool lm_head = false;  // write an explicit (untied) lm_head
};

const llm::ModelSource& stories() {
  static const llm::ModelSource src = llm::read_llama2c(model_path("stories260K.bin"), model_path("tok512.bin"));
  return src;
}

std::string hf_name(const std::string& gguf) {
  if (gguf == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf == "output_norm.weight") return "model.norm.weight";
  if (gguf == "output.weight") return "lm_head.weight";
  const size_t dot = gguf.find('.', 4);
  const std::string layer = gguf.substr(4, dot - 4), rest = gguf.substr(dot + 1);
  const std::map<std::string, std::string> m = {
      {"attn_norm.weight", "input_layernorm.weight"},        {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},          {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},     {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},           {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  return "model.layers." + layer + "." + m.at(rest);
}

nlohmann::json stories_config(bool tied) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", 64},
          {"intermediate_size", 172},
          {"num_hidden_layers", 5},
          {"num_attention_heads", 8},
          {"num_key_value_heads", 4},
          {"vocab_size", 512},
          {"max_position_embeddings", 512},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", tied},
          {"bos_token_id", 1},
          {"eos_token_id", 2},
          {"torch_dtype", "float32"}};
}

// tokenizer.json in the style of HF's SentencePiece conversion: vocab with
// '▁' pieces and byte pieces, merges (a, b) for every split of a piece into
// two pieces, ordered by the piece's SentencePiece score.
nlohmann::json spm_tokenizer_json(const llm::VocabData& v) {
  nlohmann::json vocab = nlohmann::json::object();
  std::map<std::string, int> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    vocab[v.tokens[i]] = int(i);
    ids[v.tokens[i]] = int(i);
  }
  std::vector<int> order(v.tokens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v.scores[size_t(a)] > v.scores[size_t(b)]; });
  nlohmann::json merges = nlohmann::json::array();
  for (int id : order) {
    const std::string& p = v.tokens[size_t(id)];
    if (v.types[size_t(id)] != int32_t(llm::TokenType::Normal)) continue;
    for (size_t k = 1; k < p.size(); ++k) {
      if ((static_cast<unsigned char>(p[k]) & 0xC0) == 0x80) continue;  // not inside a UTF-8 sequence
      const std::string a = p.substr(0, k), b = p.substr(k);
      if (ids.count(a) && ids.count(b)) merges.push_back(a + " " + b);
    }
  }
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const auto t = llm::TokenType(v.types[i]);
    if (t == llm::TokenType::Control || t == llm::TokenType::Unknown)
      added.push_back({{"id", int(i)}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  j["pre_tokenizer"] = nullptr;
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}}}}};
  j["model"] = {{"type", "BPE"},     {"dropout", nullptr}, {"unk_token", "<unk>"}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", true}, {"byte_fallback", true},
                {"vocab", vocab},    {"merges", merges}};
  return j;
}

void export_hf(const std::string& dir, const HfExport& opt) {
  const llm::ModelSource& src = stories();
  const llm::ModelConfig& c = src.config;
  std::vector<StEntry> entries;
  auto add = [&](const llm::TensorData& t, const std::string& name) {
    const float* w = reinterpret_cast<const float*>(t.data);
    std::vector<float> data(w, w + t.numel());
    if (t.name.find("attn_q") != std::string::npos) data = to_hf_layout(w, c.n_heads, c.head_dim, t.cols());
    if (t.name.find("attn_k") != std::string::npos) data = to_hf_layout(w, c.n_kv_heads, c.head_dim, t.cols());
    entries.push_back({name, opt.dtype, t.shape, floats_as(data.data(), t.numel(), opt.dtype)});
  };
  for (const auto& t : src.tensors) add(t, hf_name(t.name));
  if (opt.lm_head) add(*src.find("token_embd.weight"), "lm_head.weight");

  if (opt.shards == 1) {
    write_file(dir + "/model.safetensors", make_safetensors(entries, {{"format", "pt"}}));
  } else {
    nlohmann::json index;
    index["metadata"] = {{"total_size", 0}};
    const size_t per = (entries.size() + size_t(opt.shards) - 1) / size_t(opt.shards);
    for (int s = 0; s < opt.shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, opt.shards);
      std::vector<StEntry> part;
      for (size_t i = size_t(s) * per; i < std::min(entries.size(), size_t(s + 1) * per); ++i) {
        part.push_back(entries[i]);
        index["weight_map"][entries[i].name] = name;
      }
      write_file(dir + "/" + name, make_safetensors(part));
    }
    write_file(dir + "/model.safetensors.index.json", index.dump(2));
  }
  write_file(dir + "/config.json", stories_config(!opt.lm_head).dump(2));
  if (opt.tokenizer_model) write_file(dir + "/tokenizer.model", read_file(model_path("tok512.model")));
  if (opt.tokenizer_json) {
    const std::string m = read_file(model_path("tok512.model"));
    const llm::VocabData v =
        llm::parse_sentencepiece_model(reinterpret_cast<const uint8_t*>(m.data()), m.size());
    write_file(dir + "/tokenizer.json", spm_tokenizer_json(v).dump());
    write_file(dir + "/tokenizer_config.json",
               nlohmann::json({{"add_bos_token", true}, {"add_eos_token", false}, {"bos_token", "<s>"},
                               {"eos_token", "</s>"}, {"unk_token", "<unk>"}})
                   .dump());
  }
}

// Greedy generation through the public API, llama2.c conventions (stop on BOS).
void expect_reference_generations(const std::string& llm_path) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.flags = LLM_LOAD_REFERENCE_MATH;
  p.n_threads = 2;
  llm_model* m = nullptr;
  ASSERT_EQ(llm_load(llm_path.c_str(), &p, &m), LLM_OK) << llm_last_error();
  int checked = 0;
  for (const auto& c : llm::testing::load_greedy_cases("stories260K_greedy.json")) {
    SCOPED_TRACE("prompt '" + c.prompt + "'");
    std::vector<llm_token> ids(c.prompt.size() + 8);
    size_t n = 0;
    ASSERT_EQ(llm_tokenize(m, c.prompt.data(), c.prompt.size(), LLM_TOKENIZE_ADD_BOS, ids.data(), ids.size(), &n),
              LLM_OK);
    ids.resize(n);
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), c.prompt_ids);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.kv_type = LLM_KV_F32;
    llm_session* s = nullptr;
    ASSERT_EQ(llm_session_create(m, &sp, &s), LLM_OK);
    ASSERT_EQ(llm_prefill(s, c.prompt_ids.data(), c.prompt_ids.size()), LLM_OK);
    std::vector<int32_t> gen;
    for (int i = 0; i < c.max_new_tokens; ++i) {
      llm_token t = -1;
      ASSERT_EQ(llm_decode_step(s, nullptr, &t), LLM_OK);
      if (t == 1) break;
      gen.push_back(t);
    }
    llm_session_free(s);
    EXPECT_EQ(gen, c.generated_ids);
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  llm_model_free(m);
}

}  // namespace

// ---------------------------------------------------------------------------
// JSON

TEST(Json, ParsesValues) {
  const std::string text =
      R"({"a": [1, -2, 3.5, 1e3, -0, 9007199254740993, true, false, null],
          "s": "x\"\\\/\b\f\n\r\t\u00e9\u2581\ud83d\ude00", "o": {"k": {}} , "e": []})";
  const llm::json::Value v = llm::json::parse(text.data(), text.size());
  const auto& a = v.find("a")->as_array("a");
  ASSERT_EQ(a.size(), 9u);
  EXPECT_EQ(a[0].as_int("a0"), 1);
  EXPECT_EQ(a[1].as_int("a1"), -2);
  EXPECT_FALSE(a[2].is_int());
  EXPECT_DOUBLE_EQ(a[2].as_double("a2"), 3.5);
  EXPECT_FALSE(a[3].is_int());
  EXPECT_DOUBLE_EQ(a[3].as_double("a3"), 1000.0);
  EXPECT_EQ(a[5].as_int("a5"), 9007199254740993LL);  // exact beyond 2^53
  EXPECT_TRUE(a[6].as_bool("a6"));
  EXPECT_FALSE(a[7].as_bool("a7"));
  EXPECT_TRUE(a[8].is_null());
  EXPECT_EQ(v.find("s")->as_string("s"), "x\"\\/\b\f\n\r\t\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80");
  EXPECT_TRUE(v.find("o")->find("k")->is_object());
  EXPECT_TRUE(v.find("e")->as_array("e").empty());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(v.get_int("missing", 7), 7);
  EXPECT_EQ(status_of([&] { v.find("s")->as_int("s"); }), LLM_ERR_FORMAT);
  EXPECT_EQ(status_of([&] { v.get_int("o", 0); }), LLM_ERR_FORMAT);
}

TEST(Json, RejectsMalformed) {
  const char* bad[] = {"",          "{",          "[1,]",       "{\"a\":}",   "{\"a\" 1}",     "[1 2]",
                       "01",        "1.",         "-",          "1e",         "tru",           "\"abc",
                       "\"\\x\"",   "\"\\u12\"",  "\"\\ud800\"", "\"\\udc00x\"", "\"a\nb\"",    "{} x",
                       "{\"a\":1,\"a\":2}",       "[1]]",       "nul",         "{1:2}",        "\"\\ud800\\u0041\""};
  for (const char* s : bad)
    EXPECT_EQ(status_of([&] { llm::json::parse(s, std::strlen(s)); }), LLM_ERR_FORMAT) << "'" << s << "'";
  // Nesting beyond the cap is an error, not a stack overflow.
  const std::string deep(100000, '[');
  EXPECT_EQ(status_of([&] { llm::json::parse(deep.data(), deep.size()); }), LLM_ERR_FORMAT);
  std::string ok_depth = std::string(60, '[') + std::string(60, ']');
  EXPECT_EQ(status_of([&] { llm::json::parse(ok_depth.data(), ok_depth.size()); }), LLM_OK);
  // Huge exponents saturate instead of failing; the reader of the value decides.
  const std::string big = "[1e400, -1e400, 1e-400]";
  const auto v = llm::json::parse(big.data(), big.size());
  EXPECT_TRUE(std::isinf(v.as_array("x")[0].as_double("x")));
  EXPECT_TRUE(std::isinf(v.as_array("x")[1].as_double("x")));
  EXPECT_EQ(v.as_array("x")[2].as_double("x"), 0.0);
}

// ---------------------------------------------------------------------------
// safetensors container

TEST(Safetensors, ParsesTensorsAndMetadata) {
  const float f[6] = {1, 2, 3, 4, 5, 6};
  const std::string file = make_safetensors(
      {{"a", "F32", {2, 3}, floats_as(f, 6, "F32")}, {"b", "BF16", {3}, floats_as(f, 3, "BF16")}, {"e", "I8", {0}, ""}},
      {{"format", "pt"}});
  const auto* d = reinterpret_cast<const uint8_t*>(file.data());
  const llm::SafetensorsFile st = llm::parse_safetensors(d, file.size());
  ASSERT_EQ(st.tensors.size(), 3u);
  EXPECT_EQ(st.metadata.at("format"), "pt");
  const llm::SafetensorsTensor* a = st.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, "F32");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(a->nbytes, 24u);
  EXPECT_EQ(std::memcmp(a->data, f, 24), 0);
  const llm::SafetensorsTensor* b = st.find("b");
  ASSERT_NE(b, nullptr);
  uint16_t h;
  std::memcpy(&h, b->data + 4, 2);
  EXPECT_EQ(llm::bf16_to_f32(h), 3.0f);
  EXPECT_EQ(st.find("e")->nbytes, 0u);
}

TEST(Safetensors, EveryTruncationIsFormatError) {
  const float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string file =
      make_safetensors({{"w", "F32", {2, 2}, floats_as(f, 4, "F32")}, {"v", "F16", {4}, floats_as(f + 4, 4, "F16")}});
  for (size_t n = 0; n < file.size(); ++n) {
    const std::vector<uint8_t> cut(file.begin(), file.begin() + std::ptrdiff_t(n));
    EXPECT_EQ(status_of([&] { llm::parse_safetensors(cut.data(), cut.size()); }), LLM_ERR_FORMAT) << n << " bytes";
  }
  EXPECT_EQ(status_of([&] { llm::parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size()); }),
            LLM_OK);
}

TEST(Safetensors, HostileHeadersAreFormatErrors) {
  auto with_header = [](const std::string& header, size_t data_bytes, uint64_t claimed = UINT64_MAX) {
    std::string out(8, '\0');
    const uint64_t n = claimed == UINT64_MAX ? header.size() : claimed;
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return out + header + std::string(data_bytes, '\x01');
  };
  const std::vector<std::pair<std::string, size_t>> cases = {
      {R"([1, 2])", 0},                                                                  // not an object
      {R"({"w": 5})", 0},                                                                // entry not an object
      {R"({"w": {"dtype": "F32", "shape": [2]}})", 8},                                    // no offsets
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8},          // past the end
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 0]}})", 8},           // end < begin
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 8},          // negative
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8},           // size != shape
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8},          // negative dim
      {R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8},         // fractional dim
      {R"({"w": {"dtype": 3, "shape": [2], "data_offsets": [0, 8]}})", 8},               // dtype not a string
      {R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776, 1099511627776], "data_offsets": [0, 8]}})",
       8},                                                                                // numel overflow
      {R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 8]}})", 8},  // dim too big
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}})", 8},        // 3 offsets
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12},          // overlap
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8},            // duplicate name
      {R"({"__metadata__": {"k": 1}})", 0},                                               // metadata not strings
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551615]}})", 8},  // > int64
  };
  for (const auto& c : cases) {
    const std::string f = with_header(c.first, c.second);
    EXPECT_EQ(status_of([&] { llm::parse_safetensors(reinterpret_cast<const uint8_t*>(f.data()), f.size()); }),
              LLM_ERR_FORMAT)
        << c.first;
  }
  // Header length fields that lie.
  const std::string good = R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  for (uint64_t claimed : {uint64_t(0), uint64_t(good.size() + 9), uint64_t(1) << 40, UINT64_MAX - 1,
                           (uint64_t(100) << 20) + 1}) {
    const std::string f = with_header(good, 8, claimed);
    EXPECT_EQ(status_of([&] { llm::parse_safetensors(reinterpret_cast<const uint8_t*>(f.data()), f.size()); }),
              LLM_ERR_FORMAT)
        << claimed;
  }
  // An unknown dtype is accepted by the container (bounds still checked)...
  const std::string unk =
      with_header(R"({"w": {"dtype": "F4_X", "shape": [2], "data_offsets": [0, 3]}})", 3);
  EXPECT_EQ(status_of([&] { llm::parse_safetensors(reinterpret_cast<const uint8_t*>(unk.data()), unk.size()); }),
            LLM_OK);
}

TEST(Safetensors, RandomHeaderMutationsNeverCrash) {
  const float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::string file =
      make_safetensors({{"w", "F32", {2, 2}, floats_as(f, 4, "F32")}, {"v", "BF16", {4}, floats_as(f + 4, 4, "BF16")}});
  std::mt19937 rng(1234);
  int ok = 0, format = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string m = file;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % std::min<size_t>(m.size(), 8 + 140);  // length field and header
      m[at] = char(rng() & 0xff);
    }
    const llm_status st =
        status_of([&] { llm::parse_safetensors(reinterpret_cast<const uint8_t*>(m.data()), m.size()); });
    ASSERT_TRUE(st == LLM_OK || st == LLM_ERR_FORMAT) << st;
    (st == LLM_OK ? ok : format)++;
  }
  EXPECT_GT(format, 1000);
}

// ---------------------------------------------------------------------------
// Q/K layout

TEST(HfFolder, RopePermutationMatchesRotateHalf) {
  // Explicit: one head of 4 rows. HF rows (0, 1 | 2, 3) hold the rotate-half
  // pairs (0, 2) and (1, 3); the adjacent-pair layout wants 0, 2, 1, 3.
  const uint8_t hf[4] = {10, 11, 12, 13};
  uint8_t gg[4], back[4];
  llm::permute_rope_rows(hf, gg, 1, 4, 1, false);
  EXPECT_EQ(std::vector<uint8_t>(gg, gg + 4), (std::vector<uint8_t>{10, 12, 11, 13}));
  llm::permute_rope_rows(gg, back, 1, 4, 1, true);
  EXPECT_EQ(std::vector<uint8_t>(back, back + 4), (std::vector<uint8_t>{10, 11, 12, 13}));

  // Semantics: HF's rotate-half RoPE of W_hf x equals, row for row under the
  // permutation, the adjacent-pair RoPE of W_gguf x (same frequencies).
  const int64_t heads = 3, hd = 8, cols = 5, rows = heads * hd;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> w_hf(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(cols));
  for (auto& v : w_hf) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  std::vector<float> w_gg(w_hf.size());
  llm::permute_rope_rows(reinterpret_cast<const uint8_t*>(w_hf.data()), reinterpret_cast<uint8_t*>(w_gg.data()),
                         heads, hd, size_t(cols) * 4, false);
  auto matvec = [&](const std::vector<float>& w) {
    std::vector<double> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) y[size_t(r)] += double(w[size_t(r * cols + c)]) * x[size_t(c)];
    return y;
  };
  std::vector<double> q_hf = matvec(w_hf), q_gg = matvec(w_gg);
  const double pos = 5, theta = 10000;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * double(i) / double(hd));
      double& h0 = q_hf[size_t(h * hd + i)];
      double& h1 = q_hf[size_t(h * hd + i + hd / 2)];
      const double r0 = h0 * std::cos(a) - h1 * std::sin(a), r1 = h1 * std::cos(a) + h0 * std::sin(a);
      h0 = r0;
      h1 = r1;
      double& g0 = q_gg[size_t(h * hd + 2 * i)];
      double& g1 = q_gg[size_t(h * hd + 2 * i + 1)];
      const double s0 = g0 * std::cos(a) - g1 * std::sin(a), s1 = g0 * std::sin(a) + g1 * std::cos(a);
      g0 = s0;
      g1 = s1;
    }
  }
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < hd / 2; ++i) {
      EXPECT_NEAR(q_gg[size_t(h * hd + 2 * i)], q_hf[size_t(h * hd + i)], 1e-9);
      EXPECT_NEAR(q_gg[size_t(h * hd + 2 * i + 1)], q_hf[size_t(h * hd + i + hd / 2)], 1e-9);
    }
}

// ---------------------------------------------------------------------------
// Whole folders

TEST(HfFolder, Stories260KRoundTripsBitExactAndGenerates) {
  const std::string dir = tmp_dir("hf_stories_f32");
  export_hf(dir, HfExport{});
  ASSERT_TRUE(llm::is_hf_folder(dir));
  const llm::ModelSource got = llm::read_hf_folder(dir, nullptr);
  const llm::ModelSource& want = stories();
  EXPECT_EQ(got.config.dim, 64);
  EXPECT_EQ(got.config.n_kv_heads, 4);
  EXPECT_EQ(got.config.head_dim, 8);
  EXPECT_FLOAT_EQ(got.config.norm_eps, 1e-5f);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  EXPECT_EQ(got.find("output.weight"), nullptr);  // tied
  for (const auto& w : want.tensors) {
    const llm::TensorData* g = got.find(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->dtype, llm::DType::F32);
    EXPECT_EQ(g->shape, w.shape) << w.name;
    ASSERT_EQ(g->nbytes, w.nbytes) << w.name;
    EXPECT_EQ(std::memcmp(g->data, w.data, w.nbytes), 0) << w.name << " differs after HF -> GGUF layout";
  }
  // tokenizer.model: exactly the llama2.c vocabulary.
  EXPECT_EQ(got.vocab.tokens, want.vocab.tokens);
  EXPECT_EQ(got.vocab.scores, want.vocab.scores);
  EXPECT_EQ(got.vocab.types, want.vocab.types);
  EXPECT_EQ(got.vocab.bos, 1);
  EXPECT_EQ(got.vocab.eos, 2);
  EXPECT_EQ(got.vocab.unk, 0);
  EXPECT_TRUE(got.vocab.add_space_prefix);

  const std::string out = dir + "/converted.llm";
  llm::write_llm(got, out);
  expect_reference_generations(out);
}

TEST(HfFolder, ShardedHalfPrecisionAndUntiedHead) {
  for (const char* dtype : {"F16", "BF16"}) {
    SCOPED_TRACE(dtype);
    const std::string dir = tmp_dir(std::string("hf_stories_sharded_") + dtype);
    HfExport opt;
    opt.dtype = dtype;
    opt.shards = 3;
    opt.lm_head = true;
    export_hf(dir, opt);
    const llm::ModelSource got = llm::read_hf_folder(dir, nullptr);
    const llm::TensorData* out = got.find("output.weight");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(got.tensors.size(), stories().tensors.size() + 1);
    for (const auto& w : stories().tensors) {
      const llm::TensorData* g = got.find(w.name);
      ASSERT_NE(g, nullptr) << w.name;
      EXPECT_EQ(g->dtype, std::string(dtype) == "F16" ? llm::DType::F16 : llm::DType::BF16);
      ASSERT_EQ(g->nbytes, w.nbytes / 2);
      const float* f = reinterpret_cast<const float*>(w.data);
      for (int64_t i = 0; i < w.numel(); ++i) {
        uint16_t h;
        std::memcpy(&h, g->data + 2 * i, 2);
        const uint16_t expect = std::string(dtype) == "F16" ? llm::f32_to_f16(f[i]) : llm::f32_to_bf16(f[i]);
        ASSERT_EQ(h, expect) << w.name << "[" << i << "]";
      }
    }
    EXPECT_EQ(std::memcmp(out->data, got.find("token_embd.weight")->data, out->nbytes), 0);
    // The shards stay mapped as long as the tensors live.
    const llm::ModelSource copy = [&] {
      llm::ModelSource tmp = llm::read_hf_folder(dir, nullptr);
      llm::ModelSource only;
      only.tensors.push_back(*tmp.find("output_norm.weight"));
      return only;
    }();
    EXPECT_EQ(copy.tensors[0].shape, (std::vector<int64_t>{64}));
    float first;
    uint16_t h;
    std::memcpy(&h, copy.tensors[0].data, 2);
    first = std::string(dtype) == "F16" ? llm::f16_to_f32(h) : llm::bf16_to_f32(h);
    EXPECT_TRUE(std::isfinite(first));
  }
}

TEST(HfFolder, TokenizerJsonSentencePieceStyleGenerates) {
  const std::string dir = tmp_dir("hf_stories_tokjson");
  HfExport opt;
  opt.tokenizer_model = false;
  opt.tokenizer_json = true;
  export_hf(dir, opt);
  const llm::ModelSource got = llm::read_hf_folder(dir, nullptr);
  EXPECT_EQ(got.vocab.model, "llama");
  EXPECT_EQ(got.vocab.tokens, stories().vocab.tokens);
  EXPECT_EQ(got.vocab.types, stories().vocab.types);
  EXPECT_TRUE(got.vocab.add_space_prefix);
  EXPECT_EQ(got.vocab.bos, 1);
  EXPECT_EQ(got.vocab.eos, 2);
  const std::string out = dir + "/converted.llm";
  llm::write_llm(got, out);
  expect_reference_generations(out);  // also checks every prompt's token ids
}

namespace {

std::vector<std::string> split_inputs(const std::string& all) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t at = 0;
  for (size_t p; (p = all.find(sep, at)) != std::string::npos; at = p + sep.size()) texts.push_back(all.substr(at, p - at));
  return texts;
}

std::vector<std::vector<int32_t>> read_outputs(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

int check_hf_vectors(const llm::Tokenizer& t, const std::string& name) {
  const auto texts = split_inputs(read_file(model_path(name + ".inp")));
  const auto expected = read_outputs(model_path(name + ".out"));
  EXPECT_EQ(texts.size(), 46u);
  EXPECT_EQ(expected.size(), texts.size());
  int passed = 0;
  for (size_t i = 0; i < texts.size() && i < expected.size(); ++i) {
    std::vector<int32_t> got;
    t.encode(texts[i], false, false, got);
    EXPECT_EQ(got, expected[i]) << name << " text " << i << ": '" << texts[i] << "'";
    passed += got == expected[i];
  }
  return passed;
}

llm::VocabData vocab_from_json(const nlohmann::json& j, const nlohmann::json* tcfg, std::string* warning) {
  const std::string s = j.dump();
  const llm::json::Value v = llm::json::parse(s.data(), s.size(), "tokenizer.json");
  std::unique_ptr<llm::json::Value> cfg;
  if (tcfg) {
    const std::string c = tcfg->dump();
    cfg = std::make_unique<llm::json::Value>(llm::json::parse(c.data(), c.size()));
  }
  return llm::parse_hf_tokenizer_json(v, cfg.get(), nullptr, warning);
}

}  // namespace

TEST(HfTokenizer, Llama2TokenizerJsonMatchesHuggingFace) {
  // The real 32000-token Llama 2 vocabulary as HF's tokenizer.json would hold
  // it (no scores, merges instead): the merge-rank scores must reproduce HF's
  // ids for all 46 texts.
  const llm::VocabData ref = llm::read_gguf(model_path("ggml-vocab-llama-spm.gguf"), true, nullptr).vocab;
  std::string warning;
  const llm::VocabData v = vocab_from_json(spm_tokenizer_json(ref), nullptr, &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(v.model, "llama");
  EXPECT_EQ(v.tokens, ref.tokens);
  EXPECT_EQ(v.types, ref.types);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  const auto tok = llm::Tokenizer::create(v);
  EXPECT_EQ(check_hf_vectors(*tok, "ggml-vocab-llama-spm.gguf"), 46);
}

TEST(HfTokenizer, ByteLevelGpt2MatchesHuggingFace) {
  const llm::VocabData ref = llm::read_gguf(model_path("ggml-vocab-gpt-2.gguf"), true, nullptr).vocab;
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < ref.tokens.size(); ++i) {
    vocab[ref.tokens[i]] = int(i);
    if (ref.tokens[i] == "<|endoftext|>")
      added.push_back({{"id", int(i)}, {"content", ref.tokens[i]}, {"special", true}});
  }
  nlohmann::json j;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}};
  j["decoder"] = {{"type", "ByteLevel"}};
  // Newer tokenizers files store merges as pairs.
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : ref.merges) {
    const size_t sp = m.find(' ');
    merges.push_back({m.substr(0, sp), m.substr(sp + 1)});
  }
  j["model"] = {{"type", "BPE"}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}};
  const nlohmann::json tcfg = {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}};
  std::string warning;
  const llm::VocabData v = vocab_from_json(j, &tcfg, &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "gpt-2");
  EXPECT_EQ(v.merges, ref.merges);
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.eos, 50256);
  EXPECT_EQ(v.types[50256], int32_t(llm::TokenType::Control));
  const auto tok = llm::Tokenizer::create(v);
  EXPECT_EQ(check_hf_vectors(*tok, "ggml-vocab-gpt-2.gguf"), 46);

  // The Llama 3 layout: a Split regex, then ByteLevel without its own regex,
  // and a template post-processor that adds <|begin_of_text|>.
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  warning.clear();
  const llm::VocabData v3 = vocab_from_json(j, nullptr, &warning);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(v3.pre, "llama3");
  EXPECT_TRUE(v3.add_bos);
  EXPECT_EQ(v3.bos, 50256);
  // An unknown regex falls back with a warning.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+";
  warning.clear();
  EXPECT_EQ(vocab_from_json(j, nullptr, &warning).pre, "default");
  EXPECT_FALSE(warning.empty());
}

// ---------------------------------------------------------------------------
// Every family as a Hugging Face folder. tests/data/families/hf.json
// (tests/tools/make_family_hf.py) gives each tiny family model's config.json
// and the HF name of each tensor, checked there against gguf-py's
// TensorNameMap; the folder is written from the GGUF's weights in HF's
// conventions (Gemma norms as w for 1 + w, Llama q/k rows in rotate-half
// order, LongRoPE factors in config.json) and must give llama.cpp's logits of
// the GGUF (tests/data/families/<name>.json) at every position.

namespace {

const nlohmann::json& hf_families() {
  static const nlohmann::json j =
      nlohmann::json::parse(read_file(std::string(LLM_TEST_DATA_DIR) + "/families/hf.json"));
  return j;
}

std::string export_family_hf(const std::string& name) {
  const nlohmann::json& f = hf_families().at("families").at(name);
  const std::string dir = tmp_dir("hf_family_" + name);
  const llm::ModelSource src = llm::read_gguf(std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".gguf", false,
                                              nullptr);
  const llm::ModelConfig& c = src.config;
  std::vector<StEntry> entries;
  for (const llm::TensorData& t : src.tensors) {
    if (t.name.compare(0, 13, "rope_factors_") == 0) continue;  // config.json's long_factor / short_factor
    EXPECT_EQ(t.dtype, llm::DType::F32) << t.name;
    const float* w = reinterpret_cast<const float*>(t.data);
    std::vector<float> data(w, w + t.numel());
    const bool norm = t.name.size() > 11 && t.name.compare(t.name.size() - 11, 11, "norm.weight") == 0;
    if (f.at("norm_minus_one").get<bool>() && norm)
      for (float& v : data) v -= 1.0f;
    if (f.at("rope_rotate_half").get<bool>()) {
      if (t.name.find(".attn_q.weight") != std::string::npos) data = to_hf_layout(w, c.n_heads, c.head_dim, t.cols());
      if (t.name.find(".attn_k.weight") != std::string::npos) data = to_hf_layout(w, c.n_kv_heads, c.head_dim, t.cols());
    }
    entries.push_back({f.at("tensors").at(t.name).get<std::string>(), "F32", t.shape,
                       floats_as(data.data(), int64_t(data.size()), "F32")});
  }
  write_file(dir + "/model.safetensors", make_safetensors(entries, {{"format", "pt"}}));
  write_file(dir + "/config.json", f.at("config").dump(1));
  write_file(dir + "/tokenizer.model", read_file(model_path("tok512.model")));
  return dir;
}

class HfFamily : public ::testing::TestWithParam<const char*> {};

TEST_P(HfFamily, FolderGivesLlamaCppLogitsOfTheGguf) {
  const std::string name = GetParam();
  const std::string dir = export_family_hf(name);
  llm::LoadOptions o;
  o.n_threads = 2;
  o.huge_pages = false;
  o.reference_math = true;
  const std::unique_ptr<llm::Model> hf = llm::Model::from_source(llm::read_hf_folder(dir, nullptr), o);
  const std::unique_ptr<llm::Model> gg =
      llm::Model::load(std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".gguf", o);
  // The same block, but for how the norms are stored.
  llm::testing::expect_same_block_spec(hf->spec(), gg->spec());
  EXPECT_EQ(hf->spec().norm_offset, name.compare(0, 5, "gemma") == 0 ? 1.0f : 0.0f);

  const nlohmann::json ref =
      nlohmann::json::parse(read_file(std::string(LLM_TEST_DATA_DIR) + "/families/" + name + ".json"));
  llm::SessionOptions so;
  so.kv_type = LLM_KV_F32;
  double worst = 0;
  for (const auto& cs : ref.at("cases")) {
    std::vector<int32_t> seq = cs.at("prompt_token_ids").get<std::vector<int32_t>>();
    const auto gen = cs.at("generated_token_ids").get<std::vector<int32_t>>();
    std::vector<std::vector<float>> want = cs.at("prompt_logits").get<std::vector<std::vector<float>>>();
    const auto gen_logits = cs.at("generated_logits").get<std::vector<std::vector<float>>>();
    seq.insert(seq.end(), gen.begin(), gen.end() - 1);
    want.insert(want.end(), gen_logits.begin(), gen_logits.end());
    llm::Session s(*hf, so);
    for (size_t i = 0; i < seq.size(); ++i) {
      s.prefill(&seq[i], 1);
      worst = std::max(worst, llm::testing::relative_error(s.logits(), want[i]));
    }
  }
  EXPECT_LE(worst, 1e-3) << name;
  std::printf("%s from an HF folder: worst max|diff| / range = %.2e\n", name.c_str(), worst);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamily,
                         ::testing::Values("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2_yarn",
                                           "phi3_longrope"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Llama 3.1's rope_scaling becomes the rope_freqs.weight that GGUF files
// carry: the factors of Llama 3.1 8B's config, against the published rule
// evaluated in numpy (hf.json).
TEST(HfFolder, Llama3RopeScalingFactors) {
  const nlohmann::json& j = hf_families().at("llama3_rope_factors");
  const nlohmann::json& rs = j.at("config").at("rope_scaling");
  const auto want = j.at("factors").get<std::vector<double>>();
  const std::vector<float> got = llm::llama3_rope_factors(
      j.at("config").at("head_dim").get<int32_t>(), j.at("config").at("rope_theta").get<double>(),
      rs.at("factor").get<double>(), rs.at("low_freq_factor").get<double>(), rs.at("high_freq_factor").get<double>(),
      double(rs.at("original_max_position_embeddings").get<int64_t>()));
  ASSERT_EQ(got.size(), want.size());
  int smoothed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << i;
    if (want[i] > 1.0 && want[i] < 8.0) ++smoothed;
  }
  EXPECT_GT(smoothed, 0);  // the case covers the interpolated band too
}

// HF-specific refusals: settings the engine does not implement, and weights
// it would not use, name the key or tensor.
TEST(HfFolder, FamilyFoldersRefuseWhatTheyCannotRun) {
  const std::string dir = export_family_hf("qwen2");
  const std::string config = read_file(dir + "/config.json");
  auto expect = [&](llm_status want, const char* named, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(config);
    edit(c);
    write_file(dir + "/config.json", c.dump());
    llm_status st = LLM_OK;
    std::string msg;
    try {
      llm::read_hf_folder(dir, nullptr);
    } catch (const llm::Error& e) {
      st = e.status();
      msg = e.what();
    }
    EXPECT_EQ(st, want) << named << ": " << msg;
    EXPECT_NE(msg.find(named), std::string::npos) << msg;
  };
  expect(LLM_ERR_UNSUPPORTED, "use_sliding_window", [](nlohmann::json& c) { c["use_sliding_window"] = true; });
  expect(LLM_ERR_UNSUPPORTED, "dynamic",
         [](nlohmann::json& c) { c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}}; });
  expect(LLM_ERR_FORMAT, "llama3",
         [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
  expect(LLM_ERR_FORMAT, "long_factor", [](nlohmann::json& c) {
    c["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0, 2.0}}, {"short_factor", {1.0, 2.0}}};
    c["original_max_position_embeddings"] = 256;
  });
  expect(LLM_ERR_UNSUPPORTED, "hidden_act", [](nlohmann::json& c) { c["hidden_act"] = "relu"; });
  expect(LLM_ERR_FORMAT, "partial_rotary_factor", [](nlohmann::json& c) { c["partial_rotary_factor"] = 1.5; });
  expect(LLM_OK, "", [](nlohmann::json&) {});
  // A tensor inside the decoder that no part of the block uses.
  {
    const std::string st = read_file(dir + "/model.safetensors");
    const llm::SafetensorsFile f = llm::parse_safetensors(reinterpret_cast<const uint8_t*>(st.data()), st.size());
    std::vector<StEntry> entries;
    for (const auto& t : f.tensors)
      entries.push_back({t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
    const float z[4] = {0, 0, 0, 0};
    entries.push_back({"model.layers.0.self_attn.extra_gate.weight", "F32", {4}, floats_as(z, 4, "F32")});
    write_file(dir + "/model.safetensors", make_safetensors(entries));
    expect(LLM_ERR_UNSUPPORTED, "model.layers.0.self_attn.extra_gate.weight", [](nlohmann::json&) {});
  }
  fs::remove_all(dir);
}

}  // namespace

TEST(HfFolder, RejectsBadFolders) {
  const std::string dir = tmp_dir("hf_bad");
  export_hf(dir, HfExport{});
  const std::string config = read_file(dir + "/config.json");
  auto expect_status = [&](llm_status want, const char* what) {
    EXPECT_EQ(status_of([&] { llm::read_hf_folder(dir, nullptr); }), want) << what;
  };
  auto set_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = nlohmann::json::parse(config);
    edit(c);
    write_file(dir + "/config.json", c.dump());
  };
  set_config([](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; });
  expect_status(LLM_ERR_FORMAT, "rope_scaling llama3 without its frequency bounds");
  set_config([](nlohmann::json& c) {
    c["model_type"] = "gpt2";
    c["architectures"] = {"GPT2LMHeadModel"};
  });
  expect_status(LLM_ERR_UNSUPPORTED, "gpt2");
  set_config([](nlohmann::json& c) { c["num_key_value_heads"] = 3; });
  expect_status(LLM_ERR_FORMAT, "heads not a multiple");
  set_config([](nlohmann::json& c) { c["hidden_size"] = -64; });
  expect_status(LLM_ERR_FORMAT, "negative size");
  set_config([](nlohmann::json& c) { c["intermediate_size"] = 173; });
  expect_status(LLM_ERR_FORMAT, "shape mismatch");
  write_file(dir + "/config.json", "{\"model_type\": \"llama\", ");
  expect_status(LLM_ERR_FORMAT, "truncated config.json");
  write_file(dir + "/config.json", config);
  expect_status(LLM_OK, "restored");

  // A weight in an unsupported dtype.
  const std::string st = read_file(dir + "/model.safetensors");
  {
    const std::vector<float> z(64, 1.0f);
    std::vector<StEntry> entries;
    const llm::SafetensorsFile f = llm::parse_safetensors(reinterpret_cast<const uint8_t*>(st.data()), st.size());
    for (const auto& t : f.tensors) {
      std::string bytes(reinterpret_cast<const char*>(t.data), t.nbytes);
      std::string dtype = t.dtype;
      if (t.name == "model.norm.weight") {
        dtype = "I32";  // same size, wrong type
      }
      entries.push_back({t.name, dtype, t.shape, bytes});
    }
    write_file(dir + "/model.safetensors", make_safetensors(entries));
    expect_status(LLM_ERR_UNSUPPORTED, "I32 weight");
    entries.pop_back();  // drop a tensor
    write_file(dir + "/model.safetensors", make_safetensors(entries));
    expect_status(LLM_ERR_FORMAT, "missing tensor");
  }
  write_file(dir + "/model.safetensors", st.substr(0, st.size() - 3));
  expect_status(LLM_ERR_FORMAT, "truncated weights");
  write_file(dir + "/model.safetensors", st);
  expect_status(LLM_OK, "restored weights");

  // Sharded index naming a file outside the folder.
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"model.norm.weight": "../hf_stories_f32/model.safetensors"}})");
  expect_status(LLM_ERR_FORMAT, "path traversal");
  fs::remove(dir + "/model.safetensors.index.json");

  // A unigram SentencePiece model (trainer_spec.model_type = 1 appended:
  // protobuf merges a repeated message field, so the last value wins).
  std::string spm = read_file(model_path("tok512.model"));
  write_file(dir + "/tokenizer.model", spm + std::string("\x12\x02\x18\x01", 4));
  expect_status(LLM_ERR_UNSUPPORTED, "unigram");
  for (size_t cut : {size_t(1), size_t(7), spm.size() / 2, spm.size() - 1}) {
    write_file(dir + "/tokenizer.model", spm.substr(0, cut));
    expect_status(LLM_ERR_FORMAT, "truncated tokenizer.model");
  }
  fs::remove(dir + "/tokenizer.model");
  expect_status(LLM_ERR_IO, "no tokenizer");
}

TEST(HfTokenizer, SentencePieceModelEqualsLlama2cTokenizer) {
  // tok512.model and tok512.bin are exports of the same model.
  const std::string m = read_file(model_path("tok512.model"));
  const llm::VocabData v = llm::parse_sentencepiece_model(reinterpret_cast<const uint8_t*>(m.data()), m.size());
  const llm::VocabData& ref = stories().vocab;
  EXPECT_EQ(v.tokens, ref.tokens);
  EXPECT_EQ(v.scores, ref.scores);
  EXPECT_EQ(v.types, ref.types);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.pad, -1);
  // Random corruption: never a crash.
  std::mt19937 rng(99);
  for (int it = 0; it < 2000; ++it) {
    std::string c = m;
    for (int k = 0; k < 3; ++k) c[rng() % c.size()] = char(rng() & 0xff);
    const llm_status st =
        status_of([&] { llm::parse_sentencepiece_model(reinterpret_cast<const uint8_t*>(c.data()), c.size()); });
    ASSERT_TRUE(st == LLM_OK || st == LLM_ERR_FORMAT || st == LLM_ERR_UNSUPPORTED) << st;
  }
}
