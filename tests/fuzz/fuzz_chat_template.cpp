// Fuzz target: the chat-template interpreter (src/chat/): compile any text,
// render it over a small conversation with small bounds.
//
// Input: template text; optionally followed by a NUL byte and the messages as
// NUL-separated role, content, role, content... (at most 8 messages). Without
// a NUL the whole input is the template and a fixed three-message
// conversation is used, so real templates are seeds as they are.
// Invariants: only llm::Error escapes, with LLM_ERR_INVALID_ARGUMENT or
// LLM_ERR_UNSUPPORTED and a "chat template: line L, column C: " message; the
// output respects max_output_bytes; rendering twice gives the same text.
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/error.h"
#include "fuzz_common.h"

LLM_FUZZ_TARGET(chat_template) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  std::vector<llm::chat::Message> msgs;
  if (nul == std::string::npos) {
    msgs = {{"system", "Be brief."}, {"user", "Hi <b>\xc3\xa9</b>\n"}, {"assistant", "<think>x</think>\n\nHello."}};
  } else {
    std::vector<std::string> fields;
    size_t b = nul + 1;
    while (b <= input.size() && fields.size() < 16) {
      size_t e = input.find('\0', b);
      if (e == std::string::npos) e = input.size();
      fields.push_back(input.substr(b, e - b));
      b = e + 1;
    }
    for (size_t k = 0; k + 1 < fields.size(); k += 2) msgs.push_back({fields[k], fields[k + 1]});
  }
  llm::chat::RenderOptions opt;
  opt.add_generation_prompt = (size & 1) != 0;
  opt.bos_token = "<s>";
  opt.eos_token = "</s>";
  opt.max_steps = 200000;
  opt.max_output_bytes = size_t(1) << 16;
  opt.max_depth = 24;
  opt.now_unix = 1721995200;
  auto check_error = [](const llm::Error& e) {
    LLM_FUZZ_EXPECT(e.status() == LLM_ERR_INVALID_ARGUMENT || e.status() == LLM_ERR_UNSUPPORTED);
    LLM_FUZZ_EXPECT(std::string(e.what()).rfind("chat template: line ", 0) == 0);
  };
  std::shared_ptr<const llm::chat::Template> t;
  try {
    t = llm::chat::Template::compile(source);
  } catch (const llm::Error& e) {
    check_error(e);
    return 0;
  }
  std::string first;
  bool ok = false;
  try {
    first = t->render(msgs, opt);
    ok = true;
    LLM_FUZZ_EXPECT(first.size() <= opt.max_output_bytes);
  } catch (const llm::Error& e) {
    check_error(e);
  }
  try {
    const std::string second = t->render(msgs, opt);
    LLM_FUZZ_EXPECT(ok && second == first);
  } catch (const llm::Error& e) {
    LLM_FUZZ_EXPECT(!ok);
  }
  return 0;
}
