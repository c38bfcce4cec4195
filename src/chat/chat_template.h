// Chat templates: a sandboxed interpreter of the Jinja2 subset that real
// chat templates use (docs/CHAT.md), and the built-in templates for models
// that ship none.
//
// Rendering matches Hugging Face transformers' apply_chat_template: a Jinja2
// environment with trim_blocks and lstrip_blocks, the loopcontrols extension,
// raise_exception and strftime_now, and the variables messages, tools (none),
// documents (none), add_generation_prompt, bos_token, eos_token.
//
// Errors are thrown as llm::Error (src/core/error.h):
//   LLM_ERR_INVALID_ARGUMENT  malformed template, runtime error, raise_exception,
//                             a bound exceeded ("chat template: line L, column C: ...")
//   LLM_ERR_UNSUPPORTED       a construct outside the supported subset
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace llm::chat {

struct Message {
  std::string role;
  std::string content;
};

struct RenderOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;  // exposed to the template as bos_token / eos_token
  // Bounds: a template that loops or recurses is stopped, never hangs or
  // exhausts memory. max_steps counts statements and expression nodes run;
  // max_output_bytes caps the output and every string built on the way;
  // max_depth caps macro calls in progress.
  uint64_t max_steps = 10'000'000;
  size_t max_output_bytes = 16 << 20;
  int max_depth = 256;
  // The instant strftime_now() formats (UTC), in seconds since 1970; -1 reads the clock.
  int64_t now_unix = -1;
};

namespace detail {
struct Program;
}

// Immutable after compile; render() is const and thread-safe.
class Template {
 public:
  // Throws llm::Error(LLM_ERR_INVALID_ARGUMENT, "chat template: line L, column C: ...")
  // for a malformed template, LLM_ERR_UNSUPPORTED for a construct outside the subset.
  static std::shared_ptr<const Template> compile(std::string_view source);

  // Throws llm::Error (see above) with the line and column of the failing node.
  std::string render(const std::vector<Message>& msgs, const RenderOptions& opt) const;

  ~Template();
  explicit Template(std::unique_ptr<detail::Program> program);

 private:
  std::unique_ptr<detail::Program> program_;
};

// Jinja source of a built-in format by name: "chatml", "llama3", "gemma",
// "mistral", "phi3"; empty for an unknown name.
std::string_view builtin_template(std::string_view name);

// The built-in for a model without a template (docs/CHAT.md): from the
// architecture name ("gemma3", "qwen2", "llama", "phi3") and the
// vocabulary's special-token texts. Returns the built-in name or "".
std::string pick_builtin(std::string_view arch, const std::function<bool(std::string_view)>& has_token_text);

}  // namespace llm::chat
