// Lookup structures shared by the tokenizers. The maps are built once in
// create() and only read afterwards; the one mutable structure, WordCache,
// is per thread. So concurrent encode() calls need no locking.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/model_source.h"

namespace llm {
namespace tok {

inline uint64_t hash_bytes(const char* p, size_t n) { return XXH3_64bits(p, n); }

inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

inline size_t table_capacity(size_t n) {  // power of two, load factor <= 1/2
  size_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  return cap;
}

// Piece text -> token id, where the text of id is texts[id] of a vector
// that outlives the map (the Tokenizer's own VocabData::tokens). A slot holds
// only the id and 32 bits of the hash (8 bytes: with Gemma's 262,144 tokens
// the table takes 4 MiB, not the 16 MiB that a stored view and a 64-bit hash
// took). Open addressing, linear probing.
class PieceMap {
 public:
  void reserve(const std::vector<std::string>& texts, size_t n) {
    texts_ = &texts;
    slots_.assign(table_capacity(n), Slot{0, -1});
  }
  // Maps texts[id] to id; a later insert of the same text replaces the
  // earlier id (as a dict would).
  void insert(int32_t id) {
    const std::string& key = (*texts_)[size_t(id)];
    const uint64_t h = hash_bytes(key.data(), key.size());
    const uint32_t tag = uint32_t(h >> 32);
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(h) & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = Slot{tag, id};
        return;
      }
      if (s.tag == tag && (*texts_)[size_t(s.id)] == key) {
        s.id = id;
        return;
      }
    }
  }
  int32_t find(const char* p, size_t n) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_bytes(p, n);
    const uint32_t tag = uint32_t(h >> 32);
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(h) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag) {
        const std::string& k = (*texts_)[size_t(s.id)];
        if (k.size() == n && std::memcmp(k.data(), p, n) == 0) return s.id;
      }
    }
  }
  int32_t find(std::string_view s) const { return find(s.data(), s.size()); }

 private:
  struct Slot {
    uint32_t tag;  // the hash's high 32 bits (the low ones pick the slot)
    int32_t id;    // -1: empty
  };
  const std::vector<std::string>* texts_ = nullptr;
  std::vector<Slot> slots_;
};

// (left id, right id) -> (merge rank, merged id) for byte-level BPE.
class PairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n) { slots_.assign(table_capacity(n), Slot{kEmpty, Value{0, 0}}); }
  // Keeps the first (lowest-rank) entry for a pair.
  void insert(int32_t a, int32_t b, Value v) {
    const uint64_t key = make_key(a, b);
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(mix64(key)) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{key, v};
        return;
      }
      if (slots_[i].key == key) return;
    }
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = make_key(a, b);
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(mix64(key)) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are < 2^31, so no real key has this value
  static uint64_t make_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  struct Slot {
    uint64_t key;
    Value value;
  };
  std::vector<Slot> slots_;
};

// Finds special-token texts in input text (leftmost, then longest). For
// each first byte it keeps the distinct lengths of the specials starting
// with it, longest first, and probes a hash map once per length: vocabularies
// with thousands of "<...>" specials cost a few lookups per '<', not a scan.
// A probe is skipped unless the second byte and the last byte of the
// candidate occur there in some special of that first byte (and length):
// MPT's user-defined runs of 2..24 spaces cost a table lookup per space.
// When all specials share their first byte (Qwen2's "[PAD...]", Command R's
// "<|...|>"), the scan for it is a memchr.
class SpecialMatcher {
 public:
  // Registers tokens[id] for each id; `tokens` must outlive the matcher.
  void build(const std::vector<std::string>& tokens, const std::vector<int32_t>& ids);
  bool empty() const { return count_ == 0; }
  // Finds the first special token at or after `from`; returns false if none.
  bool find(std::string_view text, size_t from, size_t* pos, size_t* len, int32_t* id) const;

 private:
  static bool has(const uint64_t* set, uint8_t b) { return (set[b >> 6] >> (b & 63)) & 1; }
  static void add(uint64_t* set, uint8_t b) { set[b >> 6] |= uint64_t(1) << (b & 63); }

  PieceMap map_;
  size_t count_ = 0;
  std::vector<uint32_t> lengths_;       // per first byte b: lengths_[len_begin_[b] .. len_begin_[b+1]), descending
  std::vector<uint64_t> last_bytes_;    // 256-bit set per lengths_ entry: last bytes of those specials
  std::vector<uint64_t> second_bytes_;  // 256-bit set per first byte: second bytes of specials longer than 1
  uint32_t len_begin_[257] = {};
  int only_first_ = -1;                 // the first byte of every special, if they all share one
};

// Calls raw(piece) for every stretch of ordinary text and special(id) for
// each token the matcher finds, in order. With an empty matcher the whole
// text is one raw piece. Raw pieces are never empty.
template <class RawFn, class SpecialFn>
void split_special(const SpecialMatcher& matcher, std::string_view text, RawFn&& raw, SpecialFn&& special) {
  if (matcher.empty()) {
    if (!text.empty()) raw(text);
    return;
  }
  size_t at = 0;
  size_t pos = 0, len = 0;
  int32_t id = -1;
  while (at < text.size() && matcher.find(text, at, &pos, &len, &id)) {
    if (pos > at) raw(text.substr(at, pos - at));
    special(id);
    at = pos + len;
  }
  if (at < text.size()) raw(text.substr(at));
}

// Per-thread cache of word -> ids (pre-tokens for byte-level BPE, words of
// SentencePiece text). Direct-mapped: a colliding word replaces the slot.
// Entries carry the id of the tokenizer that made them, so one thread may
// use several tokenizers; owner ids are never reused, so a freed
// tokenizer's entries cannot be mistaken for a new one's. Each thread has
// its own cache, so concurrent encode() calls share no mutable state.
class WordCache {
 public:
  static constexpr size_t kSlots = 4096;       // power of two; ~300 KB per thread
  static constexpr size_t kMaxWordBytes = 64;  // longer words are rare; not cached

  static WordCache& for_this_thread();
  static uint64_t new_owner_id();

  static uint64_t hash(const uint8_t* word, size_t n) { return hash_bytes(reinterpret_cast<const char*>(word), n); }
  // Appends the cached ids of `word` (hash h) to `out`; false on a miss.
  bool lookup(uint64_t owner, uint64_t h, const uint8_t* word, size_t n, std::vector<int32_t>& out) const {
    if (n > kMaxWordBytes) return false;
    const Slot& s = slots_[size_t(h) & (kSlots - 1)];
    if (s.owner != owner || s.hash != h || s.word.size() != n || std::memcmp(s.word.data(), word, n) != 0)
      return false;
    out.insert(out.end(), s.ids.begin(), s.ids.end());
    return true;
  }
  // Remembers out[first..] as the ids of `word`.
  void store(uint64_t owner, uint64_t h, const uint8_t* word, size_t n, const std::vector<int32_t>& out,
             size_t first) {
    if (n > kMaxWordBytes) return;
    Slot& s = slots_[size_t(h) & (kSlots - 1)];
    s.owner = owner;
    s.hash = h;
    s.word.assign(reinterpret_cast<const char*>(word), n);
    s.ids.assign(out.begin() + std::ptrdiff_t(first), out.end());
  }

 private:
  struct Slot {
    uint64_t owner = 0;  // 0: empty
    uint64_t hash = 0;
    std::string word;
    std::vector<int32_t> ids;
  };
  std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
};

// Token type with an empty `types` array meaning Normal.
inline TokenType token_type(const VocabData& v, int32_t id) {
  if (v.types.empty()) return TokenType::Normal;
  return TokenType(v.types[size_t(id)]);
}

// Parses "<0xXX>" (either hex case); returns the byte or -1.
int parse_byte_token(std::string_view text);

// Ids whose text is matched as a whole when parse_special is set: Control,
// UserDefined and Unknown tokens plus the configured bos/eos/eot/unk/pad. Sorted.
std::vector<int32_t> special_token_ids(const VocabData& v);
// True for the texts of end-of-generation markers ("</s>", "<|im_end|>", ...).
bool is_end_text(std::string_view text);
// Ids whose text is matched as a whole even without parse_special: the
// UserDefined tokens (Hugging Face's added tokens that are not special), as
// in llama.cpp and Hugging Face tokenizers, except end markers, which
// llama.cpp treats as control tokens. Sorted.
std::vector<int32_t> user_defined_ids(const VocabData& v);

// Decoded pieces of all tokens in one buffer: piece i is
// bytes[offsets[i] .. offsets[i + 1]).
struct PieceTable {
  std::string bytes;
  std::vector<uint32_t> offsets;
  void append_to(int32_t id, std::string& out) const {
    if (id < 0 || size_t(id) + 1 >= offsets.size()) return;
    out.append(bytes, offsets[size_t(id)], offsets[size_t(id) + 1] - offsets[size_t(id)]);
  }
};

}  // namespace tok

class Tokenizer;
std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabData vocab);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabData vocab);
}  // namespace llm
