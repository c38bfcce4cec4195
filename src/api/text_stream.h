// Generated tokens -> text to show (llm_text_stream_*): complete UTF-8 only,
// stop strings matched across token boundaries, end-of-generation tokens end
// the stream. The text that may still turn into a stop string is held back
// until it cannot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace llm {
class Tokenizer;
}

namespace llm::api {

class TextStream {
 public:
  // Throws Error(LLM_ERR_INVALID_ARGUMENT) for an empty or oversized stop, or too many.
  TextStream(const Tokenizer& tk, std::vector<std::string> stops);

  // The text that became safe to show after `token`; sets *stopped once a
  // stop string or an end-of-generation token ended the stream. Pure: the
  // caller commits the returned state (so a too-small buffer changes nothing).
  struct State {
    std::string utf8_pending;  // bytes of an unfinished UTF-8 sequence
    std::string held;          // complete text whose tail may begin a stop string
    int32_t prev_token = -1;   // last token that produced text (SentencePiece leading-space rule)
    bool stopped = false;
  };
  State push(const State& s, int32_t token, std::string& out) const;
  // Everything still held, as text (unfinished UTF-8 as U+FFFD).
  static void flush(State& s, std::string& out);

  State& state() { return state_; }

  static constexpr size_t kMaxStops = 64;
  static constexpr size_t kMaxStopBytes = 1024;

 private:
  const Tokenizer& tk_;
  std::vector<std::string> stops_;
  State state_;
};

}  // namespace llm::api
