// Byte-level BPE ("gpt2" vocabularies: GPT-2, Llama 3, Qwen2, Mistral Nemo...)
// and BPE over raw UTF-8 ("gemma4").
//
// Text -> pre-tokens (pretokenize.h) -> each pre-token's bytes become the
// tokens of their GPT-2 byte characters -> repeatedly merge the adjacent pair
// with the lowest merge rank (ties: leftmost) -> ids. Merges are looked up by
// id pair, so the loop never builds strings. Pre-tokens repeat a lot in real
// text, so each thread keeps a small direct-mapped cache of word -> ids.
//
// Gemma 4 (llama.cpp's "gemma4" pre-tokenizer) is not byte-level: spaces
// become U+2581, the text is split only at line breaks, each UTF-8
// character starts as the token of its own text, and a character that is
// no token falls back to its <0xXX> byte tokens.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

namespace llm {
namespace {

using tok::PairMap;
using tok::PieceMap;

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(VocabData v);

  void encode(std::string_view text, bool add_bos, bool parse_special, std::vector<int32_t>& out) const override;
  void append_piece(int32_t id, std::string& out) const override { pieces_.append_to(id, out); }
  bool strip_space_after_bos() const override { return false; }

 private:
  struct Symbol {
    int32_t prev, next;  // linked list over live symbols; -1 at the ends
    int32_t id;          // -1 once merged away, or for a character missing from the vocabulary
  };
  struct Bigram {
    int32_t rank;
    int32_t left, right;          // symbol indices
    int32_t left_id, right_id;    // ids when queued (stale entries differ)
    int32_t id;                   // merged id
  };
  struct Scratch {
    std::vector<Symbol> syms;
    std::vector<Bigram> heap;
    std::string mapped;
    std::string escaped;
    std::vector<size_t> ends;    // pre-token ends (multi-rule pre-tokenizers)
    std::vector<uint32_t> offs;  // raw UTF-8: first byte of each symbol's character
  };

  void encode_raw(std::string_view text, Scratch& sc, std::vector<int32_t>& out) const;
  void encode_word(const uint8_t* w, size_t n, Scratch& sc, std::vector<int32_t>& out) const;
  void try_add_bigram(Scratch& sc, int32_t left, int32_t right) const;
  void emit_unknown(const uint8_t* c, size_t len, std::vector<int32_t>& out) const;

  PreTokenizer pre_ = PreTokenizer::Gpt2;
  bool ignore_merges_ = false;
  bool byte_level_ = true;         // false: raw UTF-8 characters, spaces as U+2581 (Gemma 4)
  bool single_pattern_ = true;     // pretoken_end() walks the split
  bool all_bytes_ = true;          // byte-level: every byte has a token
  PieceMap all_;     // every token's text
  PairMap merges_;   // (left id, right id) -> (rank, merged id)
  // Byte-level: the token of each byte's GPT-2 character. Raw UTF-8: the
  // token of each ASCII character's own text (-1 for bytes >= 0x80).
  int32_t byte_ids_[256];
  int32_t fallback_ids_[256];      // raw UTF-8: the <0xXX> byte tokens
  tok::PieceTable pieces_;
  tok::SpecialMatcher specials_;       // with parse_special
  tok::SpecialMatcher user_defined_;  // without it
  uint64_t instance_;
};

BpeTokenizer::BpeTokenizer(VocabData v) : Tokenizer(std::move(v)), instance_(tok::WordCache::new_owner_id()) {
  bool known = true;
  // llama.cpp uses the gemma4 pre-tokenizer for a "gemma4" model whatever the file says.
  pre_ = pre_tokenizer_from_name(vocab_.model == "gemma4" ? "gemma4" : vocab_.pre, &known, &ignore_merges_);
  if (!known) {
    warning_ = "tokenizer: unknown pre-tokenizer '" + vocab_.pre + "', using the GPT-2 default split";
  }
  byte_level_ = pre_ != PreTokenizer::Gemma4;
  single_pattern_ = is_single_pattern(pre_);

  const size_t n = vocab_.tokens.size();
  all_.reserve(vocab_.tokens, n);
  for (size_t i = 0; i < n; ++i) all_.insert(int32_t(i));

  // Byte-level: byte b starts out as the token of its GPT-2 character.
  // Raw UTF-8: an ASCII character starts as the token of its own text.
  std::string ch;
  std::fill(std::begin(fallback_ids_), std::end(fallback_ids_), -1);
  for (int b = 0; b < 256; ++b) {
    ch.clear();
    if (byte_level_) {
      utf8_append(gpt2_byte_to_cp(uint8_t(b)), ch);
      byte_ids_[b] = all_.find(ch);
    } else {
      ch.push_back(char(b));
      byte_ids_[b] = b < 0x80 ? all_.find(ch) : -1;
    }
  }
  for (int b = 0; b < 256; ++b) all_bytes_ = all_bytes_ && byte_level_ && byte_ids_[b] >= 0;
  if (!byte_level_) {
    for (size_t i = 0; i < n; ++i) {
      if (tok::token_type(vocab_, int32_t(i)) != TokenType::Byte) continue;
      const int byte = tok::parse_byte_token(vocab_.tokens[i]);
      if (byte >= 0 && fallback_ids_[byte] < 0) fallback_ids_[byte] = int32_t(i);
    }
  }

  LLM_CHECK(vocab_.merges.size() < size_t(INT32_MAX), LLM_ERR_FORMAT, "tokenizer: too many merges");
  merges_.reserve(vocab_.merges.size());
  std::string joined;
  size_t skipped = 0;
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& m = vocab_.merges[r];
    // "left right"; the separator is the first space after the first character.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    LLM_CHECK(sp != std::string::npos, LLM_ERR_FORMAT, "tokenizer: merge %zu ('%.40s') has no separator", r,
              m.c_str());
    const std::string_view a(m.data(), sp), b(m.data() + sp + 1, m.size() - sp - 1);
    joined.assign(a.data(), a.size()).append(b.data(), b.size());
    const int32_t ia = all_.find(a), ib = all_.find(b), ij = all_.find(joined);
    if (ia < 0 || ib < 0 || ij < 0) {
      ++skipped;  // refers to pieces the vocabulary lacks; it can never apply
      continue;
    }
    merges_.insert(ia, ib, PairMap::Value{int32_t(r), ij});
  }
  if (skipped > 0) {
    if (!warning_.empty()) warning_ += "; ";
    warning_ += "tokenizer: " + std::to_string(skipped) + " merges refer to tokens not in the vocabulary";
  }

  // Decoded pieces: byte characters back to bytes (raw UTF-8: U+2581 back
  // to a space); user-defined text as is; control/unused/unknown tokens
  // print nothing.
  pieces_.offsets.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    pieces_.offsets.push_back(uint32_t(pieces_.bytes.size()));
    const std::string& text = vocab_.tokens[i];
    switch (tok::token_type(vocab_, int32_t(i))) {
      case TokenType::Normal:
      case TokenType::Undefined: {
        if (!byte_level_) {
          for (size_t k = 0; k < text.size();) {
            if (text.compare(k, 3, "\xE2\x96\x81") == 0) {
              pieces_.bytes.push_back(' ');
              k += 3;
            } else {
              pieces_.bytes.push_back(text[k++]);
            }
          }
          break;
        }
        const auto* s = reinterpret_cast<const uint8_t*>(text.data());
        for (size_t k = 0; k < text.size();) {
          size_t len = 1;
          const uint32_t cp = utf8_decode(s + k, text.size() - k, &len);
          const int byte = gpt2_cp_to_byte(cp);
          if (byte >= 0)
            pieces_.bytes.push_back(char(byte));
          else
            pieces_.bytes.append(text, k, len);
          k += len;
        }
        break;
      }
      case TokenType::UserDefined: pieces_.bytes += text; break;
      case TokenType::Byte: {
        const int byte = tok::parse_byte_token(text);
        if (byte >= 0)
          pieces_.bytes.push_back(char(byte));
        else
          pieces_.bytes += text;
        break;
      }
      case TokenType::Control:
      case TokenType::Unused:
      case TokenType::Unknown: break;
    }
  }
  pieces_.offsets.push_back(uint32_t(pieces_.bytes.size()));
  specials_.build(vocab_.tokens, tok::special_token_ids(vocab_));
  user_defined_.build(vocab_.tokens, tok::user_defined_ids(vocab_));
}

void BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special, std::vector<int32_t>& out) const {
  if (add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
  Scratch sc;
  tok::split_special(
      parse_special ? specials_ : user_defined_, text,
      [&](std::string_view raw) { encode_raw(raw, sc, out); }, [&](int32_t id) { out.push_back(id); });
}

void BpeTokenizer::encode_raw(std::string_view text, Scratch& sc, std::vector<int32_t>& out) const {
  if (!byte_level_) {  // spaces as U+2581
    std::string& esc = sc.escaped;
    esc.clear();
    esc.reserve(text.size());
    for (char c : text) {
      if (c == ' ')
        esc.append("\xE2\x96\x81", 3);
      else
        esc.push_back(c);
    }
    text = esc;
  }
  tok::WordCache& cache = tok::WordCache::for_this_thread();
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  // Single-pattern pre-tokenizers are walked with pretoken_end(); the
  // others are split first (piece ends into the scratch).
  if (!single_pattern_) {
    sc.ends.clear();
    pretoken_ends(pre_, s, n, sc.ends);
  }
  const bool single = single_pattern_;
  size_t piece = 0;
  for (size_t i = 0; i < n;) {
    const size_t e = single ? pretoken_end(pre_, s, n, i) : sc.ends[piece++];
    const uint8_t* w = s + i;
    const size_t wn = e - i;
    i = e;
    if (wn == 1) {  // a single byte needs no merging
      const int32_t id = byte_ids_[w[0]];
      if (id >= 0)
        out.push_back(id);
      else
        emit_unknown(w, 1, out);
      continue;
    }
    const uint64_t h = wn <= tok::WordCache::kMaxWordBytes ? tok::WordCache::hash(w, wn) : 0;
    if (cache.lookup(instance_, h, w, wn, out)) continue;
    const size_t first = out.size();
    encode_word(w, wn, sc, out);
    cache.store(instance_, h, w, wn, out, first);
  }
}

// A character (raw UTF-8) or byte (byte-level) that no token covers. Raw
// UTF-8: its <0xXX> byte tokens, as in llama.cpp. Byte-level: nothing, as in
// llama.cpp and in Hugging Face's BPE without an unk token (StarCoder's
// vocabulary has no token for the byte 0xF1, for one).
void BpeTokenizer::emit_unknown(const uint8_t* c, size_t len, std::vector<int32_t>& out) const {
  if (byte_level_) return;
  for (size_t k = 0; k < len; ++k) {
    if (fallback_ids_[c[k]] >= 0) out.push_back(fallback_ids_[c[k]]);
  }
}

// Heap order: lowest rank on top, then the leftmost pair.
struct BigramLess {
  template <class B>
  bool operator()(const B& a, const B& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

void BpeTokenizer::try_add_bigram(Scratch& sc, int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return;
  const int32_t a = sc.syms[size_t(left)].id, b = sc.syms[size_t(right)].id;
  if (a < 0 || b < 0) return;
  const PairMap::Value* m = merges_.find(a, b);
  if (!m) return;
  sc.heap.push_back(Bigram{m->rank, left, right, a, b, m->id});
  std::push_heap(sc.heap.begin(), sc.heap.end(), BigramLess());
}

void BpeTokenizer::encode_word(const uint8_t* w, size_t n, Scratch& sc, std::vector<int32_t>& out) const {
  if (ignore_merges_ && byte_level_) {  // a word that is itself a token is kept whole (Llama 3, Tekken)
    sc.mapped.clear();
    for (size_t k = 0; k < n; ++k) utf8_append(gpt2_byte_to_cp(w[k]), sc.mapped);
    const int32_t id = all_.find(sc.mapped);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol>& syms = sc.syms;
  if (all_bytes_) {
    syms.resize(n);
    for (size_t k = 0; k < n; ++k) syms[k] = Symbol{int32_t(k) - 1, k + 1 < n ? int32_t(k + 1) : -1, byte_ids_[w[k]]};
  } else if (byte_level_) {
    // A byte without a token is dropped before merging, so its neighbours
    // may merge (Hugging Face's BPE without an unk token; llama.cpp keeps
    // it as a barrier and drops it afterwards).
    syms.resize(n);
    int32_t m = 0;
    for (size_t k = 0; k < n; ++k) {
      const int32_t id = byte_ids_[w[k]];
      if (id < 0) continue;
      syms[size_t(m)] = Symbol{m - 1, m + 1, id};
      ++m;
    }
    if (m == 0) return;
    syms.resize(size_t(m));
    syms.back().next = -1;
  } else {
    // A run of line breaks that is a token stays whole (llama.cpp's Gemma 4 rule).
    if (w[0] == '\n') {
      const int32_t id = all_.find(reinterpret_cast<const char*>(w), n);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    syms.clear();
    sc.offs.clear();
    for (size_t k = 0; k < n;) {
      size_t len = 1;
      utf8_decode(w + k, n - k, &len);
      const int32_t id = w[k] < 0x80 ? byte_ids_[w[k]] : all_.find(reinterpret_cast<const char*>(w + k), len);
      const int32_t idx = int32_t(syms.size());
      syms.push_back(Symbol{idx - 1, k + len < n ? idx + 1 : -1, id});
      sc.offs.push_back(uint32_t(k));
      k += len;
    }
  }
  const int32_t count = int32_t(syms.size());
  sc.heap.clear();
  for (int32_t k = 1; k < count; ++k) try_add_bigram(sc, k - 1, k);
  while (!sc.heap.empty()) {
    std::pop_heap(sc.heap.begin(), sc.heap.end(), BigramLess());
    const Bigram bg = sc.heap.back();
    sc.heap.pop_back();
    Symbol& l = syms[size_t(bg.left)];
    Symbol& r = syms[size_t(bg.right)];
    if (l.id != bg.left_id || r.id != bg.right_id || l.next != bg.right) continue;  // stale
    l.id = bg.id;
    l.next = r.next;
    if (r.next >= 0) syms[size_t(r.next)].prev = bg.left;
    r.id = -1;
    r.prev = r.next = -1;
    try_add_bigram(sc, l.prev, bg.left);
    try_add_bigram(sc, bg.left, l.next);
  }
  for (int32_t k = 0; k >= 0; k = syms[size_t(k)].next) {
    const int32_t id = syms[size_t(k)].id;
    if (id >= 0) {
      out.push_back(id);
    } else {  // raw UTF-8: a character that is no token and was never merged
      const int32_t next = syms[size_t(k)].next;
      const uint32_t off = sc.offs[size_t(k)], end = next >= 0 ? sc.offs[size_t(next)] : uint32_t(n);
      emit_unknown(w + off, end - off, out);
    }
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabData vocab) {
  return std::unique_ptr<Tokenizer>(new BpeTokenizer(std::move(vocab)));
}

}  // namespace llm
