// GBNF parser: each construct, errors with line and column, and llama.cpp's
// example grammars (tests/data/grammars/) with strings they accept and reject.
#include "grammar_test_util.h"

namespace llm::grammar::test {
namespace {

std::shared_ptr<const Grammar> G(const std::string& text) { return parse_gbnf(text); }

std::string error_of(const std::string& text, std::string_view root = "root") {
  try {
    parse_gbnf(text, root);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

TEST(Gbnf, LiteralsAndSequences) {
  auto g = G("root ::= \"ab\" \"c\"");
  EXPECT_TRUE(accepts(g, "abc"));
  EXPECT_FALSE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, "abcd"));
  EXPECT_FALSE(accepts(g, "abd"));
}

TEST(Gbnf, Alternatives) {
  auto g = G("root ::= \"a\" | \"bc\" | \"\"");
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, "bc"));
  EXPECT_TRUE(accepts(g, ""));
  EXPECT_FALSE(accepts(g, "b"));
  EXPECT_FALSE(accepts(g, "abc"));
}

TEST(Gbnf, Escapes) {
  auto g = G(R"(root ::= "\n\t\\\"\x41\u00e9\U0001F600\r\[\]")");
  EXPECT_TRUE(accepts(g, "\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x80\r[]"));
  EXPECT_FALSE(accepts(g, "\n\t\\\"A\xC3\xA9\xF0\x9F\x98\x81\r[]"));
}

TEST(Gbnf, CharClasses) {
  auto g = G("root ::= [a-c0-9_] [^a-z\\n] [-+]");
  EXPECT_TRUE(accepts(g, "b7-"));
  EXPECT_TRUE(accepts(g, "_A+"));
  EXPECT_TRUE(accepts(g, "0\xE2\x82\xAC-"));  // negated class takes any non-listed code point
  EXPECT_FALSE(accepts(g, "dA-"));
  EXPECT_FALSE(accepts(g, "aa-"));
  EXPECT_FALSE(accepts(g, "a\n-"));
  EXPECT_FALSE(accepts(g, "aA*"));
}

TEST(Gbnf, UnicodeClassesAndDot) {
  auto g = G("root ::= [ぁ-ゟ]+ . \"!\"");
  EXPECT_TRUE(accepts(g, "ひらがな\xF0\x9F\x98\x80!"));
  EXPECT_TRUE(accepts(g, "あx!"));
  EXPECT_FALSE(accepts(g, "カx!"));
  EXPECT_FALSE(accepts(g, "あ!"));
  // Invalid UTF-8 is never matched, even by '.'.
  EXPECT_FALSE(accepts(g, "あ\xFF!"));
  EXPECT_FALSE(accepts(g, "あ\xC0\x80!"));        // overlong
  EXPECT_FALSE(accepts(g, "あ\xED\xA0\x80!"));    // surrogate
}

TEST(Gbnf, Repetition) {
  auto star = G("root ::= \"a\"* \"b\"");
  EXPECT_TRUE(accepts(star, "b"));
  EXPECT_TRUE(accepts(star, "aaaab"));
  auto plus = G("root ::= \"ab\"+");
  EXPECT_FALSE(accepts(plus, ""));
  EXPECT_TRUE(accepts(plus, "ababab"));
  EXPECT_FALSE(accepts(plus, "aba"));
  auto opt = G("root ::= \"a\"? \"b\"");
  EXPECT_TRUE(accepts(opt, "ab"));
  EXPECT_TRUE(accepts(opt, "b"));
  EXPECT_FALSE(accepts(opt, "aab"));
}

TEST(Gbnf, QuantifierRunsAreOneQuantifier) {
  // (x+)* = x*, (x?)+ = x*, (x+)+ = x+, (x?)? = x?, spaces allowed between.
  for (const char* q : {"+*", "*+", "?*", "*?", "+?", "?+", "**", "* ?", "+*+*+"}) {
    auto g = G(std::string("root ::= \"a\"") + q + " \"b\"");
    EXPECT_TRUE(accepts(g, "b")) << q;
    EXPECT_TRUE(accepts(g, "aaab")) << q;
    EXPECT_FALSE(accepts(g, "aa")) << q;
    EXPECT_EQ(g->rules.size(), G("root ::= \"a\"* \"b\"")->rules.size()) << q;
  }
  auto plus = G("root ::= \"a\"++ \"b\"");
  EXPECT_FALSE(accepts(plus, "b"));
  EXPECT_TRUE(accepts(plus, "aab"));
  auto opt = G("root ::= \"a\"?? \"b\"");
  EXPECT_TRUE(accepts(opt, "b"));
  EXPECT_TRUE(accepts(opt, "ab"));
  EXPECT_FALSE(accepts(opt, "aab"));
  EXPECT_EQ(opt->rules.size(), G("root ::= \"a\"? \"b\"")->rules.size());
}

TEST(Gbnf, RepetitionBounds) {
  auto exact = G("root ::= [0-9]{3}");
  EXPECT_TRUE(accepts(exact, "123"));
  EXPECT_FALSE(accepts(exact, "12"));
  EXPECT_FALSE(accepts(exact, "1234"));
  auto at_least = G("root ::= \"x\"{2,}");
  EXPECT_FALSE(accepts(at_least, "x"));
  EXPECT_TRUE(accepts(at_least, "xx"));
  EXPECT_TRUE(accepts(at_least, std::string(50, 'x')));
  auto range = G("root ::= (\"ab\" | \"c\"){1,3}");
  EXPECT_FALSE(accepts(range, ""));
  EXPECT_TRUE(accepts(range, "c"));
  EXPECT_TRUE(accepts(range, "abcab"));
  EXPECT_FALSE(accepts(range, "abcabc"));
  auto at_most = G("root ::= \"a\"{0,2} \"b\"");
  EXPECT_TRUE(accepts(at_most, "b"));
  EXPECT_TRUE(accepts(at_most, "aab"));
  EXPECT_FALSE(accepts(at_most, "aaab"));
  auto spaced = G("root ::= \"a\"{ 2 , 3 }");
  EXPECT_TRUE(accepts(spaced, "aaa"));
  EXPECT_FALSE(accepts(spaced, "a"));
}

TEST(Gbnf, RulesCommentsAndNewlines) {
  auto g = G(
      "# a comment\n"
      "root ::= greeting ws name # trailing comment\n"
      "\n"
      "greeting ::= (\n"
      "    \"hello\" |\n"
      "    \"hi\"\n"
      "  )\n"
      "name ::= [A-Z] [a-z]*\n"
      "ws ::= \" \"+\r\n");
  EXPECT_TRUE(accepts(g, "hello  World"));
  EXPECT_TRUE(accepts(g, "hi Ann"));
  EXPECT_FALSE(accepts(g, "hey Ann"));
  // A newline after '|' continues the rule.
  auto h = G("root ::= \"a\" |\n  \"b\"\n");
  EXPECT_TRUE(accepts(h, "b"));
}

TEST(Gbnf, OtherRootAndNames) {
  auto g = parse_gbnf("start ::= item_1 Other-Rule\nitem_1 ::= \"x\"\nOther-Rule ::= \"y\"", "start");
  EXPECT_TRUE(accepts(g, "xy"));
}

TEST(Gbnf, NullableTailLoopIsNotLeftRecursion) {
  // (x?)* loops over a rule that matches nothing: fine, the stack does not grow.
  auto g = G("root ::= (\"a\"?)* \"b\"");
  EXPECT_TRUE(accepts(g, "aab"));
  EXPECT_TRUE(accepts(g, "b"));
}

TEST(Gbnf, Errors) {
  EXPECT_EQ(error_of("root ::= \"a\" foo"), "grammar: line 1, column 14: undefined rule 'foo'");
  EXPECT_EQ(error_of("item ::= \"a\""), "grammar: line 1, column 13: no rule named 'root' (the start rule)");
  EXPECT_EQ(error_of("root ::= \"a\n"), "grammar: line 1, column 10: unterminated string literal");
  EXPECT_EQ(error_of("root ::= \"a\"\nx ::= [a-"), "grammar: line 2, column 7: unterminated character class");
  EXPECT_EQ(error_of("root := \"a\""), "grammar: line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(error_of("root ::= (\"a\""), "grammar: line 1, column 14: expected ')'");
  EXPECT_EQ(error_of("root ::= \"a\")"), "grammar: line 1, column 13: unexpected ')'");
  EXPECT_EQ(error_of("root ::= * \"a\""), "grammar: line 1, column 10: '*' without an item before it");
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"), "grammar: line 1, column 13: repetition {3,2}: the maximum is below the minimum");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root ::= [z-a]"), "grammar: line 1, column 13: character range out of order");
  EXPECT_EQ(error_of("root ::= \"a\" @"), "grammar: line 1, column 14: unexpected character '@'");
  EXPECT_EQ(error_of("root ::= \"\xFF\""), "grammar: line 1, column 11: invalid UTF-8");
  EXPECT_NE(error_of("root ::= " + std::string(300, '(')).find("parentheses nested deeper than 256"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{99999}").find("repetition count over"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{0,60000} \"a\"{0,60000} \"a\"{0,60000} \"a\"{0,60000}").find("grammar too large"),
            std::string::npos);
  EXPECT_EQ(error_of("root ::= \"y\" a?\na ::= \"x\" a"), "grammar: line 2, column 1: rule 'a' can never complete (every alternative recurses into it)");
}

TEST(Gbnf, LeftRecursion) {
  EXPECT_EQ(error_of("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]"),
            "grammar: line 2, column 1: left recursion in rule 'expr'");
  // Through a nullable prefix and another rule.
  EXPECT_EQ(error_of("root ::= a\na ::= b? c \"x\"\nc ::= \"y\" | a \"z\"\nb ::= \"q\""),
            "grammar: line 2, column 1: left recursion in rule 'a'");
  // Right recursion is fine.
  auto g = G("root ::= \"(\" root \")\" | \"\"");
  EXPECT_TRUE(accepts(g, "((()))"));
  EXPECT_FALSE(accepts(g, "(()"));
}

TEST(Gbnf, TokenElements) {
  std::vector<std::string> pieces = {"a", "b", "<think>", "", ""};  // 3: a control token, 4: EOG
  auto v = make_vocab(pieces, {4});
  auto g = G("root ::= <think> \"a\"+ <[3]> !<[0]>");
  Matcher m(g, v);
  EXPECT_TRUE(m.allows(2));
  EXPECT_FALSE(m.allows(0));
  m.accept(2);
  m.accept(0);
  EXPECT_TRUE(m.allows(3));
  m.accept(3);
  EXPECT_FALSE(m.allows(0));
  EXPECT_TRUE(m.allows(1));
  EXPECT_TRUE(m.allows(2));
  EXPECT_FALSE(m.allows(4));
  m.accept(1);
  EXPECT_TRUE(m.ended());
  EXPECT_THROW(Matcher(G("root ::= <nope>"), v), Error);
}

// ---- llama.cpp's example grammars ------------------------------------------------
struct FileCase {
  const char* file;
  std::vector<std::string> good, bad;
};

TEST(Gbnf, LlamaCppGrammars) {
  const std::vector<FileCase> cases = {
      {"arithmetic.gbnf", {"1+2=3\n", "(a +b) *c= x1\n", "a=b\nc=d\n"}, {"1+2\n", "=3\n", "1+=2\n"}},
      {"c.gbnf",
       {"int main(){return 0;}", "float f(int x){x = x*2;if(x<3){return x;}}", ""},
       {"int main(){return 0}", "main(){}"}},
      {"chess.gbnf",
       {"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O O-O-O+\n"},
       {"1. e4 e5\n", "1. e9 e5\n2. Nf3 Nc6\n", "e4 e5\n2. Nf3 Nc6\n"}},
      {"english.gbnf", {"Hello, world!", "a b\tc"}, {"", "caf\xC3\xA9", "a  b"}},
      {"japanese.gbnf", {"こんにちは", "カタカナ ひらがな\n漢字"}, {"hello", "こんにちは "}},
      {"json.gbnf",
       {"{}", "{\"a\": [1, 2.5, -3e21, true, false, null, \"x\\u00e9\\n\"], \"b\": {\"c\": {}}}",
        "{\n  \"k\": \"v\"\n}"},
       {"[]", "{\"a\": 01}", "{\"a\" 1}", "{\"a\": \"\x01\"}", "{\"a\": tru}", "{,}"}},
      {"json_arr.gbnf", {"[\n]", "[\n{\"a\": 1},\n\"s\"]"}, {"[]", "[\n1,]"}},
      {"list.gbnf", {"- one\n- two\n"}, {"- one", "* one\n", "- \n"}},
  };
  for (const FileCase& c : cases) {
    SCOPED_TRACE(c.file);
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = parse_gbnf(read_text(data_path(std::string("grammars/") + c.file))));
    for (const std::string& s : c.good) EXPECT_TRUE(accepts(g, s)) << s;
    for (const std::string& s : c.bad) EXPECT_FALSE(accepts(g, s)) << s;
  }
}

TEST(Gbnf, EveryDataGrammarParses) {
  for (const char* f : {"arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"}) {
    EXPECT_NO_THROW(parse_gbnf(read_text(data_path(std::string("grammars/") + f + ".gbnf")))) << f;
  }
}

}  // namespace
}  // namespace llm::grammar::test
