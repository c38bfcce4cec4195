// Values of the chat-template interpreter: a small variant with Python
// semantics (lists and dicts are shared and mutable, dicts keep insertion
// order). Internal to src/chat/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llm::chat::detail {

struct Pos {
  int line = 0, col = 0;
};

// Thrown by value helpers; the renderer adds the position (see Renderer::fail).
struct ValueError {
  std::string message;
};

struct Value;
class Renderer;
using List = std::vector<Value>;
struct Dict;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Function {
  std::string name;
  std::function<Value(Renderer&, CallArgs&, const Pos&)> call;
};

enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Function, Namespace };

struct Value {
  Type type = Type::Undefined;
  bool is_tuple = false;  // a List written or made as a tuple (repr only)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> sp;  // String; Undefined: what is missing, for messages
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<Function> fn;

  Value() = default;
  static Value undefined(std::string name = {}) {
    Value v;
    if (!name.empty()) v.sp = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value none() {
    Value v;
    v.type = Type::None;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.type = Type::Bool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.type = Type::Int;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.type = Type::Float;
    v.f = x;
    return v;
  }
  static Value string(std::string x);
  static Value make_list(List items = {}, bool tuple = false);
  static Value make_dict();
  static Value make_namespace();
  static Value function(std::string name, std::function<Value(Renderer&, CallArgs&, const Pos&)> f) {
    Value v;
    v.type = Type::Function;
    v.fn = std::make_shared<Function>(Function{std::move(name), std::move(f)});
    return v;
  }

  // Shared and immutable: copying a Value never copies its text.
  const std::string& str() const {
    static const std::string empty;
    return sp ? *sp : empty;
  }
  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
  bool is_list() const { return type == Type::List; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_mapping() const { return type == Type::Dict || type == Type::Namespace; }
};

bool equals(const Value& a, const Value& b);

// Keys are strings for everything the renderer builds; a template's dict
// literal may use other hashable keys (ints, floats, bools, none).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& kv : items)
      if (kv.first.type == Type::String && kv.first.str() == key) return &kv.second;
    return nullptr;
  }
  Value* find(std::string_view key) {
    for (auto& kv : items)
      if (kv.first.type == Type::String && kv.first.str() == key) return &kv.second;
    return nullptr;
  }
  const Value* find(const Value& key) const {
    for (const auto& kv : items)
      if (equals(kv.first, key)) return &kv.second;
    return nullptr;
  }
  void set(const Value& key, Value v) {
    for (auto& kv : items) {
      if (equals(kv.first, key)) {
        kv.second = std::move(v);
        return;
      }
    }
    items.emplace_back(key, std::move(v));
  }
  void set(std::string key, Value v) { set(Value::string(std::move(key)), std::move(v)); }
};

// Every list and dict made while a render runs is also held here, so that the
// render can empty them all when it ends: that frees cycles a template made
// (a list appended to itself) and frees deep nesting without recursing.
// It also counts the bytes of every string made, which the render charges
// against its step budget, so what a template can build is bounded.
struct Arena {
  std::vector<std::shared_ptr<List>> lists;
  std::vector<std::shared_ptr<Dict>> dicts;
  uint64_t string_bytes = 0;
};
Arena*& current_arena();  // per thread; null outside a render

inline Value Value::string(std::string x) {
  Value v;
  v.type = Type::String;
  if (Arena* a = current_arena()) a->string_bytes += x.size();
  v.sp = std::make_shared<const std::string>(std::move(x));
  return v;
}
inline Value Value::make_list(List items, bool tuple) {
  Value v;
  v.type = Type::List;
  v.is_tuple = tuple;
  v.list = std::make_shared<List>(std::move(items));
  if (Arena* a = current_arena()) a->lists.push_back(v.list);
  return v;
}
inline Value Value::make_dict() {
  Value v;
  v.type = Type::Dict;
  v.dict = std::make_shared<Dict>();
  if (Arena* a = current_arena()) a->dicts.push_back(v.dict);
  return v;
}
inline Value Value::make_namespace() {
  Value v;
  v.type = Type::Namespace;
  v.dict = std::make_shared<Dict>();
  if (Arena* a = current_arena()) a->dicts.push_back(v.dict);
  return v;
}

// ---- Python-like conversions (value.cpp) ------------------------------------
const char* type_name(const Value& v);  // Python's name: 'str', 'int', 'NoneType', ...
bool truthy(const Value& v);
std::string to_str(const Value& v);      // str(v); undefined -> ""
// Containers nest at most kMaxNesting deep for repr/json/equality/ordering;
// deeper (or cyclic) values are a ValueError, not a stack overflow.
constexpr int kMaxValueNesting = 200;
std::string repr(const Value& v, int depth = 0);  // repr(v)
std::string float_repr(double d);        // repr(float)
// json.dumps with transformers' defaults (ensure_ascii=False).
struct JsonStyle {
  int indent = -1;  // < 0: None (one line)
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent
};
void to_json(const Value& v, const JsonStyle& style, std::string& out, int level = 0);
bool equals(const Value& a, const Value& b, int depth);
// Python's a < b (-1), a == b (0), a > b (1) for numbers, strings, lists; ValueError otherwise.
int compare(const Value& a, const Value& b, int depth = 0);
double as_double(const Value& v);  // number -> double (bool/int/float)

// ---- UTF-8 (Python strings index code points) -----------------------------
size_t utf8_length(std::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> utf8_offsets(std::string_view s);
std::string utf8_encode(uint32_t cp);

}  // namespace llm::chat::detail
