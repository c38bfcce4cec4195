// The native .llm container (docs/FORMAT.md): header, metadata, tensor
// table, tensor data (raw + aligned for mmap, or zstd chunks), every stored
// byte covered by an XXH3-64 checksum. The reader; the writer and the
// conversion are offline code in convert/llm_file_writer.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/model_source.h"

namespace llm {

class ThreadPool;

// Format constants (docs/FORMAT.md). Never change their values.
constexpr uint16_t kLlmVersionMajor = 1;
constexpr uint16_t kLlmVersionMinor = 0;
constexpr uint32_t kLlmHeaderSize = 128;
constexpr uint32_t kLlmAlignment = 64;

// How a tensor's bytes are stored.
enum class LlmCodec : uint32_t {
  Raw = 0,         // the raw bytes, aligned: read zero-copy from the mapping
  Zstd = 1,        // independent zstd frames of chunk_bytes raw bytes each, then a chunk index
  ZstdPlanes = 2,  // as Zstd, but each chunk is split into byte planes (most significant first)
                   // of the element width (2 for f16/bf16, 4 for f32) before compression
};
const char* llm_codec_name(LlmCodec c);

struct LlmReadOptions {
  bool vocab_only = false;
  bool verify_checksums = true;
  ThreadPool* pool = nullptr;               // parallel decompression/verification
  std::function<bool(float)> progress;      // return false to cancel -> LLM_ERR_CANCELLED
};

// True if the bytes start with the .llm magic.
bool is_llm_file(const uint8_t* data, size_t size);

// Reads and validates a .llm file. LLM_ERR_FORMAT for structure errors,
// LLM_ERR_CHECKSUM for checksum mismatches, LLM_ERR_UNSUPPORTED for newer
// versions / unknown dtypes or codecs. Raw tensors point into the mapping
// (ModelSource::file); zstd tensors are decompressed into TensorData::owned.
// ModelSource::meta gets the file's extra string metadata.
ModelSource read_llm(const std::string& path, const LlmReadOptions& opts = {});
ModelSource parse_llm(std::shared_ptr<MappedFile> file, const LlmReadOptions& opts = {});

// The container's structure, validated (header, metadata and table
// checksums; every region inside the file) but without reading tensor data.
struct LlmTableEntry {
  std::string name;
  DType dtype = DType::F32;
  uint32_t group = 0;
  LlmCodec codec = LlmCodec::Raw;
  std::vector<int64_t> shape;
  uint64_t offset = 0, stored_size = 0, raw_size = 0, checksum = 0;
  uint32_t chunk_bytes = 0;
  uint64_t n_chunks = 0;
};
struct LlmFileInfo {
  uint16_t version_major = 0, version_minor = 0;
  uint32_t flags = 0;
  uint64_t meta_offset = 0, meta_size = 0;
  uint64_t table_offset = 0, table_size = 0;
  uint64_t data_offset = 0, data_size = 0;
  std::vector<LlmTableEntry> tensors;
};
LlmFileInfo inspect_llm(const uint8_t* data, size_t size);

}  // namespace llm
