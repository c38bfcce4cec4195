// Every vocabulary in llama.cpp's models/ folder against its test vectors.
// The folder comes from LLM_VOCAB_DIR (tests/models/fetch_llamacpp_vocabs.sh
// fetches it); without it the test is skipped. For each ggml-vocab-NAME.gguf
// with NAME.gguf.inp/.out, every text is tokenized as llama.cpp's
// test-tokenizer-0 does (no BOS/EOS, special-token text not parsed) and
// compared with the ids the Hugging Face tokenizer gave; the pieces of the
// ids must give the text back. A vocabulary whose tokenizer model the
// library does not implement must be refused with LLM_ERR_UNSUPPORTED (by
// the GGUF reader and by Tokenizer::create); it is then listed as
// unsupported, not failed. A table of strings matched per vocabulary is
// printed at the end.
//   export LLM_VOCAB_DIR=$(tests/models/fetch_llamacpp_vocabs.sh)
//   build/bin/llm_tokenizer_tests --gtest_filter='LlamaCppVocabs.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "vocab_vectors.h"
#include "common/status_of.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace llm {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

std::string slurp(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// .inp: texts separated by "\n__ggml_vocab_test__\n"; as in llama.cpp's
// test-tokenizer-0, text after the last separator is one more text (the
// Gemma 4 file has no final separator).
std::vector<std::string> read_texts(const fs::path& path) {
  const std::string all = slurp(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t at = 0;
  for (size_t p; (p = all.find(sep, at)) != std::string::npos; at = p + sep.size())
    texts.push_back(all.substr(at, p - at));
  if (at < all.size()) texts.push_back(all.substr(at));
  return texts;
}

// .out: one line of ids per text.
std::vector<Ids> read_ids(const fs::path& path) { return testing::parse_vocab_ids(slurp(path)); }

std::string escaped(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '\n') {
      r += "\\n";
    } else if (c == '\t') {
      r += "\\t";
    } else if (c == '\r') {
      r += "\\r";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      r += buf;
    } else {
      r.push_back(char(c));
    }
  }
  return r;
}

std::string ids_text(const Ids& ids) {
  std::string r;
  for (int32_t id : ids) r += (r.empty() ? "" : " ") + std::to_string(id);
  return r;
}

const char* vocab_dir() {
  const char* dir = std::getenv("LLM_VOCAB_DIR");
  return (dir && *dir) ? dir : nullptr;
}

struct Result {
  std::string name;
  std::string model, pre;
  std::string status;  // "", or why the vocabulary was not compared
  int passed = 0, total = 0;
};

// The vocabulary of a GGUF through the library's reader.
std::unique_ptr<Tokenizer> load(const fs::path& path, Result& r) {
  const ModelSource src = read_gguf(path.string(), true, nullptr);
  r.model = src.vocab.model;
  r.pre = src.vocab.pre;
  return Tokenizer::create(src.vocab);
}

// The tokenizer.ggml.* keys as VocabData, mapped here rather than by
// read_gguf: for a tokenizer model that the tokenizer implements but the
// GGUF reader does not accept yet, so that the tokenizer can still be
// checked. Only the keys the vectors need.
VocabData vocab_from_metadata(const GgufFile& g) {
  VocabData v;
  auto str = [&](const char* key) {
    const GgufValue* x = g.get(key);
    return x && x->kind == GgufValue::STRING ? x->s : std::string();
  };
  auto arr = [&](const char* key) -> const std::vector<GgufValue>* {
    const GgufValue* x = g.get(key);
    return x && x->kind == GgufValue::ARRAY ? &x->arr : nullptr;
  };
  auto id = [&](const char* key) {
    const GgufValue* x = g.get(key);
    return x && x->kind != GgufValue::ARRAY && x->kind != GgufValue::STRING ? int32_t(x->as_int()) : -1;
  };
  auto flag = [&](const char* key, bool dflt) {
    const GgufValue* x = g.get(key);
    return x && x->kind == GgufValue::BOOL ? x->u != 0 : dflt;
  };
  v.model = str("tokenizer.ggml.model");
  v.pre = str("tokenizer.ggml.pre");
  if (v.pre.empty()) v.pre = "default";
  if (const auto* a = arr("tokenizer.ggml.tokens"))
    for (const GgufValue& t : *a) v.tokens.push_back(t.s);
  if (const auto* a = arr("tokenizer.ggml.scores"))
    for (const GgufValue& t : *a) v.scores.push_back(float(t.as_float()));
  if (const auto* a = arr("tokenizer.ggml.token_type"))
    for (const GgufValue& t : *a) v.types.push_back(int32_t(t.as_int()));
  if (const auto* a = arr("tokenizer.ggml.merges"))
    for (const GgufValue& t : *a) v.merges.push_back(t.s);
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.add_bos = flag("tokenizer.ggml.add_bos_token", v.model == "llama");
  v.add_space_prefix = flag("tokenizer.ggml.add_space_prefix", v.model == "llama");
  return v;
}

GgufFile parse_vocab_gguf(const fs::path& path, std::shared_ptr<MappedFile>* keep) {
  *keep = MappedFile::open(path.string());
  return parse_gguf((*keep)->data(), (*keep)->size(), true);
}

TEST(LlamaCppVocabs, EveryVocabularyMatchesItsVectors) {
  const char* dir = vocab_dir();
  if (!dir) GTEST_SKIP() << "LLM_VOCAB_DIR is not set (tests/models/fetch_llamacpp_vocabs.sh prints a folder for it)";
  if (!fs::is_directory(dir)) GTEST_SKIP() << "LLM_VOCAB_DIR '" << dir << "' is not a folder";

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("ggml-vocab-", 0) == 0 && e.path().extension() == ".gguf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) GTEST_SKIP() << "no ggml-vocab-*.gguf in " << dir;

  std::vector<Result> results;
  for (const fs::path& path : files) {
    Result r;
    r.name = path.stem().string().substr(std::string("ggml-vocab-").size());
    const fs::path inp = path.string() + ".inp", out = path.string() + ".out";
    const bool has_vectors = fs::exists(inp) && fs::exists(out);
    std::unique_ptr<Tokenizer> tok;
    std::string msg;
    llm_status st = testing::status_of([&] { tok = load(path, r); }, &msg);
    if (st == LLM_ERR_UNSUPPORTED) {
      // Refused by the GGUF reader: is the tokenizer model itself unsupported?
      std::shared_ptr<MappedFile> keep;
      const VocabData v = vocab_from_metadata(parse_vocab_gguf(path, &keep));
      r.model = v.model;
      r.pre = v.pre;
      std::string tok_msg;
      const llm_status tok_st = testing::status_of([&] { tok = Tokenizer::create(v); }, &tok_msg);
      if (tok_st == LLM_ERR_UNSUPPORTED) {
        r.status = "unsupported: " + tok_msg;
        results.push_back(r);
        continue;
      }
      EXPECT_EQ(tok_st, LLM_OK) << r.name << ": " << tok_msg;
      r.status = "read_gguf refuses it (" + msg + "); vocabulary mapped by this test";
      st = tok_st;
      msg = tok_msg;
    }
    EXPECT_EQ(st, LLM_OK) << r.name << ": " << msg;
    if (st != LLM_OK) {
      r.status = "failed to load: " + msg;
      results.push_back(r);
      continue;
    }
    if (!tok->warning().empty()) r.status += (r.status.empty() ? "" : "; ") + ("warning: " + tok->warning());
    if (!has_vectors) {
      r.status = "loads; no test vectors" + (r.status.empty() ? "" : "; " + r.status);
      results.push_back(r);
      continue;
    }
    const auto texts = read_texts(inp);
    const auto expected = read_ids(out);
    EXPECT_FALSE(texts.empty()) << r.name;
    EXPECT_EQ(expected.size(), texts.size()) << r.name;
    r.total = int(texts.size());
    for (size_t i = 0; i < texts.size() && i < expected.size(); ++i) {
      Ids got;
      tok->encode(texts[i], false, false, got);
      // The pieces give the text back (SentencePiece: after its dummy prefix).
      std::string back;
      for (int32_t id : got) tok->append_piece(id, back);
      const bool prefix = r.model == "llama" && tok->strip_space_after_bos() && !texts[i].empty();
      EXPECT_EQ(back, (prefix ? " " : "") + texts[i]) << r.name << " text " << i << " decoded";
      if (got == expected[i]) {
        ++r.passed;
      } else {
        ADD_FAILURE() << r.name << " text " << i << " '" << escaped(texts[i]) << "'\n  expected: "
                      << ids_text(expected[i]) << "\n  got:      " << ids_text(got);
      }
    }
    results.push_back(r);
  }

  std::printf("\n%-18s %-8s %-16s %s\n", "vocab", "model", "pre", "strings");
  for (const Result& r : results) {
    std::string count = r.total > 0 ? std::to_string(r.passed) + "/" + std::to_string(r.total) : "-";
    std::printf("%-18s %-8s %-16s %-8s %s\n", r.name.c_str(), r.model.c_str(), r.pre.c_str(), count.c_str(),
                r.status.c_str());
  }
  std::fflush(stdout);
}

}  // namespace
}  // namespace llm
