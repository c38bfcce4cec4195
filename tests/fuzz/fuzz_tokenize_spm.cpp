// Fuzz target: llm_tokenize / llm_detokenize / llm_detok_push on the 32000-token
// Llama 2 SentencePiece vocabulary (ggml-vocab-llama-spm.gguf, vocab-only).
#include "fuzz_tokenize.inc"

LLM_FUZZ_TARGET(tokenize_spm) {
  static llm_model* m = llm::fuzz::load_once("ggml-vocab-llama-spm.gguf", LLM_LOAD_VOCAB_ONLY);
  check_tokenize(m, data, size, false);
  return 0;
}
