// Reads ../shared/models/reference/*.json greedy cases for tests.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llm::testing {

inline std::string models_dir() { return LLM_MODELS_DIR; }
inline std::string model_path(const std::string& name) { return models_dir() + "/" + name; }

struct LogitsStep {
  int position = 0;
  int next_token_greedy = 0;
  std::vector<float> logits;
};

struct GreedyCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;
  int max_new_tokens = 0;
  bool stopped_on_bos = false;
  std::string generated_text;
  std::vector<LogitsStep> logits_steps;
  // Reference top1 - top2 logit per generated step (empty if not recorded).
  std::vector<float> margins;
};

inline std::vector<GreedyCase> load_greedy_cases(const std::string& json_name) {
  std::ifstream f(models_dir() + "/reference/" + json_name);
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<GreedyCase> out;
  for (const auto& c : j.at("cases")) {
    GreedyCase g;
    g.prompt = c.at("prompt").get<std::string>();
    g.prompt_ids = c.at("prompt_token_ids").get<std::vector<int32_t>>();
    g.generated_ids = c.at("generated_token_ids").get<std::vector<int32_t>>();
    g.max_new_tokens = c.at("max_new_tokens").get<int>();
    g.stopped_on_bos = c.at("stopped_on_bos").get<bool>();
    g.generated_text = c.at("generated_text").get<std::string>();
    if (c.contains("top1_top2_logit_margin_per_step"))
      g.margins = c.at("top1_top2_logit_margin_per_step").get<std::vector<float>>();
    if (c.contains("logits_first_steps")) {
      for (const auto& s : c.at("logits_first_steps")) {
        LogitsStep st;
        st.position = s.at("position").get<int>();
        st.next_token_greedy = s.at("next_token_greedy").get<int>();
        st.logits = s.at("logits").get<std::vector<float>>();
        g.logits_steps.push_back(std::move(st));
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace llm::testing
