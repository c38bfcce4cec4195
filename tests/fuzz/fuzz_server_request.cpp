// Fuzz target: llm-server's reading of an OpenAI request body
// (src/cli/server/request.cpp), the part of the server that takes untrusted
// bytes from the network after cpp-httplib. Every body must give either a
// request within the documented limits or an error with a 4xx status (500
// only for out of memory); nothing may throw.
//
// Input: one byte (bit 0: chat completions, else completions), then the body.
#include <nlohmann/json.hpp>

#include "cli/server/request.h"
#include "fuzz_common.h"

LLM_FUZZ_TARGET(server_request) {
  if (size < 1 || size > 65536) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  llm_server::Request r;
  const llm_server::ApiError e = llm_server::parse_request(body, chat, "test-model", r);
  if (e.status != 0) {
    LLM_FUZZ_EXPECT(e.status == 400 || e.status == 404 || e.status == 500);
    LLM_FUZZ_EXPECT(!e.message.empty() && !e.type.empty());
    return 0;
  }
  if (chat) {
    LLM_FUZZ_EXPECT(!r.roles.empty() && r.roles.size() == r.contents.size());
  }
  LLM_FUZZ_EXPECT(r.sampling.struct_size == sizeof(llm_sampling));
  LLM_FUZZ_EXPECT(r.sampling.temperature >= 0.f && r.sampling.temperature <= 2.f);
  LLM_FUZZ_EXPECT(r.sampling.top_p >= 0.f && r.sampling.top_p <= 1.f);
  LLM_FUZZ_EXPECT(r.sampling.min_p >= 0.f && r.sampling.min_p <= 1.f);
  LLM_FUZZ_EXPECT(r.sampling.top_k >= 0);
  LLM_FUZZ_EXPECT(r.sampling.grammar == nullptr);
  LLM_FUZZ_EXPECT(r.max_tokens <= 1000000000u);
  LLM_FUZZ_EXPECT(r.stops.size() <= llm_server::kMaxStops);
  for (const std::string& s : r.stops) LLM_FUZZ_EXPECT(!s.empty() && s.size() <= llm_server::kMaxStopBytes);
  if (r.format == llm_server::ResponseFormat::kJsonSchema) {
    // The schema handed to llm_grammar_from_json_schema is JSON text.
    LLM_FUZZ_EXPECT(nlohmann::json::accept(r.schema));
  }
  return 0;
}
