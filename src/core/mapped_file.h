// Read-only memory map of a whole file (falls back to reading it into memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llm {

class MappedFile {
 public:
  // Throws Error(LLM_ERR_IO) if the file cannot be opened or mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  // Wraps bytes already in memory (tests, fuzzers, restore buffers).
  static std::shared_ptr<MappedFile> from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Advises the kernel that [p, p + n) will not be read again: the whole
  // pages inside it leave this process (a private read-only mapping reads
  // the file again if they ever are). No-op for bytes held in memory.
  void drop_pages(const uint8_t* p, size_t n) const noexcept;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  std::string path_;
};

}  // namespace llm
