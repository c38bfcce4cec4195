/* Takes the address of every function llm.h exports, so a symbol that goes
 * missing from libllm.so fails the link of this test (zstd's tests/symbols.c
 * idea). Compiled as strict C99 (-std=c99 -pedantic -Werror): the public
 * header must stay valid C. tests/abi/check_exports.cmake checks the other
 * direction (nothing exported that the header does not declare). */
#include <llm.h>
#include <stdio.h>

typedef void (*any_fn)(void);

static const any_fn kExports[] = {
  (any_fn)llm_version,
  (any_fn)llm_version_string,
  (any_fn)llm_status_string,
  (any_fn)llm_last_error,
  (any_fn)llm_load_params_init,
  (any_fn)llm_load,
  (any_fn)llm_model_free,
  (any_fn)llm_model_info,
  (any_fn)llm_tokenize,
  (any_fn)llm_token_to_text,
  (any_fn)llm_detokenize,
  (any_fn)llm_token_is_eog,
  (any_fn)llm_detok_init,
  (any_fn)llm_detok_push,
  (any_fn)llm_detok_flush,
  (any_fn)llm_session_params_init,
  (any_fn)llm_session_create,
  (any_fn)llm_session_free,
  (any_fn)llm_session_reset,
  (any_fn)llm_prefill,
  (any_fn)llm_logits,
  (any_fn)llm_sampling_init,
  (any_fn)llm_decode_step,
  (any_fn)llm_decode_batch,
  (any_fn)llm_kv_evict,
  (any_fn)llm_session_stats,
  (any_fn)llm_session_fork,
  (any_fn)llm_session_save,
  (any_fn)llm_session_restore,
  (any_fn)llm_text_stream_create,
  (any_fn)llm_text_stream_push,
  (any_fn)llm_text_stream_flush,
  (any_fn)llm_text_stream_reset,
  (any_fn)llm_text_stream_free,
  (any_fn)llm_chat_params_init,
  (any_fn)llm_chat_render,
  (any_fn)llm_model_chat_template,
  (any_fn)llm_grammar_create,
  (any_fn)llm_grammar_from_json_schema,
  (any_fn)llm_json_schema_to_gbnf,
  (any_fn)llm_grammar_free,
};

int main(void) {
  size_t i;
  size_t n = sizeof(kExports) / sizeof(kExports[0]);
  for (i = 0; i < n; ++i) {
    if (kExports[i] == NULL) {
      fprintf(stderr, "export %u resolved to NULL\n", (unsigned)i);
      return 1;
    }
  }
  /* The header this test was compiled with and the library it runs against agree. */
  if (llm_version() != LLM_VERSION_NUMBER) {
    fprintf(stderr, "llm_version() = %u, header says %u\n", (unsigned)llm_version(), (unsigned)LLM_VERSION_NUMBER);
    return 1;
  }
  printf("%u exported functions resolved\n", (unsigned)n);
  return 0;
}
