// npcs.cpp: eight game characters share one model and one system prompt, and
// answer with JSON actions the game can act on.
//
// The shared prompt is prefilled once; each character is a session forked
// from it (its KV pages are shared copy-on-write, so the prompt is stored
// once). Every answer is constrained by one JSON Schema, compiled once into
// an llm_grammar that all the sessions share (llm_sampling.grammar): the
// model can only write {"action": ..., "target": ..., "line": ...}, and the
// grammar's end ends the answer. Worker threads generate the characters'
// answers in turn, while the main thread runs a 60 Hz "frame" loop that only
// polls for finished answers and never waits on the model: a frame's work
// stays far below 16.7 ms.
//
// A model with a chat template gets its prompts through llm_chat_render; a
// model without one (stories260K) gets a plain story-style prompt.
//
//   npcs MODEL [TURNS_PER_NPC] [LINE_CHARS]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "llm.h"

namespace {

// What every answer must be. "line" is bounded by LINE_CHARS (see main), so
// an answer always ends after a bounded number of tokens.
const char* kSchemaFormat = R"({
  "type": "object",
  "properties": {
    "action": {"enum": ["say", "move", "attack", "trade", "wait"]},
    "target": {"type": "string", "maxLength": 12},
    "line": {"type": "string", "maxLength": %d}
  },
  "required": ["action", "target", "line"],
  "additionalProperties": false
})";

struct Npc {
  std::string name;
  llm_session* session = nullptr;
  llm_text_stream* text = nullptr;  // the answer's text: whole UTF-8 characters, ends at end-of-generation
};

struct Mailbox {  // finished answers, produced by workers, consumed by the frame loop
  std::mutex mu;
  std::deque<std::string> lines;
};

std::vector<llm_token> tokenize(const llm_model* m, const std::string& text, uint32_t flags) {
  size_t n = 0;
  llm_tokenize(m, text.data(), text.size(), flags, nullptr, 0, &n);
  std::vector<llm_token> t(n);
  if (llm_tokenize(m, text.data(), text.size(), flags, t.data(), t.size(), &n) != LLM_OK) t.clear();
  return t;
}

// Conversation -> prompt text through the model's own chat template; "" when
// the model has none (LLM_ERR_UNSUPPORTED).
std::string render(const llm_model* m, const std::vector<llm_chat_message>& messages, bool add_generation_prompt) {
  llm_chat_params cp;
  llm_chat_params_init(&cp);
  cp.add_generation_prompt = add_generation_prompt ? 1 : 0;
  size_t len = 0;
  if (llm_chat_render(m, messages.data(), messages.size(), &cp, nullptr, 0, &len) != LLM_ERR_BUFFER_TOO_SMALL)
    return "";
  std::string text(len + 1, '\0');  // + the NUL the call writes
  if (llm_chat_render(m, messages.data(), messages.size(), &cp, &text[0], text.size(), &len) != LLM_OK) return "";
  text.resize(len);
  return text;
}

// The answers are flat objects of string members, and the grammar guarantees
// their shape; this reads {"key": "value", ...} and nothing more.
bool parse_answer(const std::string& json, std::map<std::string, std::string>* out) {
  size_t i = 0;
  auto space = [&] { while (i < json.size() && (json[i] == ' ' || json[i] == '\n' || json[i] == '\t')) ++i; };
  auto string = [&](std::string* s) {
    space();
    if (i >= json.size() || json[i++] != '"') return false;
    for (; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] != '\\') { s->push_back(json[i]); continue; }
      if (++i >= json.size()) return false;
      const char e = json[i];
      if (e == 'u') { s->push_back('?'); i += 4; continue; }  // \uXXXX: not worth decoding here
      s->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e);
    }
    return i++ < json.size();
  };
  space();
  if (i >= json.size() || json[i++] != '{') return false;
  for (;;) {
    std::string key, value;
    if (!string(&key)) return false;
    space();
    if (i >= json.size() || json[i++] != ':') return false;
    if (!string(&value)) return false;
    (*out)[key] = value;
    space();
    if (i < json.size() && json[i] == ',') { ++i; continue; }
    return i < json.size() && json[i] == '}';
  }
}

// One answer of a character: prefill its cue, generate under the grammar
// until the grammar ends (an end-of-generation token), parse the JSON.
std::string act(Npc& npc, const std::vector<llm_token>& cue, const llm_grammar* grammar, int max_tokens,
                uint64_t seed) {
  if (llm_prefill(npc.session, cue.data(), cue.size()) != LLM_OK) return npc.name + ": (" + llm_last_error() + ")";
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 0.7f;
  samp.seed = seed;
  samp.grammar = grammar;  // the prefill above started the grammar over for this session
  llm_text_stream_reset(npc.text);
  std::string json;
  char buf[256];
  size_t len;
  int32_t stopped = 0;
  for (int i = 0; i < max_tokens && !stopped; ++i) {
    llm_token t;
    if (llm_decode_step(npc.session, &samp, &t) != LLM_OK) break;
    if (llm_text_stream_push(npc.text, t, buf, sizeof buf, &len, &stopped) == LLM_OK) json.append(buf, len);
  }
  if (llm_text_stream_flush(npc.text, buf, sizeof buf, &len) == LLM_OK) json.append(buf, len);

  std::map<std::string, std::string> a;
  if (!stopped || !parse_answer(json, &a)) return npc.name + ": (no action: " + json + ")";
  std::string line = npc.name + " -> " + a["action"];
  if (!a["target"].empty()) line += " " + a["target"];
  if (!a["line"].empty()) line += ": \"" + a["line"] + "\"";
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "../shared/models/stories260K.gguf";
  const int turns = argc > 2 ? std::atoi(argv[2]) : 2;
  const int line_chars = argc > 3 ? std::atoi(argv[3]) : 40;
  // Every token adds at least one character, and an escape (6 bytes) counts
  // as one: the grammar ends an answer well within this.
  const int max_tokens = 64 + 6 * (12 + line_chars);

  llm_load_params lp;
  llm_load_params_init(&lp);
  lp.n_threads = 1;  // the parallelism is across characters (worker threads)
  llm_model* model = nullptr;
  if (llm_load(path, &lp, &model) != LLM_OK) {
    std::fprintf(stderr, "npcs: %s\n", llm_last_error());
    return 1;
  }

  // One grammar for all the characters: immutable, shared by the sessions.
  char schema[512];
  std::snprintf(schema, sizeof schema, kSchemaFormat, line_chars);
  llm_grammar* grammar = nullptr;
  if (llm_grammar_from_json_schema(model, schema, &grammar) != LLM_OK) {
    std::fprintf(stderr, "npcs: schema: %s\n", llm_last_error());
    return 1;
  }

  // The shared "system prompt", prefilled once, and each character's cue.
  const char* names[] = {"Lily", "Tom", "Sue", "Max", "Anna", "Ben", "Mia", "Sam"};
  const std::string story = "Once upon a time, in a small village, there lived eight friends who loved to talk.";
  const llm_chat_message system = {"system",
                                    "You play the characters of a village game. Answer with one JSON action: "
                                    "say, move, attack, trade or wait, a target and a short line."};
  std::vector<llm_token> sys;
  std::vector<std::vector<llm_token>> cues(8);
  const std::string sys_text = render(model, {system}, false);
  if (!sys_text.empty()) {
    // Chat model: the cue is what the user's turn adds after the system turn.
    sys = tokenize(model, sys_text, LLM_TOKENIZE_PARSE_SPECIAL);
    for (size_t i = 0; i < cues.size(); ++i) {
      const std::string ask = "You are " + std::string(names[i]) + ". What do you do?";
      const std::string full = render(model, {system, {"user", ask.c_str()}}, true);
      if (full.compare(0, sys_text.size(), sys_text) == 0)
        cues[i] = tokenize(model, full.substr(sys_text.size()), LLM_TOKENIZE_PARSE_SPECIAL);
    }
    std::printf("[chat template of the model]\n");
  } else {
    // No chat template (stories260K): a story the answers continue.
    sys = tokenize(model, story, LLM_TOKENIZE_ADD_BOS);
    for (size_t i = 0; i < cues.size(); ++i) cues[i] = tokenize(model, "\n" + std::string(names[i]) + ":", 0);
    std::printf("[no chat template: plain story prompt]\n");
  }

  llm_session* base = nullptr;
  llm_session_create(model, nullptr, &base);
  if (!base || llm_prefill(base, sys.data(), sys.size()) != LLM_OK) {
    std::fprintf(stderr, "npcs: %s\n", llm_last_error());
    return 1;
  }
  std::vector<Npc> npcs(8);
  for (size_t i = 0; i < npcs.size(); ++i) {
    npcs[i].name = names[i];
    if (cues[i].empty()) {
      std::fprintf(stderr, "npcs: the chat template does not extend the system turn\n");
      return 1;
    }
    if (llm_session_fork(base, &npcs[i].session) != LLM_OK ||
        llm_text_stream_create(model, nullptr, 0, &npcs[i].text) != LLM_OK) {
      std::fprintf(stderr, "npcs: %s\n", llm_last_error());
      return 1;
    }
  }
  llm_session_stats_t st;
  st.struct_size = sizeof st;
  llm_session_stats(base, &st);
  std::printf("[shared prompt: %u tokens in %u KV pages, shared by %zu characters]\n", st.n_tokens, st.kv_pages,
              npcs.size());

  // Workers take characters in turn: worker w serves characters w, w+W, ...
  Mailbox mail;
  std::atomic<int> lines_left{int(npcs.size()) * turns};
  const int n_workers = 2;
  std::vector<std::thread> workers;
  for (int w = 0; w < n_workers; ++w) {
    workers.emplace_back([&, w] {
      for (int turn = 0; turn < turns; ++turn)
        for (size_t i = size_t(w); i < npcs.size(); i += n_workers) {
          std::string line = act(npcs[i], cues[i], grammar, max_tokens, 1000 * i + uint64_t(turn));
          {
            std::lock_guard<std::mutex> lk(mail.mu);
            mail.lines.push_back(std::move(line));
          }
          --lines_left;
        }
    });
  }

  // The game's frame loop: 60 Hz, never blocks on the model.
  using clock = std::chrono::steady_clock;
  const auto frame = std::chrono::microseconds(16667);
  double worst_work_ms = 0;
  long frames = 0;
  auto next = clock::now();
  while (lines_left.load() > 0 || !mail.lines.empty()) {
    const auto t0 = clock::now();
    std::deque<std::string> ready;
    {
      std::unique_lock<std::mutex> lk(mail.mu, std::try_to_lock);  // never wait for a worker
      if (lk.owns_lock()) ready.swap(mail.lines);
    }
    for (const auto& l : ready) std::printf("  %s\n", l.c_str());
    const double work_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    if (work_ms > worst_work_ms) worst_work_ms = work_ms;
    ++frames;
    next += frame;
    std::this_thread::sleep_until(next);
  }
  for (auto& t : workers) t.join();
  std::printf("[%ld frames at 60 Hz; longest frame work %.3f ms (budget 16.667 ms)]\n", frames, worst_work_ms);
  for (auto& n : npcs) {
    llm_text_stream_free(n.text);
    llm_session_free(n.session);
  }
  llm_session_free(base);
  llm_grammar_free(grammar);  // no decode_step uses it any more
  llm_model_free(model);
  return worst_work_ms < 16.667 ? 0 : 1;
}
