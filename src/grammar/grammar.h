// Constrained generation: GBNF grammars and a JSON Schema subset compiled into
// per-step token masks (docs/GRAMMAR.md).
//
//   parse_gbnf(text)            -> Grammar   (immutable, shared by every session)
//   json_schema_to_gbnf(schema) -> GBNF text (then parse_gbnf)
//   make_vocab(pieces, eog)     -> Vocab     (once per model: the sorted token bytes)
//   Matcher(grammar, vocab)                  (per session: the parse state)
//
// Grammars are over Unicode code points; tokens are byte strings, so a token
// may end inside a UTF-8 sequence and the matcher keeps the partial code point.
// Everything here throws llm::Error; nothing allocates without a bound.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace llm::grammar {

class Vocab;
namespace detail {
struct Cache;
}

// ---- compiled grammar ---------------------------------------------------------
// Every rule is a list of alternatives; every alternative a run of elements in
// one flat array, closed by an End element. A parse position is an index into
// that array, and a parse stack a vector of positions (top = back(): the next
// element to match; below it the return positions of the rules being matched).
enum class Op : uint8_t {
  End,           // closes an alternative
  Chars,         // one code point from charsets[arg]
  Ref,           // rule arg
  Token,         // exactly token id arg (<[id]>)
  NotToken,      // any one token but id arg (!<[id]>)
  TokenText,     // the token whose piece is token_texts[arg] (<text>), resolved per vocabulary
  NotTokenText,  // any one token but that one
};

struct Element {
  Op op;
  uint32_t arg;
};

// A set of code points: a bitmap for ASCII, sorted disjoint ranges above.
struct CharSet {
  uint64_t ascii[2] = {0, 0};
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive, all >= 0x80
  bool contains(uint32_t cp) const;
  bool intersects(uint32_t lo, uint32_t hi) const;  // any code point in [lo, hi]
};

struct Rule {
  std::string name;
  bool generated = false;     // made for a group or a repetition, not written by the user
  bool transparent = false;   // short, bounded match: the mask cache key looks through it
  // x{m,n} chains O(k) ::= x O(k-1) | "" (x never empty), k >= 2: k, else 0.
  // O(k)'s elements sit 4(k-j) after O(j)'s, so a cache key may map a frame in
  // O(k) to O(j) when no token can use up the difference.
  uint32_t chain_k = 0;
  std::vector<uint32_t> alts; // start position of each alternative
};

class Grammar {
 public:
  std::vector<Element> elems;
  std::vector<uint32_t> elem_rule;  // owning rule of each position
  std::vector<CharSet> charsets;
  std::vector<Rule> rules;
  std::vector<std::string> token_texts;
  uint32_t root = 0;

  // Token classifications per vocabulary (matcher.cpp), filled lazily and
  // shared by every Matcher of this grammar and that vocabulary.
  mutable std::mutex cache_mu;
  mutable std::vector<std::weak_ptr<detail::Cache>> caches;
};

// Parses GBNF (llama.cpp's grammars/README.md). Throws
// Error(LLM_ERR_INVALID_ARGUMENT, "grammar: line L, column C: ...") for syntax
// errors, undefined rules, a missing root, left recursion, or a grammar over the size caps.
std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root = "root");

// Converts a JSON Schema (the subset in docs/GRAMMAR.md) to GBNF whose root
// rule is "root". Throws Error(LLM_ERR_INVALID_ARGUMENT, "json schema: line L,
// column C: ...") for bad JSON and "json schema: at /json/pointer: ..." for an
// unsupported or invalid schema.
std::string json_schema_to_gbnf(std::string_view schema_json);

// ---- vocabulary ------------------------------------------------------------------
class Vocab {
 public:
  int32_t n_vocab() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  bool is_eog(int32_t id) const { return is_eog_[size_t(id)] != 0; }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }

  // Tokens that can match text (non-empty piece, not end-of-generation),
  // sorted by piece bytes; lcp_[i] = common prefix of sorted_[i-1] and sorted_[i].
  const std::vector<int32_t>& sorted() const { return sorted_; }
  // Piece of sorted()[i], from one contiguous buffer (walked in order: no cache misses).
  std::string_view sorted_piece(size_t i) const {
    return std::string_view(sorted_bytes_.data() + sorted_off_[i], sorted_off_[i + 1] - sorted_off_[i]);
  }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  size_t max_piece_len() const { return max_piece_len_; }
  // Token whose piece is exactly `text` (the lowest id), or -1.
  int32_t find_piece(std::string_view text) const;

 private:
  friend std::shared_ptr<const Vocab> make_vocab(std::vector<std::string>, std::vector<int32_t>);
  std::vector<std::string> pieces_;
  std::vector<uint8_t> is_eog_;
  std::vector<int32_t> eog_ids_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::string sorted_bytes_;
  std::vector<size_t> sorted_off_;  // sorted_.size() + 1
  size_t max_piece_len_ = 0;
};

// pieces[id] = the raw bytes token id stands for (empty for control tokens).
// eog_ids: end-of-generation tokens (out-of-range ids are an error).
// Pieces longer than 65535 bytes are an error.
std::shared_ptr<const Vocab> make_vocab(std::vector<std::string> pieces, std::vector<int32_t> eog_ids);

// ---- matcher -----------------------------------------------------------------------
namespace detail {
struct Partial {  // an unfinished UTF-8 sequence
  uint32_t value = 0;
  uint8_t need = 0;  // continuation bytes still to come (0: none pending)
  uint8_t len = 0;   // bytes of the sequence seen so far
  bool operator==(const Partial& o) const { return value == o.value && need == o.need && len == o.len; }
};
using Stack = std::vector<uint32_t>;
struct State {
  std::vector<Stack> stacks;  // sorted, unique; an empty stack = the grammar may end here
  Partial partial;
};
}  // namespace detail

class Matcher {
 public:
  // Throws Error(LLM_ERR_INVALID_ARGUMENT) if a <token text> of the grammar is
  // not exactly one token of the vocabulary, or the start state is over the caps.
  Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocab> vocab);

  void reset();
  // Sets the logits of forbidden tokens to -INFINITY. EOG tokens are allowed
  // only when the grammar can end here; once it has ended only EOG is allowed.
  // n_vocab may differ from the vocabulary's size (ids past it are not touched;
  // ids past the vocabulary are forbidden).
  void apply_mask(float* logits, int32_t n_vocab);
  // Allowed tokens as a bitset (bit i of word i/64), size (n_vocab + 63) / 64.
  void compute_mask(std::vector<uint64_t>& bits);
  bool allows(int32_t token) const;
  // Advances; throws Error(LLM_ERR_INVALID_ARGUMENT) if the token is not allowed.
  void accept(int32_t token);
  bool can_end() const;
  bool ended() const;

  // Brute force (tests): walks each token through a copy of the state.
  void compute_mask_slow(std::vector<uint64_t>& bits) const;
  size_t n_stacks() const { return state_.stacks.size(); }
  // How often this thread's matchers hit a cap (kMaxStacks, kMaxDepth,
  // kMaxExpand) so far. Near a cap the fast mask, which expands only the top
  // frames of each stack, may allow a token whose whole-state walk (allows,
  // accept, compute_mask_slow) hits the cap and fails: accept then throws
  // LLM_ERR_INVALID_ARGUMENT, a status, not a crash.
  static uint64_t cap_hits();

 private:
  bool advance_token(int32_t token, detail::State& out) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocab> vocab_;
  std::shared_ptr<detail::Cache> cache_;
  detail::State state_;
  bool terminated_ = false;  // an EOG token was accepted
  // apply_mask's scratch; a copy (fork) starts without one.
  struct Scratch {
    std::vector<uint64_t> bits;
    Scratch() = default;
    Scratch(const Scratch&) {}
    Scratch& operator=(const Scratch&) { return *this; }
  };
  Scratch mask_;
};

}  // namespace llm::grammar
