// Fuzz target: llama2.c tokenizer files (parse_llama2c_tokenizer) and the
// SentencePiece tokenizer built from whatever vocabulary they hold
// (duplicate pieces, empty pieces, odd scores, missing byte tokens).
//
// Input: u16 vocab_size (1..4096 after folding), one byte of text length,
// that many bytes of text to encode, then the tokenizer file bytes.
#include "format/llama2c.h"
#include "fuzz_model.h"

LLM_FUZZ_TARGET(llama2c_tokenizer) {
  llm::fuzz::Bytes in(data, size);
  const int32_t vocab_size = int32_t(in.u16() % 4096) + 1;
  const std::vector<uint8_t> text = in.take(in.u8());
  try {
    llm::VocabData v = llm::parse_llama2c_tokenizer(in.rest(), in.left(), vocab_size);
    LLM_FUZZ_EXPECT(v.tokens.size() == size_t(vocab_size));
    std::unique_ptr<llm::Tokenizer> tk = llm::Tokenizer::create(v);
    llm::fuzz::exercise_tokenizer(*tk);
    for (int flags = 0; flags < 4; ++flags) {
      std::vector<int32_t> ids;
      tk->encode(std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), flags & 1, flags & 2,
                 ids);
      std::string back;
      for (int32_t id : ids) {
        LLM_FUZZ_EXPECT(id >= 0 && id < tk->n_vocab());
        tk->append_piece(id, back);
      }
    }
  }
  LLM_FUZZ_CATCH_ERRORS
  return 0;
}
