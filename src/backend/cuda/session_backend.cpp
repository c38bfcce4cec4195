// The CUDA backend as the session sees it: the Backend interface
// (backend/backend.h) over a cuda::Backend. Host code, built with or
// without CUDA (without it no cuda::Backend exists to wrap).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace llm::cuda {

namespace {

using Device = cuda::Backend;  // inside the class below, `Backend` names the interface

struct DeviceSequence final : KvSequence {
  DeviceSequence(std::unique_ptr<Sequence> s, llm_kv_type t, size_t pb) : seq(std::move(s)), type(t), page_bytes(pb) {}
  uint32_t length() const override { return seq->length(); }
  llm_kv_type kv_type() const override { return type; }
  size_t n_pages() const override { return seq->n_pages(); }
  uint64_t kv_bytes() const override { return uint64_t(seq->n_pages()) * page_bytes; }

  std::unique_ptr<Sequence> seq;
  const llm_kv_type type;
  const size_t page_bytes;
};

Sequence& dev(KvSequence& s) { return *static_cast<DeviceSequence&>(s).seq; }
const Sequence& dev(const KvSequence& s) { return *static_cast<const DeviceSequence&>(s).seq; }

class SessionBackend final : public llm::Backend {
 public:
  SessionBackend(Device& device, size_t vocab, size_t max_batch, size_t max_rows)
      : d_(device), vocab_(vocab), max_batch_(max_batch), max_rows_(max_rows) {}

  std::unique_ptr<KvSequence> new_sequence(llm_kv_type t) override {
    LLM_CHECK(t == d_.kv_type(), LLM_ERR_UNSUPPORTED, "the device KV cache holds kv_type %d, not %d", int(d_.kv_type()),
              int(t));
    return wrap(d_.new_sequence());
  }
  std::unique_ptr<KvSequence> fork(const KvSequence& src) override { return wrap(d_.fork(dev(src))); }

  void forward(KvSequence& s, const int32_t* toks, size_t n, float* logits,
               const std::function<bool()>& cancel) override {
    if (n == 1 && !cancel) {  // a decode step: the batched, graph-captured path
      DecodeOutput out;
      out.logits = logits;
      Sequence* seq = &dev(s);
      d_.decode(&seq, toks, 1, out);
    } else {
      d_.prefill(dev(s), toks, n, logits, cancel);
    }
  }

  // Decode steps only (one row per sequence), all or nothing.
  size_t forward_batch(const SequenceRows* rows, size_t n) override {
    n = std::min(n, max_batch_);
    if (n == 0) return 0;
    std::vector<Sequence*> seqs(n);
    std::vector<int32_t> toks(n);
    for (size_t i = 0; i < n; ++i) {
      LLM_CHECK(rows[i].n == 1, LLM_ERR_INVALID_ARGUMENT, "a batched device pass takes one row per sequence");
      seqs[i] = &dev(*rows[i].seq);
      toks[i] = rows[i].tokens[0];
    }
    const size_t vocab = vocab_;
    std::vector<float> logits(n * vocab);
    DecodeOutput o;
    o.logits = logits.data();
    d_.decode(seqs.data(), toks.data(), n, o);
    for (size_t i = 0; i < n; ++i) std::memcpy(rows[i].logits, logits.data() + i * vocab, vocab * sizeof(float));
    return n;
  }
  size_t max_batch() const override { return max_batch_; }
  size_t max_batch_rows_per_seq() const override { return 1; }
  size_t max_rows() const override { return max_rows_; }

  void truncate(KvSequence& s, uint32_t n) override { d_.truncate(dev(s), std::min(n, s.length())); }
  void evict(KvSequence& s, uint32_t n_keep, uint32_t n_discard) override {
    if (n_discard) d_.evict(dev(s), n_keep, n_discard);
  }
  void kv_row(const KvSequence& s, int32_t layer, int kv, int32_t head, uint32_t slot, float* out) const override {
    d_.kv_row(dev(s), layer, kv, head, slot, out);
  }

  // Device pages are byte-identical to host pages.
  void save_pages(const KvSequence& s, std::vector<uint8_t>& out) const override {
    const size_t at = out.size();
    out.resize(at + s.n_pages() * d_.page_bytes());
    d_.read_pages(dev(s), out.data() + at);
  }
  void restore_pages(KvSequence& s, const uint8_t* data, size_t size, uint32_t n_pages, uint32_t length) override {
    const size_t pb = d_.page_bytes();
    LLM_CHECK(size == uint64_t(n_pages) * pb, LLM_ERR_FORMAT, "session snapshot has %zu bytes of KV, expected %llu",
              size, (unsigned long long)(uint64_t(n_pages) * pb));
    d_.write_pages(dev(s), data, n_pages, length);
  }

 private:
  std::unique_ptr<KvSequence> wrap(std::unique_ptr<Sequence> s) {
    return std::make_unique<DeviceSequence>(std::move(s), d_.kv_type(), d_.page_bytes());
  }

  Device& d_;
  const size_t vocab_, max_batch_, max_rows_;
};

}  // namespace

std::unique_ptr<llm::Backend> as_backend(Backend& device, size_t vocab, size_t max_batch, size_t max_rows) {
  return std::make_unique<SessionBackend>(device, vocab, max_batch, max_rows);
}

}  // namespace llm::cuda
