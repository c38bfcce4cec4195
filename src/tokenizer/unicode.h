// Unicode helpers for the tokenizers: UTF-8 decoding that never fails,
// general categories and White_Space from generated UCD tables, and GPT-2's
// byte <-> printable code point mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace llm {

// Unicode general categories; the order is fixed by tests/tools/gen_unicode_tables.py.
enum class UCat : uint8_t {
  Cn = 0, Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po,
  Sm, Sc, Sk, So, Zs, Zl, Zp, Cc, Cf, Cs, Co,
};

// Code points above U+10FFFF stand for one byte of invalid UTF-8:
// kInvalidByteBase + byte. They have category Cn and no flags below.
constexpr uint32_t kInvalidByteBase = 0x110000;

// Classes used by the pre-tokenizer patterns, one bit each.
enum : uint8_t {
  kClsLetter = 1,      // \p{L}
  kClsNumber = 2,      // \p{N}
  kClsSpace = 4,       // \s (White_Space)
  kClsMark = 8,        // \p{M}
  kClsUpperish = 16,   // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]  (tekken)
  kClsLowerish = 32,   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]        (tekken)
  kClsPunct = 64,      // \p{P}
  kClsSymbol = 128,    // \p{S}
};

// Class bits of the ASCII characters; constant-initialized, so usable at any time.
struct AsciiClasses {
  uint8_t cls[128];
};
extern const AsciiClasses kAsciiClasses;

UCat unicode_category(uint32_t cp);
bool unicode_is_space(uint32_t cp);
uint8_t unicode_classes(uint32_t cp);  // kCls* bits
const char* unicode_version();         // of the generated tables

// Decodes one code point at s[0..n), n >= 1. Accepts only well-formed UTF-8
// (no overlongs, no surrogates, <= U+10FFFF); anything else is one invalid
// byte: returns kInvalidByteBase + s[0] with *len = 1.
inline uint32_t utf8_decode(const uint8_t* s, size_t n, size_t* len) {
  const uint8_t b0 = s[0];
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  *len = 1;
  if (b0 < 0xC2 || b0 > 0xF4) return kInvalidByteBase + b0;
  if (b0 < 0xE0) {
    if (n < 2 || (s[1] & 0xC0) != 0x80) return kInvalidByteBase + b0;
    *len = 2;
    return (uint32_t(b0 & 0x1F) << 6) | (s[1] & 0x3F);
  }
  if (b0 < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return kInvalidByteBase + b0;
    const uint32_t cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidByteBase + b0;
    *len = 3;
    return cp;
  }
  if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
    return kInvalidByteBase + b0;
  const uint32_t cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(s[1] & 0x3F) << 12) |
                      (uint32_t(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  if (cp < 0x10000 || cp > 0x10FFFF) return kInvalidByteBase + b0;
  *len = 4;
  return cp;
}

// Appends the UTF-8 encoding of cp (must be <= U+10FFFF).
void utf8_append(uint32_t cp, std::string& out);

// GPT-2 byte-level mapping: every byte gets a printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100 + k).
uint32_t gpt2_byte_to_cp(uint8_t b);
// Inverse; returns -1 for a code point that is not in the mapping.
int gpt2_cp_to_byte(uint32_t cp);

}  // namespace llm
