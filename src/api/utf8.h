// UTF-8 helpers for streaming detokenization.
#pragma once

#include <string>

namespace llm::api {

// Appends to `out` the complete text of `bytes`: valid sequences as they
// are, each byte of an invalid sequence as U+FFFD. Returns how many bytes at
// the end of `bytes` form an incomplete but so-far valid sequence; those are
// not emitted (the caller holds them back for the next piece).
size_t utf8_complete(const std::string& bytes, std::string& out);

// Length of the valid UTF-8 sequence at s[i..n), 0 if invalid, or -k if
// the bytes are a valid prefix cut short by the end (k = bytes present).
int utf8_seq(const unsigned char* s, size_t i, size_t n);

}  // namespace llm::api
