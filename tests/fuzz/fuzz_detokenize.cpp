// Fuzz target: llm_detokenize, llm_token_to_text, llm_token_is_eog and the
// streaming detokenizer (llm_detok_push / llm_detok_flush) on arbitrary id
// sequences, with arbitrary (often too small) output buffers.
//
// Input: byte 0 picks the vocabulary (bits 0-1: stories260K SPM-512, Llama 2
// SPM-32000, GPT-2 BPE) and whether ids are taken raw (bit 2: out-of-range
// and negative ids included) or folded into the vocabulary; byte 1 is the
// streaming buffer capacity; then int32 ids (little-endian).
#include "fuzz_tokenize.inc"

namespace {

llm_model* pick_model(int which) {
  static llm_model* stories = llm::fuzz::load_once("stories260K.gguf", LLM_LOAD_VOCAB_ONLY);
  static llm_model* spm = llm::fuzz::load_once("ggml-vocab-llama-spm.gguf", LLM_LOAD_VOCAB_ONLY);
  static llm_model* gpt2 = llm::fuzz::load_once("ggml-vocab-gpt-2.gguf", LLM_LOAD_VOCAB_ONLY);
  return which == 0 ? stories : which == 1 ? spm : gpt2;
}

// Length of the longest piece of the vocabulary. One llm_detok_push turns
// at most 3 held-back bytes plus one piece into output, and each byte that
// can never complete becomes a 3-byte U+FFFD: at most 3 * (3 + longest).
size_t longest_piece(int which) {
  static size_t cached[3] = {0, 0, 0};
  if (cached[which] == 0) {
    llm_model* m = pick_model(which);
    llm_model_properties info;
    info.struct_size = sizeof info;
    llm_model_info(m, &info);
    for (llm_token t = 0; t < llm_token(info.vocab_size); ++t) {
      size_t n = 0;
      llm_token_to_text(m, t, nullptr, 0, &n);
      if (n > cached[which]) cached[which] = n;
    }
  }
  return cached[which];
}

}  // namespace

LLM_FUZZ_TARGET(detokenize) {
  llm::fuzz::Bytes in(data, size);
  const uint8_t mode = in.u8();
  const size_t cap = in.u8();
  const int which = int(mode & 3) % 3;
  llm_model* m = pick_model(which);
  const size_t max_push = 3 * (3 + longest_piece(which));
  const bool raw = mode & 4;
  llm_model_properties info;
  info.struct_size = sizeof info;
  LLM_FUZZ_EXPECT(llm_model_info(m, &info) == LLM_OK);
  const int64_t nv = info.vocab_size;

  std::vector<llm_token> ids;
  bool all_valid = true;
  while (in.left() >= 4 && ids.size() < 4096) {
    int32_t v = int32_t(in.u32());
    if (!raw) v = int32_t(((int64_t(v) % nv) + nv) % nv);
    all_valid = all_valid && v >= 0 && v < nv;
    ids.push_back(v);
  }

  size_t len = 0;
  llm_status st = llm_detokenize(m, ids.data(), ids.size(), nullptr, 0, &len);
  if (!all_valid) {
    LLM_FUZZ_EXPECT(st == LLM_ERR_INVALID_ARGUMENT && llm_last_error()[0] != '\0');
  } else {
    const std::string whole = detokenize(m, ids);
    if (valid_utf8(whole)) LLM_FUZZ_EXPECT(detokenize_streaming(m, ids) == whole);
  }

  // Streaming with the fuzzed capacity: a too-small buffer leaves the state
  // untouched, and a retry with room succeeds.
  llm_detok_state ds;
  llm_detok_init(&ds, (raw && !ids.empty()) ? ids[0] : -1);
  std::vector<char> small(cap);
  char big[1024];
  for (llm_token t : ids) {
    const llm_detok_state before = ds;
    size_t n = 0;
    st = llm_detok_push(m, &ds, t, small.empty() ? nullptr : small.data(), small.size(), &n);
    if (t < 0 || t >= nv) {
      LLM_FUZZ_EXPECT(st == LLM_ERR_INVALID_ARGUMENT && std::memcmp(&before, &ds, sizeof ds) == 0);
      continue;
    }
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
      LLM_FUZZ_EXPECT(n > small.size() && std::memcmp(&before, &ds, sizeof ds) == 0);
      st = llm_detok_push(m, &ds, t, big, sizeof big, &n);
    }
    LLM_FUZZ_EXPECT(st == LLM_OK && n <= sizeof big && ds.n_pending <= 4);

    size_t piece = 0;
    const llm_status ts = llm_token_to_text(m, t, nullptr, 0, &piece);
    LLM_FUZZ_EXPECT(ts == (piece == 0 ? LLM_OK : LLM_ERR_BUFFER_TOO_SMALL));
    LLM_FUZZ_EXPECT(n <= max_push);
    (void)llm_token_is_eog(m, t);
  }
  size_t n = 0;
  st = llm_detok_flush(&ds, big, sizeof big, &n);
  LLM_FUZZ_EXPECT(st == LLM_OK && ds.n_pending == 0);
  return 0;
}
