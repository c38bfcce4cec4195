#include "tokenizer/pretokenize.h"

#include "tokenizer/unicode.h"

namespace llm {
namespace {

constexpr size_t kNone = ~size_t(0);
constexpr uint8_t kL = kClsLetter, kN = kClsNumber, kS = kClsSpace;

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

// Advances over [^\s\p{L}\p{N}].
inline size_t run_other(const uint8_t* s, size_t n, size_t i) {
  while (i < n) {
    const Ch c = char_at(s, n, i);
    if (c.cls & (kL | kN | kS)) break;
    i += c.len;
  }
  return i;
}

// The whitespace alternatives at i (a space character):
//   with_crlf: \s*[\r\n]+ first (ends right after the run's last CR/LF);
//   then \s+(?!\S): the run, minus its last char when a non-space follows;
//   then \s+ (a single space char before a non-space).
size_t space_end(const uint8_t* s, size_t n, size_t i, bool with_crlf) {
  size_t e = i, last_start = i, count = 0, crlf_end = kNone;
  while (e < n) {
    const Ch c = char_at(s, n, e);
    if (!(c.cls & kS)) break;
    if (with_crlf && is_crlf(c.cp)) crlf_end = e + c.len;
    last_start = e;
    e += c.len;
    ++count;
  }
  if (count == 0) return i + char_at(s, n, i).len;  // not reached for valid callers
  if (crlf_end != kNone) return crlf_end;
  if (e == n || count == 1) return e;
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

size_t gpt2_end(const uint8_t* s, size_t n, size_t i) {
  const Ch c = char_at(s, n, i);
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
    if (d.cls & kN) return run_while(s, n, j + d.len, kN);
    if (!(d.cls & kS)) return run_other(s, n, j + d.len);
  }
  return space_end(s, n, i, false);
}

// ' ?[^\s\p{L}\p{N}]+[\r\n]*' (plus '/' in the tail for Tekken); kNone if no match.
size_t punct_end(const uint8_t* s, size_t n, size_t i, const Ch& c, bool slash) {
  size_t j = i;
  Ch d = c;
  if (c.cp == ' ') {
    j = i + 1;
    d = char_at(s, n, j);
  }
  if (!d.len || (d.cls & (kL | kN | kS))) return kNone;
  size_t e = run_other(s, n, j + d.len);
  while (e < n && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/'))) ++e;
  return e;
}

size_t llama3_end(const uint8_t* s, size_t n, size_t i, int max_digits) {
  const Ch c = char_at(s, n, i);
  if (c.cp == '\'') {
    if (size_t e = contraction_end(s, n, i, true)) return e;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls & kL) return run_while(s, n, i + c.len, kL);
  if (!(c.cls & kN) && !is_crlf(c.cp)) {
    const Ch d = char_at(s, n, i + c.len);
    if (d.len && (d.cls & kL)) return run_while(s, n, i + c.len + d.len, kL);
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
  const size_t e = punct_end(s, n, i, c, false);
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

}  // namespace

PreTokenizer pre_tokenizer_from_name(const std::string& name, bool* known, bool* ignore_merges) {
  *known = true;
  *ignore_merges = false;
  if (name == "default" || name == "gpt-2" || name == "gpt2" || name == "phi-2" || name == "olmo" || name.empty())
    return PreTokenizer::Gpt2;
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe" || name == "falcon3") {
    *ignore_merges = true;
    return PreTokenizer::Llama3;
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen" || name == "megrez") return PreTokenizer::Qwen2;
  if (name == "tekken" || name == "mistral-nemo" || name == "pixtral") {
    *ignore_merges = true;
    return PreTokenizer::Tekken;
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
  }
  return "?";
}

size_t pretoken_end(PreTokenizer p, const uint8_t* s, size_t n, size_t i) {
  size_t e;
  switch (p) {
    case PreTokenizer::Llama3: e = llama3_end(s, n, i, 3); break;
    case PreTokenizer::Qwen2: e = llama3_end(s, n, i, 1); break;
    case PreTokenizer::Tekken: e = tekken_end(s, n, i); break;
    default: e = gpt2_end(s, n, i); break;
  }
  // Every character is covered by some alternative; this only guards progress.
  return (e > i && e <= n) ? e : i + 1;
}

std::vector<std::string> pretokenize(PreTokenizer p, std::string_view text) {
  std::vector<std::string> out;
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t e = pretoken_end(p, s, text.size(), i);
    out.emplace_back(text.substr(i, e - i));
    i = e;
  }
  return out;
}

}  // namespace llm
