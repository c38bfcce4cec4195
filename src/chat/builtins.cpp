// Built-in chat templates for model files that carry none, and the rule that
// picks one (docs/CHAT.md). Each is written in the same Jinja subset the
// interpreter runs, so a built-in renders exactly like a template read from a
// file would.
#include <string>

#include "chat/chat_template.h"

namespace llm::chat {
namespace {

// <|im_start|>role\ncontent<|im_end|>\n ... (Qwen, many fine-tunes).
constexpr std::string_view kChatml =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n";

// Llama 3: header ids, content trimmed, <|eot_id|> after each turn.
constexpr std::string_view kLlama3 =
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n";

// Gemma 2/3: user/model turns; a system message is folded into the first user turn.
constexpr std::string_view kGemma =
    "{{- bos_token -}}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set first_user_prefix = messages[0]['content'] | trim + '\\n\\n' -%}\n"
    "{%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set first_user_prefix = '' -%}\n"
    "{%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + "
    "'<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n";

// Mistral [INST]: a system message is prepended to the first user turn;
// assistant turns end with eos; there is no generation prompt to add.
constexpr std::string_view kMistral =
    "{{- bos_token -}}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set system = messages[0]['content'] -%}\n"
    "{%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set system = '' -%}\n"
    "{%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "{%- if message['role'] == 'user' -%}\n"
    "{%- if loop.first and system -%}\n"
    "{{- '[INST] ' + system + '\\n\\n' + message['content'] + ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- '[INST] ' + message['content'] + ' [/INST]' -}}\n"
    "{%- endif -%}\n"
    "{%- elif message['role'] == 'assistant' -%}\n"
    "{{- ' ' + message['content'] + eos_token -}}\n"
    "{%- else -%}\n"
    "{{- raise_exception('mistral template: roles must be user and assistant after an optional system message') -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

// Phi-3: <|role|>\ncontent<|end|>\n; eos closes a conversation without a generation prompt.
constexpr std::string_view kPhi3 =
    "{%- for message in messages -%}\n"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}\n";

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::string_view builtin_template(std::string_view name) {
  if (name == "chatml") return kChatml;
  if (name == "llama3") return kLlama3;
  if (name == "gemma") return kGemma;
  if (name == "mistral") return kMistral;
  if (name == "phi3") return kPhi3;
  return {};
}

std::string pick_builtin(std::string_view arch, const std::function<bool(std::string_view)>& has_token_text) {
  auto has = [&](std::string_view t) { return has_token_text && has_token_text(t); };
  // 1. The vocabulary's turn markers are the strongest evidence of the format.
  if (has("<|im_start|>") && has("<|im_end|>")) return "chatml";
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return "llama3";
  if (has("<start_of_turn>") && has("<end_of_turn>")) return "gemma";
  if (has("<|user|>") && has("<|assistant|>") && has("<|end|>")) return "phi3";
  if (has("[INST]") && has("[/INST]")) return "mistral";
  // 2. Otherwise the architecture, where it names one format.
  if (starts_with(arch, "gemma")) return "gemma";
  if (starts_with(arch, "qwen")) return "chatml";
  if (starts_with(arch, "phi3")) return "phi3";
  if (starts_with(arch, "mistral")) return "mistral";
  // "llama" alone may be Llama 2, Llama 3, Mistral or a base model: no guess.
  return "";
}

}  // namespace llm::chat
