#include "request.h"

#include <nlohmann/json.hpp>

namespace llm_server {

namespace {

using json = nlohmann::json;

// Text of an OpenAI message content: a string, null, or an array of parts
// of which only {"type":"text"} ones are understood.
bool content_text(const json& c, std::string& out) {
  if (c.is_null()) return true;
  if (c.is_string()) {
    out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return false;
  for (const json& part : c) {
    if (!part.is_object()) return false;
    const auto type = part.find("type"), text = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text" || text == part.end() || !text->is_string())
      return false;
    if (!out.empty()) out += "\n";
    out += text->get<std::string>();
  }
  return true;
}

// body[key] when present and not null, else nullptr.
const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// A number field within [lo, hi]; absent leaves v as it is.
bool number(const json& body, const char* key, double lo, double hi, double& v) {
  const json* f = field(body, key);
  if (!f) return true;
  if (!f->is_number()) return false;
  v = f->get<double>();
  return v >= lo && v <= hi;
}

bool boolean(const json& body, const char* key, bool& v) {
  const json* f = field(body, key);
  if (!f) return true;
  if (!f->is_boolean()) return false;
  v = f->get<bool>();
  return true;
}

ApiError parse_prompt(const json& body, bool chat, Request& out) {
  if (chat) {
    const json* msgs = field(body, "messages");
    if (!msgs || !msgs->is_array() || msgs->empty())
      return bad_request("'messages' must be a non-empty array", "invalid_messages");
    for (const json& m : *msgs) {
      const json* role = m.is_object() ? field(m, "role") : nullptr;
      if (!role || !role->is_string()) return bad_request("each message needs a string 'role'", "invalid_messages");
      std::string text;
      const json* content = field(m, "content");
      if (content && !content_text(*content, text))
        return bad_request("message content must be a string or an array of text parts", "invalid_messages");
      out.roles.push_back(role->get<std::string>());
      out.contents.push_back(std::move(text));
    }
    return {};
  }
  const json* p = field(body, "prompt");
  if (!p) return bad_request("'prompt' is required");
  if (p->is_array() && p->size() == 1) p = &(*p)[0];
  if (!p->is_string()) return bad_request("'prompt' must be a string (or an array of one string)");
  out.prompt = p->get<std::string>();
  return {};
}

ApiError parse_settings(const json& body, Request& out) {
  double max_tokens = 0;
  const char* mt_key = body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!number(body, mt_key, 1, 1e9, max_tokens)) return bad_request(std::string("'") + mt_key + "' must be >= 1");
  out.max_tokens = uint64_t(max_tokens);
  llm_sampling_init(&out.sampling);
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, top_k = 0, repeat_penalty = 1.0;
  if (!number(body, "temperature", 0, 2, temperature)) return bad_request("'temperature' must be in [0, 2]");
  if (!number(body, "top_p", 0, 1, top_p)) return bad_request("'top_p' must be in [0, 1]");
  if (!number(body, "min_p", 0, 1, min_p)) return bad_request("'min_p' must be in [0, 1]");
  if (!number(body, "top_k", 0, 1e9, top_k)) return bad_request("'top_k' must be >= 0");
  if (!number(body, "repeat_penalty", 0, 10, repeat_penalty))
    return bad_request("'repeat_penalty' must be in [0, 10]");
  out.sampling.temperature = float(temperature);
  out.sampling.top_p = float(top_p);
  out.sampling.min_p = float(min_p);
  out.sampling.top_k = int32_t(top_k);
  out.sampling.repeat_penalty = float(repeat_penalty);
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer()) return bad_request("'seed' must be an integer");
    out.sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>());
    out.default_seed = false;
  }
  if (!(out.sampling.temperature > 0.f)) {  // greedy: the seed plays no part
    out.sampling.seed = 0;
    out.default_seed = false;
  }
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      out.stops.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= kMaxStops) {
      for (const json& x : *s) {
        if (!x.is_string()) return bad_request("'stop' must be a string or an array of strings");
        out.stops.push_back(x.get<std::string>());
      }
    } else {
      return bad_request("'stop' must be a string or an array of up to 16 strings");
    }
    for (const std::string& x : out.stops)
      if (x.empty() || x.size() > kMaxStopBytes) return bad_request("stop strings must have 1 to 1024 bytes");
  }
  if (!boolean(body, "stream", out.stream)) return bad_request("'stream' must be a boolean");
  if (!boolean(body, "ignore_eos", out.ignore_eos)) return bad_request("'ignore_eos' must be a boolean");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object() || !boolean(*so, "include_usage", out.include_usage))
      return bad_request("'stream_options' must be an object with a boolean 'include_usage'");
  }
  if (const json* rf = field(body, "response_format")) {
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!type || !type->is_string()) return bad_request("response_format needs a string 'type'");
    if (*type == "json_object") {
      out.format = ResponseFormat::kJsonObject;
    } else if (*type == "json_schema") {
      const json* js = field(*rf, "json_schema");
      const json* schema = js && js->is_object() ? field(*js, "schema") : nullptr;
      if (!schema) return bad_request("response_format json_schema needs json_schema.schema");
      out.format = ResponseFormat::kJsonSchema;
      out.schema = schema->dump(-1, ' ', false, json::error_handler_t::replace);
    } else if (*type != "text") {
      return bad_request("response_format type must be text, json_object or json_schema");
    }
  }
  return {};
}

}  // namespace

ApiError parse_request(std::string_view body_text, bool chat, const std::string& model_name, Request& out) {
  out = Request();
  try {
    const json body = json::parse(body_text.begin(), body_text.end());
    if (!body.is_object()) return bad_request("the request body must be a JSON object");
    if (const json* m = field(body, "model")) {
      if (!m->is_string()) return bad_request("'model' must be a string");
      if (*m != model_name)
        return {404, "invalid_request_error", "model_not_found",
                "The model '" + m->get<std::string>() + "' does not exist; this server has '" + model_name + "'"};
    }
    if (const json* n = field(body, "n"); n && *n != 1) return bad_request("only n = 1 is supported");
    ApiError e = parse_prompt(body, chat, out);
    if (e.status) return e;
    return parse_settings(body, out);
  } catch (const json::parse_error& e) {
    return bad_request(std::string("invalid JSON: ") + e.what(), "invalid_json");
  } catch (const json::exception& e) {
    return bad_request(std::string("invalid request: ") + e.what());
  } catch (const std::bad_alloc&) {
    return {500, "server_error", "out_of_memory", "out of memory reading the request"};
  }
}

}  // namespace llm_server
