// JSON Schema (the OpenAI structured-outputs subset, docs/GRAMMAR.md) -> GBNF.
//
// Every schema node becomes a rule; identical bodies share one rule, so all
// plain strings use one `string` rule (and share its mask cache entries).
// Whitespace between tokens is `space` (at most one space, or a newline and
// up to 20 indentation characters), as in llama.cpp.
// Keywords that would change what validates and are not handled are errors;
// purely descriptive ones are ignored.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "format/json.h"
#include "grammar/grammar.h"

namespace llm::grammar {

namespace {

using json::Value;

constexpr int kMaxRefDepth = 32;
constexpr int kMaxRegexNesting = 64;
constexpr size_t kMaxKeyTrieName = 256;  // code points of a property name when extra properties are allowed
constexpr int64_t kMaxCount = 10000;  // minItems/maxItems/minLength/maxLength

const char* const kSpace = R"(| " " | "\n" [ \t]{0,20})";
const char* const kChar = R"([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))";

// A GBNF string literal for raw bytes (ASCII printable kept, the rest escaped).
std::string gbnf_literal(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
      ++i;
    } else if (c >= 0x20 && c < 0x7F) {
      out += char(c);
      ++i;
    } else if (c < 0x80) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
      ++i;
    } else {
      // Raw UTF-8 (already validated by the JSON reader) stays as it is.
      size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      out.append(s, i, len);
      i += len;
    }
  }
  out += '"';
  return out;
}

// Compact JSON text of a string value.
std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
  return out;
}

std::string json_number(const Value& v) {
  if (v.is_int()) return std::to_string(v.as_int("number"));
  const double d = v.as_double("number");
  char buf[40];
  for (int prec = 15; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  return buf;
}

// Compact JSON text (the one form an enum/const value is generated in).
std::string json_compact(const Value& v) {
  switch (v.type()) {
    case json::Type::Null: return "null";
    case json::Type::Bool: return v.as_bool("bool") ? "true" : "false";
    case json::Type::Number: return json_number(v);
    case json::Type::String: return json_quote(v.as_string("string"));
    case json::Type::Array: {
      std::string out = "[";
      for (const Value& e : v.as_array("array")) {
        if (out.size() > 1) out += ',';
        out += json_compact(e);
      }
      return out + "]";
    }
    case json::Type::Object: {
      std::string out = "{";
      for (const auto& kv : v.as_object("object")) {
        if (out.size() > 1) out += ',';
        out += json_quote(kv.first) + ":" + json_compact(kv.second);
      }
      return out + "}";
    }
  }
  return "null";
}

std::string pointer_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

class Converter {
 public:
  explicit Converter(const Value& root) : root_(root) {}

  std::string run() {
    const std::string r = visit(root_, "", "root");
    std::string out = "root ::= " + r + "\n";
    for (const auto& rule : rules_) out += rule.first + " ::= " + rule.second + "\n";
    return out;
  }

 private:
  [[noreturn]] void error(const std::string& path, const char* fmt, ...)
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
  {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail(LLM_ERR_INVALID_ARGUMENT, "json schema: at %s: %s", path.empty() ? "/" : path.c_str(), msg);
  }

  std::string unique_name(const std::string& hint) {
    std::string base;
    for (char c : hint) base += ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) ? c : '-';
    if (base.size() > 48) base.resize(48);
    std::string name = base;
    for (int k = 1; names_.count(name) || name == "root"; ++k) name = base + "-" + std::to_string(k);
    names_.insert(name);
    return name;
  }

  // A rule with this body (shared with any earlier rule of the same body).
  std::string rule(const std::string& hint, const std::string& body) {
    auto it = by_body_.find(body);
    if (it != by_body_.end()) return it->second;
    const std::string name = unique_name(hint);
    rules_.push_back({name, body});
    by_body_.emplace(body, name);
    return name;
  }

  // Fixed helper rules, added on first use.
  std::string prim(const std::string& name) {
    if (prims_.count(name)) return name;
    prims_.insert(name);
    names_.insert(name);
    std::string body;
    if (name == "space") body = kSpace;
    else if (name == "char") body = kChar;
    else if (name == "string") body = "\"\\\"\" " + prim("char") + "* \"\\\"\" " + prim("space");
    else if (name == "integer") body = "\"-\"? (\"0\" | [1-9] [0-9]{0,15}) " + prim("space");
    else if (name == "number")  // at most 16 + 2 exponent digits: every value is a finite double
      body = "\"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,2})? " + prim("space");
    else if (name == "boolean") body = "(\"true\" | \"false\") " + prim("space");
    else if (name == "null") body = "\"null\" " + prim("space");
    else if (name == "value")
      body = prim("object") + " | " + prim("array") + " | " + prim("string") + " | " + prim("number") + " | " +
             prim("boolean") + " | " + prim("null");
    else if (name == "object")
      body = "\"{\" " + prim("space") + " (" + prim("string") + " \":\" " + prim("space") + " " + prim("value") +
             " (\",\" " + prim("space") + " " + prim("string") + " \":\" " + prim("space") + " " + prim("value") +
             ")*)? \"}\" " + prim("space");
    else if (name == "array")
      body = "\"[\" " + prim("space") + " (" + prim("value") + " (\",\" " + prim("space") + " " + prim("value") +
             ")*)? \"]\" " + prim("space");
    rules_.push_back({name, body});
    return name;
  }

  static bool is_descriptive(const std::string& k) {
    static const std::set<std::string> kSkip = {"title",    "description", "examples",  "$schema",  "$id",
                                                "$comment", "default",     "deprecated", "readOnly", "writeOnly",
                                                "$defs",    "definitions"};
    return kSkip.count(k) != 0;
  }

  std::string visit(const Value& s, const std::string& path, const std::string& hint) {
    if (s.is_bool()) {
      if (s.as_bool("schema")) return prim("value");
      error(path, "the schema 'false' (nothing validates) is unsupported");
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean");
    static const std::set<std::string> kKnown = {
        "type",     "properties", "required",  "additionalProperties", "items",  "minItems", "maxItems", "enum",
        "const",    "anyOf",      "oneOf",     "$ref",                 "minLength", "maxLength", "pattern", "format",
        "uniqueItems"};
    std::vector<std::string> validating;
    for (const auto& kv : s.as_object("schema")) {
      if (is_descriptive(kv.first)) continue;
      if (!kKnown.count(kv.first)) error(path, "unsupported keyword '%.64s'", kv.first.c_str());
      validating.push_back(kv.first);
    }
    if (const Value* u = s.find("uniqueItems")) {
      if (!u->is_bool() || u->as_bool("uniqueItems"))
        error(path + "/uniqueItems", "unsupported keyword 'uniqueItems' (only false)");
    }
    auto only = [&](const char* key) {
      for (const std::string& k : validating)
        if (k != key && k != "uniqueItems")
          error(path, "unsupported: '%s' together with '%s'", key, k.c_str());
    };

    if (const Value* ref = s.find("$ref")) {
      only("$ref");
      return visit_ref(*ref, path + "/$ref");
    }
    // const / enum: the listed values that also have an allowed type.
    auto type_ok = [&](const Value& v) {
      const Value* t = s.find("type");
      if (!t) return true;
      std::vector<std::string> names;
      if (t->is_string()) names.push_back(t->as_string("type"));
      else if (t->is_array())
        for (const Value& x : t->as_array("type"))
          if (x.is_string()) names.push_back(x.as_string("type"));
      for (const std::string& n : names) {
        if ((n == "null" && v.is_null()) || (n == "boolean" && v.is_bool()) || (n == "string" && v.is_string()) ||
            (n == "number" && v.is_number()) || (n == "integer" && v.is_int()) || (n == "array" && v.is_array()) ||
            (n == "object" && v.is_object()))
          return true;
      }
      return false;
    };
    if (const Value* c = s.find("const")) {
      if (!type_ok(*c)) error(path + "/const", "the 'const' value does not have the schema's type");
      return rule(hint, gbnf_literal(json_compact(*c)) + " " + prim("space"));
    }
    if (const Value* e = s.find("enum")) {
      if (!e->is_array() || e->as_array("enum").empty()) error(path + "/enum", "'enum' must be a non-empty array");
      std::string body = "(";
      for (const Value& v : e->as_array("enum")) {
        if (!type_ok(v)) continue;
        if (body.size() > 1) body += " | ";
        body += gbnf_literal(json_compact(v));
      }
      if (body.size() == 1) error(path + "/enum", "no 'enum' value has the schema's type");
      return rule(hint, body + ") " + prim("space"));
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const Value* a = s.find(key)) {
        only(key);
        if (!a->is_array() || a->as_array(key).empty()) error(path + "/" + key, "'%s' must be a non-empty array", key);
        std::string body;
        size_t i = 0;
        for (const Value& sub : a->as_array(key)) {
          if (!body.empty()) body += " | ";
          body += visit(sub, path + "/" + key + "/" + std::to_string(i), hint + "-" + std::to_string(i));
          ++i;
        }
        return rule(hint, body);
      }
    }

    std::vector<std::string> types;
    if (const Value* t = s.find("type")) {
      if (t->is_string()) {
        types.push_back(t->as_string("type"));
      } else if (t->is_array() && !t->as_array("type").empty()) {
        for (const Value& x : t->as_array("type")) {
          if (!x.is_string()) error(path + "/type", "'type' must be a string or an array of strings");
          types.push_back(x.as_string("type"));
        }
      } else {
        error(path + "/type", "'type' must be a string or an array of strings");
      }
    } else if (s.find("properties") || s.find("required") || s.find("additionalProperties")) {
      types.push_back("object");
    } else if (s.find("items") || s.find("minItems") || s.find("maxItems")) {
      types.push_back("array");
    } else if (s.find("minLength") || s.find("maxLength") || s.find("pattern") || s.find("format")) {
      types.push_back("string");
    } else {
      return prim("value");
    }
    std::string body;
    for (const std::string& t : types) {
      std::string alt;
      if (t == "object") alt = visit_object(s, path, hint);
      else if (t == "array") alt = visit_array(s, path, hint);
      else if (t == "string") alt = visit_string(s, path, hint);
      else if (t == "number") alt = prim("number");
      else if (t == "integer") alt = prim("integer");
      else if (t == "boolean") alt = prim("boolean");
      else if (t == "null") alt = prim("null");
      else error(path + "/type", "unknown type '%.64s'", t.c_str());
      if (!body.empty()) body += " | ";
      body += alt;
    }
    return types.size() == 1 ? body : rule(hint, body);
  }

  std::string visit_ref(const Value& ref, const std::string& path) {
    if (!ref.is_string()) error(path, "'$ref' must be a string");
    const std::string& r = ref.as_string("$ref");
    auto it = ref_rules_.find(r);
    if (it != ref_rules_.end()) return it->second;
    const Value* target = nullptr;
    std::string name;
    if (r == "#") {
      target = &root_;
      name = "root";
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (r.compare(0, p.size(), p) != 0) continue;
        std::string key;
        const std::string rest = r.substr(p.size());
        for (size_t i = 0; i < rest.size(); ++i) {
          if (rest[i] == '/') error(path, "unsupported $ref '%.64s' (only #/$defs/<name> and #/definitions/<name>)", r.c_str());
          if (rest[i] == '~' && i + 1 < rest.size() && (rest[i + 1] == '0' || rest[i + 1] == '1')) {
            key += rest[i + 1] == '0' ? '~' : '/';
            ++i;
          } else {
            key += rest[i];
          }
        }
        const Value* defs = root_.find(p == "#/$defs/" ? "$defs" : "definitions");
        if (defs) target = defs->find(key);
        name = key;
        break;
      }
    }
    if (!target) error(path, "unsupported or unresolved $ref '%.64s'", r.c_str());
    if (r == "#") {
      // The root rule itself.
      ref_rules_[r] = "root";
      return "root";
    }
    if (++ref_depth_ > kMaxRefDepth) error(path, "$ref chain deeper than %d", kMaxRefDepth);
    const std::string rname = unique_name("ref-" + name);
    ref_rules_[r] = rname;
    const std::string def_path = (r.compare(0, 8, "#/$defs/") == 0 ? "/$defs/" : "/definitions/") + pointer_escape(name);
    const std::string body = visit(*target, def_path, rname);
    rules_.push_back({rname, body});
    --ref_depth_;
    return rname;
  }

  int64_t get_count(const Value& s, const char* key, const std::string& path, int64_t def) {
    const Value* v = s.find(key);
    if (!v) return def;
    if (!v->is_int() || v->as_int(key) < 0) error(path + "/" + key, "'%s' must be a non-negative integer", key);
    if (v->as_int(key) > kMaxCount) error(path + "/" + key, "'%s' over %lld is unsupported", key, (long long)kMaxCount);
    return v->as_int(key);
  }

  std::string visit_array(const Value& s, const std::string& path, const std::string& hint) {
    std::string item = prim("value");
    if (const Value* it = s.find("items")) item = visit(*it, path + "/items", hint + "-item");
    const int64_t lo = get_count(s, "minItems", path, 0);
    const int64_t hi = get_count(s, "maxItems", path, -1);
    if (hi >= 0 && hi < lo) error(path, "maxItems is below minItems");
    const std::string sp = prim("space");
    const std::string next = "\",\" " + sp + " " + item;
    std::string body = "\"[\" " + sp + " ";
    if (hi == 0) {
      // nothing
    } else if (lo == 0) {
      body += "(" + item + " (" + next + ")" + (hi < 0 ? "*" : "{0," + std::to_string(hi - 1) + "}") + ")?";
    } else {
      body += item + " (" + next + "){" + std::to_string(lo - 1) + "," + (hi < 0 ? "" : std::to_string(hi - 1)) + "}";
    }
    body += " \"]\" " + sp;
    return rule(hint, body);
  }

  std::string visit_string(const Value& s, const std::string& path, const std::string& hint) {
    const int64_t lo = get_count(s, "minLength", path, 0);
    const int64_t hi = get_count(s, "maxLength", path, -1);
    if (hi >= 0 && hi < lo) error(path, "maxLength is below minLength");
    const bool lengths = s.find("minLength") || s.find("maxLength");
    const std::string q = "\"\\\"\"";
    const std::string sp = prim("space");
    if (const Value* p = s.find("pattern")) {
      if (!p->is_string()) error(path + "/pattern", "'pattern' must be a string");
      if (lengths) error(path, "unsupported: 'pattern' together with minLength/maxLength");
      return rule(hint, q + " " + regex_to_gbnf(p->as_string("pattern"), path + "/pattern") + " " + q + " " + sp);
    }
    if (const Value* f = s.find("format")) {
      if (!f->is_string()) error(path + "/format", "'format' must be a string");
      const std::string& fmt = f->as_string("format");
      const std::string date = R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))";
      const std::string time =
          R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]+)? ([Zz] | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
      std::string g;
      if (fmt == "date") g = date;
      else if (fmt == "time") g = time;
      else if (fmt == "date-time") g = date + " [Tt] " + time;
      else if (fmt == "uuid")
        g = R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})";
      if (!g.empty()) {
        if (lengths) error(path, "unsupported: 'format' %s together with minLength/maxLength", fmt.c_str());
        return rule(hint, q + " " + g + " " + q + " " + sp);
      }
      // Other formats are annotations (JSON Schema 2020-12 default): any string.
    }
    if (!lengths) return prim("string");
    const std::string c = prim("char");
    return rule(hint, q + " " + c + "{" + std::to_string(lo) + "," + (hi < 0 ? "" : std::to_string(hi)) + "} " + q + " " + sp);
  }

  // Keys of extra properties: any JSON string without escapes that is not one
  // of `names` (a trie of the names, each node saying where to leave it).
  std::string key_not_in(const std::vector<std::string>& names, const std::string& hint) {
    const std::string plain = R"([^"\\\x7F\x00-\x1F])";
    const std::string tail = "(" + plain + ")*";
    // Code points of each name (names are valid UTF-8).
    std::vector<std::vector<uint32_t>> cps;
    for (const std::string& n : names) {
      std::vector<uint32_t> v;
      for (size_t i = 0; i < n.size();) {
        const unsigned char c = static_cast<unsigned char>(n[i]);
        size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (size_t k = 1; k < len && i + k < n.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(n[i + k]) & 0x3F);
        v.push_back(cp);
        i += len;
      }
      if (v.size() > kMaxKeyTrieName)
        error(path_, "property name over %zu characters with additional properties allowed (unsupported)", kMaxKeyTrieName);
      cps.push_back(v);
    }
    // Recursive over prefixes; a name with a control/quote/backslash char can
    // never be written without escapes, so it needs no exclusion past that char.
    std::function<std::string(const std::vector<uint32_t>&)> node = [&](const std::vector<uint32_t>& prefix) {
      std::set<uint32_t> next;
      bool is_name = false;
      for (const auto& v : cps) {
        if (v.size() < prefix.size() || !std::equal(prefix.begin(), prefix.end(), v.begin())) continue;
        if (v.size() == prefix.size()) is_name = true;
        else next.insert(v[prefix.size()]);
      }
      std::vector<std::string> alts;
      if (!is_name) alts.push_back("\"\\\"\"");
      std::string cls = "[^\"\\\\\\x7F\\x00-\\x1F";
      for (uint32_t c : next) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\U%08X", c);
        cls += buf;
      }
      cls += "]";
      alts.push_back(cls + " " + tail + " \"\\\"\"");
      for (uint32_t c : next) {
        if (c < 0x20 || c == '"' || c == '\\' || c == 0x7F) continue;
        std::vector<uint32_t> p2 = prefix;
        p2.push_back(c);
        char buf[16];
        std::snprintf(buf, sizeof buf, "[\\U%08X]", c);
        alts.push_back(std::string(buf) + " " + node(p2));
      }
      std::string body;
      for (const std::string& a : alts) body += (body.empty() ? "" : " | ") + a;
      return rule(hint + "-key", body);
    };
    return "\"\\\"\" " + node({}) + " " + prim("space");
  }

  std::string visit_object(const Value& s, const std::string& path, const std::string& hint) {
    std::vector<std::pair<std::string, const Value*>> props;
    if (const Value* p = s.find("properties")) {
      if (!p->is_object()) error(path + "/properties", "'properties' must be an object");
      for (const auto& kv : p->as_object("properties")) props.push_back({kv.first, &kv.second});
    }
    std::set<std::string> required;
    if (const Value* r = s.find("required")) {
      if (!r->is_array()) error(path + "/required", "'required' must be an array of strings");
      for (const Value& x : r->as_array("required")) {
        if (!x.is_string()) error(path + "/required", "'required' must be an array of strings");
        const std::string& name = x.as_string("required");
        bool found = false;
        for (const auto& p : props) found = found || p.first == name;
        if (!found) error(path + "/required", "required property '%.64s' is not in 'properties' (unsupported)", name.c_str());
        required.insert(name);
      }
    }
    const std::string sp = prim("space");
    // Extra properties.
    std::string extra_kv;
    const Value* ap = s.find("additionalProperties");
    if (!ap || !ap->is_bool() || ap->as_bool("additionalProperties")) {
      std::string value = prim("value");
      if (ap && !ap->is_bool()) value = visit(*ap, path + "/additionalProperties", hint + "-additional");
      std::vector<std::string> names;
      for (const auto& p : props) names.push_back(p.first);
      path_ = path;
      const std::string key = props.empty() ? prim("string") : key_not_in(names, hint);
      extra_kv = rule(hint + "-extra-kv", key + " \":\" " + sp + " " + value);
    }
    const size_t n = props.size();
    std::vector<std::string> kv(n);
    for (size_t i = 0; i < n; ++i) {
      const std::string v = visit(*props[i].second, path + "/properties/" + pointer_escape(props[i].first),
                                  hint + "-" + props[i].first);
      kv[i] = rule(hint + "-" + props[i].first + "-kv", gbnf_literal(json_quote(props[i].first)) + " " + sp +
                                                              " \":\" " + sp + " " + v);
    }
    // rest(i): properties i.. after at least one was written; first(i): none written yet.
    std::string rest = extra_kv.empty() ? "" : rule(hint + "-extras", "(\",\" " + sp + " " + extra_kv + ")*");
    std::string first = extra_kv.empty() ? "" : rule(hint + "-extras-first", "(" + extra_kv + " (\",\" " + sp + " " + extra_kv + ")*)?");
    for (size_t i = n; i-- > 0;) {
      const bool req = required.count(props[i].first) != 0;
      const std::string tail = rest.empty() ? "" : " " + rest;
      std::string new_first;
      if (req) {
        new_first = rule(hint + "-first", kv[i] + tail);
      } else {
        new_first = rule(hint + "-first", kv[i] + tail + " | " + (first.empty() ? "\"\"" : first));
      }
      std::string new_rest;
      if (req)
        new_rest = rule(hint + "-rest", "\",\" " + sp + " " + kv[i] + tail);
      else
        new_rest = rule(hint + "-rest", "(\",\" " + sp + " " + kv[i] + ")?" + tail);
      first = new_first;
      rest = new_rest;
    }
    return rule(hint, "\"{\" " + sp + (first.empty() ? "" : " " + first) + " \"}\" " + sp);
  }

  // ---- regex subset -> GBNF over the characters of a JSON string ----------
  std::string regex_to_gbnf(const std::string& re, const std::string& path) {
    re_ = &re;
    re_path_ = path;
    ri_ = 0;
    re_depth_ = 0;
    bool start_anchor = false, end_anchor = false;
    size_t end = re.size();
    if (!re.empty() && re[0] == '^') {
      start_anchor = true;
      ri_ = 1;
    }
    if (end > ri_ && re[end - 1] == '$') {
      size_t bs = 0;
      for (size_t k = end - 1; k > ri_ && re[k - 1] == '\\'; --k) ++bs;
      if (bs % 2 == 0) {
        end_anchor = true;
        --end;
      }
    }
    re_end_ = end;
    const std::string body = re_alt();
    if (ri_ != re_end_) re_error("unexpected ')'");
    const std::string any = prim("char") + "*";
    return (start_anchor ? "" : any + " ") + "(" + body + ")" + (end_anchor ? "" : " " + any);
  }

  [[noreturn]] void re_error(const char* what) {
    error(re_path_, "pattern: %s at offset %zu (supported: literals, classes, groups, |, ? * + {m,n}, ^ and $ at the ends)",
          what, ri_);
  }

  bool re_more() const { return ri_ < re_end_; }
  char re_peek() const { return re_more() ? (*re_)[ri_] : '\0'; }

  uint32_t re_utf8() {
    const std::string& s = *re_;
    const unsigned char c = static_cast<unsigned char>(s[ri_]);
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len && ri_ + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[ri_ + k]) & 0x3F);
    ri_ += len;
    return cp;
  }

  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

  static Ranges negate(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    uint32_t next = 0;
    for (const auto& p : r) {
      if (p.first > next) out.push_back({next, p.first - 1});
      next = std::max(next, p.second + 1);
    }
    if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
    return out;
  }

  // Class escapes (\d \w \s and negations); false if `e` is not one.
  static bool class_escape(char e, Ranges& out) {
    Ranges r;
    const char lower = char(e | 0x20);
    if (lower == 'd') r = {{'0', '9'}};
    else if (lower == 'w') r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    else if (lower == 's') r = {{'\t', '\r'}, {' ', ' '}};
    else return false;
    if (e >= 'A' && e <= 'Z') r = negate(r);
    out.insert(out.end(), r.begin(), r.end());
    return true;
  }

  // One escaped code point (after the backslash); ~0u if not a single-char escape.
  uint32_t re_escape_char(char e) {
    switch (e) {
      case 't': return '\t';
      case 'n': return '\n';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'x': case 'u': {
        const size_t n = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (size_t k = 0; k < n; ++k) {
          const char c = re_peek();
          int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
          if (d < 0) re_error("bad hex escape");
          v = v * 16 + uint32_t(d);
          ++ri_;
        }
        return v;
      }
      default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) re_error("unsupported escape");
        return uint32_t(static_cast<unsigned char>(e));
    }
  }

  // A set of code points as GBNF producing their JSON string encodings.
  static std::string ranges_to_gbnf(Ranges r) {
    std::sort(r.begin(), r.end());
    auto has = [&](uint32_t c) {
      for (const auto& p : r)
        if (p.first <= c && c <= p.second) return true;
      return false;
    };
    std::vector<std::string> alts;
    std::string cls = "[";
    for (const auto& p : r) {
      // Plain characters only: drop controls, '"', '\\' and DEL.
      uint32_t a = p.first, b = p.second;
      auto add = [&](uint32_t x, uint32_t y) {
        if (x > y) return;
        char buf[32];
        if (x == y) std::snprintf(buf, sizeof buf, "\\U%08X", x);
        else std::snprintf(buf, sizeof buf, "\\U%08X-\\U%08X", x, y);
        cls += buf;
      };
      if (b < 0x20) continue;
      a = std::max<uint32_t>(a, 0x20);
      const uint32_t cuts[] = {'"', '\\', 0x7F};
      for (uint32_t cut : cuts) {
        if (a <= cut && cut <= b) {
          add(a, cut - 1);
          a = cut + 1;
        }
      }
      add(a, b);
    }
    cls += "]";
    if (cls != "[]") alts.push_back(cls);
    const std::pair<uint32_t, const char*> esc[] = {{'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'\n', "\"\\\\n\""},
                                                    {'\t', "\"\\\\t\""}, {'\r', "\"\\\\r\""}};
    for (const auto& e : esc)
      if (has(e.first)) alts.push_back(e.second);
    if (alts.empty()) return "[^\\x00-\\U0010FFFF]";  // matches nothing
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
    return out + ")";
  }

  std::string re_alt() {
    std::string out = re_seq();
    while (re_peek() == '|') {
      ++ri_;
      out += " | " + re_seq();
    }
    return out;
  }

  std::string re_seq() {
    std::string out;
    while (re_more() && re_peek() != '|' && re_peek() != ')') {
      std::string atom = re_atom();
      // Quantifiers.
      for (;;) {
        const char q = re_peek();
        if (q == '*' || q == '+' || q == '?') {
          ++ri_;
          atom = "(" + atom + ")" + q;
        } else if (q == '{') {
          const size_t save = ri_;
          ++ri_;
          std::string lo, hi;
          bool comma = false;
          while (re_peek() >= '0' && re_peek() <= '9') lo += (*re_)[ri_++];
          if (re_peek() == ',') {
            comma = true;
            ++ri_;
            while (re_peek() >= '0' && re_peek() <= '9') hi += (*re_)[ri_++];
          }
          if (re_peek() != '}' || lo.empty() || lo.size() > 5 || hi.size() > 5) {
            ri_ = save;  // a literal '{'
            break;
          }
          ++ri_;
          if (!hi.empty() && std::stol(hi) < std::stol(lo)) re_error("repetition {m,n} with n < m");
          atom = "(" + atom + "){" + lo + (comma ? "," + hi : "") + "}";
        } else {
          break;
        }
        if (re_peek() == '?') ++ri_;  // lazy: the same language
        if (re_peek() == '+') re_error("possessive quantifiers are unsupported");
      }
      out += (out.empty() ? "" : " ") + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string re_atom() {
    const char c = re_peek();
    if (c == '(') {
      ++ri_;
      if (re_peek() == '?') {
        if (ri_ + 1 < re_end_ && (*re_)[ri_ + 1] == ':') ri_ += 2;
        else re_error("lookaround and named groups are unsupported");
      }
      if (++re_depth_ > kMaxRegexNesting) re_error("groups nested too deep");
      const std::string inner = re_alt();
      --re_depth_;
      if (re_peek() != ')') re_error("missing ')'");
      ++ri_;
      return "(" + inner + ")";
    }
    if (c == '[') {
      ++ri_;
      bool neg = false;
      if (re_peek() == '^') {
        neg = true;
        ++ri_;
      }
      Ranges r;
      bool first = true;
      while (re_more() && (re_peek() != ']' || first)) {
        first = false;
        uint32_t a;
        if (re_peek() == '\\') {
          ++ri_;
          if (!re_more()) re_error("unterminated class");
          const char e = (*re_)[ri_++];
          if (class_escape(e, r)) continue;
          if (e == 'b') a = '\b';
          else a = re_escape_char(e);
        } else {
          a = re_utf8();
        }
        uint32_t b = a;
        if (re_peek() == '-' && ri_ + 1 < re_end_ && (*re_)[ri_ + 1] != ']') {
          ++ri_;
          if (re_peek() == '\\') {
            ++ri_;
            if (!re_more()) re_error("unterminated class");
            b = re_escape_char((*re_)[ri_++]);
          } else {
            b = re_utf8();
          }
          if (b < a) re_error("class range out of order");
        }
        r.push_back({a, b});
      }
      if (re_peek() != ']') re_error("unterminated class");
      ++ri_;
      return ranges_to_gbnf(neg ? negate(r) : r);
    }
    if (c == '.') {
      ++ri_;
      return ranges_to_gbnf(negate({{'\n', '\n'}, {'\r', '\r'}}));
    }
    if (c == '\\') {
      ++ri_;
      if (!re_more()) re_error("trailing backslash");
      const char e = (*re_)[ri_++];
      Ranges r;
      if (class_escape(e, r)) return ranges_to_gbnf(r);
      const uint32_t cp = re_escape_char(e);
      return ranges_to_gbnf({{cp, cp}});
    }
    if (c == '^' || c == '$') re_error("anchors are supported only at the ends");
    if (c == '*' || c == '+' || c == '?') re_error("quantifier without an item");
    const uint32_t cp = re_utf8();
    return ranges_to_gbnf({{cp, cp}});
  }

  const Value& root_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, std::string> by_body_;
  std::set<std::string> names_;
  std::set<std::string> prims_;
  std::map<std::string, std::string> ref_rules_;
  int ref_depth_ = 0;
  std::string path_;  // of the object whose extra-property keys are being built
  const std::string* re_ = nullptr;
  std::string re_path_;
  size_t ri_ = 0, re_end_ = 0;
  int re_depth_ = 0;
};

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema_json) {
  json::Value doc;
  try {
    json::ParseLimits limits;
    limits.max_depth = 64;
    limits.max_bytes = size_t(16) << 20;
    doc = json::parse(schema_json.data(), schema_json.size(), "json", limits);
  } catch (const Error& e) {
    // "json: <what> at byte N" -> line and column.
    std::string msg = e.what();
    size_t off = schema_json.size();
    const size_t at = msg.rfind(" at byte ");
    if (at != std::string::npos) {
      off = std::min<size_t>(std::strtoull(msg.c_str() + at + 9, nullptr, 10), schema_json.size());
      msg.resize(at);
    }
    if (msg.compare(0, 6, "json: ") == 0) msg = msg.substr(6);
    size_t line = 1, col = 1;
    for (size_t k = 0; k < off; ++k) {
      if (schema_json[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail(LLM_ERR_INVALID_ARGUMENT, "json schema: line %zu, column %zu: %s", line, col, msg.c_str());
  }
  std::string gbnf;
  try {
    gbnf = Converter(doc).run();
  } catch (const Error& e) {
    if (e.status() == LLM_ERR_INVALID_ARGUMENT) throw;
    fail(LLM_ERR_INVALID_ARGUMENT, "json schema: %s", e.what());  // a wrong-typed member (LLM_ERR_FORMAT)
  }
  // The schema may still describe an impossible grammar (a $ref cycle that
  // consumes nothing): report it as a schema error.
  try {
    parse_gbnf(gbnf);
  } catch (const Error& e) {
    fail(LLM_ERR_INVALID_ARGUMENT, "json schema: unsupported schema (%s)", e.what());
  }
  return gbnf;
}

}  // namespace llm::grammar
