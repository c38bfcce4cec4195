// Fuzz target: the GBNF parser (llm::grammar::parse_gbnf) and, for grammars
// it accepts, the matcher over a small vocabulary for a few steps: the fast
// mask must equal the brute-force mask, and every token the mask allows must
// be accepted.
//
// Input: one byte choosing the token walk, then the grammar text.
#include "core/error.h"
#include "fuzz_common.h"
#include "grammar/grammar.h"

namespace {

std::shared_ptr<const llm::grammar::Vocab> fuzz_vocab() {
  static std::shared_ptr<const llm::grammar::Vocab> v = [] {
    std::vector<std::string> p;
    for (int b = 0; b < 128; ++b) p.push_back(std::string(1, char(b)));
    for (const char* s : {"\xC3", "\xA9", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98", "\x80", "ab", "abc", "{\"",
                          "\":", "\",", "true", "null", "12", "  ", "\n", "<think>", ""}) {
      p.push_back(s);
    }
    p.push_back("");  // EOG
    return llm::grammar::make_vocab(p, {int32_t(p.size() - 1)});
  }();
  return v;
}

}  // namespace

LLM_FUZZ_TARGET(gbnf) {
  if (size < 1 || size > 8192) return 0;
  const uint8_t seed = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::shared_ptr<const llm::grammar::Grammar> g;
  try {
    g = llm::grammar::parse_gbnf(text);
  } catch (const llm::Error& e) {
    LLM_FUZZ_EXPECT(e.status() == LLM_ERR_INVALID_ARGUMENT);
    LLM_FUZZ_EXPECT(std::string(e.what()).compare(0, 14, "grammar: line ") == 0);
    return 0;
  }
  auto v = fuzz_vocab();
  try {
    llm::grammar::Matcher m(g, v);
    uint32_t pick = seed;
    for (int step = 0; step < 6; ++step) {
      std::vector<uint64_t> fast, slow;
      m.compute_mask(fast);
      const uint64_t caps0 = llm::grammar::Matcher::cap_hits();
      m.compute_mask_slow(slow);
      // Equal, unless the whole-state walk hit a cap (grammar.h: cap_hits).
      const bool capped = llm::grammar::Matcher::cap_hits() != caps0;
      LLM_FUZZ_EXPECT(fast == slow || capped);
      if (capped) break;
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < v->n_vocab(); ++t)
        if ((fast[size_t(t) >> 6] >> (t & 63)) & 1) allowed.push_back(t);
      if (allowed.empty() || m.ended()) break;
      pick = pick * 1103515245u + 12345u;
      const int32_t t = allowed[(pick >> 8) % allowed.size()];
      LLM_FUZZ_EXPECT(m.allows(t));
      m.accept(t);
    }
  } catch (const llm::Error& e) {
    // Over the matcher's caps, or a <token> missing from the vocabulary.
    LLM_FUZZ_EXPECT(e.status() == LLM_ERR_INVALID_ARGUMENT);
  }
  return 0;
}
