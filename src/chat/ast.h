// Syntax tree of a compiled chat template (parse.cpp builds it, render.cpp
// runs it). Internal to src/chat/.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace llm::chat::detail {

enum class Op : uint8_t {
  Add, Sub, Mul, Div, FloorDiv, Mod, Pow, Concat,  // arithmetic, ~
  Eq, Ne, Lt, Le, Gt, Ge, In, NotIn,               // comparisons
  Neg, Pos,                                         // unary
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind : uint8_t {
    Literal,  // value
    Name,     // name
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]] (null parts omitted)
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs); args[0] null in a filter block
    Test,     // args[0] is [not] name(args[1..])
    Unary,    // op args[0]
    Binary,   // args[0] op args[1]
    And, Or,  // args[0] and/or args[1]
    Not,      // not args[0]
    Cond,     // args[0] if args[1] else args[2] (null: undefined)
    ListLit, TupleLit,  // args
    DictLit,  // args = key, value, key, value...
  };
  Kind kind;
  Op op = Op::Add;
  bool negated = false;  // Test: "is not"
  Pos pos;
  std::string name;
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;

  Expr(Kind k, Pos p) : kind(k), pos(p) {}
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum Kind : uint8_t {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches; else_body
    For,          // targets in expr [if cond]: body; else_body
    Set,          // targets = expr; or ns.attr = expr (attr non-empty)
    SetBlock,     // {% set targets[0] %}body{% endset %}, filter (may be null)
    Macro,        // name(params) body
    FilterBlock,  // {% filter f %}body{% endfilter %}: filter->args[0] is null
    Break,
    Continue,
    Scope,        // body as is ({% generation %})
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;    // For: loop filter
  ExprPtr filter;  // SetBlock, FilterBlock
  std::vector<std::string> targets;
  std::string attr;  // Set: namespace attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name, default (may be null)

  Stmt(Kind k, Pos p) : kind(k), pos(p) {}
};

struct Program {
  Body body;
};

// parse.cpp: source -> Program; throws llm::Error with line and column.
std::unique_ptr<Program> parse_template(std::string_view source);

// Filters and tests the renderer knows; the parser refuses others at compile
// time, as jinja2 does.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace llm::chat::detail
