// Tokenizer throughput: encode and decode MB/s on ~1 MB of mixed English,
// Chinese and code text (generated deterministically here), for the
// SentencePiece (Llama 2) and byte-level BPE (GPT-2) vocabularies, one thread.
// Each is measured next to a naive reference written here: the textbook
// O(n^2) merge loop that rescans every adjacent pair after each merge and
// looks pieces up by string. Setup checks that both give the same ids.
//
// Needs LLM_MODELS_DIR (compile definition, or the environment variable).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using llm::Tokenizer;
using llm::VocabData;

std::string models_dir() {
  if (const char* env = std::getenv("LLM_MODELS_DIR")) return env;
#ifdef LLM_MODELS_DIR
  return LLM_MODELS_DIR;
#else
  return "../shared/models";
#endif
}

// ~1 MB: paragraphs of English prose (60%), Chinese (20%) and C-like code (20%).
std::string make_corpus(size_t target_bytes) {
  static const char* const kWords[] = {
      "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
      "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
      "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
      "would", "who", "so", "no", "model", "token", "language", "memory", "inference", "quickly", "between",
      "through", "everything", "understanding", "tokenizer", "weights", "library", "thread", "request",
      "London", "Paris", "Tuesday", "December", "isn't", "don't", "we're", "they've", "I'll", "it's"};
  static const char kHan[] =
      "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后"
      "多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合"
      "还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只"
      "没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边";
  static const char* const kIdents[] = {"i", "n", "buf", "count", "data", "result", "ctx", "len", "offset",
                                        "tokenizer", "merge_rank", "symbols", "out", "value", "node", "next"};
  std::mt19937 rng(42);
  auto pick = [&rng](size_t n) { return size_t(rng() % n); };
  // Han characters are 3 bytes each in kHan.
  const size_t n_han = (sizeof(kHan) - 1) / 3;

  std::string s;
  s.reserve(target_bytes + 4096);
  while (s.size() < target_bytes) {
    const size_t kind = pick(10);
    if (kind < 6) {  // English paragraph
      const size_t sentences = 2 + pick(5);
      for (size_t k = 0; k < sentences; ++k) {
        const size_t words = 5 + pick(15);
        for (size_t w = 0; w < words; ++w) {
          std::string word = kWords[pick(sizeof kWords / sizeof *kWords)];
          if (w == 0 && word[0] >= 'a' && word[0] <= 'z') word[0] = char(word[0] - 32);
          s += word;
          if (pick(12) == 0) s += " " + std::to_string(pick(5000));
          s += (w + 1 < words) ? (pick(9) == 0 ? ", " : " ") : ". ";
        }
      }
      s += "\n\n";
    } else if (kind < 8) {  // Chinese paragraph
      const size_t sentences = 2 + pick(4);
      for (size_t k = 0; k < sentences; ++k) {
        const size_t chars = 6 + pick(25);
        for (size_t c = 0; c < chars; ++c) s.append(kHan + 3 * pick(n_han), 3);
        s += pick(3) == 0 ? "，" : "。";
      }
      s += "\n\n";
    } else {  // code
      const size_t lines = 3 + pick(10);
      for (size_t l = 0; l < lines; ++l) {
        s.append(2 * (1 + pick(3)), ' ');
        const char* a = kIdents[pick(16)];
        const char* b = kIdents[pick(16)];
        switch (pick(4)) {
          case 0: s += std::string("for (int ") + a + " = 0; " + a + " < " + b + "; ++" + a + ") {"; break;
          case 1: s += std::string(a) + "[" + b + "] += " + std::to_string(pick(100000)) + " * " + b + ";"; break;
          case 2: s += std::string("if (") + a + "->" + b + " != nullptr && " + a + " >= 0x" + std::to_string(pick(99)) + ") return -1;"; break;
          default: s += std::string("// ") + kWords[pick(40)] + " " + kWords[pick(40)] + ": " + a + "." + b + "()"; break;
        }
        s += "\n";
      }
      s += "}\n\n";
    }
  }
  return s;
}

// --- naive references ----------------------------------------------------------

// Byte-level BPE as in the original GPT-2 encoder: per pre-token, rescan all
// pairs for the lowest rank after every merge; pieces are strings.
class NaiveBpe {
 public:
  explicit NaiveBpe(const VocabData& v) {
    bool known = false, ignore_merges = false;
    pre_ = llm::pre_tokenizer_from_name(v.pre, &known, &ignore_merges);
    for (size_t i = 0; i < v.tokens.size(); ++i) ids_[v.tokens[i]] = int32_t(i);
    for (size_t r = 0; r < v.merges.size(); ++r) ranks_.emplace(v.merges[r], int32_t(r));
  }
  void encode(const std::string& text, std::vector<int32_t>& out) const {
    const auto* s = reinterpret_cast<const uint8_t*>(text.data());
    std::vector<std::string> sym;
    for (size_t i = 0; i < text.size();) {
      const size_t e = llm::pretoken_end(pre_, s, text.size(), i);
      sym.clear();
      for (size_t k = i; k < e; ++k) {
        std::string c;
        llm::utf8_append(llm::gpt2_byte_to_cp(s[k]), c);
        sym.push_back(c);
      }
      i = e;
      for (;;) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t k = 0; k + 1 < sym.size(); ++k) {
          auto it = ranks_.find(sym[k] + " " + sym[k + 1]);
          if (it != ranks_.end() && it->second < best) {
            best = it->second;
            at = k;
          }
        }
        if (best == INT32_MAX) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + std::ptrdiff_t(at) + 1);
      }
      for (const auto& p : sym) {
        auto it = ids_.find(p);
        if (it != ids_.end()) out.push_back(it->second);
      }
    }
  }

 private:
  llm::PreTokenizer pre_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<std::string, int32_t> ranks_;
};

// SentencePiece BPE as in llama2.c run.c: rescan all pairs for the best score
// after every merge. Run per line: the Llama 2 vocabulary has no piece that
// contains '\n', so lines never merge with each other and the ids are the
// same as for the whole text (checked in setup), while the whole 1 MB at once
// would take hours at O(n^2).
class NaiveSpm {
 public:
  explicit NaiveSpm(const VocabData& v) {
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const int32_t t = v.types.empty() ? 1 : v.types[i];
      if (t == 1 || t == 4) ids_[v.tokens[i]] = int32_t(i);
      if (t == 6) byte_ids_[std::stoi(v.tokens[i].substr(3, 2), nullptr, 16)] = int32_t(i);
    }
    scores_ = v.scores;
  }
  void encode(const std::string& text, std::vector<int32_t>& out) const {
    std::string norm = "\xE2\x96\x81";
    for (char c : text) norm += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    const auto* s = reinterpret_cast<const uint8_t*>(norm.data());
    std::vector<std::string> sym;
    for (size_t i = 0; i < norm.size();) {
      const size_t line_end = std::min(norm.find('\n', i), norm.size());
      sym.clear();
      for (size_t k = i; k < line_end;) {
        size_t len = 1;
        llm::utf8_decode(s + k, norm.size() - k, &len);
        sym.push_back(norm.substr(k, len));
        k += len;
      }
      merge_and_emit(sym, out);
      if (line_end < norm.size()) out.push_back(byte_ids_['\n']);
      i = line_end + 1;
    }
  }

 private:
  void merge_and_emit(std::vector<std::string>& sym, std::vector<int32_t>& out) const {
    for (;;) {
      float best = -1e30f;
      size_t at = SIZE_MAX;
      for (size_t k = 0; k + 1 < sym.size(); ++k) {
        auto it = ids_.find(sym[k] + sym[k + 1]);
        if (it != ids_.end() && scores_[size_t(it->second)] > best) {
          best = scores_[size_t(it->second)];
          at = k;
        }
      }
      if (at == SIZE_MAX) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + std::ptrdiff_t(at) + 1);
    }
    for (const auto& p : sym) {
      auto it = ids_.find(p);
      if (it != ids_.end()) {
        out.push_back(it->second);
      } else {
        for (unsigned char c : p) out.push_back(byte_ids_[c]);
      }
    }
  }
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<float> scores_;
  int32_t byte_ids_[256] = {};
};

// --- fixtures ------------------------------------------------------------------

struct Setup {
  std::string text = make_corpus(1 << 20);
  VocabData spm_vocab = llm::read_gguf(models_dir() + "/ggml-vocab-llama-spm.gguf", true, nullptr).vocab;
  VocabData gpt2_vocab = llm::read_gguf(models_dir() + "/ggml-vocab-gpt-2.gguf", true, nullptr).vocab;
  std::unique_ptr<Tokenizer> spm = Tokenizer::create(spm_vocab);
  std::unique_ptr<Tokenizer> gpt2 = Tokenizer::create(gpt2_vocab);
  NaiveSpm naive_spm{spm_vocab};
  NaiveBpe naive_gpt2{gpt2_vocab};
  std::vector<int32_t> spm_ids, gpt2_ids;

  Setup() {
    spm->encode(text, false, false, spm_ids);
    gpt2->encode(text, false, false, gpt2_ids);
    std::vector<int32_t> a, b;
    naive_spm.encode(text, a);
    naive_gpt2.encode(text, b);
    if (a != spm_ids || b != gpt2_ids) {
      std::fprintf(stderr, "tokenizer_bench: naive and fast tokenizers disagree (spm %s, gpt2 %s)\n",
                   a == spm_ids ? "ok" : "DIFF", b == gpt2_ids ? "ok" : "DIFF");
      std::abort();
    }
    std::fprintf(stderr, "corpus: %zu bytes; spm %zu tokens, gpt2 %zu tokens; naive == fast\n", text.size(),
                 spm_ids.size(), gpt2_ids.size());
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

void BM_EncodeSpm(benchmark::State& state) {
  Setup& s = setup();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    s.spm->encode(s.text, false, false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.text.size()));
}

void BM_EncodeGpt2(benchmark::State& state) {
  Setup& s = setup();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    s.gpt2->encode(s.text, false, false, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.text.size()));
}

void BM_NaiveEncodeSpm(benchmark::State& state) {
  Setup& s = setup();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    s.naive_spm.encode(s.text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.text.size()));
}

void BM_NaiveEncodeGpt2(benchmark::State& state) {
  Setup& s = setup();
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    s.naive_gpt2.encode(s.text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.text.size()));
}

// Decode: bytes of text produced per second, piece by piece.
void decode_bench(benchmark::State& state, const Tokenizer& t, const std::vector<int32_t>& ids, size_t text_bytes) {
  std::string out;
  for (auto _ : state) {
    out.clear();
    for (int32_t id : ids) t.append_piece(id, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text_bytes));
}
void BM_DecodeSpm(benchmark::State& state) { decode_bench(state, *setup().spm, setup().spm_ids, setup().text.size()); }
void BM_DecodeGpt2(benchmark::State& state) {
  decode_bench(state, *setup().gpt2, setup().gpt2_ids, setup().text.size());
}

// Naive decode: look the piece text up and convert it on every call.
void BM_NaiveDecodeGpt2(benchmark::State& state) {
  Setup& s = setup();
  std::string out;
  for (auto _ : state) {
    out.clear();
    for (int32_t id : s.gpt2_ids) {
      const std::string& piece = s.gpt2_vocab.tokens[size_t(id)];
      const auto* p = reinterpret_cast<const uint8_t*>(piece.data());
      for (size_t k = 0; k < piece.size();) {
        size_t len = 1;
        const int b = llm::gpt2_cp_to_byte(llm::utf8_decode(p + k, piece.size() - k, &len));
        if (b >= 0) out.push_back(char(b));
        k += len;
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(s.text.size()));
}

BENCHMARK(BM_EncodeSpm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NaiveEncodeSpm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NaiveEncodeGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeSpm)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeGpt2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NaiveDecodeGpt2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
