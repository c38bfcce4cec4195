/* An outside program linked against an installed libllm: checks the run-time
 * version against the installed header, that the library it loaded is the
 * installed one (not the build tree's), and generates a few greedy tokens of
 * stories260K, which must match the reference continuation.
 * usage: llm_consumer MODEL EXPECTED_LIB_DIR_PREFIX */
#include <llm.h>

#include <stdio.h>
#include <string.h>

static int loaded_from(const char *prefix) {
  char line[4096];
  int found = 0;
  FILE *maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) return 1; /* no /proc: cannot check, do not fail */
  while (fgets(line, sizeof line, maps) != NULL) {
    const char *path = strchr(line, '/');
    if (path == NULL || strstr(path, "libllm.so") == NULL) continue;
    printf("libllm mapped from %s", path);
    found = strncmp(path, prefix, strlen(prefix)) == 0;
    break;
  }
  fclose(maps);
  return found;
}

int main(int argc, char **argv) {
  static const llm_token kWant[] = {432, 383, 286, 261, 376, 298, 315, 421}; /* ", there was a little girl named" */
  llm_model *model = NULL;
  llm_session *session = NULL;
  llm_load_params lp;
  llm_token prompt[16];
  size_t n_prompt = 0, i;
  char text[256];
  size_t len = 0;
  llm_token out[8];
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL EXPECTED_LIB_PREFIX\n", argv[0]);
    return 2;
  }
  printf("libllm %s (header %d.%d.%d)\n", llm_version_string(), LLM_VERSION_MAJOR, LLM_VERSION_MINOR,
         LLM_VERSION_PATCH);
  if (llm_version() != LLM_VERSION_NUMBER) {
    fprintf(stderr, "version mismatch: library %u, header %d\n", (unsigned)llm_version(), LLM_VERSION_NUMBER);
    return 1;
  }
  if (!loaded_from(argv[2])) {
    fprintf(stderr, "libllm was not loaded from %s\n", argv[2]);
    return 1;
  }
  llm_load_params_init(&lp);
  lp.device = LLM_DEVICE_CPU;
  if (llm_load(argv[1], &lp, &model) != LLM_OK ||
      llm_tokenize(model, "Once upon a time", 16, LLM_TOKENIZE_ADD_BOS, prompt, 16, &n_prompt) != LLM_OK ||
      llm_session_create(model, NULL, &session) != LLM_OK || llm_prefill(session, prompt, n_prompt) != LLM_OK) {
    fprintf(stderr, "setup failed: %s\n", llm_last_error());
    llm_model_free(model);
    return 1;
  }
  for (i = 0; i < 8; ++i) {
    if (llm_decode_step(session, NULL, &out[i]) != LLM_OK) {
      fprintf(stderr, "decode failed: %s\n", llm_last_error());
      return 1;
    }
  }
  if (llm_detokenize(model, out, 8, text, sizeof text - 1, &len) != LLM_OK) {
    fprintf(stderr, "detokenize failed: %s\n", llm_last_error());
    return 1;
  }
  text[len] = '\0';
  printf("Once upon a time%s\n", text);
  llm_session_free(session);
  llm_model_free(model);
  if (memcmp(out, kWant, sizeof kWant) != 0) {
    fprintf(stderr, "generated tokens differ from the reference\n");
    return 1;
  }
  return 0;
}
