// Byte-level BPE pre-tokenizers: hand-written matchers equivalent to the
// split regexes of GPT-2, Llama 3, Qwen2 and Tekken (Mistral Nemo), working
// on code points with real Unicode categories. Each returns where the regex
// match that starts at byte i ends (findall semantics: leftmost alternative
// wins, greedy quantifiers with backtracking). Invalid UTF-8 bytes count as
// one character each that is neither letter, number nor space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llm {

enum class PreTokenizer {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Llama3,
  // as Llama3 with \p{N} (single digits)
  Qwen2,
  // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
  // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
  // \p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Tekken,
};

// Maps tokenizer.ggml.pre to a pre-tokenizer. *known is false for a name this
// library does not know (the result is then Gpt2); *ignore_merges is true
// where the whole word is looked up in the vocabulary before merging (Llama 3, Tekken).
PreTokenizer pre_tokenizer_from_name(const std::string& name, bool* known, bool* ignore_merges);
const char* pre_tokenizer_name(PreTokenizer p);

// End (exclusive, in bytes) of the pre-token starting at byte i < n; always > i.
size_t pretoken_end(PreTokenizer p, const uint8_t* s, size_t n, size_t i);

// Convenience for tests: the whole split.
std::vector<std::string> pretokenize(PreTokenizer p, std::string_view text);

}  // namespace llm
