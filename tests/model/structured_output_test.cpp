// Structured output on a real model (Gemma 3 270M Q4_K_M, LLM_GEMMA3_GGUF;
// skipped without it): seeded samples at temperature 1 under llama.cpp's
// json.gbnf and under five JSON Schemas (tests/data/json_schemas/). Every
// sample the grammar ended must parse as JSON, and under a schema validate
// against it (tests/common/json_schema_check.h, written apart from the
// converter); samples cut by the token cap are counted and reported.
//
// LLM_GRAMMAR_SAMPLES sets the number of json.gbnf samples (default 8, to
// keep CI short; the figure in docs/GRAMMAR.md is a run with 100) and
// LLM_SCHEMA_SAMPLES the samples per schema (default 3).
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "json_schema_check.h"
#include "llm.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// True if text is one JSON value by RFC 8259's grammar (whitespace around
// it allowed). Syntax only, written here because RFC 8259 (and json.gbnf)
// put no limit on a number's exponent while nlohmann's parser refuses
// numbers beyond a double's range (1e400).
class JsonSyntax {
 public:
  static bool check(const std::string& t) {
    JsonSyntax p{t};
    p.ws();
    if (!p.value(0)) return false;
    p.ws();
    return p.i == t.size();
  }

 private:
  const std::string& t;
  size_t i = 0;
  explicit JsonSyntax(const std::string& text) : t(text) {}
  bool at(char c) const { return i < t.size() && t[i] == c; }
  bool digit() const { return i < t.size() && t[i] >= '0' && t[i] <= '9'; }
  void ws() {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  }
  bool lit(const char* w) {
    const size_t n = std::strlen(w);
    if (t.compare(i, n, w) != 0) return false;
    i += n;
    return true;
  }
  bool string() {
    if (!at('"')) return false;
    for (++i; i < t.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(t[i]);
      if (c == '"') return ++i, true;
      if (c < 0x20) return false;
      if (c == '\\') {
        if (++i >= t.size()) return false;
        if (t[i] == 'u') {
          for (int k = 0; k < 4; ++k)
            if (++i >= t.size() || !std::isxdigit(static_cast<unsigned char>(t[i]))) return false;
        } else if (t[i] == '\0' || !std::strchr("\"\\/bfnrt", t[i])) {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    if (at('-')) ++i;
    if (at('0')) ++i;
    else if (digit()) while (digit()) ++i;
    else return false;
    if (at('.')) {
      ++i;
      if (!digit()) return false;
      while (digit()) ++i;
    }
    if (at('e') || at('E')) {
      ++i;
      if (at('+') || at('-')) ++i;
      if (!digit()) return false;
      while (digit()) ++i;
    }
    return true;
  }
  bool value(int depth) {
    if (depth > 512) return false;
    if (at('{')) {
      ++i, ws();
      if (at('}')) return ++i, true;
      for (;;) {
        if (!string()) return false;
        ws();
        if (!at(':')) return false;
        ++i, ws();
        if (!value(depth + 1)) return false;
        ws();
        if (at('}')) return ++i, true;
        if (!at(',')) return false;
        ++i, ws();
      }
    }
    if (at('[')) {
      ++i, ws();
      if (at(']')) return ++i, true;
      for (;;) {
        if (!value(depth + 1)) return false;
        ws();
        if (at(']')) return ++i, true;
        if (!at(',')) return false;
        ++i, ws();
      }
    }
    if (at('"')) return string();
    return lit("true") || lit("false") || lit("null") || number();
  }
};

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* p = std::getenv("LLM_GEMMA3_GGUF");
    if (!p || !*p) return;
    llm_load_params lp;
    llm_load_params_init(&lp);
    lp.n_threads = 2;
    if (llm_load(p, &lp, &model_) != LLM_OK) {
      ADD_FAILURE() << "load " << p << ": " << llm_last_error();
      model_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    llm_model_free(model_);
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "LLM_GEMMA3_GGUF is not set (tests/models/fetch_gemma3.sh)";
  }

  // The chat-template prompt for one user message, as tokens.
  static std::vector<llm_token> prompt(const std::string& user) {
    const llm_chat_message msg = {"user", user.c_str()};
    size_t len = 0;
    EXPECT_EQ(llm_chat_render(model_, &msg, 1, nullptr, nullptr, 0, &len), LLM_ERR_BUFFER_TOO_SMALL);
    std::vector<char> text(len + 1);
    EXPECT_EQ(llm_chat_render(model_, &msg, 1, nullptr, text.data(), text.size(), &len), LLM_OK);
    std::vector<llm_token> toks(len + 8);
    size_t n = 0;
    EXPECT_EQ(llm_tokenize(model_, text.data(), len, LLM_TOKENIZE_PARSE_SPECIAL, toks.data(), toks.size(), &n),
              LLM_OK);
    toks.resize(n);
    return toks;
  }

  struct Tally {
    int ended = 0, cut = 0;
    long tokens = 0;
  };

  // n seeded samples (temperature 1) from a fork of one prefilled session;
  // check(text) runs on every sample the grammar ended.
  static Tally sample(const llm_grammar* g, const std::vector<llm_token>& toks, int n, int cap,
                      const std::function<void(const std::string&, uint64_t)>& check) {
    llm_session* base = nullptr;
    EXPECT_EQ(llm_session_create(model_, nullptr, &base), LLM_OK);
    EXPECT_EQ(llm_prefill(base, toks.data(), toks.size()), LLM_OK);
    Tally t;
    std::vector<char> buf(1 << 16);
    for (int i = 0; i < n; ++i) {
      const uint64_t seed = 1000 + uint64_t(i);
      llm_session* s = nullptr;
      EXPECT_EQ(llm_session_fork(base, &s), LLM_OK);  // the prompt's pages are shared
      llm_sampling samp;
      llm_sampling_init(&samp);
      samp.temperature = 1.0f;
      samp.seed = seed;
      samp.grammar = g;
      llm_text_stream* ts = nullptr;
      EXPECT_EQ(llm_text_stream_create(model_, nullptr, 0, &ts), LLM_OK);
      std::string text;
      int32_t stopped = 0;
      int steps = 0;
      for (; steps < cap && !stopped; ++steps) {
        llm_token tok;
        if (llm_decode_step(s, &samp, &tok) != LLM_OK) {
          ADD_FAILURE() << "seed " << seed << ": " << llm_last_error();
          break;
        }
        size_t len = 0;
        EXPECT_EQ(llm_text_stream_push(ts, tok, buf.data(), buf.size(), &len, &stopped), LLM_OK);
        text.append(buf.data(), len);
      }
      t.tokens += steps;
      if (stopped) {
        ++t.ended;
        check(text, seed);
      } else {
        ++t.cut;
      }
      llm_text_stream_free(ts);
      llm_session_free(s);
    }
    llm_session_free(base);
    return t;
  }

  static llm_model* model_;
};
llm_model* StructuredOutput::model_ = nullptr;

TEST_F(StructuredOutput, JsonGbnfSamplesThatEndParse) {
  const std::string gbnf = read_file(std::string(LLM_TEST_DATA_DIR) + "/grammars/json.gbnf");
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_create(model_, gbnf.c_str(), nullptr, &g), LLM_OK) << llm_last_error();
  const int n = env_int("LLM_GRAMMAR_SAMPLES", 8);
  const Tally t = sample(g, prompt("Describe a cat as a JSON object."), n, 512, [](const std::string& text, uint64_t seed) {
    EXPECT_TRUE(JsonSyntax::check(text)) << "seed " << seed << ": " << text;
  });
  std::printf("json.gbnf: %d samples, %d ended by the grammar (all parse), %d cut by the 512-token cap, %ld tokens\n", n,
              t.ended, t.cut, t.tokens);
  EXPECT_GT(t.ended, 0);
  llm_grammar_free(g);
}

TEST_F(StructuredOutput, SchemaSamplesThatEndValidate) {
  const int n = env_int("LLM_SCHEMA_SAMPLES", 3);
  for (const char* name : {"npc_action", "person", "inventory", "shape", "weather"}) {
    const std::string schema_text = read_file(std::string(LLM_TEST_DATA_DIR) + "/json_schemas/" + name + ".json");
    const nlohmann::json schema = nlohmann::json::parse(schema_text);
    llm_grammar* g = nullptr;
    ASSERT_EQ(llm_grammar_from_json_schema(model_, schema_text.c_str(), &g), LLM_OK) << name << ": " << llm_last_error();
    const llm::testing::SchemaCheck validator(schema);
    const Tally t = sample(g, prompt("Reply with JSON that follows this schema:\n" + schema_text), n, 256,
                           [&](const std::string& text, uint64_t seed) {
                             const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
                             ASSERT_FALSE(j.is_discarded()) << name << " seed " << seed << ": " << text;
                             EXPECT_EQ(validator.check(j), "") << name << " seed " << seed << ": " << text;
                           });
    std::printf("%-10s %d samples, %d ended (all validate), %d cut by the 256-token cap\n", name, n, t.ended, t.cut);
    EXPECT_GT(t.ended, 0) << name;
    llm_grammar_free(g);
  }
}

}  // namespace
