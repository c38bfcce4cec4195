// Python semantics of chat-template values: str(), repr(), json.dumps,
// equality, ordering, truth.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "chat/value.h"
#include "tokenizer/unicode.h"

namespace llm::chat::detail {

Arena*& current_arena() {
  static thread_local Arena* arena = nullptr;
  return arena;
}

static void check_depth(int depth) {
  if (depth > kMaxValueNesting) throw ValueError{"value nested too deeply (or contains itself)"};
}

const char* type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return v.is_tuple ? "tuple" : "list";
    case Type::Dict: return "dict";
    case Type::Function: return "function";
    case Type::Namespace: return "Namespace";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.i != 0;
    case Type::Float: return v.f != 0.0;
    case Type::String: return !v.str().empty();
    case Type::List: return !v.list->empty();
    case Type::Dict: return !v.dict->items.empty();
    case Type::Function:
    case Type::Namespace: return true;
  }
  return false;
}

// Python's repr(float): the shortest digits that round-trip, fixed notation
// for exponents in [-4, 16), otherwise d.ddde+XX.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = false;
  size_t p = 0;
  if (sci[0] == '-') {
    neg = true;
    p = 1;
  }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t k = p; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  int exp = std::atoi(sci.c_str() + e + 1);
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return out;
}

static std::string str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == q) out += std::string("\\") + char(q);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v, int depth) {
  check_depth(depth);
  switch (v.type) {
    case Type::String: return str_repr(v.str());
    case Type::List: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k], depth + 1);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      out += v.is_tuple ? ")" : "]";
      return out;
    }
    case Type::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(kv.first, depth + 1) + ": " + repr(kv.second, depth + 1);
      }
      return out + "}";
    }
    case Type::Undefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return v.b ? "True" : "False";
    case Type::Int: return std::to_string(v.i);
    case Type::Float: return float_repr(v.f);
    case Type::String: return v.str();
    case Type::List:
    case Type::Dict: return repr(v);
    case Type::Function: return "<function " + v.fn->name + ">";
    case Type::Namespace: return "<Namespace>";
  }
  return "";
}

static void json_string(const std::string& s, std::string& out, bool ensure_ascii) {
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else if (c >= 0x80 && ensure_ascii) {
          // Decode one UTF-8 sequence; astral code points become a surrogate pair.
          int len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
          if (k + size_t(len) > s.size()) len = 1;
          uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
          for (int j = 1; j < len; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[k + size_t(j)]) & 0x3F);
          k += size_t(len) - 1;
          char b[16];
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", cp);
          }
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_newline(int indent, int level, std::string& out) {
  out += '\n';
  out.append(size_t(indent) * size_t(level), ' ');
}

void to_json(const Value& v, const JsonStyle& st, std::string& out, int level) {
  check_depth(level);
  const std::string& item_sep = !st.item_sep.empty() ? st.item_sep : st.indent >= 0 ? std::string(",") : std::string(", ");
  const std::string& key_sep = !st.key_sep.empty() ? st.key_sep : std::string(": ");
  switch (v.type) {
    case Type::None: out += "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::Int: out += std::to_string(v.i); return;
    case Type::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Type::String: json_string(v.str(), out, st.ensure_ascii); return;
    case Type::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        if (st.indent >= 0) json_newline(st.indent, level + 1, out);
        to_json((*v.list)[k], st, out, level + 1);
      }
      if (st.indent >= 0) json_newline(st.indent, level, out);
      out += ']';
      return;
    }
    case Type::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys) {
        for (const auto* kv : items)
          if (kv->first.type != Type::String) throw ValueError{"tojson: sort_keys needs string keys"};
        std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) { return a->first.str() < b->first.str(); });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        if (st.indent >= 0) json_newline(st.indent, level + 1, out);
        const Value& key = kv->first;
        if (key.type == Type::String) json_string(key.str(), out, st.ensure_ascii);
        else if (key.type == Type::None) out += "\"null\"";
        else if (key.type == Type::Bool) out += key.b ? "\"true\"" : "\"false\"";
        else if (key.type == Type::Int || key.type == Type::Float) json_string(to_str(key), out, false);
        else throw ValueError{"keys must be str, int, float, bool or None"};
        out += key_sep;
        to_json(kv->second, st, out, level + 1);
      }
      if (st.indent >= 0) json_newline(st.indent, level, out);
      out += '}';
      return;
    }
    default: throw ValueError{std::string("Object of type ") + type_name(v) + " is not JSON serializable"};
  }
}

double as_double(const Value& v) {
  switch (v.type) {
    case Type::Bool: return v.b ? 1.0 : 0.0;
    case Type::Int: return double(v.i);
    case Type::Float: return v.f;
    default: return 0.0;
  }
}

static int64_t as_int(const Value& v) { return v.type == Type::Bool ? int64_t(v.b) : v.i; }

bool equals(const Value& a, const Value& b) { return equals(a, b, 0); }

bool equals(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::Float && b.type != Type::Float) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::Undefined:
    case Type::None: return true;
    case Type::String: return a.str() == b.str();
    case Type::List: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    }
    case Type::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equals(kv.second, *o, depth + 1)) return false;
      }
      return true;
    }
    case Type::Function: return a.fn == b.fn;
    case Type::Namespace: return a.dict == b.dict;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::Float && b.type != Type::Float) {
      const int64_t x = as_int(a), y = as_int(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k], depth + 1)) continue;
      return compare((*a.list)[k], (*b.list)[k], depth + 1);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw ValueError{std::string("'<' not supported between instances of '") + type_name(a) + "' and '" +
                   type_name(b) + "'"};
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) off.push_back(k);
  off.push_back(s.size());
  return off;
}

std::string utf8_encode(uint32_t cp) {
  std::string out;
  utf8_append(cp > 0x10FFFF ? 0xFFFD : cp, out);
  return out;
}

}  // namespace llm::chat::detail
