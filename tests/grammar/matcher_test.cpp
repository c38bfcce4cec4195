// Matcher: token-level semantics (multi-byte tokens, UTF-8 split across
// tokens, EOG, fork/reset) and the fast mask against the brute-force mask over
// random vocabularies, json.gbnf, a schema grammar and (LLM_GEMMA3_GGUF) the
// real Gemma 3 vocabulary.
#include <thread>

#include "grammar_test_util.h"

namespace llm::grammar::test {
namespace {

std::shared_ptr<const Grammar> json_grammar() {
  static auto g = parse_gbnf(read_text(data_path("grammars/json.gbnf")));
  return g;
}

TEST(Matcher, MultiByteTokensAndEog) {
  // 0 "ab", 1 "a", 2 "b", 3 "c", 4 "bc", 5 EOG, 6 control (empty)
  auto v = make_vocab({"ab", "a", "b", "c", "bc", "", ""}, {5});
  auto g = parse_gbnf("root ::= \"a\" \"b\"+ \"c\"?");
  Matcher m(g, v);
  EXPECT_TRUE(m.allows(0));
  EXPECT_TRUE(m.allows(1));
  EXPECT_FALSE(m.allows(2));
  EXPECT_FALSE(m.allows(5));  // cannot end yet
  EXPECT_FALSE(m.allows(6));  // control tokens never match text
  m.accept(0);
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.ended());
  EXPECT_TRUE(m.allows(5));
  EXPECT_TRUE(m.allows(4));
  m.accept(4);
  EXPECT_TRUE(m.ended());
  // Ended: only EOG.
  std::vector<float> logits(7, 1.0f);
  m.apply_mask(logits.data(), 7);
  for (int t = 0; t < 7; ++t) EXPECT_EQ(std::isinf(logits[size_t(t)]), t != 5) << t;
  EXPECT_THROW(m.accept(3), Error);
  m.accept(5);
  EXPECT_TRUE(m.ended());
  m.reset();
  EXPECT_FALSE(m.can_end());
  EXPECT_THROW(m.accept(2), Error);
  m.accept(1);  // the failed accept left the state unchanged
}

TEST(Matcher, Utf8SplitAcrossTokens) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80
  auto v = make_vocab({"\xC3", "\xA9", "\xE2\x82", "\xAC", "\xF0\x9F", "\x98\x80", "x", "\xA9x", "\xC3\xA9", ""}, {9});
  auto g = parse_gbnf("root ::= [é€] \"😀\"? \"x\"");
  Matcher m(g, v);
  EXPECT_TRUE(m.allows(0));
  EXPECT_TRUE(m.allows(2));
  EXPECT_TRUE(m.allows(8));
  EXPECT_FALSE(m.allows(1));  // a lone continuation byte
  EXPECT_FALSE(m.allows(4));  // 😀 is not in the class
  Matcher fork = m;
  m.accept(0);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.allows(1));
  EXPECT_TRUE(m.allows(7));   // finishes é and goes on with x
  EXPECT_FALSE(m.allows(6));  // x cannot finish a pending é
  EXPECT_FALSE(m.allows(9));
  EXPECT_TRUE(masks_equal(m, *v));
  m.accept(1);
  EXPECT_TRUE(m.allows(4));
  m.accept(4);
  EXPECT_TRUE(masks_equal(m, *v));
  EXPECT_TRUE(m.allows(5));
  EXPECT_FALSE(m.allows(6));
  m.accept(5);
  m.accept(6);
  EXPECT_TRUE(m.ended());
  // The fork kept the start state; € split 2+1 bytes.
  fork.accept(2);
  EXPECT_TRUE(fork.allows(3));
  EXPECT_FALSE(fork.allows(1));
  fork.accept(3);
  fork.accept(6);
  EXPECT_TRUE(fork.ended());
}

TEST(Matcher, ApplyMaskLargerLogitsThanVocab) {
  auto v = make_vocab({"a", "b", ""}, {2});
  Matcher m(parse_gbnf("root ::= \"a\""), v);
  std::vector<float> logits(5, 0.0f);
  m.apply_mask(logits.data(), 5);
  EXPECT_EQ(logits[0], 0.0f);
  for (int t : {1, 2, 3, 4}) EXPECT_TRUE(std::isinf(logits[size_t(t)])) << t;
}

TEST(Matcher, RepetitionBoundsTokenLevel) {
  auto v = make_vocab({"a", "aa", "aaa", "b", ""}, {4});
  Matcher m(parse_gbnf("root ::= \"a\"{2,4} \"b\""), v);
  EXPECT_TRUE(m.allows(2));
  EXPECT_FALSE(m.allows(3));
  m.accept(2);
  EXPECT_TRUE(m.allows(0));
  EXPECT_FALSE(m.allows(1));  // would make 5
  EXPECT_TRUE(m.allows(3));
  EXPECT_TRUE(masks_equal(m, *v));
}

TEST(Matcher, StackSetIsBounded) {
  // After n a's there are 2^n ways to close: the matcher must refuse (a
  // clear error) rather than grow without bound.
  auto g = parse_gbnf("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x \"c\" | \"\"");
  Matcher m(g, byte_vocab());
  bool threw = false;
  try {
    for (int i = 0; i < 64; ++i) m.accept('a');
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.status(), LLM_ERR_INVALID_ARGUMENT);
  }
  EXPECT_TRUE(threw);
  EXPECT_LE(m.n_stacks(), 1024u);
}

std::string nested_loops(int depth) {
  std::string text = "root ::= ";
  for (int i = 0; i < depth; ++i) text += "(";
  text += "[ab]";
  for (int i = 0; i < depth; ++i) text += i % 3 == 0 ? ")+" : ")*";
  return text + " \"!\"";
}

TEST(Matcher, NestedNullableLoopsStayExact) {
  // ((((a)*)*)*)... : every level may loop or leave after each "a", so the
  // paths to one stack multiply with the depth; the matcher must keep one
  // copy of each stack and match exactly.
  auto v = byte_vocab();
  Matcher m(parse_gbnf(nested_loops(12)), v);
  for (char c : std::string("abba")) {
    ASSERT_TRUE(m.allows(uint8_t(c))) << c;
    m.accept(uint8_t(c));
    EXPECT_LE(m.n_stacks(), 64u);
    EXPECT_TRUE(masks_equal(m, *v));
  }
  EXPECT_FALSE(m.allows('c'));
  m.accept('!');
  EXPECT_TRUE(m.ended());
  // Twice as deep, the distinct stacks outgrow the caps: a clear refusal,
  // after bounded work, at the first step.
  Matcher deep(parse_gbnf(nested_loops(24)), v);
  const uint64_t caps = Matcher::cap_hits();
  EXPECT_FALSE(deep.allows('a'));
  EXPECT_GT(Matcher::cap_hits(), caps);
  try {
    deep.accept('a');
    ADD_FAILURE() << "accepted past the caps";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_INVALID_ARGUMENT);
  }
}

TEST(Matcher, DeepNestingIsBounded) {
  Matcher m(json_grammar(), byte_vocab());
  bool threw = false;
  try {
    m.accept('{');
    for (int i = 0; i < 100000; ++i) {
      for (char c : std::string("\"a\":[")) m.accept(uint8_t(c));
    }
  } catch (const Error&) {
    threw = true;
  }
  EXPECT_TRUE(threw);
}

// ---- fast mask == brute force ---------------------------------------------------

// A random vocabulary: all single bytes of `alphabet`, plus random strings
// over it (and a few UTF-8 fragments), plus EOG and a control token.
std::shared_ptr<const Vocab> random_vocab(std::mt19937& rng, const std::string& alphabet, int n_extra) {
  std::vector<std::string> pieces;
  for (char c : alphabet) pieces.push_back(std::string(1, c));
  const char* frags[] = {"\xC3", "\xA9", "\xC3\xA9", "\xE2\x82", "\xAC", "\xE2\x82\xAC", "\xF0\x9F\x98", "\x80"};
  for (const char* f : frags) pieces.push_back(f);
  std::uniform_int_distribution<int> len(2, 8), pick(0, int(alphabet.size()) - 1), frag(0, 7), coin(0, 9);
  for (int i = 0; i < n_extra; ++i) {
    std::string s;
    const int L = len(rng);
    for (int k = 0; k < L; ++k) s += coin(rng) == 0 ? std::string(frags[frag(rng)]) : std::string(1, alphabet[size_t(pick(rng))]);
    pieces.push_back(s);
  }
  pieces.push_back("");
  pieces.push_back("");
  const int32_t eog = int32_t(pieces.size() - 2);
  return make_vocab(pieces, {eog});
}

// Walks `text` through the matcher with random token choices that fit it,
// checking the masks at every step.
void check_along(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const Vocab>& v, const std::string& text,
                 std::mt19937& rng, int* n_checked) {
  Matcher m(g, v);
  size_t i = 0;
  while (true) {
    ASSERT_TRUE(masks_equal(m, *v)) << "at byte " << i << " of " << text;
    ++*n_checked;
    if (i >= text.size()) break;
    std::vector<int32_t> fits;
    for (int32_t t = 0; t < v->n_vocab(); ++t) {
      const std::string& p = v->piece(t);
      if (!p.empty() && !v->is_eog(t) && text.compare(i, p.size(), p) == 0 && m.allows(t)) fits.push_back(t);
    }
    ASSERT_FALSE(fits.empty()) << "stuck at byte " << i << " of " << text;
    const int32_t t = fits[std::uniform_int_distribution<size_t>(0, fits.size() - 1)(rng)];
    m.accept(t);
    i += v->piece(t).size();
  }
  EXPECT_TRUE(m.can_end()) << text;
}

TEST(MaskEquality, JsonRandomVocabularies) {
  std::mt19937 rng(1234);
  const std::string alphabet = "{}[]\":, \n\t-+.0123456789eEabcdefghijklmnopqrstuvwxyz\\/";
  const std::vector<std::string> texts = {
      "{\"a\": [1, -2.5e+3, true, false, null], \"b\": {\"c\": \"x\\u00e9\\n\"}}",
      "{\n  \"list\": [\n    {\"k\": \"v\"},\n    []\n  ],\n  \"n\": 0.25\n}",
      "{\"s\": \"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\", \"e\": {}}",
  };
  int n = 0;
  for (int round = 0; round < 6; ++round) {
    auto v = random_vocab(rng, alphabet, 400);
    for (const std::string& t : texts) check_along(json_grammar(), v, t, rng, &n);
  }
  EXPECT_GT(n, 300);
}

// Sessions on several threads share one grammar's caches (llm_sampling.grammar
// across sessions): four matchers walk the same texts at once from a cold
// cache, so they build and insert the same keys concurrently. Each mask must
// equal the brute-force one; under ASan (tests/run_reliability.sh) a cache
// entry freed while a matcher reads it is an error. (It was: the memoized
// "below" tokens were iterated through a temporary shared_ptr.)
TEST(MaskEquality, ThreadsShareOneGrammarsCaches) {
  const std::string alphabet = "{}[]\":, \n\t-+.0123456789eEabcdefghijklmnopqrstuvwxyz\\/";
  const std::vector<std::string> texts = {
      "{\"a\": [1, -2.5e+3, true, false, null], \"b\": {\"c\": \"x\\u00e9\\n\"}}",
      "{\n  \"list\": [\n    {\"k\": \"v\"},\n    []\n  ],\n  \"n\": 0.25\n}",
  };
  std::mt19937 vrng(77);
  for (int round = 0; round < 3; ++round) {
    const auto g = parse_gbnf(read_text(data_path("grammars/json.gbnf")));  // a cold cache each round
    const auto v = random_vocab(vrng, alphabet, 300);
    std::vector<int> checked(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::mt19937 rng(uint32_t(round * 10 + t));
        for (const std::string& text : texts) check_along(g, v, text, rng, &checked[size_t(t)]);
      });
    for (auto& th : threads) th.join();
    for (int c : checked) EXPECT_GT(c, 20);
  }
}

TEST(MaskEquality, OtherGrammarsRandomVocabularies) {
  std::mt19937 rng(99);
  struct C {
    const char* file;
    std::string alphabet, text;
  };
  const std::vector<C> cases = {
      {"arithmetic.gbnf", "abcxyz0123456789+-*/()= \n", "(a +b1) *22= x\nc=a\n"},
      {"chess.gbnf", "12345678abcdefghNBKQRxO-+#=. \n", "1. e4 e5\n2. Nf3 Nc6\n3. O-O exd4+\n"},
      {"c.gbnf", "intflorechawu(){};=+-*/<>! \n0123456789xyab", "int f(int x){while(x<10){x = x+1;}return x;}"},
      {"list.gbnf", "- abc\nxyz", "- abc\n- xyz\n"},
  };
  int n = 0;
  for (const C& c : cases) {
    auto g = parse_gbnf(read_text(data_path(std::string("grammars/") + c.file)));
    for (int round = 0; round < 3; ++round) check_along(g, random_vocab(rng, c.alphabet, 300), c.text, rng, &n);
  }
  EXPECT_GT(n, 100);
}

TEST(MaskEquality, SchemaGrammarRandomVocabularies) {
  const std::string schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "minLength": 1, "maxLength": 12},
      "kind": {"enum": ["cat", "dog", 3]},
      "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
      "pos": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "integer"}},
              "required": ["x", "y"], "additionalProperties": false},
      "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]+$"}
    },
    "required": ["name", "pos"]
  })";
  auto g = parse_gbnf(json_schema_to_gbnf(schema));
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":, \n-.0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const std::vector<std::string> texts = {
      R"({"name": "Tom", "kind": "cat", "pos": {"x": 1.5, "y": -2}, "code": "AB-12"})",
      R"({"name": "x", "tags": ["a", "bc"], "pos": {"x": 0, "y": 0}, "extra": [1, {"z": null}]})",
  };
  int n = 0;
  for (int round = 0; round < 5; ++round) {
    auto v = random_vocab(rng, alphabet, 500);
    for (const std::string& t : texts) check_along(g, v, t, rng, &n);
  }
  EXPECT_GT(n, 200);
}

TEST(MaskEquality, LongBoundedRepetitions) {
  // Repetition counts far above the longest piece share cache entries
  // (canonicalize_key); the masks must not change.
  std::vector<std::string> pieces;
  const std::string alphabet = "[]()abcz";
  for (char a : alphabet) {
    pieces.push_back(std::string(1, a));
    for (char b : alphabet) {
      pieces.push_back(std::string(1, a) + b);
      for (char c : alphabet) pieces.push_back(std::string(1, a) + b + c);
    }
  }
  pieces.push_back("");
  auto v = make_vocab(pieces, {int32_t(pieces.size() - 1)});
  auto g = parse_gbnf("root ::= \"[\" [a-c]{0,40} \"]\" | \"(\" (\"ab\" | \"c\"){2,30} \")\" | \"z\"{3,12} (\"z\"? \"a\"){0,9}");
  std::mt19937 rng(5);
  int n = 0;
  for (const std::string& t : std::vector<std::string>{"[" + std::string(40, 'a') + "]", "[abcabc]", "[]", "(" + std::string(20, 'c') + "abab)",
                               std::string(12, 'z') + "azaaza"}) {
    for (int round = 0; round < 3; ++round) check_along(g, v, t, rng, &n);
  }
  EXPECT_GT(n, 100);
  // Past the bound: rejected.
  EXPECT_FALSE(accepts(g, "[" + std::string(41, 'a') + "]"));
  EXPECT_FALSE(accepts(g, "(" + std::string(31, 'c') + ")"));
}

TEST(MaskEquality, GemmaVocabulary) {
  auto v = gemma_vocab();
  if (!v) GTEST_SKIP() << "LLM_GEMMA3_GGUF is not set (tests/models/fetch_gemma3.sh)";
  ASSERT_GT(v->n_vocab(), 200000);
  const std::string json_text =
      "{\"name\": \"Grace Hopper\", \"born\": 1906, \"langs\": [\"COBOL\", \"FLOW-MATIC\"], "
      "\"note\": \"caf\xC3\xA9 \xE2\x82\xAC\", \"ok\": true, \"nested\": {\"a\": null, \"b\": -1.5e3}}";
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string"}, "born": {"type": "integer"},
      "langs": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
      "note": {"type": "string", "maxLength": 52}, "ok": {"type": "boolean"},
      "nested": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "number"}}}},
      "required": ["name", "born"], "additionalProperties": false})";
  for (const auto& g : {json_grammar(), parse_gbnf(json_schema_to_gbnf(schema))}) {
    Matcher m(g, v);
    const std::vector<int32_t> toks = greedy_tokens(m, *v, json_text);
    ASSERT_FALSE(toks.empty());
    int checked = 0;
    for (size_t k = 0; k <= toks.size(); ++k) {
      if (k % 2 == 0 || k + 3 > toks.size()) {
        ASSERT_TRUE(masks_equal(m, *v)) << "after " << k << " tokens";
        ++checked;
      }
      if (k < toks.size()) m.accept(toks[k]);
    }
    EXPECT_TRUE(m.can_end());
    EXPECT_GT(checked, 10);
  }
}

}  // namespace
}  // namespace llm::grammar::test
