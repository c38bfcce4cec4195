// Chat-template renderer: runs a parsed Program over the messages with
// jinja2's semantics (default Undefined, Python values) inside the bounds of
// RenderOptions: steps, string and output size, macro depth.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "chat/ast.h"
#include "chat/chat_template.h"
#include "core/error.h"

namespace llm::chat::detail {

namespace {

constexpr size_t kMaxListItems = size_t(1) << 20;

// Macro recursion is bounded by max_depth and also by the stack it uses, so
// that a render on a thread with a small stack (512 KiB is common) cannot
// overflow it. A macro level takes about 4 KiB; sanitizers make frames larger.
#if defined(__SANITIZE_ADDRESS__)
#define LLM_CHAT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LLM_CHAT_SANITIZED 1
#endif
#endif
#ifdef LLM_CHAT_SANITIZED
constexpr uintptr_t kStackBudget = uintptr_t(2) << 20;
#else
constexpr uintptr_t kStackBudget = uintptr_t(192) << 10;
#endif

enum class Flow { Normal, Break, Continue };

using Frame = std::vector<std::pair<std::string, Value>>;

Value* frame_find(Frame& f, std::string_view name) {
  for (auto it = f.rbegin(); it != f.rend(); ++it)
    if (it->first == name) return &it->second;
  return nullptr;
}
void frame_set(Frame& f, const std::string& name, Value v) {
  if (Value* old = frame_find(f, name)) {
    *old = std::move(v);
    return;
  }
  f.emplace_back(name, std::move(v));
}

// ---- string helpers (Python str methods on UTF-8) ------------------------------
bool py_space(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + size_t(len) > s.size()) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int j = 1; j < len; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[k + size_t(j)]) & 0x3F);
    out.push_back(cp);
    k += size_t(len);
  }
  return out;
}
std::string encode(const std::vector<uint32_t>& cps, size_t b = 0, size_t e = SIZE_MAX) {
  std::string out;
  e = std::min(e, cps.size());
  for (size_t k = b; k < e; ++k) out += utf8_encode(cps[k]);
  return out;
}

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<uint32_t> cps = decode(s);
  std::vector<uint32_t> set;
  const bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) set = decode(chars->str());
  auto in = [&](uint32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in(cps[b])) ++b;
  if (right)
    while (e > b && in(cps[e - 1])) --e;
  return encode(cps, b, e);
}

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}
uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}
bool is_alpha(uint32_t c) { return to_upper(c) != c || to_lower(c) != c || (c > 0x7f && !py_space(c) && c >= 0x100); }
std::string map_case(const std::string& s, bool upper) {
  std::vector<uint32_t> cps = decode(s);
  for (auto& c : cps) c = upper ? to_upper(c) : to_lower(c);
  return encode(cps);
}
// str.title(): a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(const std::string& s) {
  std::vector<uint32_t> cps = decode(s);
  bool prev_cased = false;
  for (auto& c : cps) {
    const bool cased = to_upper(c) != c || to_lower(c) != c;
    if (cased) c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return encode(cps);
}
// jinja2's title filter: words begin after '-', whitespace, '(', '{', '[', '<'.
std::string jinja_title(const std::string& s) {
  std::vector<uint32_t> cps = decode(s);
  bool start = true;
  for (auto& c : cps) {
    const bool sep = c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      start = true;
      continue;
    }
    c = start ? to_upper(c) : to_lower(c);
    start = false;
  }
  return encode(cps);
}
std::string capitalize(const std::string& s) {
  std::vector<uint32_t> cps = decode(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? to_upper(cps[k]) : to_lower(cps[k]);
  return encode(cps);
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        size_t cap) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between code points and at both ends.
    std::vector<size_t> off = utf8_offsets(s);
    int64_t n = 0;
    for (size_t k = 0; k + 1 < off.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out.append(s, off[k], off[k + 1] - off[k]);
      if (out.size() > cap) return out;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t p = 0;
  int64_t n = 0;
  for (;;) {
    size_t f = (count < 0 || n < count) ? s.find(from, p) : std::string::npos;
    if (f == std::string::npos) {
      out.append(s, p, std::string::npos);
      return out;
    }
    out.append(s, p, f - p);
    out += to;
    if (out.size() > cap) return out;
    p = f + from.size();
    ++n;
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

// ---- renderer ------------------------------------------------------------------
class Renderer {
 public:
  Renderer(const RenderOptions& opt) : opt_(opt), saved_arena_(current_arena()) { current_arena() = &arena_; }
  ~Renderer() {
    current_arena() = saved_arena_;
    // Empty every container first: what they hold drops while every other
    // container is still alive, so nothing is freed recursively and cycles
    // are broken.
    for (auto& l : arena_.lists) {
      List tmp;
      tmp.swap(*l);
    }
    for (auto& d : arena_.dicts) {
      std::vector<std::pair<Value, Value>> tmp;
      tmp.swap(d->items);
    }
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  [[noreturn]] void fail(Pos p, const std::string& msg, llm_status status = LLM_ERR_INVALID_ARGUMENT) {
    throw Error(status, "chat template: line " + std::to_string(p.line) + ", column " + std::to_string(p.col) +
                            ": " + msg);
  }

  // Steps: statements and expression nodes, plus one per 64 bytes of string made.
  void step(Pos p, uint64_t n = 1) {
    steps_ += n;
    if (steps_ + (arena_.string_bytes >> 6) > opt_.max_steps)
      fail(p, "template exceeded max_steps (" + std::to_string(opt_.max_steps) + "); an endless loop?");
  }

  // Strings built by concatenation, repetition, joins... go through here for
  // the size cap (every string made is charged to the steps, see Arena).
  Value make_str(std::string s, Pos p) {
    check_size(s.size(), p);
    Value v = Value::string(std::move(s));
    step(p);
    return v;
  }
  void check_size(size_t n, Pos p) {
    if (n > opt_.max_output_bytes)
      fail(p, "string exceeds max_output_bytes (" + std::to_string(opt_.max_output_bytes) + ")");
  }
  Value make_list(List items, Pos p, bool tuple = false) {
    if (items.size() > kMaxListItems) fail(p, "list too long");
    step(p, items.size() * 4);
    return Value::make_list(std::move(items), tuple);
  }

  std::string run(const Program& prog, const std::vector<Message>& msgs) {
    char base = 0;
    stack_base_ = reinterpret_cast<uintptr_t>(&base);
    Frame globals;
    List ml;
    for (const auto& m : msgs) {
      Value d = Value::make_dict();
      d.dict->set("role", Value::string(m.role));
      d.dict->set("content", Value::string(m.content));
      ml.push_back(std::move(d));
    }
    globals.emplace_back("messages", Value::make_list(std::move(ml)));
    globals.emplace_back("tools", Value::none());
    globals.emplace_back("documents", Value::none());
    globals.emplace_back("add_generation_prompt", Value::boolean(opt_.add_generation_prompt));
    globals.emplace_back("bos_token", Value::string(opt_.bos_token));
    globals.emplace_back("eos_token", Value::string(opt_.eos_token));
    add_global_functions(globals);
    globals_ = &globals;
    Frame root;
    scopes_.push_back(&root);
    std::string out;
    exec_body(prog.body, out);
    return out;
  }

  // ---- statements
  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void emit(std::string& out, const std::string& s, Pos p) {
    check_size(out.size() + s.size(), p);
    out += s;
  }

  Flow exec(const Stmt& s, std::string& out) {
    step(s.pos);
    try {
      return exec_stmt(s, out);
    } catch (const ValueError& ve) {
      fail(s.pos, ve.message);
    }
  }

  Flow exec_stmt(const Stmt& s, std::string& out) {
    switch (s.kind) {
      case Stmt::Text: emit(out, s.text, s.pos); return Flow::Normal;
      case Stmt::Output: {
        Value v = eval(*s.expr);
        if (v.is_string()) emit(out, v.str(), s.pos);
        else emit(out, to_str(v), s.pos);
        return Flow::Normal;
      }
      case Stmt::If:
        for (const auto& br : s.branches)
          if (truthy(eval(*br.first))) return exec_body(br.second, out);
        return exec_body(s.else_body, out);
      case Stmt::For: return exec_for(s, out);
      case Stmt::Set: {
        Value v = eval(*s.expr);
        if (!s.attr.empty()) {
          Value target = lookup(s.targets[0]);
          if (target.type != Type::Namespace)
            fail(s.pos, "cannot assign attribute on non-namespace object '" + s.targets[0] + "'");
          target.dict->set(s.attr, std::move(v));
        } else {
          assign(s.targets, std::move(v), s.pos);
        }
        return Flow::Normal;
      }
      case Stmt::SetBlock: {
        std::string buf;
        exec_body(s.body, buf);
        Value v = Value::string(std::move(buf));
        if (s.filter) v = eval_filter_chain(*s.filter, std::move(v));
        frame_set(*scopes_.back(), s.targets[0], std::move(v));
        return Flow::Normal;
      }
      case Stmt::Macro: {
        // A macro sees the template's top level as it is when called, and
        // the enclosing loop or macro variables as they were when defined.
        const Stmt* m = &s;
        auto closure = std::make_shared<Frame>();
        for (size_t k = 1; k < scopes_.size(); ++k)
          for (const auto& kv : *scopes_[k]) frame_set(*closure, kv.first, kv.second);
        frame_set(*scopes_.back(), s.text,
                  Value::function(s.text, [m, closure](Renderer& r, CallArgs& a, const Pos& p) {
                    return r.call_macro(*m, *closure, a, p);
                  }));
        return Flow::Normal;
      }
      case Stmt::FilterBlock: {
        std::string buf;
        exec_body(s.body, buf);
        Value v = eval_filter_chain(*s.filter, Value::string(std::move(buf)));
        emit(out, to_str(v), s.pos);
        return Flow::Normal;
      }
      case Stmt::Break: return Flow::Break;
      case Stmt::Continue: return Flow::Continue;
      case Stmt::Scope: return exec_body(s.body, out);
    }
    return Flow::Normal;
  }

  void assign(const std::vector<std::string>& targets, Value v, Pos p) {
    if (targets.size() == 1) {
      frame_set(*scopes_.back(), targets[0], std::move(v));
      return;
    }
    List items = iterate(v, p);
    if (items.size() != targets.size())
      fail(p, items.size() > targets.size() ? "too many values to unpack" : "not enough values to unpack");
    for (size_t k = 0; k < targets.size(); ++k) frame_set(*scopes_.back(), targets[k], std::move(items[k]));
  }

  // The items a for loop walks: list items, dict keys, string characters.
  List iterate(const Value& v, Pos p) {
    switch (v.type) {
      case Type::Undefined: return {};
      case Type::List: return *v.list;
      case Type::Dict: {
        List keys;
        for (const auto& kv : v.dict->items) keys.push_back(kv.first);
        return keys;
      }
      case Type::String: {
        List chars;
        const std::string& s = v.str();
        std::vector<size_t> off = utf8_offsets(s);
        step(p, off.size());
        for (size_t k = 0; k + 1 < off.size(); ++k) chars.push_back(Value::string(s.substr(off[k], off[k + 1] - off[k])));
        return chars;
      }
      default: fail(p, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  Flow exec_for(const Stmt& s, std::string& out) {
    Value seq = eval(*s.expr);
    List items = iterate(seq, s.expr->pos);
    if (s.cond) {
      List kept;
      for (auto& item : items) {
        Frame f;
        scopes_.push_back(&f);
        assign_into(f, s.targets, item, s.pos);
        const bool keep = truthy(eval(*s.cond));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const size_t n = items.size();
    if (n == 0) return exec_body(s.else_body, out);
    // One loop object per loop, updated in place each iteration (a fresh
    // dict per iteration costs more than the body of a typical loop).
    static const char* const kKeys[] = {"index",    "index0",   "revindex", "revindex0", "first", "last",
                                        "length",   "depth",    "depth0",   "previtem",  "nextitem", "cycle"};
    Value loop = Value::make_dict();
    Dict& d = *loop.dict;
    for (const char* key : kKeys) d.items.emplace_back(Value::string(key), Value());
    std::weak_ptr<Dict> weak = loop.dict;  // weak: the dict holds this function
    d.items[11].second = Value::function("cycle", [weak](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      if (a.pos.empty()) r.fail(p, "no items for cycling given");
      std::shared_ptr<Dict> self = weak.lock();
      const int64_t idx = self ? self->items[1].second.i : 0;
      return a.pos[size_t(idx) % a.pos.size()];
    });
    d.items[6].second = Value::integer(int64_t(n));
    d.items[7].second = Value::integer(1);
    d.items[8].second = Value::integer(0);
    for (size_t k = 0; k < n; ++k) {
      step(s.pos);
      Frame f;
      scopes_.push_back(&f);
      struct Pop {
        std::vector<Frame*>& s;
        ~Pop() { s.pop_back(); }
      } pop{scopes_};
      d.items[0].second = Value::integer(int64_t(k) + 1);
      d.items[1].second = Value::integer(int64_t(k));
      d.items[2].second = Value::integer(int64_t(n - k));
      d.items[3].second = Value::integer(int64_t(n - k - 1));
      d.items[4].second = Value::boolean(k == 0);
      d.items[5].second = Value::boolean(k + 1 == n);
      d.items[9].second = k > 0 ? items[k - 1] : Value::undefined("there is no previous item");
      d.items[10].second = k + 1 < n ? items[k + 1] : Value::undefined("there is no next item");
      f.emplace_back("loop", loop);
      assign_into(f, s.targets, items[k], s.pos);
      Flow fl = exec_body(s.body, out);
      if (fl == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void assign_into(Frame& f, const std::vector<std::string>& targets, const Value& v, Pos p) {
    if (targets.size() == 1) {
      frame_set(f, targets[0], v);
      return;
    }
    List items = iterate(v, p);
    if (items.size() != targets.size())
      fail(p, items.size() > targets.size() ? "too many values to unpack" : "not enough values to unpack");
    for (size_t k = 0; k < targets.size(); ++k) frame_set(f, targets[k], items[k]);
  }

  Value call_macro(const Stmt& m, Frame& closure, CallArgs& a, const Pos& p) {
    if (++depth_ > opt_.max_depth) fail(p, "template exceeded max_depth (" + std::to_string(opt_.max_depth) + ")");
    char here = 0;
    const uintptr_t at = reinterpret_cast<uintptr_t>(&here);
    if (stack_base_ > at && stack_base_ - at > kStackBudget)
      fail(p, "template exceeded max_depth (its macro calls nest " + std::to_string(depth_) +
                  " deep and would use more than " + std::to_string(kStackBudget >> 10) + " KiB of stack)");
    if (a.pos.size() > m.params.size())
      fail(p, "macro '" + m.text + "' takes not more than " + std::to_string(m.params.size()) + " argument(s)");
    Frame f;
    std::vector<Frame*> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());  // the template's top level
    if (!closure.empty()) scopes_.push_back(&closure);
    scopes_.push_back(&f);
    struct Restore {
      Renderer& r;
      std::vector<Frame*>& saved;
      ~Restore() {
        r.scopes_.swap(saved);
        --r.depth_;
      }
    } restore{*this, saved};
    std::vector<bool> bound(m.params.size(), false);
    for (size_t k = 0; k < a.pos.size(); ++k) {
      f.emplace_back(m.params[k].first, std::move(a.pos[k]));
      bound[k] = true;
    }
    for (auto& kw : a.kw) {
      size_t k = 0;
      while (k < m.params.size() && m.params[k].first != kw.first) ++k;
      if (k == m.params.size()) fail(p, "macro '" + m.text + "' takes no keyword argument '" + kw.first + "'");
      if (bound[k]) fail(p, "macro '" + m.text + "' got multiple values for argument '" + kw.first + "'");
      f.emplace_back(kw.first, std::move(kw.second));
      bound[k] = true;
    }
    for (size_t k = 0; k < m.params.size(); ++k) {
      if (bound[k]) continue;
      Value v = m.params[k].second ? eval(*m.params[k].second)
                                   : Value::undefined("'" + m.params[k].first + "' is undefined");
      f.emplace_back(m.params[k].first, std::move(v));
    }
    std::string buf;
    exec_body(m.body, buf);
    return Value::string(std::move(buf));
  }

  // ---- expressions
  Value lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (Value* v = frame_find(**it, name)) return *v;
    if (Value* v = frame_find(*globals_, name)) return *v;
    return Value::undefined("'" + name + "' is undefined");
  }

  [[noreturn]] void undefined_error(const Value& v, Pos p) {
    fail(p, v.sp ? v.str() : std::string("value is undefined"));
  }

  Value eval(const Expr& e) {
    step(e.pos);
    switch (e.kind) {
      case Expr::Literal: return e.value;
      case Expr::Name: return lookup(e.name);
      case Expr::Attr: {
        Value obj = eval(*e.args[0]);
        return get_attr(obj, e.name, e.pos);
      }
      case Expr::Item: {
        Value obj = eval(*e.args[0]);
        Value idx = eval(*e.args[1]);
        return get_item(obj, idx, e.pos);
      }
      case Expr::Slice: return eval_slice(e);
      case Expr::Call: return eval_call(e);
      case Expr::Filter: {
        Value in = eval(*e.args[0]);
        return apply_filter(e, std::move(in));
      }
      case Expr::Test: {
        Value in = eval(*e.args[0]);
        CallArgs a = eval_args(e);
        const bool r = apply_test(e.name, in, a, e.pos);
        return Value::boolean(r != e.negated);
      }
      case Expr::Unary: {
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) undefined_error(v, e.pos);
        if (e.op == Op::Neg) {
          if (v.type == Type::Int || v.type == Type::Bool) {
            const int64_t x = v.type == Type::Bool ? int64_t(v.b) : v.i;
            if (x == INT64_MIN) fail(e.pos, "integer overflow", LLM_ERR_UNSUPPORTED);
            return Value::integer(-x);
          }
          if (v.type == Type::Float) return Value::number(-v.f);
          fail(e.pos, std::string("bad operand type for unary -: '") + type_name(v) + "'");
        }
        if (!v.is_number()) fail(e.pos, std::string("bad operand type for unary +: '") + type_name(v) + "'");
        return v.type == Type::Bool ? Value::integer(v.b) : v;
      }
      case Expr::Binary: {
        Value a = eval(*e.args[0]);
        Value b = eval(*e.args[1]);
        return binary(e.op, a, b, e.pos);
      }
      case Expr::And: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Or: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Not: return Value::boolean(!truthy(eval(*e.args[0])));
      case Expr::Cond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if's condition was false and it has no else");
      case Expr::ListLit:
      case Expr::TupleLit: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return make_list(std::move(items), e.pos, e.kind == Expr::TupleLit);
      }
      case Expr::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (key.is_undefined() || key.is_list() || key.is_mapping() || key.type == Type::Function)
            fail(e.args[k]->pos, std::string("unhashable dict key of type '") + type_name(key) + "'");
          d.dict->set(key, eval(*e.args[k + 1]));
        }
        return d;
      }
    }
    fail(e.pos, "bad expression", LLM_ERR_INVALID_ARGUMENT);
  }

  CallArgs eval_args(const Expr& e, size_t first = 1) {
    CallArgs a;
    for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.first, eval(*kw.second));
    return a;
  }

  Value eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Attr) {
      Value obj = eval(*callee.args[0]);
      if (obj.is_undefined()) undefined_error(obj, callee.pos);
      if (has_method(obj, callee.name)) {
        CallArgs a = eval_args(e);
        return call_method(obj, callee.name, a, e.pos);
      }
      Value fn = get_attr(obj, callee.name, callee.pos);
      CallArgs a = eval_args(e);
      return call_value(fn, a, e.pos);
    }
    Value fn = eval(callee);
    CallArgs a = eval_args(e);
    return call_value(fn, a, e.pos);
  }

  Value call_value(const Value& fn, CallArgs& a, Pos p) {
    if (fn.is_undefined()) undefined_error(fn, p);
    if (fn.type != Type::Function) fail(p, std::string("'") + type_name(fn) + "' object is not callable");
    return fn.fn->call(*this, a, p);
  }

  // ---- attributes, items, slices
  static bool has_method(const Value& obj, const std::string& name) {
    static const char* const str_methods[] = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
        "title", "capitalize", "replace", "format", "find", "rfind", "index", "rindex", "count", "join", "isdigit",
        "isalpha", "isalnum", "isspace", "islower", "isupper", "removeprefix", "removesuffix", "casefold"};
    static const char* const dict_methods[] = {"get", "items", "keys", "values", "pop", "update", "setdefault", "copy"};
    static const char* const list_methods[] = {"append", "extend", "pop", "insert", "index", "count", "copy"};
    auto in = [&](const auto& arr) {
      for (const char* m : arr)
        if (name == m) return true;
      return false;
    };
    switch (obj.type) {
      case Type::String: return in(str_methods);
      case Type::Dict: return in(dict_methods);
      case Type::List: return in(list_methods);
      default: return false;
    }
  }

  Value get_attr(const Value& obj, const std::string& name, Pos p) {
    if (obj.is_undefined()) undefined_error(obj, p);
    if (has_method(obj, name)) {
      Value self = obj;
      return Value::function(name, [self, name](Renderer& r, CallArgs& a, const Pos& pos) {
        return r.call_method(self, name, a, pos);
      });
    }
    if (obj.is_mapping()) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined(std::string("'") + (obj.is_dict() ? "dict object" : "Namespace") +
                              "' has no attribute '" + name + "'");
    }
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
  }

  Value get_item(const Value& obj, const Value& idx, Pos p) {
    if (obj.is_undefined()) undefined_error(obj, p);
    if (obj.is_mapping()) {
      if (const Value* v = obj.dict->find(idx)) return *v;
      if (idx.is_string() && obj.is_dict() && has_method(obj, idx.str())) return get_attr(obj, idx.str(), p);
      return Value::undefined("'" + std::string(obj.is_dict() ? "dict object" : "Namespace") + "' has no attribute " +
                              repr(idx));
    }
    if (obj.is_list() || obj.is_string()) {
      if (idx.type == Type::Int || idx.type == Type::Bool) {
        int64_t i = idx.type == Type::Bool ? int64_t(idx.b) : idx.i;
        if (obj.is_list()) {
          const int64_t n = int64_t(obj.list->size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined(std::string("list index out of range"));
          return (*obj.list)[size_t(i)];
        }
        const std::string& s = obj.str();
        std::vector<size_t> off = utf8_offsets(s);
        const int64_t n = int64_t(off.size()) - 1;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(std::string("string index out of range"));
        return Value::string(s.substr(off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]));
      }
      if (idx.is_string()) return get_attr(obj, idx.str(), p);
      return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute " + repr(idx));
    }
    return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute " + repr(idx));
  }

  Value eval_slice(const Expr& e) {
    Value obj = eval(*e.args[0]);
    if (obj.is_undefined()) undefined_error(obj, e.pos);
    int64_t parts[3];
    bool given[3];
    for (int k = 0; k < 3; ++k) {
      given[k] = false;
      parts[k] = 0;
      if (!e.args[size_t(k) + 1]) continue;
      Value v = eval(*e.args[size_t(k) + 1]);
      if (v.is_none()) continue;
      if (v.type != Type::Int && v.type != Type::Bool)
        fail(e.pos, "slice indices must be integers or None");
      parts[k] = v.type == Type::Bool ? int64_t(v.b) : v.i;
      given[k] = true;
    }
    int64_t stepv = given[2] ? parts[2] : 1;
    if (stepv == 0) fail(e.pos, "slice step cannot be zero");
    std::vector<size_t> off;
    int64_t n;
    if (obj.is_list()) n = int64_t(obj.list->size());
    else if (obj.is_string()) {
      off = utf8_offsets(obj.str());
      n = int64_t(off.size()) - 1;
    } else {
      fail(e.pos, std::string("'") + type_name(obj) + "' object is not subscriptable");
    }
    auto norm = [&](int64_t v, bool g, int64_t def) {
      if (!g) return def;
      if (v < 0) {
        v += n;
        if (v < 0) v = stepv < 0 ? -1 : 0;
      } else if (v >= n) {
        v = stepv < 0 ? n - 1 : n;
      }
      return v;
    };
    const int64_t start = norm(parts[0], given[0], stepv < 0 ? n - 1 : 0);
    const int64_t stop = norm(parts[1], given[1], stepv < 0 ? -1 : n);
    std::vector<int64_t> idx;
    for (int64_t i = start; stepv > 0 ? i < stop : i > stop;) {
      idx.push_back(i);
      if (__builtin_add_overflow(i, stepv, &i)) break;
    }
    step(e.pos, idx.size());
    if (obj.is_list()) {
      List out;
      for (int64_t i : idx) out.push_back((*obj.list)[size_t(i)]);
      return make_list(std::move(out), e.pos, obj.is_tuple);
    }
    std::string out;
    const std::string& s = obj.str();
    if (stepv == 1 && !idx.empty()) out = s.substr(off[size_t(idx.front())], off[size_t(idx.back()) + 1] - off[size_t(idx.front())]);
    else
      for (int64_t i : idx) out.append(s, off[size_t(i)], off[size_t(i) + 1] - off[size_t(i)]);
    return Value::string(std::move(out));
  }

  // ---- operators
  [[noreturn]] void operand_error(const char* op, const Value& a, const Value& b, Pos p) {
    if (a.is_undefined()) undefined_error(a, p);
    if (b.is_undefined()) undefined_error(b, p);
    fail(p, std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  static bool is_int(const Value& v) { return v.type == Type::Int || v.type == Type::Bool; }
  static int64_t int_of(const Value& v) { return v.type == Type::Bool ? int64_t(v.b) : v.i; }

  Value repeat(const Value& seq, int64_t n, Pos p) {
    if (n <= 0) return seq.is_string() ? Value::string("") : make_list({}, p);
    if (seq.is_string()) {
      const std::string& s = seq.str();
      if (!s.empty() && uint64_t(n) > opt_.max_output_bytes / s.size()) check_size(opt_.max_output_bytes + 1, p);
      std::string out;
      out.reserve(s.size() * size_t(n));
      for (int64_t k = 0; k < n; ++k) out += s;
      return make_str(std::move(out), p);
    }
    const size_t m = seq.list->size();
    if (m != 0 && uint64_t(n) > kMaxListItems / m) fail(p, "list too long");
    List out;
    for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
    return make_list(std::move(out), p);
  }

  Value binary(Op op, const Value& a, const Value& b, Pos p) {
    switch (op) {
      case Op::Eq: return Value::boolean(equals(a, b));
      case Op::Ne: return Value::boolean(!equals(a, b));
      case Op::Lt:
      case Op::Le:
      case Op::Gt:
      case Op::Ge: {
        if (a.is_undefined()) undefined_error(a, p);
        if (b.is_undefined()) undefined_error(b, p);
        int c;
        try {
          c = compare(a, b);
        } catch (const ValueError& ve) {
          fail(p, ve.message);
        }
        return Value::boolean(op == Op::Lt ? c < 0 : op == Op::Le ? c <= 0 : op == Op::Gt ? c > 0 : c >= 0);
      }
      case Op::In: return Value::boolean(contains(b, a, p));
      case Op::NotIn: return Value::boolean(!contains(b, a, p));
      case Op::Concat: return make_str(to_str(a) + to_str(b), p);
      default: break;
    }
    if (a.is_undefined()) undefined_error(a, p);
    if (b.is_undefined()) undefined_error(b, p);
    switch (op) {
      case Op::Add:
        if (is_int(a) && is_int(b)) {
          int64_t r;
          if (__builtin_add_overflow(int_of(a), int_of(b), &r)) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
          return Value::integer(r);
        }
        if (a.is_number() && b.is_number()) return Value::number(as_double(a) + as_double(b));
        if (a.is_string() && b.is_string()) {
          check_size(a.str().size() + b.str().size(), p);
          return make_str(a.str() + b.str(), p);
        }
        if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple) {
          if (a.list->size() + b.list->size() > kMaxListItems) fail(p, "list too long");
          List out = *a.list;
          out.insert(out.end(), b.list->begin(), b.list->end());
          return make_list(std::move(out), p, a.is_tuple);
        }
        operand_error("+", a, b, p);
      case Op::Sub:
        if (is_int(a) && is_int(b)) {
          int64_t r;
          if (__builtin_sub_overflow(int_of(a), int_of(b), &r)) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
          return Value::integer(r);
        }
        if (a.is_number() && b.is_number()) return Value::number(as_double(a) - as_double(b));
        operand_error("-", a, b, p);
      case Op::Mul:
        if (is_int(a) && is_int(b)) {
          int64_t r;
          if (__builtin_mul_overflow(int_of(a), int_of(b), &r)) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
          return Value::integer(r);
        }
        if (a.is_number() && b.is_number()) return Value::number(as_double(a) * as_double(b));
        if ((a.is_string() || a.is_list()) && is_int(b)) return repeat(a, int_of(b), p);
        if ((b.is_string() || b.is_list()) && is_int(a)) return repeat(b, int_of(a), p);
        operand_error("*", a, b, p);
      case Op::Div:
        if (a.is_number() && b.is_number()) {
          if (as_double(b) == 0.0) fail(p, "division by zero");
          return Value::number(as_double(a) / as_double(b));
        }
        operand_error("/", a, b, p);
      case Op::FloorDiv:
        if (is_int(a) && is_int(b)) {
          if (int_of(b) == 0) fail(p, "integer division or modulo by zero");
          if (int_of(a) == INT64_MIN && int_of(b) == -1) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
          return Value::integer(floor_div(int_of(a), int_of(b)));
        }
        if (a.is_number() && b.is_number()) {
          if (as_double(b) == 0.0) fail(p, "float floor division by zero");
          return Value::number(std::floor(as_double(a) / as_double(b)));
        }
        operand_error("//", a, b, p);
      case Op::Mod:
        if (is_int(a) && is_int(b)) {
          if (int_of(b) == 0) fail(p, "integer division or modulo by zero");
          if (int_of(b) == -1) return Value::integer(0);
          return Value::integer(py_mod(int_of(a), int_of(b)));
        }
        if (a.is_number() && b.is_number()) {
          const double x = as_double(a), y = as_double(b);
          if (y == 0.0) fail(p, "float modulo");
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::number(m);
        }
        if (a.is_string()) return make_str(printf_format(a.str(), b, p), p);
        operand_error("%", a, b, p);
      case Op::Pow:
        if (is_int(a) && is_int(b) && int_of(b) >= 0) {
          int64_t r = 1, base = int_of(a), e = int_of(b);
          while (e > 0) {
            if (e & 1)
              if (__builtin_mul_overflow(r, base, &r)) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
            e >>= 1;
            if (e > 0 && __builtin_mul_overflow(base, base, &base)) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
          }
          return Value::integer(r);
        }
        if (a.is_number() && b.is_number()) return Value::number(std::pow(as_double(a), as_double(b)));
        operand_error("**", a, b, p);
      default: break;
    }
    fail(p, "bad operator");
  }

  bool contains(const Value& container, const Value& item, Pos p) {
    switch (container.type) {
      case Type::Undefined: return false;
      case Type::String:
        if (!item.is_string())
          fail(p, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
        return container.str().find(item.str()) != std::string::npos;
      case Type::List:
        for (const auto& v : *container.list)
          if (equals(v, item)) return true;
        return false;
      case Type::Dict:
      case Type::Namespace: return container.dict->find(item) != nullptr;
      default: fail(p, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  // "%s and %d" % args (printf-style): flags "-+ 0#", width, precision and
  // the conversions s r a d i u x X o f F e E g G c %.
  std::string printf_format(const std::string& fmt, const Value& args, Pos p) {
    List items = args.is_list() && args.is_tuple ? *args.list : List{args};
    std::string out;
    size_t next = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] != '%') {
        out += fmt[k];
        continue;
      }
      ++k;
      std::string flags;
      while (k < fmt.size() && std::strchr("-+ 0#", fmt[k])) flags += fmt[k++];
      int width = -1, prec = -1;
      auto number = [&](int& v) {
        if (k < fmt.size() && fmt[k] == '*') fail(p, "unsupported: '*' in a format", LLM_ERR_UNSUPPORTED);
        while (k < fmt.size() && fmt[k] >= '0' && fmt[k] <= '9') {
          v = (v < 0 ? 0 : v) * 10 + (fmt[k++] - '0');
          if (v > 4096) fail(p, "format width too large", LLM_ERR_UNSUPPORTED);
        }
      };
      number(width);
      if (k < fmt.size() && fmt[k] == '.') {
        ++k;
        prec = 0;
        number(prec);
      }
      if (k >= fmt.size()) fail(p, "incomplete format");
      const char c = fmt[k];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (next >= items.size()) fail(p, "not enough arguments for format string");
      const Value& v = items[next++];
      std::string piece;
      if (c == 's' || c == 'r' || c == 'a') {
        piece = c == 's' ? to_str(v) : repr(v);
        if (prec >= 0) {
          std::vector<size_t> off = utf8_offsets(piece);
          if (size_t(prec) + 1 < off.size()) piece.resize(off[size_t(prec)]);
        }
        const size_t len = utf8_length(piece);
        if (width > 0 && len < size_t(width)) {
          const std::string pad(size_t(width) - len, ' ');
          piece = flags.find('-') != std::string::npos ? piece + pad : pad + piece;
        }
      } else if (std::strchr("diuxXoeEfFgGc", c)) {
        if (!v.is_number()) fail(p, std::string("%") + c + " format: a real number is required, not " + type_name(v));
        std::string spec = "%" + flags;
        if (width >= 0) spec += std::to_string(width);
        if (prec >= 0) spec += "." + std::to_string(prec);
        char buf[4400];
        if (std::strchr("diuxXoc", c)) {
          double d = as_double(v);
          if (!is_int(v) && !(std::fabs(d) < 9.2e18)) fail(p, "cannot convert float to integer");
          const long long x = is_int(v) ? (long long)int_of(v) : (long long)d;
          if (c == 'c') {
            if (x < 0 || x > 0x10FFFF) fail(p, "%c arg not in range");
            piece = utf8_encode(uint32_t(x));
          } else {
            const bool neg = x < 0 && (c == 'x' || c == 'X' || c == 'o');
            spec += std::string("ll") + (c == 'u' || c == 'i' ? 'd' : c);
            std::snprintf(buf, sizeof buf, spec.c_str(), neg ? -x : x);
            piece = neg ? "-" + std::string(buf) : std::string(buf);
          }
        } else {
          spec += c;
          std::snprintf(buf, sizeof buf, spec.c_str(), as_double(v));
          piece = buf;
        }
      } else {
        fail(p, std::string("unsupported format character '") + c + "'", LLM_ERR_UNSUPPORTED);
      }
      out += piece;
      check_size(out.size(), p);
    }
    if (next < items.size()) fail(p, "not all arguments converted during string formatting");
    return out;
  }

  // ---- methods
  static const Value* arg(CallArgs& a, size_t k, const char* name) {
    if (k < a.pos.size()) return &a.pos[k];
    for (auto& kw : a.kw)
      if (kw.first == name) return &kw.second;
    return nullptr;
  }
  std::string str_arg(CallArgs& a, size_t k, const char* name, Pos p, const char* fn, const char* def = nullptr) {
    const Value* v = arg(a, k, name);
    if (!v) {
      if (def) return def;
      fail(p, std::string(fn) + "() missing argument '" + name + "'");
    }
    if (!v->is_string()) fail(p, std::string(fn) + "() argument '" + name + "' must be str, not " + type_name(*v));
    return v->str();
  }
  int64_t int_arg(CallArgs& a, size_t k, const char* name, Pos p, const char* fn, int64_t def) {
    const Value* v = arg(a, k, name);
    if (!v || v->is_none()) return def;
    if (!is_int(*v)) fail(p, std::string(fn) + "() argument '" + name + "' must be an integer");
    return int_of(*v);
  }

  Value split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right, Pos p) {
    List out;
    if (!sep || sep->is_none()) {
      std::vector<uint32_t> cps = decode(s);
      std::vector<std::pair<size_t, size_t>> words;
      size_t k = 0;
      while (k < cps.size()) {
        while (k < cps.size() && py_space(cps[k])) ++k;
        if (k >= cps.size()) break;
        size_t b = k;
        while (k < cps.size() && !py_space(cps[k])) ++k;
        words.emplace_back(b, k);
      }
      if (maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
        if (!from_right) {
          // The last piece keeps the rest of the string, leading spaces stripped.
          std::vector<std::pair<size_t, size_t>> w(words.begin(), words.begin() + maxsplit);
          w.emplace_back(words[size_t(maxsplit)].first, cps.size());  // the rest keeps its trailing spaces
          words = w;
        } else {
          std::vector<std::pair<size_t, size_t>> w;
          const size_t first_kept = words.size() - size_t(maxsplit);
          w.emplace_back(0, words[first_kept - 1].second);  // the rest keeps its leading spaces
          w.insert(w.end(), words.begin() + long(first_kept), words.end());
          words = w;
        }
      }
      for (auto& w : words) out.push_back(Value::string(encode(cps, w.first, w.second)));
      return make_list(std::move(out), p);
    }
    if (!sep->is_string()) fail(p, "split(): separator must be str or None");
    const std::string& d = sep->str();
    if (d.empty()) fail(p, "empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
      size_t b = 0;
      int64_t n = 0;
      for (;;) {
        size_t f = (maxsplit < 0 || n < maxsplit) ? s.find(d, b) : std::string::npos;
        if (f == std::string::npos) {
          parts.push_back(s.substr(b));
          break;
        }
        parts.push_back(s.substr(b, f - b));
        b = f + d.size();
        ++n;
      }
    } else {
      size_t e = s.size();
      int64_t n = 0;
      for (;;) {
        size_t f = (maxsplit < 0 || n < maxsplit) && e >= d.size() ? s.rfind(d, e - d.size()) : std::string::npos;
        if (f == std::string::npos) {
          parts.insert(parts.begin(), s.substr(0, e));
          break;
        }
        parts.insert(parts.begin(), s.substr(f + d.size(), e - f - d.size()));
        e = f;
        ++n;
      }
    }
    if (parts.size() > kMaxListItems) fail(p, "list too long");
    for (auto& x : parts) out.push_back(Value::string(std::move(x)));
    return make_list(std::move(out), p);
  }

  // Python find/count/index on code points: byte offsets map back to code points.
  static int64_t cp_index(const std::string& s, size_t byte) { return int64_t(utf8_length(std::string_view(s).substr(0, byte))); }

  bool prefix_test(const std::string& s, const Value& v, bool ends, Pos p) {
    auto one = [&](const Value& x) {
      if (!x.is_string()) fail(p, "startswith/endswith first arg must be str or a tuple of str");
      const std::string& t = x.str();
      if (t.size() > s.size()) return false;
      return ends ? s.compare(s.size() - t.size(), t.size(), t) == 0 : s.compare(0, t.size(), t) == 0;
    };
    if (v.is_list()) {
      for (const auto& x : *v.list)
        if (one(x)) return true;
      return false;
    }
    return one(v);
  }

  Value call_method(const Value& obj, const std::string& name, CallArgs& a, Pos p) {
    step(p);
    if (obj.is_string()) return string_method(obj.str(), name, a, p);
    if (obj.is_dict()) {
      Dict& d = *obj.dict;
      if (name == "get") {
        const Value* key = arg(a, 0, "key");
        if (!key) fail(p, "get() missing argument 'key'");
        const Value* v = d.find(*key);
        if (v) return *v;
        const Value* def = arg(a, 1, "default");
        return def ? *def : Value::none();
      }
      if (name == "items") {
        List out;
        for (const auto& kv : d.items) out.push_back(Value::make_list({kv.first, kv.second}, true));
        return make_list(std::move(out), p);
      }
      if (name == "keys") {
        List out;
        for (const auto& kv : d.items) out.push_back(kv.first);
        return make_list(std::move(out), p);
      }
      if (name == "values") {
        List out;
        for (const auto& kv : d.items) out.push_back(kv.second);
        return make_list(std::move(out), p);
      }
      if (name == "copy") {
        Value c = Value::make_dict();
        c.dict->items = d.items;
        return c;
      }
      if (name == "pop" || name == "setdefault") {
        const Value* keyp = arg(a, 0, "key");
        if (!keyp) fail(p, name + "() missing argument 'key'");
        const Value key = *keyp;
        for (size_t k = 0; k < d.items.size(); ++k) {
          if (!equals(d.items[k].first, key)) continue;
          Value v = d.items[k].second;
          if (name == "pop") d.items.erase(d.items.begin() + long(k));
          return v;
        }
        const Value* def = arg(a, 1, "default");
        if (name == "setdefault") {
          d.set(key, def ? *def : Value::none());
          return def ? *def : Value::none();
        }
        if (!def) fail(p, "KeyError: " + repr(key));
        return *def;
      }
      if (name == "update") {
        if (!a.pos.empty()) {
          if (!a.pos[0].is_mapping()) fail(p, "update() argument must be a dict");
          for (const auto& kv : a.pos[0].dict->items) d.set(kv.first, kv.second);
        }
        for (auto& kw : a.kw) d.set(kw.first, kw.second);
        return Value::none();
      }
    }
    if (obj.is_list()) {
      List& l = *obj.list;
      if (name == "append") {
        if (a.pos.size() != 1) fail(p, "append() takes exactly one argument");
        if (l.size() >= kMaxListItems) fail(p, "list too long");
        step(p, 4);
        l.push_back(a.pos[0]);
        return Value::none();
      }
      if (name == "extend") {
        if (a.pos.size() != 1) fail(p, "extend() takes exactly one argument");
        List more = iterate(a.pos[0], p);
        if (l.size() + more.size() > kMaxListItems) fail(p, "list too long");
        step(p, more.size() * 4);
        l.insert(l.end(), more.begin(), more.end());
        return Value::none();
      }
      if (name == "insert") {
        if (a.pos.size() != 2 || !is_int(a.pos[0])) fail(p, "insert() takes an index and a value");
        if (l.size() >= kMaxListItems) fail(p, "list too long");
        int64_t i = int_of(a.pos[0]);
        const int64_t n = int64_t(l.size());
        if (i < 0) i = std::max<int64_t>(0, i + n);
        if (i > n) i = n;
        l.insert(l.begin() + long(i), a.pos[1]);
        return Value::none();
      }
      if (name == "pop") {
        if (l.empty()) fail(p, "pop from empty list");
        int64_t i = int_arg(a, 0, "index", p, "pop", -1);
        const int64_t n = int64_t(l.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) fail(p, "pop index out of range");
        Value v = l[size_t(i)];
        l.erase(l.begin() + long(i));
        return v;
      }
      if (name == "index" || name == "count") {
        if (a.pos.size() != 1) fail(p, name + "() takes exactly one argument");
        int64_t c = 0;
        for (size_t k = 0; k < l.size(); ++k) {
          if (!equals(l[k], a.pos[0])) continue;
          if (name == "index") return Value::integer(int64_t(k));
          ++c;
        }
        if (name == "index") fail(p, "value is not in list");
        return Value::integer(c);
      }
      if (name == "copy") return make_list(l, p);
    }
    fail(p, std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
  }

  Value string_method(const std::string& s, const std::string& name, CallArgs& a, Pos p) {
    const char* fn = name.c_str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value* chars = arg(a, 0, "chars");
      if (chars && !chars->is_string() && !chars->is_none()) fail(p, name + " arg must be None or str");
      return Value::string(strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit")
      return split(s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", p, fn, -1), name == "rsplit", p);
    if (name == "splitlines") {
      List out;
      size_t b = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
          out.push_back(Value::string(s.substr(b, k - b)));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          b = k + 1;
        }
      }
      if (b < s.size()) out.push_back(Value::string(s.substr(b)));
      return make_list(std::move(out), p);
    }
    if (name == "startswith" || name == "endswith") {
      const Value* v = arg(a, 0, "prefix");
      if (!v) fail(p, name + "() takes at least 1 argument");
      return Value::boolean(prefix_test(s, *v, name == "endswith", p));
    }
    if (name == "upper") return Value::string(map_case(s, true));
    if (name == "lower" || name == "casefold") return Value::string(map_case(s, false));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(capitalize(s));
    if (name == "replace") {
      const std::string from = str_arg(a, 0, "old", p, fn), to = str_arg(a, 1, "new", p, fn);
      std::string r = replace_all(s, from, to, int_arg(a, 2, "count", p, fn, -1), opt_.max_output_bytes);
      return make_str(std::move(r), p);
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
      const std::string t = str_arg(a, 0, "sub", p, fn);
      const size_t f = name[0] == 'r' ? s.rfind(t) : s.find(t);
      if (f == std::string::npos) {
        if (name == "index" || name == "rindex") fail(p, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, f));
    }
    if (name == "count") {
      const std::string t = str_arg(a, 0, "sub", p, fn);
      if (t.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      int64_t c = 0;
      for (size_t f = s.find(t); f != std::string::npos; f = s.find(t, f + t.size())) ++c;
      return Value::integer(c);
    }
    if (name == "join") {
      if (a.pos.size() != 1) fail(p, "join() takes exactly one argument");
      List items = iterate(a.pos[0], p);
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (!items[k].is_string()) fail(p, std::string("sequence item ") + std::to_string(k) + ": expected str instance, " + type_name(items[k]) + " found");
        if (k) out += s;
        out += items[k].str();
        check_size(out.size(), p);
      }
      return make_str(std::move(out), p);
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const std::string t = str_arg(a, 0, "prefix", p, fn);
      if (name == "removeprefix" && s.compare(0, t.size(), t) == 0) return Value::string(s.substr(t.size()));
      if (name == "removesuffix" && t.size() <= s.size() && s.compare(s.size() - t.size(), t.size(), t) == 0 && !t.empty())
        return Value::string(s.substr(0, s.size() - t.size()));
      return Value::string(s);
    }
    if (name == "format") return make_str(str_format(s, a, p), p);
    if (name.rfind("is", 0) == 0) {
      std::vector<uint32_t> cps = decode(s);
      if (cps.empty()) return Value::boolean(false);
      bool r = true, any_cased = false;
      for (uint32_t c : cps) {
        const bool lower = to_upper(c) != c, upper = to_lower(c) != c;
        any_cased = any_cased || lower || upper;
        if (name == "isdigit") r = r && c >= '0' && c <= '9';
        else if (name == "isalpha") r = r && is_alpha(c);
        else if (name == "isalnum") r = r && (is_alpha(c) || (c >= '0' && c <= '9'));
        else if (name == "isspace") r = r && py_space(c);
        else if (name == "islower") r = r && !upper;
        else if (name == "isupper") r = r && !lower;
      }
      if (name == "islower" || name == "isupper") r = r && any_cased;
      return Value::boolean(r);
    }
    fail(p, "'str' object has no method '" + name + "'");
  }

  // str.format: {} {0} {name} {name.attr} {name[key]}, {{ }}; !r !s; no format spec.
  std::string str_format(const std::string& fmt, CallArgs& a, Pos p) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
      const char c = fmt[k];
      if (c == '}') {
        if (k + 1 < fmt.size() && fmt[k + 1] == '}') ++k;
        else fail(p, "Single '}' encountered in format string");
        out += '}';
        continue;
      }
      if (c != '{') {
        out += c;
        continue;
      }
      if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
        out += '{';
        ++k;
        continue;
      }
      const size_t e = fmt.find('}', k);
      if (e == std::string::npos) fail(p, "Single '{' encountered in format string");
      std::string field = fmt.substr(k + 1, e - k - 1);
      k = e;
      char conv = 0;
      const size_t colon = field.find(':');
      if (colon != std::string::npos) {
        if (colon + 1 != field.size()) fail(p, "unsupported: format specifications in str.format", LLM_ERR_UNSUPPORTED);
        field.resize(colon);
      }
      const size_t bang = field.find('!');
      if (bang != std::string::npos) {
        conv = bang + 1 < field.size() ? field[bang + 1] : 0;
        field.resize(bang);
      }
      size_t stop = field.find_first_of(".[");
      std::string head = field.substr(0, stop);
      Value v;
      if (head.empty()) {
        if (auto_idx >= a.pos.size()) fail(p, "Replacement index " + std::to_string(auto_idx) + " out of range");
        v = a.pos[auto_idx++];
      } else if (head.find_first_not_of("0123456789") == std::string::npos) {
        const size_t i = size_t(std::strtoul(head.c_str(), nullptr, 10));
        if (i >= a.pos.size()) fail(p, "Replacement index " + head + " out of range");
        v = a.pos[i];
      } else {
        const Value* kv = nullptr;
        for (auto& kw : a.kw)
          if (kw.first == head) kv = &kw.second;
        if (!kv) fail(p, "KeyError: '" + head + "'");
        v = *kv;
      }
      while (stop != std::string::npos && stop < field.size()) {
        if (field[stop] == '.') {
          size_t n = field.find_first_of(".[", stop + 1);
          v = get_attr(v, field.substr(stop + 1, n == std::string::npos ? std::string::npos : n - stop - 1), p);
          stop = n;
        } else {
          size_t n = field.find(']', stop);
          if (n == std::string::npos) fail(p, "Missing ']' in format string");
          std::string key = field.substr(stop + 1, n - stop - 1);
          Value kv = key.find_first_not_of("0123456789") == std::string::npos && !key.empty()
                         ? Value::integer(std::strtoll(key.c_str(), nullptr, 10))
                         : Value::string(key);
          v = get_item(v, kv, p);
          stop = n + 1 < field.size() ? n + 1 : std::string::npos;
        }
      }
      if (v.is_undefined()) undefined_error(v, p);
      out += conv == 'r' ? repr(v) : to_str(v);
      check_size(out.size(), p);
    }
    return out;
  }

  // ---- global functions
  void add_global_functions(Frame& g) {
    g.emplace_back("raise_exception", Value::function("raise_exception", [](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      std::string msg = a.pos.empty() ? std::string() : to_str(a.pos[0]);
      r.fail(p, "raise_exception: " + msg);
    }));
    g.emplace_back("strftime_now", Value::function("strftime_now", [](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      if (a.pos.size() != 1 || !a.pos[0].is_string()) r.fail(p, "strftime_now() takes one format string");
      std::time_t t = r.opt_.now_unix >= 0 ? std::time_t(r.opt_.now_unix) : std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      const std::string& f = a.pos[0].str();
      if (f.size() > 256) r.fail(p, "strftime_now(): format too long");
      char buf[4096];
      const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }));
    g.emplace_back("range", Value::function("range", [](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      int64_t start = 0, stop = 0, stp = 1;
      for (const auto& v : a.pos)
        if (!is_int(v)) r.fail(p, "range() arguments must be integers");
      if (a.pos.size() == 1) stop = int_of(a.pos[0]);
      else if (a.pos.size() == 2 || a.pos.size() == 3) {
        start = int_of(a.pos[0]);
        stop = int_of(a.pos[1]);
        if (a.pos.size() == 3) stp = int_of(a.pos[2]);
      } else {
        r.fail(p, "range() takes 1 to 3 arguments");
      }
      if (stp == 0) r.fail(p, "range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp) {
        if (out.size() >= kMaxListItems) r.fail(p, "range too long");
        out.push_back(Value::integer(i));
        if ((stp > 0 && i > INT64_MAX - stp) || (stp < 0 && i < INT64_MIN - stp)) break;
      }
      return r.make_list(std::move(out), p);
    }));
    g.emplace_back("namespace", Value::function("namespace", [](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      Value ns = Value::make_namespace();
      for (const auto& v : a.pos) {
        if (!v.is_mapping()) r.fail(p, "namespace() positional argument must be a dict");
        for (const auto& kv : v.dict->items) ns.dict->set(kv.first, kv.second);
      }
      for (auto& kw : a.kw) ns.dict->set(kw.first, kw.second);
      return ns;
    }));
    g.emplace_back("dict", Value::function("dict", [](Renderer& r, CallArgs& a, const Pos& p) -> Value {
      Value d = Value::make_dict();
      for (const auto& v : a.pos) {
        if (!v.is_mapping()) r.fail(p, "unsupported: dict() of a non-mapping", LLM_ERR_UNSUPPORTED);
        for (const auto& kv : v.dict->items) d.dict->set(kv.first, kv.second);
      }
      for (auto& kw : a.kw) d.dict->set(kw.first, kw.second);
      return d;
    }));
  }

  template <class KeyFn>
  void sort_values(List& items, KeyFn key, bool reverse, Pos p) {
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& v : items) keyed.emplace_back(key(v), std::move(v));
    step(p, keyed.size() * 4);
    try {
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
      });
    } catch (const ValueError& ve) {
      fail(p, ve.message);
    }
    items.clear();
    for (auto& kv : keyed) items.push_back(std::move(kv.second));
  }

  // ---- filters
  Value apply_filter(const Expr& e, Value in);
  Value apply_named_filter(const std::string& name, Value in, CallArgs& a, Pos p);
  bool apply_test(const std::string& name, const Value& v, CallArgs& a, Pos p);
  Value eval_filter_chain(const Expr& f, Value in) {
    if (f.args[0]) in = eval_filter_chain(*f.args[0], std::move(in));
    return apply_filter(f, std::move(in));
  }

  const RenderOptions& opt_;
  Arena arena_;
  Arena* saved_arena_;
  uint64_t steps_ = 0;
  int depth_ = 0;
  uintptr_t stack_base_ = 0;
  Frame* globals_ = nullptr;
  std::vector<Frame*> scopes_;
};

// ---- filters and tests ----------------------------------------------------------
namespace {

const char* const kFilters[] = {
    "trim", "tojson", "length", "count", "upper", "lower", "title", "capitalize", "replace", "join", "first",
    "last", "default", "d", "string", "int", "float", "list", "map", "select", "reject", "selectattr",
    "rejectattr", "items", "safe", "e", "escape", "indent", "round", "abs", "dictsort", "unique", "sum",
    "sort", "min", "max", "format", "reverse", "attr", "wordcount"};
const char* const kTests[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
    "boolean", "true", "false", "callable", "equalto", "eq", "==", "sameas", "ne", "!=", "lt", "<", "le", "<=",
    "gt", ">", "ge", ">=", "greaterthan", "lessthan", "in", "odd", "even", "divisibleby", "lower", "upper"};

}  // namespace

bool is_known_filter(const std::string& name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}
bool is_known_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

Value Renderer::apply_filter(const Expr& e, Value in) {
  CallArgs a = eval_args(e);
  return apply_named_filter(e.name, std::move(in), a, e.pos);
}

// Sort key of a value for sort/dictsort/unique/min/max: strings lower-cased
// unless case_sensitive.
static Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(map_case(v.str(), false));
  return v;
}

Value Renderer::apply_named_filter(const std::string& name, Value in, CallArgs& a, Pos p) {
  step(p);
  const char* fn = name.c_str();
  auto flag = [&](size_t k, const char* kw, bool def) {
    const Value* v = arg(a, k, kw);
    return v ? truthy(*v) : def;
  };
  auto attr_of = [&](const Value& item, const Value& attr) -> Value {
    // jinja2's make_attrgetter: dotted path, integer parts index.
    if (!attr.is_string()) return get_item(item, attr, p);
    Value cur = item;
    const std::string& path = attr.str();
    size_t b = 0;
    for (;;) {
      size_t e = path.find('.', b);
      std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
      Value key = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos
                      ? Value::integer(std::strtoll(part.c_str(), nullptr, 10))
                      : Value::string(part);
      if (cur.is_undefined()) undefined_error(cur, p);
      cur = get_item(cur, key, p);
      if (e == std::string::npos) return cur;
      b = e + 1;
    }
  };

  if (name == "safe") return in;
  if (name == "trim") {
    const Value* chars = arg(a, 0, "chars");
    return Value::string(strip(in.is_string() ? in.str() : to_str(in), chars, true, true));
  }
  if (name == "string") return in.is_string() ? in : make_str(to_str(in), p);
  if (name == "upper" || name == "lower") return Value::string(map_case(to_str(in), name == "upper"));
  if (name == "title") return Value::string(jinja_title(to_str(in)));
  if (name == "capitalize") return Value::string(capitalize(to_str(in)));
  if (name == "e" || name == "escape") return make_str(html_escape(to_str(in)), p);
  if (name == "default" || name == "d") {
    const Value* def = arg(a, 0, "default_value");
    const bool boolean = flag(1, "boolean", false);
    if (in.is_undefined() || (boolean && !truthy(in))) return def ? *def : Value::string("");
    return in;
  }
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    JsonStyle st;
    const Value* ind = arg(a, 1, "indent");
    if (ind && !ind->is_none()) {
      if (!is_int(*ind)) fail(p, "unsupported: tojson indent other than an integer", LLM_ERR_UNSUPPORTED);
      st.indent = int(std::clamp<int64_t>(int_of(*ind), 0, 64));
    }
    st.ensure_ascii = flag(0, "ensure_ascii", false);
    st.sort_keys = flag(3, "sort_keys", false);
    if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
      if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() || !(*sep->list)[1].is_string())
        fail(p, "tojson separators must be a pair of strings");
      st.item_sep = (*sep->list)[0].str();
      st.key_sep = (*sep->list)[1].str();
      if (st.item_sep.empty() || st.key_sep.empty())
        fail(p, "unsupported: empty tojson separators", LLM_ERR_UNSUPPORTED);
    }
    std::string out;
    try {
      to_json(in, st, out);
    } catch (const ValueError& ve) {
      if (in.is_undefined()) undefined_error(in, p);
      fail(p, ve.message);
    }
    return make_str(std::move(out), p);
  }
  if (name == "length" || name == "count") {
    switch (in.type) {
      case Type::Undefined: return Value::integer(0);
      case Type::String: return Value::integer(int64_t(utf8_length(in.str())));
      case Type::List: return Value::integer(int64_t(in.list->size()));
      case Type::Dict: return Value::integer(int64_t(in.dict->items.size()));
      default: fail(p, std::string("object of type '") + type_name(in) + "' has no len()");
    }
  }
  if (name == "replace") {
    const std::string s = to_str(in);
    const Value* o = arg(a, 0, "old");
    const Value* n = arg(a, 1, "new");
    if (!o || !n) fail(p, "replace() takes old and new");
    return make_str(replace_all(s, to_str(*o), to_str(*n), int_arg(a, 2, "count", p, fn, -1), opt_.max_output_bytes), p);
  }
  if (name == "join") {
    const Value* sepv = arg(a, 0, "d");
    const std::string sep = sepv ? to_str(*sepv) : std::string();
    const Value* attr = arg(a, 1, "attribute");
    List items = iterate(in, p);
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += sep;
      Value v = attr ? attr_of(items[k], *attr) : items[k];
      out += v.is_string() ? v.str() : to_str(v);
      check_size(out.size(), p);
    }
    return make_str(std::move(out), p);
  }
  if (name == "first" || name == "last") {
    if (in.is_undefined()) undefined_error(in, p);
    List items = iterate(in, p);
    if (items.empty()) return Value::undefined(std::string("No ") + fn + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (in.is_string()) {
      std::vector<uint32_t> cps = decode(in.str());
      std::reverse(cps.begin(), cps.end());
      return Value::string(encode(cps));
    }
    List items = iterate(in, p);
    std::reverse(items.begin(), items.end());
    return make_list(std::move(items), p);
  }
  if (name == "int") {
    const Value* defv = arg(a, 0, "default");
    Value def = defv ? *defv : Value::integer(0);
    if (in.type == Type::Int) return in;
    if (in.type == Type::Bool) return Value::integer(in.b);
    if (in.type == Type::Float) {
      if (!std::isfinite(in.f) || std::fabs(in.f) >= 9.2e18) return def;
      return Value::integer(int64_t(in.f));
    }
    if (in.is_string()) {
      std::string s = strip(in.str(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == 0 && errno == 0) return Value::integer(v);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(d));
    }
    return def;
  }
  if (name == "float") {
    const Value* defv = arg(a, 0, "default");
    Value def = defv ? *defv : Value::number(0.0);
    if (in.is_number()) return Value::number(as_double(in));
    if (in.is_string()) {
      std::string s = strip(in.str(), nullptr, true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value::number(d);
    }
    return def;
  }
  if (name == "list") return make_list(iterate(in, p), p);
  if (name == "items") {
    if (in.is_undefined()) return make_list({}, p);
    if (!in.is_mapping()) fail(p, "items() filter needs a mapping");
    List out;
    for (const auto& kv : in.dict->items) out.push_back(Value::make_list({kv.first, kv.second}, true));
    return make_list(std::move(out), p);
  }
  if (name == "map") {
    List items = truthy(in) ? iterate(in, p) : List{};
    List out;
    const Value* attr = arg(a, SIZE_MAX, "attribute");
    if (attr) {
      const Value* def = arg(a, SIZE_MAX, "default");
      for (const auto& it : items) {
        Value v = attr_of(it, *attr);
        out.push_back(v.is_undefined() && def ? *def : v);
      }
      return make_list(std::move(out), p);
    }
    if (a.pos.empty() || !a.pos[0].is_string()) fail(p, "map() needs a filter name or attribute=");
    const std::string fname = a.pos[0].str();
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const auto& it : items) {
      CallArgs copy = rest;
      out.push_back(apply_named_filter(fname, it, copy, p));
    }
    return make_list(std::move(out), p);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    size_t k = 0;
    Value attr;
    if (by_attr) {
      if (a.pos.empty()) fail(p, std::string(fn) + "() needs an attribute");
      attr = a.pos[k++];
    }
    std::string test;
    if (k < a.pos.size()) {
      if (!a.pos[k].is_string()) fail(p, "test name must be a string");
      test = a.pos[k++].str();
    }
    CallArgs targs;
    targs.pos.assign(a.pos.begin() + long(std::min(k, a.pos.size())), a.pos.end());
    List out;
    for (const auto& it : truthy(in) ? iterate(in, p) : List{}) {
      step(p);
      Value v = by_attr ? attr_of(it, attr) : it;
      bool r;
      if (test.empty()) {
        r = truthy(v);
      } else {
        CallArgs copy = targs;
        r = apply_test(test, v, copy, p);
      }
      if (r == keep_if) out.push_back(it);
    }
    return make_list(std::move(out), p);
  }
  if (name == "indent") {
    const Value* wv = arg(a, 0, "width");
    std::string ind = wv && wv->is_string() ? wv->str() : std::string(size_t(std::clamp<int64_t>(wv ? int_of(*wv) : 4, 0, 4096)), ' ');
    const bool first = flag(1, "first", false), blank = flag(2, "blank", false);
    std::string s = to_str(in) + "\n";
    std::vector<std::string> lines;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\n' || s[k] == '\r') {
        lines.push_back(s.substr(b, k - b));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
    }
    if (b < s.size()) lines.push_back(s.substr(b));
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) {
        out += '\n';
        if (blank || !lines[k].empty()) out += ind;
      }
      out += lines[k];
      check_size(out.size(), p);
    }
    if (first) out = ind + out;
    return make_str(std::move(out), p);
  }
  if (name == "round") {
    if (!in.is_number()) fail(p, "round() needs a number");
    const int64_t prec = std::clamp<int64_t>(int_arg(a, 0, "precision", p, fn, 0), -300, 300);
    const Value* mv = arg(a, 1, "method");
    const std::string method = mv ? to_str(*mv) : "common";
    if (method == "common" && is_int(in)) return Value::integer(int_of(in));  // Python's round(int, n) is an int
    const double scale = std::pow(10.0, double(prec));
    double x = as_double(in) * scale;
    if (method == "common") x = std::nearbyint(x);
    else if (method == "floor") x = std::floor(x);
    else if (method == "ceil") x = std::ceil(x);
    else fail(p, "method must be common, ceil or floor");
    return Value::number(x / scale);
  }
  if (name == "abs") {
    if (is_int(in)) {
      if (int_of(in) == INT64_MIN) fail(p, "integer overflow", LLM_ERR_UNSUPPORTED);
      return Value::integer(int_of(in) < 0 ? -int_of(in) : int_of(in));
    }
    if (in.type == Type::Float) return Value::number(std::fabs(in.f));
    fail(p, std::string("bad operand type for abs(): '") + type_name(in) + "'");
  }
  if (name == "dictsort") {
    if (!in.is_mapping()) fail(p, "dictsort() needs a mapping");
    const bool cs = flag(0, "case_sensitive", false);
    const Value* byv = arg(a, 1, "by");
    const bool by_value = byv && to_str(*byv) == "value";
    const bool rev = flag(2, "reverse", false);
    List out;
    for (const auto& kv : in.dict->items) out.push_back(Value::make_list({kv.first, kv.second}, true));
    sort_values(out, [&](const Value& v) { return sort_key((*v.list)[by_value ? 1 : 0], cs); }, rev, p);
    return make_list(std::move(out), p);
  }
  if (name == "sort") {
    const bool rev = flag(0, "reverse", false), cs = flag(1, "case_sensitive", false);
    const Value* attr = arg(a, 2, "attribute");
    List items = iterate(in, p);
    sort_values(items, [&](const Value& v) { return sort_key(attr ? attr_of(v, *attr) : v, cs); }, rev, p);
    return make_list(std::move(items), p);
  }
  if (name == "unique") {
    const bool cs = flag(0, "case_sensitive", false);
    const Value* attr = arg(a, 1, "attribute");
    List out, seen;
    for (const auto& it : iterate(in, p)) {
      step(p);
      Value key = sort_key(attr ? attr_of(it, *attr) : it, cs);
      bool dup = false;
      for (const auto& s : seen) dup = dup || equals(s, key);
      if (dup) continue;
      seen.push_back(key);
      out.push_back(it);
    }
    return make_list(std::move(out), p);
  }
  if (name == "min" || name == "max") {
    const bool cs = flag(0, "case_sensitive", false);
    const Value* attr = arg(a, 1, "attribute");
    List items = iterate(in, p);
    if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
      int c;
      try {
        c = compare(sort_key(attr ? attr_of(items[k], *attr) : items[k], cs),
                    sort_key(attr ? attr_of(items[best], *attr) : items[best], cs));
      } catch (const ValueError& ve) {
        fail(p, ve.message);
      }
      if (name == "min" ? c < 0 : c > 0) best = k;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value* attr = arg(a, 0, "attribute");
    const Value* start = arg(a, 1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const auto& it : iterate(in, p)) total = binary(Op::Add, total, attr ? attr_of(it, *attr) : it, p);
    return total;
  }
  if (name == "format") {
    Value args = Value::make_list(a.pos, true);
    return make_str(printf_format(to_str(in), args, p), p);
  }
  if (name == "attr") {
    const Value* n = arg(a, 0, "name");
    if (!n || !n->is_string()) fail(p, "attr() needs a name");
    return get_attr(in, n->str(), p);
  }
  if (name == "wordcount") {
    Value parts = split(to_str(in), nullptr, -1, false, p);
    return Value::integer(int64_t(parts.list->size()));
  }
  // jinja2 reports an unknown filter when the code that uses it runs.
  fail(p, "unsupported: no filter named '" + name + "'", LLM_ERR_UNSUPPORTED);
}

bool Renderer::apply_test(const std::string& name, const Value& v, CallArgs& a, Pos p) {
  step(p);
  auto other = [&]() -> const Value& {
    if (a.pos.empty()) fail(p, "test '" + name + "' needs an argument");
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.type == Type::Int;
  if (name == "float") return v.type == Type::Float;
  if (name == "boolean") return v.type == Type::Bool;
  if (name == "true") return v.type == Type::Bool && v.b;
  if (name == "false") return v.type == Type::Bool && !v.b;
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.type == Type::Function;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return map_case(v.str(), name == "upper") == v.str();
  }
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.type != o.type) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_mapping()) return v.dict == o.dict;
    if (v.is_string()) return v.sp == o.sp;
    return equals(v, o);
  }
  if (name == "lt" || name == "<" || name == "lessthan") return truthy(binary(Op::Lt, v, other(), p));
  if (name == "le" || name == "<=") return truthy(binary(Op::Le, v, other(), p));
  if (name == "gt" || name == ">" || name == "greaterthan") return truthy(binary(Op::Gt, v, other(), p));
  if (name == "ge" || name == ">=") return truthy(binary(Op::Ge, v, other(), p));
  if (name == "in") return contains(other(), v, p);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.is_undefined()) undefined_error(v, p);
    if (!is_int(v)) fail(p, "test '" + name + "' needs an integer");
    if (name == "odd") return py_mod(int_of(v), 2) == 1;
    if (name == "even") return py_mod(int_of(v), 2) == 0;
    const Value& d = other();
    if (!is_int(d)) fail(p, "divisibleby needs an integer");
    if (int_of(d) == 0) fail(p, "integer division or modulo by zero");
    if (int_of(d) == -1) return true;
    return py_mod(int_of(v), int_of(d)) == 0;
  }
  fail(p, "unsupported: no test named '" + name + "'", LLM_ERR_UNSUPPORTED);
}

}  // namespace llm::chat::detail

// ---- public API -------------------------------------------------------------------
namespace llm::chat {

Template::Template(std::unique_ptr<detail::Program> program) : program_(std::move(program)) {}
Template::~Template() = default;

std::shared_ptr<const Template> Template::compile(std::string_view source) {
  return std::make_shared<const Template>(detail::parse_template(source));
}

std::string Template::render(const std::vector<Message>& msgs, const RenderOptions& opt) const {
  detail::Renderer r(opt);
  return r.run(*program_, msgs);
}

}  // namespace llm::chat
