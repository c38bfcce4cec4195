#include <gtest/gtest.h>

#include <random>
#include <string>

#include "api/utf8.h"

using llm::api::utf8_complete;

TEST(Utf8, CompleteTextPassesThrough) {
  std::string out;
  EXPECT_EQ(utf8_complete("h\xC3\xA9llo \xE4\xB8\xAD \xF0\x9F\x98\x80", out), 0u);
  EXPECT_EQ(out, "h\xC3\xA9llo \xE4\xB8\xAD \xF0\x9F\x98\x80");
}

TEST(Utf8, IncompleteTailIsHeldBack) {
  std::string out;
  EXPECT_EQ(utf8_complete("ab\xF0\x9F\x98", out), 3u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8_complete("\xE4", out), 1u);
  EXPECT_EQ(out, "");
}

TEST(Utf8, InvalidBytesBecomeReplacementChars) {
  std::string out;
  // lone continuation, overlong C0, surrogate ED A0 80, F5 lead
  EXPECT_EQ(utf8_complete("\x80" "a" "\xC0\xAF" "\xED\xA0\x80" "\xF5", out), 0u);
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(out, r + "a" + r + r + r + r + r + r);
}

TEST(Utf8, StreamingAnySplitEqualsWhole) {
  // Feeding the bytes in arbitrary pieces, carrying the held-back tail, gives
  // the same text as converting everything at once.
  std::mt19937 rng(1);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s;
    const int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) s.push_back(char(rng() % 4 == 0 ? rng() % 256 : 0x61 + rng() % 26));
    s += "\xE2\x82\xAC\xF0\x9F\x98\x80";
    std::string whole;
    const size_t held_whole = utf8_complete(s, whole);
    std::string streamed, carry;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t k = std::min(s.size() - pos, size_t(1 + rng() % 5));
      std::string piece = carry + s.substr(pos, k);
      pos += k;
      const size_t held = utf8_complete(piece, streamed);
      carry = piece.substr(piece.size() - held);
    }
    EXPECT_EQ(held_whole, carry.size());
    EXPECT_EQ(streamed, whole);
  }
}
