#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "core/error.h"

namespace llm {

// Makes sure v can take `more` elements without reallocating (geometric growth).
template <typename T>
static void reserve_room(std::vector<T>& v, size_t more) {
  if (v.capacity() - v.size() < more) v.reserve(std::max(v.size() + more, 2 * v.size()));
}

// A vocab-only model has no backend: refuse before binding a reference to one.
static Backend& backend_of(const Model& model, llm_kv_type t) {
  LLM_CHECK(!model.vocab_only(), LLM_ERR_UNSUPPORTED, "the model was loaded vocab-only; sessions need weights");
  LLM_CHECK(t == LLM_KV_F16 || t == LLM_KV_F32 || t == LLM_KV_INT8 || t == LLM_KV_INT4, LLM_ERR_INVALID_ARGUMENT,
            "unknown kv_type %d", int(t));
  return model.backend_for(t);
}

Session::Session(const Model& model, const SessionOptions& opts)
    : model_(model), opts_(opts), backend_(backend_of(model, opts.kv_type)) {
  const uint32_t ctx = uint32_t(std::max(model.config().seq_len, 1));
  capacity_ = opts.max_tokens ? opts.max_tokens : ctx;
  if (opts.window) {
    const uint32_t pt = page_tokens();
    LLM_CHECK(uint64_t(opts.n_sink) + pt < opts.window, LLM_ERR_INVALID_ARGUMENT,
              "window %u must exceed n_sink %u by more than one page (%u tokens)", opts.window, opts.n_sink, pt);
    LLM_CHECK(opts.window <= capacity_ || opts.max_tokens == 0, LLM_ERR_INVALID_ARGUMENT,
              "window %u exceeds max_tokens %u", opts.window, opts.max_tokens);
    capacity_ = opts.window;  // positions never exceed the window
  }
  logits_.resize(size_t(model.config().vocab_size));
  seq_ = backend_.new_sequence(opts.kv_type);
}

Session::~Session() = default;

uint32_t Session::page_tokens() const { return uint32_t(model_.kv_pool().geometry().page_tokens); }

void Session::reset() {
  backend_.truncate(*seq_, 0);  // every page goes back; the sequence keeps its scratch
  tokens_.clear();
  pending_ = logits_valid_ = sampled_since_prefill_ = false;
  n_prompt_ = n_generated_ = n_evicted_ = prompt_tokens_timed_ = 0;
  last_prefill_ms_ = ttft_ms_ = prompt_ms_total_ = gen_ms_total_ = 0;
  itl_ms_.clear();
  rng_seeded_ = false;
  constraint_.reset();
}

void Session::kv_row(int32_t layer, int kv, int32_t head, uint32_t slot, float* out) const {
  const ModelConfig& c = model_.config();
  LLM_CHECK(slot < n_cached() && layer >= 0 && layer < c.n_layers && head >= 0 && head < c.n_kv_heads &&
                (kv == 0 || kv == 1),
            LLM_ERR_INVALID_ARGUMENT, "kv_row out of range");
  backend_.kv_row(*seq_, layer, kv, head, slot, out);
}

// ---------------------------------------------------------------- forward

void Session::make_room(size_t m) {
  const uint32_t cached = n_cached();
  if (size_t(cached) + m <= capacity_) return;
  if (!opts_.window)
    fail(LLM_ERR_CONTEXT_FULL, "context full: %u cached + %zu new tokens > %u", cached, m, capacity_);
  // Evict the oldest non-sink tokens in whole-page steps.
  const uint32_t pt = page_tokens();
  const size_t over = size_t(cached) + m - capacity_;
  size_t drop = (over + pt - 1) / pt * pt;
  drop = std::min<size_t>(drop, cached - std::min(cached, opts_.n_sink));
  LLM_CHECK(size_t(cached) - drop + m <= capacity_, LLM_ERR_CONTEXT_FULL,
            "%zu tokens do not fit in the window of %u", m, capacity_);
  evict(opts_.n_sink, uint32_t(drop));
}

void Session::forward(const int32_t* toks, size_t n, bool allow_cancel, size_t n_new) {
  // A long input runs in several chunks, each appended to the cache when it
  // completes. If a later one fails (cancel, pool full, out of memory), the
  // earlier ones are undone so that the call appends nothing, unless a
  // sliding window evicted rows to make room: those cannot come back, so the
  // completed chunks stay (cache and tokens_ agree either way).
  const size_t old_part = n - n_new;  // leading tokens already in tokens_ (a pending one)
  const uint32_t cached0 = n_cached(), evicted0 = n_evicted_;
  const size_t tokens0 = tokens_.size();
  const bool logits_valid0 = logits_valid_;
  const size_t max_rows = backend_.max_rows();
  std::vector<float> logits0;
  const bool multi = n > max_rows || opts_.window;
  if (multi) logits0 = logits_;
  std::function<bool()> cancel;
  if (allow_cancel && opts_.cancel) cancel = [this] { return opts_.cancel(opts_.cancel_user) != 0; };
  size_t done = 0;
  if (multi) backend_.hold(*seq_);  // undoing completed chunks stays exact on sliding-window layers
  try {
    while (done < n) {
      // With a window, each chunk must fit after eviction.
      size_t chunk = std::min(n - done, max_rows);
      if (opts_.window) chunk = std::min<size_t>(chunk, capacity_ - opts_.n_sink - page_tokens());
      make_room(chunk);
      LLM_CHECK(size_t(n_cached()) + chunk <= capacity_, LLM_ERR_CONTEXT_FULL, "context full");
      backend_.forward(*seq_, toks + done, chunk, logits_.data(), cancel);
      logits_valid_ = true;
      const size_t new_from = std::max(done, old_part), new_to = done + chunk;
      if (new_to > new_from) tokens_.insert(tokens_.end(), toks + new_from, toks + new_to);  // room reserved
      done += chunk;
    }
  } catch (...) {
    if (n_evicted_ == evicted0) {
      if (n_cached() != cached0) {
        backend_.truncate(*seq_, cached0);
        if (multi) {
          logits_.swap(logits0);
          logits_valid_ = logits_valid0;
        } else {
          logits_valid_ = false;
        }
      }
      tokens_.resize(tokens0);
    } else if (old_part > 0 && done > 0) {
      pending_ = false;  // the pending token went into the cache with the first chunk
    }
    if (multi) backend_.release_hold(*seq_);
    throw;
  }
  if (multi) backend_.release_hold(*seq_);
}

// ---------------------------------------------------------------- API ops

void Session::check_ids(const int32_t* toks, size_t n) const {
  const int32_t n_vocab = model_.config().vocab_size;
  for (size_t i = 0; i < n; ++i)
    LLM_CHECK(toks[i] >= 0 && toks[i] < n_vocab, LLM_ERR_INVALID_ARGUMENT, "token %zu has id %d outside [0, %d)", i,
              toks[i], n_vocab);
}

void Session::prefill(const int32_t* toks, size_t n) {
  check_ids(toks, n);
  const auto t0 = Clock::now();
  std::vector<int32_t> batch;
  batch.reserve(n + 1);
  if (pending_) batch.push_back(tokens_.back());
  batch.insert(batch.end(), toks, toks + n);
  if (batch.empty()) return;
  if (!opts_.window && size_t(n_cached()) + batch.size() > capacity_)
    fail(LLM_ERR_CONTEXT_FULL, "context full: %u cached + %zu new tokens > %u", n_cached(), batch.size(), capacity_);
  reserve_room(tokens_, n);  // forward() appends without reallocating
  forward(batch.data(), batch.size(), true, n);
  prefilled(nullptr, n, batch.size(), std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void Session::prefilled(const int32_t* toks, size_t n, size_t rows, double ms) {
  if (toks) tokens_.insert(tokens_.end(), toks, toks + n);  // forward() appended them itself otherwise
  pending_ = false;
  sampled_since_prefill_ = false;
  constraint_.reset();  // a grammar constrains what is generated after the last prompt
  rng_seeded_ = false;  // and the seed's stream starts again: a prompt and a seed give the same tokens
  n_prompt_ += uint32_t(n);
  last_prefill_ms_ = ms;
  prompt_ms_total_ += ms;
  prompt_tokens_timed_ += uint32_t(rows);
}

void Session::ensure_logits() {
  LLM_CHECK(!tokens_.empty(), LLM_ERR_INVALID_ARGUMENT, "the session holds no token yet (call llm_prefill first)");
  if (!pending_ && !logits_valid_) {
    // The cache changed under the logits (eviction): the last token runs
    // again, as a pending one (so a failure leaves a consistent session).
    const uint32_t cached = n_cached();
    if (cached == 0) {
      forward(&tokens_.back(), 1, false);
      return;
    }
    backend_.truncate(*seq_, cached - 1);
    pending_ = true;
  }
  if (pending_) {
    forward(&tokens_.back(), 1, false);
    pending_ = false;
  }
}

const float* Session::logits() {
  ensure_logits();
  return logits_.data();
}

int32_t Session::sample_next(const llm_sampling& s, const TokenConstraint* proto) {
  const int32_t n_vocab = model_.config().vocab_size;
  if (!proto) {
    constraint_.reset();
    return sampler_.sample(logits_.data(), n_vocab, s, tokens_.data(), tokens_.size(), rng_);
  }
  // Build the new state aside: the session changes only once sampling succeeded.
  std::unique_ptr<TokenConstraint> fresh;
  if (!constraint_ || constraint_->key() != proto->key()) fresh = proto->clone();
  TokenConstraint& c = fresh ? *fresh : *constraint_;
  const bool plain_greedy = !(s.temperature > 0.f) && (s.repeat_penalty <= 0.f || s.repeat_penalty == 1.f);
  int32_t tok = -1;
  if (plain_greedy) {
    // The masked argmax is the best token the grammar allows (lowest id on
    // ties, as the sampler breaks them): try the few best in order, one
    // token check each, before building a whole mask.
    constexpr size_t kTry = 32;
    const float* l = logits_.data();
    tok = sampler_.sample(l, n_vocab, s, tokens_.data(), tokens_.size(), rng_);  // the plain argmax
    if (c.allows(tok)) goto sampled;
    tok = -1;
    auto better = [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    greedy_ids_.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) greedy_ids_[size_t(i)] = i;
    const size_t k = std::min(kTry, greedy_ids_.size());
    std::partial_sort(greedy_ids_.begin(), greedy_ids_.begin() + long(k), greedy_ids_.end(), better);
    for (size_t i = 0; i < k && tok < 0; ++i)
      if (l[greedy_ids_[i]] != -INFINITY && c.allows(greedy_ids_[i])) tok = greedy_ids_[i];
  }
  if (tok < 0) {
    masked_.assign(logits_.begin(), logits_.begin() + n_vocab);
    c.apply(masked_.data(), n_vocab);
    bool any = false;
    for (int32_t i = 0; i < n_vocab && !any; ++i) any = masked_[size_t(i)] != -INFINITY;
    LLM_CHECK(any, LLM_ERR_INVALID_ARGUMENT,
              "the grammar allows no token of the vocabulary at this point (generated so far: %u tokens)",
              n_generated_);
    tok = sampler_.sample(masked_.data(), n_vocab, s, tokens_.data(), tokens_.size(), rng_);
  }
sampled:
  c.accept(tok);
  if (fresh) constraint_ = std::move(fresh);
  return tok;
}

int32_t Session::decode_step(const llm_sampling* user, const TokenConstraint* constraint) {
  const auto t0 = Clock::now();
  const llm_sampling s = sampling_from_user(user);
  // Allocate before anything changes: the bookkeeping after sampling cannot fail.
  reserve_room(tokens_, 1);
  reserve_room(itl_ms_, 1);
  ensure_logits();
  if (!rng_seeded_ || rng_seed_ != s.seed) {
    rng_.reseed(s.seed);
    rng_seed_ = s.seed;
    rng_seeded_ = true;
  }
  const int32_t tok = sample_next(s, constraint);
  tokens_.push_back(tok);
  pending_ = true;
  logits_valid_ = false;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!sampled_since_prefill_) {
    ttft_ms_ = last_prefill_ms_ + ms;
    sampled_since_prefill_ = true;
  } else {
    itl_ms_.push_back(float(ms));
    gen_ms_total_ += ms;
  }
  ++n_generated_;
  return tok;
}

void Session::decode_batch(Session* const* ss, size_t n, const llm_sampling* const* samplings, int32_t* out,
                           const TokenConstraint* const* constraints, const PromptChunk* prompts) {
  if (n == 0) return;
  if (prompts)  // every id is checked before any session moves
    for (size_t i = 0; i < n; ++i) {
      LLM_CHECK(prompts[i].n == 0 || prompts[i].tokens != nullptr, LLM_ERR_INVALID_ARGUMENT,
                "session %zu: prompt tokens are NULL", i);
      ss[i]->check_ids(prompts[i].tokens, prompts[i].n);
    }
  auto has_prompt = [&](size_t i) { return prompts && prompts[i].n > 0; };
  // The pending tokens and prompt chunks of the sessions that can share a
  // pass over the weights run first (decode_batch_passes), then every
  // session samples below. Each token of such a pass counts the pass in its
  // ITL, as a step alone counts its forward pass.
  std::vector<uint32_t> gen0;   // per session: n_generated_ + 1 if a pass advanced it, else 0
  std::vector<double> pass_ms;  // per session: the time of the pass that advanced it
  std::vector<bool> joined;     // per session: its prompt chunk ran in a pass
  if (n > 1) decode_batch_passes(ss, n, prompts, gen0, pass_ms, joined);
  struct PassTime {  // runs on the way out, also when a step throws
    Session* const* ss;
    const std::vector<uint32_t>& gen0;
    const std::vector<double>& ms;
    ~PassTime() {
      for (size_t i = 0; i < gen0.size(); ++i)
        if (gen0[i] != 0 && ss[i]->n_generated_ == gen0[i] && !ss[i]->itl_ms_.empty()) {
          ss[i]->itl_ms_.back() += float(ms[i]);
          ss[i]->gen_ms_total_ += ms[i];
        }
    }
  } pass_time{ss, gen0, pass_ms};
  for (size_t i = 0; i < n; ++i) {
    if (has_prompt(i) && (joined.empty() || !joined[i])) ss[i]->prefill(prompts[i].tokens, prompts[i].n);
    if (prompts && !prompts[i].sample) continue;  // out[i] stays as the caller set it
    out[i] = ss[i]->decode_step(samplings ? samplings[i] : nullptr, constraints ? constraints[i] : nullptr);
  }
}

// The sessions taken are a prefix of ss in the sense of llm_decode_batch's
// contract (sessions before a failing one have advanced, it and those after
// it are unchanged): a session on the backend of the first one with rows to
// run, with a pending token or a prompt chunk the backend takes in a batch,
// and room for them, joins; a session whose step only samples (logits
// valid, nothing pending: a step right after prefill) or does nothing is
// passed over; any other session (context full, a window eviction due, a
// re-run after an eviction, a chunk longer than the backend batches, another
// backend) ends the batch, since its step alone might fail. A pass takes
// what Backend::forward_batch takes; a session that cannot get its pages
// there ends the batch too (it then fails or succeeds alone). A pass is all
// or nothing: if it throws, its sessions are as they were, and they and the
// rest run alone.
void Session::decode_batch_passes(Session* const* ss, size_t n, const PromptChunk* prompts,
                                  std::vector<uint32_t>& gen0, std::vector<double>& pass_ms,
                                  std::vector<bool>& joined) {
  auto prompt_n = [&](size_t i) { return prompts ? prompts[i].n : size_t(0); };
  auto rows_of = [&](size_t i) { return prompt_n(i) + (ss[i]->pending_ ? 1 : 0); };
  Backend* be = nullptr;
  std::vector<size_t> joins;
  for (size_t i = 0; i < n; ++i) {
    Session* s = ss[i];
    const size_t rows = rows_of(i);
    const bool sample = !prompts || prompts[i].sample;
    if (rows > 0 && !be) be = &s->backend_;
    if (rows > 0 && &s->backend_ == be && rows <= be->max_batch_rows_per_seq() && rows <= be->max_rows() &&
        size_t(s->n_cached()) + rows <= s->capacity_)
      joins.push_back(i);
    else if (rows > 0 || (sample && (!s->logits_valid_ || s->tokens_.empty())))
      break;
  }
  if (joins.size() < 2) return;  // alone below, with the same cost
  for (size_t j0 = 0; j0 < joins.size();) {
    std::vector<Session*> batch;
    size_t j = j0, total = 0;
    bool short_of_memory = false;
    for (; j < joins.size() && batch.size() < be->max_batch() && total + rows_of(joins[j]) <= be->max_rows(); ++j) {
      const size_t i = joins[j];
      try {
        reserve_room(ss[i]->tokens_, prompt_n(i) + 1);  // prefilled() and decode_step() append without allocating
      } catch (...) {
        short_of_memory = true;  // this session runs alone (and fails there, or not); the batch ends
        break;
      }
      batch.push_back(ss[i]);
      total += rows_of(i);
    }
    if (batch.empty()) return;
    std::vector<SequenceRows> rows(batch.size());
    std::vector<std::vector<int32_t>> rows_toks(batch.size());  // a prompt chunk after the pending token
    for (size_t k = 0; k < batch.size(); ++k) {
      Session* s = batch[k];
      const size_t i = joins[j0 + k];
      SequenceRows& r = rows[k];
      if (prompt_n(i) > 0) {
        std::vector<int32_t>& t = rows_toks[k];
        if (s->pending_) t.push_back(s->tokens_.back());
        t.insert(t.end(), prompts[i].tokens, prompts[i].tokens + prompts[i].n);
        r.tokens = t.data();
        r.n = t.size();
      } else {
        r.tokens = &s->tokens_.back();
        r.n = 1;
      }
      r.seq = s->seq_.get();
      r.logits = s->logits_.data();
    }
    const auto t0 = Clock::now();
    size_t ran = 0;
    try {
      ran = be->forward_batch(rows.data(), rows.size());
    } catch (...) {
      return;
    }
    if (ran == 0) return;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (gen0.empty()) {
      gen0.assign(n, 0);
      pass_ms.assign(n, 0.0);
      joined.assign(n, false);
    }
    for (size_t k = 0; k < ran; ++k) {
      Session* s = batch[k];
      const size_t i = joins[j0 + k];
      s->logits_valid_ = true;
      pass_ms[i] = ms;
      if (prompt_n(i) > 0) {
        s->prefilled(prompts[i].tokens, prompts[i].n, rows[k].n, ms);
        joined[i] = true;
      } else {
        s->pending_ = false;
        gen0[i] = s->n_generated_ + 1;
      }
    }
    if (short_of_memory || ran < batch.size()) return;
    j0 = j;
  }
}

void Session::evict_cached(uint32_t n_keep, uint32_t n_discard) {
  if (n_discard > 0) backend_.evict(*seq_, n_keep, n_discard);
}

void Session::evict(uint32_t n_keep, uint32_t n_discard) {
  const uint64_t len = tokens_.size();
  LLM_CHECK(uint64_t(n_keep) + uint64_t(n_discard) <= len, LLM_ERR_INVALID_ARGUMENT,
            "evict [%u, %llu) is outside the sequence of %llu tokens", n_keep,
            (unsigned long long)(uint64_t(n_keep) + n_discard), (unsigned long long)len);
  if (n_discard == 0) return;
  // Cached part of the range.
  const uint32_t cached_end = std::min<uint32_t>(n_keep + n_discard, n_cached());
  const uint32_t cached_discard = cached_end > n_keep ? cached_end - n_keep : 0;
  const bool drops_pending = pending_ && uint64_t(n_keep) + n_discard == len;
  evict_cached(n_keep, cached_discard);
  tokens_.erase(tokens_.begin() + n_keep, tokens_.begin() + n_keep + n_discard);
  if (drops_pending) pending_ = false;
  if (cached_discard > 0) logits_valid_ = false;
  n_evicted_ += n_discard;
}

void Session::stats(llm_session_stats_t* out) const {
  llm_session_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.n_tokens = uint32_t(tokens_.size());
  s.n_cached = n_cached();
  s.n_prompt = n_prompt_;
  s.n_generated = n_generated_;
  s.kv_pages = uint32_t(seq_->n_pages() + seq_->n_local_pages());
  s.kv_bytes = seq_->kv_bytes();
  s.ttft_ms = ttft_ms_;
  if (!itl_ms_.empty()) {
    // Linear-time order statistics: stats may be polled after every token.
    std::vector<float> v = itl_ms_;
    auto nth = [&v](size_t k) {
      std::nth_element(v.begin(), v.begin() + long(k), v.end());
      return double(v[k]);
    };
    const size_t mid = v.size() / 2;
    s.itl_median_ms = v.size() % 2 ? nth(mid) : 0.5 * (nth(mid - 1) + nth(mid));
    s.itl_p95_ms = nth(std::min(v.size() - 1, size_t(std::ceil(0.95 * double(v.size()))) - 1));
    s.gen_tokens_per_s = gen_ms_total_ > 0 ? 1000.0 * double(itl_ms_.size()) / gen_ms_total_ : 0;
  }
  s.prompt_tokens_per_s = prompt_ms_total_ > 0 ? 1000.0 * prompt_tokens_timed_ / prompt_ms_total_ : 0;
  s.n_evicted = n_evicted_;
  std::memcpy(out, &s, std::min<size_t>(out->struct_size, sizeof s));
  out->struct_size = std::min<uint32_t>(out->struct_size, uint32_t(sizeof s));
}

}  // namespace llm

// ---------------------------------------------------------------- fork / save / restore

namespace llm {

std::unique_ptr<Session> Session::fork() const {
  std::unique_ptr<Session> f(new Session(model_, opts_));
  f->seq_.reset();
  f->seq_ = backend_.fork(*seq_);
  f->tokens_ = tokens_;
  f->pending_ = pending_;
  f->logits_valid_ = logits_valid_;
  f->sampled_since_prefill_ = sampled_since_prefill_;
  f->logits_ = logits_;
  f->rng_ = rng_;
  f->rng_seed_ = rng_seed_;
  f->rng_seeded_ = rng_seeded_;
  if (constraint_) f->constraint_ = constraint_->clone();
  return f;
}

namespace {

// Snapshot layout (little-endian), version 1:
//   u32 magic "LLMS", u32 version, u32 header_bytes
//   header: u32 n_layers, n_kv_heads, head_dim, page_tokens, vocab_size, dim,
//           max_tokens, window, n_sink, kv_type, flags (1 pending, 2 logits
//           valid, 4 sampled since prefill, 8 rng seeded), n_tokens, n_cached,
//           n_pages; u64 rng_state, rng_inc, rng_seed
//   i32 tokens[n_tokens]
//   f32 logits[vocab_size]            (present when flag 2)
//   pages: n_pages x page_bytes(kv_type) raw bytes
//   u64 XXH3-64 of everything before it
constexpr uint32_t kSnapMagic = 0x534d4c4cu;  // "LLMS"
constexpr uint32_t kSnapVersion = 1;
// Version 2, for models whose sliding-window layers keep their own pages
// (Model::kv_pool_local()): version 1's layout (n_layers and n_pages are the
// global layers'), then u32 local_first and the windowed layers' pages
// [local_first / page_tokens, n_pages), before the checksum.
constexpr uint32_t kSnapVersionLocal = 2;
constexpr size_t kSnapHeaderWords = 14;

struct Writer {
  std::vector<uint8_t>& out;
  template <typename T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
};

struct Reader {
  const uint8_t* p;
  size_t n, off = 0;
  template <typename T>
  T get() {
    LLM_CHECK(n - off >= sizeof(T), LLM_ERR_FORMAT, "session snapshot is truncated");
    T v;
    std::memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
  const uint8_t* take(size_t bytes) {
    LLM_CHECK(n - off >= bytes, LLM_ERR_FORMAT, "session snapshot is truncated");
    const uint8_t* r = p + off;
    off += bytes;
    return r;
  }
};

}  // namespace

}  // namespace llm

#include <xxhash.h>

namespace llm {

void Session::save(std::vector<uint8_t>& out) const {
  out.clear();
  const kv::Geometry& g = model_.kv_pool().geometry();
  const ModelConfig& c = model_.config();
  Writer w{out};
  w.put(kSnapMagic);
  w.put(model_.kv_pool_local() ? kSnapVersionLocal : kSnapVersion);
  w.put(uint32_t(kSnapHeaderWords * 4 + 3 * 8));
  const uint32_t flags = (pending_ ? 1u : 0u) | (logits_valid_ ? 2u : 0u) | (sampled_since_prefill_ ? 4u : 0u) |
                         (rng_seeded_ ? 8u : 0u);
  const uint32_t header[kSnapHeaderWords] = {uint32_t(g.n_layers), uint32_t(g.n_kv_heads), uint32_t(g.head_dim),
                                             uint32_t(g.page_tokens), uint32_t(c.vocab_size), uint32_t(c.dim),
                                             opts_.max_tokens, opts_.window, opts_.n_sink, uint32_t(opts_.kv_type),
                                             flags, uint32_t(tokens_.size()), n_cached(),
                                             uint32_t(seq_->n_pages())};
  for (uint32_t v : header) w.put(v);
  w.put(rng_.state());
  w.put(rng_.inc());
  w.put(rng_seed_);
  w.put_bytes(tokens_.data(), tokens_.size() * sizeof(int32_t));
  if (logits_valid_) w.put_bytes(logits_.data(), logits_.size() * sizeof(float));
  backend_.save_pages(*seq_, out);
  w.put(uint64_t(XXH3_64bits(out.data(), out.size())));
}

std::unique_ptr<Session> Session::restore(const Model& model, const uint8_t* data, size_t size) {
  LLM_CHECK(data != nullptr && size >= 12 + 8, LLM_ERR_FORMAT, "session snapshot is too short (%zu bytes)", size);
  Reader r{data, size - 8};
  LLM_CHECK(r.get<uint32_t>() == kSnapMagic, LLM_ERR_FORMAT, "not a libllm session snapshot (bad magic)");
  const uint32_t version = r.get<uint32_t>();
  LLM_CHECK(version == kSnapVersion || version == kSnapVersionLocal, LLM_ERR_UNSUPPORTED,
            "session snapshot version %u is not supported", version);
  uint64_t stored_sum;
  std::memcpy(&stored_sum, data + size - 8, 8);
  LLM_CHECK(XXH3_64bits(data, size - 8) == stored_sum, LLM_ERR_CHECKSUM, "session snapshot checksum mismatch");
  LLM_CHECK(r.get<uint32_t>() == kSnapHeaderWords * 4 + 3 * 8, LLM_ERR_FORMAT, "session snapshot header size");
  uint32_t h[kSnapHeaderWords];
  for (uint32_t& v : h) v = r.get<uint32_t>();
  LLM_CHECK(!model.vocab_only(), LLM_ERR_UNSUPPORTED, "the model was loaded vocab-only");
  const kv::Geometry& g = model.kv_pool().geometry();
  const ModelConfig& c = model.config();
  LLM_CHECK(h[0] == uint32_t(g.n_layers) && h[1] == uint32_t(g.n_kv_heads) && h[2] == uint32_t(g.head_dim) &&
                h[3] == uint32_t(g.page_tokens) && h[4] == uint32_t(c.vocab_size) && h[5] == uint32_t(c.dim),
            LLM_ERR_UNSUPPORTED, "session snapshot was saved from a model of another shape or KV page size");
  SessionOptions o;
  o.max_tokens = h[6];
  o.window = h[7];
  o.n_sink = h[8];
  LLM_CHECK(h[9] <= uint32_t(LLM_KV_INT4), LLM_ERR_FORMAT, "session snapshot has kv_type %u", h[9]);
  o.kv_type = llm_kv_type(h[9]);
  const uint32_t flags = h[10], n_tokens = h[11], n_cached = h[12], n_pages = h[13];
  std::unique_ptr<Session> s(new Session(model, o));  // validates window/n_sink
  const uint32_t pt = uint32_t(g.page_tokens);
  const bool pending = flags & 1u;
  LLM_CHECK(n_cached <= s->capacity_ && n_tokens == n_cached + (pending ? 1u : 0u) &&
                n_pages == (uint64_t(n_cached) + pt - 1) / pt && (flags & ~15u) == 0,
            LLM_ERR_FORMAT, "session snapshot counts are inconsistent");
  const uint64_t st = r.get<uint64_t>(), inc = r.get<uint64_t>();
  s->rng_.set_state(st, inc);
  s->rng_seed_ = r.get<uint64_t>();
  s->rng_seeded_ = flags & 8u;
  const uint8_t* token_bytes = r.take(size_t(n_tokens) * 4);  // bounds-checked before allocating
  s->tokens_.resize(n_tokens);
  if (n_tokens) std::memcpy(s->tokens_.data(), token_bytes, size_t(n_tokens) * 4);
  for (int32_t t : s->tokens_)
    LLM_CHECK(t >= 0 && t < c.vocab_size, LLM_ERR_FORMAT, "session snapshot holds token id %d", t);
  s->logits_valid_ = flags & 2u;
  if (s->logits_valid_) std::memcpy(s->logits_.data(), r.take(s->logits_.size() * 4), s->logits_.size() * 4);
  LLM_CHECK((version == kSnapVersionLocal) == (model.kv_pool_local() != nullptr), LLM_ERR_UNSUPPORTED,
            "session snapshot version %u does not fit this model's KV layout", version);
  const size_t kv_size = r.n - r.off;
  s->backend_.restore_pages(*s->seq_, r.take(kv_size), kv_size, n_pages, n_cached);
  s->pending_ = pending;
  s->sampled_since_prefill_ = flags & 4u;
  return s;
}

}  // namespace llm
