// JSON Schema -> GBNF: for each schema, hand-checked instances that validate
// (accepted) and that do not (rejected); errors for bad JSON and unsupported
// keywords.
#include "grammar_test_util.h"

namespace llm::grammar::test {
namespace {

std::string schema_error(const std::string& schema) {
  try {
    json_schema_to_gbnf(schema);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), LLM_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

struct SchemaCase {
  const char* name;
  std::string schema;
  std::vector<std::string> valid, invalid;
};

std::vector<SchemaCase> cases() {
  return {
      {"nested_objects",
       R"({"type": "object",
           "properties": {
             "name": {"type": "string"},
             "age": {"type": "integer"},
             "address": {"type": "object",
                         "properties": {"city": {"type": "string"}, "zip": {"type": "string", "minLength": 5, "maxLength": 5}},
                         "required": ["city"], "additionalProperties": false}},
           "required": ["name", "address"], "additionalProperties": false})",
       {R"({"name": "Ada", "address": {"city": "London"}})",
        R"({"name": "Ada", "age": 36, "address": {"city": "London", "zip": "N1 9G"}})",
        "{\n  \"name\": \"A\\\"d\\u00e9\",\n  \"age\": -7,\n  \"address\": {\"city\": \"\"}\n}"},
       {R"({"address": {"city": "London"}})",                        // missing required
        R"({"name": "Ada"})",                                        // missing required
        R"({"address": {"city": "London"}, "name": "Ada"})",         // order kept
        R"({"name": "Ada", "age": 1.5, "address": {"city": "L"}})",  // not an integer
        R"({"name": "Ada", "address": {"city": "L", "zip": "123"}})",  // too short
        R"({"name": "Ada", "address": {"city": "L"}, "x": 1})",      // additionalProperties false
        R"({"name": "Ada", "address": {"city": "L", "country": "UK"}})",
        R"({"name": "Ada" "address": {"city": "L"}})"}},
      {"arrays",
       R"({"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3})",
       {"[1, 2]", "[1.5, -2e3, 0]", "[ 0,1 ]", "[1e99, -2.5E-07]"},
       // exponents of 3 digits could leave the range of a double (10e+1000)
       {"[]", "[1]", "[1, 2, 3, 4]", "[1, \"2\"]", "[1,, 2]", "[01, 2]", "[1e100, 2]", "[10e+1000, 1]"}},
      {"enum_const",
       R"({"type": "object", "properties": {
             "color": {"enum": ["red", "green", null, 42, {"a": [1]}]},
             "v": {"const": "fixed"}},
           "required": ["color", "v"], "additionalProperties": false})",
       {R"({"color": "red", "v": "fixed"})", R"({"color": null, "v": "fixed"})",
        R"({"color": 42, "v": "fixed"})", R"({"color": {"a":[1]}, "v": "fixed"})"},
       {R"({"color": "blue", "v": "fixed"})", R"({"color": "red", "v": "other"})", R"({"color": 4, "v": "fixed"})"}},
      {"any_of_and_type_arrays",
       R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "boolean"}}, {"type": ["integer", "null"]}]})",
       {R"("abc")", "[true, false]", "[]", "12", "null"},
       {R"("abcd")", "[1]", "1.5", "{}", "true"}},
      {"patterns",
       R"({"type": "object", "properties": {
             "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,4}$"},
             "word": {"type": "string", "pattern": "^(cat|dog)s?$"},
             "has": {"type": "string", "pattern": "ab+c"}},
           "additionalProperties": false})",
       {R"({"code": "AB-123"})", R"({"code": "ZZ-0000", "word": "dogs"})", R"({"word": "cat", "has": "xxabbbcyy"})",
        R"({"has": "abc"})"},
       {R"({"code": "A-123"})", R"({"code": "AB-12"})", R"({"code": "AB-12345"})", R"({"word": "cow"})",
        R"({"word": "catss"})", R"({"has": "ac"})"}},
      {"defs_and_recursion",
       R"({"$defs": {"node": {"type": "object",
                               "properties": {"value": {"type": "integer"},
                                              "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                               "required": ["value"], "additionalProperties": false}},
           "$ref": "#/$defs/node"})",
       {R"({"value": 1})", R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]})"},
       {R"({"children": []})", R"({"value": 1, "children": [{"v": 2}]})"}},
      {"definitions_and_formats",
       R"({"type": "object", "properties": {
             "id": {"$ref": "#/definitions/uuid"},
             "day": {"type": "string", "format": "date"},
             "at": {"type": "string", "format": "date-time"},
             "t": {"type": "string", "format": "time"}},
           "required": ["id"],
           "definitions": {"uuid": {"type": "string", "format": "uuid"}}})",
       {R"({"id": "123e4567-e89b-12d3-a456-426614174000"})",
        R"({"id": "123e4567-e89b-12d3-a456-426614174000", "day": "2024-02-29", "at": "2024-01-01T10:20:30.5Z", "t": "23:59:59+02:00"})"},
       {R"({"id": "123e4567-e89b-12d3-a456-42661417400"})", R"({"id": "123e4567-e89b-12d3-a456-426614174000", "day": "2024-13-01"})",
        R"({"id": "123e4567-e89b-12d3-a456-426614174000", "t": "24:00:00Z"})"}},
      {"additional_properties",
       R"({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"}}, "required": ["a"]})",
       {R"({"a": 1})", R"({"a": 1, "ab": "x"})", R"({"a": 1, "b": [1, {}], "abc": null})", R"({"a": 1, "ab": "x", "": 1})"},
       {R"({"a": "1"})", R"({"a": 1, "ab": 2})", R"({"b": 1})", R"({"a": 1, "a": 2})"}},
      {"additional_properties_schema",
       R"({"type": "object", "additionalProperties": {"type": "integer"}})",
       {"{}", R"({"x": 1, "y": 2})"},
       {R"({"x": "1"})"}},
      {"enum_with_type",
       R"({"type": "object", "properties": {"e": {"type": "string", "enum": ["a", 1, "b"]}, "n": {"type": ["integer", "null"], "enum": [1, 1.5, null, "x"]}},
           "additionalProperties": false})",
       {R"({"e": "a"})", R"({"e": "b", "n": 1})", R"({"n": null})"},
       {R"({"e": 1})", R"({"n": 1.5})", R"({"n": "x"})"}},
      {"primitives",
       R"({"type": "object", "properties": {"b": {"type": "boolean"}, "n": {"type": "null"}, "any": {}, "t": true},
           "required": ["b", "n", "any", "t"], "additionalProperties": false})",
       {R"({"b": true, "n": null, "any": [1, "x"], "t": {"z": false}})"},
       {R"({"b": 1, "n": null, "any": 1, "t": 1})", R"({"b": true, "n": 0, "any": 1, "t": 1})"}},
  };
}

TEST(JsonSchema, ValidAcceptedInvalidRejected) {
  for (const SchemaCase& c : cases()) {
    SCOPED_TRACE(c.name);
    std::string gbnf;
    ASSERT_NO_THROW(gbnf = json_schema_to_gbnf(c.schema));
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = parse_gbnf(gbnf)) << gbnf;
    for (const std::string& s : c.valid) EXPECT_TRUE(accepts(g, s)) << s << "\n" << gbnf;
    for (const std::string& s : c.invalid) EXPECT_FALSE(accepts(g, s)) << s << "\n" << gbnf;
  }
}

TEST(JsonSchema, WhitespaceIsLimited) {
  auto g = parse_gbnf(json_schema_to_gbnf(R"({"type": "array", "items": {"type": "integer"}})"));
  EXPECT_TRUE(accepts(g, "[1, 2]"));
  EXPECT_TRUE(accepts(g, "[\n  1,\n  2\n]"));
  EXPECT_FALSE(accepts(g, "[1,  2]"));                     // two spaces
  EXPECT_FALSE(accepts(g, "[1," + std::string(30, ' ') + "2]"));
  EXPECT_FALSE(accepts(g, "[\n" + std::string(25, ' ') + "1]"));  // indentation over 20
}

TEST(JsonSchema, Errors) {
  EXPECT_EQ(schema_error("{\"type\": \"object\",\n  \"x\": }"), "json schema: line 2, column 8: unexpected character");
  EXPECT_EQ(schema_error(R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": 3}}})"),
            "json schema: at /properties/x: unsupported keyword 'minimum'");
  EXPECT_EQ(schema_error(R"({"allOf": [{}]})"), "json schema: at /: unsupported keyword 'allOf'");
  EXPECT_EQ(schema_error(R"({"type": "strin"})"), "json schema: at /type: unknown type 'strin'");
  EXPECT_EQ(schema_error(R"({"$ref": "http://example.com/s"})"),
            "json schema: at /$ref: unsupported or unresolved $ref 'http://example.com/s'");
  EXPECT_EQ(schema_error(R"({"$ref": "#/$defs/missing"})"),
            "json schema: at /$ref: unsupported or unresolved $ref '#/$defs/missing'");
  EXPECT_EQ(schema_error(R"({"type": "array", "prefixItems": []})"), "json schema: at /: unsupported keyword 'prefixItems'");
  EXPECT_EQ(schema_error(R"({"type": "array", "uniqueItems": true})"),
            "json schema: at /uniqueItems: unsupported keyword 'uniqueItems' (only false)");
  EXPECT_EQ(schema_error(R"({"type": "object", "required": ["a"]})"),
            "json schema: at /required: required property 'a' is not in 'properties' (unsupported)");
  EXPECT_EQ(schema_error(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "json schema: at /: maxItems is below minItems");
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": "(?=a)b"})").find("lookaround"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": "a^b"})").find("anchors are supported only at the ends"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": "(a)\\1"})").find("unsupported escape"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})").find("can never complete"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": ")" + std::string(100, '(') + "\"}").find("nested too deep"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "object", "properties": {")" + std::string(300, 'k') + R"(": {}}})")
                .find("property name over 256 characters"),
            std::string::npos);
  EXPECT_EQ(schema_error(R"({"type": "string", "enum": [1, 2]})"), "json schema: at /enum: no 'enum' value has the schema's type");
  EXPECT_EQ(schema_error(R"({"type": "integer", "const": "1"})"),
            "json schema: at /const: the 'const' value does not have the schema's type");
  EXPECT_EQ(schema_error("false"), "json schema: at /: the schema 'false' (nothing validates) is unsupported");
  // Descriptive keywords are ignored.
  EXPECT_EQ(schema_error(R"({"title": "t", "description": "d", "examples": [1], "$schema": "x", "type": "integer"})"), "");
}

}  // namespace
}  // namespace llm::grammar::test
