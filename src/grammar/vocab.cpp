// The vocabulary side of masking: token pieces sorted by bytes, with the
// common prefix of each neighbour pair. Walking that list in order is a
// depth-first walk of the byte trie: the parse state of a prefix is computed
// once and shared by every token that starts with it, and a rejected prefix
// skips the whole run of tokens below it.
#include <algorithm>

#include "core/error.h"
#include "grammar/grammar.h"

namespace llm::grammar {

int32_t Vocab::find_piece(std::string_view text) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), text,
                             [&](int32_t id, std::string_view t) { return std::string_view(pieces_[size_t(id)]) < t; });
  int32_t best = -1;
  for (; it != sorted_.end() && pieces_[size_t(*it)] == text; ++it)
    if (best < 0 || *it < best) best = *it;
  return best;
}

std::shared_ptr<const Vocab> make_vocab(std::vector<std::string> pieces, std::vector<int32_t> eog_ids) {
  auto v = std::shared_ptr<Vocab>(new Vocab());
  const size_t n = pieces.size();
  LLM_CHECK(n <= size_t(0x7FFFFFFF), LLM_ERR_INVALID_ARGUMENT, "grammar: vocabulary too large");
  v->is_eog_.assign(n, 0);
  for (int32_t id : eog_ids) {
    LLM_CHECK(id >= 0 && size_t(id) < n, LLM_ERR_INVALID_ARGUMENT, "grammar: end-of-generation id %d out of range", id);
    v->is_eog_[size_t(id)] = 1;
  }
  std::sort(eog_ids.begin(), eog_ids.end());
  eog_ids.erase(std::unique(eog_ids.begin(), eog_ids.end()), eog_ids.end());
  v->eog_ids_ = std::move(eog_ids);
  for (size_t i = 0; i < n; ++i) {
    LLM_CHECK(pieces[i].size() <= 0xFFFF, LLM_ERR_INVALID_ARGUMENT, "grammar: token %zu is over 65535 bytes", i);
    if (!pieces[i].empty() && !v->is_eog_[i]) {
      v->sorted_.push_back(int32_t(i));
      v->max_piece_len_ = std::max(v->max_piece_len_, pieces[i].size());
    }
  }
  std::sort(v->sorted_.begin(), v->sorted_.end(), [&](int32_t a, int32_t b) {
    const int c = pieces[size_t(a)].compare(pieces[size_t(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  v->sorted_off_.push_back(0);
  for (int32_t id : v->sorted_) {
    v->sorted_bytes_ += pieces[size_t(id)];
    v->sorted_off_.push_back(v->sorted_bytes_.size());
  }
  v->lcp_.assign(v->sorted_.size(), 0);
  for (size_t i = 1; i < v->sorted_.size(); ++i) {
    const std::string& a = pieces[size_t(v->sorted_[i - 1])];
    const std::string& b = pieces[size_t(v->sorted_[i])];
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    v->lcp_[i] = uint16_t(k);
  }
  v->pieces_ = std::move(pieces);
  return v;
}

}  // namespace llm::grammar
