// The public API's "ask the size, then fill" calls as std::string /
// std::vector results, for the command-line programs (header only: every
// src/cli/*.cpp is its own executable).
#pragma once

#include <string>
#include <vector>

#include "llm.h"

namespace llm_cli {

// Renders msgs through the model's chat template, or through tpl when it is non-empty.
inline llm_status render_chat(const llm_model* model, const std::string& tpl,
                              const std::vector<llm_chat_message>& msgs, bool add_generation_prompt,
                              std::string& out) {
  llm_chat_params cp;
  llm_chat_params_init(&cp);
  cp.template_source = tpl.empty() ? nullptr : tpl.c_str();
  cp.add_generation_prompt = add_generation_prompt ? 1 : 0;
  size_t len = 0;
  llm_status st = llm_chat_render(model, msgs.data(), msgs.size(), &cp, nullptr, 0, &len);
  if (st != LLM_ERR_BUFFER_TOO_SMALL) return st;
  std::vector<char> buf(len + 1);
  st = llm_chat_render(model, msgs.data(), msgs.size(), &cp, buf.data(), buf.size(), &len);
  if (st == LLM_OK) out.assign(buf.data(), len);
  return st;
}

inline llm_status tokenize(const llm_model* model, const std::string& text, uint32_t flags,
                           std::vector<llm_token>& out) {
  size_t n = 0;
  llm_status st = llm_tokenize(model, text.data(), text.size(), flags, nullptr, 0, &n);
  if (st != LLM_OK && st != LLM_ERR_BUFFER_TOO_SMALL) return st;
  out.resize(n);
  return llm_tokenize(model, text.data(), text.size(), flags, out.data(), out.size(), &n);
}

}  // namespace llm_cli
