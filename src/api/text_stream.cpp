#include "api/text_stream.h"

#include <algorithm>

#include "api/utf8.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace llm::api {

TextStream::TextStream(const Tokenizer& tk, std::vector<std::string> stops) : tk_(tk), stops_(std::move(stops)) {
  LLM_CHECK(stops_.size() <= kMaxStops, LLM_ERR_INVALID_ARGUMENT, "%zu stop strings (at most %zu)", stops_.size(),
            kMaxStops);
  for (size_t i = 0; i < stops_.size(); ++i) {
    LLM_CHECK(!stops_[i].empty(), LLM_ERR_INVALID_ARGUMENT, "stop string %zu is empty", i);
    LLM_CHECK(stops_[i].size() <= kMaxStopBytes, LLM_ERR_INVALID_ARGUMENT, "stop string %zu has %zu bytes (at most %zu)",
              i, stops_[i].size(), kMaxStopBytes);
  }
}

TextStream::State TextStream::push(const State& in, int32_t token, std::string& out) const {
  State s = in;
  out.clear();
  if (s.stopped) return s;
  if (tk_.is_eog(token)) {
    // The held text never became a stop string: it is text after all.
    flush(s, out);
    s.stopped = true;
    return s;
  }
  std::string bytes = s.utf8_pending;
  const size_t before = bytes.size();
  tk_.append_piece(token, bytes);
  const bool at_start = s.prev_token < 0 || s.prev_token == tk_.bos();
  if (at_start && tk_.strip_space_after_bos() && bytes.size() > before && bytes[before] == ' ') bytes.erase(before, 1);
  if (!(tk_.is_control(token) && bytes.size() == before)) s.prev_token = token;
  std::string text;
  const size_t n_pending = utf8_complete(bytes, text);
  s.utf8_pending.assign(bytes, bytes.size() - n_pending, n_pending);
  s.held += text;

  // The earliest stop string in the held text ends the stream there.
  size_t cut = std::string::npos;
  for (const std::string& stop : stops_) cut = std::min(cut, s.held.find(stop));
  if (cut != std::string::npos) {
    out.assign(s.held, 0, cut);
    s.held.clear();
    s.utf8_pending.clear();
    s.stopped = true;
    return s;
  }
  // Hold back the longest tail that is the beginning of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    const size_t max_k = std::min(stop.size() - 1, s.held.size());
    for (size_t k = max_k; k > keep; --k)
      if (s.held.compare(s.held.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
  }
  out.assign(s.held, 0, s.held.size() - keep);
  s.held.erase(0, s.held.size() - keep);
  return s;
}

void TextStream::flush(State& s, std::string& out) {
  out = s.held;
  for (size_t i = 0; i < s.utf8_pending.size(); ++i) out += "\xEF\xBF\xBD";
  s.held.clear();
  s.utf8_pending.clear();
}

}  // namespace llm::api
