#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace llm {
namespace {

constexpr size_t kNone = ~size_t(0);

// GPT-2's matcher is inlined into pretoken_end(), the tokenizer's inner
// loop, whatever the compiler's size heuristics say (measured: forcing the
// others, or space_end, costs more than it saves).
#if defined(__GNUC__)
#define LLM_PRETOK_INLINE inline __attribute__((always_inline))
#else
#define LLM_PRETOK_INLINE inline
#endif
constexpr uint8_t kL = kClsLetter, kN = kClsNumber, kS = kClsSpace, kM = kClsMark;

struct Ch {
  uint32_t cp;
  uint8_t cls;
  uint8_t len;  // 0 at the end of the text
};

inline Ch char_at(const uint8_t* s, size_t n, size_t i) {
  if (i >= n) return Ch{0, 0, 0};
  const uint8_t b = s[i];
  if (b < 0x80) return Ch{b, kAsciiClasses.cls[b], 1};
  size_t len = 1;
  const uint32_t cp = utf8_decode(s + i, n - i, &len);
  return Ch{cp, unicode_classes(cp), uint8_t(len)};
}

inline bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Advances over characters having any class bit in `mask`.
inline size_t run_while(const uint8_t* s, size_t n, size_t i, uint8_t mask) {
  while (i < n) {
    const Ch c = char_at(s, n, i);
    if (!(c.cls & mask)) break;
    i += c.len;
  }
  return i;
}

// Advances over characters having none of the class bits in `stop`
// ([^\s\p{L}\p{N}] for stop = kL | kN | kS).
inline size_t run_other(const uint8_t* s, size_t n, size_t i, uint8_t stop = kL | kN | kS) {
  while (i < n) {
    const Ch c = char_at(s, n, i);
    if (c.cls & stop) break;
    i += c.len;
  }
  return i;
}

// The whitespace alternatives at i (a space character):
//   with_crlf: \s*[\r\n]+ first (ends right after the run's last CR/LF);
//   then \s+(?!\S): the run, minus its last char when a non-space follows;
//   then \s+ (a single space char before a non-space).
//   number_ends: a number after the run counts as the end of the text (the
//   run is a piece of its own when numbers were split off first: StarCoder).
size_t space_end(const uint8_t* s, size_t n, size_t i, bool with_crlf, bool number_ends = false) {
  size_t e = i, last_start = i, count = 0, crlf_end = kNone;
  uint8_t next_cls = 0;
  while (e < n) {
    const Ch c = char_at(s, n, e);
    if (!(c.cls & kS)) {
      next_cls = c.cls;
      break;
    }
    if (with_crlf && is_crlf(c.cp)) crlf_end = e + c.len;
    last_start = e;
    e += c.len;
    ++count;
  }
  if (count == 0) return i + char_at(s, n, i).len;  // not reached for valid callers
  if (crlf_end != kNone) return crlf_end;
  if (e == n || count == 1 || (number_ends && (next_cls & kN))) return e;
  return last_start;
}

inline uint8_t ascii_lower(uint8_t b) { return (b >= 'A' && b <= 'Z') ? uint8_t(b + 32) : b; }

// 's|'t|'re|'ve|'m|'ll|'d at i (s[i] == '\''); 0 if none.
size_t contraction_end(const uint8_t* s, size_t n, size_t i, bool ignore_case) {
  if (i + 1 >= n) return 0;
  // (?i) folds U+017F LATIN SMALL LETTER LONG S to 's' (CaseFolding.txt);
  // no other character folds to one of these ASCII letters.
  if (ignore_case && i + 2 < n && s[i + 1] == 0xC5 && s[i + 2] == 0xBF) return i + 3;
  const uint8_t a = ignore_case ? ascii_lower(s[i + 1]) : s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 >= n) return 0;
  const uint8_t b = ignore_case ? ascii_lower(s[i + 2]) : s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

// GPT-2; with `numbers_apart` (StarCoder: every \p{N} split off first) a
// number is a pre-token of its own and ends the text for the pattern
// around it: no ' ' joins it, and a whitespace run before it stays whole.
template <bool numbers_apart>
LLM_PRETOK_INLINE size_t gpt2_end(const uint8_t* s, size_t n, size_t i) {
  const Ch c = char_at(s, n, i);
  if constexpr (numbers_apart) {
    if (c.cls & kN) return i + c.len;
  }
  if (c.cp == '\'') {
    if (size_t e = contraction_end(s, n, i, false)) return e;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the optional space only
  // changes where the class run starts.
  size_t j = i;
  Ch d = c;
  if (c.cp == ' ') {
    j = i + 1;
    d = char_at(s, n, j);
  }
  if (d.len) {
    if (d.cls & kL) return run_while(s, n, j + d.len, kL);
    if (d.cls & kN) {
      if (!numbers_apart) return run_while(s, n, j + d.len, kN);
    } else if (!(d.cls & kS)) {
      return run_other(s, n, j + d.len);
    }
  }
  return space_end(s, n, i, false, numbers_apart);
}

// ' ?[^\s\p{L}\p{N}]+[\r\n]*' (plus '/' in the tail for Tekken; `stop`
// adds \p{M} to the excluded classes for Qwen3.5); kNone if no match.
size_t punct_end(const uint8_t* s, size_t n, size_t i, const Ch& c, bool slash, uint8_t stop = kL | kN | kS) {
  size_t j = i;
  Ch d = c;
  if (c.cp == ' ') {
    j = i + 1;
    d = char_at(s, n, j);
  }
  if (!d.len || (d.cls & stop)) return kNone;
  size_t e = run_other(s, n, j + d.len, stop);
  while (e < n && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/'))) ++e;
  return e;
}

// Llama 3 and Qwen2; with `marks` (Qwen3.5) the letter runs are
// [\p{L}\p{M}]+ and the punctuation runs exclude \p{M}.
template <int max_digits, bool marks>
size_t llama3_end(const uint8_t* s, size_t n, size_t i) {
  const uint8_t letters = marks ? kL | kM : kL;
  const Ch c = char_at(s, n, i);
  if (c.cp == '\'') {
    if (size_t e = contraction_end(s, n, i, true)) return e;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+ (a mark as the optional first character
  // gives the same match as the mark starting the run)
  if (c.cls & letters) return run_while(s, n, i + c.len, letters);
  if (!(c.cls & kN) && !is_crlf(c.cp)) {
    const Ch d = char_at(s, n, i + c.len);
    if (d.len && (d.cls & letters)) return run_while(s, n, i + c.len + d.len, letters);
  }
  // \p{N}{1,max_digits}
  if (c.cls & kN) {
    size_t e = i + c.len;
    for (int k = 1; k < max_digits; ++k) {
      const Ch d = char_at(s, n, e);
      if (!(d.cls & kN)) break;
      e += d.len;
    }
    return e;
  }
  const size_t e = punct_end(s, n, i, c, false, marks ? kL | kN | kS | kM : kL | kN | kS);
  if (e != kNone) return e;
  return space_end(s, n, i, true);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ from `start`:
// the star gives back characters until the plus can start, so the plus
// starts at the last "lowerish" position inside or right after the
// "upperish" run.
size_t tekken_lower_end(const uint8_t* s, size_t n, size_t start) {
  size_t p = start, plus_start = kNone;
  while (p < n) {
    const Ch c = char_at(s, n, p);
    if (c.cls & kClsLowerish) plus_start = p;
    if (!(c.cls & kClsUpperish)) break;
    p += c.len;
  }
  if (plus_start == kNone) return kNone;
  return run_while(s, n, plus_start, kClsLowerish);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* from `start`.
size_t tekken_upper_end(const uint8_t* s, size_t n, size_t start) {
  const Ch c = char_at(s, n, start);
  if (!(c.cls & kClsUpperish)) return kNone;
  const size_t u = run_while(s, n, start + c.len, kClsUpperish);
  return run_while(s, n, u, kClsLowerish);
}

size_t tekken_end(const uint8_t* s, size_t n, size_t i) {
  const Ch c = char_at(s, n, i);
  // Each letter alternative first tries with the optional prefix character,
  // then (backtracking) without it, before the next alternative.
  const bool can_prefix = !(c.cls & (kL | kN)) && !is_crlf(c.cp);
  size_t e;
  if (can_prefix && (e = tekken_lower_end(s, n, i + c.len)) != kNone) return e;
  if ((e = tekken_lower_end(s, n, i)) != kNone) return e;
  if (can_prefix && (e = tekken_upper_end(s, n, i + c.len)) != kNone) return e;
  if ((e = tekken_upper_end(s, n, i)) != kNone) return e;
  if (c.cls & kN) return i + c.len;
  if ((e = punct_end(s, n, i, c, true)) != kNone) return e;
  return space_end(s, n, i, true);
}

// [^\n]+|[\n]+
size_t lines_end(const uint8_t* s, size_t n, size_t i) {
  const bool nl = s[i] == '\n';
  while (++i < n && (s[i] == '\n') == nl) {
  }
  return i;
}

// Code point ranges, sorted and disjoint.
struct Range {
  uint32_t lo, hi;
};

template <size_t N>
bool in_ranges(const Range (&r)[N], uint32_t cp) {
  if (cp < r[0].lo || cp > r[N - 1].hi) return false;
  size_t lo = 0, hi = N;  // first range with r.hi >= cp
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (r[mid].hi < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < N && r[lo].lo <= cp;
}

// The letter class of DeepSeek LLM's second split (one regex, wrapped here)
//   \s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-
//   ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ
//   -Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ
//   -ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+
// as code point ranges (adjacent ones joined).
constexpr Range kDsLetters[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA}, {0x1BC, 0x1BF},
    {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481},
    {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3},
    {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

// [!-/:-~！-／：-～‘-‟　-。] (DeepSeek LLM's third split; ASCII letters are in
// it too, but the second split has taken them by then).
constexpr Range kDsPunct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

// [一-龥ࠀ-一가-퟿] (both DeepSeek vocabularies).
constexpr Range kCjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

inline bool is_ascii_punct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}

// Bytes whose GPT-2 byte character is \p{N}: '0'-'9' and ² ³ ¹ ¼ ½ ¾.
inline bool is_byte_level_digit(uint8_t b) {
  return (b >= '0' && b <= '9') || b == 0xB2 || b == 0xB3 || b == 0xB9 || b == 0xBC || b == 0xBD || b == 0xBE;
}

// Character predicates of the split rules.
bool is_number(const Ch& c) { return (c.cls & kN) != 0; }
bool is_crlf_ch(const Ch& c) { return is_crlf(c.cp); }
bool is_letter(const Ch& c) { return (c.cls & kL) != 0; }
bool is_unicode_punct(const Ch& c) { return (c.cls & kClsPunct) != 0; }
bool is_punct_or_ascii_punct(const Ch& c) { return (c.cls & kClsPunct) != 0 || is_ascii_punct(c.cp); }
bool is_ds_letter(const Ch& c) {
  if (c.cp < 0x80) return c.len && uint32_t((c.cp | 0x20) - 'a') < 26;
  return in_ranges(kDsLetters, c.cp);
}
bool is_ds_punct(const Ch& c) {
  if (c.cp < 0x80) return (c.cp >= 0x21 && c.cp <= 0x2F) || (c.cp >= 0x3A && c.cp <= 0x7E);
  return in_ranges(kDsPunct, c.cp);
}
bool is_cjk(const Ch& c) { return in_ranges(kCjk, c.cp); }

// The leftmost run (`run`) or single character of class `pred` at or after `from`.
template <bool (*pred)(const Ch&)>
bool find_class(const uint8_t* s, size_t e, size_t from, bool run, size_t* mb, size_t* me) {
  for (size_t i = from; i < e;) {
    const Ch c = char_at(s, e, i);
    if (pred(c)) {
      size_t j = i + c.len;
      while (run && j < e) {
        const Ch d = char_at(s, e, j);
        if (!pred(d)) break;
        j += d.len;
      }
      *mb = i;
      *me = j;
      return true;
    }
    i += c.len;
  }
  return false;
}

// The leftmost match of \s?X+ at or after `from`: a space counts only when
// an X follows it.
template <bool (*pred)(const Ch&)>
bool find_space_run(const uint8_t* s, size_t e, size_t from, size_t* mb, size_t* me) {
  for (size_t i = from; i < e;) {
    const Ch c = char_at(s, e, i);
    size_t start = kNone, j = i + c.len;
    if (pred(c)) {
      start = i;
    } else if (c.cls & kS) {
      const Ch d = char_at(s, e, j);
      if (d.len && pred(d)) {
        start = i;
        j += d.len;
      }
    }
    if (start != kNone) {
      while (j < e) {
        const Ch d = char_at(s, e, j);
        if (!pred(d)) break;
        j += d.len;
      }
      *mb = start;
      *me = j;
      return true;
    }
    i += c.len;
  }
  return false;
}

// \s+$: the whitespace that ends the piece. '$' also matches before a final
// '\n'; pieces reaching this rule hold a '\n' only as the whole piece (DeepSeek
// LLM isolates every CR and LF first), which \s+ covers either way.
bool find_trailing_space(const uint8_t* s, size_t e, size_t from, size_t* mb, size_t* me) {
  size_t run_start = kNone;
  for (size_t i = from; i < e;) {
    const Ch c = char_at(s, e, i);
    if (c.cls & kS) {
      if (run_start == kNone) run_start = i;
    } else {
      run_start = kNone;
    }
    i += c.len;
  }
  if (run_start == kNone) return false;
  *mb = run_start;
  *me = e;
  return true;
}

bool find_byte_digits(const uint8_t* s, size_t e, size_t from, size_t* mb, size_t* me) {
  size_t i = from;
  while (i < e && !is_byte_level_digit(s[i])) ++i;
  if (i == e) return false;
  size_t j = i + 1;
  while (j < e && is_byte_level_digit(s[j])) ++j;
  *mb = i;
  *me = j;
  return true;
}

bool find_three_digits(const uint8_t* s, size_t e, size_t from, size_t* mb, size_t* me) {
  size_t run = 0;  // ASCII digits ending at i
  for (size_t i = from; i < e; ++i) {
    run = (s[i] >= '0' && s[i] <= '9') ? run + 1 : 0;
    if (run == 3) {
      *mb = i - 2;
      *me = i + 1;
      return true;
    }
  }
  return false;
}

}  // namespace

PreTokenizer pre_tokenizer_from_name(const std::string& name, bool* known, bool* ignore_merges) {
  // Names as llama.cpp's llama-vocab.cpp maps them; several share a pattern.
  static const struct {
    const char* name;
    PreTokenizer pre;
    bool ignore_merges;
  } kNames[] = {
      {"default", PreTokenizer::Gpt2, false},
      {"gpt-2", PreTokenizer::Gpt2, false},
      {"gpt2", PreTokenizer::Gpt2, false},
      {"phi-2", PreTokenizer::Gpt2, false},
      {"olmo", PreTokenizer::Gpt2, false},
      {"mpt", PreTokenizer::Gpt2, false},
      {"jais", PreTokenizer::Gpt2, false},
      {"trillion", PreTokenizer::Gpt2, false},
      {"granite-docling", PreTokenizer::Gpt2, false},
      {"exaone4", PreTokenizer::Gpt2, false},
      {"llama3", PreTokenizer::Llama3, true},
      {"llama-v3", PreTokenizer::Llama3, true},
      {"llama-bpe", PreTokenizer::Llama3, true},
      {"falcon3", PreTokenizer::Llama3, true},
      {"falcon-h1", PreTokenizer::Llama3, true},
      {"midm-2.0", PreTokenizer::Llama3, true},
      {"lfm2", PreTokenizer::Llama3, true},
      {"jina-v5-nano", PreTokenizer::Llama3, true},
      {"dbrx", PreTokenizer::Llama3, false},
      {"smaug-bpe", PreTokenizer::Llama3, false},
      {"qwen2", PreTokenizer::Qwen2, false},
      {"deepseek-r1-qwen", PreTokenizer::Qwen2, false},
      {"megrez", PreTokenizer::Qwen2, false},
      {"stablelm2", PreTokenizer::Qwen2, false},
      {"kormo", PreTokenizer::Qwen2, false},
      {"f2llmv2", PreTokenizer::Qwen2, false},
      {"qwen35", PreTokenizer::Qwen35, false},
      {"tekken", PreTokenizer::Tekken, true},
      {"mistral-nemo", PreTokenizer::Tekken, true},
      {"pixtral", PreTokenizer::Tekken, true},  // llama.cpp now uses the Llama 3 pattern for this name
      {"starcoder", PreTokenizer::Starcoder, false},
      {"refact", PreTokenizer::Starcoder, false},
      {"command-r", PreTokenizer::Starcoder, false},
      {"smollm", PreTokenizer::Starcoder, false},
      {"codeshell", PreTokenizer::Starcoder, false},
      {"exaone", PreTokenizer::Starcoder, false},
      {"minerva-7b", PreTokenizer::Starcoder, false},
      {"mellum2", PreTokenizer::Starcoder, false},
      {"falcon", PreTokenizer::Falcon, false},
      {"deepseek-llm", PreTokenizer::DeepseekLlm, false},
      {"deepseek-coder", PreTokenizer::DeepseekCoder, false},
      {"gemma4", PreTokenizer::Gemma4, false},
  };
  *known = true;
  *ignore_merges = false;
  if (name.empty()) return PreTokenizer::Gpt2;
  for (const auto& n : kNames) {
    if (name == n.name) {
      *ignore_merges = n.ignore_merges;
      return n.pre;
    }
  }
  *known = false;
  return PreTokenizer::Gpt2;
}

const char* pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::Gpt2: return "gpt-2";
    case PreTokenizer::Llama3: return "llama3";
    case PreTokenizer::Qwen2: return "qwen2";
    case PreTokenizer::Tekken: return "tekken";
    case PreTokenizer::Qwen35: return "qwen35";
    case PreTokenizer::Starcoder: return "starcoder";
    case PreTokenizer::Falcon: return "falcon";
    case PreTokenizer::DeepseekLlm: return "deepseek-llm";
    case PreTokenizer::DeepseekCoder: return "deepseek-coder";
    case PreTokenizer::Gemma4: return "gemma4";
  }
  return "?";
}

namespace {

// The rules of the multi-rule pre-tokenizers, as Hugging Face "Split"
// pre-tokenizers with the "Isolated" behaviour: each rule splits every piece
// the previous rules made into its matches and the gaps between them.
enum class Rule {
  Gpt2,               // the GPT-2 pattern; covers every character
  EachNumber,         // \p{N}
  NumberRun,          // \p{N}+
  PunctRun,           // [\p{P}$+<=>^`|~]+ (Unicode or ASCII punctuation)
  ByteLevelDigitRun,  // bytes whose GPT-2 byte character is numeric, one or more
  ThreeAsciiDigits,   // [0-9]{3}
  EachCrLf,           // [\r\n]
  SpaceLetters,       // \s?\p{L}+
  SpacePunct,         // \s?\p{P}+
  SpaceDsLetters,     // \s?[DeepSeek LLM letters]+
  SpaceDsPunct,       // \s?[!-/:-~！-／：-～‘-‟　-。]+
  TrailingSpace,      // \s+$
  CjkRun,             // [\x{800}-\x{9FA5}\x{AC00}-\x{D7FF}]+
};

// The leftmost match of rule R in s[from..e) (e ends the piece and acts as
// the end of the text); false if there is none.
template <Rule R>
inline bool next_match(const uint8_t* s, size_t e, size_t from, size_t* mb, size_t* me) {
  if constexpr (R == Rule::Gpt2) {
    *mb = from;
    *me = pretoken_end(PreTokenizer::Gpt2, s, e, from);
    return true;
  } else if constexpr (R == Rule::EachNumber) {
    return find_class<is_number>(s, e, from, false, mb, me);
  } else if constexpr (R == Rule::NumberRun) {
    return find_class<is_number>(s, e, from, true, mb, me);
  } else if constexpr (R == Rule::PunctRun) {
    return find_class<is_punct_or_ascii_punct>(s, e, from, true, mb, me);
  } else if constexpr (R == Rule::ByteLevelDigitRun) {
    return find_byte_digits(s, e, from, mb, me);
  } else if constexpr (R == Rule::ThreeAsciiDigits) {
    return find_three_digits(s, e, from, mb, me);
  } else if constexpr (R == Rule::EachCrLf) {
    return find_class<is_crlf_ch>(s, e, from, false, mb, me);
  } else if constexpr (R == Rule::SpaceLetters) {
    return find_space_run<is_letter>(s, e, from, mb, me);
  } else if constexpr (R == Rule::SpacePunct) {
    return find_space_run<is_unicode_punct>(s, e, from, mb, me);
  } else if constexpr (R == Rule::SpaceDsLetters) {
    return find_space_run<is_ds_letter>(s, e, from, mb, me);
  } else if constexpr (R == Rule::SpaceDsPunct) {
    return find_space_run<is_ds_punct>(s, e, from, mb, me);
  } else if constexpr (R == Rule::TrailingSpace) {
    return find_trailing_space(s, e, from, mb, me);
  } else {
    static_assert(R == Rule::CjkRun);
    return find_class<is_cjk>(s, e, from, true, mb, me);
  }
}

template <Rule... Rs>
struct Rules {};

// Applies the rules to the piece s[b..e); appends the end of every final piece.
inline void split(Rules<>, const uint8_t*, size_t, size_t e, std::vector<size_t>& ends) { ends.push_back(e); }

template <Rule R, Rule... Rest>
void split(Rules<R, Rest...>, const uint8_t* s, size_t b, size_t e, std::vector<size_t>& ends) {
  size_t at = b, mb = 0, me = 0;
  while (at < e && next_match<R>(s, e, at, &mb, &me)) {
    if (mb > at) split(Rules<Rest...>{}, s, at, mb, ends);
    split(Rules<Rest...>{}, s, mb, me, ends);
    at = me;
  }
  if (at < e) split(Rules<Rest...>{}, s, at, e, ends);
}

// The first pre-token of s[0..n) for a multi-rule pre-tokenizer (out of
// pretoken_end(), which stays lean for the single-pattern ones).
#if defined(__GNUC__)
__attribute__((noinline))
#endif
size_t first_pretoken(PreTokenizer p, const uint8_t* s, size_t n) {
  std::vector<size_t> ends;
  pretoken_ends(p, s, n, ends);
  return ends.empty() ? 1 : ends.front();
}

}  // namespace

size_t pretoken_end(PreTokenizer p, const uint8_t* s, size_t n, size_t i) {
  size_t e;
  switch (p) {
    case PreTokenizer::Llama3: e = llama3_end<3, false>(s, n, i); break;
    case PreTokenizer::Qwen2: e = llama3_end<1, false>(s, n, i); break;
    case PreTokenizer::Tekken: e = tekken_end(s, n, i); break;
    case PreTokenizer::Qwen35: e = llama3_end<1, true>(s, n, i); break;
    case PreTokenizer::Gemma4: e = lines_end(s, n, i); break;
    case PreTokenizer::Falcon:
    case PreTokenizer::DeepseekLlm:
    case PreTokenizer::DeepseekCoder: e = i + first_pretoken(p, s + i, n - i); break;
    case PreTokenizer::Starcoder: e = gpt2_end<true>(s, n, i); break;
    default: e = gpt2_end<false>(s, n, i); break;
  }
  // Every character is covered by some alternative; this only guards progress.
  return (e > i && e <= n) ? e : i + 1;
}

void pretoken_ends(PreTokenizer p, const uint8_t* s, size_t n, std::vector<size_t>& ends) {
  if (n == 0) return;
  switch (p) {
    case PreTokenizer::Falcon:
      // Punctuation(contiguous), ByteLevel (GPT-2 pattern), Digits, Split [0-9]{3}
      split(Rules<Rule::PunctRun, Rule::Gpt2, Rule::ByteLevelDigitRun, Rule::ThreeAsciiDigits>{}, s, 0, n, ends);
      return;
    case PreTokenizer::DeepseekLlm:
      split(Rules<Rule::EachCrLf, Rule::SpaceDsLetters, Rule::SpaceDsPunct, Rule::TrailingSpace, Rule::CjkRun,
                  Rule::NumberRun>{},
            s, 0, n, ends);
      return;
    case PreTokenizer::DeepseekCoder:
      split(Rules<Rule::EachCrLf, Rule::SpaceLetters, Rule::SpacePunct, Rule::CjkRun, Rule::EachNumber>{}, s, 0, n,
            ends);
      return;
    default:
      for (size_t i = 0; i < n;) {
        i = pretoken_end(p, s, n, i);
        ends.push_back(i);
      }
      return;
  }
}

bool is_single_pattern(PreTokenizer p) {
  return p != PreTokenizer::Falcon && p != PreTokenizer::DeepseekLlm && p != PreTokenizer::DeepseekCoder;
}

std::vector<std::string> pretokenize(PreTokenizer p, std::string_view text) {
  std::vector<size_t> ends;
  pretoken_ends(p, reinterpret_cast<const uint8_t*>(text.data()), text.size(), ends);
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e : ends) {
    out.emplace_back(text.substr(b, e - b));
    b = e;
  }
  return out;
}

}  // namespace llm
