#include "api/utf8.h"

namespace llm::api {

int utf8_seq(const unsigned char* s, size_t i, size_t n) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + size_t(k) >= n) return -k;
    const unsigned char b = s[i + size_t(k)];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

size_t utf8_complete(const std::string& bytes, std::string& out) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const int len = utf8_seq(s, i, n);
    if (len > 0) {
      out.append(bytes, i, size_t(len));
      i += size_t(len);
    } else if (len < 0) {
      return n - i;  // valid prefix cut by the end: hold back
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return 0;
}

}  // namespace llm::api
