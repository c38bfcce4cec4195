// Fuzz target: llm_tokenize / llm_detokenize / llm_detok_push on the GPT-2
// byte-level BPE vocabulary (ggml-vocab-gpt-2.gguf, vocab-only).
#include "fuzz_tokenize.inc"

LLM_FUZZ_TARGET(tokenize_gpt2) {
  static llm_model* m = llm::fuzz::load_once("ggml-vocab-gpt-2.gguf", LLM_LOAD_VOCAB_ONLY);
  check_tokenize(m, data, size, true);
  return 0;
}
