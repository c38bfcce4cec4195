// A small JSON reader for untrusted model metadata (safetensors headers,
// Hugging Face config.json and tokenizer.json). Every read is bounds-checked;
// nesting depth and total size are capped, so a hostile file costs at most a
// clear LLM_ERR_FORMAT. Not a general-purpose library: it parses, it does not
// write, and objects keep their keys in file order (duplicates are an error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llm::json {

enum class Type { Null, Bool, Number, String, Array, Object };

class Value {
 public:
  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  // True for a number written without fraction or exponent that fits int64.
  bool is_int() const { return type_ == Type::Number && is_int_; }

  // Checked accessors: throw Error(LLM_ERR_FORMAT) naming `what` when the
  // value has another type (or, for as_int, is not an exact integer).
  bool as_bool(const char* what) const;
  double as_double(const char* what) const;
  int64_t as_int(const char* what) const;
  const std::string& as_string(const char* what) const;
  const std::vector<Value>& as_array(const char* what) const;
  const std::vector<std::pair<std::string, Value>>& as_object(const char* what) const;

  // Object member lookup (linear; objects here are small or iterated).
  // Null if this is not an object or the key is absent.
  const Value* find(const std::string& key) const;

  // Convenience for optional members with defaults; a present member of the
  // wrong type is LLM_ERR_FORMAT.
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;

 private:
  friend class Parser;
  Type type_ = Type::Null;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double num_ = 0.0;
  std::string str_;
  std::vector<Value> arr_;
  std::vector<std::pair<std::string, Value>> obj_;
};

struct ParseLimits {
  size_t max_depth = 64;
  size_t max_bytes = size_t(256) << 20;  // larger inputs are refused before parsing
};

// Parses one JSON text (RFC 8259; surrounding whitespace allowed, nothing
// else after the value). Strings are decoded to UTF-8 (\u escapes, surrogate
// pairs); raw bytes inside strings are kept as they are. Throws
// Error(LLM_ERR_FORMAT) with the byte offset of the problem. `what` names the
// document in messages.
Value parse(const char* data, size_t size, const char* what = "JSON", const ParseLimits& limits = {});

}  // namespace llm::json
