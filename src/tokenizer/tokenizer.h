// Tokenizers: SentencePiece-style BPE ("llama"), byte-level BPE ("gpt2") and
// BPE over raw UTF-8 ("gemma4").
// Built once per model from VocabData; immutable afterwards, so every method
// is safe to call from many threads at once. encode() allocates nothing
// proportional to the vocabulary per call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "format/model_source.h"

namespace llm {

class Tokenizer {
 public:
  // Throws Error(LLM_ERR_FORMAT / LLM_ERR_UNSUPPORTED) for a bad or unknown vocabulary.
  // Takes the vocabulary (pass an rvalue to move it in: no second copy).
  static std::unique_ptr<Tokenizer> create(VocabData vocab);
  virtual ~Tokenizer() = default;
  // Its lookup tables refer to its own vocabulary: never copied or moved.
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Appends the ids of `text` to `out` (BOS first if add_bos and the
  // vocabulary has one). Never fails on any byte sequence: invalid UTF-8 is
  // tokenized byte by byte. The text of a UserDefined token always becomes
  // that token (leftmost, longest match), and the text between is tokenized
  // normally, as in llama.cpp and Hugging Face tokenizers. With
  // parse_special the same holds for Control and Unknown tokens (and
  // bos/eos/eot/unk/pad); without it, their text is ordinary text.
  // SentencePiece gives each stretch between such tokens its own dummy
  // prefix, as llama.cpp does.
  virtual void encode(std::string_view text, bool add_bos, bool parse_special,
                      std::vector<int32_t>& out) const = 0;

  // Appends the raw bytes of token `id`'s piece to `out` ('▁' -> ' ', byte
  // tokens -> their byte, byte-level BPE chars -> bytes, user-defined ->
  // their text, control/unused -> nothing, SentencePiece <unk> -> U+2585 as
  // in llama.cpp). An id outside [0, n_vocab()) appends nothing.
  virtual void append_piece(int32_t id, std::string& out) const = 0;

  // True if the piece of a token that follows BOS drops its leading space
  // (SentencePiece dummy prefix).
  virtual bool strip_space_after_bos() const = 0;

  int32_t n_vocab() const { return int32_t(vocab_.tokens.size()); }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  bool is_eog(int32_t id) const;      // EOS, EOT and other end-of-generation tokens
  bool is_control(int32_t id) const;  // control / unused tokens
  const VocabData& vocab() const { return vocab_; }
  // A note on how the vocabulary was interpreted (for example an unknown
  // pre-tokenizer name replaced by the default); empty if there is none.
  // The tokenizer has no logger: the caller may pass this on.
  const std::string& warning() const { return warning_; }

 protected:
  explicit Tokenizer(VocabData vocab) : vocab_(std::move(vocab)) {}
  VocabData vocab_;
  std::vector<int32_t> eog_ids_;  // filled by create(), sorted
  std::string warning_;
};

}  // namespace llm
