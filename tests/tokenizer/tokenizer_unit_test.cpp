// Tokenizer algorithms on small hand-built vocabularies: merge order, byte
// fallback, dummy prefix, special tokens, pre-tokenizer splits, Unicode tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace llm {
namespace {

const int32_t kUnk = 0, kBos = 1, kEos = 2;

// SentencePiece-style vocabulary: <unk>, <s>, </s>, optionally the 256 byte
// tokens, then pieces added with add().
struct SpmVocab {
  VocabData v;
  explicit SpmVocab(bool bytes = true) {
    v.model = "llama";
    add("<unk>", 0, TokenType::Unknown);
    add("<s>", 0, TokenType::Control);
    add("</s>", 0, TokenType::Control);
    if (bytes) {
      for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 0, TokenType::Byte);
      }
    }
    v.unk = kUnk;
    v.bos = kBos;
    v.eos = kEos;
  }
  int32_t add(const std::string& text, float score, TokenType type = TokenType::Normal) {
    v.tokens.push_back(text);
    v.scores.push_back(score);
    v.types.push_back(int32_t(type));
    return int32_t(v.tokens.size()) - 1;
  }
  int32_t byte(int b) const { return 3 + b; }
};

std::vector<int32_t> encode(const Tokenizer& t, const std::string& s, bool add_bos = false, bool special = false) {
  std::vector<int32_t> out;
  t.encode(s, add_bos, special, out);
  return out;
}

std::string decode(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) t.append_piece(id, s);
  return s;
}

using Ids = std::vector<int32_t>;
const std::string kMark = "\xE2\x96\x81";  // '▁'

TEST(SpmTokenizer, MergesHighestScoreFirst) {
  SpmVocab sv;
  sv.v.add_space_prefix = false;
  const int32_t a = sv.add("a", -10);
  sv.add("b", -10);
  const int32_t c = sv.add("c", -10);
  const int32_t ab = sv.add("ab", -2), bc = sv.add("bc", -1);
  {
    auto t = Tokenizer::create(sv.v);
    EXPECT_EQ(encode(*t, "abc"), (Ids{a, bc}));  // bc outscores ab
    EXPECT_EQ(encode(*t, "abab"), (Ids{ab, ab}));
  }
  const int32_t abc = sv.add("abc", -5);  // reachable only through a + bc
  auto t = Tokenizer::create(sv.v);
  EXPECT_EQ(encode(*t, "abc"), (Ids{abc}));
  EXPECT_EQ(encode(*t, "cabc"), (Ids{c, abc}));
}

TEST(SpmTokenizer, TiesGoToTheLeftmostPair) {
  SpmVocab sv;
  sv.v.add_space_prefix = false;
  const int32_t a = sv.add("a", -10), aa = sv.add("aa", -1);
  auto t = Tokenizer::create(sv.v);
  EXPECT_EQ(encode(*t, "aaa"), (Ids{aa, a}));
  EXPECT_EQ(encode(*t, "aaaaa"), (Ids{aa, aa, a}));
}

TEST(SpmTokenizer, DummyPrefixAndSpaceEscaping) {
  SpmVocab sv;
  const int32_t sp = sv.add(kMark, -5);
  const int32_t a = sv.add("a", -10);
  sv.add("b", -10);
  const int32_t spa = sv.add(kMark + "a", -1), spb = sv.add(kMark + "b", -1);
  auto t = Tokenizer::create(sv.v);
  EXPECT_TRUE(t->strip_space_after_bos());
  EXPECT_EQ(encode(*t, "a b"), (Ids{spa, spb}));
  EXPECT_EQ(encode(*t, "a b", true), (Ids{kBos, spa, spb}));
  EXPECT_EQ(encode(*t, " a"), (Ids{sp, spa}));
  EXPECT_EQ(encode(*t, ""), Ids{});  // no prefix for empty text
  EXPECT_EQ(encode(*t, "", true), Ids{kBos});
  EXPECT_EQ(decode(*t, encode(*t, "a b")), " a b");

  sv.v.add_space_prefix = false;
  auto t2 = Tokenizer::create(sv.v);
  EXPECT_FALSE(t2->strip_space_after_bos());
  EXPECT_EQ(encode(*t2, "a b"), (Ids{a, spb}));
}

// Words are merged separately only when no piece joins a word to a
// following '▁'; here "x▁" exists, so the merge must cross the space.
TEST(SpmTokenizer, PiecesSpanningASpaceStillMerge) {
  SpmVocab sv;
  const int32_t sp = sv.add(kMark, -5);
  sv.add("x", -5);
  const int32_t y = sv.add("y", -5);
  const int32_t x_sp = sv.add("x" + kMark, -1);
  const int32_t sp_y = sv.add(kMark + "y", -2);
  auto t = Tokenizer::create(sv.v);
  EXPECT_EQ(encode(*t, "x y"), (Ids{sp, x_sp, y}));
  EXPECT_EQ(encode(*t, "y y"), (Ids{sp_y, sp_y}));
  EXPECT_EQ(decode(*t, encode(*t, "x y x y")), " x y x y");
}

TEST(SpmTokenizer, ByteFallbackAndUnknown) {
  SpmVocab sv;
  sv.v.add_space_prefix = false;
  const int32_t a = sv.add("a", -1);
  const int32_t e_acute = sv.add("\xC3\xA9", -1);  // 'é' is a piece, 'ö' is not
  auto t = Tokenizer::create(sv.v);
  EXPECT_EQ(encode(*t, "a\xC3\xB6" "a"), (Ids{a, sv.byte(0xC3), sv.byte(0xB6), a}));
  EXPECT_EQ(encode(*t, "\xC3\xA9"), (Ids{e_acute}));
  // Invalid UTF-8 goes byte by byte; a stray lead byte does not swallow the next character.
  EXPECT_EQ(encode(*t, "\xFF" "a\xC3" "a"), (Ids{sv.byte(0xFF), a, sv.byte(0xC3), a}));
  EXPECT_EQ(decode(*t, encode(*t, "\xFF" "a\xC3" "a")), "\xFF" "a\xC3" "a");

  SpmVocab nb(false);
  nb.v.add_space_prefix = false;
  const int32_t a2 = nb.add("a", -1);
  auto t2 = Tokenizer::create(nb.v);
  EXPECT_EQ(encode(*t2, "a\xC3\xB6" "a"), (Ids{a2, kUnk, a2}));  // one <unk> per unknown character
}

TEST(SpmTokenizer, MergesNeverProduceControlTokens) {
  SpmVocab sv;
  sv.v.add_space_prefix = false;
  const int32_t lt = sv.add("<", -1), s = sv.add("s", -1), gt = sv.add(">", -1);
  const int32_t sgt = sv.add("s>", -0.5f);
  auto t = Tokenizer::create(sv.v);
  EXPECT_EQ(encode(*t, "<s>"), (Ids{lt, sgt}));            // "<s>" is Control: never a merge result
  EXPECT_EQ(encode(*t, "<s>", false, true), (Ids{kBos}));  // ...but parsed as special on request
  EXPECT_EQ(encode(*t, "s<s>>", false, true), (Ids{s, kBos, gt}));
}

TEST(SpmTokenizer, SpecialTokensSplitTheText) {
  SpmVocab sv;
  const int32_t spa = sv.add(kMark + "a", -1);
  sv.add(kMark, -5);
  const int32_t spb = sv.add(kMark + "b", -1);
  sv.add("a", -9);
  sv.add("b", -9);
  const int32_t x = sv.add("<|x|>", 0, TokenType::Control);
  const int32_t x_long = sv.add("<|x|>y", 0, TokenType::UserDefined);
  auto t = Tokenizer::create(sv.v);
  // Each stretch of text between specials gets its own dummy prefix (llama.cpp).
  EXPECT_EQ(encode(*t, "a</s>b", false, true), (Ids{spa, kEos, spb}));
  EXPECT_EQ(encode(*t, "<s>a", false, true), (Ids{kBos, spa}));
  EXPECT_EQ(encode(*t, "<|x|>", false, true), (Ids{x}));
  EXPECT_EQ(encode(*t, "<|x|>y", false, true), (Ids{x_long}));  // longest match
  const Ids plain = encode(*t, "a</s>b", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kEos), 0);
  EXPECT_EQ(decode(*t, plain), " a</s>b");
  // Control pieces print nothing, user-defined pieces print their text.
  EXPECT_EQ(decode(*t, {kBos, spa, kEos, x_long}), " a<|x|>y");
}

// --- byte-level BPE ----------------------------------------------------------

// The 256 byte tokens (id = byte) in GPT-2's printable mapping, then extra
// tokens and merges given in raw bytes (mapped here).
struct BpeVocab {
  VocabData v;
  BpeVocab() {
    v.model = "gpt2";
    v.pre = "gpt-2";
    for (int b = 0; b < 256; ++b) v.tokens.push_back(map(std::string(1, char(b))));
    v.types.assign(256, int32_t(TokenType::Normal));
  }
  static std::string map(const std::string& raw) {
    std::string s;
    for (unsigned char c : raw) utf8_append(gpt2_byte_to_cp(c), s);
    return s;
  }
  int32_t add(const std::string& raw, TokenType type = TokenType::Normal) {
    v.tokens.push_back(type == TokenType::Normal ? map(raw) : raw);
    v.types.push_back(int32_t(type));
    return int32_t(v.tokens.size()) - 1;
  }
  int32_t merge(const std::string& a, const std::string& b) {
    v.merges.push_back(map(a) + " " + map(b));
    return add(a + b);
  }
};

TEST(BpeTokenizer, ByteMapping) {
  EXPECT_EQ(gpt2_byte_to_cp('A'), uint32_t('A'));
  EXPECT_EQ(gpt2_byte_to_cp(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_cp('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_cp(0xAD), 0x143u);  // the last one
  for (int b = 0; b < 256; ++b) EXPECT_EQ(gpt2_cp_to_byte(gpt2_byte_to_cp(uint8_t(b))), b);
  EXPECT_EQ(gpt2_cp_to_byte(0x144), -1);
}

TEST(BpeTokenizer, LowestRankFirstThenLeftmost) {
  {
    BpeVocab bv;
    const int32_t bc = bv.merge("b", "c");
    bv.merge("a", "b");
    auto t = Tokenizer::create(bv.v);
    EXPECT_EQ(encode(*t, "abc"), (Ids{'a', bc}));
  }
  {
    BpeVocab bv;
    const int32_t ab = bv.merge("a", "b");
    bv.merge("b", "c");
    auto t = Tokenizer::create(bv.v);
    EXPECT_EQ(encode(*t, "abc"), (Ids{ab, 'c'}));
  }
  {
    BpeVocab bv;
    const int32_t aa = bv.merge("a", "a");
    const int32_t aaaa = bv.merge("aa", "aa");
    auto t = Tokenizer::create(bv.v);
    EXPECT_EQ(encode(*t, "aaa"), (Ids{aa, 'a'}));
    EXPECT_EQ(encode(*t, "aaaaa"), (Ids{aaaa, 'a'}));
  }
}

TEST(BpeTokenizer, WordsAreMergedSeparately) {
  BpeVocab bv;
  const int32_t sp_h = bv.merge(" ", "h");
  const int32_t he = bv.merge("h", "e");
  const int32_t sp_he = bv.merge(" h", "e");
  const int32_t ee = bv.merge("e", "e");
  auto t = Tokenizer::create(bv.v);
  EXPECT_EQ(encode(*t, "he he"), (Ids{he, sp_he}));
  EXPECT_EQ(encode(*t, "e e"), (Ids{'e', ' ', 'e'}));  // no merge across the word boundary
  EXPECT_EQ(encode(*t, "ee!"), (Ids{ee, '!'}));
  EXPECT_EQ(encode(*t, " h"), (Ids{sp_h}));
  EXPECT_EQ(decode(*t, encode(*t, "he he\n\t\xFF")), "he he\n\t\xFF");
}

TEST(BpeTokenizer, IgnoreMergesKeepsWholeWordTokens) {
  BpeVocab bv;
  const int32_t hello = bv.add("hello");  // no merge path leads to it
  bv.v.pre = "llama-bpe";
  auto t = Tokenizer::create(bv.v);
  EXPECT_TRUE(t->warning().empty());
  EXPECT_EQ(encode(*t, "hello"), (Ids{hello}));
  bv.v.pre = "gpt-2";
  auto t2 = Tokenizer::create(bv.v);
  EXPECT_EQ(encode(*t2, "hello"), (Ids{'h', 'e', 'l', 'l', 'o'}));
}

TEST(BpeTokenizer, UnknownPreTokenizerFallsBackWithWarning) {
  BpeVocab bv;
  bv.v.pre = "no-such-pre";
  auto t = Tokenizer::create(bv.v);
  EXPECT_NE(t->warning().find("no-such-pre"), std::string::npos);
  EXPECT_EQ(encode(*t, "a 12"), (Ids{'a', ' ', '1', '2'}));
}

TEST(BpeTokenizer, SpecialTokens) {
  BpeVocab bv;
  const int32_t eot = bv.add("<|endoftext|>", TokenType::Control);
  const int32_t tool = bv.add("<tool>", TokenType::UserDefined);
  bv.v.eos = eot;
  bv.v.bos = eot;
  auto t = Tokenizer::create(bv.v);
  EXPECT_EQ(encode(*t, "a<|endoftext|>b", false, true), (Ids{'a', eot, 'b'}));
  EXPECT_EQ(encode(*t, "<tool>", false, true), (Ids{tool}));
  EXPECT_EQ(encode(*t, "x", true, false), (Ids{eot, 'x'}));
  const Ids plain = encode(*t, "a<|endoftext|>b", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(decode(*t, plain), "a<|endoftext|>b");
  EXPECT_EQ(decode(*t, {'a', eot, tool}), "a<tool>");  // control prints nothing
  EXPECT_EQ(decode(*t, {-1, t->n_vocab(), 1 << 30}), "");  // out-of-range ids print nothing
  EXPECT_FALSE(t->strip_space_after_bos());
}

// End of generation: the file's eos, eot and eom ids, whatever their text.
TEST(BpeTokenizer, EndOfGenerationIdsFromTheFile) {
  BpeVocab bv;
  const int32_t a = bv.add("<stop-a>", TokenType::Control);
  const int32_t b = bv.add("<stop-b>", TokenType::Control);
  const int32_t c = bv.add("<stop-c>", TokenType::Control);
  const int32_t other = bv.add("<other>", TokenType::Control);
  bv.v.eos = a;
  bv.v.eot = b;
  bv.v.eom = c;
  auto t = Tokenizer::create(bv.v);
  EXPECT_TRUE(t->is_eog(a));
  EXPECT_TRUE(t->is_eog(b));
  EXPECT_TRUE(t->is_eog(c));
  EXPECT_FALSE(t->is_eog(other));
  bv.v.eom = t->n_vocab();  // past the vocabulary: a format error
  EXPECT_THROW(Tokenizer::create(bv.v), Error);
}

// User-defined tokens (added tokens that are not special) are found in the
// text even without parse_special, as llama.cpp and Hugging Face do; control
// tokens only with it; a user-defined end marker counts as control (llama.cpp).
TEST(BpeTokenizer, UserDefinedTokensAlwaysSplitTheText) {
  BpeVocab bv;
  const int32_t eot = bv.add("<|endoftext|>", TokenType::Control);
  const int32_t two = bv.add("  ", TokenType::UserDefined);  // as MPT's runs of spaces
  const int32_t three = bv.add("   ", TokenType::UserDefined);
  const int32_t tool = bv.add("<tool>", TokenType::UserDefined);
  const int32_t end = bv.add("</s>", TokenType::UserDefined);
  auto t = Tokenizer::create(bv.v);
  EXPECT_EQ(encode(*t, "a  b"), (Ids{'a', two, 'b'}));
  EXPECT_EQ(encode(*t, "a     b"), (Ids{'a', three, two, 'b'}));  // leftmost, longest
  EXPECT_EQ(encode(*t, "x<tool>y"), (Ids{'x', tool, 'y'}));
  EXPECT_EQ(encode(*t, "x<tool>y", false, true), (Ids{'x', tool, 'y'}));
  const Ids plain = encode(*t, "<|endoftext|>");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(encode(*t, "<|endoftext|>", false, true), (Ids{eot}));
  EXPECT_EQ(encode(*t, "</s>"), (Ids{'<', '/', 's', '>'}));
  EXPECT_EQ(encode(*t, "</s>", false, true), (Ids{end}));
  EXPECT_TRUE(t->is_eog(end));
}

TEST(SpmTokenizer, UserDefinedTokensAlwaysSplitTheText) {
  SpmVocab sv;
  const int32_t a = sv.add(kMark + "a", -1);
  const int32_t x = sv.add("x", -1);
  const int32_t mark = sv.add(kMark, -2);
  const int32_t tool = sv.add("<tool>", 0, TokenType::UserDefined);
  auto t = Tokenizer::create(sv.v);
  // Each stretch after a user-defined token gets its own dummy prefix, as
  // after any special token.
  EXPECT_EQ(encode(*t, "a<tool>a"), (Ids{a, tool, a}));
  EXPECT_EQ(encode(*t, "<tool>x"), (Ids{tool, mark, x}));
  // A control token's text stays ordinary text without parse_special.
  EXPECT_EQ(encode(*t, "<s>x"), (Ids{mark, sv.byte('<'), sv.byte('s'), sv.byte('>'), x}));
  EXPECT_EQ(encode(*t, "<s>x", false, true), (Ids{kBos, mark, x}));
}

// A byte whose GPT-2 character is not in the vocabulary (StarCoder lacks
// 0xF1) is dropped before merging, so its neighbours may merge, as in
// Hugging Face's BPE without an unk token.
TEST(BpeTokenizer, BytesWithoutATokenAreDroppedBeforeMerging) {
  BpeVocab bv;
  const int32_t pair = bv.merge("!", "?");
  bv.v.tokens[0xF1] = "<not-a-byte>";
  bv.v.types[0xF1] = int32_t(TokenType::Control);
  bv.v.unk = bv.add("<unk>", TokenType::Unknown);
  auto t = Tokenizer::create(bv.v);
  EXPECT_EQ(pretokenize(PreTokenizer::Gpt2, "!\xF1?").size(), 1u);
  EXPECT_EQ(encode(*t, "!\xF1?"), (Ids{pair}));
  EXPECT_EQ(encode(*t, "\xF1"), (Ids{}));
  EXPECT_EQ(encode(*t, "x\xF1\xF1"), (Ids{'x'}));
}

// Gemma 4: BPE over raw UTF-8, spaces as U+2581, split only at line breaks,
// byte tokens for characters that are no token.
TEST(BpeTokenizer, Gemma4RawUtf8) {
  VocabData v;
  v.model = "gemma4";
  v.pre = "default";  // llama.cpp ignores the file's name for this model
  v.add_space_prefix = false;
  auto add = [&](const std::string& text, TokenType type = TokenType::Normal) {
    v.tokens.push_back(text);
    v.types.push_back(int32_t(type));
    return int32_t(v.tokens.size()) - 1;
  };
  const int32_t bos = add("<bos>", TokenType::Control);
  v.bos = bos;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, TokenType::Byte);
  }
  const int32_t mark = add(kMark), a = add("a"), b = add("b"), nl = add("\n");
  const int32_t nl2 = add("\n\n");  // reachable by no merge: taken whole, as llama.cpp does
  const int32_t mark_a = add(kMark + "a");
  v.merges.push_back(kMark + " a");
  const int32_t ab = add("ab");
  v.merges.push_back("a b");
  auto t = Tokenizer::create(v);
  EXPECT_TRUE(t->warning().empty()) << t->warning();
  EXPECT_EQ(encode(*t, " a b\n\nab"), (Ids{mark_a, mark, b, nl2, ab}));
  EXPECT_EQ(encode(*t, "a\n"), (Ids{a, nl}));
  EXPECT_EQ(encode(*t, "ab", true), (Ids{bos, ab}));
  // "é" is no token: its UTF-8 bytes; merges never reach across it.
  EXPECT_EQ(encode(*t, "a\xC3\xA9" "b"), (Ids{a, 1 + 0xC3, 1 + 0xA9, b}));
  EXPECT_EQ(decode(*t, encode(*t, " a b\n\nab\xC3\xA9 ")), " a b\n\nab\xC3\xA9 ");
  EXPECT_FALSE(t->strip_space_after_bos());
}

TEST(Tokenizer, EndOfGenerationAndControl) {
  BpeVocab bv;
  const int32_t eos = bv.add("<|endoftext|>", TokenType::Control);
  const int32_t im_end = bv.add("<|im_end|>", TokenType::Control);
  const int32_t eot = bv.add("<|eot_id|>", TokenType::Control);
  const int32_t other = bv.add("<|im_start|>", TokenType::Control);
  const int32_t unused = bv.add("<unused0>", TokenType::Unused);
  const int32_t normal_end = bv.add("</s>");  // an ordinary piece, not a marker
  bv.v.eos = eos;
  auto t = Tokenizer::create(bv.v);
  EXPECT_TRUE(t->is_eog(eos));
  EXPECT_TRUE(t->is_eog(im_end));
  EXPECT_TRUE(t->is_eog(eot));
  EXPECT_FALSE(t->is_eog(other));
  EXPECT_FALSE(t->is_eog(normal_end));
  EXPECT_FALSE(t->is_eog('a'));
  EXPECT_FALSE(t->is_eog(-1));
  EXPECT_TRUE(t->is_control(other));
  EXPECT_TRUE(t->is_control(unused));
  EXPECT_FALSE(t->is_control('a'));
  EXPECT_FALSE(t->is_control(1 << 30));
  EXPECT_EQ(t->eos(), eos);
  EXPECT_EQ(t->n_vocab(), int32_t(bv.v.tokens.size()));
}

TEST(Tokenizer, RejectsBadVocabularies) {
  auto status_of = [](const VocabData& v) {
    try {
      Tokenizer::create(v);
    } catch (const Error& e) {
      return e.status();
    }
    return LLM_OK;
  };
  VocabData empty;
  EXPECT_EQ(status_of(empty), LLM_ERR_FORMAT);
  SpmVocab sv;
  sv.v.model = "bert";
  EXPECT_EQ(status_of(sv.v), LLM_ERR_UNSUPPORTED);
  sv.v.model = "llama";
  sv.v.scores.pop_back();
  EXPECT_EQ(status_of(sv.v), LLM_ERR_FORMAT);
  SpmVocab bad_id;
  bad_id.v.eos = 100000;
  EXPECT_EQ(status_of(bad_id.v), LLM_ERR_FORMAT);
  SpmVocab bad_type;
  bad_type.v.types[5] = 42;
  EXPECT_EQ(status_of(bad_type.v), LLM_ERR_FORMAT);
  BpeVocab bv;
  bv.v.merges.push_back("nospace");
  EXPECT_EQ(status_of(bv.v), LLM_ERR_FORMAT);
  BpeVocab missing;  // a merge of pieces the vocabulary lacks is skipped with a note
  missing.v.merges.push_back("zz qq");
  EXPECT_EQ(status_of(missing.v), LLM_OK);
  EXPECT_FALSE(Tokenizer::create(missing.v)->warning().empty());
}

TEST(Tokenizer, RandomBytesRoundTripOnToyVocabularies) {
  SpmVocab sv;
  sv.v.add_space_prefix = false;
  sv.add(kMark, -1);
  sv.add("ab", -2);
  sv.add("a", -3);
  sv.add("\xC3\xA9", -3);
  BpeVocab bv;
  bv.merge("a", "b");
  bv.merge(" ", "a");
  bv.v.pre = "llama3";
  auto spm = Tokenizer::create(sv.v);
  auto bpe = Tokenizer::create(bv.v);
  std::mt19937 rng(1234);
  const char alphabet[] = {'a', 'b', ' ', '\n', '\xC3', '\xA9', '\xFF', '\x80', '\xE2', '\x96', '\x81', '\''};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int len = int(rng() % 24);
    for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % sizeof alphabet]);
    // SentencePiece cannot tell a literal U+2581 from an escaped space.
    std::string spm_expected = s;
    for (size_t p = 0; (p = spm_expected.find(kMark, p)) != std::string::npos;) spm_expected.replace(p, 3, " ");
    for (bool special : {false, true}) {
      EXPECT_EQ(decode(*spm, encode(*spm, s, false, special)), spm_expected);
      EXPECT_EQ(decode(*bpe, encode(*bpe, s, false, special)), s);
    }
  }
}

// --- pre-tokenizers --------------------------------------------------------------

struct SplitCase {
  PreTokenizer pre;
  std::string text;
  std::vector<std::string> parts;
};

// Expected splits were produced with Python's `regex` module (findall) on the
// patterns quoted in pretokenize.h.
const SplitCase kSplitCases[] = {
    {PreTokenizer::Gpt2, "Hello world", {"Hello", " world"}},
    {PreTokenizer::Gpt2, "  Hello  world  ", {" ", " Hello", " ", " world", "  "}},
    {PreTokenizer::Gpt2, "I'm here, you'LL see 'S", {"I", "'m", " here", ",", " you", "'", "LL", " see", " '", "S"}},
    {PreTokenizer::Gpt2, "x 12345 y", {"x", " 12345", " y"}},
    {PreTokenizer::Gpt2, "a\n\n  b\r\n", {"a", "\n\n ", " b", "\r\n"}},
    {PreTokenizer::Gpt2, "\"quoted\" (x)", {"\"", "quoted", "\"", " (", "x", ")"}},
    {PreTokenizer::Gpt2, "Größe 3½ ǅemal", {"Größe", " 3½", " ǅemal"}},
    {PreTokenizer::Gpt2, "中文字符 テスト", {"中文字符", " テスト"}},
    {PreTokenizer::Gpt2, "tab\there", {"tab", "\t", "here"}},
    {PreTokenizer::Gpt2, "ABCdef GHI jKL", {"ABCdef", " GHI", " jKL"}},
    {PreTokenizer::Gpt2, "e\u0301te", {"e", "\u0301", "te"}},
    {PreTokenizer::Gpt2, "a/b//\nc", {"a", "/", "b", "//", "\n", "c"}},
    {PreTokenizer::Gpt2, "don't   stop!!\n", {"don", "'t", "  ", " stop", "!!", "\n"}},
    {PreTokenizer::Gpt2, "x\u3000\u3000y\u00a0z", {"x", "\u3000", "\u3000", "y", "\u00a0", "z"}},
    {PreTokenizer::Gpt2, "ſo 'ſ", {"ſo", " '", "ſ"}},
    {PreTokenizer::Llama3, "Hello world", {"Hello", " world"}},
    {PreTokenizer::Llama3, "  Hello  world  ", {" ", " Hello", " ", " world", "  "}},
    {PreTokenizer::Llama3, "I'm here, you'LL see 'S", {"I", "'m", " here", ",", " you", "'LL", " see", " '", "S"}},
    {PreTokenizer::Llama3, "x 12345 y", {"x", " ", "123", "45", " y"}},
    {PreTokenizer::Llama3, "a\n\n  b\r\n", {"a", "\n\n", " ", " b", "\r\n"}},
    {PreTokenizer::Llama3, "\"quoted\" (x)", {"\"quoted", "\"", " (", "x", ")"}},
    {PreTokenizer::Llama3, "Größe 3½ ǅemal", {"Größe", " ", "3½", " ǅemal"}},
    {PreTokenizer::Llama3, "中文字符 テスト", {"中文字符", " テスト"}},
    {PreTokenizer::Llama3, "tab\there", {"tab", "\there"}},
    {PreTokenizer::Llama3, "ABCdef GHI jKL", {"ABCdef", " GHI", " jKL"}},
    {PreTokenizer::Llama3, "e\u0301te", {"e", "\u0301te"}},
    {PreTokenizer::Llama3, "a/b//\nc", {"a", "/b", "//\n", "c"}},
    {PreTokenizer::Llama3, "don't   stop!!\n", {"don", "'t", "  ", " stop", "!!\n"}},
    {PreTokenizer::Llama3, "x\u3000\u3000y\u00a0z", {"x", "\u3000", "\u3000y", "\u00a0z"}},
    {PreTokenizer::Llama3, "ſo 'ſ", {"ſo", " '", "ſ"}},
    {PreTokenizer::Qwen2, "Hello world", {"Hello", " world"}},
    {PreTokenizer::Qwen2, "  Hello  world  ", {" ", " Hello", " ", " world", "  "}},
    {PreTokenizer::Qwen2, "I'm here, you'LL see 'S", {"I", "'m", " here", ",", " you", "'LL", " see", " '", "S"}},
    {PreTokenizer::Qwen2, "x 12345 y", {"x", " ", "1", "2", "3", "4", "5", " y"}},
    {PreTokenizer::Qwen2, "a\n\n  b\r\n", {"a", "\n\n", " ", " b", "\r\n"}},
    {PreTokenizer::Qwen2, "\"quoted\" (x)", {"\"quoted", "\"", " (", "x", ")"}},
    {PreTokenizer::Qwen2, "Größe 3½ ǅemal", {"Größe", " ", "3", "½", " ǅemal"}},
    {PreTokenizer::Qwen2, "中文字符 テスト", {"中文字符", " テスト"}},
    {PreTokenizer::Qwen2, "tab\there", {"tab", "\there"}},
    {PreTokenizer::Qwen2, "ABCdef GHI jKL", {"ABCdef", " GHI", " jKL"}},
    {PreTokenizer::Qwen2, "e\u0301te", {"e", "\u0301te"}},
    {PreTokenizer::Qwen2, "a/b//\nc", {"a", "/b", "//\n", "c"}},
    {PreTokenizer::Qwen2, "don't   stop!!\n", {"don", "'t", "  ", " stop", "!!\n"}},
    {PreTokenizer::Qwen2, "x\u3000\u3000y\u00a0z", {"x", "\u3000", "\u3000y", "\u00a0z"}},
    {PreTokenizer::Qwen2, "ſo 'ſ", {"ſo", " '", "ſ"}},
    {PreTokenizer::Tekken, "Hello world", {"Hello", " world"}},
    {PreTokenizer::Tekken, "  Hello  world  ", {" ", " Hello", " ", " world", "  "}},
    {PreTokenizer::Tekken, "I'm here, you'LL see 'S", {"I", "'m", " here", ",", " you", "'LL", " see", " '", "S"}},
    {PreTokenizer::Tekken, "x 12345 y", {"x", " ", "1", "2", "3", "4", "5", " y"}},
    {PreTokenizer::Tekken, "a\n\n  b\r\n", {"a", "\n\n", " ", " b", "\r\n"}},
    {PreTokenizer::Tekken, "\"quoted\" (x)", {"\"quoted", "\"", " (", "x", ")"}},
    {PreTokenizer::Tekken, "Größe 3½ ǅemal", {"Größe", " ", "3", "½", " ǅemal"}},
    {PreTokenizer::Tekken, "中文字符 テスト", {"中文字符", " テスト"}},
    {PreTokenizer::Tekken, "tab\there", {"tab", "\there"}},
    {PreTokenizer::Tekken, "ABCdef GHI jKL", {"ABCdef", " GHI", " j", "KL"}},
    {PreTokenizer::Tekken, "e\u0301te", {"e\u0301te"}},
    {PreTokenizer::Tekken, "a/b//\nc", {"a", "/b", "//\n", "c"}},
    {PreTokenizer::Tekken, "don't   stop!!\n", {"don", "'t", "  ", " stop", "!!\n"}},
    {PreTokenizer::Tekken, "x\u3000\u3000y\u00a0z", {"x", "\u3000", "\u3000y", "\u00a0z"}},
    {PreTokenizer::Tekken, "ſo 'ſ", {"ſo", " '", "ſ"}},
    // The Hugging Face pre-tokenizer sequences behind llama.cpp's names, from
    // the tokenizers package (0.23; Split "isolated", Digits, Punctuation,
    // ByteLevel) on the patterns in llama-vocab.cpp. Falcon's digit split
    // runs after the byte-level mapping, so it cuts characters whose UTF-8
    // has the byte BD (½) or B3 (³).
    {PreTokenizer::Qwen35, "e\u0301te caf\u00E9", {"e\u0301te", " caf\u00E9"}},
    {PreTokenizer::Qwen35, "x 12 y", {"x", " ", "1", "2", " y"}},
    {PreTokenizer::Qwen35, "\u0301a!\u0301", {"\u0301a", "!\u0301"}},
    {PreTokenizer::Qwen35, "Gr\u00F6\u00DFe 3\u00BD", {"Gr\u00F6\u00DFe", " ", "3", "\u00BD"}},
    {PreTokenizer::Qwen35, "don't   stop!!\n", {"don", "'t", "  ", " stop", "!!\n"}},
    {PreTokenizer::Qwen35, "\u1780\u17B6\u1793\u17CB\u178F\u17C2", {"\u1780\u17B6\u1793\u17CB\u178F\u17C2"}},
    {PreTokenizer::Starcoder, "ied 4 \u00BD months", {"ied", " ", "4", " ", "\u00BD", " months"}},
    {PreTokenizer::Starcoder, "x 12345 y", {"x", " ", "1", "2", "3", "4", "5", " y"}},
    {PreTokenizer::Starcoder, "a1b", {"a", "1", "b"}},
    {PreTokenizer::Starcoder, "don't  33\n", {"don", "'t", "  ", "3", "3", "\n"}},
    {PreTokenizer::Falcon, "\n =", {"\n ", "="}},
    {PreTokenizer::Falcon, "3333 33333", {"333", "3", " ", "333", "33"}},
    {PreTokenizer::Falcon, "\u043D\u0435\u0449\u043E", {"\xD0", "\xBD", "\xD0\xB5\xD1\x89\xD0", "\xBE"}},
    {PreTokenizer::Falcon, "Hello, y'all!", {"Hello", ",", " y", "'", "all", "!"}},
    {PreTokenizer::Falcon, "a$b+c<=>d", {"a", "$", "b", "+", "c", "<=>", "d"}},
    {PreTokenizer::Falcon, "12\u00BD345", {"\x31\x32", "\xC2", "\xBD", "\x33\x34\x35"}},
    {PreTokenizer::Falcon, "\u6211\u60F3", {"\xE6\x88\x91\xE6\x83", "\xB3"}},
    {PreTokenizer::DeepseekLlm, "x\u2009sy", {"x", "\u2009", "sy"}},
    {PreTokenizer::DeepseekLlm, "a \u3000b", {"a", " ", "\u3000", "b"}},
    {PreTokenizer::DeepseekLlm, "Hello, world!\n", {"Hello", ",", " world", "!", "\n"}},
    {PreTokenizer::DeepseekLlm, "  trailing  ", {" ", " trailing", "  "}},
    {PreTokenizer::DeepseekLlm, "\u043D\u0435\u0449\u043E 123 \u4E2D\u6587",
     {"\u043D\u0435\u0449\u043E", " ", "123", " ", "\u4E2D\u6587"}},
    {PreTokenizer::DeepseekLlm, "3.14", {"3", ".", "14"}},
    {PreTokenizer::DeepseekCoder, "Hello, world!", {"Hello", ",", " world", "!"}},
    {PreTokenizer::DeepseekCoder, "x 12 \u00BD", {"x", " ", "1", "2", " ", "\u00BD"}},
    {PreTokenizer::DeepseekCoder, "\u4E2D\u6587 \u5B57\u7B26", {"\u4E2D\u6587", " ", "\u5B57\u7B26"}},
    {PreTokenizer::DeepseekCoder, "a\r\nb", {"a", "\r", "\n", "b"}},
    {PreTokenizer::DeepseekCoder, "\u2009s", {"\u2009", "s"}},
    {PreTokenizer::Gemma4, "a\u2581b\n\nc", {"a\u2581b", "\n\n", "c"}},
    {PreTokenizer::Gemma4, "\n\n", {"\n\n"}},
    {PreTokenizer::Gemma4, "x\n", {"x", "\n"}},
    {PreTokenizer::Gemma4, "\u2581\u2581", {"\u2581\u2581"}},
};

TEST(PreTokenizer, MatchesTheReferenceRegexes) {
  for (const SplitCase& c : kSplitCases) {
    EXPECT_EQ(pretokenize(c.pre, c.text), c.parts) << pre_tokenizer_name(c.pre) << " on '" << c.text << "'";
  }
}

TEST(PreTokenizer, NamesMapToPatterns) {
  bool known = false, ignore = false;
  EXPECT_EQ(pre_tokenizer_from_name("gpt-2", &known, &ignore), PreTokenizer::Gpt2);
  EXPECT_TRUE(known);
  EXPECT_FALSE(ignore);
  EXPECT_EQ(pre_tokenizer_from_name("llama-bpe", &known, &ignore), PreTokenizer::Llama3);
  EXPECT_TRUE(ignore);
  EXPECT_EQ(pre_tokenizer_from_name("qwen2", &known, &ignore), PreTokenizer::Qwen2);
  EXPECT_FALSE(ignore);
  EXPECT_EQ(pre_tokenizer_from_name("tekken", &known, &ignore), PreTokenizer::Tekken);
  const struct {
    const char* name;
    PreTokenizer pre;
  } more[] = {{"qwen35", PreTokenizer::Qwen35},           {"starcoder", PreTokenizer::Starcoder},
              {"refact", PreTokenizer::Starcoder},        {"command-r", PreTokenizer::Starcoder},
              {"falcon", PreTokenizer::Falcon},           {"deepseek-llm", PreTokenizer::DeepseekLlm},
              {"deepseek-coder", PreTokenizer::DeepseekCoder}, {"mpt", PreTokenizer::Gpt2},
              {"gemma4", PreTokenizer::Gemma4}};
  for (const auto& m : more) {
    EXPECT_EQ(pre_tokenizer_from_name(m.name, &known, &ignore), m.pre) << m.name;
    EXPECT_TRUE(known) << m.name;
    EXPECT_FALSE(ignore) << m.name;
  }
  EXPECT_EQ(pre_tokenizer_from_name("whatever", &known, &ignore), PreTokenizer::Gpt2);
  EXPECT_FALSE(known);
}

// pretoken_end() walks the single-pattern pre-tokenizers exactly as the
// whole split does.
TEST(PreTokenizer, PretokenEndFollowsTheSplit) {
  const std::string text = "Hello, y'all!  3333 \u00BD\u4E2D\u6587\n\n x\u2581y";
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  for (PreTokenizer p : {PreTokenizer::Gpt2, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Tekken,
                         PreTokenizer::Qwen35, PreTokenizer::Starcoder, PreTokenizer::Gemma4}) {
    ASSERT_TRUE(is_single_pattern(p));
    std::vector<std::string> walked;
    for (size_t i = 0; i < text.size();) {
      const size_t e = pretoken_end(p, s, text.size(), i);
      walked.push_back(text.substr(i, e - i));
      i = e;
    }
    EXPECT_EQ(walked, pretokenize(p, text)) << pre_tokenizer_name(p);
  }
}

TEST(PreTokenizer, InvalidUtf8NeverStallsAndCoversEveryByte) {
  std::mt19937 rng(99);
  for (PreTokenizer p : {PreTokenizer::Gpt2, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Tekken,
                         PreTokenizer::Qwen35, PreTokenizer::Starcoder, PreTokenizer::Falcon,
                         PreTokenizer::DeepseekLlm, PreTokenizer::DeepseekCoder, PreTokenizer::Gemma4}) {
    for (int iter = 0; iter < 500; ++iter) {
      std::string s;
      const int len = int(rng() % 40);
      for (int k = 0; k < len; ++k) s.push_back(char(rng() % 256));
      std::string joined;
      for (const std::string& part : pretokenize(p, s)) {
        EXPECT_FALSE(part.empty());
        joined += part;
      }
      EXPECT_EQ(joined, s);
    }
  }
}

// --- Unicode tables ----------------------------------------------------------

TEST(Unicode, CategoriesFromTheUcd) {
  EXPECT_STREQ(unicode_version(), "15.0.0");
  EXPECT_EQ(unicode_category('A'), UCat::Lu);
  EXPECT_EQ(unicode_category('z'), UCat::Ll);
  EXPECT_EQ(unicode_category(0x01C5), UCat::Lt);   // ǅ
  EXPECT_EQ(unicode_category(0x02B0), UCat::Lm);   // ʰ
  EXPECT_EQ(unicode_category(0x4E2D), UCat::Lo);   // 中 (inside a First/Last range)
  EXPECT_EQ(unicode_category(0x2A6DF), UCat::Lo);  // last of CJK Extension B
  EXPECT_EQ(unicode_category(0x0301), UCat::Mn);
  EXPECT_EQ(unicode_category(0x0663), UCat::Nd);   // Arabic-Indic three
  EXPECT_EQ(unicode_category(0x216B), UCat::Nl);   // Roman numeral twelve
  EXPECT_EQ(unicode_category(0x00BD), UCat::No);   // ½
  EXPECT_EQ(unicode_category('!'), UCat::Po);
  EXPECT_EQ(unicode_category(0x20AC), UCat::Sc);   // €
  EXPECT_EQ(unicode_category(0x1F999), UCat::So);  // 🦙
  EXPECT_EQ(unicode_category(0x3000), UCat::Zs);
  EXPECT_EQ(unicode_category(0x0378), UCat::Cn);   // unassigned
  EXPECT_EQ(unicode_category(0xD800), UCat::Cs);
  EXPECT_EQ(unicode_category(0x10FFFD), UCat::Co);
  EXPECT_EQ(unicode_category(0x110000), UCat::Cn);
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2009u, 0x2028u, 0x3000u})
    EXPECT_TRUE(unicode_is_space(cp)) << cp;
  for (uint32_t cp : {0x1Cu, 0x200Bu, 0xFEFFu, uint32_t('a')}) EXPECT_FALSE(unicode_is_space(cp)) << cp;
  EXPECT_EQ(unicode_classes(0x0301) & (kClsLetter | kClsMark), kClsMark);
  EXPECT_EQ(unicode_classes(0x00BD), kClsNumber);
}

TEST(Unicode, Utf8DecodeRejectsMalformedSequences) {
  auto dec = [](const std::string& s, size_t* len) {
    return utf8_decode(reinterpret_cast<const uint8_t*>(s.data()), s.size(), len);
  };
  size_t len = 0;
  EXPECT_EQ(dec("\xE4\xB8\xAD", &len), 0x4E2Du);
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(dec("\xF0\x9F\xA6\x99", &len), 0x1F999u);
  EXPECT_EQ(len, 4u);
  for (const char* bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xE4\xB8", "\xFF"}) {
    const std::string s(bad);
    EXPECT_EQ(dec(s, &len), kInvalidByteBase + uint8_t(s[0])) << s.size();
    EXPECT_EQ(len, 1u);
  }
}

}  // namespace
}  // namespace llm
