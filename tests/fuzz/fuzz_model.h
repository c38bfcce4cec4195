// Runs a model that a parser accepted from fuzzed bytes through the engine:
// tokenizer both ways and, with weights, a short session (prefill, decode,
// evict, fork, save/restore). Whatever the weights hold (NaN, Inf, huge
// values), the engine may fail only with an llm::Error carrying a
// documented status; the caller catches it.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "engine/session.h"
#include "fuzz_common.h"
#include "model/model.h"

namespace llm::fuzz {

inline LoadOptions fuzz_load_options(bool vocab_only) {
  LoadOptions o;
  o.n_threads = 1;
  o.vocab_only = vocab_only;
  o.kv_budget_bytes = uint64_t(16) << 20;  // a hostile shape cannot take more than this for KV
  return o;
}

inline void exercise_tokenizer(const Tokenizer& tk) {
  static const char kText[] = "Once upon a time, <s> </s> <|endoftext|> caf\xC3\xA9 \xE2\x96\x81 \xFF\xFE  x\n";
  for (int flags = 0; flags < 4; ++flags) {
    std::vector<int32_t> ids;
    tk.encode(std::string_view(kText, sizeof kText - 1), flags & 1, flags & 2, ids);
    std::string text;
    for (int32_t id : ids) {
      LLM_FUZZ_EXPECT(id >= 0 && id < tk.n_vocab());
      tk.append_piece(id, text);
    }
  }
  std::string s;
  const int32_t n = tk.n_vocab() < 300 ? tk.n_vocab() : 300;
  for (int32_t id = 0; id < n; ++id) {
    tk.append_piece(id, s);
    (void)tk.is_eog(id);
    (void)tk.is_control(id);
  }
}

inline void exercise_session(const Model& m) {
  const int32_t n_vocab = m.config().vocab_size;
  SessionOptions so;
  so.max_tokens = 12;
  Session s(m, so);
  const int32_t bos = m.tokenizer().bos() >= 0 ? m.tokenizer().bos() : 0;
  const int32_t prompt[3] = {bos, n_vocab > 1 ? 1 : 0, n_vocab - 1};
  s.prefill(prompt, 3);
  llm_sampling greedy;
  llm_sampling_init(&greedy);
  for (int i = 0; i < 2; ++i) {
    const int32_t t = s.decode_step(&greedy);
    LLM_FUZZ_EXPECT(t >= 0 && t < n_vocab);
  }
  llm_sampling hot = greedy;
  hot.temperature = 0.9f;
  hot.top_k = 5;
  hot.top_p = 0.8f;
  hot.seed = 7;
  const int32_t t = s.decode_step(&hot);
  LLM_FUZZ_EXPECT(t >= 0 && t < n_vocab);
  std::unique_ptr<Session> f = s.fork();
  s.evict(1, 1);
  (void)s.logits();
  std::vector<uint8_t> snap;
  f->save(snap);
  std::unique_ptr<Session> r = Session::restore(m, snap.data(), snap.size());
  LLM_FUZZ_EXPECT(r->tokens() == f->tokens());
}

inline void exercise_model(const Model& m) {
  exercise_tokenizer(m.tokenizer());
  if (!m.vocab_only()) exercise_session(m);
}

// The only exceptions allowed out of a parser or the engine: llm::Error with
// a documented status. Anything else propagates and crashes the fuzzer.
#define LLM_FUZZ_CATCH_ERRORS                                  \
  catch (const ::llm::Error& e) {                              \
    LLM_FUZZ_EXPECT(::llm::fuzz::is_documented_status(e.status())); \
  }

}  // namespace llm::fuzz
