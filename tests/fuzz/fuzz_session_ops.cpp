// Fuzz target: random sequences of session operations through the public API
// on stories260K: create (odd params), prefill (invalid ids, long prompts,
// cancellation), decode (odd sampling params), decode_batch, evict, fork,
// reset, free, save/restore, logits, stats. After every call:
//   - the status is documented, never LLM_ERR_INTERNAL;
//   - a failed prefill / decode / evict leaves the session exactly as it
//     was (llm.h: "on any failure the session is unchanged");
//   - the bookkeeping holds: n_tokens - n_cached is 0 or 1 (the pending
//     token), kv_pages covers n_cached in whole pages, n_cached fits max_tokens;
//   - restore(save(s)) saves back to the same bytes.
// The KV pool is small (1 MiB) so "pool full" paths run too.
#include <xxhash.h>

#include "fuzz_common.h"

namespace {

constexpr int kSlots = 4;
constexpr uint32_t kPageTokens = 16;

struct Snapshot {
  llm_session_stats_t st;
  std::vector<uint8_t> bytes;
};

int g_cancel_after = 0;  // polls left before the cancel callback says stop
int cancel_cb(void*) { return g_cancel_after-- <= 0 ? 1 : 0; }

llm_session_stats_t stats_of(llm_session* s) {
  llm_session_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  LLM_FUZZ_EXPECT(llm_session_stats(s, &st) == LLM_OK);
  return st;
}

std::vector<uint8_t> save(llm_session* s) {
  size_t n = 0;
  LLM_FUZZ_EXPECT(llm_session_save(s, nullptr, 0, &n) == LLM_ERR_BUFFER_TOO_SMALL);
  std::vector<uint8_t> b(n);
  LLM_FUZZ_EXPECT(llm_session_save(s, b.data(), b.size(), &n) == LLM_OK && n == b.size());
  return b;
}

// The observable state of a session: its counters and its snapshot bytes
// (tokens, KV, logits, sampler state).
Snapshot observe(llm_session* s) { return Snapshot{stats_of(s), save(s)}; }

void check_unchanged(const Snapshot& before, llm_session* s) {
  const Snapshot now = observe(s);
  LLM_FUZZ_EXPECT(now.st.n_tokens == before.st.n_tokens);
  LLM_FUZZ_EXPECT(now.st.n_cached == before.st.n_cached);
  LLM_FUZZ_EXPECT(now.st.kv_pages == before.st.kv_pages);
  LLM_FUZZ_EXPECT(now.bytes == before.bytes);
}

void check_invariants(llm_session* s, uint32_t max_tokens) {
  const llm_session_stats_t st = stats_of(s);
  LLM_FUZZ_EXPECT(st.n_cached <= st.n_tokens && st.n_tokens - st.n_cached <= 1);
  LLM_FUZZ_EXPECT(st.kv_pages == (st.n_cached + kPageTokens - 1) / kPageTokens);
  if (max_tokens) LLM_FUZZ_EXPECT(st.n_cached <= max_tokens);
}

float pick_float(uint8_t b) {
  static const float kValues[] = {0.0f, 0.5f, 1.0f, 1.7f, 100.0f, 1e-30f, -1.0f, 1e30f,
                                  __builtin_nanf(""), __builtin_inff(), -__builtin_inff(), 0.05f};
  return kValues[b % (sizeof kValues / sizeof kValues[0])];
}

}  // namespace

LLM_FUZZ_TARGET(session_ops) {
  static llm_model* model = [] {
    llm_load_params p;
    llm_load_params_init(&p);
    p.n_threads = 1;
    p.kv_budget_bytes = 1u << 20;
    llm_model* m = nullptr;
    const std::string path = llm::fuzz::model_path("stories260K.gguf");
    if (llm_load(path.c_str(), &p, &m) != LLM_OK) std::abort();
    return m;
  }();
  llm::fuzz::Bytes in(data, size);
  llm_session* slot[kSlots] = {};
  uint32_t max_tokens[kSlots] = {};
  for (int step = 0; step < 48 && in.left() > 0; ++step) {
    const uint8_t op = in.u8();
    const int i = (op >> 4) % kSlots;
    llm_session*& s = slot[i];
    switch (op % 12) {
      case 0: {  // create
        if (s) break;
        llm_session_params sp;
        llm_session_params_init(&sp);
        const uint8_t a = in.u8(), b = in.u8();
        sp.max_tokens = a % 4 == 0 ? 0 : a;
        sp.window = b % 3 == 0 ? 0 : b;
        sp.n_sink = in.u8() % 8;
        sp.kv_type = llm_kv_type(in.u8() % 5);  // 4 is not a kv type
        const llm_status st = llm_session_create(model, &sp, &s);
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT);
        LLM_FUZZ_EXPECT((st == LLM_OK) == (s != nullptr));
        if (st != LLM_OK) LLM_FUZZ_EXPECT(llm_last_error()[0] != '\0');
        max_tokens[i] = sp.window ? sp.window : sp.max_tokens;
        break;
      }
      case 1:
      case 2: {  // prefill, sometimes long, sometimes cancelled
        if (!s) break;
        const uint8_t kind = in.u8();
        size_t n = kind % 24;
        if (kind == 255) n = 505 + size_t(in.u8() % 16);  // sometimes crosses the 512-token chunk
        std::vector<llm_token> toks(n);
        for (auto& t : toks) t = llm_token(in.u8()) * 2 + (kind % 7 == 6 ? 1 : 0);  // ids up to 511
        if (n && kind % 11 == 10) toks[n / 2] = 512 + (kind % 3);  // one bad id
        const Snapshot before = observe(s);
        const bool cancel = op % 12 == 2;
        // The cancel callback is a session parameter: use a fork with one.
        llm_status st;
        if (cancel) {
          llm_session_params sp;
          llm_session_params_init(&sp);
          sp.max_tokens = max_tokens[i];
          sp.cancel = cancel_cb;
          llm_session* c = nullptr;
          if (llm_session_create(model, &sp, &c) != LLM_OK) break;
          // Some history first (not cancelled), then the cancelled call.
          g_cancel_after = 1 << 30;
          const llm_token head[3] = {1, 403, 407};
          if (llm_prefill(c, head, 1 + in.u8() % 3) == LLM_OK && (in.u8() & 1)) {
            llm_token t;
            LLM_FUZZ_EXPECT(llm_decode_step(c, nullptr, &t) == LLM_OK);
          }
          const Snapshot cb = observe(c);
          g_cancel_after = in.u8() % 12;
          st = llm_prefill(c, toks.data(), toks.size());
          LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_CANCELLED || st == LLM_ERR_INVALID_ARGUMENT ||
                          st == LLM_ERR_CONTEXT_FULL);
          if (st != LLM_OK) check_unchanged(cb, c);
          check_invariants(c, max_tokens[i]);
          llm_session_free(c);
          break;
        }
        st = llm_prefill(s, toks.data(), toks.size());
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_CONTEXT_FULL);
        if (st != LLM_OK) check_unchanged(before, s);
        break;
      }
      case 3: {  // decode
        if (!s) break;
        llm_sampling sp;
        llm_sampling_init(&sp);
        const uint8_t k = in.u8();
        if (k & 1) {
          sp.temperature = pick_float(in.u8());
          sp.top_k = int32_t(int8_t(in.u8()));
          sp.top_p = pick_float(in.u8());
          sp.min_p = pick_float(in.u8());
          sp.repeat_penalty = pick_float(in.u8());
          sp.repeat_last_n = int32_t(int8_t(in.u8())) * 4;
          sp.seed = in.u32();
        }
        const Snapshot before = observe(s);
        llm_token t = -1;
        const llm_status st = llm_decode_step(s, &sp, &t);
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_CONTEXT_FULL);
        if (st == LLM_OK) LLM_FUZZ_EXPECT(t >= 0 && t < 512);
        if (st != LLM_OK) check_unchanged(before, s);
        break;
      }
      case 4: {  // evict
        if (!s) break;
        const llm_session_stats_t st0 = stats_of(s);
        const uint32_t keep = in.u8() % (st0.n_tokens + 2), discard = in.u8() % (st0.n_tokens + 2);
        const Snapshot before = observe(s);
        const llm_status st = llm_kv_evict(s, keep, discard);
        LLM_FUZZ_EXPECT(st == (uint64_t(keep) + discard <= st0.n_tokens ? LLM_OK : LLM_ERR_INVALID_ARGUMENT));
        if (st != LLM_OK) check_unchanged(before, s);
        else LLM_FUZZ_EXPECT(stats_of(s).n_tokens == st0.n_tokens - discard);
        break;
      }
      case 5: {  // fork into the next free slot
        if (!s) break;
        for (int j = 0; j < kSlots; ++j) {
          if (slot[j]) continue;
          LLM_FUZZ_EXPECT(llm_session_fork(s, &slot[j]) == LLM_OK);
          max_tokens[j] = max_tokens[i];
          if (slot[j]) LLM_FUZZ_EXPECT(save(slot[j]) == save(s));
          break;
        }
        break;
      }
      case 6:  // free
        llm_session_free(s);
        s = nullptr;
        break;
      case 7:  // reset
        if (!s) break;
        LLM_FUZZ_EXPECT(llm_session_reset(s) == LLM_OK);
        LLM_FUZZ_EXPECT(stats_of(s).n_tokens == 0 && stats_of(s).kv_pages == 0);
        break;
      case 8: {  // save -> restore into this slot
        if (!s) break;
        const std::vector<uint8_t> b = save(s);
        llm_session* r = nullptr;
        const llm_status st = llm_session_restore(model, b.data(), b.size(), &r);
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_CONTEXT_FULL);
        if (st == LLM_OK) {
          LLM_FUZZ_EXPECT(save(r) == b);
          llm_session_free(s);
          s = r;
        }
        break;
      }
      case 9: {  // logits
        if (!s) break;
        const float* lg = nullptr;
        size_t nv = 0;
        const llm_status st = llm_logits(s, &lg, &nv);
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_CONTEXT_FULL);
        if (st == LLM_OK) LLM_FUZZ_EXPECT(lg != nullptr && nv == 512);
        break;
      }
      case 10: {  // a snapshot one byte short is refused
        if (!s) break;
        const std::vector<uint8_t> b = save(s);
        llm_session* r = nullptr;
        const llm_status st = llm_session_restore(model, b.data(), b.size() - 1, &r);
        LLM_FUZZ_EXPECT((st == LLM_ERR_CHECKSUM || st == LLM_ERR_FORMAT) && !r);
        break;
      }
      case 11: {  // decode_batch over every live slot: stops at the first failure
        llm_session* batch[kSlots];
        uint32_t caps[kSlots];
        size_t n = 0;
        for (int j = 0; j < kSlots; ++j)
          if (slot[j]) {
            caps[n] = max_tokens[j];
            batch[n++] = slot[j];
          }
        std::vector<Snapshot> before;
        for (size_t j = 0; j < n; ++j) before.push_back(observe(batch[j]));
        llm_token out[kSlots];
        const llm_status st = llm_decode_batch(batch, n, nullptr, out);
        LLM_FUZZ_EXPECT(st == LLM_OK || st == LLM_ERR_INVALID_ARGUMENT || st == LLM_ERR_CONTEXT_FULL);
        bool failed = false;
        for (size_t j = 0; j < n; ++j) {
          if (out[j] == -1) {
            failed = true;
            check_unchanged(before[j], batch[j]);  // the failing session and those after it
          } else {
            LLM_FUZZ_EXPECT(!failed && out[j] >= 0 && out[j] < 512);
            // One token more, less what a sliding window evicted to make room for it.
            const llm_session_stats_t after = stats_of(batch[j]);
            LLM_FUZZ_EXPECT(after.n_tokens + (after.n_evicted - before[j].st.n_evicted) == before[j].st.n_tokens + 1);
          }
          check_invariants(batch[j], caps[j]);
        }
        LLM_FUZZ_EXPECT((st == LLM_OK) == !failed);
        break;
      }
    }
    if (s) check_invariants(s, max_tokens[i]);
  }
  for (llm_session*& s : slot) llm_session_free(s);
  return 0;
}
