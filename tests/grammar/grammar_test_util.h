// Helpers shared by the grammar tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace llm::grammar::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string data_path(const std::string& rel) { return std::string(LLM_TEST_DATA_DIR) + "/" + rel; }

// 256 one-byte tokens, then EOG (id 256, empty piece).
inline std::shared_ptr<const Vocab> byte_vocab() {
  static std::shared_ptr<const Vocab> v = [] {
    std::vector<std::string> p;
    for (int b = 0; b < 256; ++b) p.push_back(std::string(1, char(b)));
    p.push_back("");
    return make_vocab(p, {256});
  }();
  return v;
}
constexpr int32_t kByteEog = 256;

// True if the grammar accepts exactly `text` (fed one byte per token, so
// every multi-byte character is split across tokens).
inline bool accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g, byte_vocab());
  for (unsigned char c : text) {
    if (!m.allows(c)) return false;
    m.accept(c);
  }
  return m.can_end() && m.allows(kByteEog);
}

// True if `text` is a prefix of some string of the grammar (every byte allowed).
inline bool accepts_prefix(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g, byte_vocab());
  for (unsigned char c : text) {
    if (!m.allows(c)) return false;
    m.accept(c);
  }
  return true;
}

inline bool bit(const std::vector<uint64_t>& b, int32_t i) { return (b[size_t(i) >> 6] >> (i & 63)) & 1; }

// The fast mask equals the brute-force one; reports the first differences.
inline ::testing::AssertionResult masks_equal(Matcher& m, const Vocab& v) {
  std::vector<uint64_t> fast, slow;
  m.compute_mask(fast);
  m.compute_mask_slow(slow);
  if (fast == slow) return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure();
  int shown = 0;
  for (int32_t t = 0; t < v.n_vocab() && shown < 10; ++t) {
    if (bit(fast, t) != bit(slow, t)) {
      r << "token " << t << " '" << v.piece(t) << "': fast " << bit(fast, t) << " slow " << bit(slow, t) << "\n";
      ++shown;
    }
  }
  return r;
}

// Gemma 3 vocabulary (LLM_GEMMA3_GGUF), or null.
inline std::shared_ptr<const Vocab> gemma_vocab() {
  static std::shared_ptr<const Vocab> v = []() -> std::shared_ptr<const Vocab> {
    const char* p = std::getenv("LLM_GEMMA3_GGUF");
    if (!p || !*p) return nullptr;
    std::ifstream f(p);
    if (!f.good()) return nullptr;
    ModelSource src = read_gguf(p, true, nullptr);
    std::unique_ptr<Tokenizer> tok = Tokenizer::create(src.vocab);
    std::vector<std::string> pieces(size_t(tok->n_vocab()));
    std::vector<int32_t> eog;
    for (int32_t id = 0; id < tok->n_vocab(); ++id) {
      if (tok->is_eog(id)) eog.push_back(id);
      else if (!tok->is_control(id)) tok->append_piece(id, pieces[size_t(id)]);
    }
    return make_vocab(std::move(pieces), std::move(eog));
  }();
  return v;
}

// Greedy tokenization of `text` with the longest allowed piece at each step
// (what a model under the mask could emit). Empty if stuck.
inline std::vector<int32_t> greedy_tokens(Matcher m, const Vocab& v, const std::string& text) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t t = 0; t < v.n_vocab(); ++t) {
      const std::string& p = v.piece(t);
      if (p.empty() || p.size() <= best_len || text.compare(i, p.size(), p) != 0) continue;
      if (!m.allows(t)) continue;
      best = t;
      best_len = p.size();
    }
    if (best < 0) return {};
    m.accept(best);
    out.push_back(best);
    i += best_len;
  }
  return out;
}

}  // namespace llm::grammar::test
