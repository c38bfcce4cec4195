/* story.c: stream a story with the public API only.
 *
 *   story MODEL [PROMPT] [N_TOKENS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

static int fail(const char *what, llm_status st) {
  fprintf(stderr, "story: %s: %s (%s)\n", what, llm_status_string(st), llm_last_error());
  return 1;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "../shared/models/stories260K.gguf";
  const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
  const int n_predict = argc > 3 ? atoi(argv[3]) : 200;

  llm_model *model = NULL;
  llm_status st = llm_load(path, NULL, &model);
  if (st != LLM_OK) return fail("load", st);

  llm_session *session = NULL;
  st = llm_session_create(model, NULL, &session);
  if (st != LLM_OK) {
    llm_model_free(model);
    return fail("session", st);
  }

  /* Ask for the size first, then tokenize into a buffer of that size. */
  size_t n_tokens = 0;
  llm_tokenize(model, prompt, strlen(prompt), LLM_TOKENIZE_ADD_BOS, NULL, 0, &n_tokens);
  llm_token *tokens = malloc(n_tokens * sizeof *tokens);
  if (!tokens) return 1;
  st = llm_tokenize(model, prompt, strlen(prompt), LLM_TOKENIZE_ADD_BOS, tokens, n_tokens, &n_tokens);
  if (st == LLM_OK) st = llm_prefill(session, tokens, n_tokens);
  if (st != LLM_OK) return fail("prefill", st);

  llm_model_properties info;
  info.struct_size = sizeof info;
  llm_model_info(model, &info);

  fputs(prompt, stdout);
  llm_detok_state ds;
  llm_detok_init(&ds, tokens[n_tokens - 1]);
  char text[256];
  size_t len;
  for (int i = 0; i < n_predict; ++i) {
    llm_token t;
    st = llm_decode_step(session, NULL, &t);
    if (st != LLM_OK) return fail("decode", st);
    if (t == info.bos || llm_token_is_eog(model, t)) break; /* stories260K ends a story with BOS */
    if (llm_detok_push(model, &ds, t, text, sizeof text, &len) == LLM_OK) {
      fwrite(text, 1, len, stdout);
      fflush(stdout);
    }
  }
  if (llm_detok_flush(&ds, text, sizeof text, &len) == LLM_OK) fwrite(text, 1, len, stdout);
  putchar('\n');

  llm_session_stats_t stats;
  stats.struct_size = sizeof stats;
  if (llm_session_stats(session, &stats) == LLM_OK)
    fprintf(stderr, "story: TTFT %.2f ms, ITL median %.3f ms, %.1f tokens/s\n", stats.ttft_ms, stats.itl_median_ms,
            stats.gen_tokens_per_s);
  free(tokens);
  llm_session_free(session);
  llm_model_free(model);
  return 0;
}
