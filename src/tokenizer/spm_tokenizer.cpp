// SentencePiece-style BPE ("llama" vocabularies, llama2.c tokenizer files).
//
// Text -> optional dummy-prefix space -> ' ' replaced by U+2581 -> one symbol
// per UTF-8 character -> repeatedly merge the adjacent pair whose
// concatenation is a vocabulary piece with the highest score (ties: leftmost)
// -> symbols that are not pieces become <0xXX> byte tokens (or <unk>).
// The merge loop uses a linked list of symbols and a max-heap of candidate
// pairs, O(n log n). When no piece joins a word to the '▁' after it (true
// for Llama 2), each '▁'-led word is merged on its own, and repeated words
// come from a per-thread cache.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

namespace llm {
namespace {

using tok::PieceMap;

constexpr char kSpaceMark[] = "\xE2\x96\x81";  // U+2581 '▁'
constexpr size_t kSpaceMarkLen = 3;

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(VocabData v);

  void encode(std::string_view text, bool add_bos, bool parse_special, std::vector<int32_t>& out) const override;
  void append_piece(int32_t id, std::string& out) const override { pieces_.append_to(id, out); }
  bool strip_space_after_bos() const override { return vocab_.add_space_prefix; }

 private:
  struct Symbol {
    int32_t prev, next;  // linked list over live symbols; -1 at the ends
    uint32_t off, len;   // bytes of the normalized text; len 0 once merged away
    int32_t id;          // piece id, or -1 for a character that is not a piece
  };
  struct Bigram {
    float score;
    int32_t left, right;  // symbol indices
    uint32_t len;         // combined length when queued (stale entries differ)
    int32_t id;           // id of the merged piece
  };
  struct Scratch {
    std::string norm;
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
  };

  void encode_segment(std::string_view text, Scratch& sc, std::vector<int32_t>& out) const;
  void encode_word(uint32_t begin, uint32_t end, Scratch& sc, std::vector<int32_t>& out) const;
  void try_add_bigram(Scratch& sc, int32_t left, int32_t right) const;
  void emit_bytes(const Scratch& sc, const Symbol& s, std::vector<int32_t>& out) const;
  bool any_piece_joins_word_and_space() const;

  PieceMap mergeable_;         // pieces that merges may produce (normal and user-defined)
  int32_t byte_ids_[256];
  tok::PieceTable pieces_;
  tok::SpecialMatcher specials_;       // with parse_special
  tok::SpecialMatcher user_defined_;  // without it
  bool split_words_ = false;  // no mergeable piece contains "x▁" with x != '▁'
  uint64_t instance_;         // owner id in the per-thread word cache
};

SpmTokenizer::SpmTokenizer(VocabData v) : Tokenizer(std::move(v)), instance_(tok::WordCache::new_owner_id()) {
  const size_t n = vocab_.tokens.size();
  // The scores are used in place (no second per-id array: 1 MiB for Gemma 3),
  // NaN replaced so that the heap order is total; no scores means all equal.
  if (vocab_.scores.empty()) vocab_.scores.assign(n, 0.0f);
  for (float& s : vocab_.scores)
    if (std::isnan(s)) s = -std::numeric_limits<float>::infinity();
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  mergeable_.reserve(vocab_.tokens, n);
  pieces_.offsets.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    const std::string& text = vocab_.tokens[i];
    TokenType type = tok::token_type(vocab_, id);
    const int byte = tok::parse_byte_token(text);
    // Without a type array, "<0xXX>" pieces are byte tokens (SentencePiece's convention).
    if (vocab_.types.empty() && byte >= 0) type = TokenType::Byte;
    pieces_.offsets.push_back(uint32_t(pieces_.bytes.size()));
    switch (type) {
      case TokenType::Normal:
      case TokenType::Undefined:
        mergeable_.insert(id);
        for (size_t k = 0; k < text.size();) {  // '▁' -> ' '
          if (text.compare(k, kSpaceMarkLen, kSpaceMark) == 0) {
            pieces_.bytes.push_back(' ');
            k += kSpaceMarkLen;
          } else {
            pieces_.bytes.push_back(text[k++]);
          }
        }
        break;
      case TokenType::UserDefined:
        mergeable_.insert(id);
        pieces_.bytes += text;
        break;
      case TokenType::Byte:
        if (byte >= 0) {
          if (byte_ids_[byte] < 0) byte_ids_[byte] = id;
          pieces_.bytes.push_back(char(byte));
        } else {
          pieces_.bytes += text;
        }
        break;
      case TokenType::Unknown:
        pieces_.bytes += "\xE2\x96\x85";  // U+2585, as llama.cpp renders <unk>
        break;
      case TokenType::Control:
      case TokenType::Unused:
        break;
    }
  }
  pieces_.offsets.push_back(uint32_t(pieces_.bytes.size()));
  specials_.build(vocab_.tokens, tok::special_token_ids(vocab_));
  user_defined_.build(vocab_.tokens, tok::user_defined_ids(vocab_));
  split_words_ = !any_piece_joins_word_and_space();
}

// True if a piece that merges may produce has '▁' right after another
// character than '▁' (then words cannot be merged independently).
bool SpmTokenizer::any_piece_joins_word_and_space() const {
  for (size_t i = 0; i < vocab_.tokens.size(); ++i) {
    const TokenType t = tok::token_type(vocab_, int32_t(i));
    if (t != TokenType::Normal && t != TokenType::Undefined && t != TokenType::UserDefined) continue;
    const std::string& text = vocab_.tokens[i];
    for (size_t p = text.find(kSpaceMark, 1); p != std::string::npos; p = text.find(kSpaceMark, p + 1)) {
      if (p < kSpaceMarkLen || text.compare(p - kSpaceMarkLen, kSpaceMarkLen, kSpaceMark) != 0) return true;
    }
  }
  return false;
}

void SpmTokenizer::encode(std::string_view text, bool add_bos, bool parse_special, std::vector<int32_t>& out) const {
  if (add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
  Scratch sc;
  tok::split_special(
      parse_special ? specials_ : user_defined_, text,
      [&](std::string_view raw) { encode_segment(raw, sc, out); },
      [&](int32_t id) { out.push_back(id); });
}

// Heap order: highest score on top, then the leftmost pair.
struct BigramLess {
  template <class B>
  bool operator()(const B& a, const B& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

void SpmTokenizer::try_add_bigram(Scratch& sc, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const Symbol& l = sc.syms[size_t(left)];
  const Symbol& r = sc.syms[size_t(right)];
  const uint32_t len = l.len + r.len;
  const int32_t id = mergeable_.find(sc.norm.data() + l.off, len);
  if (id < 0) return;
  sc.heap.push_back(Bigram{vocab_.scores[size_t(id)], left, right, len, id});
  std::push_heap(sc.heap.begin(), sc.heap.end(), BigramLess());
}

void SpmTokenizer::encode_segment(std::string_view text, Scratch& sc, std::vector<int32_t>& out) const {
  // Normalize: dummy prefix and spaces as U+2581. Every raw segment starts a
  // "sentence" (it is first or follows a special token), as in llama.cpp.
  std::string& norm = sc.norm;
  norm.clear();
  norm.reserve(text.size() + kSpaceMarkLen);
  if (vocab_.add_space_prefix) norm.append(kSpaceMark, kSpaceMarkLen);
  for (char c : text) {
    if (c == ' ')
      norm.append(kSpaceMark, kSpaceMarkLen);
    else
      norm.push_back(c);
  }
  LLM_CHECK(norm.size() < size_t(UINT32_MAX), LLM_ERR_INVALID_ARGUMENT, "tokenizer: text too long (%zu bytes)",
            text.size());
  if (!split_words_) {
    encode_word(0, uint32_t(norm.size()), sc, out);
    return;
  }
  // No piece spans a "x▁" boundary (x != '▁'), so the words that start
  // there merge independently, and repeated words come from the cache.
  tok::WordCache& cache = tok::WordCache::for_this_thread();
  const auto* s = reinterpret_cast<const uint8_t*>(norm.data());
  const size_t n = norm.size();
  size_t start = 0;
  auto flush = [&](size_t end) {
    const size_t wn = end - start;
    const uint64_t h = wn <= tok::WordCache::kMaxWordBytes ? tok::WordCache::hash(s + start, wn) : 0;
    if (cache.lookup(instance_, h, s + start, wn, out)) return;
    const size_t first = out.size();
    encode_word(uint32_t(start), uint32_t(end), sc, out);
    cache.store(instance_, h, s + start, wn, out, first);
  };
  for (size_t p = 1; p + kSpaceMarkLen <= n; ++p) {
    if (s[p] != 0xE2 || std::memcmp(s + p, kSpaceMark, kSpaceMarkLen) != 0) continue;
    const bool after_mark = p >= kSpaceMarkLen && std::memcmp(s + p - kSpaceMarkLen, kSpaceMark, kSpaceMarkLen) == 0;
    if (!after_mark && p > start) {
      flush(p);
      start = p;
    }
    p += kSpaceMarkLen - 1;
  }
  if (start < n) flush(n);
}

void SpmTokenizer::encode_word(uint32_t begin, uint32_t end, Scratch& sc, std::vector<int32_t>& out) const {
  const std::string& norm = sc.norm;
  // One symbol per character; an invalid UTF-8 byte is a character of its own.
  std::vector<Symbol>& syms = sc.syms;
  syms.clear();
  const auto* s = reinterpret_cast<const uint8_t*>(norm.data());
  for (uint32_t i = begin; i < end;) {
    size_t len = 1;
    utf8_decode(s + i, end - i, &len);
    const int32_t idx = int32_t(syms.size());
    syms.push_back(Symbol{idx - 1, i + len < end ? idx + 1 : -1, i, uint32_t(len), mergeable_.find(norm.data() + i, len)});
    i += uint32_t(len);
  }
  if (syms.empty()) return;

  sc.heap.clear();
  for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_add_bigram(sc, i - 1, i);
  while (!sc.heap.empty()) {
    std::pop_heap(sc.heap.begin(), sc.heap.end(), BigramLess());
    const Bigram bg = sc.heap.back();
    sc.heap.pop_back();
    Symbol& l = syms[size_t(bg.left)];
    Symbol& r = syms[size_t(bg.right)];
    // Stale: one side was merged away or grew since the pair was queued.
    if (l.len == 0 || r.len == 0 || l.next != bg.right || l.len + r.len != bg.len) continue;
    l.len = bg.len;
    l.id = bg.id;
    l.next = r.next;
    if (r.next >= 0) syms[size_t(r.next)].prev = bg.left;
    r.len = 0;
    try_add_bigram(sc, l.prev, bg.left);
    try_add_bigram(sc, bg.left, l.next);
  }

  // Symbol 0 is never merged away (merges keep the left symbol).
  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) {
    const Symbol& sym = syms[size_t(i)];
    if (sym.id >= 0)
      out.push_back(sym.id);
    else
      emit_bytes(sc, sym, out);
  }
}

// A character that is not a piece: one <0xXX> token per byte, or <unk> when
// the vocabulary lacks one of those byte tokens.
void SpmTokenizer::emit_bytes(const Scratch& sc, const Symbol& sym, std::vector<int32_t>& out) const {
  bool all = true;
  for (uint32_t k = 0; k < sym.len; ++k) all = all && byte_ids_[uint8_t(sc.norm[sym.off + k])] >= 0;
  if (all) {
    for (uint32_t k = 0; k < sym.len; ++k) out.push_back(byte_ids_[uint8_t(sc.norm[sym.off + k])]);
  } else if (vocab_.unk >= 0) {
    out.push_back(vocab_.unk);
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabData vocab) {
  return std::unique_ptr<Tokenizer>(new SpmTokenizer(std::move(vocab)));
}

}  // namespace llm
