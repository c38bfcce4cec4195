// Fuzz target: the GGUF reader (parse_gguf, gguf_to_model_source including
// the dequantise/re-quantise path of non-native ggml types) and the model
// built from what it accepts.
//
// Input: one mode byte (bit 0: vocab-only), then the file bytes.
#include "core/log.h"
#include "format/gguf.h"
#include "fuzz_model.h"

namespace {

void count_log(llm_log_level level, const char* message, void* user) {
  LLM_FUZZ_EXPECT(message != nullptr);
  LLM_FUZZ_EXPECT(level >= LLM_LOG_DEBUG && level <= LLM_LOG_ERROR);
  ++*static_cast<int*>(user);
}

}  // namespace

LLM_FUZZ_TARGET(gguf) {
  if (size < 1) return 0;
  const bool vocab_only = data[0] & 1;
  std::shared_ptr<llm::MappedFile> file =
      llm::MappedFile::from_bytes(std::vector<uint8_t>(data + 1, data + size), "<fuzz>");
  int n_logs = 0;
  llm::Logger log;
  log.fn = count_log;
  log.user = &n_logs;
  try {
    llm::GgufFile g = llm::parse_gguf(file->data(), file->size(), vocab_only);
    for (const auto& t : g.tensors) {
      if (!t.data) continue;
      LLM_FUZZ_EXPECT(t.data >= file->data() && t.nbytes <= file->size() &&
                      size_t(t.data - file->data()) <= file->size() - t.nbytes);
    }
    llm::ModelSource src = llm::gguf_to_model_source(g, file, vocab_only, &log);
    llm::LoadOptions lo = llm::fuzz::fuzz_load_options(vocab_only);
    lo.log = log;
    std::unique_ptr<llm::Model> m = llm::Model::from_source(std::move(src), lo);
    llm::fuzz::exercise_model(*m);
  }
  LLM_FUZZ_CATCH_ERRORS
  return 0;
}
