// The peer figure for llm-bench's grammar mode: greedy decode speed of
// llama.cpp (through its llama.h) from one prompt, free and under a GBNF
// grammar, in the same way llm-bench measures it (N timed steps; where the
// grammar ends, its EOG token is decoded and the grammar starts over).
// Built against a llama.cpp build beside the project, never committed:
//   g++ -O2 -std=c++17 tests/tools/llamacpp_grammar_bench.cpp -I$LC/include -I$LC/ggml/include \
//       -L$LC_BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$LC_BUILD/bin -o llamacpp_grammar_bench
//   ./llamacpp_grammar_bench MODEL.gguf GRAMMAR.gbnf PROMPT_FILE N THREADS REPS
// PROMPT_FILE holds the prompt text with its special tokens (as llm-run
// --render-chat prints it); the grammar text can come from
// llm_json_schema_to_gbnf, so both engines constrain to the same language.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static std::string slurp(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static void quiet(ggml_log_level, const char*, void*) {}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s MODEL GRAMMAR PROMPT_FILE N THREADS REPS\n", argv[0]);
    return 2;
  }
  const std::string gbnf = slurp(argv[2]), prompt = slurp(argv[3]);
  const int n_gen = std::atoi(argv[4]), threads = std::atoi(argv[5]), reps = std::atoi(argv[6]);
  llama_log_set(quiet, nullptr);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 4096;
  cp.n_threads = cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  std::vector<llama_token> toks(prompt.size() + 16);
  const int n = llama_tokenize(vocab, prompt.data(), int(prompt.size()), toks.data(), int(toks.size()), false, true);
  toks.resize(size_t(n));

  for (int constrained = 0; constrained < 2; ++constrained) {
    llama_sampler* chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    const auto c0 = std::chrono::steady_clock::now();
    if (constrained) llama_sampler_chain_add(chain, llama_sampler_init_grammar(vocab, gbnf.c_str(), "root"));
    const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count();
    llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    std::vector<double> tps;
    for (int r = 0; r <= reps; ++r) {  // the first run is a warm-up
      llama_memory_clear(llama_get_memory(ctx), true);
      llama_sampler_reset(chain);
      if (llama_decode(ctx, llama_batch_get_one(toks.data(), int(toks.size())))) return 1;
      llama_token t = llama_sampler_sample(chain, ctx, -1);  // the prompt's token: TTFT, untimed
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n_gen; ++i) {
        if (constrained && llama_vocab_is_eog(vocab, t)) llama_sampler_reset(chain);  // the grammar starts over
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) return 1;
        t = llama_sampler_sample(chain, ctx, -1);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) tps.push_back(n_gen / s);
    }
    std::sort(tps.begin(), tps.end());
    std::printf("llama.cpp tg%d %s: median %.2f t/s (min %.2f, max %.2f over %d)%s", n_gen,
                constrained ? "+grammar" : "free", tps[tps.size() / 2], tps.front(), tps.back(), reps,
                constrained ? "" : "\n");
    if (constrained) std::printf(", grammar init %.2f ms\n", compile_ms);
    llama_sampler_free(chain);
  }
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
