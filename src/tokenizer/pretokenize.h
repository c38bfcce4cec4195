// Byte-level BPE pre-tokenizers: hand-written matchers equivalent to the
// split regexes of the Hugging Face tokenizers that llama.cpp names in
// tokenizer.ggml.pre, working on code points with real Unicode categories.
// Invalid UTF-8 bytes count as one character each that is neither letter,
// number, mark, punctuation nor space.
//
// Most are one pattern whose matches cover every character (findall
// semantics: leftmost alternative wins, greedy quantifiers with
// backtracking). Falcon and DeepSeek are lists of rules applied in order, as
// a Hugging Face "Sequence" of "Split" pre-tokenizers with the "Isolated"
// behaviour: each rule splits every piece the previous rules made into its
// matches and the gaps between them, and the pieces after the last rule are
// the pre-tokens. Every rule sees its piece as a whole text: lookaheads and
// '$' stop at the piece's end.
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
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+   (Qwen3.5: marks stay with their letters)
  Qwen35,
  // [^\n]+|[\n]+ on text whose spaces are already U+2581 (Gemma 4's
  // SentencePiece-style BPE; not byte-level)
  Gemma4,
  // \p{N} isolated, then Gpt2 (StarCoder, Refact, Command R: Digits(individual) + ByteLevel);
  // one pattern here: Gpt2 with every number a pre-token that ends the text
  // around it
  Starcoder,
  // [\p{P}$+<=>^`|~]+ isolated, then Gpt2, then runs of digits *after* the
  // byte-level mapping (the bytes 0-9, B2, B3, B9, BC, BD, BE map to
  // numeric characters), then [0-9]{3} (Falcon: Punctuation, ByteLevel,
  // Digits, Split, in that order)
  Falcon,
  // [\r\n], \s?[Latin/Greek/Cyrillic/... letters]+, \s?[!-/:-~ and CJK punctuation]+,
  // \s+$, [\x{800}-\x{9FA5}\x{AC00}-\x{D7FF}]+, \p{N}+ (DeepSeek LLM)
  DeepseekLlm,
  // [\r\n], \s?\p{L}+, \s?\p{P}+, [\x{800}-\x{9FA5}\x{AC00}-\x{D7FF}]+, \p{N} (DeepSeek Coder)
  DeepseekCoder,
};

// Maps tokenizer.ggml.pre to a pre-tokenizer. *known is false for a name this
// library does not know (the result is then Gpt2); *ignore_merges is true
// where the whole word is looked up in the vocabulary before merging (Llama 3, Tekken).
PreTokenizer pre_tokenizer_from_name(const std::string& name, bool* known, bool* ignore_merges);
const char* pre_tokenizer_name(PreTokenizer p);

// Appends the end (exclusive, in bytes) of every pre-token of s[0..n), in
// order; pre-tokens are never empty and cover the text.
void pretoken_ends(PreTokenizer p, const uint8_t* s, size_t n, std::vector<size_t>& ends);

// True for the pre-tokenizers that are one pattern, whose pretoken_end()
// walks the split.
bool is_single_pattern(PreTokenizer p);

// End (exclusive, in bytes) of the first pre-token of s[i..n), i < n; always
// > i. For a single-pattern pre-tokenizer this is the pre-token that starts
// at i when i is a boundary, so a loop over it splits a whole text; the
// others take s[i..n) as a text of its own (and split it all), so use
// pretoken_ends() for them.
size_t pretoken_end(PreTokenizer p, const uint8_t* s, size_t n, size_t i);

// Convenience for tests: the whole split.
std::vector<std::string> pretokenize(PreTokenizer p, std::string_view text);

}  // namespace llm
