/* chat.c: a streaming conversation loop over one session.
 *
 * Each line read from stdin is appended to the same session (the KV cache
 * keeps the conversation, so only the new text is prefilled) and the model's
 * continuation streams back. TTFT and inter-token latency are printed after
 * each reply.
 *
 *   chat MODEL [MAX_REPLY_TOKENS] < lines
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

static void report(const char *what, llm_status st) {
  fprintf(stderr, "chat: %s: %s (%s)\n", what, llm_status_string(st), llm_last_error());
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "../shared/models/stories260K.gguf";
  const int max_reply = argc > 2 ? atoi(argv[2]) : 64;
  llm_model *model = NULL;
  llm_status st = llm_load(path, NULL, &model);
  if (st != LLM_OK) {
    report("load", st);
    return 1;
  }
  llm_session *s = NULL;
  if ((st = llm_session_create(model, NULL, &s)) != LLM_OK) {
    report("session", st);
    llm_model_free(model);
    return 1;
  }
  llm_model_properties info;
  info.struct_size = sizeof info;
  llm_model_info(model, &info);

  char line[4096];
  int turn = 0;
  llm_token *toks = NULL;
  size_t cap = 0;
  while (fgets(line, sizeof line, stdin)) {
    size_t n_line = strcspn(line, "\n");
    line[n_line] = '\0';
    if (n_line == 0) continue;
    /* The first turn starts the sequence with BOS. */
    const uint32_t flags = turn == 0 ? LLM_TOKENIZE_ADD_BOS : 0;
    size_t n = 0;
    st = llm_tokenize(model, line, n_line, flags, toks, cap, &n);
    if (st == LLM_ERR_BUFFER_TOO_SMALL) {
      llm_token *grown = realloc(toks, n * sizeof *toks);
      if (!grown) break;
      toks = grown;
      cap = n;
      st = llm_tokenize(model, line, n_line, flags, toks, cap, &n);
    }
    if (st == LLM_OK) st = llm_prefill(s, toks, n);
    if (st != LLM_OK) {
      report("prefill", st);
      break;
    }
    printf("> %s\n", line);
    llm_detok_state ds;
    llm_detok_init(&ds, toks[n - 1]);
    char buf[256];
    size_t len;
    for (int i = 0; i < max_reply; ++i) {
      llm_token t;
      if ((st = llm_decode_step(s, NULL, &t)) != LLM_OK) {
        report("decode", st);
        break;
      }
      if (t == info.bos || llm_token_is_eog(model, t)) break;
      if (llm_detok_push(model, &ds, t, buf, sizeof buf, &len) == LLM_OK) {
        fwrite(buf, 1, len, stdout);
        fflush(stdout);
      }
    }
    llm_session_stats_t stats;
    stats.struct_size = sizeof stats;
    llm_session_stats(s, &stats);
    printf("\n[turn %d: TTFT %.2f ms, ITL median %.3f ms, p95 %.3f ms, %u tokens in context]\n", ++turn,
           stats.ttft_ms, stats.itl_median_ms, stats.itl_p95_ms, stats.n_tokens);
  }
  free(toks);
  llm_session_free(s);
  llm_model_free(model);
  return st == LLM_OK ? 0 : 1;
}
