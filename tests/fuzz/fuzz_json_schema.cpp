// Fuzz target: JSON Schema -> GBNF (llm::grammar::json_schema_to_gbnf). Any
// input either converts to a grammar that parse_gbnf accepts, or fails with
// LLM_ERR_INVALID_ARGUMENT and a "json schema: " message.
//
// Input: the schema text.
#include "core/error.h"
#include "fuzz_common.h"
#include "grammar/grammar.h"

LLM_FUZZ_TARGET(json_schema) {
  if (size > 65536) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string gbnf;
  try {
    gbnf = llm::grammar::json_schema_to_gbnf(text);
  } catch (const llm::Error& e) {
    LLM_FUZZ_EXPECT(e.status() == LLM_ERR_INVALID_ARGUMENT);
    LLM_FUZZ_EXPECT(std::string(e.what()).compare(0, 13, "json schema: ") == 0);
    return 0;
  }
  try {
    auto g = llm::grammar::parse_gbnf(gbnf);
    static auto v = llm::grammar::make_vocab({"{", "}", "[", "]", "\"", ":", ",", " ", "a", "1", "true", "null", ""}, {12});
    llm::grammar::Matcher m(g, v);
    std::vector<uint64_t> fast, slow;
    m.compute_mask(fast);
    m.compute_mask_slow(slow);
    LLM_FUZZ_EXPECT(fast == slow);
  } catch (const llm::Error&) {
    LLM_FUZZ_EXPECT(!"a converted schema must parse and match");
  }
  return 0;
}
