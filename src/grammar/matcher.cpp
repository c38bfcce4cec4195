// The pushdown matcher and its token masks.
//
// State: a set of parse stacks (sorted, deduplicated, at most kMaxStacks,
// each at most kMaxDepth frames) plus an unfinished UTF-8 sequence shared by
// all of them. Every stack top is a terminal (Chars or a token element) or the
// stack is empty (the grammar may end there).
//
// Masks. Walking every token through the grammar at every step is too slow
// for 262,144-token vocabularies, so the work is split (after XGrammar's
// adaptive token mask cache):
//   key(stack) = the top frames down to and including the first frame of a
//                user rule that is not transparent (not a short bounded rule).
//   For each key, once per (grammar, vocabulary), every token is walked
//   through the key frames alone (the sorted-piece walk shares prefixes and
//   prunes rejected ones), and classified:
//     accepted  - some path stays inside the key frames to the token's end
//                 (or leaves them exactly at its end): right whatever lies below;
//     rejected  - every path dies inside the key frames;
//     uncertain - some path leaves the key frames at byte d < length: the rest,
//                 piece[d:], must be checked against the frames below.
//   At a step, the mask is the union over stacks of the accepted sets, plus
//   the uncertain suffixes (deduplicated, sorted, walked once each) checked
//   against the stack below the key.
// With an unfinished UTF-8 sequence pending (rare) the whole sorted vocabulary
// is walked from the state instead: only continuation bytes survive the first
// step, so the walk prunes almost everything at once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "grammar/grammar.h"

namespace llm::grammar {

namespace detail {

constexpr size_t kMaxStacks = 1024;           // stacks in one state
constexpr size_t kMaxDepth = 2048;            // frames in one stack
constexpr size_t kMaxExpand = 16384;          // Ref expansions in one expand()
constexpr size_t kMaxCacheBytes = size_t(512) << 20;
constexpr size_t kMaxBelowBytes = size_t(64) << 20;

struct KeyEntry {
  std::vector<uint64_t> bits;   // accepted tokens, dense form (or empty)
  std::vector<int32_t> list;    // accepted tokens, sparse form
  // Uncertain: distinct suffixes (sorted), each with the tokens that reach it.
  std::vector<std::string_view> suffix;
  std::vector<uint16_t> suffix_lcp;
  std::vector<uint32_t> group_begin;  // suffix.size() + 1
  std::vector<int32_t> group_tokens;
  size_t bytes() const {
    return bits.size() * 8 + list.size() * 4 + suffix.size() * 24 + group_tokens.size() * 4 + 64;
  }
};

struct Cache {
  const Grammar* grammar = nullptr;
  std::shared_ptr<const Vocab> vocab;
  std::vector<int32_t> token_text_ids;  // Grammar::token_texts resolved in this vocabulary
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const KeyEntry>> entries;
  size_t bytes = 0;
  // Uncertain tokens that the frames below accepted, per whole stack: within
  // one JSON string or list the stack below repeats at every step.
  std::unordered_map<std::string, std::shared_ptr<const std::vector<int32_t>>> below;
  size_t below_bytes = 0;
};

namespace {

void add_stack(std::vector<Stack>& out, Stack&& s) { out.push_back(std::move(s)); }

void normalize(std::vector<Stack>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Caps hit on this thread (expand / advance gave up): Matcher::cap_hits().
thread_local uint64_t cap_hits = 0;
inline bool capped() {
  ++cap_hits;
  return false;
}

// Work one expansion step may do, in stack frames copied (a Ref expanded in a
// stack of depth d costs d per alternative, plus d for the set of expanded
// stacks). Shared by every expand() of one step, so a grammar of nested
// nullable repetitions ((x*)*)* cannot multiply it by the stack count.
constexpr size_t kMaxExpandWork = size_t(1) << 20;

struct StackHash {
  size_t operator()(const Stack& s) const {
    return std::hash<std::string_view>()(
        std::string_view(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(uint32_t)));
  }
};

// Expands `s` until every stack top is a terminal, appending to `out`.
// False when a cap is hit; `work` is the step's remaining kMaxExpandWork.
bool expand(const Grammar& g, Stack s, std::vector<Stack>& out, size_t& work) {
  if (!s.empty()) {
    const Op op = g.elems[s.back()].op;
    if (op != Op::End && op != Op::Ref) {  // the common case: already a terminal
      out.push_back(std::move(s));
      return true;
    }
  }
  thread_local std::vector<Stack> todo;
  // Stacks whose top Ref was expanded already (tail-call cycles, and the many
  // paths to one stack through nested nullable rules).
  thread_local std::unordered_set<Stack, StackHash> seen;
  todo.clear();
  seen.clear();
  todo.push_back(std::move(s));
  size_t n_expanded = 0;
  while (!todo.empty()) {
    Stack st = std::move(todo.back());
    todo.pop_back();
    for (;;) {
      if (st.empty()) {
        add_stack(out, std::move(st));
        break;
      }
      const uint32_t p = st.back();
      const Element e = g.elems[p];
      if (e.op == Op::End) {
        st.pop_back();
        continue;
      }
      if (e.op != Op::Ref) {
        add_stack(out, std::move(st));
        break;
      }
      if (st.size() + 1 > work) return capped();
      work -= st.size() + 1;
      if (!seen.insert(st).second) break;
      if (++n_expanded > kMaxExpand) return capped();
      const size_t cost = g.rules[e.arg].alts.size() * (st.size() + 1);
      if (cost > work) return capped();
      work -= cost;
      if (g.elems[p + 1].op == Op::End)
        st.pop_back();  // tail call: nothing to return to
      else
        st.back() = p + 1;
      if (st.size() >= kMaxDepth) return capped();
      for (uint32_t a : g.rules[e.arg].alts) {
        Stack ns = st;
        ns.push_back(a);
        todo.push_back(std::move(ns));
      }
      break;
    }
    if (out.size() > 4 * kMaxStacks) return capped();
  }
  return true;
}

bool expand(const Grammar& g, Stack s, std::vector<Stack>& out) {
  size_t work = kMaxExpandWork;
  return expand(g, std::move(s), out, work);
}

// Stacks after matching code point cp.
bool advance_cp(const Grammar& g, const std::vector<Stack>& in, uint32_t cp, std::vector<Stack>& out) {
  out.clear();
  size_t work = kMaxExpandWork;
  for (const Stack& s : in) {
    if (s.empty()) continue;
    const Element e = g.elems[s.back()];
    if (e.op != Op::Chars || !g.charsets[e.arg].contains(cp)) continue;
    Stack ns = s;
    ns.back() += 1;
    if (!expand(g, std::move(ns), out, work)) {
      out.clear();
      return false;
    }
  }
  normalize(out);
  if (out.size() > kMaxStacks) {
    out.clear();
    return capped();
  }
  return true;
}

constexpr uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};

// UTF-8 decoding, one byte: kInvalid, kPending (p updated) or kComplete (*cp set).
enum class Utf8 { kInvalid, kPending, kComplete };
Utf8 utf8_step(Partial& p, uint8_t b, uint32_t* cp) {
  if (p.need == 0) {
    if (b < 0x80) {
      *cp = b;
      return Utf8::kComplete;
    }
    if (b >= 0xC2 && b <= 0xDF) p = {uint32_t(b & 0x1F), 1, 1};
    else if (b >= 0xE0 && b <= 0xEF) p = {uint32_t(b & 0x0F), 2, 1};
    else if (b >= 0xF0 && b <= 0xF4) p = {uint32_t(b & 0x07), 3, 1};
    else return Utf8::kInvalid;
  } else {
    if ((b & 0xC0) != 0x80) return Utf8::kInvalid;
    p.value = (p.value << 6) | (b & 0x3F);
    p.need--;
    p.len++;
    if (p.need == 0) {
      *cp = p.value;
      if (*cp < kMinOfLen[p.len] || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return Utf8::kInvalid;
      return Utf8::kComplete;
    }
  }
  return Utf8::kPending;
}

// With p pending: keep the stacks whose top can take some completion.
bool filter_partial(const Grammar& g, const std::vector<Stack>& in, const Partial& p, std::vector<Stack>& out) {
  const uint32_t total = uint32_t(p.len + p.need);
  uint32_t lo = p.value << (6 * p.need);
  uint32_t hi = lo | ((uint32_t(1) << (6 * p.need)) - 1);
  lo = std::max(lo, kMinOfLen[total]);
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  out.clear();
  if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
  for (const Stack& s : in) {
    if (s.empty()) continue;
    const Element e = g.elems[s.back()];
    if (e.op == Op::Chars && g.charsets[e.arg].intersects(lo, hi)) out.push_back(s);
  }
  return !out.empty();
}

// One byte. False (out undefined) if no stack survives.
bool advance_byte(const Grammar& g, const State& in, uint8_t b, State& out) {
  Partial p = in.partial;
  uint32_t cp = 0;
  switch (utf8_step(p, b, &cp)) {
    case Utf8::kInvalid: return false;
    case Utf8::kComplete:
      out.partial = Partial{};
      return advance_cp(g, in.stacks, cp, out.stacks) && !out.stacks.empty();
    case Utf8::kPending: break;
  }
  out.partial = p;
  return filter_partial(g, in.stacks, p, out.stacks);
}

// Frames of the cache key: from the top down to the first frame of a
// non-transparent rule (inclusive), or the whole stack.
size_t key_len(const Grammar& g, const Stack& s) {
  for (size_t k = s.size(); k-- > 0;)
    if (!g.rules[g.elem_rule[s[k]]].transparent) return s.size() - k;
  return s.size();
}

// A frame in a repetition chain O(k) whose k no token can use up (every
// repetition takes at least one byte) is the same for the cache as O(cap + 1).
void canonicalize_key(const Grammar& g, const Vocab& v, Stack& key) {
  const uint32_t cap = uint32_t(std::min<size_t>(v.max_piece_len(), 1u << 20)) + 1;
  if (cap < 2) return;
  for (uint32_t& f : key) {
    const uint32_t k = g.rules[g.elem_rule[f]].chain_k;
    if (k > cap) {
      // k >= 3 chains are validated down to k = 2, so O(cap) exists and sits 4 * (k - cap) earlier.
      f -= 4 * (k - cap);
    }
  }
}

inline void set_bit(std::vector<uint64_t>& bits, int32_t i) { bits[size_t(i) >> 6] |= uint64_t(1) << (i & 63); }

// Walks strings str(0..n-1) (sorted, lcp(i) = common prefix with i-1) from
// `init`; calls on_accept(i) for each string that leaves some stack alive.
template <class Str, class Lcp, class OnAccept>
void walk_sorted(const Grammar& g, const State& init, size_t n, Str str, Lcp lcp, OnAccept on_accept) {
  std::vector<State> states(1, init);
  size_t alive = 0;  // states[0..alive] valid along the previous string
  for (size_t i = 0; i < n; ++i) {
    const std::string_view s = str(i);
    const size_t l = i == 0 ? 0 : lcp(i);
    if (l > alive) continue;  // shares the byte that killed the previous string
    size_t d = l;
    if (states.size() < s.size() + 1) states.resize(s.size() + 1);
    for (; d < s.size(); ++d)
      if (!advance_byte(g, states[d], uint8_t(s[d]), states[d + 1])) break;
    alive = d;
    if (d == s.size()) on_accept(i);
  }
}

// States of one key's walk, interned, with their byte transitions memoized:
// inside a string almost every byte leads back to the same state, so the walk
// over the whole vocabulary costs a hash lookup per trie node, not an advance.
class StateTable {
 public:
  static constexpr int32_t kDead = -1;
  explicit StateTable(const Grammar& g) : g_(g) {}

  int32_t intern(State&& s) {
    std::string k = serialize(s);
    auto it = ids_.find(k);
    if (it != ids_.end()) return it->second;
    const int32_t id = int32_t(states_.size());
    states_.push_back(std::move(s));
    ids_.emplace(std::move(k), id);
    return id;
  }

  // Next state after byte b; *popped: some path left the key frames here.
  // With nothing left inside the key, the state is kDead (the pop still counts).
  int32_t step(int32_t id, uint8_t b, bool* popped) {
    // Row of 256 transitions per state (the first kMaxRows states): 0 = not
    // computed yet, else ((next + 2) << 1) | pop.
    const bool memo = size_t(id) < kMaxRows;
    if (memo) {
      if (trans_.size() < (size_t(id) + 1) * 256) trans_.resize((size_t(id) + 1) * 256, 0);
      const uint32_t e = trans_[size_t(id) * 256 + b];
      if (e != 0) {
        *popped = e & 1;
        return int32_t(e >> 1) - 2;
      }
    }
    int32_t next = kDead;
    bool pop = false;
    const State& cur = states_[size_t(id)];
    Partial p = cur.partial;
    uint32_t cp = 0;
    const Utf8 kind = utf8_step(p, b, &cp);
    if (kind == Utf8::kComplete && cur.stacks.size() <= 64) {
      // The result depends only on which stack tops take cp: memoized per
      // (stack set, that subset), so the many code points of a class cost one advance.
      uint64_t takes = 0;
      for (size_t k = 0; k < cur.stacks.size(); ++k) {
        const Stack& st = cur.stacks[k];
        if (st.empty()) continue;
        const Element e = g_.elems[st.back()];
        if (e.op == Op::Chars && g_.charsets[e.arg].contains(cp)) takes |= uint64_t(1) << k;
      }
      if (takes != 0) {
        const std::pair<int32_t, uint64_t> mk(base_id(id), takes);
        auto it = complete_.find(mk);
        if (it != complete_.end()) {
          next = it->second.first;
          pop = it->second.second;
        } else {
          finish(advance_cp(g_, cur.stacks, cp, nx_.stacks), Partial{}, &next, &pop);
          complete_.emplace(mk, std::make_pair(next, pop));
        }
      }
    } else if (kind == Utf8::kComplete) {
      finish(advance_cp(g_, cur.stacks, cp, nx_.stacks), Partial{}, &next, &pop);
    } else if (kind == Utf8::kPending) {
      finish(filter_partial(g_, cur.stacks, p, nx_.stacks), p, &next, &pop);
    }
    if (memo) trans_[size_t(id) * 256 + b] = (uint32_t(next + 2) << 1) | (pop ? 1u : 0u);
    *popped = pop;
    return next;
  }

 private:
  static std::string serialize(const State& s) {
    std::string k;
    k.append(reinterpret_cast<const char*>(&s.partial.value), 4);
    k.push_back(char(s.partial.need));
    k.push_back(char(s.partial.len));
    for (const Stack& st : s.stacks) {
      const uint32_t n = uint32_t(st.size());
      k.append(reinterpret_cast<const char*>(&n), 4);
      k.append(reinterpret_cast<const char*>(st.data()), st.size() * 4);
    }
    return k;
  }

  const Grammar& g_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> ids_;
  // nx_ holds the stacks just computed (ok: any survived); intern what is left
  // inside the key after taking out the empty stack (a path that left it).
  void finish(bool ok, const Partial& p, int32_t* next, bool* pop) {
    *next = kDead;
    *pop = false;
    if (!ok || nx_.stacks.empty()) return;
    if (nx_.stacks[0].empty()) {
      *pop = true;
      nx_.stacks.erase(nx_.stacks.begin());
    }
    if (nx_.stacks.empty()) return;
    nx_.partial = p;
    State s = std::move(nx_);
    nx_ = State{};
    *next = intern(std::move(s));
  }

  // Id of a state's stack set alone (partial ignored).
  int32_t base_id(int32_t id) {
    if (base_of_.size() <= size_t(id)) base_of_.resize(size_t(id) + 1, -1);
    int32_t& b = base_of_[size_t(id)];
    if (b < 0) {
      State only;
      only.stacks = states_[size_t(id)].stacks;
      std::string k = serialize(only);
      auto it = bases_.find(k);
      if (it == bases_.end()) it = bases_.emplace(std::move(k), int32_t(bases_.size())).first;
      b = it->second;
    }
    return b;
  }

  struct PairHash {
    size_t operator()(const std::pair<int32_t, uint64_t>& k) const {
      return std::hash<uint64_t>()(k.second * 0x9E3779B97F4A7C15ull ^ uint64_t(uint32_t(k.first)));
    }
  };

  State nx_;
  std::vector<int32_t> base_of_;
  std::unordered_map<std::string, int32_t> bases_;
  std::unordered_map<std::pair<int32_t, uint64_t>, std::pair<int32_t, bool>, PairHash> complete_;
  static constexpr size_t kMaxRows = 16384;  // 16 MiB of transitions at most
  std::vector<uint32_t> trans_;
};

std::shared_ptr<const KeyEntry> build_entry(const Cache& c, const Stack& key) {
  const Grammar& g = *c.grammar;
  const Vocab& v = *c.vocab;
  const std::vector<int32_t>& sorted = v.sorted();
  const std::vector<uint16_t>& lcp = v.lcp();
  auto entry = std::make_shared<KeyEntry>();

  std::vector<int32_t> accepted;
  std::vector<std::pair<std::string_view, int32_t>> uncertain;
  StateTable table(g);
  State init;
  init.stacks.push_back(key);
  std::vector<int32_t> states(1, table.intern(std::move(init)));
  std::vector<uint32_t> pops;  // depths along the current path where a path left the key
  size_t alive = 0;             // states[0..alive] live along the previous token
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int32_t t = sorted[i];
    const std::string_view piece = v.sorted_piece(i);
    const size_t L = piece.size();
    const size_t l = i == 0 ? 0 : lcp[i];
    while (!pops.empty() && pops.back() > l) pops.pop_back();
    if (l > alive) {
      // Dies (or leaves the key for good) where the previous token did.
      if (!pops.empty() && pops.back() == L) {
        accepted.push_back(t);
      } else {
        for (uint32_t d : pops) uncertain.push_back({piece.substr(d), t});
      }
      continue;
    }
    if (states.size() < L + 1) states.resize(L + 1);
    alive = l;
    for (size_t d = l; d < L; ++d) {
      bool popped = false;
      const int32_t nx = table.step(states[d], uint8_t(piece[d]), &popped);
      if (popped) pops.push_back(uint32_t(d + 1));
      if (nx == StateTable::kDead) break;
      states[d + 1] = nx;
      alive = d + 1;
    }
    if (alive == L || (!pops.empty() && pops.back() == L)) {
      accepted.push_back(t);
    } else {
      for (uint32_t pd : pops)
        if (pd < L) uncertain.push_back({piece.substr(pd), t});
    }
  }

  const int32_t n = v.n_vocab();
  if (accepted.size() * 32 > size_t(n)) {
    entry->bits.assign((size_t(n) + 63) / 64, 0);
    for (int32_t t : accepted) set_bit(entry->bits, t);
  } else {
    std::sort(accepted.begin(), accepted.end());
    entry->list = std::move(accepted);
  }
  std::sort(uncertain.begin(), uncertain.end());
  uncertain.erase(std::unique(uncertain.begin(), uncertain.end()), uncertain.end());
  for (size_t k = 0; k < uncertain.size(); ++k) {
    if (k == 0 || uncertain[k].first != uncertain[k - 1].first) {
      const std::string_view s = uncertain[k].first;
      size_t common = 0;
      if (!entry->suffix.empty()) {
        const std::string_view p = entry->suffix.back();
        while (common < p.size() && common < s.size() && p[common] == s[common]) ++common;
      }
      entry->suffix.push_back(s);
      entry->suffix_lcp.push_back(uint16_t(common));
      entry->group_begin.push_back(uint32_t(entry->group_tokens.size()));
    }
    entry->group_tokens.push_back(uncertain[k].second);
  }
  entry->group_begin.push_back(uint32_t(entry->group_tokens.size()));
  return entry;
}

std::shared_ptr<const KeyEntry> get_entry(Cache& c, const Stack& key) {
  std::string k(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(uint32_t));
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.entries.find(k);
    if (it != c.entries.end()) return it->second;
  }
  std::shared_ptr<const KeyEntry> e = build_entry(c, key);
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.entries.find(k);
  if (it != c.entries.end()) return it->second;
  if (c.bytes + e->bytes() <= kMaxCacheBytes) {
    c.bytes += e->bytes();
    c.entries.emplace(std::move(k), e);
  }
  return e;
}

// The uncertain tokens of `entry` that stack s (key = its top klen frames)
// accepts: their suffixes walked from the frames below the key. Memoized.
std::shared_ptr<const std::vector<int32_t>> below_accepted(Cache& c, const Stack& s, size_t klen, const KeyEntry& entry) {
  std::string k(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(uint32_t));
  k.append(reinterpret_cast<const char*>(&klen), sizeof klen);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.below.find(k);
    if (it != c.below.end()) return it->second;
  }
  auto out = std::make_shared<std::vector<int32_t>>();
  State below;
  if (expand(*c.grammar, Stack(s.begin(), s.end() - long(klen)), below.stacks)) {
    normalize(below.stacks);
    walk_sorted(
        *c.grammar, below, entry.suffix.size(), [&](size_t i) { return entry.suffix[i]; },
        [&](size_t i) { return size_t(entry.suffix_lcp[i]); },
        [&](size_t i) {
          for (uint32_t j = entry.group_begin[i]; j < entry.group_begin[i + 1]; ++j) out->push_back(entry.group_tokens[j]);
        });
  }
  std::lock_guard<std::mutex> lock(c.mu);
  const size_t bytes = k.size() + out->size() * 4 + 64;
  if (c.below_bytes + bytes > kMaxBelowBytes) {
    c.below.clear();
    c.below_bytes = 0;
  }
  c.below_bytes += bytes;
  c.below.emplace(std::move(k), out);
  return out;
}

bool token_elem_matches(const Cache& c, const Element& e, int32_t token, const Vocab& v) {
  switch (e.op) {
    case Op::Token: return int32_t(e.arg) == token;
    case Op::NotToken: return int32_t(e.arg) != token && !v.is_eog(token);
    case Op::TokenText: return c.token_text_ids[e.arg] == token;
    case Op::NotTokenText: return c.token_text_ids[e.arg] != token && !v.is_eog(token);
    default: return false;
  }
}

}  // namespace

}  // namespace detail

using detail::Cache;
using detail::Stack;
using detail::State;

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  LLM_CHECK(grammar_ && vocab_, LLM_ERR_INVALID_ARGUMENT, "grammar: null grammar or vocabulary");
  {
    std::lock_guard<std::mutex> lock(grammar_->cache_mu);
    auto& caches = grammar_->caches;
    for (size_t k = 0; k < caches.size();) {
      std::shared_ptr<Cache> c = caches[k].lock();
      if (!c) {
        caches.erase(caches.begin() + long(k));
        continue;
      }
      if (c->vocab == vocab_) cache_ = c;
      ++k;
    }
    if (!cache_) {
      auto c = std::make_shared<Cache>();
      c->grammar = grammar_.get();
      c->vocab = vocab_;
      for (const std::string& text : grammar_->token_texts) {
        const int32_t id = vocab_->find_piece(text);
        LLM_CHECK(id >= 0, LLM_ERR_INVALID_ARGUMENT, "grammar: <%.64s> is not one token of this vocabulary", text.c_str());
        c->token_text_ids.push_back(id);
      }
      caches.push_back(c);
      cache_ = c;
    }
  }
  reset();
}

void Matcher::reset() {
  const Grammar& g = *grammar_;
  State s;
  size_t work = detail::kMaxExpandWork;
  for (uint32_t a : g.rules[g.root].alts)
    LLM_CHECK(detail::expand(g, Stack{a}, s.stacks, work), LLM_ERR_INVALID_ARGUMENT,
              "grammar: the start state is over the matcher's limits");
  detail::normalize(s.stacks);
  LLM_CHECK(s.stacks.size() <= detail::kMaxStacks, LLM_ERR_INVALID_ARGUMENT,
            "grammar: the start state is over the matcher's limits");
  state_ = std::move(s);
  terminated_ = false;
}

bool Matcher::can_end() const {
  if (terminated_) return true;
  return state_.partial.need == 0 && !state_.stacks.empty() && state_.stacks[0].empty();
}

bool Matcher::ended() const {
  if (terminated_) return true;
  return state_.partial.need == 0 && state_.stacks.size() == 1 && state_.stacks[0].empty();
}

bool Matcher::advance_token(int32_t token, State& out) const {
  const Grammar& g = *grammar_;
  const Vocab& v = *vocab_;
  out.stacks.clear();
  out.partial = detail::Partial{};
  if (token < 0 || token >= v.n_vocab()) return false;
  // Byte path.
  const std::string& piece = v.piece(token);
  if (!piece.empty() && !v.is_eog(token)) {
    State cur = state_, next;
    bool ok = true;
    for (char ch : piece) {
      if (!detail::advance_byte(g, cur, uint8_t(ch), next)) {
        ok = false;
        break;
      }
      std::swap(cur, next);
    }
    if (ok) out = std::move(cur);
  }
  // Token elements.
  if (state_.partial.need == 0 && out.partial.need == 0) {
    size_t work = detail::kMaxExpandWork;
    for (const Stack& s : state_.stacks) {
      if (s.empty()) continue;
      const Element e = g.elems[s.back()];
      if (!detail::token_elem_matches(*cache_, e, token, v)) continue;
      Stack ns = s;
      ns.back() += 1;
      if (!detail::expand(g, std::move(ns), out.stacks, work)) return false;
    }
    detail::normalize(out.stacks);
    if (out.stacks.size() > detail::kMaxStacks) return detail::capped();
  }
  return !out.stacks.empty();
}

uint64_t Matcher::cap_hits() { return detail::cap_hits; }

bool Matcher::allows(int32_t token) const {
  if (token < 0 || token >= vocab_->n_vocab()) return false;
  if (vocab_->is_eog(token)) {
    if (can_end()) return true;
  }
  if (terminated_ || ended()) return false;
  State tmp;
  return advance_token(token, tmp);
}

void Matcher::accept(int32_t token) {
  if (token >= 0 && token < vocab_->n_vocab() && vocab_->is_eog(token) && can_end()) {
    terminated_ = true;
    return;
  }
  State next;
  if (terminated_ || ended() || !advance_token(token, next))
    fail(LLM_ERR_INVALID_ARGUMENT, "grammar: token %d is not allowed here", token);
  state_ = std::move(next);
}

void Matcher::compute_mask(std::vector<uint64_t>& bits) {
  const Grammar& g = *grammar_;
  const Vocab& v = *vocab_;
  const int32_t n = v.n_vocab();
  bits.assign((size_t(n) + 63) / 64, 0);
  const bool end_ok = can_end();
  if (!(terminated_ || ended())) {
    if (state_.partial.need != 0) {
      const std::vector<int32_t>& sorted = v.sorted();
      detail::walk_sorted(
          g, state_, sorted.size(), [&](size_t i) { return v.sorted_piece(i); },
          [&](size_t i) { return size_t(v.lcp()[i]); }, [&](size_t i) { detail::set_bit(bits, sorted[i]); });
    } else {
      for (const Stack& s : state_.stacks) {
        if (s.empty()) continue;
        const Element e = g.elems[s.back()];
        if (e.op != Op::Chars) {
          if (e.op == Op::Token || e.op == Op::TokenText) {
            const int32_t id = e.op == Op::Token ? int32_t(e.arg) : cache_->token_text_ids[e.arg];
            if (id < n) detail::set_bit(bits, id);
          } else {
            const int32_t id = e.op == Op::NotToken ? int32_t(e.arg) : cache_->token_text_ids[e.arg];
            for (int32_t t = 0; t < n; ++t)
              if (t != id && !v.is_eog(t)) detail::set_bit(bits, t);
          }
          continue;
        }
        const size_t klen = detail::key_len(g, s);
        Stack key(s.end() - long(klen), s.end());
        detail::canonicalize_key(g, v, key);
        std::shared_ptr<const detail::KeyEntry> entry = detail::get_entry(*cache_, key);
        if (!entry->bits.empty()) {
          for (size_t w = 0; w < bits.size(); ++w) bits[w] |= entry->bits[w];
        } else {
          for (int32_t t : entry->list) detail::set_bit(bits, t);
        }
        if (entry->suffix.empty() || klen == s.size()) continue;
        // Held here: the cache may drop its own reference meanwhile (another
        // thread's insert of the same key, or a clear at the byte budget).
        const std::shared_ptr<const std::vector<int32_t>> below = detail::below_accepted(*cache_, s, klen, *entry);
        for (int32_t t : *below) detail::set_bit(bits, t);
      }
    }
  }
  if (end_ok)
    for (int32_t t : v.eog_ids()) detail::set_bit(bits, t);
}

void Matcher::compute_mask_slow(std::vector<uint64_t>& bits) const {
  const int32_t n = vocab_->n_vocab();
  bits.assign((size_t(n) + 63) / 64, 0);
  for (int32_t t = 0; t < n; ++t)
    if (allows(t)) detail::set_bit(bits, t);
}

void Matcher::apply_mask(float* logits, int32_t n_vocab) {
  std::vector<uint64_t>& mask = mask_.bits;
  compute_mask(mask);
  const int32_t n = std::min(n_vocab, vocab_->n_vocab());
  for (int32_t w = 0; w * 64 < n; ++w) {
    const uint64_t m = mask[size_t(w)];
    if (m == ~uint64_t(0)) continue;
    const int32_t end = std::min(n, w * 64 + 64);
    if (m == 0) {
      std::fill(logits + w * 64, logits + end, -INFINITY);
      continue;
    }
    uint64_t forbidden = ~m;  // visit only the zero bits
    if (end - w * 64 < 64) forbidden &= (uint64_t(1) << (end - w * 64)) - 1;
    while (forbidden) {
      logits[w * 64 + __builtin_ctzll(forbidden)] = -INFINITY;
      forbidden &= forbidden - 1;
    }
  }
  for (int32_t t = n; t < n_vocab; ++t) logits[t] = -INFINITY;
}

}  // namespace llm::grammar
