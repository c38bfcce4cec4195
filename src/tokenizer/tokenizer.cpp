// Tokenizer::create(): validates the vocabulary and picks the implementation.
// Also the pieces shared by both tokenizers (special-token matching, EOG set).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace llm {
namespace tok {

int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || (t[2] != 'x' && t[2] != 'X') || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

void SpecialMatcher::build(const std::vector<std::string>& tokens, const std::vector<int32_t>& ids) {
  // (first byte, length, last byte) of every special
  std::vector<std::pair<std::pair<uint8_t, uint32_t>, uint8_t>> keys;
  map_.reserve(tokens, ids.size());  // tokens: the tokenizer's own, outliving the map
  count_ = 0;
  second_bytes_.assign(256 * 4, 0);
  for (int32_t id : ids) {
    const std::string& t = tokens[size_t(id)];
    if (t.empty() || t.size() > UINT32_MAX) continue;
    map_.insert(id);
    keys.push_back({{uint8_t(t[0]), uint32_t(t.size())}, uint8_t(t.back())});
    if (t.size() > 1) add(&second_bytes_[size_t(uint8_t(t[0])) * 4], uint8_t(t[1]));
    ++count_;
  }
  // By first byte, then longest first.
  std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) {
    return a.first.first != b.first.first ? a.first.first < b.first.first : a.first.second > b.first.second;
  });
  lengths_.clear();
  last_bytes_.clear();
  size_t k = 0;
  for (int b = 0; b < 256; ++b) {
    len_begin_[b] = uint32_t(lengths_.size());
    for (; k < keys.size() && keys[k].first.first == b; ++k) {
      if (lengths_.size() == len_begin_[b] || lengths_.back() != keys[k].first.second) {
        lengths_.push_back(keys[k].first.second);
        last_bytes_.insert(last_bytes_.end(), 4, 0);
      }
      add(&last_bytes_[last_bytes_.size() - 4], keys[k].second);
    }
  }
  len_begin_[256] = uint32_t(lengths_.size());
  only_first_ = -1;
  if (!keys.empty() && keys.front().first.first == keys.back().first.first) only_first_ = keys.front().first.first;
}

bool SpecialMatcher::find(std::string_view text, size_t from, size_t* pos, size_t* len, int32_t* id) const {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t size = text.size();
  for (size_t i = from; i < size; ++i) {
    if (only_first_ >= 0) {
      const void* hit = std::memchr(s + i, only_first_, size - i);
      if (!hit) return false;
      i = size_t(static_cast<const uint8_t*>(hit) - s);
    }
    const uint8_t b = s[i];
    uint32_t k = len_begin_[b];
    const uint32_t ke = len_begin_[b + 1];
    if (k == ke) continue;
    // Without a possible second byte only a one-byte special can start here.
    if (i + 1 == size || !has(&second_bytes_[size_t(b) * 4], s[i + 1])) {
      if (lengths_[ke - 1] != 1) continue;
      k = ke - 1;
    }
    for (; k < ke; ++k) {
      const size_t n = lengths_[k];
      if (n > size - i || !has(&last_bytes_[size_t(k) * 4], s[i + n - 1])) continue;
      const int32_t found = map_.find(text.data() + i, n);
      if (found >= 0) {
        *pos = i;
        *len = n;
        *id = found;
        return true;
      }
    }
  }
  return false;
}

WordCache& WordCache::for_this_thread() {
  thread_local WordCache cache;
  return cache;
}

uint64_t WordCache::new_owner_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

std::vector<int32_t> special_token_ids(const VocabData& v) {
  std::vector<int32_t> ids;
  const int32_t n = int32_t(v.tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = token_type(v, id);
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) ids.push_back(id);
  }
  // The configured specials count even when the type array does not say so.
  for (int32_t id : {v.bos, v.eos, v.eot, v.unk, v.pad}) {
    if (id >= 0 && id < n && token_type(v, id) != TokenType::Byte) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

bool is_end_text(std::string_view text) {
  // The texts llama.cpp treats as end of generation (llama-vocab.cpp).
  static const char* const kEndTexts[] = {
      "<|eot_id|>",  "<|im_end|>",     "<|end|>",          "<|return|>",      "<|call|>",
      "<|flush|>",   "<|calls|>",      "<end_of_turn>",    "<|endoftext|>",   "</s>",
      "<|eom_id|>",  "<EOT>",          "_<EOT>",           "[EOT]",           "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>",    "<turn|>",         "<|tool_response>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",  // <｜end▁of▁sentence｜>
      "[e~[",
  };
  for (const char* end : kEndTexts) {
    if (text == end) return true;
  }
  return false;
}

std::vector<int32_t> user_defined_ids(const VocabData& v) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < int32_t(v.tokens.size()); ++id) {
    // llama.cpp makes a user-defined end marker (Phi-3's "</s>") a control
    // token, so its text is ordinary text without parse_special.
    if (token_type(v, id) == TokenType::UserDefined && !is_end_text(v.tokens[size_t(id)])) ids.push_back(id);
  }
  return ids;
}

}  // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::create(VocabData vocab) {
  const size_t n = vocab.tokens.size();
  LLM_CHECK(n > 0, LLM_ERR_FORMAT, "tokenizer: empty vocabulary");
  LLM_CHECK(n < size_t(INT32_MAX), LLM_ERR_FORMAT, "tokenizer: vocabulary too large (%zu)", n);
  LLM_CHECK(vocab.scores.empty() || vocab.scores.size() == n, LLM_ERR_FORMAT,
            "tokenizer: %zu scores for %zu tokens", vocab.scores.size(), n);
  LLM_CHECK(vocab.types.empty() || vocab.types.size() == n, LLM_ERR_FORMAT,
            "tokenizer: %zu token types for %zu tokens", vocab.types.size(), n);
  size_t text_bytes = 0;
  for (const std::string& t : vocab.tokens) text_bytes += t.size();
  // Decoded pieces are indexed with 32-bit offsets.
  LLM_CHECK(text_bytes < size_t(UINT32_MAX) / 2, LLM_ERR_FORMAT, "tokenizer: %zu bytes of token text", text_bytes);
  for (size_t i = 0; i < vocab.types.size(); ++i) {
    const int32_t t = vocab.types[i];
    LLM_CHECK(t >= 0 && t <= int32_t(TokenType::Byte), LLM_ERR_FORMAT, "tokenizer: token %zu has bad type %d", i,
              int(t));
  }
  const struct {
    const char* name;
    int32_t id;
  } specials[] = {{"bos", vocab.bos}, {"eos", vocab.eos}, {"unk", vocab.unk},
                  {"pad", vocab.pad}, {"eot", vocab.eot}, {"eom", vocab.eom}};
  for (const auto& s : specials) {
    LLM_CHECK(s.id >= -1 && s.id < int32_t(n), LLM_ERR_FORMAT, "tokenizer: %s id %d outside vocabulary of %zu",
              s.name, int(s.id), n);
  }

  std::unique_ptr<Tokenizer> tok;
  if (vocab.model == "llama") {
    tok = make_spm_tokenizer(std::move(vocab));
  } else if (vocab.model == "gpt2" || vocab.model == "gemma4") {
    // gemma4: BPE over raw UTF-8 with spaces as U+2581 (llama.cpp's "gemma4" pre-tokenizer).
    tok = make_bpe_tokenizer(std::move(vocab));
  } else {
    fail(LLM_ERR_UNSUPPORTED, "tokenizer: unsupported tokenizer model '%s' (supported: llama, gpt2, gemma4)",
         vocab.model.c_str());
  }

  // End of generation: EOS, EOT, EOM (Llama 3.1 tool calls) and the well-known
  // end markers present in the vocabulary.
  const VocabData& v = tok->vocab_;  // the tokenizer's own (vocab was moved into it)
  std::vector<int32_t>& eog = tok->eog_ids_;
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (id >= 0) eog.push_back(id);
  for (int32_t id = 0; id < int32_t(n); ++id) {
    const TokenType t = tok::token_type(v, id);
    if (t != TokenType::Control && t != TokenType::UserDefined && !v.types.empty()) continue;
    if (tok::is_end_text(v.tokens[size_t(id)])) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  return tok;
}

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }

bool Tokenizer::is_control(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return false;
  if (vocab_.types.empty()) return id == vocab_.bos || id == vocab_.eos || id == vocab_.eot || id == vocab_.pad;
  const TokenType t = TokenType(vocab_.types[size_t(id)]);
  return t == TokenType::Control || t == TokenType::Unused;
}

}  // namespace llm
