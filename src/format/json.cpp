// Recursive-descent JSON parser with a depth cap. Numbers: integers without
// fraction/exponent are kept exact in int64 (safetensors offsets, token ids);
// every number also gets a double (std::from_chars: locale-independent).
#include "format/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace llm::json {

bool Value::as_bool(const char* what) const {
  LLM_CHECK(type_ == Type::Bool, LLM_ERR_FORMAT, "%s: expected true/false", what);
  return bool_;
}

double Value::as_double(const char* what) const {
  LLM_CHECK(type_ == Type::Number, LLM_ERR_FORMAT, "%s: expected a number", what);
  return num_;
}

int64_t Value::as_int(const char* what) const {
  LLM_CHECK(type_ == Type::Number && is_int_, LLM_ERR_FORMAT, "%s: expected an integer", what);
  return int_;
}

const std::string& Value::as_string(const char* what) const {
  LLM_CHECK(type_ == Type::String, LLM_ERR_FORMAT, "%s: expected a string", what);
  return str_;
}

const std::vector<Value>& Value::as_array(const char* what) const {
  LLM_CHECK(type_ == Type::Array, LLM_ERR_FORMAT, "%s: expected an array", what);
  return arr_;
}

const std::vector<std::pair<std::string, Value>>& Value::as_object(const char* what) const {
  LLM_CHECK(type_ == Type::Object, LLM_ERR_FORMAT, "%s: expected an object", what);
  return obj_;
}

const Value* Value::find(const std::string& key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& kv : obj_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

int64_t Value::get_int(const std::string& key, int64_t def) const {
  const Value* v = find(key);
  return v && !v->is_null() ? v->as_int(key.c_str()) : def;
}

double Value::get_double(const std::string& key, double def) const {
  const Value* v = find(key);
  return v && !v->is_null() ? v->as_double(key.c_str()) : def;
}

bool Value::get_bool(const std::string& key, bool def) const {
  const Value* v = find(key);
  return v && !v->is_null() ? v->as_bool(key.c_str()) : def;
}

std::string Value::get_string(const std::string& key, const std::string& def) const {
  const Value* v = find(key);
  return v && !v->is_null() ? v->as_string(key.c_str()) : def;
}

class Parser {
 public:
  Parser(const char* data, size_t size, const char* what, const ParseLimits& limits)
      : p_(data), n_(size), what_(what), limits_(limits) {}

  Value parse_document() {
    Value v;
    skip_ws();
    parse_value(v, 0);
    skip_ws();
    if (i_ != n_) error("unexpected data after the value");
    return v;
  }

 private:
  [[noreturn]] void error(const char* msg) const {
    fail(LLM_ERR_FORMAT, "%s: %s at byte %zu", what_, msg, i_);
  }

  void skip_ws() {
    while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\t' || p_[i_] == '\n' || p_[i_] == '\r')) ++i_;
  }

  bool literal(const char* word) {
    const size_t len = std::strlen(word);
    if (n_ - i_ < len || std::memcmp(p_ + i_, word, len) != 0) return false;
    i_ += len;
    return true;
  }

  void parse_value(Value& v, size_t depth) {
    if (depth > limits_.max_depth) error("nesting too deep");
    if (i_ >= n_) error("unexpected end of input");
    const char c = p_[i_];
    switch (c) {
      case '{': parse_object(v, depth); return;
      case '[': parse_array(v, depth); return;
      case '"':
        v.type_ = Type::String;
        parse_string(v.str_);
        return;
      case 't':
        if (!literal("true")) error("bad literal");
        v.type_ = Type::Bool;
        v.bool_ = true;
        return;
      case 'f':
        if (!literal("false")) error("bad literal");
        v.type_ = Type::Bool;
        v.bool_ = false;
        return;
      case 'n':
        if (!literal("null")) error("bad literal");
        v.type_ = Type::Null;
        return;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          parse_number(v);
          return;
        }
        error("unexpected character");
    }
  }

  void parse_object(Value& v, size_t depth) {
    v.type_ = Type::Object;
    ++i_;  // '{'
    skip_ws();
    if (i_ < n_ && p_[i_] == '}') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      if (i_ >= n_ || p_[i_] != '"') error("expected a member name");
      std::string key;
      parse_string(key);
      skip_ws();
      if (i_ >= n_ || p_[i_] != ':') error("expected ':'");
      ++i_;
      skip_ws();
      v.obj_.emplace_back(std::move(key), Value());
      parse_value(v.obj_.back().second, depth + 1);
      skip_ws();
      if (i_ >= n_) error("unterminated object");
      if (p_[i_] == ',') {
        ++i_;
        continue;
      }
      if (p_[i_] == '}') {
        ++i_;
        break;
      }
      error("expected ',' or '}'");
    }
    check_duplicates(v);
  }

  // Duplicate keys make "which one wins" reader-dependent (a classic way to
  // smuggle a second tensor offset past a validator): refuse them. Sorting
  // pointers keeps this O(n log n) for vocabularies of 100k+ entries.
  void check_duplicates(const Value& v) {
    if (v.obj_.size() < 2) return;
    std::vector<const std::string*> keys;
    keys.reserve(v.obj_.size());
    for (const auto& kv : v.obj_) keys.push_back(&kv.first);
    std::sort(keys.begin(), keys.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t k = 1; k < keys.size(); ++k)
      if (*keys[k] == *keys[k - 1]) fail(LLM_ERR_FORMAT, "%s: duplicate key '%.64s'", what_, keys[k]->c_str());
  }

  void parse_array(Value& v, size_t depth) {
    v.type_ = Type::Array;
    ++i_;  // '['
    skip_ws();
    if (i_ < n_ && p_[i_] == ']') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      v.arr_.emplace_back();
      parse_value(v.arr_.back(), depth + 1);
      skip_ws();
      if (i_ >= n_) error("unterminated array");
      if (p_[i_] == ',') {
        ++i_;
        continue;
      }
      if (p_[i_] == ']') {
        ++i_;
        return;
      }
      error("expected ',' or ']'");
    }
  }

  int hex4() {
    if (n_ - i_ < 4) error("truncated \\u escape");
    int v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = p_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else error("bad hex digit in \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  void parse_string(std::string& out) {
    ++i_;  // opening quote
    for (;;) {
      // Copy the run of plain bytes in one go.
      size_t j = i_;
      while (j < n_ && p_[j] != '"' && p_[j] != '\\' && static_cast<unsigned char>(p_[j]) >= 0x20) ++j;
      out.append(p_ + i_, j - i_);
      i_ = j;
      if (i_ >= n_) error("unterminated string");
      const char c = p_[i_];
      if (c == '"') {
        ++i_;
        return;
      }
      if (c != '\\') error("control character in string");
      ++i_;
      if (i_ >= n_) error("unterminated escape");
      const char e = p_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = uint32_t(hex4());
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (n_ - i_ < 2 || p_[i_] != '\\' || p_[i_ + 1] != 'u') error("unpaired surrogate");
            i_ += 2;
            const uint32_t lo = uint32_t(hex4());
            if (lo < 0xDC00 || lo > 0xDFFF) error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: error("bad escape");
      }
    }
  }

  void parse_number(Value& v) {
    const size_t start = i_;
    bool integral = true, negative_exponent = false;
    if (p_[i_] == '-') ++i_;
    if (i_ >= n_) error("bad number");
    if (p_[i_] == '0') {
      ++i_;
    } else if (p_[i_] >= '1' && p_[i_] <= '9') {
      while (i_ < n_ && p_[i_] >= '0' && p_[i_] <= '9') ++i_;
    } else {
      error("bad number");
    }
    if (i_ < n_ && p_[i_] == '.') {
      integral = false;
      ++i_;
      if (i_ >= n_ || p_[i_] < '0' || p_[i_] > '9') error("bad number");
      while (i_ < n_ && p_[i_] >= '0' && p_[i_] <= '9') ++i_;
    }
    if (i_ < n_ && (p_[i_] == 'e' || p_[i_] == 'E')) {
      integral = false;
      ++i_;
      if (i_ < n_ && (p_[i_] == '+' || p_[i_] == '-')) negative_exponent = p_[i_++] == '-';
      if (i_ >= n_ || p_[i_] < '0' || p_[i_] > '9') error("bad number");
      while (i_ < n_ && p_[i_] >= '0' && p_[i_] <= '9') ++i_;
    }
    v.type_ = Type::Number;
    const char* b = p_ + start;
    const char* e = p_ + i_;
    if (integral) {
      int64_t x = 0;
      const auto r = std::from_chars(b, e, x);
      if (r.ec == std::errc() && r.ptr == e) {
        v.is_int_ = true;
        v.int_ = x;
        v.num_ = double(x);
        return;
      }
    }
    // Out-of-range magnitudes become +-inf or +-0 rather than an error (a
    // config value like 1e400 is then rejected by whoever reads it); an
    // integer beyond int64 becomes the nearest double.
    double d = 0.0;
    const auto r = std::from_chars(b, e, d);
    if (r.ptr != e) error("bad number");
    if (r.ec == std::errc::result_out_of_range) {
      const double mag = negative_exponent ? 0.0 : HUGE_VAL;
      d = *b == '-' ? -mag : mag;
    }
    v.num_ = d;
  }

  const char* p_;
  size_t n_;
  size_t i_ = 0;
  const char* what_;
  ParseLimits limits_;
};

Value parse(const char* data, size_t size, const char* what, const ParseLimits& limits) {
  LLM_CHECK(data != nullptr || size == 0, LLM_ERR_INVALID_ARGUMENT, "%s: null buffer", what);
  LLM_CHECK(size <= limits.max_bytes, LLM_ERR_FORMAT, "%s: %zu bytes is larger than the %zu-byte limit", what, size,
            limits.max_bytes);
  Parser p(data, size, what, limits);
  return p.parse_document();
}

}  // namespace llm::json
