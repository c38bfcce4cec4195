// llm-run: generate text from a model with the public API, streaming it to
// stdout; timing figures go to stderr at the end.
//
//   llm-run -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]
//           [--repeat-penalty R] [--seed S] [--threads N] [--device auto|cpu|cuda]
//           [--kv f16|f32|int8|int4] [--window W --sink S] [--exact] [--ignore-eos]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llm.h"

static void usage() {
  std::fprintf(stderr,
               "usage: llm-run -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
               "               [--repeat-penalty R] [--seed S] [--threads N] [--device auto|cpu|cuda]\n"
               "               [--kv f16|f32|int8|int4] [--window W] [--sink S] [--exact] [--ignore-eos]\n");
}

static int die(llm_status st, const char* what) {
  std::fprintf(stderr, "llm-run: %s: %s (%s)\n", what, llm_status_string(st), llm_last_error());
  return 1;
}

int main(int argc, char** argv) {
  std::string model_path, prompt;
  int n_predict = 128;
  bool ignore_eos = false;
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
  if (model_path.empty()) {
    usage();
    return 2;
  }

  llm_model* model = nullptr;
  llm_status st = llm_load(model_path.c_str(), &lp, &model);
  if (st != LLM_OK) return die(st, "load");
  llm_session* session = nullptr;
  st = llm_session_create(model, &sp, &session);
  if (st != LLM_OK) {
    llm_model_free(model);
    return die(st, "session");
  }

  size_t n_tok = 0;
  llm_tokenize(model, prompt.data(), prompt.size(), LLM_TOKENIZE_ADD_BOS, nullptr, 0, &n_tok);
  std::vector<llm_token> toks(n_tok);
  st = llm_tokenize(model, prompt.data(), prompt.size(), LLM_TOKENIZE_ADD_BOS, toks.data(), toks.size(), &n_tok);
  if (st == LLM_OK) st = llm_prefill(session, toks.data(), toks.size());
  if (st != LLM_OK) {
    llm_session_free(session);
    llm_model_free(model);
    return die(st, "prefill");
  }
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);

  llm_detok_state ds;
  llm_detok_init(&ds, toks.empty() ? -1 : toks.back());
  llm_model_properties info;
  info.struct_size = sizeof info;
  llm_model_info(model, &info);
  char buf[512];
  for (int i = 0; i < n_predict; ++i) {
    llm_token t;
    st = llm_decode_step(session, &samp, &t);
    if (st != LLM_OK) {
      std::fprintf(stderr, "\n");
      die(st, "decode");
      break;
    }
    if (!ignore_eos && (llm_token_is_eog(model, t) || t == info.bos)) break;
    size_t len = 0;
    if (llm_detok_push(model, &ds, t, buf, sizeof buf, &len) == LLM_OK) {
      std::fwrite(buf, 1, len, stdout);
      std::fflush(stdout);
    }
  }
  size_t len = 0;
  if (llm_detok_flush(&ds, buf, sizeof buf, &len) == LLM_OK) std::fwrite(buf, 1, len, stdout);
  std::printf("\n");

  llm_session_stats_t stats;
  stats.struct_size = sizeof stats;
  llm_session_stats(session, &stats);
  std::fprintf(stderr,
               "llm-run: prompt %u tokens, generated %u tokens\n"
               "llm-run: TTFT %.2f ms | ITL median %.3f ms, p95 %.3f ms | prompt %.1f tok/s | generation %.1f tok/s\n",
               stats.n_prompt, stats.n_generated, stats.ttft_ms, stats.itl_median_ms, stats.itl_p95_ms,
               stats.prompt_tokens_per_s, stats.gen_tokens_per_s);
  llm_session_free(session);
  llm_model_free(model);
  return 0;
}
