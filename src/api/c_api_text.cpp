// The C ABI of text streams with stop strings (llm_text_stream_*).
#include <cstring>
#include <string>
#include <vector>

#include "api/handles.h"
#include "api/text_stream.h"
#include "core/error.h"

using llm::api::copy_out;
using llm::api::model_of;

struct llm_text_stream {
  uint64_t magic;
  std::shared_ptr<llm::Model> model;  // keeps the tokenizer alive
  llm::api::TextStream impl;
};

namespace {

constexpr uint64_t kStreamMagic = 0x4c4c4d5354524d53ULL;  // "LLMSTRMS"

llm_text_stream& stream_of(llm_text_stream* s) {
  LLM_CHECK(s != nullptr, LLM_ERR_INVALID_ARGUMENT, "text stream is NULL");
  LLM_CHECK(llm::api::is_live(s) && s->magic == kStreamMagic, LLM_ERR_INVALID_ARGUMENT,
            "text stream handle %p is not live (freed, or not from llm_text_stream_create)", static_cast<void*>(s));
  return *s;
}

}  // namespace

extern "C" LLM_API llm_status llm_text_stream_create(const llm_model* model, const char* const* stops, size_t n_stops,
                                                     llm_text_stream** out_stream) {
  if (out_stream) *out_stream = nullptr;
  LLM_API_BEGIN
  model_of(model);
  LLM_CHECK_ARG(out_stream != nullptr);
  LLM_CHECK_ARG(stops != nullptr || n_stops == 0);
  LLM_CHECK(n_stops <= llm::api::TextStream::kMaxStops, LLM_ERR_INVALID_ARGUMENT, "%zu stop strings (at most %zu)",
            n_stops, llm::api::TextStream::kMaxStops);
  std::vector<std::string> v;
  for (size_t i = 0; i < n_stops; ++i) {
    LLM_CHECK(stops[i] != nullptr, LLM_ERR_INVALID_ARGUMENT, "stop string %zu is NULL", i);
    const size_t len = strnlen(stops[i], llm::api::TextStream::kMaxStopBytes + 1);
    v.emplace_back(stops[i], len);
  }
  std::shared_ptr<llm::Model> m = model->impl;
  std::unique_ptr<llm_text_stream> h(
      new llm_text_stream{kStreamMagic, m, llm::api::TextStream(m->tokenizer(), std::move(v))});
  llm::api::register_handle(h.get());
  *out_stream = h.release();
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_text_stream_push(llm_text_stream* stream, llm_token token, char* buf,
                                                   size_t capacity, size_t* length, int32_t* stopped) {
  if (length) *length = 0;
  LLM_API_BEGIN
  llm_text_stream& s = stream_of(stream);
  LLM_CHECK_ARG(length != nullptr && stopped != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  const int32_t n_vocab = s.model->tokenizer().n_vocab();
  LLM_CHECK(token >= 0 && token < n_vocab, LLM_ERR_INVALID_ARGUMENT, "token id %d outside [0, %d)", token, n_vocab);
  std::string out;
  llm::api::TextStream::State next = s.impl.push(s.impl.state(), token, out);
  const llm_status st = copy_out(out, buf, capacity, length);
  if (st != LLM_OK) return st;  // stream unchanged
  s.impl.state() = std::move(next);
  *stopped = s.impl.state().stopped ? 1 : 0;
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_text_stream_flush(llm_text_stream* stream, char* buf, size_t capacity,
                                                    size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  llm_text_stream& s = stream_of(stream);
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  llm::api::TextStream::State next = s.impl.state();
  std::string out;
  llm::api::TextStream::flush(next, out);
  const llm_status st = copy_out(out, buf, capacity, length);
  if (st != LLM_OK) return st;
  s.impl.state() = std::move(next);
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_text_stream_reset(llm_text_stream* stream) {
  LLM_API_BEGIN
  stream_of(stream).impl.state() = llm::api::TextStream::State{};
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API void llm_text_stream_free(llm_text_stream* stream) {
  if (!stream || !llm::api::is_live(stream) || stream->magic != kStreamMagic) return;
  llm::api::unregister_handle(stream);
  stream->magic = 0;
  delete stream;
}
