// JSON Schema grammars against a small validator for the same subset: random
// instances (generated from each schema, then randomly broken) must be
// accepted by the grammar exactly when the validator says they validate.
//
// The grammar is stricter than JSON Schema in two documented ways that the
// generator stays clear of: properties come in the declared order, and oneOf is
// anyOf. Instances are written compactly (nlohmann's dump).
#include <nlohmann/json.hpp>

#include <regex>

#include "grammar_test_util.h"

namespace llm::grammar::test {
namespace {

using Json = nlohmann::ordered_json;

class Validator {
 public:
  explicit Validator(const Json& root) : root_(root) {}

  const Json& resolve(const Json& s) const {
    if (s.is_object() && s.contains("$ref")) {
      const std::string r = s["$ref"];
      const std::string name = r.substr(r.find_last_of('/') + 1);
      return root_.contains("$defs") ? root_["$defs"][name] : root_["definitions"][name];
    }
    return s;
  }

  bool valid(const Json& schema, const Json& v) const {
    const Json& s = resolve(schema);
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("const") && v != s["const"]) return false;
    if (s.contains("enum")) {
      bool found = false;
      for (const Json& e : s["enum"]) found = found || e == v;
      if (!found) return false;
    }
    if ((s.contains("const") || s.contains("enum")) && !s.contains("type")) return true;
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      for (const Json& sub : s[k])
        if (valid(sub, v)) return true;
      return false;
    }
    if (!s.contains("type")) return true;
    std::vector<std::string> types;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else for (const Json& t : s["type"]) types.push_back(t);
    for (const std::string& t : types)
      if (valid_type(s, t, v)) return true;
    return false;
  }

 private:
  static size_t code_points(const std::string& str) {
    size_t n = 0;
    for (unsigned char c : str) n += (c & 0xC0) != 0x80;
    return n;
  }

  bool valid_type(const Json& s, const std::string& t, const Json& v) const {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "integer") return v.is_number_integer();
    if (t == "number") return v.is_number();
    if (t == "string") {
      if (!v.is_string()) return false;
      const std::string str = v;
      if (s.contains("minLength") && code_points(str) < s["minLength"].get<size_t>()) return false;
      if (s.contains("maxLength") && code_points(str) > s["maxLength"].get<size_t>()) return false;
      if (s.contains("pattern") && !std::regex_search(str, std::regex(s["pattern"].get<std::string>()))) return false;
      return true;
    }
    if (t == "array") {
      if (!v.is_array()) return false;
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
      if (s.contains("items"))
        for (const Json& e : v)
          if (!valid(s["items"], e)) return false;
      return true;
    }
    if (t == "object") {
      if (!v.is_object()) return false;
      const Json props = s.value("properties", Json::object());
      for (const Json& r : s.value("required", Json::array()))
        if (!v.contains(r.get<std::string>())) return false;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (props.contains(it.key())) {
          if (!valid(props[it.key()], it.value())) return false;
        } else if (s.contains("additionalProperties")) {
          if (!valid(s["additionalProperties"], it.value())) return false;
        }
      }
      return true;
    }
    return false;
  }

  const Json& root_;
};

class Generator {
 public:
  Generator(const Json& root, const Validator& val, std::mt19937& rng) : root_(root), val_(val), rng_(rng) {}

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  Json any_scalar() {
    switch (pick(7)) {
      case 0: return nullptr;
      case 1: return pick(2) == 0;
      case 2: return pick(200) - 100;
      case 3: return 2.5;
      case 4: return random_string(pick(6));
      case 5: return Json::array({1, "x"});
      default: return Json::object({{"k", pick(3)}});
    }
  }

  std::string random_string(int len) {
    static const std::vector<std::string> chars = {"a", "b", "c", "Z", "-", "1", "9", " ", "\xC3\xA9", "\"", "\\", "\n"};
    std::string s;
    for (int i = 0; i < len; ++i) s += chars[size_t(pick(int(chars.size())))];
    return s;
  }

  Json gen(const Json& schema, int depth) {
    const Json& s = val_.resolve(schema);
    if (s.is_boolean() || (s.is_object() && s.empty())) return any_scalar();
    if (s.contains("const")) return s["const"];
    if (s.contains("enum")) return s["enum"][size_t(pick(int(s["enum"].size())))];
    for (const char* k : {"anyOf", "oneOf"})
      if (s.contains(k)) return gen(s[k][size_t(pick(int(s[k].size())))], depth);
    std::string t;
    if (s["type"].is_string()) t = s["type"];
    else t = s["type"][size_t(pick(int(s["type"].size())))];
    if (t == "null") return nullptr;
    if (t == "boolean") return pick(2) == 0;
    if (t == "integer") return pick(2000) - 1000;
    if (t == "number") return pick(2) ? Json(pick(100)) : Json(double(pick(400) - 200) / 8.0);
    if (t == "string") {
      if (s.contains("pattern")) {
        static const std::vector<std::string> pool = {"AB-123", "ZZ-0000", "A-1", "AB-12345", "cat", "cats", "dog",
                                                      "dogs", "cow", "abc", "xabbcy", "ac", "", "ab1c"};
        return pool[size_t(pick(int(pool.size())))];
      }
      const int lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 6);
      return random_string(lo + pick(hi - lo + 1));
    }
    if (t == "array") {
      const int lo = s.value("minItems", 0), hi = std::min(s.value("maxItems", lo + 3), lo + 3);
      Json a = Json::array();
      const int n = depth > 3 ? lo : lo + pick(hi - lo + 1);
      for (int i = 0; i < n; ++i) a.push_back(s.contains("items") ? gen(s["items"], depth + 1) : any_scalar());
      return a;
    }
    Json o = Json::object();
    const Json props = s.value("properties", Json::object());
    const Json req = s.value("required", Json::array());
    for (auto it = props.begin(); it != props.end(); ++it) {
      const bool required = std::find(req.begin(), req.end(), Json(it.key())) != req.end();
      if (required || (depth < 4 && pick(2) == 0)) o[it.key()] = gen(it.value(), depth + 1);
    }
    return o;
  }

  // One random change somewhere in v.
  void mutate(Json& v) {
    if (v.is_object() && !v.empty() && pick(3) != 0) {
      auto it = v.begin();
      std::advance(it, pick(int(v.size())));
      switch (pick(3)) {
        case 0: v.erase(it.key()); return;
        case 1: mutate(it.value()); return;
        default: v["zz" + std::to_string(pick(3))] = any_scalar(); return;
      }
    }
    if (v.is_array() && !v.empty() && pick(3) != 0) {
      switch (pick(3)) {
        case 0: v.erase(v.begin() + pick(int(v.size()))); return;
        case 1: mutate(v[size_t(pick(int(v.size())))]); return;
        default: v.push_back(any_scalar()); return;
      }
    }
    if (v.is_string() && pick(2) == 0) {
      v = v.get<std::string>() + random_string(1 + pick(3));
      return;
    }
    v = any_scalar();
  }

 private:
  const Json& root_;
  const Validator& val_;
  std::mt19937& rng_;
};

TEST(JsonSchemaValidate, GrammarAgreesWithValidator) {
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {
           "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
           "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "minLength": 2, "maxLength": 3}},
                       "required": ["city"], "additionalProperties": false}},
         "required": ["name", "address"], "additionalProperties": false})",
      R"({"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3})",
      R"({"type": "object", "properties": {"color": {"enum": ["red", "green", null, 42]}, "v": {"const": "fixed"}},
         "required": ["color"], "additionalProperties": false})",
      R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "boolean"}}, {"type": ["integer", "null"]}]})",
      R"({"type": "object", "properties": {
           "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"},
           "word": {"type": "string", "pattern": "^(cat|dog)s?$"},
           "has": {"type": "string", "pattern": "ab+c"}}, "additionalProperties": false})",
      R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
           "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
           "required": ["value"], "additionalProperties": false}}, "$ref": "#/$defs/node"})",
      R"({"type": "object", "properties": {"e": {"type": ["string", "null"], "enum": ["a", 2, null, "b"]}, "c": {"type": "integer", "const": 2}}})",
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
         "required": ["a"], "additionalProperties": {"type": "string"}})",
  };
  std::mt19937 rng(2024);
  int n_valid = 0, n_invalid = 0;
  for (const std::string& text : schemas) {
    const Json schema = Json::parse(text);
    auto g = parse_gbnf(json_schema_to_gbnf(text));
    Validator val(schema);
    Generator gen(schema, val, rng);
    for (int i = 0; i < 400; ++i) {
      Json inst = gen.gen(schema, 0);
      if (i % 2 == 1) gen.mutate(inst);
      const std::string s = inst.dump();
      const bool expect = val.valid(schema, inst);
      EXPECT_EQ(accepts(g, s), expect) << text << "\ninstance: " << s;
      (expect ? n_valid : n_invalid)++;
    }
  }
  EXPECT_GT(n_valid, 800);
  EXPECT_GT(n_invalid, 400);
}

}  // namespace
}  // namespace llm::grammar::test
