// llm-server's reading of an OpenAI request body, apart from the HTTP server
// and the model so that the fuzz target (tests/fuzz/fuzz_server_request.cpp)
// can run it on any bytes. parse_request never throws: every body gives
// either a filled Request or an ApiError with an HTTP status.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "llm.h"

namespace llm_server {

// An OpenAI-style error: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 0;  // 0: no error
  std::string type, code, message;
};

inline ApiError bad_request(const std::string& msg, const std::string& code = "") {
  return {400, "invalid_request_error", code, msg};
}

enum class ResponseFormat { kText, kJsonObject, kJsonSchema };

struct Request {
  // Chat: the messages (role, text); completions: the prompt text.
  std::vector<std::string> roles, contents;
  std::string prompt;
  uint64_t max_tokens = 0;  // 0: not given (the context's room)
  llm_sampling sampling{};  // grammar left null; seed 0 for greedy
  bool default_seed = true;  // the request gave no seed (and samples)
  std::vector<std::string> stops;  // at most kMaxStops, each 1..kMaxStopBytes bytes
  bool stream = false, include_usage = false, ignore_eos = false;
  ResponseFormat format = ResponseFormat::kText;
  std::string schema;  // kJsonSchema: the schema as JSON text
};

constexpr size_t kMaxStops = 16;
constexpr size_t kMaxStopBytes = 1024;

// Reads body (a chat completion when chat, else a completion) into out.
// model_name: the name this server answers to (another gives 404).
ApiError parse_request(std::string_view body, bool chat, const std::string& model_name, Request& out);

}  // namespace llm_server
