// Fuzz target: llm_session_restore on untrusted snapshot bytes, with the
// stories260K model. A snapshot that is accepted must save back to the very
// same bytes and must be usable (logits, decode, evict, fork).
//
// Input: one mode byte, then the snapshot.
//   mode bit 0: rewrite the trailing XXH3-64 so mutations get past the
//               checksum into the structure checks;
//   mode bit 1: sample with temperature/top-k/top-p/min-p instead of greedy
//               (the restored logits may be NaN or Inf).
#include <xxhash.h>

#include "fuzz_common.h"

LLM_FUZZ_TARGET(session_restore) {
  static llm_model* model = llm::fuzz::load_once("stories260K.gguf", 0);
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> snap(data + 1, data + size);
  if ((mode & 1) && snap.size() >= 8) {
    const uint64_t sum = XXH3_64bits(snap.data(), snap.size() - 8);
    std::memcpy(snap.data() + snap.size() - 8, &sum, 8);
  }
  llm_session* s = nullptr;
  const llm_status st = llm_session_restore(model, snap.data(), snap.size(), &s);
  LLM_FUZZ_EXPECT(llm::fuzz::is_documented_status(st));
  if (st != LLM_OK) {
    LLM_FUZZ_EXPECT(s == nullptr && llm_last_error()[0] != '\0');
    return 0;
  }
  LLM_FUZZ_EXPECT(s != nullptr);
  // Saving gives the same bytes back, except that slots past the sequence in
  // the last KV page are written as zeros: restore(save(.)) is a fixed point.
  size_t need = 0;
  LLM_FUZZ_EXPECT(llm_session_save(s, nullptr, 0, &need) == LLM_ERR_BUFFER_TOO_SMALL);
  LLM_FUZZ_EXPECT(need == snap.size());
  std::vector<uint8_t> again(need);
  LLM_FUZZ_EXPECT(llm_session_save(s, again.data(), again.size(), &need) == LLM_OK);
  llm_session* s2 = nullptr;
  LLM_FUZZ_EXPECT(llm_session_restore(model, again.data(), again.size(), &s2) == LLM_OK);
  if (s2) {
    std::vector<uint8_t> third(need);
    LLM_FUZZ_EXPECT(llm_session_save(s2, third.data(), third.size(), &need) == LLM_OK && third == again);
    llm_session_free(s2);
  }

  llm_session_stats_t stats;
  stats.struct_size = sizeof stats;
  LLM_FUZZ_EXPECT(llm_session_stats(s, &stats) == LLM_OK);
  llm_sampling sp;
  llm_sampling_init(&sp);
  if (mode & 2) {
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.9f;
    sp.min_p = 0.05f;
    sp.repeat_penalty = 1.3f;
  }
  llm_session* f = nullptr;
  const llm_status fst = llm_session_fork(s, &f);
  LLM_FUZZ_EXPECT(fst == LLM_OK || fst == LLM_ERR_OUT_OF_MEMORY);
  for (int i = 0; i < 3; ++i) {
    llm_token t = -1;
    const llm_status d = llm_decode_step(s, &sp, &t);
    LLM_FUZZ_EXPECT(d == LLM_OK || d == LLM_ERR_INVALID_ARGUMENT || d == LLM_ERR_CONTEXT_FULL);
    if (d == LLM_OK) LLM_FUZZ_EXPECT(t >= 0 && t < 512);
    if (d != LLM_OK) break;
  }
  if (f) {
    const float* lg = nullptr;
    size_t nv = 0;
    const llm_status ls = llm_logits(f, &lg, &nv);
    LLM_FUZZ_EXPECT(ls == LLM_OK || ls == LLM_ERR_INVALID_ARGUMENT || ls == LLM_ERR_CONTEXT_FULL);
    // The fork's own length: running its pending token may have made the
    // sliding window (restored with the snapshot) evict tokens.
    llm_session_stats_t fstats;
    fstats.struct_size = sizeof fstats;
    LLM_FUZZ_EXPECT(llm_session_stats(f, &fstats) == LLM_OK);
    // (A fork counts evictions from its own creation.)
    LLM_FUZZ_EXPECT(uint64_t(fstats.n_tokens) + fstats.n_evicted == stats.n_tokens);
    LLM_FUZZ_EXPECT(llm_kv_evict(f, 0, fstats.n_tokens / 2) == LLM_OK);
    llm_token t = -1;
    const llm_status d = llm_decode_step(f, &sp, &t);
    LLM_FUZZ_EXPECT(d == LLM_OK || d == LLM_ERR_INVALID_ARGUMENT || d == LLM_ERR_CONTEXT_FULL);
  }
  llm_session_free(f);
  llm_session_free(s);
  return 0;
}
