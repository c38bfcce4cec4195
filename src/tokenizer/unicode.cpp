#include "tokenizer/unicode.h"

namespace llm {
namespace {

#include "tokenizer/unicode_tables.inc"

static_assert(sizeof(kUcdStage1) == 0x110000 / 256, "stage1 covers every plane");

constexpr uint8_t kSpaceBit = 0x20;
constexpr uint8_t kCatMask = 0x1F;

constexpr uint8_t ucd_entry(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  return kUcdStage2[size_t(kUcdStage1[cp >> 8]) * 256 + (cp & 0xFF)];
}

constexpr uint8_t classes_of_entry(uint8_t e) {
  uint8_t cls = (e & kSpaceBit) ? kClsSpace : 0;
  switch (UCat(e & kCatMask)) {
    case UCat::Lu:
    case UCat::Lt: cls |= kClsLetter | kClsUpperish; break;
    case UCat::Ll: cls |= kClsLetter | kClsLowerish; break;
    case UCat::Lm:
    case UCat::Lo: cls |= kClsLetter | kClsUpperish | kClsLowerish; break;
    case UCat::Mn:
    case UCat::Mc:
    case UCat::Me: cls |= kClsMark | kClsUpperish | kClsLowerish; break;
    case UCat::Nd:
    case UCat::Nl:
    case UCat::No: cls |= kClsNumber; break;
    case UCat::Pc:
    case UCat::Pd:
    case UCat::Ps:
    case UCat::Pe:
    case UCat::Pi:
    case UCat::Pf:
    case UCat::Po: cls |= kClsPunct; break;
    case UCat::Sm:
    case UCat::Sc:
    case UCat::Sk:
    case UCat::So: cls |= kClsSymbol; break;
    default: break;
  }
  return cls;
}

// Class bits for every possible table byte (5-bit category | space bit).
struct ClassTable {
  uint8_t cls[64];
  constexpr ClassTable() : cls() {
    for (int e = 0; e < 64; ++e) cls[e] = classes_of_entry(uint8_t(e));
  }
};
constexpr ClassTable kClassTable;

// GPT-2's bytes_to_unicode(): bytes that are printable Latin-1 ('!'..'~',
// '¡'..'¬', '®'..'ÿ') keep their value; the other 68 get U+0100.. in order.
// The largest mapped code point is U+0143.
constexpr uint32_t kGpt2MaxCp = 0x143;
struct Gpt2ByteMap {
  uint32_t to_cp[256];
  int16_t to_byte[kGpt2MaxCp + 1];
  constexpr Gpt2ByteMap() : to_cp(), to_byte() {
    for (uint32_t i = 0; i <= kGpt2MaxCp; ++i) to_byte[i] = -1;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : next++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};
constexpr Gpt2ByteMap kGpt2Map;

constexpr AsciiClasses make_ascii_classes() {
  AsciiClasses a{};
  for (uint32_t c = 0; c < 128; ++c) a.cls[c] = kClassTable.cls[ucd_entry(c)];
  return a;
}

}  // namespace

const AsciiClasses kAsciiClasses = make_ascii_classes();

UCat unicode_category(uint32_t cp) { return UCat(ucd_entry(cp) & kCatMask); }
bool unicode_is_space(uint32_t cp) { return (ucd_entry(cp) & kSpaceBit) != 0; }
uint8_t unicode_classes(uint32_t cp) { return kClassTable.cls[ucd_entry(cp)]; }
const char* unicode_version() { return kUcdVersion; }

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

uint32_t gpt2_byte_to_cp(uint8_t b) { return kGpt2Map.to_cp[b]; }
int gpt2_cp_to_byte(uint32_t cp) { return cp <= kGpt2MaxCp ? kGpt2Map.to_byte[cp] : -1; }

}  // namespace llm
