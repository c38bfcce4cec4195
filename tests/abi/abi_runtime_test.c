/* Run-time side of the ABI contract of llm.h, through the shared library:
 * versions, status strings, *_init defaults, NULL handling, thread-local
 * last error, and the struct_size rule (the library reads and writes only
 * min(struct_size, its sizeof) bytes), which is what lets old binaries keep
 * working when a struct grows. Plain C99; exits non-zero on the first failure. */
#include <llm.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef LLM_MODELS_DIR
#error "LLM_MODELS_DIR must be defined"
#endif

static int g_failures = 0;

#define EXPECT(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      fprintf(stderr, "%s:%d: EXPECT(%s) failed (last error: %s)\n", __FILE__,      \
              __LINE__, #cond, llm_last_error());                                   \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

static const llm_token kPrompt[] = {1, 403, 407, 261, 378}; /* "Once upon a time" */
static const llm_token kFirstGreedy = 432;                  /* reference/stories260K_greedy.json case 0 */

static void test_versions(void) {
  char want[32];
  EXPECT(llm_version() == LLM_VERSION_NUMBER);
  sprintf(want, "%d.%d.%d", LLM_VERSION_MAJOR, LLM_VERSION_MINOR, LLM_VERSION_PATCH);
  EXPECT(llm_version_string() != NULL && strcmp(llm_version_string(), want) == 0);
}

static void test_status_strings(void) {
  static const llm_status all[] = {LLM_OK, LLM_ERR_INVALID_ARGUMENT, LLM_ERR_OUT_OF_MEMORY, LLM_ERR_IO,
                                   LLM_ERR_FORMAT, LLM_ERR_CHECKSUM, LLM_ERR_UNSUPPORTED, LLM_ERR_DEVICE,
                                   LLM_ERR_CONTEXT_FULL, LLM_ERR_CANCELLED, LLM_ERR_BUFFER_TOO_SMALL,
                                   LLM_ERR_INTERNAL};
  size_t n = sizeof(all) / sizeof(all[0]), i, j;
  for (i = 0; i < n; ++i) {
    const char *s = llm_status_string(all[i]);
    EXPECT(s != NULL && s[0] != '\0');
    for (j = 0; j < i; ++j) EXPECT(s != NULL && strcmp(s, llm_status_string(all[j])) != 0);
  }
  EXPECT(strstr(llm_status_string(LLM_ERR_FORMAT), "LLM_ERR_FORMAT") != NULL);
  EXPECT(llm_status_string((llm_status)12345) != NULL); /* unknown values still get a string */
}

static void test_init_and_null(void) {
  llm_load_params lp;
  llm_session_params sp;
  llm_sampling sa;
  llm_detok_state ds;
  memset(&lp, 0xAB, sizeof lp);
  memset(&sp, 0xAB, sizeof sp);
  memset(&sa, 0xAB, sizeof sa);
  memset(&ds, 0xAB, sizeof ds);
  llm_load_params_init(&lp);
  llm_session_params_init(&sp);
  llm_sampling_init(&sa);
  llm_detok_init(&ds, -1);
  EXPECT(lp.struct_size == sizeof lp);
  EXPECT(lp.device == LLM_DEVICE_AUTO && lp.n_threads == 0 && lp.flags == 0);
  EXPECT(lp.progress == NULL && lp.log == NULL);
  EXPECT(sp.struct_size == sizeof sp && sp.kv_type == LLM_KV_F16 && sp.n_sink == 4 && sp.cancel == NULL);
  EXPECT(sa.struct_size == sizeof sa && sa.temperature <= 0.0f && sa.repeat_last_n == 64);
  EXPECT(ds.prev_token == -1 && ds.n_pending == 0);
  /* NULL is a no-op for every *_init and *_free. */
  llm_load_params_init(NULL);
  llm_session_params_init(NULL);
  llm_sampling_init(NULL);
  llm_model_free(NULL);
  llm_session_free(NULL);
  /* An empty batch may pass NULL arrays; a non-empty one may not. */
  EXPECT(llm_decode_batch(NULL, 0, NULL, NULL) == LLM_OK);
  EXPECT(llm_decode_batch(NULL, 2, NULL, NULL) == LLM_ERR_INVALID_ARGUMENT);
}

static void *read_last_error(void *out) {
  const char *e = llm_last_error();
  *(int *)out = (e != NULL && e[0] == '\0');
  return NULL;
}

static void test_errors_and_thread_local_last_error(void) {
  llm_model *m = (llm_model *)&g_failures; /* must be reset to NULL on failure */
  pthread_t t;
  int fresh_thread_empty = 0;
  EXPECT(llm_load(NULL, NULL, &m) == LLM_ERR_INVALID_ARGUMENT);
  EXPECT(m == NULL);
  EXPECT(llm_load(LLM_MODELS_DIR "/stories260K.gguf", NULL, NULL) == LLM_ERR_INVALID_ARGUMENT);
  m = (llm_model *)&g_failures;
  EXPECT(llm_load(LLM_MODELS_DIR "/no-such-model.gguf", NULL, &m) == LLM_ERR_IO);
  EXPECT(m == NULL);
  EXPECT(llm_last_error() != NULL && llm_last_error()[0] != '\0');
  /* The detail is per thread: a thread that never failed sees "". */
  EXPECT(pthread_create(&t, NULL, read_last_error, &fresh_thread_empty) == 0);
  pthread_join(t, NULL);
  EXPECT(fresh_thread_empty);
  EXPECT(llm_last_error()[0] != '\0'); /* and ours is still there */
}

/* A caller compiled against an older, shorter llm_load_params: only
 * struct_size and device exist. Whatever follows in memory is garbage
 * (0xFF: a callback pointer there would crash, VOCAB_ONLY would be set) and
 * must be ignored in favour of defaults. */
static llm_model *load_with_short_params(void) {
  unsigned char raw[sizeof(llm_load_params) + 16];
  llm_load_params *p = (llm_load_params *)(void *)raw;
  llm_model *m = NULL;
  memset(raw, 0xFF, sizeof raw);
  p->struct_size = (uint32_t)(offsetof(llm_load_params, device) + sizeof(p->device));
  p->device = LLM_DEVICE_CPU;
  EXPECT(llm_load(LLM_MODELS_DIR "/stories260K.gguf", p, &m) == LLM_OK);
  return m;
}

static void test_struct_size_rule(void) {
  llm_model *m = load_with_short_params();
  llm_session *s = NULL, *s2 = NULL;
  llm_token tok = -1;
  unsigned char raw[sizeof(llm_model_properties) + 16];
  llm_model_properties *info = (llm_model_properties *)(void *)raw;
  llm_session_stats_t stats;
  size_t i, short_size;
  struct {
    llm_sampling s;
    uint64_t future_field; /* a newer caller's struct: larger than the library's */
  } newer;
  if (m == NULL) return;

  /* Output struct from an older caller: nothing past struct_size is written. */
  short_size = offsetof(llm_model_properties, n_layers);
  memset(raw, 0xCD, sizeof raw);
  info->struct_size = (uint32_t)short_size;
  EXPECT(llm_model_info(m, info) == LLM_OK);
  EXPECT(info->vocab_size == 512 && info->bos == 1 && info->eos == 2);
  for (i = short_size; i < sizeof raw; ++i) EXPECT(raw[i] == 0xCD);
  memset(raw, 0, sizeof raw);
  info->struct_size = sizeof(llm_model_properties);
  EXPECT(llm_model_info(m, info) == LLM_OK);
  EXPECT(info->n_layers == 5 && info->dim == 64 && info->n_heads == 8 && info->n_kv_heads == 4);
  EXPECT(strcmp(info->architecture, "llama") == 0);
  EXPECT(info->device == LLM_DEVICE_CPU);

  /* The short load params did not make the model vocab-only. */
  EXPECT(llm_session_create(m, NULL, &s) == LLM_OK);
  if (s != NULL) {
    EXPECT(llm_prefill(s, kPrompt, sizeof kPrompt / sizeof kPrompt[0]) == LLM_OK);
    memset(&newer, 0, sizeof newer);
    llm_sampling_init(&newer.s);
    newer.s.struct_size = (uint32_t)sizeof newer;
    EXPECT(llm_decode_step(s, &newer.s, &tok) == LLM_OK);
    EXPECT(tok == kFirstGreedy);
    /* llm_decode_batch reads the same larger sampling struct. */
    EXPECT(llm_session_create(m, NULL, &s2) == LLM_OK);
    if (s2 != NULL) {
      EXPECT(llm_prefill(s2, kPrompt, sizeof kPrompt / sizeof kPrompt[0]) == LLM_OK);
      tok = -1;
      EXPECT(llm_decode_batch(&s2, 1, &newer.s, &tok) == LLM_OK);
      EXPECT(tok == kFirstGreedy);
      llm_session_free(s2);
    }

    memset(&stats, 0xCD, sizeof stats);
    stats.struct_size = (uint32_t)offsetof(llm_session_stats_t, n_generated);
    EXPECT(llm_session_stats(s, &stats) == LLM_OK);
    EXPECT(stats.n_tokens == 6 && stats.n_prompt == 5);
    EXPECT(stats.n_generated == 0xCDCDCDCDu); /* past struct_size: untouched */
    llm_session_free(s);
  }
  llm_model_free(m);
}

int main(void) {
  test_versions();
  test_status_strings();
  test_init_and_null();
  test_errors_and_thread_local_last_error();
  test_struct_size_rule();
  if (g_failures != 0) {
    fprintf(stderr, "%d ABI expectation(s) failed\n", g_failures);
    return 1;
  }
  printf("ABI run-time contract holds\n");
  return 0;
}
