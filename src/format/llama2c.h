// llama2.c checkpoints (version 0 "legacy" float32 layout: 7 x int32 header,
// then weights) and llama2.c tokenizer files (tokenizer.bin / tok512.bin).
#pragma once

#include <string>

#include "format/model_source.h"

namespace llm {

// Reads a tokenizer file into GGUF-style VocabData ('▁' for space, "<s>",
// "</s>", "<0xXX>", token types). vocab_size from the checkpoint.
VocabData parse_llama2c_tokenizer(const uint8_t* data, size_t size, int32_t vocab_size);

// Reads a checkpoint + tokenizer. Throws Error(LLM_ERR_FORMAT) on size mismatch.
ModelSource read_llama2c(const std::string& checkpoint_path, const std::string& tokenizer_path);

// True if the bytes look like a llama2.c checkpoint (header consistent with size).
bool looks_like_llama2c(const uint8_t* data, size_t size);

}  // namespace llm
