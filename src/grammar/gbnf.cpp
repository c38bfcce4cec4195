// GBNF parser and compiler: text -> Grammar (flat element array, rules as
// lists of alternatives). Groups and repetitions become generated rules:
//   x*      -> S ::= x S | ""            (tail recursion: the stack does not grow)
//   x{m,n}  -> x ... x (m times) O(n-m),  O(k) ::= x O(k-1) | ""
// Then three analyses over the rule graph: which rules match the empty string,
// left recursion (an error), and which rules are short enough that the mask
// cache looks through them (Rule::transparent).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "grammar/grammar.h"

namespace llm::grammar {

namespace {

constexpr size_t kMaxElements = size_t(1) << 20;  // whole grammar, after repetitions are expanded
constexpr uint32_t kMaxRepeat = 65535;            // m and n of {m,n}
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kTransparentMaxLen = 8;        // code points; see Rule::transparent
constexpr int kMaxNesting = 256;                  // parentheses

struct PendingRule {
  std::string name;
  bool generated = false;
  bool defined = false;
  size_t def_offset = 0;  // where it was defined (or, for generated rules, opened)
  size_t ref_offset = 0;  // first reference (for "undefined rule")
  uint32_t parent = 0;    // generated rules: the user rule they were made for
  uint32_t chain_k = 0;   // O(k) of a bounded repetition (see Rule::chain_k)
  std::vector<std::vector<Element>> alts;
};

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

CharSet make_charset(std::vector<std::pair<uint32_t, uint32_t>> r, bool negated) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& p : r) {
    if (!merged.empty() && p.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, p.second);
    else
      merged.push_back(p);
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> inv;
    uint32_t next = 0;
    for (const auto& p : merged) {
      if (p.first > next) inv.push_back({next, p.first - 1});
      next = p.second + 1;
    }
    if (next <= kMaxCodePoint) inv.push_back({next, kMaxCodePoint});
    merged.swap(inv);
  }
  CharSet cs;
  for (const auto& p : merged) {
    for (uint32_t c = p.first; c <= std::min<uint32_t>(p.second, 0x7F); ++c) cs.ascii[c >> 6] |= uint64_t(1) << (c & 63);
    if (p.second >= 0x80) cs.ranges.push_back({std::max<uint32_t>(p.first, 0x80), p.second});
  }
  return cs;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  void parse() {
    skip_space(true);
    while (i_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
  }

  std::shared_ptr<Grammar> finish(std::string_view root_name);

 private:
  [[noreturn]] void error_at(size_t off, const char* fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
  {
    off = std::min(off, s_.size());
    size_t line = 1, col = 1;
    for (size_t k = 0; k < off; ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail(LLM_ERR_INVALID_ARGUMENT, "grammar: line %zu, column %zu: %s", line, col, msg);
  }

  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

  void skip_space(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') ++i_;
      } else if ((c == '\n' || c == '\r') && newlines) {
        ++i_;
      } else {
        break;
      }
    }
  }

  uint32_t rule_id(const std::string& name, size_t off) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = uint32_t(rules_.size());
    rules_.emplace_back();
    rules_.back().name = name;
    rules_.back().ref_offset = off;
    ids_.emplace(name, id);
    return id;
  }

  uint32_t new_generated(size_t off) {
    const uint32_t id = uint32_t(rules_.size());
    rules_.emplace_back();
    PendingRule& r = rules_.back();
    r.name = rules_[current_].name + "/" + std::to_string(n_generated_++);
    r.generated = true;
    r.parent = current_;
    r.defined = true;
    r.def_offset = off;
    return id;
  }

  void count(size_t n, size_t off) {
    n_elements_ += n;
    if (n_elements_ > kMaxElements) error_at(off, "grammar too large (over %zu elements after expanding repetitions)", kMaxElements);
  }

  uint32_t charset_id(CharSet cs) {
    charsets_.push_back(std::move(cs));
    return uint32_t(charsets_.size() - 1);
  }
  uint32_t single_char(uint32_t cp) {
    auto it = single_.find(cp);
    if (it != single_.end()) return it->second;
    const uint32_t id = charset_id(make_charset({{cp, cp}}, false));
    single_.emplace(cp, id);
    return id;
  }

  void parse_rule() {
    const size_t off = i_;
    std::string name;
    while (i_ < s_.size() && is_word_char(s_[i_])) name.push_back(s_[i_++]);
    if (name.empty()) error_at(off, "expected a rule name");
    skip_space(false);
    if (s_.substr(i_, 3) != "::=") error_at(i_, "expected '::=' after rule name '%s'", name.c_str());
    i_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, off);
    if (rules_[id].defined) error_at(off, "rule '%s' is defined twice", name.c_str());
    rules_[id].defined = true;
    rules_[id].def_offset = off;
    current_ = id;
    parse_alternates(id, false);
    skip_space(false);
    if (at_end()) return;
    if (peek() == '\n' || peek() == '\r') {
      ++i_;
      return;
    }
    if (peek() == ')') error_at(i_, "unexpected ')'");
    error_at(i_, "expected the end of rule '%s'", name.c_str());
  }

  void parse_alternates(uint32_t id, bool nested) {
    std::vector<std::vector<Element>> alts;
    alts.push_back(parse_sequence(nested));
    while (peek() == '|') {
      ++i_;
      skip_space(true);
      alts.push_back(parse_sequence(nested));
    }
    count(alts.size(), i_);  // End elements
    rules_[id].alts = std::move(alts);
  }

  uint32_t parse_hex(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else error_at(i_, "expected %zu hex digits", n);
      v = v * 16 + uint32_t(d);
      ++i_;
    }
    return v;
  }

  // One code point of a literal or a class (escapes decoded).
  uint32_t parse_char() {
    const size_t off = i_;
    if (at_end()) error_at(off, "unexpected end of input");
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c == '\\') {
      ++i_;
      const char e = peek();
      ++i_;
      uint32_t v;
      switch (e) {
        case 'x': v = parse_hex(2); break;
        case 'u': v = parse_hex(4); break;
        case 'U': v = parse_hex(8); break;
        case 't': return '\t';
        case 'n': return '\n';
        case 'r': return '\r';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return uint32_t(e);
        default: error_at(off, "unknown escape '\\%c'", e ? e : '0');
      }
      if (v > kMaxCodePoint) error_at(off, "code point U+%X is past U+10FFFF", v);
      return v;
    }
    // UTF-8
    uint32_t cp;
    size_t len;
    if (c < 0x80) { cp = c; len = 1; }
    else if (c >= 0xC2 && c <= 0xDF) { cp = c & 0x1F; len = 2; }
    else if (c >= 0xE0 && c <= 0xEF) { cp = c & 0x0F; len = 3; }
    else if (c >= 0xF0 && c <= 0xF4) { cp = c & 0x07; len = 4; }
    else error_at(off, "invalid UTF-8");
    if (i_ + len > s_.size()) error_at(off, "invalid UTF-8");
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(s_[i_ + k]);
      if ((b & 0xC0) != 0x80) error_at(off, "invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) error_at(off, "invalid UTF-8");
    i_ += len;
    return cp;
  }

  uint32_t parse_count() {
    const size_t off = i_;
    uint64_t v = 0;
    if (!(peek() >= '0' && peek() <= '9')) error_at(off, "expected a number");
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + uint64_t(peek() - '0');
      if (v > kMaxRepeat) error_at(off, "repetition count over %u", kMaxRepeat);
      ++i_;
    }
    return uint32_t(v);
  }

  // Replaces seq[start..] (the last item) by its repetition {lo, hi}; hi = ~0u: unbounded.
  void repeat(std::vector<Element>& seq, size_t start, uint32_t lo, uint32_t hi, size_t off) {
    if (start >= seq.size()) error_at(off, "repetition without an item before it");
    Element x;
    if (seq.size() - start == 1) {
      x = seq[start];
    } else {
      const uint32_t g = new_generated(off);
      rules_[g].alts.push_back(std::vector<Element>(seq.begin() + long(start), seq.end()));
      count(1, off);
      x = {Op::Ref, g};
    }
    seq.resize(start);
    const bool unbounded = hi == ~0u;
    const size_t extra = lo + (unbounded ? 5 : 5 * size_t(hi - lo));
    count(extra, off);
    for (uint32_t k = 0; k < lo; ++k) seq.push_back(x);
    if (unbounded) {
      const uint32_t r = new_generated(off);
      rules_[r].alts = {{x, {Op::Ref, r}}, {}};
      seq.push_back({Op::Ref, r});
    } else if (hi > lo) {
      uint32_t prev = ~0u;
      for (uint32_t k = 0; k < hi - lo; ++k) {
        const uint32_t r = new_generated(off);
        if (prev == ~0u) {
          rules_[r].alts = {{x}, {}};
        } else {
          rules_[r].alts = {{x, {Op::Ref, prev}}, {}};
          rules_[r].chain_k = k + 1;
        }
        prev = r;
      }
      seq.push_back({Op::Ref, prev});
    }
  }

  std::vector<Element> parse_sequence(bool nested) {
    std::vector<Element> seq;
    size_t last = size_t(-1);  // start of the last item in seq
    while (!at_end()) {
      const size_t off = i_;
      const char c = peek();
      if (c == '"') {
        ++i_;
        last = seq.size();
        while (peek() != '"') {
          if (at_end()) error_at(off, "unterminated string literal");
          seq.push_back({Op::Chars, single_char(parse_char())});
          count(1, off);
        }
        ++i_;
      } else if (c == '[') {
        ++i_;
        bool negated = false;
        if (peek() == '^') {
          negated = true;
          ++i_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (peek() != ']') {
          if (at_end()) error_at(off, "unterminated character class");
          const uint32_t a = parse_char();
          uint32_t b = a;
          if (peek() == '-' && peek(1) != ']' && i_ + 1 < s_.size()) {
            ++i_;
            const size_t roff = i_;
            b = parse_char();
            if (b < a) error_at(roff, "character range out of order");
          }
          ranges.push_back({a, b});
        }
        ++i_;
        last = seq.size();
        seq.push_back({Op::Chars, charset_id(make_charset(std::move(ranges), negated))});
        count(1, off);
      } else if (c == '.') {
        ++i_;
        last = seq.size();
        if (any_ == ~0u) any_ = charset_id(make_charset({{0, kMaxCodePoint}}, false));
        seq.push_back({Op::Chars, any_});
        count(1, off);
      } else if (c == '(') {
        ++i_;
        skip_space(true);
        if (++depth_ > kMaxNesting) error_at(off, "parentheses nested deeper than %d", kMaxNesting);
        const uint32_t g = new_generated(off);
        parse_alternates(g, true);
        --depth_;
        if (peek() != ')') error_at(i_, "expected ')'");
        ++i_;
        last = seq.size();
        seq.push_back({Op::Ref, g});
        count(1, off);
      } else if (c == '<' || (c == '!' && peek(1) == '<')) {
        const bool neg = c == '!';
        i_ += neg ? 2 : 1;
        last = seq.size();
        if (peek() == '[') {
          ++i_;
          uint64_t id = 0;
          if (!(peek() >= '0' && peek() <= '9')) error_at(i_, "expected a token id");
          while (peek() >= '0' && peek() <= '9') {
            id = id * 10 + uint64_t(peek() - '0');
            if (id > 0x7FFFFFFF) error_at(off, "token id too large");
            ++i_;
          }
          if (peek() != ']' || peek(1) != '>') error_at(i_, "expected ']>'");
          i_ += 2;
          seq.push_back({neg ? Op::NotToken : Op::Token, uint32_t(id)});
        } else {
          const size_t start = i_ - 1;  // the text includes the brackets: <think>
          while (!at_end() && peek() != '>' && peek() != '\n') ++i_;
          if (peek() != '>' || i_ == start + 1) error_at(off, "expected '<token>'");
          ++i_;
          token_texts_.emplace_back(s_.substr(start, i_ - start));
          seq.push_back({neg ? Op::NotTokenText : Op::TokenText, uint32_t(token_texts_.size() - 1)});
        }
        count(1, off);
      } else if (is_word_char(c)) {
        std::string name;
        while (!at_end() && is_word_char(peek())) name.push_back(s_[i_++]);
        last = seq.size();
        seq.push_back({Op::Ref, rule_id(name, off)});
        count(1, off);
      } else if (c == '*' || c == '+' || c == '?') {
        ++i_;
        if (last == size_t(-1)) error_at(off, "'%c' without an item before it", c);
        // A run of these quantifiers is one: x+* = x*, x?+ = x*, x++ = x+,
        // x?? = x?. Nested nullable loops would only give the matcher many
        // paths to every state.
        uint32_t lo = c == '+' ? 1 : 0, hi = c == '?' ? 1 : ~0u;
        for (;;) {
          const size_t save = i_;
          skip_space(nested);
          const char d = peek();
          if (d != '*' && d != '+' && d != '?') {
            i_ = save;
            break;
          }
          ++i_;
          lo = std::min<uint32_t>(lo, d == '+' ? 1 : 0);
          hi = (hi == ~0u || d != '?') ? ~0u : 1;
        }
        repeat(seq, last, lo, hi, off);
      } else if (c == '{') {
        ++i_;
        if (last == size_t(-1)) error_at(off, "'{' without an item before it");
        skip_space(false);
        const uint32_t lo = parse_count();
        uint32_t hi = lo;
        skip_space(false);
        if (peek() == ',') {
          ++i_;
          skip_space(false);
          hi = (peek() >= '0' && peek() <= '9') ? parse_count() : ~0u;
          skip_space(false);
        }
        if (peek() != '}') error_at(i_, "expected '}'");
        ++i_;
        if (hi < lo) error_at(off, "repetition {%u,%u}: the maximum is below the minimum", lo, hi);
        repeat(seq, last, lo, hi, off);
      } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
        break;
      } else {
        error_at(off, "unexpected character '%c'", c);
      }
      skip_space(nested);
    }
    return seq;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::vector<PendingRule> rules_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<CharSet> charsets_;
  std::unordered_map<uint32_t, uint32_t> single_;
  uint32_t any_ = ~0u;
  std::vector<std::string> token_texts_;
  size_t n_elements_ = 0;
  uint32_t current_ = 0;
  uint32_t n_generated_ = 0;
  int depth_ = 0;
};

// Strongly connected components (iterative Tarjan). comp[v] = component id;
// components are numbered in reverse topological order (every edge goes to a
// component with an id <= its own).
std::vector<uint32_t> tarjan(const std::vector<std::vector<uint32_t>>& adj) {
  const uint32_t n = uint32_t(adj.size());
  const uint32_t kUnset = ~0u;
  std::vector<uint32_t> index(n, kUnset), low(n, 0), comp(n, kUnset);
  std::vector<uint32_t> stack;
  std::vector<char> on_stack(n, 0);
  std::vector<std::pair<uint32_t, uint32_t>> call;  // (vertex, next edge)
  uint32_t next_index = 0, next_comp = 0;
  for (uint32_t root = 0; root < n; ++root) {
    if (index[root] != kUnset) continue;
    call.push_back({root, 0});
    while (!call.empty()) {
      const uint32_t v = call.back().first;
      uint32_t& e = call.back().second;
      if (e == 0 && index[v] == kUnset) {
        index[v] = low[v] = next_index++;
        stack.push_back(v);
        on_stack[v] = 1;
      }
      if (e < adj[v].size()) {
        const uint32_t w = adj[v][e++];
        if (index[w] == kUnset) {
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      if (low[v] == index[v]) {
        uint32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp[w] = next_comp;
        } while (w != v);
        ++next_comp;
      }
      call.pop_back();
      if (!call.empty()) {
        const uint32_t u = call.back().first;
        low[u] = std::min(low[u], low[v]);
      }
    }
  }
  return comp;
}

std::shared_ptr<Grammar> Parser::finish(std::string_view root_name) {
  for (const PendingRule& r : rules_)
    if (!r.defined) error_at(r.ref_offset, "undefined rule '%s'", r.name.c_str());
  auto root_it = ids_.find(std::string(root_name));
  if (root_it == ids_.end())
    error_at(s_.size(), "no rule named '%.*s' (the start rule)", int(root_name.size()), root_name.data());

  auto g = std::make_shared<Grammar>();
  g->root = root_it->second;
  g->charsets = std::move(charsets_);
  g->token_texts = std::move(token_texts_);
  const uint32_t n = uint32_t(rules_.size());
  g->rules.resize(n);
  for (uint32_t r = 0; r < n; ++r) {
    g->rules[r].name = rules_[r].name;
    g->rules[r].generated = rules_[r].generated;
    for (const auto& alt : rules_[r].alts) {
      g->rules[r].alts.push_back(uint32_t(g->elems.size()));
      for (const Element& e : alt) {
        g->elems.push_back(e);
        g->elem_rule.push_back(r);
      }
      g->elems.push_back({Op::End, 0});
      g->elem_rule.push_back(r);
    }
  }

  // Rules that match the empty string (fixed point).
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : rules_[r].alts) {
        bool all = true;
        for (const Element& e : alt)
          if (!(e.op == Op::Ref && nullable[e.arg])) {
            all = false;
            break;
          }
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }

  // Rules that can finish at all (some alternative made of terminals and
  // such rules); one that cannot would leave the matcher with no way forward.
  {
    std::vector<char> productive(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < n; ++r) {
        if (productive[r]) continue;
        for (const auto& alt : rules_[r].alts) {
          bool all = true;
          for (const Element& e : alt)
            if (e.op == Op::Ref && !productive[e.arg]) {
              all = false;
              break;
            }
          if (all) {
            productive[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    for (uint32_t r = 0; r < n; ++r) {
      if (productive[r]) continue;
      uint32_t culprit = r;
      if (rules_[culprit].generated) culprit = rules_[culprit].parent;
      error_at(rules_[culprit].def_offset, "rule '%s' can never complete (every alternative recurses into it)",
               rules_[culprit].name.c_str());
    }
  }

  // Left recursion: a rule reached again before any input is consumed, with a
  // return position pushed on the way (the stack would grow without end). A
  // cycle made only of tail calls (x* over a nullable x) keeps the stack flat,
  // and the matcher's expansion stops at states it has already seen.
  std::vector<std::vector<uint32_t>> first(n);
  std::vector<std::pair<uint32_t, uint32_t>> growing;  // (from, to) edges that push a frame
  for (uint32_t r = 0; r < n; ++r) {
    for (const auto& alt : rules_[r].alts) {
      for (size_t k = 0; k < alt.size(); ++k) {
        const Element& e = alt[k];
        if (e.op != Op::Ref) break;
        first[r].push_back(e.arg);
        if (k + 1 < alt.size()) growing.push_back({r, e.arg});
        if (!nullable[e.arg]) break;
      }
    }
  }
  {
    const std::vector<uint32_t> comp = tarjan(first);
    for (const auto& edge : growing) {
      if (comp[edge.first] != comp[edge.second]) continue;
      // Name a user rule of the cycle if there is one.
      uint32_t culprit = edge.first;
      for (uint32_t r = 0; r < n; ++r)
        if (comp[r] == comp[edge.first] && !rules_[r].generated) {
          culprit = r;
          break;
        }
      if (rules_[culprit].generated) culprit = rules_[culprit].parent;
      error_at(rules_[culprit].def_offset, "left recursion in rule '%s'", rules_[culprit].name.c_str());
    }
  }

  // Longest match in code points (unbounded if the rule reaches a cycle);
  // short user rules (a character, an escape) are transparent to the cache.
  {
    std::vector<std::vector<uint32_t>> refs(n);
    for (uint32_t r = 0; r < n; ++r)
      for (const auto& alt : rules_[r].alts)
        for (const Element& e : alt)
          if (e.op == Op::Ref) refs[r].push_back(e.arg);
    const std::vector<uint32_t> comp = tarjan(refs);
    std::vector<uint32_t> order(n);
    for (uint32_t r = 0; r < n; ++r) order[r] = r;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return comp[a] < comp[b]; });
    std::vector<uint32_t> comp_size(n, 0);
    for (uint32_t r = 0; r < n; ++r) comp_size[comp[r]]++;
    const uint32_t kInf = std::numeric_limits<uint32_t>::max();
    std::vector<uint32_t> maxlen(n, 0);
    for (uint32_t r : order) {
      bool cyclic = comp_size[comp[r]] > 1;
      uint64_t best = 0;
      for (const auto& alt : rules_[r].alts) {
        uint64_t len = 0;
        for (const Element& e : alt) {
          if (e.op == Op::Ref) {
            if (e.arg == r) cyclic = true;
            len += maxlen[e.arg] == kInf ? uint64_t(kInf) : maxlen[e.arg];
          } else {
            len += 1;
          }
        }
        best = std::max(best, len);
      }
      maxlen[r] = cyclic || best >= kInf ? kInf : uint32_t(best);
    }
    for (uint32_t r = 0; r < n; ++r) g->rules[r].transparent = rules_[r].generated || maxlen[r] <= kTransparentMaxLen;
  }

  // Chains whose item always consumes input, laid out as Rule::chain_k says.
  for (uint32_t r = 0; r < n; ++r) {
    const uint32_t k = rules_[r].chain_k;
    if (k < 2) continue;
    const Element x = rules_[r].alts[0][0];
    if (x.op == Op::Ref && nullable[x.arg]) continue;
    if (k > 2 && g->rules[r - 1].chain_k != k - 1) continue;
    if (k > 2 && g->rules[r].alts[0] != g->rules[r - 1].alts[0] + 4) continue;
    g->rules[r].chain_k = k;
  }
  return g;
}

}  // namespace

bool CharSet::contains(uint32_t cp) const {
  if (cp < 0x80) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(cp, ~0u));
  return it != ranges.begin() && (it - 1)->second >= cp;
}

bool CharSet::intersects(uint32_t lo, uint32_t hi) const {
  for (uint32_t c = lo; c <= hi && c < 0x80; ++c)
    if (contains(c)) return true;
  if (hi < 0x80) return false;
  lo = std::max<uint32_t>(lo, 0x80);
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(lo, ~0u));
  if (it != ranges.begin() && (it - 1)->second >= lo) return true;
  return it != ranges.end() && it->first <= hi;
}

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root) {
  Parser p(text);
  p.parse();
  return p.finish(root);
}

}  // namespace llm::grammar
