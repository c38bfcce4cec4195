/* endless_story.c: generate forever in a bounded KV cache.
 *
 * The session has a sliding window with attention sinks: when the cache is
 * full, the oldest tokens after the first n_sink are evicted (their keys are
 * re-rotated), so memory stays constant however long the story runs.
 *
 *   endless_story MODEL [N_TOKENS (0 = forever)] [WINDOW] [SEED]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "../shared/models/stories260K.gguf";
  const long n_tokens = argc > 2 ? atol(argv[2]) : 0;
  const unsigned window = argc > 3 ? (unsigned)atoi(argv[3]) : 128;
  const unsigned long long seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 42;

  llm_model *model = NULL;
  llm_status st = llm_load(path, NULL, &model);
  if (st != LLM_OK) {
    fprintf(stderr, "endless_story: %s (%s)\n", llm_status_string(st), llm_last_error());
    return 1;
  }
  llm_session_params sp;
  llm_session_params_init(&sp);
  sp.window = window; /* tokens kept in the cache */
  sp.n_sink = 4;      /* the first tokens always stay: attention sinks */
  llm_session *s = NULL;
  st = llm_session_create(model, &sp, &s);
  if (st != LLM_OK) {
    fprintf(stderr, "endless_story: %s (%s)\n", llm_status_string(st), llm_last_error());
    llm_model_free(model);
    return 1;
  }
  llm_model_properties info;
  info.struct_size = sizeof info;
  llm_model_info(model, &info);

  llm_token bos = info.bos;
  st = llm_prefill(s, &bos, 1);
  llm_sampling samp;
  llm_sampling_init(&samp);
  samp.temperature = 0.8f;
  samp.top_p = 0.95f;
  samp.seed = seed;

  llm_detok_state ds;
  llm_detok_init(&ds, bos);
  char buf[256];
  size_t len;
  llm_session_stats_t stats;
  stats.struct_size = sizeof stats;
  uint64_t kv_bytes_max = 0;
  for (long i = 0; st == LLM_OK && (n_tokens == 0 || i < n_tokens); ++i) {
    llm_token t;
    st = llm_decode_step(s, &samp, &t);
    if (st != LLM_OK) break;
    if (t == info.bos || llm_token_is_eog(model, t)) {
      /* A story ended: start a new paragraph and keep going in the same cache. */
      fputs("\n\n", stdout);
      llm_detok_init(&ds, info.bos);
      continue;
    }
    if (llm_detok_push(model, &ds, t, buf, sizeof buf, &len) == LLM_OK) fwrite(buf, 1, len, stdout);
    if (llm_session_stats(s, &stats) == LLM_OK && stats.kv_bytes > kv_bytes_max) kv_bytes_max = stats.kv_bytes;
  }
  fflush(stdout);
  llm_session_stats(s, &stats);
  fprintf(stderr, "\nendless_story: %u tokens generated, %u evicted, KV cache %u tokens / %llu bytes (max %llu)\n",
          stats.n_generated, stats.n_evicted, stats.n_cached, (unsigned long long)stats.kv_bytes,
          (unsigned long long)kv_bytes_max);
  llm_session_free(s);
  llm_model_free(model);
  if (st != LLM_OK) {
    fprintf(stderr, "endless_story: %s (%s)\n", llm_status_string(st), llm_last_error());
    return 1;
  }
  return 0;
}
