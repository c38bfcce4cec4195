// llama.cpp's tokenizer test vectors: a .out file holds one line of token ids per text.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace llm::testing {

inline std::vector<std::vector<int32_t>> parse_vocab_ids(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace llm::testing
