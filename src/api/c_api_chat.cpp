// The C ABI of chat templates (llm_chat_*) and grammars (llm_grammar_*).
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/handles.h"
#include "chat/chat_template.h"
#include "core/error.h"
#include "grammar/grammar.h"
#include "sampling/constraint.h"

using llm::api::copy_out;
using llm::api::model_of;

// What the chat and grammar calls build once per model handle, on first use.
struct llm_model_extras {
  std::mutex mu;
  std::shared_ptr<const llm::grammar::Vocab> vocab;
  bool template_resolved = false;
  std::string template_source;                          // the file's or a built-in; empty: none
  std::string template_origin;                          // "file" or the built-in's name
  std::shared_ptr<const llm::chat::Template> compiled;  // template_source compiled
};

namespace {

constexpr uint64_t kGrammarMagic = 0x4c4c4d4752414d52ULL;  // "LLMGRAMR"

// A session's grammar state, seen through sampling/constraint.h.
class GrammarConstraint final : public llm::TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const llm::grammar::Grammar> g, std::shared_ptr<const llm::grammar::Vocab> v)
      : key_(g.get()), m_(std::move(g), std::move(v)) {}
  std::unique_ptr<llm::TokenConstraint> clone() const override { return std::make_unique<GrammarConstraint>(*this); }
  const void* key() const override { return key_; }
  bool allows(int32_t token) const override { return m_.allows(token); }
  void apply(float* logits, int32_t n_vocab) override { m_.apply_mask(logits, n_vocab); }
  void accept(int32_t token) override { m_.accept(token); }

 private:
  const void* key_;
  llm::grammar::Matcher m_;
};

llm_model_extras& extras_of(const llm_model* m) {
  model_of(m);
  return *m->extras;
}

// The grammar's view of the model's vocabulary: each token's bytes (control
// tokens none) and the end-of-generation ids.
std::shared_ptr<const llm::grammar::Vocab> vocab_of(const llm_model* model) {
  llm_model_extras& x = extras_of(model);
  std::lock_guard<std::mutex> lk(x.mu);
  if (!x.vocab) {
    const llm::Tokenizer& tk = model->impl->tokenizer();
    std::vector<std::string> pieces(size_t(tk.n_vocab()));
    std::vector<int32_t> eog;
    for (int32_t id = 0; id < tk.n_vocab(); ++id) {
      if (tk.is_eog(id)) eog.push_back(id);
      else if (!tk.is_control(id)) tk.append_piece(id, pieces[size_t(id)]);
    }
    x.vocab = llm::grammar::make_vocab(std::move(pieces), std::move(eog));
  }
  return x.vocab;
}

// The model's template: the file's, else the built-in the rule picks.
void resolve_template(const llm_model* model, llm_model_extras& x) {
  if (x.template_resolved) return;
  const llm::Model& m = *model->impl;
  const llm::VocabData& v = m.tokenizer().vocab();
  if (!v.chat_template.empty()) {
    x.template_source = v.chat_template;
    x.template_origin = "file";
  } else {
    const std::string name = llm::chat::pick_builtin(m.config().arch, [&](std::string_view text) {
      for (const std::string& t : v.tokens)
        if (t == text) return true;
      return false;
    });
    if (!name.empty()) {
      x.template_source = std::string(llm::chat::builtin_template(name));
      x.template_origin = name;
    }
  }
  x.template_resolved = true;
}

std::string token_text(const llm::Model& m, int32_t id) {
  const llm::VocabData& v = m.tokenizer().vocab();
  return id >= 0 && size_t(id) < v.tokens.size() ? v.tokens[size_t(id)] : std::string();
}

}  // namespace

struct llm_grammar {
  uint64_t magic;
  std::weak_ptr<llm::Model> model;  // identity only: a grammar does not keep the weights alive
  GrammarConstraint start;          // the start state sessions copy
};

namespace llm::api {

void free_model_extras(llm_model_extras* x) { delete x; }
llm_model_extras* new_model_extras() { return new llm_model_extras(); }

const TokenConstraint* constraint_of(const llm_sampling* sampling, const std::shared_ptr<llm::Model>& model) {
  if (!sampling || sampling->struct_size < offsetof(llm_sampling, grammar) + sizeof(sampling->grammar) ||
      !sampling->grammar)
    return nullptr;
  const llm_grammar* g = sampling->grammar;
  LLM_CHECK(is_live(g) && g->magic == kGrammarMagic, LLM_ERR_INVALID_ARGUMENT,
            "sampling->grammar %p is not a live llm_grammar", static_cast<const void*>(g));
  LLM_CHECK(!g->model.owner_before(model) && !model.owner_before(g->model), LLM_ERR_INVALID_ARGUMENT,
            "sampling->grammar was made for another model");
  return &g->start;
}

}  // namespace llm::api

// ---------------------------------------------------------------- chat

extern "C" LLM_API void llm_chat_params_init(llm_chat_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->add_generation_prompt = 1;
}

extern "C" LLM_API llm_status llm_chat_render(const llm_model* model, const llm_chat_message* messages,
                                              size_t n_messages, const llm_chat_params* params, char* buf,
                                              size_t capacity, size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  LLM_CHECK_ARG(messages != nullptr || n_messages == 0);
  LLM_CHECK(n_messages <= (1u << 20), LLM_ERR_INVALID_ARGUMENT, "%zu messages", n_messages);
  llm_chat_params d;
  llm_chat_params_init(&d);
  const llm_chat_params p = llm::api::read_params(params, d);
  LLM_CHECK(model != nullptr || p.template_source != nullptr, LLM_ERR_INVALID_ARGUMENT,
            "llm_chat_render needs a model or params->template_source");
  std::vector<llm::chat::Message> msgs(n_messages);
  for (size_t i = 0; i < n_messages; ++i) {
    LLM_CHECK(messages[i].role != nullptr && messages[i].content != nullptr, LLM_ERR_INVALID_ARGUMENT,
              "message %zu has a NULL role or content", i);
    msgs[i].role = messages[i].role;
    msgs[i].content = messages[i].content;
  }
  llm::chat::RenderOptions opt;
  opt.add_generation_prompt = p.add_generation_prompt != 0;
  std::shared_ptr<const llm::chat::Template> tpl;
  if (model) {
    const llm::Model& m = model_of(model);
    opt.bos_token = token_text(m, m.tokenizer().bos());
    opt.eos_token = token_text(m, m.tokenizer().eos());
  }
  if (p.template_source) {
    tpl = llm::chat::Template::compile(p.template_source);
  } else {
    llm_model_extras& x = extras_of(model);
    std::lock_guard<std::mutex> lk(x.mu);
    resolve_template(model, x);
    LLM_CHECK(!x.template_source.empty(), LLM_ERR_UNSUPPORTED,
              "the model has no chat template and no built-in format fits it (architecture '%s'): pass "
              "params->template_source",
              model->impl->config().arch.c_str());
    if (!x.compiled) x.compiled = llm::chat::Template::compile(x.template_source);
    tpl = x.compiled;
  }
  return copy_out(tpl->render(msgs, opt), buf, capacity, length, true);
  LLM_API_END
}

extern "C" LLM_API llm_status llm_model_chat_template(const llm_model* model, char* buf, size_t capacity,
                                                      size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  llm_model_extras& x = extras_of(model);
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  std::string src;
  {
    std::lock_guard<std::mutex> lk(x.mu);
    resolve_template(model, x);
    src = x.template_source;
  }
  LLM_CHECK(!src.empty(), LLM_ERR_UNSUPPORTED, "the model has no chat template and no built-in format fits it");
  return copy_out(src, buf, capacity, length, true);
  LLM_API_END
}

// ---------------------------------------------------------------- grammars

static llm_status make_grammar(const llm_model* model, std::shared_ptr<const llm::grammar::Grammar> g,
                               llm_grammar** out) {
  std::unique_ptr<llm_grammar> h(
      new llm_grammar{kGrammarMagic, model->impl, GrammarConstraint(std::move(g), vocab_of(model))});
  llm::api::register_handle(h.get());
  *out = h.release();
  return LLM_OK;
}

extern "C" LLM_API llm_status llm_grammar_create(const llm_model* model, const char* gbnf, const char* root,
                                                 llm_grammar** out_grammar) {
  if (out_grammar) *out_grammar = nullptr;
  LLM_API_BEGIN
  model_of(model);
  LLM_CHECK_ARG(gbnf != nullptr && out_grammar != nullptr);
  return make_grammar(model, llm::grammar::parse_gbnf(gbnf, root ? root : "root"), out_grammar);
  LLM_API_END
}

extern "C" LLM_API llm_status llm_grammar_from_json_schema(const llm_model* model, const char* schema_json,
                                                           llm_grammar** out_grammar) {
  if (out_grammar) *out_grammar = nullptr;
  LLM_API_BEGIN
  model_of(model);
  LLM_CHECK_ARG(schema_json != nullptr && out_grammar != nullptr);
  return make_grammar(model, llm::grammar::parse_gbnf(llm::grammar::json_schema_to_gbnf(schema_json)), out_grammar);
  LLM_API_END
}

extern "C" LLM_API llm_status llm_json_schema_to_gbnf(const char* schema_json, char* buf, size_t capacity,
                                                      size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  LLM_CHECK_ARG(schema_json != nullptr && length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  return copy_out(llm::grammar::json_schema_to_gbnf(schema_json), buf, capacity, length, true);
  LLM_API_END
}

extern "C" LLM_API void llm_grammar_free(llm_grammar* grammar) {
  if (!grammar || !llm::api::is_live(grammar) || grammar->magic != kGrammarMagic) return;
  llm::api::unregister_handle(grammar);
  grammar->magic = 0;
  delete grammar;
}
