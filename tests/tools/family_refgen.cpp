// Reference logits for the model-family tests (tests/data/families/), computed with
// llama.cpp's public C API (libllama).
//
// For each prompt (one per line in PROMPTS: token ids separated by spaces or commas)
// it clears the memory, runs ONE llama_decode of the whole prompt with logits
// requested at every position, then continues greedily for N_GEN steps (argmax,
// lowest id on ties, no stop on end-of-generation tokens), one single-token
// llama_decode per step. It prints one JSON object to stdout:
//   {"n_vocab": V, "cases": [{"prompt_token_ids": [...], "prompt_logits": [[V] x len],
//     "generated_token_ids": [N_GEN], "generated_logits": [[V] x N_GEN]}, ...]}
// where generated_logits[k] are the logits after feeding generated_token_ids[k].
// Floats are printed with %.9g (exact float32 round trip).
//
// Settings: CPU only (n_gpu_layers 0), n_ctx = n_batch = n_ubatch = 512, one sequence,
// F32 K and V cache, flash attention disabled, full-size SWA cache, THREADS threads.
//
// usage: family_refgen MODEL.gguf PROMPTS [N_GEN=32] [THREADS=2]
//
// build (LLAMA_SRC = llama.cpp source tree, LLAMA_BUILD = its cmake build dir with
// libllama.so and libggml*.so in bin/):
//   g++ -std=c++17 -O2 -o family_refgen tests/tools/family_refgen.cpp \
//       -I$LLAMA_SRC/include -I$LLAMA_SRC/ggml/include \
//       -L$LLAMA_BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA_BUILD/bin
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static void quiet_log(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static std::vector<std::vector<llama_token>> read_prompts(const char* path) {
  std::vector<std::vector<llama_token>> out;
  std::ifstream in(path);
  if (!in) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
  std::string line;
  while (std::getline(in, line)) {
    for (char& c : line) if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream ss(line);
    std::vector<llama_token> ids;
    long v;
    while (ss >> v) ids.push_back((llama_token)v);
    if (!ids.empty()) out.push_back(ids);
  }
  return out;
}

static void print_row(const float* lg, int n) {
  putchar('[');
  for (int i = 0; i < n; ++i) printf(i ? ",%.9g" : "%.9g", lg[i]);
  putchar(']');
}

static llama_token argmax(const float* lg, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) if (lg[i] > lg[best]) best = i;  // strict: lowest id wins ties
  return best;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: family_refgen MODEL.gguf PROMPTS [N_GEN=32] [THREADS=2]\n");
    return 2;
  }
  const int n_gen = argc > 3 ? atoi(argv[3]) : 32;
  const int threads = argc > 4 ? atoi(argv[4]) : 2;
  const int n_ctx = 512;

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { fprintf(stderr, "load failed: %s\n", argv[1]); return 1; }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = n_ctx;
  cp.n_batch = n_ctx;
  cp.n_ubatch = n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = true;
  cp.embeddings = false;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { fprintf(stderr, "context creation failed\n"); return 1; }

  const auto prompts = read_prompts(argv[2]);
  printf("{\"n_vocab\": %d, \"cases\": [\n", n_vocab);
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const auto& p = prompts[pi];
    const int n = (int)p.size();
    if (n + n_gen > n_ctx) { fprintf(stderr, "prompt %zu too long\n", pi); return 1; }
    llama_memory_clear(llama_get_memory(ctx), true);

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
      batch.token[i] = p[i];
      batch.pos[i] = i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch)) { fprintf(stderr, "prompt decode failed\n"); return 1; }
    llama_batch_free(batch);

    printf("%s{\"prompt_token_ids\": [", pi ? ",\n" : "");
    for (int i = 0; i < n; ++i) printf(i ? ",%d" : "%d", p[i]);
    printf("],\n\"prompt_logits\": [");
    for (int i = 0; i < n; ++i) {
      if (i) printf(",\n");
      print_row(llama_get_logits_ith(ctx, i), n_vocab);
    }
    printf("],\n");

    std::vector<llama_token> gen;
    std::vector<std::vector<float>> gen_logits;
    llama_token next = argmax(llama_get_logits_ith(ctx, n - 1), n_vocab);
    llama_batch one = llama_batch_init(1, 0, 1);
    for (int k = 0; k < n_gen; ++k) {
      gen.push_back(next);
      one.token[0] = next;
      one.pos[0] = n + k;
      one.n_seq_id[0] = 1;
      one.seq_id[0][0] = 0;
      one.logits[0] = 1;
      one.n_tokens = 1;
      if (llama_decode(ctx, one)) { fprintf(stderr, "decode failed at step %d\n", k); return 1; }
      const float* lg = llama_get_logits_ith(ctx, 0);
      gen_logits.emplace_back(lg, lg + n_vocab);
      next = argmax(lg, n_vocab);
    }
    llama_batch_free(one);

    printf("\"generated_token_ids\": [");
    for (int k = 0; k < n_gen; ++k) printf(k ? ",%d" : "%d", gen[k]);
    printf("],\n\"generated_logits\": [");
    for (int k = 0; k < n_gen; ++k) {
      if (k) printf(",\n");
      print_row(gen_logits[k].data(), n_vocab);
    }
    printf("]}");
  }
  printf("\n]}\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
