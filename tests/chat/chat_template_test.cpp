// Chat templates (src/chat/): the real templates of llama.cpp's
// models/templates against jinja2's own output (expected.json, written by
// tests/tools/make_chat_refs.py), each construct of the language, errors with
// their line and column, the bounds, the built-in templates and the rule that
// picks one.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "core/error.h"

namespace {

using llm::chat::Message;
using llm::chat::RenderOptions;
using llm::chat::Template;

const std::string kDir = std::string(LLM_TEST_DATA_DIR) + "/chat_templates/";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The conversation the language tests run over (make_chat_refs.py's "sys_multi").
std::vector<Message> sys_multi() {
  return {{"system", "Be brief.\nAnswer in English."},
          {"user", "Bonjour, \xc3\xa7" "a va ?"},
          {"assistant", "Yes, fine. \xe2\x98\x95"},
          {"user", "And now?"}};
}

RenderOptions options() {
  RenderOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.now_unix = 1721995200;  // 2024-07-26 12:00:00 UTC, as make_chat_refs.py
  return o;
}

std::string render(const std::string& src, const std::vector<Message>& msgs = sys_multi(),
                   const RenderOptions& o = options()) {
  return Template::compile(src)->render(msgs, o);
}

// The error a template gives (compile or render); "" when it renders.
std::string error_of(const std::string& src, const RenderOptions& o = options(), llm_status* status = nullptr) {
  try {
    render(src, sys_multi(), o);
  } catch (const llm::Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "";
}

// ---- the real templates ------------------------------------------------------------

TEST(ChatTemplates, RealTemplatesMatchJinja2) {
  const nlohmann::json j = nlohmann::json::parse(read_file(kDir + "expected.json"));
  std::map<std::string, std::vector<Message>> convs;
  for (const auto& [id, list] : j.at("conversations").items())
    for (const auto& m : list) convs[id].push_back({m.at("role"), m.at("content")});

  struct Tally {
    int cases = 0, identical = 0, rendered = 0;
    std::string first_problem;
  };
  std::map<std::string, Tally> by_template;
  std::map<std::string, std::shared_ptr<const Template>> compiled;
  std::map<std::string, std::string> compile_error;
  for (const auto& c : j.at("cases")) {
    const std::string name = c.at("template");
    Tally& t = by_template[name];
    ++t.cases;
    if (!compiled.count(name) && !compile_error.count(name)) {
      try {
        compiled[name] = Template::compile(read_file(kDir + name));
      } catch (const llm::Error& e) {
        compile_error[name] = e.what();
      }
    }
    RenderOptions o;
    o.bos_token = j.at("bos_token");
    o.eos_token = j.at("eos_token");
    o.now_unix = j.at("now_unix");
    o.add_generation_prompt = c.at("add_generation_prompt");
    std::string got, err;
    if (compile_error.count(name)) {
      err = compile_error[name];
    } else {
      try {
        got = compiled[name]->render(convs.at(c.at("conversation")), o);
      } catch (const llm::Error& e) {
        err = e.what();
        EXPECT_TRUE(e.status() == LLM_ERR_INVALID_ARGUMENT || e.status() == LLM_ERR_UNSUPPORTED) << err;
        EXPECT_EQ(err.rfind("chat template: line ", 0), 0u) << err;
      }
    }
    const std::string where = name + " / " + c.at("conversation").get<std::string>() +
                              (o.add_generation_prompt ? " / generation prompt" : "");
    if (c.contains("expected")) {
      const std::string want = c.at("expected");
      // Never a different string: anything but the exact text must be an error.
      if (err.empty()) {
        EXPECT_EQ(got, want) << where;
      }
      if (err.empty() && got == want) {
        ++t.identical;
        ++t.rendered;
      } else if (t.first_problem.empty()) {
        t.first_problem = err.empty() ? "different text" : err;
      }
    } else {
      // jinja2 fails here: so must we, and raise_exception's message must come through.
      EXPECT_FALSE(err.empty()) << where << " rendered but jinja2 raised " << c.at("error");
      const std::string jerr = c.at("error");
      const std::string prefix = "TemplateError: ";
      if (!err.empty() && jerr.rfind(prefix, 0) == 0) {
        EXPECT_NE(err.find(jerr.substr(prefix.size())), std::string::npos) << where << ": " << err;
      }
      if (!err.empty()) ++t.identical;
      else if (t.first_problem.empty()) t.first_problem = "rendered where jinja2 raised";
    }
  }
  int full = 0, full_rendering = 0;
  for (const auto& [name, t] : by_template) {
    if (t.identical == t.cases) {
      ++full;
      if (t.rendered > 0) ++full_rendering;
    } else {
      std::printf("  not supported: %s (%d/%d cases): %s\n", name.c_str(), t.identical, t.cases,
                  t.first_problem.c_str());
    }
  }
  std::printf("chat templates byte-identical to jinja2: %d of %zu (%d of them render text, the others raise "
              "as jinja2 does); %zu cases\n",
              full, by_template.size(), full_rendering, j.at("cases").size());
  EXPECT_GE(full, 50);
  EXPECT_GE(by_template.size(), 70u);
}

// ---- the language, construct by construct ---------------------------------------------
// Each expected string is jinja2 3.1's output for the same source and
// variables (transformers' environment, the sys_multi conversation);
// nullptr: jinja2 raises there, and so must we.
struct Case {
  const char* src;
  const char* expected;
};
const Case kCases[] = {
    {R"J({% for v in [1, 2] %}{% macro m() %}{{ v }}{% endmacro %}{{ m() }}{% endfor %})J",
     R"J(12)J"},
    {R"J({% macro m() %}[{{ late }}]{% endmacro %}{% set late = 'L' %}{{ m() }})J",
     R"J([L])J"},
    {R"J({% set early = 'E' %}{% macro m() %}[{{ early }}]{% endmacro %}{% set early = 'E2' %}{{ m() }})J",
     R"J([E2])J"},
    {R"J({% macro m(ns) %}{% set ns.x = ns.x + 1 %}{% endmacro %}{% set ns = namespace(x=1) %}{{ m(ns) }}{{ ns.x }})J",
     R"J(2)J"},
    {R"J({% macro outer() %}{% macro inner() %}in{% endmacro %}{{ inner() }}-{% endmacro %}{{ outer() }})J",
     R"J(in-)J"},
    {R"J({% macro m(a) %}{% set a = a + 1 %}{{ a }}{% endmacro %}{% set a = 10 %}{{ m(1) }}{{ a }})J",
     R"J(210)J"},
    {R"J({% if true %}{% set x = 'set in if' %}{% endif %}{{ x }})J",
     R"J(set in if)J"},
    {R"J({% for i in [1] %}{% macro m() %}{{ i }}{% endmacro %}{% endfor %}{{ m is defined }})J",
     R"J(False)J"},
    {R"J({% macro m(x) %}{{ x }}{% endmacro %}{{ m() }}|{{ m(none) }}|{{ m([1]) }})J",
     R"J(|None|[1])J"},
    {R"J({{ '%02d|%-4s|%.2f|%5.1f|%x' % (7, 'ab', 3.14159, 2.25, 255) }})J",
     R"J(07|ab  |3.14|  2.2|ff)J"},
    {R"J({{ '%s%%' % 5 }})J",
     R"J(5%)J"},
    {R"J({% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }})J",
     R"J(21)J"},
    {R"J({{ '%5s|%-5d|%+d|% d|%05.1f|%e|%g|%G|%o|%X|%c' % ('ab', 3, 4, 5, 2.5, 12345.678, 0.0001, 1e20, 8, 255, 65) }})J",
     R"J(   ab|3    |+4| 5|002.5|1.234568e+04|0.0001|1E+20|10|FF|A)J"},
    {R"J({{ '%.1s|%3.1s|%r' % ('xyz', 'xyz', 'q') }})J",
     R"J(x|  x|'q')J"},
    {R"J({% macro outer(a) %}{% macro inner() %}{{ a }}{% endmacro %}{{ inner() }}{% endmacro %}{{ outer('A') }})J",
     R"J(A)J"},
    {R"J({{ {'b': 'é☕😀', 'a': [1, 2]} | tojson(ensure_ascii=true) }})J",
     R"J({"b": "\u00e9\u2615\ud83d\ude00", "a": [1, 2]})J"},
    {R"J({{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true) }})J",
     R"J({"a": [1, 2], "b": 1})J"},
    {R"J({{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':')) }})J",
     R"J({"b":1,"a":[1,2]})J"},
    {R"J({{ {'b': 1, 'a': [1, {'c': 2}]} | tojson(indent=2, separators=(', ', ' = ')) }})J",
     R"J({
  "b" = 1, 
  "a" = [
    1, 
    {
      "c" = 2
    }
  ]
})J"},
    {R"J({{ 'x' | tojson(false, 2) }})J",
     R"J("x")J"},
    {R"J({% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %})J", R"J([])J"},
    {R"J({% set x = 0 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }})J", R"J([0][0]0)J"},
    {R"J({% for i in [1,2] %}{% set x = i %}{% endfor %}[{{ x }}])J", R"J([])J"},
    {R"J({{ 'a' + "b" ~ 1 ~ none ~ true }})J",
     R"J(ab1NoneTrue)J"},
    {R"J({{ 1 + 2 * 3 - 4 / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** 0.5 }})J",
     R"J(5.0|3|-4|1|2|1024|1.4142135623730951)J"},
    {R"J({{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 3 / 1 }}|{{ 10 / 4 }}|{{ 1_000 }})J",
     R"J(1.0|0.30000000000000004|1e+20|1.5e-07|3.0|2.5|1000)J"},
    {R"J({{ "x" * 3 }}|{{ 3 * "ab" }}|{{ [1, 2] * 2 }}|{{ [1] + [2, 'a'] }})J",
     R"J(xxx|ababab|[1, 2, 1, 2]|[1, 2, 'a'])J"},
    {R"J({{ 'it''s' }}|{{ "tab\there" }}|{{ 'uni\u00e9\x41' }}|{{ 'back\\slash' }}|{{ 'keep\d' }})J",
     R"J(its|tab	here|uniéA|back\slash|keep\d)J"},
    {R"J({{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }})J",
     R"J([1, 'a', None, True, 1.5, [2], {'k': 'v'}]|(1, 2)|(1,)|())J"},
    {R"J({{ {'a': 1, 'b': [1, 2], 3: 'x'} }}|{{ "q'uote" }}|{{ ['q"d', "s'"] }})J",
     R"J({'a': 1, 'b': [1, 2], 3: 'x'}|q'uote|['q"d', "s'"])J"},
    {R"J({% if 1 < 2 < 3 %}chain{% endif %}|{% if 3 > 2 > 5 %}bad{% else %}ok{% endif %})J",
     R"J(chain|ok)J"},
    {R"J({{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ [1, 2] == [1, 2] }}|{{ 'ab' < 'b' }}|{{ none == none }}|{{ true == 1 }})J",
     R"J(True|True|True|True|True|True)J"},
    {R"J({{ 'a' in 'cat' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'z' not in 'cat' }}|{{ 3 not in [1] }})J",
     R"J(True|True|True|True|True)J"},
    {R"J({{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ not 0 }}|{{ not [] }}|{{ none or [] }})J",
     R"J(x|b||True|True|[])J"},
    {R"J({{ 'yes' if true else 'no' }}|{{ 'yes' if false else 'no' }}|{{ 'x' if false }}|[{{ undefined_var }}])J",
     R"J(yes|no||[])J"},
    {R"J({% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})J",
     R"J(1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;)J"},
    {R"J({% for x in ['a', 'b', 'c'] %}{{ loop.previtem | default('^') }}{{ x }}{{ loop.nextitem | default('$') }} {% endfor %})J",
     R"J(^ab abc bc$ )J"},
    {R"J({% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %})J",
     R"J(empty|2242)J"},
    {R"J({% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %})J",
     R"J(a=1,b=2,|37)J"},
    {R"J({% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %})J",
     R"J(xy|h.é.l.l.o.)J"},
    {R"J({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %})J",
     R"J(0134)J"},
    {R"J({% for i in range(3) %}{{ loop.cycle('odd', 'even') }}{% endfor %}|{{ range(2, 10, 3) | list }}|{{ range(5, 0, -2) | list }})J",
     R"J(oddevenodd|[2, 5, 8]|[5, 3, 1])J"},
    {R"J({% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }})J",
     R"J(21)J"},
    {R"J({% set ns = namespace(found=false, n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.n }})J",
     R"J(True6)J"},
    {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = 1, 2 %}{{ t }})J",
     R"J(12|(1, 2))J"},
    {R"J({% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]|{% set up | upper %}shout{% endset %}{{ up }})J",
     R"J([inner 2]|SHOUT)J"},
    {R"J({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }}{{ greet('Al', punct='?') }}{{ greet(name='X') }})J",
     R"J(Hi Bob!Hi Al?Hi X!)J"},
    {R"J({% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }})J",
     R"J(321)J"},
    {R"J({% filter upper %}abc{{ 'd' }}{% endfilter %}|{%- filter trim -%}   padded   {%- endfilter %}|)J",
     R"J(ABCD|padded|)J"},
    {R"J({{ '  hi  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hello' | upper }}{{ 'Hello' | lower }}|{{ 'hello wORLD-foo (bar' | title }}|{{ 'hELLO world' | capitalize }})J",
     R"J(hi|hi|HELLOhello|Hello World-Foo (Bar|Hello world)J"},
    {R"J({{ 'aaa' | replace('a', 'b') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ [1, 'a'] | join('-') }}|{{ ['x', 'y'] | join }}|{{ [{'n': 'a'}, {'n': 'b'}] | join(',', attribute='n') }})J",
     R"J(bbb|bba|1-a|xy|a,b)J"},
    {R"J({{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}{{ 'abc' | first }}{{ 'abc' | last }}|{{ [] | first }}|{{ 'abc' | length }}{{ [1] | count }}{{ {'a': 1} | length }}{{ 'héllo' | length }})J",
     R"J(13ac||3115)J"},
    {R"J({{ undefined_thing | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ none | default('d') }}|{{ false | d('d', boolean=true) }})J",
     R"J(dflt||dflt|None|d)J"},
    {R"J({{ 3 | string }}{{ none | string }}{{ [1] | string }}|{{ '42' | int + 1 }}|{{ '4.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3.9 | int }}|{{ '2.5' | float }}|{{ 3 | float }}|{{ 'z' | float }})J",
     R"J(3None[1]|43|4|0|7|3|2.5|3.0|0.0)J"},
    {R"J({{ 'ab' | list }}|{{ {'a': 1} | list }}|{{ [{'a': 1}, {'a': 2}, {}] | map(attribute='a') | list }}|{{ [{'a': 1}, {}] | map(attribute='a', default=0) | list }}|{{ ['a', 'B'] | map('upper') | list }})J",
     R"J(['a', 'b']|['a']|[1, 2, Undefined]|[1, 0]|['A', 'B'])J"},
    {R"J({{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ [0, 1, '', 'a'] | select | list }}|{{ [1, 5, 3] | select('gt', 2) | list }}|{{ [1, 2] | select('equalto', 2) | list }})J",
     R"J([1, 3]|[2, 4]|[1, 'a']|[5, 3]|[2])J"},
    {R"J({{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|{{ messages | rejectattr('role', 'in', ['user', 'system']) | list | length }}|{{ messages | selectattr('role') | list | length }})J",
     R"J(['Bonjour, ça va ?', 'And now?']|1|4)J"},
    {R"J({{ {'b': 1, 'a': 2} | items | list }}|{{ {'b': 1, 'A': 2, 'c': 0} | dictsort }}|{{ {'b': 1, 'a': 2} | dictsort(by='value') }}|{{ {'b': 1, 'a': 2} | dictsort(reverse=true) }})J",
     R"J([('b', 1), ('a', 2)]|[('A', 2), ('b', 1), ('c', 0)]|[('b', 1), ('a', 2)]|[('b', 1), ('a', 2)])J"},
    {R"J({{ '<a href="x">&\'' | e }}|{{ '<b>' | escape }}|{{ '<b>' | safe }}|{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width=3, blank=true) }}|{{ 'x' | indent('>>', first=true) }})J",
     R"J(&lt;a href=&#34;x&#34;&gt;&amp;&#39;|&lt;b&gt;|<b>|a
  b

  c|  a
  b|a
   
   b|>>x)J"},
    {R"J({{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.567 | round(2) }}|{{ 2.1 | round(0, 'ceil') }}|{{ 2.9 | round(method='floor') }}|{{ -3 | abs }}|{{ -2.5 | abs }}|{{ 5 | round }})J",
     R"J(2.0|4.0|2.57|3.0|2.0|3|2.5|5)J"},
    {R"J({{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|{{ [3, 1] | sort(reverse=true) }}|{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }})J",
     R"J([1, 2, 3]|['A', 'b', 'c']|['A', 'b', 'c']|[3, 1]|[{'n': 1}, {'n': 2}])J"},
    {R"J({{ [1, 2, 1, 3, 2] | unique | list }}|{{ ['a', 'A', 'b'] | unique | list }}|{{ [1, 2, 3] | sum }}|{{ [{'v': 1}, {'v': 2}] | sum(attribute='v') }}|{{ [1, 2] | sum(start=10) }}|{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }}|{{ ['b', 'A'] | max }})J",
     R"J([1, 2, 3]|['a', 'b']|6|3|13|13|b)J"},
    {R"J({{ [1, 2, 3] | reverse | list }}|{{ 'abc' | reverse }}|{{ '%s-%d' | format('a', 3) }}|{{ '%s' % 'x' }}|{{ '%s+%s' % (1, 2) }}|{{ 'a b  c' | wordcount }})J",
     R"J([3, 2, 1]|cba|a-3|x|1+2|3)J"},
    {R"J({{ {'a': [1, {'b': 'é"\n'}], 'n': none, 't': true, 'f': 1.5} | tojson }}|{{ {'a': [1, {'b': 2}], 'e': [], 'd': {}} | tojson(indent=2) }}|{{ 'x' | tojson }}|{{ [] | tojson }})J",
     R"J({"a": [1, {"b": "é\"\n"}], "n": null, "t": true, "f": 1.5}|{
  "a": [
    1,
    {
      "b": 2
    }
  ],
  "e": [],
  "d": {}
}|"x"|[])J"},
    {R"J({{ '  a b  ' .strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ 'a  b c'.split(None, 1) }})J",
     R"J(a b|a|a|a|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a,b', 'c']|['a', 'b c'])J"},
    {R"J({{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}|{{ 'Hi There'.upper() }}{{ 'Hi There'.lower() }}{{ "they're bill's".title() }}{{ 'hELLO'.capitalize() }})J",
     R"J(TrueTrueTrue|HI THEREhi thereThey'Re Bill'SHello)J"},
    {R"J({{ 'a-b-c'.replace('-', '+') }}|{{ 'a-b-c'.replace('-', '', 1) }}|{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}{{ 'héllo'.find('l') }}|{{ 'banana'.count('a') }}|{{ ', '.join(['a', 'b']) }})J",
     R"J(a+b+c|ab-c|23-12|3|a, b)J"},
    {R"J({{ '{} and {}'.format('a', 'b') }}|{{ '{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='x') }}|{{ '{{literal}} {}'.format(1) }}|{{ '{!r}'.format('q') }})J",
     R"J(a and b|ba|x!|{literal} 1|'q')J"},
    {R"J({{ 'abc'.isdigit() }}{{ '123'.isdigit() }}{{ '  '.isspace() }}{{ 'abc'.isalpha() }}|{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'a\nb\r\nc'.splitlines() }})J",
     R"J(FalseTrueTrueTrue|x|['a', 'b', 'c'])J"},
    {R"J({% set d = {'a': 1, 'b': 2} %}{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 'dz') }}{{ d.keys() | list }}{{ d.values() | list }}{{ d['a'] }}{{ d.a }}{{ d['zz'] is defined }})J",
     R"J(1Nonedz['a', 'b'][1, 2]11False)J"},
    {R"J({% set l = [1, 2, 3, 4, 5] %}{{ l[0] }}{{ l[-1] }}{{ l[1:3] }}{{ l[:2] }}{{ l[3:] }}{{ l[::-1] }}{{ l[::2] }}{{ l[-2:] }}{{ l[10] is defined }}{{ l[1:-1] }}{{ l[5:1:-2] }})J",
     R"J(15[2, 3][1, 2][4, 5][5, 4, 3, 2, 1][1, 3, 5][4, 5]False[2, 3, 4][5, 3])J"},
    {R"J({% set s = 'héllo' %}{{ s[0] }}{{ s[1] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[:-1] }})J",
     R"J(héoélolléhhéll)J"},
    {R"J({{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ 'a' is number }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }})J",
     R"J(FalseTrueTrueTrueTrueTrueFalseTrueFalseTrueTrueFalseTrue)J"},
    {R"J({{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 'a' is not none }}{{ 1 is integer }}{{ 1.0 is float }}{{ 'ab' is lower }}{{ 'AB' is upper }})J",
     R"J(TrueFalseTrueFalseTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrue)J"},
    {R"J({{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages | length }}|{{ messages[1].content | tojson }}|{{ messages[0].missing is defined }}|{{ messages[0].missing | default('none') }})J",
     R"J(system|Be brief.
Answer in English.|4|"Bonjour, ça va ?"|False|none)J"},
    {R"J({{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|{{ tools is defined }}|{{ documents }}|{{ date_string is defined }}|{{ strftime_now('%Y-%m-%d %b %d') }})J",
     R"J(<s></s>|True|True|True|None|False|2024-07-26 Jul 26)J"},
    {R"J({% set lst = [] %}{% if lst %}nonempty{% else %}empty{% endif %}|{% if {} %}x{% else %}y{% endif %}|{% if 0.0 %}x{% else %}y{% endif %}|{% if 'a' %}t{% endif %})J",
     R"J(empty|y|y|t)J"},
    {R"J(  {% if true %}
    lstripped
  {% endif %}
  {%+ if true %}keep-indent{% endif +%}
after)J",
     R"J(    lstripped
  keep-indent
after)J"},
    {R"J({# a comment #}
{#- stripped comment -#}   x
{%- raw %} {{ not parsed }} {% endraw %})J",
     R"J(x {{ not parsed }} )J"},
    {R"J({{ -1 | abs }}|{{ - 2 ** 2 }}|{{ (1, 2)[0] }}|{{ [[1, 2], [3]][0][1] }}|{{ {'a': {'b': 'deep'}}.a.b }}|{{ 'abc'[1:] | upper }})J",
     R"J(1|4|1|2|deep|BC)J"},
    {R"J({% set f = 'x' ~ 'y' | upper %}{{ f }}|)J",
     R"J(xY|)J"},
    {R"J({{ 1 + 2 | string }})J",
     nullptr},
    {R"J({{ not true == false }}|{{ -3 | abs + 1 }})J",
     R"J(True|4)J"},
    {R"J({{ "%s" | format(none) }}|)J",
     R"J(None|)J"},
    {R"J({{ 1 ~ 2 + 3 }})J",
     nullptr},
    {R"J({{ 'a' ~ [1] }}|{{ 10 - 2 - 3 }}|{{ 2 ** 3 ** 2 }}|{{ 100 // 7 * 7 }})J",
     R"J(a[1]|5|64|98)J"},
    {R"J({{ 1.0 * 2 }}|{{ 7.0 // 2 }}|{{ 7.5 % 2 }}|{{ 1 / 3 }}|{{ 2 / 3 }}|{{ 1e16 }}|{{ 123456789012345678 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ 1e-4 * 3 }})J",
     R"J(2.0|3.0|1.5|0.3333333333333333|0.6666666666666666|1e+16|123456789012345678|0.0001|1e-05|-0.0|0.00030000000000000003)J"},
    {R"J({{ [1, [2, 3], 'x'] | tojson }}|{{ 12345.5 | tojson }}|{{ {"k": "\u00e9\u4e2d\U0001F600"} | tojson }}|{{ "ctrl\u0001\b\f" | tojson }}|{{ {'z': 1, 'a': 2} | tojson }})J",
     R"J([1, [2, 3], "x"]|12345.5|{"k": "é中😀"}|"ctrl\u0001\b\f"|{"z": 1, "a": 2})J"},
    {R"J({{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', '==', 'user') | list | count }}|{{ messages[1:] | map(attribute='role') | list }})J",
     R"J(system, user, assistant, user|2|['user', 'assistant', 'user'])J"},
    {R"J({% for m in messages %}{% if loop.first %}[{% endif %}{{ m.role[0] | upper }}{% if not loop.last %},{% else %}]{% endif %}{% endfor %})J",
     R"J([S,U,A,U])J"},
    {R"J({{ undefined_var.attr }})J",
     nullptr},
    {R"J({{ undefined_var + 1 }})J",
     nullptr},
    {R"J([{{ none.attr }}])J",
     R"J([])J"},
    {R"J([{{ messages[0].content.missing }}])J",
     R"J([])J"},
    {R"J({{ undefined_var | tojson }})J",
     nullptr},
    {R"J({{ 1 < 'a' }})J",
     nullptr},
    {R"J({{ raise_exception('boom') }})J",
     nullptr},
    {R"J({% for x in none %}{% endfor %})J",
     nullptr},
    {R"J([{{ [1][5] }}])J",
     R"J([])J"},
    {R"J({{ 'abc'.nonexistent() }})J",
     nullptr},
    {R"J({{ {'a': 1}.a.b.c }})J",
     nullptr},
    {R"J({{ 1 / 0 }})J",
     nullptr},
    {R"J({{ undefined_var | length }}|{{ undefined_var | trim }}|{{ undefined_var | upper }}|{% for x in undefined_var %}a{% else %}b{% endfor %})J",
     R"J(0|||b)J"},
    {R"J({{ 'a' in undefined_var }})J",
     R"J(False)J"},
    {R"J({{ undefined_var == undefined_var2 }}|{{ undefined_var is none }}|{{ undefined_var ~ 'x' }}|{{ loop }}|{% set x = undefined_var %}{{ x is defined }})J",
     R"J(True|False|x||False)J"},
    {R"J({{ undefined_var[0] }})J",
     nullptr},
    {R"J({{ 'x'.split('') }})J",
     nullptr},
    {R"J({{ '%d' % 'x' }})J",
     nullptr},
    {R"J({% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }})J",
     nullptr},
    {R"J({% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }})J",
     nullptr},
    {R"J({% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}{{ m(b=2, a=1) }})J",
     R"J([1|][1|2])J"},
    {R"J({{ 'a' * -1 }}|{{ none ~ '' }}|{{ true + 1 }}|{{ "a" "b" }}|{{ messages[0].get('role') }}|{{ x.y if x is defined else 'n' }})J",
     R"J(|None|2|ab|system|n)J"},
    {R"J({{ (1, 2) + [3] }})J",
     nullptr},
    {R"J({{ 1 if undefined_var.x else 2 }})J",
     nullptr},
    {R"J({{ loop.index }})J",
     nullptr},
    {R"J({{ 1 // 0 }})J",
     nullptr},
    {R"J({{ 1 % 0 }})J",
     nullptr},
    {R"J({% set ns = namespace() %}[{{ ns.missing }}])J",
     R"J([])J"},
    {R"J({% set ns = namespace() %}{% set ns.a.b = 1 %})J",
     nullptr},
    {R"J({% if %}x{% endif %})J",
     nullptr},
    {R"J({% if true %}x)J",
     nullptr},
    {R"J({% for %})J",
     nullptr},
    {R"J({{ 1 +)J",
     nullptr},
    {R"J({{ 'unterminated }})J",
     nullptr},
    {R"J({% endfor %})J",
     nullptr},
    {R"J({% foo %})J",
     nullptr},
    {R"J({% include 'x' %})J",
     nullptr},
    {R"J({{ x | nosuchfilter }})J",
     nullptr},
    {R"J({% if false %}{{ x | nosuchfilter }}{% endif %}ok)J",
     R"J(ok)J"},
    {R"J({{ x is nosuchtest }})J",
     nullptr},
    {R"J({{ [1, 2] | join(', ') | length }}|{{ 'abc'[5:] }}|{{ 'abc'[-10:2] }}|{{ [1,2,3][-10:10] }})J",
     R"J(4||ab|[1, 2, 3])J"},
    {R"J({{ messages[0] | items | list | length }}|{{ messages[0] | dictsort | first }})J",
     R"J(2|('content', 'Be brief.\nAnswer in English.'))J"},
    {R"J({{ messages | map(attribute='content') | map('length') | list }})J",
     R"J([28, 16, 12, 8])J"},
    {R"J({{ [1, 2] | tojson(indent=none) }}|{{ {'a': 1} | tojson(indent=0) }})J",
     R"J([1, 2]|{
"a": 1
})J"},
    {R"J({{ '\n'.join(['a', 'b']) }}|{{ 'x' ~ '\'' }}|{{ 'a\\nb' }})J",
     R"J(a
b|x'|a\nb)J"},
    {R"J({%- for m in messages -%}
{{- m.role -}}
{%- endfor -%})J",
     R"J(systemuserassistantuser)J"},
    {R"J({% for i in range(3) %}{{ i }}{% endfor %}{{ i }})J",
     R"J(012)J"},
    {R"J({% set i = 9 %}{% for i in range(2) %}{{ i }}{% endfor %}{{ i }})J",
     R"J(019)J"},
    {R"J({% macro m() %}{{ caller_var }}{% endmacro %}{% set caller_var = 'top' %}{{ m() }})J",
     R"J(top)J"},
    {R"J({% macro m() %}{{ v }}{% endmacro %}{% for v in [1] %}{{ m() }}{% endfor %}|)J",
     R"J(|)J"},
    {R"J({{ messages[0]['role'] is string and messages[0]['role'] == 'system' }}|{{ messages[-1].role }}|{{ messages[1:3] | length }})J",
     R"J(True|user|2)J"},
    {R"J({{ 5 is divisibleby 0 }})J",
     nullptr},
    {R"J({{ {'a': 1} + {'b': 2} }})J",
     nullptr},
    {R"J({{ -'a' }})J",
     nullptr},
    {R"J({{ [1, 'a'] | sort }})J",
     nullptr},
    {R"J({{ 'a' | int + 'b' }})J",
     nullptr},
    {R"J({{ 1 is defined is true }})J",
     nullptr},
    {R"J({{ not 1 is none }}|{{ not (1 is none) }}|{{ - 1 | abs }})J",
     R"J(True|True|1)J"},
    {R"J({{ {'a': 1}.items() | list }}|{{ {'a': 1}.keys() | first }})J",
     R"J([('a', 1)]|a)J"},
    {R"J({{ 'x'.replace('', '-') }}|{{ 'abc'.replace('', '-', 2) }})J",
     R"J(-x-|-a-bc)J"},
    {R"J({{ 'aXbXc'.split('X', -1) }}|{{ '  a b c  '.split(None, 1) }}|{{ '  a b c  '.rsplit(None, 1) }}|{{ 'a b c'.rsplit(' ', 1) }})J",
     R"J(['a', 'b', 'c']|['a', 'b c  ']|['  a b', 'c']|['a b', 'c'])J"},
    {R"J({{ 'Hello World'.title() }}|{{ 'hello_world-x y'.title() }}|{{ "o'neil mc-d" | title }})J",
     R"J(Hello World|Hello_World-X Y|O'neil Mc-D)J"},
    {R"J({{ 3 is number and not 3 is boolean }}|{{ 3.0 == 3 }}|{{ [1, 2] != [1, 2] }}|{{ 'a' < 'b' < 'c' }})J",
     R"J(True|True|False|True)J"},
};

TEST(ChatTemplates, LanguageMatchesJinja2) {
  int n = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.src);
    if (c.expected) {
      std::string got;
      try {
        got = render(c.src);
      } catch (const llm::Error& e) {
        ADD_FAILURE() << "error: " << e.what();
        continue;
      }
      EXPECT_EQ(got, c.expected);
    } else {
      llm_status st = LLM_OK;
      const std::string err = error_of(c.src, options(), &st);
      EXPECT_FALSE(err.empty());
      EXPECT_TRUE(st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_UNSUPPORTED) << err;
      EXPECT_EQ(err.rfind("chat template: line ", 0), 0u) << err;
    }
    ++n;
  }
  EXPECT_GE(n, 120);
}

TEST(ChatTemplates, WhitespaceControl) {
  EXPECT_EQ(render("a\n{% if true %}\nb\n{% endif %}\nc"), "a\nb\nc");              // trim_blocks
  EXPECT_EQ(render("a\n    {% if true %}b\n{% endif %}\nc"), "a\nb\nc");            // lstrip_blocks
  EXPECT_EQ(render("a\n    {% if true %}b{% endif %}\nc"), "a\nbc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a  {{- 'x' -}}  c"), "axc");
  EXPECT_EQ(render("a  {{ 'x' }}  c"), "a  x  c");                                   // no lstrip for {{
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");                         // + keeps the indent
  EXPECT_EQ(render("{% if true +%}\nx{% endif %}"), "\nx");                         // + keeps the newline
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(render("x\n"), "x");                                                    // one trailing newline dropped
  EXPECT_EQ(render("x\n\n"), "x\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(ChatTemplates, ListsAndNamespacesAreMutable) {
  // As in Python. (transformers' ImmutableSandboxedEnvironment refuses
  // list.append and dict.update; no template in tests/data takes those paths
  // with plain messages.)
  EXPECT_EQ(render("{% set x = [1] %}{% set _ = x.append(2) %}{{ x }}"), "[1, 2]");
  EXPECT_EQ(render("{% set d = {} %}{% set _ = d.update({'a': 1}) %}{{ d }}"), "{'a': 1}");
  EXPECT_EQ(render("{% set x = [1, 2, 3] %}{{ x.pop() }}{{ x }}"), "3[1, 2]");
  EXPECT_EQ(render("{% set ns = namespace(items=[]) %}{% for m in messages %}{% set ns.items = ns.items + [m.role] %}"
                   "{% endfor %}{{ ns.items | join(',') }}"),
            "system,user,assistant,user");
}

TEST(ChatTemplates, Variables) {
  RenderOptions o = options();
  o.add_generation_prompt = false;
  EXPECT_EQ(render("{{ add_generation_prompt }}|{{ bos_token }}|{{ eos_token }}", {}, o), "False|<s>|</s>");
  EXPECT_EQ(render("{{ messages | length }}", {}), "0");
  EXPECT_EQ(render("{{ tools is none }}{{ documents is none }}{{ date_string is defined }}"), "TrueTrueFalse");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "26 Jul 2024");
  RenderOptions now = options();
  now.now_unix = -1;
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }}", {}, now), "4");
}

// ---- errors -------------------------------------------------------------------------

TEST(ChatTemplates, SyntaxErrorsGiveLineAndColumn) {
  struct E {
    const char* src;
    const char* message;
  };
  const E cases[] = {
      {"{% if %}x{% endif %}", "chat template: line 1, column 7: unexpected '%}', expected an expression"},
      {"ab\n  {{ 1 + }}", "chat template: line 2, column 10: unexpected '}}', expected an expression"},
      {"{% if true %}x", "chat template: line 1, column 15: unexpected end of template, expected 'elif'"},
      {"x\n{% for x in y %}", "chat template: line 2, column 17: unexpected end of template, expected 'endfor'"},
      {"{{ 'abc }}", "chat template: line 1, column 4: unterminated string literal"},
      {"{{ x", "chat template: line 1, column 1: unexpected end of template, missing '}}'"},
      {"{# open", "chat template: line 1, column 1: missing end of comment tag"},
      {"{% endfor %}", "chat template: line 1, column 4: unknown tag 'endfor'"},
      {"{% foo %}", "chat template: line 1, column 4: unknown tag 'foo'"},
      {"{{ a $ b }}", "chat template: line 1, column 6: unexpected character '$'"},
      {"{% break %}", "chat template: line 1, column 4: 'break' outside of a loop"},
      {"\n\n   {% set x = (1, %}", "chat template: line 3, column 20: unexpected '}', expected ')'"},
      {"{% set x = (1, 2 %}", "chat template: line 1, column 19: unexpected '}', expected ')'"},
  };
  for (const E& c : cases) {
    llm_status st = LLM_OK;
    EXPECT_EQ(error_of(c.src, options(), &st), c.message) << c.src;
    EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT) << c.src;
  }
}

TEST(ChatTemplates, UnsupportedConstructsAreErrors) {
  for (const char* src : {"{% include 'other.jinja' %}", "{% extends 'base' %}", "{% for x in y recursive %}{% endfor %}",
                          "{{ 'abc' | batch(2) }}", "{{ 1 is nosuchtest }}", "{{ '{:>5}'.format(1) }}",
                          "{% call m() %}{% endcall %}", "{{ f(*args) }}", "{{ 99999999999999999999 }}"}) {
    llm_status st = LLM_OK;
    const std::string err = error_of(src, options(), &st);
    EXPECT_EQ(st, LLM_ERR_UNSUPPORTED) << src << ": " << err;
    EXPECT_NE(err.find("unsupported"), std::string::npos) << err;
    EXPECT_EQ(err.rfind("chat template: line 1, column ", 0), 0u) << err;
  }
}

TEST(ChatTemplates, RuntimeErrorsGiveLineAndColumn) {
  EXPECT_EQ(error_of("line one\n{{ raise_exception('Conversation roles must alternate') }}"),
            "chat template: line 2, column 4: raise_exception: Conversation roles must alternate");
  EXPECT_EQ(error_of("{{ x.y }}"), "chat template: line 1, column 5: 'x' is undefined");
  EXPECT_EQ(error_of("{{ messages[0].nope.deeper }}"),
            "chat template: line 1, column 20: 'dict object' has no attribute 'nope'");
  EXPECT_EQ(error_of("{% for t in tools %}{% endfor %}"),
            "chat template: line 1, column 13: 'NoneType' object is not iterable");
  EXPECT_EQ(error_of("{{ 1 + 'a' }}"),
            "chat template: line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "chat template: line 1, column 6: integer division or modulo by zero");
}

// ---- bounds -----------------------------------------------------------------------------

TEST(ChatTemplates, BoundsStopRunawayTemplates) {
  RenderOptions o = options();
  o.max_steps = 100000;
  o.max_output_bytes = 1 << 20;
  o.max_depth = 32;
  auto expect_bound = [&](const char* src, const char* what) {
    llm_status st = LLM_OK;
    const std::string err = error_of(src, o, &st);
    EXPECT_EQ(st, LLM_ERR_INVALID_ARGUMENT) << src;
    EXPECT_NE(err.find(what), std::string::npos) << src << ": " << err;
  };
  expect_bound("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_steps");
  expect_bound("{% set ns = namespace(n=0) %}{% for i in range(1000000) %}{% set ns.n = ns.n + 1 %}{% endfor %}",
               "max_steps");
  expect_bound("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_depth");
  expect_bound("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}", "max_depth");
  expect_bound("{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}", "max_output_bytes");
  expect_bound("{{ 'a' * 1000000000 }}", "max_output_bytes");
  expect_bound("{{ 'ab' * 9223372036854775807 }}", "max_output_bytes");
  expect_bound("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               "max_output_bytes");
  expect_bound("{% set x %}{% for i in range(2000) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}", "max_output_bytes");
  // Strings kept in a list: each one made is charged, so the memory they hold is bounded.
  expect_bound("{% set big = 'x' * 100000 %}{% set l = [] %}{% for i in range(100000) %}"
               "{% set _ = l.append(big | upper) %}{% endfor %}",
               "max_steps");
  expect_bound("{{ range(100000000000) | length }}", "too long");
  expect_bound("{{ [1] * 100000000 }}", "too long");
  // Values that contain themselves or nest deeply: an error, not a stack overflow; freed at the end.
  EXPECT_NE(error_of("{% set x = [] %}{% set _ = x.append(x) %}{{ x }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{% set d = {} %}{% set _ = d.update({'d': d}) %}{{ d | tojson }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{% set x = [] %}{% set _ = x.append(x) %}{{ x == x }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_EQ(render("{% set ns = namespace(l=[]) %}{% for i in range(200000) %}{% set ns.l = [ns.l] %}{% endfor %}ok"),
            "ok");
  EXPECT_EQ(render("{{ 'abc'[1::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}"), "bc");
  // Deep nesting is refused when compiling, before it can exhaust the stack;
  // ordinary depths compile.
  EXPECT_EQ(render("{{ " + std::string(90, '(') + "1" + std::string(90, ')') + " }}"), "1");
  std::string ifs;
  for (int k = 0; k < 200; ++k) ifs += "{% if true %}";
  ifs += "x";
  for (int k = 0; k < 200; ++k) ifs += "{% endif %}";
  EXPECT_EQ(render(ifs), "x");
  const std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  EXPECT_NE(error_of(deep).find("nested too deeply"), std::string::npos);
  std::string deep_ifs;
  for (int k = 0; k < 10000; ++k) deep_ifs += "{% if true %}";
  EXPECT_NE(error_of(deep_ifs).find("nested too deeply"), std::string::npos);
  // The defaults stop an endless template too.
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}")
                .find("max_steps"),
            std::string::npos);
}

TEST(ChatTemplates, RenderIsThreadSafe) {
  auto t = Template::compile(read_file(kDir + "Qwen-Qwen3-0.6B.jinja"));
  const std::string want = t->render(sys_multi(), options());
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) ok[size_t(k)] += t->render(sys_multi(), options()) == want;
    });
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 50);
}

// ---- built-in templates -----------------------------------------------------------------

std::vector<Message> two_turns() {
  return {{"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
}

std::string render_builtin(const char* name, bool generation_prompt = true) {
  RenderOptions o;
  o.add_generation_prompt = generation_prompt;
  const char* bos = std::string(name) == "llama3" ? "<|begin_of_text|>" : std::string(name) == "gemma" ? "<bos>" : "<s>";
  o.bos_token = bos;
  o.eos_token = std::string(name) == "phi3" ? "<|endoftext|>" : "</s>";
  const std::string_view src = llm::chat::builtin_template(name);
  EXPECT_FALSE(src.empty()) << name;
  return Template::compile(src)->render(two_turns(), o);
}

TEST(ChatTemplates, BuiltinTemplates) {
  EXPECT_EQ(render_builtin("chatml"),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_builtin("llama3"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_builtin("gemma"),
            "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_builtin("mistral"), "<s>[INST] You are terse.\n\nHi [/INST] Hello.</s>[INST] Bye [/INST]");
  EXPECT_EQ(render_builtin("phi3"),
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nBye<|end|>\n<|assistant|>\n");
  EXPECT_EQ(render_builtin("phi3", false),
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
            "<|user|>\nBye<|end|>\n<|endoftext|>");
  EXPECT_EQ(render_builtin("chatml", false).find("<|im_start|>assistant\n<"), std::string::npos);
  EXPECT_TRUE(llm::chat::builtin_template("nope").empty());
  EXPECT_TRUE(llm::chat::builtin_template("").empty());
  // The mistral format has only user/assistant turns after the system message.
  RenderOptions o;
  EXPECT_THROW(Template::compile(llm::chat::builtin_template("mistral"))->render({{"tool", "x"}}, o), llm::Error);
}

TEST(ChatTemplates, PickBuiltin) {
  auto vocab = [](std::set<std::string> texts) {
    return [texts](std::string_view t) { return texts.count(std::string(t)) != 0; };
  };
  const auto none = vocab({});
  EXPECT_EQ(llm::chat::pick_builtin("qwen2", vocab({"<|im_start|>", "<|im_end|>"})), "chatml");
  EXPECT_EQ(llm::chat::pick_builtin("llama", vocab({"<|im_start|>", "<|im_end|>"})), "chatml");  // a ChatML fine-tune
  EXPECT_EQ(llm::chat::pick_builtin("llama", vocab({"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})),
            "llama3");
  EXPECT_EQ(llm::chat::pick_builtin("gemma3", vocab({"<start_of_turn>", "<end_of_turn>"})), "gemma");
  EXPECT_EQ(llm::chat::pick_builtin("llama", vocab({"[INST]", "[/INST]"})), "mistral");
  EXPECT_EQ(llm::chat::pick_builtin("phi3", vocab({"<|user|>", "<|assistant|>", "<|end|>"})), "phi3");
  EXPECT_EQ(llm::chat::pick_builtin("gemma2", none), "gemma");
  EXPECT_EQ(llm::chat::pick_builtin("gemma3", none), "gemma");
  EXPECT_EQ(llm::chat::pick_builtin("qwen3", none), "chatml");
  EXPECT_EQ(llm::chat::pick_builtin("phi3", none), "phi3");
  EXPECT_EQ(llm::chat::pick_builtin("llama", none), "");
  EXPECT_EQ(llm::chat::pick_builtin("gpt2", none), "");
  EXPECT_EQ(llm::chat::pick_builtin("llama", vocab({"<|im_start|>"})), "");  // half a pair is not evidence
  EXPECT_EQ(llm::chat::pick_builtin("llama", nullptr), "");
  for (const char* name : {"chatml", "llama3", "gemma", "mistral", "phi3"})
    EXPECT_FALSE(llm::chat::builtin_template(name).empty());
}

}  // namespace
