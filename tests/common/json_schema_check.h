// A JSON Schema validator for the subset llm_grammar_from_json_schema
// accepts (docs/GRAMMAR.md), written independently of the converter so that
// tests can check generated JSON against the schema itself: type (and type
// arrays), properties / required / additionalProperties, items, minItems /
// maxItems, enum, const, anyOf / oneOf, minLength / maxLength, pattern
// (std::regex ECMAScript, searched), minimum / maximum, $ref to #/$defs/...
// and #/definitions/... Returns "" when `v` is valid, else the first reason.
#pragma once

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace llm::testing {

class SchemaCheck {
 public:
  explicit SchemaCheck(const nlohmann::json& root) : root_(root) {}

  std::string check(const nlohmann::json& v) const { return check(root_, v, "$"); }

 private:
  static size_t utf8_length(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  const nlohmann::json& resolve(const nlohmann::json& s) const {
    if (!s.is_object() || !s.contains("$ref")) return s;
    const std::string ref = s["$ref"].get<std::string>();
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.rfind(p, 0) == 0) return root_[p.substr(2, p.size() - 3)][ref.substr(p.size())];
    }
    return s;
  }

  static bool has_type(const nlohmann::json& v, const std::string& t) {
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
    if (t == "number") return v.is_number();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    return false;
  }

  std::string check(const nlohmann::json& schema_in, const nlohmann::json& v, const std::string& at) const {
    const nlohmann::json& s = resolve(schema_in);
    if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
    if (s.contains("type")) {
      bool ok = false;
      if (s["type"].is_array()) {
        for (const auto& t : s["type"]) ok = ok || has_type(v, t.get<std::string>());
      } else {
        ok = has_type(v, s["type"].get<std::string>());
      }
      if (!ok) return at + ": not of type " + s["type"].dump();
    }
    if (s.contains("const") && s["const"] != v) return at + ": not the const " + s["const"].dump();
    if (s.contains("enum")) {
      bool found = false;
      for (const auto& e : s["enum"]) found = found || e == v;
      if (!found) return at + ": not in enum";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      int n_ok = 0;
      for (const auto& alt : s[key]) n_ok += check(alt, v, at).empty();
      if (n_ok == 0) return at + ": matches no " + key + " alternative";
    }
    if (v.is_object()) {
      const nlohmann::json props = s.value("properties", nlohmann::json::object());
      if (s.contains("required"))
        for (const auto& r : s["required"])
          if (!v.contains(r.get<std::string>())) return at + ": missing required '" + r.get<std::string>() + "'";
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (props.contains(it.key())) {
          const std::string e = check(props[it.key()], it.value(), at + "." + it.key());
          if (!e.empty()) return e;
        } else if (s.contains("additionalProperties")) {
          const auto& ap = s["additionalProperties"];
          if (ap.is_boolean() && !ap.get<bool>()) return at + ": unexpected property '" + it.key() + "'";
          if (ap.is_object()) {
            const std::string e = check(ap, it.value(), at + "." + it.key());
            if (!e.empty()) return e;
          }
        }
      }
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
      if (s.contains("items"))
        for (size_t i = 0; i < v.size(); ++i) {
          const std::string e = check(s["items"], v[i], at + "[" + std::to_string(i) + "]");
          if (!e.empty()) return e;
        }
    }
    if (v.is_string()) {
      const std::string str = v.get<std::string>();
      if (s.contains("minLength") && utf8_length(str) < s["minLength"].get<size_t>()) return at + ": too short";
      if (s.contains("maxLength") && utf8_length(str) > s["maxLength"].get<size_t>()) return at + ": too long";
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>())))
        return at + ": does not match pattern " + s["pattern"].get<std::string>();
    }
    if (v.is_number()) {
      const double x = v.get<double>();
      if (s.contains("minimum") && x < s["minimum"].get<double>()) return at + ": below minimum";
      if (s.contains("maximum") && x > s["maximum"].get<double>()) return at + ": above maximum";
    }
    return "";
  }

  const nlohmann::json& root_;
};

}  // namespace llm::testing
