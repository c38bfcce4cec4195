// Chat rendering and grammar-constrained sampling through the public API
// (llm_chat_render, llm_model_chat_template, llm_grammar_*, llm_sampling.grammar):
// template choice, NUL-terminated buffers, grammars that end the generation,
// state kept per session (fork) and started over (prefill), bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llm.h"

namespace {

std::string models_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }
std::string data_path(const char* name) { return std::string(LLM_TEST_DATA_DIR) + "/" + name; }

llm_model* load(const std::string& path) {
  llm_load_params p;
  llm_load_params_init(&p);
  p.n_threads = 1;
  llm_model* m = nullptr;
  EXPECT_EQ(llm_load(path.c_str(), &p, &m), LLM_OK) << path << ": " << llm_last_error();
  return m;
}

std::string render(const llm_model* m, const std::vector<llm_chat_message>& msgs, const char* tpl = nullptr,
                   bool gen = true, llm_status* status = nullptr) {
  llm_chat_params p;
  llm_chat_params_init(&p);
  p.template_source = tpl;
  p.add_generation_prompt = gen ? 1 : 0;
  size_t len = 0;
  llm_status st = llm_chat_render(m, msgs.data(), msgs.size(), &p, nullptr, 0, &len);
  if (st == LLM_ERR_BUFFER_TOO_SMALL) {
    std::vector<char> buf(len + 1, 'x');
    st = llm_chat_render(m, msgs.data(), msgs.size(), &p, buf.data(), buf.size(), &len);
    EXPECT_EQ(buf[len], '\0');
    if (status) *status = st;
    return st == LLM_OK ? std::string(buf.data(), len) : std::string();
  }
  if (status) *status = st;
  return {};
}

std::string detok(const llm_model* m, const std::vector<llm_token>& toks) {
  std::vector<char> buf(toks.size() * 64 + 16);
  size_t len = 0;
  EXPECT_EQ(llm_detokenize(m, toks.data(), toks.size(), buf.data(), buf.size(), &len), LLM_OK);
  return std::string(buf.data(), len);
}

const std::vector<llm_chat_message> kTwoTurns = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "How are you?"}};

TEST(ChatApi, TemplateSourceRendersWithoutAModel) {
  const char* tpl =
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  EXPECT_EQ(render(nullptr, kTwoTurns, tpl),
            "<system>Be brief.</system>\n<user>Hi!</user>\n<assistant>Hello.</assistant>\n<user>How are "
            "you?</user>\n<assistant>");
  EXPECT_EQ(render(nullptr, kTwoTurns, tpl, false),
            "<system>Be brief.</system>\n<user>Hi!</user>\n<assistant>Hello.</assistant>\n<user>How are "
            "you?</user>\n");
}

TEST(ChatApi, ModelWithoutTemplatePicksTheBuiltInOfItsFamily) {
  // The tiny Qwen 2 GGUF carries no template: the rule picks ChatML.
  llm_model* m = load(data_path("families/qwen2.gguf"));
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(render(m, {{"user", "Hi!"}}), "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  size_t len = 0;
  ASSERT_EQ(llm_model_chat_template(m, nullptr, 0, &len), LLM_ERR_BUFFER_TOO_SMALL);
  std::vector<char> buf(len + 1);
  ASSERT_EQ(llm_model_chat_template(m, buf.data(), buf.size(), &len), LLM_OK);
  EXPECT_NE(std::string(buf.data(), len).find("<|im_start|>"), std::string::npos);
  llm_model_free(m);
}

TEST(ChatApi, LlamaBaseModelWithoutTemplateNeedsOne) {
  llm_model* m = load(models_path("stories260K.gguf"));
  ASSERT_NE(m, nullptr);
  llm_status st = LLM_OK;
  render(m, {{"user", "Hi!"}}, nullptr, true, &st);
  EXPECT_EQ(st, LLM_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(llm_last_error()).find("template"), std::string::npos);
  // A template passed by the caller gets the model's BOS/EOS texts.
  EXPECT_EQ(render(m, {{"user", "Hi"}}, "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"), "<s>Hi</s>");
  llm_model_free(m);
}

TEST(ChatApi, BadTemplatesAndArgumentsGiveAClearStatus) {
  llm_status st = LLM_OK;
  render(nullptr, kTwoTurns, "{% for m in messages %}{{ m.role }", true, &st);
  EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()).find("line 1"), std::string::npos) << llm_last_error();
  render(nullptr, kTwoTurns, "{{ raise_exception('no system role') }}", true, &st);
  EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()).find("no system role"), std::string::npos);
  render(nullptr, kTwoTurns, "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", true, &st);
  EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT);  // recursion stopped by its bound
  render(nullptr, kTwoTurns, "{% for i in range(100000000) %}x{% endfor %}", true, &st);
  EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT);  // steps/output bounded
  size_t len = 7;
  const llm_chat_message bad[] = {{"user", nullptr}};
  EXPECT_EQ(llm_chat_render(nullptr, bad, 1, nullptr, nullptr, 0, &len), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_chat_render(nullptr, kTwoTurns.data(), kTwoTurns.size(), nullptr, nullptr, 0, &len),
            LLM_ERR_INVALID_ARGUMENT);  // neither a model nor a template
  llm_chat_params p;
  llm_chat_params_init(&p);
  p.template_source = "abc";
  char small[3];
  EXPECT_EQ(llm_chat_render(nullptr, nullptr, 0, &p, small, sizeof small, &len), LLM_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 3u);  // room for the NUL is needed too
}

// ---------------------------------------------------------------- grammars

class GrammarApi : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = load(models_path("stories260K.gguf"));
    ASSERT_NE(model_, nullptr);
    llm_model_properties info;
    info.struct_size = sizeof info;
    ASSERT_EQ(llm_model_info(model_, &info), LLM_OK);
    eos_ = info.eos;
  }
  void TearDown() override { llm_model_free(model_); }

  llm_session* session_with(const char* prompt) {
    llm_session* s = nullptr;
    EXPECT_EQ(llm_session_create(model_, nullptr, &s), LLM_OK);
    std::vector<llm_token> t(256);
    size_t n = 0;
    EXPECT_EQ(llm_tokenize(model_, prompt, std::strlen(prompt), LLM_TOKENIZE_ADD_BOS, t.data(), t.size(), &n), LLM_OK);
    EXPECT_EQ(llm_prefill(s, t.data(), n), LLM_OK);
    return s;
  }
  // Decodes until an end-of-generation token (returned in *ended) or max steps.
  std::vector<llm_token> generate(llm_session* s, const llm_sampling& samp, int max, bool* ended) {
    std::vector<llm_token> out;
    *ended = false;
    for (int i = 0; i < max; ++i) {
      llm_token t = -1;
      EXPECT_EQ(llm_decode_step(s, &samp, &t), LLM_OK) << llm_last_error();
      if (llm_token_is_eog(model_, t)) {
        *ended = true;
        break;
      }
      out.push_back(t);
    }
    return out;
  }

  llm_model* model_ = nullptr;
  llm_token eos_ = -1;
};

TEST_F(GrammarApi, GreedyAndSampledOutputStaysInTheLanguageAndEnds) {
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_create(model_, "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3} \".\"", nullptr, &g), LLM_OK)
      << llm_last_error();
  for (uint64_t seed = 0; seed < 12; ++seed) {
    llm_session* s = session_with("Once upon a time");
    llm_sampling samp;
    llm_sampling_init(&samp);
    samp.temperature = seed == 0 ? 0.f : 1.0f;
    samp.seed = seed;
    samp.grammar = g;
    bool ended = false;
    const std::string text = detok(model_, generate(s, samp, 64, &ended));
    EXPECT_TRUE(ended) << text;
    const bool yes = text.rfind("yes ", 0) == 0, no = text.rfind("no ", 0) == 0;
    EXPECT_TRUE(yes || no) << text;
    const std::string digits = text.substr(yes ? 4 : 3);
    ASSERT_GE(digits.size(), 2u) << text;
    EXPECT_EQ(digits.back(), '.') << text;
    EXPECT_LE(digits.size(), 4u) << text;
    for (size_t i = 0; i + 1 < digits.size(); ++i) EXPECT_TRUE(digits[i] >= '0' && digits[i] <= '9') << text;
    // Once ended, only end-of-generation tokens come.
    llm_token t = -1;
    ASSERT_EQ(llm_decode_step(s, &samp, &t), LLM_OK);
    EXPECT_TRUE(llm_token_is_eog(model_, t));
    llm_session_free(s);
  }
  llm_grammar_free(g);
}

TEST_F(GrammarApi, JsonSchemaOutputParsesAndValidates) {
  const char* schema = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
      "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog"]}}, "required": ["name", "age", "pet"],
      "additionalProperties": false})";
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_from_json_schema(model_, schema, &g), LLM_OK) << llm_last_error();
  int n_ended = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    llm_session* s = session_with("Lily");
    llm_sampling samp;
    llm_sampling_init(&samp);
    samp.temperature = 0.8f;
    samp.seed = seed;
    samp.grammar = g;
    bool ended = false;
    const std::string text = detok(model_, generate(s, samp, 200, &ended));
    llm_session_free(s);
    if (!ended) continue;  // cut by the cap: nothing to check
    ++n_ended;
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j.size(), 3u) << text;
    EXPECT_TRUE(j["name"].is_string() && j["name"].get<std::string>().size() <= 12) << text;
    EXPECT_TRUE(j["age"].is_number_integer()) << text;
    EXPECT_TRUE(j["pet"] == "cat" || j["pet"] == "dog") << text;
  }
  EXPECT_GE(n_ended, 4);
  llm_grammar_free(g);
}

TEST_F(GrammarApi, ForkKeepsTheStatePrefillStartsItOver) {
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_create(model_, "root ::= \"ab\" [a-z]* \".\"", nullptr, &g), LLM_OK);
  llm_session* s = session_with("Once");
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 1.f;
  samp.seed = 7;
  samp.grammar = g;
  llm_token t;
  ASSERT_EQ(llm_decode_step(s, &samp, &t), LLM_OK);
  std::string first = detok(model_, {t});
  llm_session* f = nullptr;
  ASSERT_EQ(llm_session_fork(s, &f), LLM_OK);
  bool e1 = false, e2 = false;
  const auto a = generate(s, samp, 40, &e1);
  const auto b = generate(f, samp, 40, &e2);
  EXPECT_EQ(a, b);  // same state, same RNG: the same continuation
  const std::string text = first + detok(model_, a);
  EXPECT_EQ(text.rfind("ab", 0), 0u) << text;
  // After a prefill the grammar starts over: "ab" again.
  const llm_token more[] = {t};
  ASSERT_EQ(llm_prefill(s, more, 1), LLM_OK);
  bool e3 = false;
  const std::string again = detok(model_, generate(s, samp, 40, &e3));
  EXPECT_EQ(again.rfind("ab", 0), 0u) << again;
  llm_session_free(f);
  llm_session_free(s);
  llm_grammar_free(g);
}

TEST_F(GrammarApi, BatchedDecodeHonoursTheGrammar) {
  llm_grammar* g = nullptr;
  ASSERT_EQ(llm_grammar_create(model_, "root ::= [0-9]+ \";\"", nullptr, &g), LLM_OK);
  std::vector<llm_session*> ss = {session_with("One"), session_with("Two two"), session_with("Three")};
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.grammar = g;
  std::vector<std::string> text(ss.size());
  for (int step = 0; step < 6; ++step) {
    std::vector<llm_token> out(ss.size());
    ASSERT_EQ(llm_decode_batch(ss.data(), ss.size(), &samp, out.data()), LLM_OK) << llm_last_error();
    for (size_t i = 0; i < ss.size(); ++i)
      if (!llm_token_is_eog(model_, out[i])) text[i] += detok(model_, {out[i]});
  }
  for (const std::string& t : text) {
    ASSERT_FALSE(t.empty());
    for (char c : t) EXPECT_TRUE((c >= '0' && c <= '9') || c == ';') << t;
  }
  for (llm_session* s : ss) llm_session_free(s);
  llm_grammar_free(g);
}

TEST_F(GrammarApi, BadGrammarsAndHandlesAreRefused) {
  llm_grammar* g = reinterpret_cast<llm_grammar*>(&g);
  EXPECT_EQ(llm_grammar_create(model_, "root ::= \"a\"\nfoo ::= [a-", nullptr, &g), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g, nullptr);
  EXPECT_NE(std::string(llm_last_error()).find("line 2"), std::string::npos) << llm_last_error();
  EXPECT_EQ(llm_grammar_create(model_, "root ::= undefined-rule", nullptr, &g), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_grammar_create(model_, "start ::= \"a\"", nullptr, &g), LLM_ERR_INVALID_ARGUMENT);  // no root
  ASSERT_EQ(llm_grammar_create(model_, "start ::= \"a\"", "start", &g), LLM_OK);
  llm_grammar_free(g);
  EXPECT_EQ(llm_grammar_from_json_schema(model_, "{\"type\": \"object\",\n \"properties\": {", &g),
            LLM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(llm_last_error()).find("line 2"), std::string::npos) << llm_last_error();
  EXPECT_EQ(llm_grammar_create(nullptr, "root ::= \"a\"", nullptr, &g), LLM_ERR_INVALID_ARGUMENT);
  size_t len = 0;
  EXPECT_EQ(llm_json_schema_to_gbnf("{\"type\": \"integer\"}", nullptr, 0, &len), LLM_ERR_BUFFER_TOO_SMALL);
  std::vector<char> buf(len + 1);
  EXPECT_EQ(llm_json_schema_to_gbnf("{\"type\": \"integer\"}", buf.data(), buf.size(), &len), LLM_OK);
  EXPECT_NE(std::string(buf.data()).find("root"), std::string::npos);

  // A grammar of another model, and a freed one, are refused by decode_step.
  llm_model* other = load(models_path("stories260K.gguf"));
  llm_grammar* og = nullptr;
  ASSERT_EQ(llm_grammar_create(other, "root ::= \"a\"", nullptr, &og), LLM_OK);
  llm_session* s = session_with("Once");
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.grammar = og;
  llm_token t = 0;
  EXPECT_EQ(llm_decode_step(s, &samp, &t), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t, -1);
  llm_grammar_free(og);
  EXPECT_EQ(llm_decode_step(s, &samp, &t), LLM_ERR_INVALID_ARGUMENT);
  // An older caller's struct (no grammar field) is unconstrained.
  samp.struct_size = 40;
  EXPECT_EQ(llm_decode_step(s, &samp, &t), LLM_OK);
  llm_session_free(s);
  llm_model_free(other);
  llm_grammar_free(nullptr);
}

}  // namespace
