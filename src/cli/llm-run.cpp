// llm-run: generate text from a model with the public API, streaming it to
// stdout; timing figures go to stderr at the end.
//
//   llm-run -m MODEL -p PROMPT [-n N] [sampling] [--stop S]... [--grammar-file F | --json-schema F]
//   llm-run -m MODEL --chat [--system TEXT] [--chat-template-file T] [-n N] [sampling] ...
//   llm-run (-m MODEL | --chat-template-file T) --render-chat MESSAGES.json
//
// --chat reads one user message per line from stdin and answers it through
// the model's chat template (or T); the conversation stays in the session
// and only what the template adds each turn is prefilled. --render-chat
// prints the prompt an OpenAI-style messages array renders to (generation
// prompt added) and exits.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "api_strings.h"
#include "llm.h"

static void usage() {
  std::fprintf(stderr,
               "usage: llm-run -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
               "               [--repeat-penalty R] [--seed S] [--threads N] [--device auto|cpu|cuda]\n"
               "               [--kv f16|f32|int8|int4] [--window W] [--sink S] [--exact] [--ignore-eos]\n"
               "               [--stop TEXT]... [--grammar-file F.gbnf | --json-schema F.json]\n"
               "               [--chat [--system TEXT]] [--chat-template-file T]\n"
               "       llm-run (-m MODEL | --chat-template-file T) --render-chat MESSAGES.json\n");
}

static int die(llm_status st, const char* what) {
  std::fprintf(stderr, "llm-run: %s: %s (%s)\n", what, llm_status_string(st), llm_last_error());
  return 1;
}

static bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

struct Message {
  std::string role, content;
};

// Renders msgs through the model's template, or through tpl when non-empty.
static llm_status render(const llm_model* model, const std::string& tpl, const std::vector<Message>& msgs,
                         bool add_generation_prompt, std::string& out) {
  std::vector<llm_chat_message> cm;
  for (const Message& m : msgs) cm.push_back({m.role.c_str(), m.content.c_str()});
  return llm_cli::render_chat(model, tpl, cm, add_generation_prompt, out);
}

using llm_cli::tokenize;

// Generates up to n_predict tokens, streaming the text through a text stream
// (stops, EOG). Appends the tokens to `held` and the text to `text`.
static llm_status generate(llm_model* model, llm_session* session, const llm_sampling& samp,
                           const std::vector<std::string>& stops, int n_predict, bool ignore_eos,
                           std::vector<llm_token>& held, std::string& text) {
  std::vector<const char*> cs;
  for (const std::string& s : stops) cs.push_back(s.c_str());
  llm_text_stream* ts = nullptr;
  llm_status st = llm_text_stream_create(model, cs.data(), cs.size(), &ts);
  if (st != LLM_OK) return st;
  std::vector<char> buf(1 << 16);
  int32_t stopped = 0;
  for (int i = 0; i < n_predict && !stopped; ++i) {
    llm_token t;
    st = llm_decode_step(session, &samp, &t);
    if (st != LLM_OK) break;
    held.push_back(t);
    if (ignore_eos && llm_token_is_eog(model, t)) continue;
    size_t len = 0;
    st = llm_text_stream_push(ts, t, buf.data(), buf.size(), &len, &stopped);
    if (st != LLM_OK) break;
    std::fwrite(buf.data(), 1, len, stdout);
    std::fflush(stdout);
    text.append(buf.data(), len);
  }
  size_t len = 0;
  if (!stopped && llm_text_stream_flush(ts, buf.data(), buf.size(), &len) == LLM_OK) {
    std::fwrite(buf.data(), 1, len, stdout);
    text.append(buf.data(), len);
  }
  llm_text_stream_free(ts);
  return st;
}

// Makes the session hold exactly `want`: keeps the common prefix with
// `held`, drops the rest (llm_kv_evict) and prefills what is new.
static llm_status sync_session(llm_session* session, std::vector<llm_token>& held, const std::vector<llm_token>& want) {
  size_t common = 0;
  while (common < held.size() && common < want.size() && held[common] == want[common]) ++common;
  if (common == want.size() && common > 0) --common;  // re-run the last token for fresh logits
  llm_status st = LLM_OK;
  if (common < held.size()) st = llm_kv_evict(session, uint32_t(common), uint32_t(held.size() - common));
  if (st == LLM_OK) st = llm_prefill(session, want.data() + common, want.size() - common);
  if (st == LLM_OK) held = want;
  return st;
}

int main(int argc, char** argv) {
  std::string model_path, prompt, system_prompt, template_file, render_file, grammar_file, schema_file;
  std::vector<std::string> stops;
  int n_predict = 128;
  bool ignore_eos = false, chat = false;
  llm_load_params lp;
  llm_load_params_init(&lp);
  llm_session_params sp;
  llm_session_params_init(&sp);
  llm_sampling samp;
  llm_sampling_init(&samp);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-m" || a == "--model") model_path = next();
    else if (a == "-p" || a == "--prompt") prompt = next();
    else if (a == "-n") n_predict = std::atoi(next());
    else if (a == "--temp") samp.temperature = float(std::atof(next()));
    else if (a == "--top-k") samp.top_k = std::atoi(next());
    else if (a == "--top-p") samp.top_p = float(std::atof(next()));
    else if (a == "--min-p") samp.min_p = float(std::atof(next()));
    else if (a == "--repeat-penalty") samp.repeat_penalty = float(std::atof(next()));
    else if (a == "--seed") samp.seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--threads" || a == "-t") lp.n_threads = std::atoi(next());
    else if (a == "--window") sp.window = uint32_t(std::atoi(next()));
    else if (a == "--sink") sp.n_sink = uint32_t(std::atoi(next()));
    else if (a == "--exact") lp.flags |= LLM_LOAD_REFERENCE_MATH;
    else if (a == "--ignore-eos") ignore_eos = true;
    else if (a == "--stop") stops.push_back(next());
    else if (a == "--grammar-file") grammar_file = next();
    else if (a == "--json-schema") schema_file = next();
    else if (a == "--chat") chat = true;
    else if (a == "--system") system_prompt = next();
    else if (a == "--chat-template-file") template_file = next();
    else if (a == "--render-chat") render_file = next();
    else if (a == "--device") {
      const std::string d = next();
      lp.device = d == "cpu" ? LLM_DEVICE_CPU : d == "cuda" ? LLM_DEVICE_CUDA : LLM_DEVICE_AUTO;
    } else if (a == "--kv") {
      const std::string k = next();
      sp.kv_type = k == "f32" ? LLM_KV_F32 : k == "int8" ? LLM_KV_INT8 : k == "int4" ? LLM_KV_INT4 : LLM_KV_F16;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "llm-run: unknown option '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  std::string tpl;
  if (!template_file.empty() && !read_file(template_file, tpl)) {
    std::fprintf(stderr, "llm-run: cannot read '%s'\n", template_file.c_str());
    return 1;
  }
  if (model_path.empty() && !(render_file.size() && tpl.size())) {
    usage();
    return 2;
  }
  if (!grammar_file.empty() && !schema_file.empty()) {
    std::fprintf(stderr, "llm-run: --grammar-file and --json-schema exclude each other\n");
    return 2;
  }

  llm_model* model = nullptr;
  llm_status st;
  if (!model_path.empty()) {
    st = llm_load(model_path.c_str(), &lp, &model);
    if (st != LLM_OK) return die(st, "load");
  }

  if (!render_file.empty()) {  // --render-chat: print the prompt and exit
    std::string text;
    std::vector<Message> msgs;
    try {
      if (!read_file(render_file, text)) throw std::runtime_error("cannot read '" + render_file + "'");
      const nlohmann::json j = nlohmann::json::parse(text);
      if (!j.is_array()) throw std::runtime_error("the messages file must hold a JSON array");
      for (const auto& m : j) msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "llm-run: %s: %s\n", render_file.c_str(), e.what());
      llm_model_free(model);
      return 1;
    }
    std::string out;
    st = render(model, tpl, msgs, true, out);
    llm_model_free(model);
    if (st != LLM_OK) return die(st, "render-chat");
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }

  llm_grammar* grammar = nullptr;
  if (!grammar_file.empty() || !schema_file.empty()) {
    std::string text;
    const std::string& f = grammar_file.empty() ? schema_file : grammar_file;
    if (!read_file(f, text)) {
      std::fprintf(stderr, "llm-run: cannot read '%s'\n", f.c_str());
      llm_model_free(model);
      return 1;
    }
    st = grammar_file.empty() ? llm_grammar_from_json_schema(model, text.c_str(), &grammar)
                              : llm_grammar_create(model, text.c_str(), nullptr, &grammar);
    if (st != LLM_OK) {
      llm_model_free(model);
      return die(st, f.c_str());
    }
    samp.grammar = grammar;
  }

  llm_session* session = nullptr;
  st = llm_session_create(model, &sp, &session);
  if (st != LLM_OK) {
    llm_grammar_free(grammar);
    llm_model_free(model);
    return die(st, "session");
  }

  int rc = 0;
  std::vector<llm_token> held;
  if (chat) {
    std::vector<Message> msgs;
    if (!system_prompt.empty()) msgs.push_back({"system", system_prompt});
    std::string line;
    std::fprintf(stderr, "> ");
    while (std::getline(std::cin, line)) {
      msgs.push_back({"user", line});
      std::string text;
      std::vector<llm_token> want;
      st = render(model, tpl, msgs, true, text);
      if (st == LLM_OK) st = tokenize(model, text, LLM_TOKENIZE_PARSE_SPECIAL, want);
      if (st == LLM_OK) st = sync_session(session, held, want);
      std::string answer;
      if (st == LLM_OK) st = generate(model, session, samp, stops, n_predict, false, held, answer);
      if (st != LLM_OK) {
        rc = die(st, "chat");
        break;
      }
      msgs.push_back({"assistant", answer});
      std::fprintf(stdout, "\n");
      std::fprintf(stderr, "> ");
    }
  } else {
    std::vector<llm_token> toks;
    st = tokenize(model, prompt, LLM_TOKENIZE_ADD_BOS, toks);
    if (st == LLM_OK) st = llm_prefill(session, toks.data(), toks.size());
    if (st != LLM_OK) {
      rc = die(st, "prefill");
    } else {
      held = toks;
      std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      std::fflush(stdout);
      std::string text;
      st = generate(model, session, samp, stops, n_predict, ignore_eos, held, text);
      if (st != LLM_OK) rc = die(st, "decode");
      std::printf("\n");
    }
  }

  llm_session_stats_t stats;
  stats.struct_size = sizeof stats;
  llm_session_stats(session, &stats);
  std::fprintf(stderr,
               "llm-run: prompt %u tokens, generated %u tokens\n"
               "llm-run: TTFT %.2f ms | ITL median %.3f ms, p95 %.3f ms | prompt %.1f tok/s | generation %.1f tok/s\n",
               stats.n_prompt, stats.n_generated, stats.ttft_ms, stats.itl_median_ms, stats.itl_p95_ms,
               stats.prompt_tokens_per_s, stats.gen_tokens_per_s);
  llm_session_free(session);
  llm_grammar_free(grammar);
  llm_model_free(model);
  return rc;
}
