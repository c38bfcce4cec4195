// Chat-template lexer and parser: Jinja2 syntax with trim_blocks and
// lstrip_blocks, as transformers configures it. The whitespace rules follow
// jinja2's lexer: `{%-`/`{{-`/`{#-` strip all whitespace before the tag,
// `-%}`/`-}}`/`-#}` all whitespace after it; trim_blocks drops the newline
// after a block or comment tag; lstrip_blocks drops spaces and tabs between
// the start of a line and a block or comment tag; `+` turns either off.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "chat/ast.h"
#include "core/error.h"

namespace llm::chat::detail {
namespace {

constexpr int kMaxNesting = 300;  // parser recursion units: ~3 per bracket level, 1 per block (bounds the stack)

[[noreturn]] void fail_at(llm_status status, Pos p, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void fail_at(llm_status status, Pos p, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  throw Error(status, "chat template: line " + std::to_string(p.line) + ", column " + std::to_string(p.col) +
                          ": " + msg);
}

enum class Tok : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  Pos pos;
  std::string text;  // Text, Name, String (unescaped), Op
  int64_t ival = 0;
  double fval = 0;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// ---- lexer -------------------------------------------------------------------
class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  Pos pos_at(size_t off) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    const size_t line = size_t(it - line_starts_.begin());
    return Pos{int(line), int(off - line_starts_[line - 1] + 1)};
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    size_t p = 0;
    bool line_starting = true;
    while (p < n) {
      size_t t = p;
      while ((t = src_.find('{', t)) != std::string::npos) {
        if (t + 1 < n && (src_[t + 1] == '{' || src_[t + 1] == '%' || src_[t + 1] == '#')) break;
        ++t;
      }
      std::string text = src_.substr(p, (t == std::string::npos ? n : t) - p);
      const size_t text_off = p;
      if (t == std::string::npos) {
        emit_text(std::move(text), text_off);
        break;
      }
      const char kind = src_[t + 1];
      const char mod = t + 2 < n ? src_[t + 2] : 0;
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && is_space(text[e - 1])) --e;
        text.resize(e);
      } else if (mod != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && text.size() > l_pos) {
          bool all_ws = true;
          for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_space(text[k]);
          if (all_ws) text.resize(l_pos);
        }
      }
      emit_text(std::move(text), text_off);
      p = t + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        p = lex_comment(t, p, line_starting);
      } else if (kind == '%' && is_raw(p)) {
        p = lex_raw(t, p, line_starting);
      } else {
        p = lex_tag(kind == '{', t, p, line_starting);
      }
    }
    Token eof{Tok::Eof, pos_at(n), {}};
    toks_.push_back(eof);
    return std::move(toks_);
  }

 private:
  void emit_text(std::string text, size_t off) {
    if (text.empty()) return;
    toks_.push_back(Token{Tok::Text, pos_at(off), std::move(text)});
  }

  // After a block/comment end: `-` eats all whitespace, `+` nothing, plain
  // one newline (trim_blocks). Returns the new offset.
  size_t after_block_end(char mod, size_t p, bool& line_starting) {
    if (mod == '-') {
      const size_t start = p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      line_starting = p > start && src_[p - 1] == '\n';
    } else if (mod == '+') {
      line_starting = false;
    } else if (p < src_.size() && src_[p] == '\n') {
      ++p;
      line_starting = true;
    } else {
      line_starting = false;
    }
    return p;
  }

  size_t lex_comment(size_t begin, size_t p, bool& line_starting) {
    const size_t e = src_.find("#}", p);
    if (e == std::string::npos) fail_at(LLM_ERR_INVALID_ARGUMENT, pos_at(begin), "missing end of comment tag");
    char mod = 0;
    if (e > p && (src_[e - 1] == '-' || src_[e - 1] == '+')) mod = src_[e - 1];
    return after_block_end(mod, e + 2, line_starting);
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t begin, size_t p, bool& line_starting) {
    while (is_space(src_[p])) ++p;
    p += 3;
    while (is_space(src_[p])) ++p;
    if (src_[p] == '-') {
      p += 3;
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else {
      p += 2;
    }
    // Find {%[-+]? endraw [-+]?%}
    size_t s = p;
    for (;;) {
      s = src_.find("{%", s);
      if (s == std::string::npos) fail_at(LLM_ERR_INVALID_ARGUMENT, pos_at(begin), "missing endraw");
      size_t q = s + 2;
      const char mod = q < src_.size() ? src_[q] : 0;
      if (mod == '-' || mod == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        q += 6;
        while (q < src_.size() && is_space(src_[q])) ++q;
        char emod = 0;
        if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) emod = src_[q++];
        if (src_.compare(q, 2, "%}") != 0) fail_at(LLM_ERR_INVALID_ARGUMENT, pos_at(s), "malformed endraw");
        std::string text = src_.substr(p, s - p);
        if (mod == '-') {
          size_t e = text.size();
          while (e > 0 && is_space(text[e - 1])) --e;
          text.resize(e);
        } else if (mod != '+') {
          const size_t nl = text.rfind('\n');
          const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
          if (l_pos > 0 && text.size() > l_pos) {
            bool all_ws = true;
            for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_space(text[k]);
            if (all_ws) text.resize(l_pos);
          }
        }
        emit_text(std::move(text), p);
        return after_block_end(emod, q + 2, line_starting);
      }
      s += 2;
    }
  }

  size_t lex_tag(bool is_var, size_t begin, size_t p, bool& line_starting) {
    toks_.push_back(Token{is_var ? Tok::VarBegin : Tok::BlockBegin, pos_at(begin), {}});
    const size_t n = src_.size();
    std::string brackets;  // closers owed, innermost last (end markers count only outside brackets)
    for (;;) {
      while (p < n && is_space(src_[p])) ++p;
      if (p >= n)
        fail_at(LLM_ERR_INVALID_ARGUMENT, pos_at(begin), "unexpected end of template, missing '%s'",
                is_var ? "}}" : "%}");
      const char c = src_[p];
      if (brackets.empty()) {
        if (is_var) {
          if (src_.compare(p, 3, "-}}") == 0 || src_.compare(p, 2, "}}") == 0) {
            toks_.push_back(Token{Tok::VarEnd, pos_at(p), {}});
            if (c == '-') {
              p += 3;
              const size_t start = p;
              while (p < n && is_space(src_[p])) ++p;
              line_starting = p > start && src_[p - 1] == '\n';
            } else {
              p += 2;
              line_starting = false;
            }
            return p;
          }
        } else if (src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0 ||
                   src_.compare(p, 3, "+%}") == 0) {
          toks_.push_back(Token{Tok::BlockEnd, pos_at(p), {}});
          const char mod = c == '%' ? 0 : c;
          return after_block_end(mod, p + (mod ? 3 : 2), line_starting);
        }
      }
      const Pos pos = pos_at(p);
      if (is_name_start(c)) {
        size_t e = p;
        while (e < n && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
        toks_.push_back(Token{Tok::Name, pos, src_.substr(p, e - p)});
        p = e;
      } else if (is_digit(c)) {
        p = lex_number(p, pos);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, pos);
      } else {
        static const char* const two[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=()[]{},.:|", c))
            fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "unexpected character '%c'", c);
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
          if (c == ')' || c == ']' || c == '}') {
            if (brackets.empty()) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "unexpected '%c'", c);
            if (brackets.back() != c)
              fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "unexpected '%c', expected '%c'", c, brackets.back());
            brackets.pop_back();
          }
        }
        toks_.push_back(Token{Tok::Op, pos, op});
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p, Pos pos) {
    const size_t n = src_.size();
    size_t e = p;
    std::string digits;
    auto take_digits = [&] {
      while (e < n && (is_digit(src_[e]) || (src_[e] == '_' && e + 1 < n && is_digit(src_[e + 1])))) {
        if (src_[e] != '_') digits += src_[e];
        ++e;
      }
    };
    take_digits();
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      digits += '.';
      ++e;
      take_digits();
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < n && is_digit(src_[k])) {
        is_float = true;
        digits += 'e';
        digits.append(src_, e + 1, k - e - 1);
        e = k;
        take_digits();
      }
    }
    Token t{is_float ? Tok::Float : Tok::Int, pos, digits};
    if (is_float) {
      t.fval = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
      if (errno != 0 || v > uint64_t(INT64_MAX))
        fail_at(LLM_ERR_UNSUPPORTED, pos, "unsupported: integer literal %s is too large", digits.c_str());
      t.ival = int64_t(v);
    }
    toks_.push_back(std::move(t));
    return e;
  }

  // Python string literal escapes (jinja2 decodes them with unicode-escape);
  // an unknown escape keeps its backslash.
  size_t lex_string(size_t p, Pos pos) {
    const char q = src_[p];
    const size_t n = src_.size();
    size_t e = p + 1;
    std::string out;
    auto hex = [&](size_t k, int len, uint32_t& v) {
      v = 0;
      if (k + size_t(len) > n) return false;
      for (int j = 0; j < len; ++j) {
        const char h = src_[k + size_t(j)];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v * 16 + uint32_t(d);
      }
      return true;
    };
    for (;;) {
      if (e >= n) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "unterminated string literal");
      const char c = src_[e];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++e;
        continue;
      }
      if (e + 1 >= n) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "unterminated string literal");
      const char x = src_[e + 1];
      e += 2;
      uint32_t v = 0;
      switch (x) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x':
          if (!hex(e, 2, v)) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "invalid \\x escape");
          out += utf8_encode(v);
          e += 2;
          break;
        case 'u':
          if (!hex(e, 4, v)) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "invalid \\u escape");
          out += utf8_encode(v);
          e += 4;
          break;
        case 'U':
          if (!hex(e, 8, v)) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "invalid \\U escape");
          out += utf8_encode(v);
          e += 8;
          break;
        default:
          if (x >= '0' && x <= '7') {
            v = uint32_t(x - '0');
            for (int j = 0; j < 2 && e < n && src_[e] >= '0' && src_[e] <= '7'; ++j) v = v * 8 + uint32_t(src_[e++] - '0');
            out += utf8_encode(v);
          } else {
            out += '\\';
            out += x;
          }
      }
    }
    toks_.push_back(Token{Tok::String, pos, std::move(out)});
    return e + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> toks_;
};

// ---- parser ------------------------------------------------------------------
class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    std::string end;
    prog->body = parse_body({}, &end);
    return prog;
  }

 private:
  // ---- token helpers
  const Token& peek(size_t k = 0) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool at_op(const char* op, size_t k = 0) const { return peek(k).type == Tok::Op && peek(k).text == op; }
  bool at_name(const char* nm, size_t k = 0) const { return peek(k).type == Tok::Name && peek(k).text == nm; }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* nm) {
    if (!at_name(nm)) return false;
    next();
    return true;
  }
  static const char* describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "'}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "'%}'";
      case Tok::Name: return "name";
      case Tok::String: return "string";
      case Tok::Int:
      case Tok::Float: return "number";
      case Tok::Op: return "operator";
      case Tok::Eof: return "end of template";
    }
    return "token";
  }
  [[noreturn]] void unexpected(const Token& t, const char* wanted) {
    if (t.type == Tok::Op || t.type == Tok::Name)
      fail_at(LLM_ERR_INVALID_ARGUMENT, t.pos, "unexpected '%s', expected %s", t.text.c_str(), wanted);
    fail_at(LLM_ERR_INVALID_ARGUMENT, t.pos, "unexpected %s, expected %s", describe(t), wanted);
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) {
      std::string w = std::string("'") + op + "'";
      unexpected(peek(), w.c_str());
    }
  }
  void expect(Tok type, const char* wanted) {
    if (peek().type != type) unexpected(peek(), wanted);
    next();
  }
  std::string expect_name() {
    if (peek().type != Tok::Name) unexpected(peek(), "a name");
    return next().text;
  }
  void expect_block_end() { expect(Tok::BlockEnd, "'%}'"); }

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser, Pos pos) : p(parser) {
      if (++p.depth_ > kMaxNesting) fail_at(LLM_ERR_INVALID_ARGUMENT, pos, "template nested too deeply");
    }
    ~Nest() { --p.depth_; }
  };

  // ---- statements
  // Parses until `{% <one of ends>` (consumed, name returned in *end) or the end of input.
  Body parse_body(std::initializer_list<const char*> ends, std::string* end) {
    Body body;
    for (;;) {
      const Token& t = peek();
      if (t.type == Tok::Eof) {
        if (ends.size() != 0) {
          std::string w = std::string("'") + *ends.begin() + "'";
          unexpected(t, w.c_str());
        }
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = std::make_unique<Stmt>(Stmt::Text, t.pos);
        s->text = t.text;
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>(Stmt::Output, t.pos);
        s->expr = parse_tuple();
        expect(Tok::VarEnd, "'}}'");
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& kw = peek(1);
        if (kw.type != Tok::Name) unexpected(kw, "a tag name");
        for (const char* e : ends) {
          if (kw.text == e) {
            next();
            next();
            *end = e;
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        unexpected(t, "text or a tag");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Token& kw = next();
    Nest nest(*this, kw.pos);
    const std::string& k = kw.text;
    if (k == "if") return parse_if(kw.pos);
    if (k == "for") return parse_for(kw.pos);
    if (k == "set") return parse_set(kw.pos);
    if (k == "macro") return parse_macro(kw.pos);
    if (k == "filter") {
      auto s = std::make_unique<Stmt>(Stmt::FilterBlock, kw.pos);
      s->filter = parse_filter_chain(nullptr);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endfilter"}, &end);
      expect_block_end();
      return s;
    }
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail_at(LLM_ERR_INVALID_ARGUMENT, kw.pos, "'%s' outside of a loop", k.c_str());
      expect_block_end();
      return std::make_unique<Stmt>(k == "break" ? Stmt::Break : Stmt::Continue, kw.pos);
    }
    if (k == "generation") {
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Scope, kw.pos);
      std::string end;
      s->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return s;
    }
    static const char* const unsupported[] = {"include", "extends", "block", "import", "from", "call",
                                              "with", "autoescape", "do", "trans"};
    for (const char* u : unsupported)
      if (k == u) fail_at(LLM_ERR_UNSUPPORTED, kw.pos, "unsupported tag '%s'", k.c_str());
    fail_at(LLM_ERR_INVALID_ARGUMENT, kw.pos, "unknown tag '%s'", k.c_str());
  }

  std::unique_ptr<Stmt> parse_if(Pos pos) {
    auto s = std::make_unique<Stmt>(Stmt::If, pos);
    ExprPtr cond = parse_expr();
    expect_block_end();
    for (;;) {
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, &end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_expr();
        expect_block_end();
        continue;
      }
      expect_block_end();
      if (end == "else") {
        s->else_body = parse_body({"endif"}, &end);
        expect_block_end();
      }
      return s;
    }
  }

  void parse_targets(std::vector<std::string>& targets) {
    const bool paren = skip_op("(");
    targets.push_back(expect_name());
    while (skip_op(",")) {
      if (peek().type != Tok::Name) break;
      targets.push_back(expect_name());
    }
    if (paren) expect_op(")");
  }

  std::unique_ptr<Stmt> parse_for(Pos pos) {
    auto s = std::make_unique<Stmt>(Stmt::For, pos);
    parse_targets(s->targets);
    if (!skip_name("in")) unexpected(peek(), "'in'");
    s->expr = parse_tuple(/*with_cond=*/false);
    if (skip_name("if")) s->cond = parse_expr();
    if (at_name("recursive")) fail_at(LLM_ERR_UNSUPPORTED, peek().pos, "unsupported: recursive loops");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    s->body = parse_body({"endfor", "else"}, &end);
    --loop_depth_;
    expect_block_end();
    if (end == "else") {
      s->else_body = parse_body({"endfor"}, &end);
      expect_block_end();
    }
    return s;
  }

  std::unique_ptr<Stmt> parse_set(Pos pos) {
    auto s = std::make_unique<Stmt>(Stmt::Set, pos);
    std::string first = expect_name();
    if (skip_op(".")) {
      s->targets.push_back(first);
      s->attr = expect_name();
      expect_op("=");
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    s->targets.push_back(first);
    while (skip_op(",")) s->targets.push_back(expect_name());
    if (skip_op("=")) {
      s->expr = parse_tuple();
      expect_block_end();
      return s;
    }
    if (s->targets.size() != 1) unexpected(peek(), "'='");
    s->kind = Stmt::SetBlock;
    if (skip_op("|")) s->filter = parse_filter_chain(nullptr);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endset"}, &end);
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(Pos pos) {
    auto s = std::make_unique<Stmt>(Stmt::Macro, pos);
    s->text = expect_name();
    expect_op("(");
    while (!at_op(")")) {
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) def = parse_expr();
      s->params.emplace_back(std::move(name), std::move(def));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved;
    if (peek().type == Tok::Name) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  // ---- expressions
  ExprPtr make(Expr::Kind k, Pos p) { return std::make_unique<Expr>(k, p); }

  // expr [, expr]* -> a tuple when there is a comma.
  ExprPtr parse_tuple(bool with_cond = true) {
    const Pos pos = peek().pos;
    ExprPtr e = with_cond ? parse_expr() : parse_or();
    if (!at_op(",")) return e;
    auto t = make(Expr::TupleLit, pos);
    t->args.push_back(std::move(e));
    while (skip_op(",")) {
      if (peek().type == Tok::VarEnd || peek().type == Tok::BlockEnd || at_name("if")) break;
      t->args.push_back(with_cond ? parse_expr() : parse_or());
    }
    return t;
  }

  ExprPtr parse_expr() {
    Nest nest(*this, peek().pos);
    ExprPtr e = parse_or();
    while (at_name("if")) {
      const Pos pos = next().pos;
      auto c = make(Expr::Cond, pos);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expr();
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind k, Op op, Pos pos, ExprPtr a, ExprPtr b) {
    auto e = make(k, pos);
    e->op = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      const Pos pos = next().pos;
      e = binary(Expr::Or, Op::Add, pos, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      const Pos pos = next().pos;
      e = binary(Expr::And, Op::Add, pos, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (at_name("not")) {
      const Pos pos = next().pos;
      Nest nest(*this, pos);
      auto e = make(Expr::Not, pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Pos pos = peek().pos;
    ExprPtr e = parse_math1();
    ExprPtr chain;  // a < b < c -> (a < b) and (b < c); b is evaluated twice
    for (;;) {
      Op op;
      const Token& t = peek();
      if (t.type == Tok::Op && t.text == "==") op = Op::Eq;
      else if (t.type == Tok::Op && t.text == "!=") op = Op::Ne;
      else if (t.type == Tok::Op && t.text == "<") op = Op::Lt;
      else if (t.type == Tok::Op && t.text == "<=") op = Op::Le;
      else if (t.type == Tok::Op && t.text == ">") op = Op::Gt;
      else if (t.type == Tok::Op && t.text == ">=") op = Op::Ge;
      else if (at_name("in")) op = Op::In;
      else if (at_name("not") && at_name("in", 1)) op = Op::NotIn;
      else break;
      const Pos opos = next().pos;
      if (op == Op::NotIn) next();
      ExprPtr rhs = parse_math1();
      if (!chain) {
        if (at_compare_op()) {
          ExprPtr copy = clone(*rhs);
          chain = binary(Expr::Binary, op, opos, std::move(e), std::move(rhs));
          e = std::move(copy);
        } else {
          return binary(Expr::Binary, op, opos, std::move(e), std::move(rhs));
        }
      } else {
        ExprPtr copy = at_compare_op() ? clone(*rhs) : nullptr;
        chain = binary(Expr::And, Op::Add, pos, std::move(chain),
                       binary(Expr::Binary, op, opos, std::move(e), std::move(rhs)));
        if (!copy) return chain;
        e = std::move(copy);
      }
    }
    return chain ? std::move(chain) : std::move(e);
  }
  bool at_compare_op() const {
    const Token& t = peek();
    if (t.type == Tok::Op)
      return t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=";
    return at_name("in") || (at_name("not") && at_name("in", 1));
  }
  static ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>(e.kind, e.pos);
    c->op = e.op;
    c->negated = e.negated;
    c->name = e.name;
    c->value = e.value;
    for (const auto& a : e.args) c->args.push_back(a ? clone(*a) : nullptr);
    for (const auto& kv : e.kwargs) c->kwargs.emplace_back(kv.first, kv.second ? clone(*kv.second) : nullptr);
    return c;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    for (;;) {
      Op op;
      if (at_op("+")) op = Op::Add;
      else if (at_op("-")) op = Op::Sub;
      else return e;
      const Pos pos = next().pos;
      e = binary(Expr::Binary, op, pos, std::move(e), parse_concat());
    }
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (at_op("~")) {
      const Pos pos = next().pos;
      e = binary(Expr::Binary, Op::Concat, pos, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (at_op("*")) op = Op::Mul;
      else if (at_op("/")) op = Op::Div;
      else if (at_op("//")) op = Op::FloorDiv;
      else if (at_op("%")) op = Op::Mod;
      else return e;
      const Pos pos = next().pos;
      e = binary(Expr::Binary, op, pos, std::move(e), parse_pow());
    }
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (at_op("**")) {
      const Pos pos = next().pos;
      e = binary(Expr::Binary, Op::Pow, pos, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    const Pos pos = peek().pos;
    Nest nest(*this, pos);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const bool neg = next().text == "-";
      e = make(Expr::Unary, pos);
      e->op = neg ? Op::Neg : Op::Pos;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    Nest nest(*this, t.pos);
    switch (t.type) {
      case Tok::Name: {
        next();
        auto e = make(Expr::Literal, t.pos);
        if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") e->value = Value::none();
        else {
          e->kind = Expr::Name;
          e->name = t.text;
        }
        return e;
      }
      case Tok::String: {
        auto e = make(Expr::Literal, t.pos);
        std::string s;
        while (peek().type == Tok::String) s += next().text;  // adjacent literals join
        e->value = Value::string(std::move(s));
        return e;
      }
      case Tok::Int: {
        next();
        auto e = make(Expr::Literal, t.pos);
        e->value = Value::integer(t.ival);
        return e;
      }
      case Tok::Float: {
        next();
        auto e = make(Expr::Literal, t.pos);
        e->value = Value::number(t.fval);
        return e;
      }
      case Tok::Op:
        if (t.text == "(") {
          next();
          if (skip_op(")")) return make(Expr::TupleLit, t.pos);
          ExprPtr first = parse_expr();
          if (skip_op(")")) return first;
          auto tup = make(Expr::TupleLit, t.pos);
          tup->args.push_back(std::move(first));
          while (skip_op(",")) {
            if (at_op(")")) break;
            tup->args.push_back(parse_expr());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          next();
          auto e = make(Expr::ListLit, t.pos);
          while (!at_op("]")) {
            e->args.push_back(parse_expr());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(Expr::DictLit, t.pos);
          while (!at_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    unexpected(t, "an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (at_op(".")) {
        const Pos pos = next().pos;
        const Token& t = peek();
        if (t.type == Tok::Name) {
          auto a = make(Expr::Attr, pos);
          a->name = next().text;
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (t.type == Tok::Int) {
          auto a = make(Expr::Item, pos);
          a->args.push_back(std::move(e));
          auto idx = make(Expr::Literal, t.pos);
          idx->value = Value::integer(next().ival);
          a->args.push_back(std::move(idx));
          e = std::move(a);
        } else {
          unexpected(t, "an attribute name");
        }
      } else if (at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Pos pos = next().pos;  // [
    Nest nest(*this, pos);
    ExprPtr parts[3];
    bool is_slice = false;
    if (!at_op(":")) {
      parts[0] = parse_expr();
      if (skip_op("]")) {
        auto e = make(Expr::Item, pos);
        e->args.push_back(std::move(obj));
        e->args.push_back(std::move(parts[0]));
        return e;
      }
    }
    expect_op(":");
    is_slice = true;
    if (!at_op("]") && !at_op(":")) parts[1] = parse_expr();
    if (skip_op(":")) {
      if (!at_op("]")) parts[2] = parse_expr();
    }
    expect_op("]");
    auto e = make(Expr::Slice, pos);
    (void)is_slice;
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  void parse_args(Expr& call) {
    expect_op("(");
    while (!at_op(")")) {
      if (at_op("*") || at_op("**")) fail_at(LLM_ERR_UNSUPPORTED, peek().pos, "unsupported: *args and **kwargs");
      if (peek().type == Tok::Name && at_op("=", 1)) {
        std::string name = next().text;
        next();
        call.kwargs.emplace_back(std::move(name), parse_expr());
      } else {
        if (!call.kwargs.empty()) fail_at(LLM_ERR_INVALID_ARGUMENT, peek().pos, "positional argument follows keyword argument");
        call.args.push_back(parse_expr());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Call, callee->pos);  // errors point at what is called
    Nest nest(*this, e->pos);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  // | name [(args)] [| name ...]; `input` may be null (filter blocks).
  ExprPtr parse_filter_chain(ExprPtr input) {
    bool first = input == nullptr;
    ExprPtr e = std::move(input);
    do {
      if (!first) expect_op("|");
      first = false;
      const Token& t = peek();
      std::string name = expect_name();
      while (at_op(".")) {  // dotted filter names
        next();
        name += "." + expect_name();
      }
      auto f = make(Expr::Filter, t.pos);
      f->name = name;
      f->args.push_back(std::move(e));
      if (at_op("(")) parse_args(*f);
      e = std::move(f);
    } while (at_op("|"));
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (at_name("is")) {
        const Pos pos = next().pos;
        auto t = make(Expr::Test, pos);
        t->negated = skip_name("not");
        std::string name = expect_name();
        t->name = name;
        t->args.push_back(std::move(e));
        const Token& a = peek();
        if (at_op("(")) {
          parse_args(*t);
        } else if ((a.type == Tok::Name || a.type == Tok::String || a.type == Tok::Int || a.type == Tok::Float ||
                    at_op("[") || at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if")) {
          if (at_name("is")) unexpected(a, "a test argument");
          ExprPtr arg = parse_postfix(parse_primary());
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_template(std::string_view source) {
  // jinja2 normalises line endings to "\n" and drops one trailing newline
  // (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(std::move(src));
  Parser parser(lexer.run());
  return parser.run();
}

}  // namespace llm::chat::detail
