// llm_text_stream_*: generated tokens -> text with stop strings that span
// token boundaries, end-of-generation tokens, UTF-8 held back until whole.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llm.h"

namespace {

std::string model_path(const char* name) { return std::string(LLM_MODELS_DIR) + "/" + name; }

class TextStream : public ::testing::Test {
 protected:
  void SetUp() override {
    llm_load_params p;
    llm_load_params_init(&p);
    p.n_threads = 1;
    ASSERT_EQ(llm_load(model_path("stories260K.gguf").c_str(), &p, &model_), LLM_OK) << llm_last_error();
  }
  void TearDown() override { llm_model_free(model_); }

  std::vector<llm_token> tokenize(const std::string& text) {
    std::vector<llm_token> ids(text.size() + 8);
    size_t n = 0;
    EXPECT_EQ(llm_tokenize(model_, text.data(), text.size(), 0, ids.data(), ids.size(), &n), LLM_OK);
    ids.resize(n);
    return ids;
  }
  // Pushes every token; returns the text delivered (flushed at the end
  // unless stopped) and whether a stop ended it.
  std::string run(const std::vector<std::string>& stops, const std::vector<llm_token>& toks, bool* stopped_out,
                  size_t* stopped_at = nullptr) {
    std::vector<const char*> cs;
    for (const auto& s : stops) cs.push_back(s.c_str());
    llm_text_stream* st = nullptr;
    EXPECT_EQ(llm_text_stream_create(model_, cs.data(), cs.size(), &st), LLM_OK) << llm_last_error();
    std::string text;
    int32_t stopped = 0;
    char buf[4096];
    for (size_t i = 0; i < toks.size(); ++i) {
      size_t len = 0;
      EXPECT_EQ(llm_text_stream_push(st, toks[i], buf, sizeof buf, &len, &stopped), LLM_OK);
      text.append(buf, len);
      if (stopped) {
        if (stopped_at) *stopped_at = i;
        break;
      }
    }
    if (!stopped) {
      size_t len = 0;
      EXPECT_EQ(llm_text_stream_flush(st, buf, sizeof buf, &len), LLM_OK);
      text.append(buf, len);
    }
    llm_text_stream_free(st);
    *stopped_out = stopped != 0;
    return text;
  }

  llm_model* model_ = nullptr;
};

TEST_F(TextStream, WithoutStopsDeliversTheDetokenizedText) {
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const auto toks = tokenize(text);
  std::vector<char> want(text.size() * 2 + 16);
  size_t wl = 0;
  ASSERT_EQ(llm_detokenize(model_, toks.data(), toks.size(), want.data(), want.size(), &wl), LLM_OK);
  bool stopped = true;
  EXPECT_EQ(run({}, toks, &stopped), std::string(want.data(), wl));
  EXPECT_FALSE(stopped);
}

TEST_F(TextStream, StopStringSpanningTokensCutsTheTextBeforeIt) {
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const auto toks = tokenize(text);
  ASSERT_GT(toks.size(), 6u);
  // Whatever the token boundaries, a stop inside the text delivers exactly
  // what precedes its first occurrence and nothing after.
  for (const std::string stop : {"time, th", "e", "Lily.", "a little", "there was a little girl named"}) {
    bool stopped = false;
    size_t at = 0;
    const std::string got = run({stop}, toks, &stopped, &at);
    EXPECT_TRUE(stopped) << stop;
    std::string full = run({}, toks, &stopped);
    EXPECT_EQ(got, full.substr(0, full.find(stop))) << stop;
  }
  // The earliest of several stops wins.
  bool stopped = false;
  const std::string got = run({"little", "upon"}, toks, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(got, "Once ");
}

TEST_F(TextStream, HeldPrefixThatNeverCompletesIsDeliveredAtTheEnd) {
  const auto toks = tokenize("Once upon a time");
  bool stopped = true;
  // "time!" begins at the end but never completes: flush gives the text back.
  EXPECT_EQ(run({"time!"}, toks, &stopped), "Once upon a time");
  EXPECT_FALSE(stopped);
}

TEST_F(TextStream, EndOfGenerationTokenEndsTheStream) {
  llm_model_properties info;
  info.struct_size = sizeof info;
  ASSERT_EQ(llm_model_info(model_, &info), LLM_OK);
  ASSERT_GE(info.eos, 0);
  auto toks = tokenize("Once upon a");
  toks.push_back(info.eos);
  const auto more = tokenize(" time");
  toks.insert(toks.end(), more.begin(), more.end());
  bool stopped = false;
  EXPECT_EQ(run({"a time"}, toks, &stopped), "Once upon a");  // the held "a" is text: the stop never completed
  EXPECT_TRUE(stopped);
}

TEST_F(TextStream, SmallBufferLeavesTheStreamUnchanged) {
  const auto toks = tokenize("Once upon a time");
  llm_text_stream* st = nullptr;
  ASSERT_EQ(llm_text_stream_create(model_, nullptr, 0, &st), LLM_OK);
  std::string text;
  char buf[64];
  for (llm_token t : toks) {
    size_t len = 99;
    int32_t stopped = 0;
    const llm_status s = llm_text_stream_push(st, t, nullptr, 0, &len, &stopped);
    if (s == LLM_ERR_BUFFER_TOO_SMALL) {
      EXPECT_GT(len, 0u);
      ASSERT_EQ(llm_text_stream_push(st, t, buf, len, &len, &stopped), LLM_OK);
    } else {
      ASSERT_EQ(s, LLM_OK);
      EXPECT_EQ(len, 0u);
    }
    text.append(buf, len);
  }
  size_t len = 0;
  ASSERT_EQ(llm_text_stream_flush(st, buf, sizeof buf, &len), LLM_OK);
  text.append(buf, len);
  EXPECT_EQ(text, "Once upon a time");
  ASSERT_EQ(llm_text_stream_reset(st), LLM_OK);
  llm_text_stream_free(st);
}

TEST_F(TextStream, BadArgumentsAreRefused) {
  llm_text_stream* st = reinterpret_cast<llm_text_stream*>(&st);
  const char* empty[] = {""};
  EXPECT_EQ(llm_text_stream_create(model_, empty, 1, &st), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(st, nullptr);
  const char* null_stop[] = {nullptr};
  EXPECT_EQ(llm_text_stream_create(model_, null_stop, 1, &st), LLM_ERR_INVALID_ARGUMENT);
  const std::string big(2000, 'x');
  const char* big_stop[] = {big.c_str()};
  EXPECT_EQ(llm_text_stream_create(model_, big_stop, 1, &st), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_text_stream_create(nullptr, nullptr, 0, &st), LLM_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(llm_text_stream_create(model_, nullptr, 0, &st), LLM_OK);
  char buf[16];
  size_t len = 0;
  int32_t stopped = 0;
  EXPECT_EQ(llm_text_stream_push(st, -1, buf, sizeof buf, &len, &stopped), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_text_stream_push(st, 1 << 20, buf, sizeof buf, &len, &stopped), LLM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(llm_text_stream_push(st, 1, buf, sizeof buf, nullptr, &stopped), LLM_ERR_INVALID_ARGUMENT);
  // A session handle is not a stream.
  EXPECT_EQ(llm_text_stream_push(reinterpret_cast<llm_text_stream*>(model_), 1, buf, sizeof buf, &len, &stopped),
            LLM_ERR_INVALID_ARGUMENT);
  llm_text_stream_free(st);
  llm_text_stream_free(st);  // freed: a no-op
  llm_text_stream_free(nullptr);
}

}  // namespace
