// Fuzz target: the .llm container reader (parse_llm, inspect_llm) and the
// model built from what it accepts.
//
// Input: one mode byte, then the file bytes.
//   mode bit 0: repair the header, metadata and table checksums before
//               parsing (and skip tensor checksums), so mutations reach the
//               structure checks behind them instead of dying at the first
//               XXH3 comparison;
//   mode bit 1: vocab-only read;
//   mode bit 2: also run inspect_llm on the same bytes.
#include <xxhash.h>

#include "format/llm_file.h"
#include "fuzz_model.h"

namespace {

uint64_t get_u64(const std::vector<uint8_t>& b, size_t off) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}
void put_u64(std::vector<uint8_t>& b, size_t off, uint64_t v) { std::memcpy(b.data() + off, &v, 8); }

// Header layout (docs/FORMAT.md): magic[8] u16 major u16 minor u32 header_size
// u32 flags u32 alignment u64 file_size u64 meta_offset u64 meta_size
// u64 meta_checksum u64 table_offset u64 table_size u64 table_checksum ...
// and the header's own XXH3-64 in its last 8 bytes.
void repair_checksums(std::vector<uint8_t>& b) {
  if (b.size() < 128) return;
  uint32_t header_size;
  std::memcpy(&header_size, b.data() + 12, 4);
  if (header_size < 104 || header_size > b.size() || header_size % 8 != 0) return;
  const uint64_t n = b.size();
  auto fix_region = [&](size_t off_field, size_t size_field, size_t sum_field) {
    const uint64_t off = get_u64(b, off_field), len = get_u64(b, size_field);
    if (off <= n && len <= n - off) put_u64(b, sum_field, XXH3_64bits(b.data() + off, size_t(len)));
  };
  fix_region(32, 40, 48);  // metadata
  fix_region(56, 64, 72);  // tensor table
  put_u64(b, header_size - 8, XXH3_64bits(b.data(), header_size - 8));
}

}  // namespace

LLM_FUZZ_TARGET(llm_file) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> bytes(data + 1, data + size);
  const bool repaired = mode & 1;
  if (repaired) repair_checksums(bytes);
  if (mode & 4) {
    try {
      const llm::LlmFileInfo info = llm::inspect_llm(bytes.data(), bytes.size());
      for (const auto& t : info.tensors) LLM_FUZZ_EXPECT(t.offset + t.stored_size <= bytes.size());
    }
    LLM_FUZZ_CATCH_ERRORS
  }
  llm::LlmReadOptions ro;
  ro.vocab_only = mode & 2;
  ro.verify_checksums = !repaired;
  try {
    llm::ModelSource src = llm::parse_llm(llm::MappedFile::from_bytes(std::move(bytes)), ro);
    std::unique_ptr<llm::Model> m = llm::Model::from_source(std::move(src), llm::fuzz::fuzz_load_options(ro.vocab_only));
    llm::fuzz::exercise_model(*m);
  }
  LLM_FUZZ_CATCH_ERRORS
  return 0;
}
