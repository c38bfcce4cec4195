// Tokenizers on the real vocabularies in LLM_MODELS_DIR: llama.cpp's
// tokenizer vectors (from Hugging Face tokenizers), llama2.c prompts, round
// trips, special tokens and concurrent use.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "vocab_vectors.h"
#include "common/reference.h"
#include "format/gguf.h"
#include "format/llama2c.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace llm {
namespace {

using Ids = std::vector<int32_t>;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A .inp file: each text is followed by "\n__ggml_vocab_test__\n".
std::vector<std::string> read_inputs(const std::string& path) {
  const std::string all = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t at = 0;
  for (size_t p; (p = all.find(sep, at)) != std::string::npos; at = p + sep.size()) texts.push_back(all.substr(at, p - at));
  EXPECT_EQ(at, all.size()) << "trailing text after the last separator in " << path;
  return texts;
}

std::vector<Ids> read_outputs(const std::string& path) { return llm::testing::parse_vocab_ids(read_file(path)); }

Ids encode(const Tokenizer& t, const std::string& s, bool add_bos = false, bool special = false) {
  Ids out;
  t.encode(s, add_bos, special, out);
  return out;
}

std::string decode(const Tokenizer& t, const Ids& ids) {
  std::string s;
  for (int32_t id : ids) t.append_piece(id, s);
  return s;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& name) {
  return Tokenizer::create(read_gguf(testing::model_path(name), true, nullptr).vocab);
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& name, int32_t vocab_size) {
  const std::string bytes = read_file(testing::model_path(name));
  return Tokenizer::create(
      parse_llama2c_tokenizer(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), vocab_size));
}

// Tokenizers are expensive enough to build once per suite.
struct Vocabs {
  std::unique_ptr<Tokenizer> spm = load_gguf_tokenizer("ggml-vocab-llama-spm.gguf");
  std::unique_ptr<Tokenizer> gpt2 = load_gguf_tokenizer("ggml-vocab-gpt-2.gguf");
};
const Vocabs& vocabs() {
  static const Vocabs v;
  return v;
}

// SentencePiece cannot tell a literal U+2581 from an escaped space.
std::string spm_visible(std::string s) {
  for (size_t p = 0; (p = s.find("\xE2\x96\x81", p)) != std::string::npos;) s.replace(p, 3, " ");
  return s;
}

void check_vectors(const Tokenizer& t, const std::string& name) {
  const auto texts = read_inputs(testing::model_path(name + ".inp"));
  const auto expected = read_outputs(testing::model_path(name + ".out"));
  ASSERT_EQ(texts.size(), 46u);
  ASSERT_EQ(expected.size(), texts.size());
  int passed = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Ids got = encode(t, texts[i]);
    EXPECT_EQ(got, expected[i]) << name << " text " << i << ": '" << texts[i] << "'";
    passed += got == expected[i];
    // No special-token text occurs in the vectors, so parsing specials changes nothing.
    EXPECT_EQ(encode(t, texts[i], false, true), expected[i]) << name << " text " << i;
  }
  EXPECT_EQ(passed, int(texts.size()));
}

TEST(TokenizerVectors, LlamaSpmMatchesHuggingFace) {
  ASSERT_TRUE(vocabs().spm->warning().empty());
  check_vectors(*vocabs().spm, "ggml-vocab-llama-spm.gguf");
}

TEST(TokenizerVectors, Gpt2MatchesHuggingFace) {
  EXPECT_TRUE(vocabs().gpt2->warning().empty()) << vocabs().gpt2->warning();
  EXPECT_EQ(vocabs().gpt2->vocab().pre, "gpt-2");
  check_vectors(*vocabs().gpt2, "ggml-vocab-gpt-2.gguf");
}

// The llama2.c export of the same Llama 2 vocabulary, through the llama2.c reader.
TEST(TokenizerVectors, Llama2cTokenizerFileMatchesHuggingFace) {
  auto t = load_llama2c_tokenizer("llama2_tokenizer.bin", 32000);
  check_vectors(*t, "ggml-vocab-llama-spm.gguf");
}

TEST(TokenizerRoundTrip, VectorTexts) {
  const auto texts = read_inputs(testing::model_path("ggml-vocab-llama-spm.gguf.inp"));
  for (const std::string& s : texts) {
    EXPECT_EQ(decode(*vocabs().gpt2, encode(*vocabs().gpt2, s)), s);
    const std::string spm = decode(*vocabs().spm, encode(*vocabs().spm, s));
    if (s.empty()) {
      EXPECT_EQ(spm, "");
    } else {
      ASSERT_FALSE(spm.empty());
      EXPECT_EQ(spm[0], ' ');  // the dummy prefix
      EXPECT_EQ(spm.substr(1), s);
    }
  }
}

// Random strings: valid UTF-8 from all planes mixed with arbitrary bytes.
TEST(TokenizerRoundTrip, RandomUtf8AndInvalidBytes) {
  std::mt19937 rng(20240601);
  auto random_text = [&rng]() {
    std::string s;
    const int n = int(rng() % 64);
    for (int k = 0; k < n; ++k) {
      const uint32_t kind = rng() % 8;
      if (kind == 0) {
        s.push_back(char(rng() % 256));  // any byte, often invalid UTF-8
      } else if (kind <= 3) {
        s.push_back(char(0x20 + rng() % 95));
      } else if (kind == 4) {
        s.push_back(" \n\t\r"[rng() % 4]);
      } else {
        uint32_t cp = kind == 5 ? 0x80 + rng() % 0x780 : kind == 6 ? 0x800 + rng() % 0xF800 : 0x10000 + rng() % 0x100000;
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E2D;
        utf8_append(cp, s);
      }
    }
    return s;
  };
  for (int iter = 0; iter < 300; ++iter) {
    const std::string s = random_text();
    for (bool special : {false, true}) {
      EXPECT_EQ(decode(*vocabs().gpt2, encode(*vocabs().gpt2, s, false, special)), s);
      const std::string spm = decode(*vocabs().spm, encode(*vocabs().spm, s, false, special));
      if (!special) {
        EXPECT_EQ(spm, s.empty() ? "" : " " + spm_visible(s));
      }
    }
  }
}

void check_prompts(const Tokenizer& t, const std::string& json) {
  const auto cases = testing::load_greedy_cases(json);
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    EXPECT_EQ(encode(t, c.prompt, true), c.prompt_ids) << json << ": '" << c.prompt << "'";
  }
}

TEST(TokenizerPrompts, Stories260KFromGguf) {
  auto t = Tokenizer::create(read_gguf(testing::model_path("stories260K.gguf"), true, nullptr).vocab);
  EXPECT_EQ(t->n_vocab(), 512);
  check_prompts(*t, "stories260K_greedy.json");
  // Conventions stated in the models README: a dummy " " (410) that finds no
  // merge stays alone, and "ö" falls back to its bytes + 3.
  const Ids zog = encode(*t, "Zog", true);
  ASSERT_EQ(zog.size(), 5u);
  EXPECT_EQ(zog[0], 1);
  EXPECT_EQ(zog[1], 410);
  EXPECT_EQ(decode(*t, {zog[2], zog[3], zog[4]}), "Zog");
  EXPECT_EQ(encode(*t, "\xC3\xB6"), (Ids{410, 0xC3 + 3, 0xB6 + 3}));
}

TEST(TokenizerPrompts, Stories260KFromLlama2cTokenizer) {
  auto t = load_llama2c_tokenizer("tok512.bin", 512);
  check_prompts(*t, "stories260K_greedy.json");
}

TEST(TokenizerPrompts, Llama2TinyRandom) {
  auto t = Tokenizer::create(read_gguf(testing::model_path("llama-2-tiny-random.gguf"), true, nullptr).vocab);
  EXPECT_EQ(t->n_vocab(), 32000);
  check_prompts(*t, "llama-2-tiny-random_greedy.json");
}

TEST(TokenizerSpecial, LlamaSpm) {
  const Tokenizer& t = *vocabs().spm;
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_EQ(encode(t, "<s>Hello</s>", false, true), (Ids{1, 15043, 2}));
  const Ids plain = encode(t, "<s>Hello</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1) + std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(decode(t, plain), " <s>Hello</s>");
  EXPECT_EQ(decode(t, {1, 15043, 2}), " Hello");  // control tokens print nothing
  EXPECT_TRUE(t.strip_space_after_bos());
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_FALSE(t.is_eog(15043));
  EXPECT_TRUE(t.is_control(1));
  EXPECT_FALSE(t.is_control(15043));
  std::string piece;
  t.append_piece(13, piece);  // <0x0A>
  EXPECT_EQ(piece, "\n");
}

TEST(TokenizerSpecial, Gpt2) {
  const Tokenizer& t = *vocabs().gpt2;
  const int32_t eot = 50256;  // <|endoftext|>
  EXPECT_EQ(encode(t, "Hello<|endoftext|> world", false, true), (Ids{15496, eot, 995}));
  const Ids plain = encode(t, "Hello<|endoftext|> world", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(decode(t, plain), "Hello<|endoftext|> world");
  EXPECT_TRUE(t.is_eog(eot));
  EXPECT_FALSE(t.is_eog(15496));
  EXPECT_FALSE(t.strip_space_after_bos());
}

// One Tokenizer, many threads at once: same ids as a single thread.
TEST(TokenizerThreads, ConcurrentEncodeMatchesSingleThreaded) {
  auto texts = read_inputs(testing::model_path("ggml-vocab-llama-spm.gguf.inp"));
  std::string big;
  for (int r = 0; r < 20; ++r)
    for (const auto& s : texts) big += s + (r % 2 ? " " : "\n");
  texts.push_back(big);
  for (const Tokenizer* t : {vocabs().spm.get(), vocabs().gpt2.get()}) {
    std::vector<Ids> expected;
    std::vector<std::string> expected_text;
    for (const auto& s : texts) {
      expected.push_back(encode(*t, s));
      expected_text.push_back(decode(*t, expected.back()));
    }
    const int n_threads = 8;
    std::vector<int> mismatches(n_threads, 0);
    std::vector<std::thread> threads;
    for (int k = 0; k < n_threads; ++k) {
      threads.emplace_back([&, k] {
        for (int rep = 0; rep < 5; ++rep) {
          for (size_t i = 0; i < texts.size(); ++i) {
            // Different orders per thread so the threads' caches differ.
            const size_t j = (i * (k + 1) + rep) % texts.size();
            if (encode(*t, texts[j]) != expected[j]) ++mismatches[size_t(k)];
            if (decode(*t, expected[j]) != expected_text[j]) ++mismatches[size_t(k)];
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int k = 0; k < n_threads; ++k) EXPECT_EQ(mismatches[size_t(k)], 0) << "thread " << k;
  }
}

}  // namespace
}  // namespace llm
