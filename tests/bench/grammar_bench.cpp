// Grammar mask cost (docs/GRAMMAR.md): Matcher::apply_mask over a 262,144-token
// vocabulary at a few JSON states, with the mask cache warm (the steady state
// of a generation) and cold (the first time a grammar position is seen).
//
//   LLM_GEMMA3_GGUF=/path/gemma-3-270m.gguf build/bin/llm_grammar_bench
//
// Without LLM_GEMMA3_GGUF the vocabulary is synthetic: 262,144 random pieces
// (words with and without a leading space, digits, punctuation runs, quotes,
// UTF-8), so the numbers are indicative only.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <unordered_map>

#include "format/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace llm::grammar;

std::shared_ptr<const Vocab> load_vocab() {
  static std::shared_ptr<const Vocab> v = []() -> std::shared_ptr<const Vocab> {
    const char* p = std::getenv("LLM_GEMMA3_GGUF");
    if (p && *p && std::ifstream(p).good()) {
      llm::ModelSource src = llm::read_gguf(p, true, nullptr);
      std::unique_ptr<llm::Tokenizer> tok = llm::Tokenizer::create(src.vocab);
      std::vector<std::string> pieces(size_t(tok->n_vocab()));
      std::vector<int32_t> eog;
      for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        if (tok->is_eog(id)) eog.push_back(id);
        else if (!tok->is_control(id)) tok->append_piece(id, pieces[size_t(id)]);
      }
      return make_vocab(std::move(pieces), std::move(eog));
    }
    std::mt19937 rng(42);
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
    const std::string letters = "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ";
    const char* punct[] = {"\"", "\",", "\":", "\"}", "{\"", "},", "],", "\"]", "(", ")", ";", ".", ",", "\\n", "  ", "\n", "\t", "->", "==", "</"};
    const char* utf8[] = {"é", "ü", "ß", "€", "の", "は", "中", "文", "😀", "ñ"};
    std::uniform_int_distribution<int> kind(0, 9), len(1, 10), li(0, int(letters.size()) - 1), pi(0, 19), ui(0, 9), di(0, 9);
    while (pieces.size() < 262144) {
      std::string s;
      const int k = kind(rng);
      if (k <= 5) {
        if (k <= 2) s += ' ';
        for (int n = len(rng); n > 0; --n) s += letters[size_t(li(rng))];
      } else if (k == 6) {
        for (int n = len(rng) % 4 + 1; n > 0; --n) s += char('0' + di(rng));
      } else if (k == 7) {
        for (int n = len(rng) % 3 + 1; n > 0; --n) s += punct[pi(rng)];
      } else {
        for (int n = len(rng) % 4 + 1; n > 0; --n) s += utf8[ui(rng)];
      }
      pieces.push_back(s);
    }
    pieces.push_back("");
    return make_vocab(std::move(pieces), {int32_t(pieces.size() - 1)});
  }();
  return v;
}

// tests/data/grammars/json.gbnf (llama.cpp's), inline so the binary runs from anywhere.
const char* const kJsonGbnf = R"GBNF(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)GBNF";

std::shared_ptr<const Grammar> json_grammar() { return parse_gbnf(kJsonGbnf); }

std::shared_ptr<const Grammar> schema_grammar() {
  return parse_gbnf(json_schema_to_gbnf(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "born": {"type": "integer"},
      "langs": {"type": "array", "items": {"type": "string"}},
      "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}},
      "required": ["name", "born"], "additionalProperties": false})"));
}

// Feeds `text` with the longest allowed pieces.
void feed(Matcher& m, const Vocab& v, const std::string& text) {
  static std::unordered_map<std::string, int32_t> by_piece;
  if (by_piece.empty())
    for (int32_t t = 0; t < v.n_vocab(); ++t)
      if (!v.piece(t).empty() && !v.is_eog(t)) by_piece.emplace(v.piece(t), t);
  size_t i = 0;
  while (i < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t len = std::min<size_t>(32, text.size() - i); len > 0 && best < 0; --len) {
      auto it = by_piece.find(text.substr(i, len));
      if (it != by_piece.end() && m.allows(it->second)) {
        best = it->second;
        best_len = len;
      }
    }
    if (best < 0) std::abort();
    m.accept(best);
    i += best_len;
  }
}

void run_mask(benchmark::State& st, std::shared_ptr<const Grammar> g, const std::string& prefix) {
  auto v = load_vocab();
  Matcher m(g, v);
  feed(m, *v, prefix);
  std::vector<float> logits(size_t(v->n_vocab()), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  m.apply_mask(logits.data(), v->n_vocab());  // cold: fills the cache for these stack tops
  const double cold_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t allowed = 0;
  for (float x : logits) allowed += x == 0.0f;
  for (auto _ : st) {
    m.apply_mask(logits.data(), v->n_vocab());
    benchmark::DoNotOptimize(logits.data());
  }
  st.counters["cold_ms"] = cold_ms;
  st.counters["allowed"] = double(allowed);
  st.counters["stacks"] = double(m.n_stacks());
}

void BM_JsonMidString(benchmark::State& st) { run_mask(st, json_grammar(), "{\"name\": \"Grace Hop"); }
void BM_JsonBetweenValues(benchmark::State& st) { run_mask(st, json_grammar(), "{\"a\": [1, \"x\"], \"b\": "); }
void BM_JsonAfterValue(benchmark::State& st) { run_mask(st, json_grammar(), "{\"a\": {\"b\": [1, 2"); }
void BM_SchemaMidString(benchmark::State& st) { run_mask(st, schema_grammar(), "{\"name\": \"Grace Hop"); }
void BM_SchemaBetweenValues(benchmark::State& st) {
  run_mask(st, schema_grammar(), "{\"name\": \"Grace\", \"born\": 1906, \"langs\": [\"COBOL\", ");
}

// A bounded string: one cache key per count (docs/GRAMMAR.md, "Not done yet").
void BM_SchemaMaxLengthString(benchmark::State& st) {
  run_mask(st, parse_gbnf(json_schema_to_gbnf(R"({"type": "string", "maxLength": 100})")), "\"Grace Hop");
}

// A whole document from a fresh grammar (every cache fill included): the
// total of apply_mask + accept over its tokens, per document.
void run_document(benchmark::State& st, const std::string& gbnf, const std::string& doc) {
  auto v = load_vocab();
  std::vector<float> logits(size_t(v->n_vocab()), 0.0f);
  size_t n_tokens = 0;
  for (auto _ : st) {
    st.PauseTiming();
    // The document's tokens (longest allowed pieces), found on a throwaway grammar.
    std::vector<int32_t> toks;
    {
      Matcher t(parse_gbnf(gbnf), v);
      size_t i = 0;
      static std::unordered_map<std::string, int32_t> by_piece;
      if (by_piece.empty())
        for (int32_t id = 0; id < v->n_vocab(); ++id)
          if (!v->piece(id).empty() && !v->is_eog(id)) by_piece.emplace(v->piece(id), id);
      while (i < doc.size()) {
        int32_t best = -1;
        size_t len = std::min<size_t>(32, doc.size() - i);
        for (; len > 0; --len) {
          auto it = by_piece.find(doc.substr(i, len));
          if (it != by_piece.end() && t.allows(it->second)) {
            best = it->second;
            break;
          }
        }
        if (best < 0) std::abort();
        t.accept(best);
        toks.push_back(best);
        i += len;
      }
    }
    Matcher fresh(parse_gbnf(gbnf), v);  // a new Grammar: a cold cache
    st.ResumeTiming();
    for (int32_t t : toks) {
      fresh.apply_mask(logits.data(), v->n_vocab());
      fresh.accept(t);
    }
    n_tokens = toks.size();
  }
  st.counters["tokens"] = double(n_tokens);
}

void BM_ColdJsonDocument(benchmark::State& st) {
  run_document(st, kJsonGbnf,
               "{\"name\": \"Grace Hopper\", \"born\": 1906, \"langs\": [\"COBOL\", \"FLOW-MATIC\"], "
               "\"address\": {\"city\": \"New York\", \"zip\": \"10001\"}, \"note\": \"Rear admiral; "
               "coined the word debugging\"}");
}
void BM_ColdMaxLengthDocument(benchmark::State& st) {
  run_document(st, json_schema_to_gbnf(R"({"type": "object", "properties": {"bio": {"type": "string", "maxLength": 100}}, "required": ["bio"], "additionalProperties": false})"),
               "{\"bio\": \"Grace Hopper was an American computer scientist, mathematician and United States Navy "
               "rear admiral.\"}");
}

BENCHMARK(BM_ColdJsonDocument)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_ColdMaxLengthDocument)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_JsonMidString)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_JsonBetweenValues)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_JsonAfterValue)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaMidString)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaBetweenValues)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaMaxLengthString)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
