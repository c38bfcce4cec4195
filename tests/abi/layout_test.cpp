// Pins the binary layout of every public struct and the value of every
// public constant of llm.h. These are ABI: bindings in other languages
// (bindings/) hard-code the same offsets. A failing static_assert here means
// a change broke compiled callers: add new fields at the end of a struct and
// new constants with new values instead. Values are for x86-64 / LP64.
#include <llm.h>

#include <cstddef>
#include <cstdio>

#define PIN_OFFSET(type, field, value) static_assert(offsetof(type, field) == (value), #type "." #field " moved")
#define PIN_SIZE(type, value) static_assert(sizeof(type) == (value), "sizeof(" #type ") changed")

#if defined(__x86_64__) || defined(_M_X64) || (defined(__aarch64__) && defined(__LP64__))

PIN_SIZE(llm_token, 4);
PIN_SIZE(llm_status, 4);
PIN_SIZE(llm_device, 4);
PIN_SIZE(llm_log_level, 4);
PIN_SIZE(llm_kv_type, 4);

PIN_OFFSET(llm_load_params, struct_size, 0);
PIN_OFFSET(llm_load_params, device, 4);
PIN_OFFSET(llm_load_params, n_threads, 8);
PIN_OFFSET(llm_load_params, flags, 12);
PIN_OFFSET(llm_load_params, progress, 16);
PIN_OFFSET(llm_load_params, progress_user_data, 24);
PIN_OFFSET(llm_load_params, log, 32);
PIN_OFFSET(llm_load_params, log_user_data, 40);
PIN_OFFSET(llm_load_params, kv_budget_bytes, 48);
PIN_OFFSET(llm_load_params, kv_page_tokens, 56);
PIN_SIZE(llm_load_params, 64);

PIN_OFFSET(llm_model_properties, struct_size, 0);
PIN_OFFSET(llm_model_properties, vocab_size, 4);
PIN_OFFSET(llm_model_properties, context_length, 8);
PIN_OFFSET(llm_model_properties, bos, 12);
PIN_OFFSET(llm_model_properties, eos, 16);
PIN_OFFSET(llm_model_properties, n_layers, 20);
PIN_OFFSET(llm_model_properties, dim, 24);
PIN_OFFSET(llm_model_properties, hidden_dim, 28);
PIN_OFFSET(llm_model_properties, n_heads, 32);
PIN_OFFSET(llm_model_properties, n_kv_heads, 36);
PIN_OFFSET(llm_model_properties, head_dim, 40);
PIN_OFFSET(llm_model_properties, device, 44);
PIN_OFFSET(llm_model_properties, n_params, 48);
PIN_OFFSET(llm_model_properties, weight_bytes, 56);
PIN_OFFSET(llm_model_properties, architecture, 64);
PIN_OFFSET(llm_model_properties, weight_type, 96);
PIN_SIZE(llm_model_properties, 112);
static_assert(sizeof(((llm_model_properties *)0)->architecture) == 32, "architecture length changed");
static_assert(sizeof(((llm_model_properties *)0)->weight_type) == 16, "weight_type length changed");

PIN_OFFSET(llm_detok_state, struct_size, 0);
PIN_OFFSET(llm_detok_state, prev_token, 4);
PIN_OFFSET(llm_detok_state, n_pending, 8);
PIN_OFFSET(llm_detok_state, pending, 12);
PIN_SIZE(llm_detok_state, 16);

PIN_OFFSET(llm_session_params, struct_size, 0);
PIN_OFFSET(llm_session_params, max_tokens, 4);
PIN_OFFSET(llm_session_params, window, 8);
PIN_OFFSET(llm_session_params, n_sink, 12);
PIN_OFFSET(llm_session_params, kv_type, 16);
PIN_OFFSET(llm_session_params, cancel, 24);
PIN_OFFSET(llm_session_params, cancel_user_data, 32);
PIN_SIZE(llm_session_params, 40);

PIN_OFFSET(llm_sampling, struct_size, 0);
PIN_OFFSET(llm_sampling, temperature, 4);
PIN_OFFSET(llm_sampling, top_k, 8);
PIN_OFFSET(llm_sampling, top_p, 12);
PIN_OFFSET(llm_sampling, min_p, 16);
PIN_OFFSET(llm_sampling, repeat_penalty, 20);
PIN_OFFSET(llm_sampling, seed, 24);
PIN_OFFSET(llm_sampling, repeat_last_n, 32);
PIN_OFFSET(llm_sampling, grammar, 40);
PIN_SIZE(llm_sampling, 48);

PIN_OFFSET(llm_session_stats_t, struct_size, 0);
PIN_OFFSET(llm_session_stats_t, n_tokens, 4);
PIN_OFFSET(llm_session_stats_t, n_cached, 8);
PIN_OFFSET(llm_session_stats_t, n_prompt, 12);
PIN_OFFSET(llm_session_stats_t, n_generated, 16);
PIN_OFFSET(llm_session_stats_t, kv_pages, 20);
PIN_OFFSET(llm_session_stats_t, kv_bytes, 24);
PIN_OFFSET(llm_session_stats_t, ttft_ms, 32);
PIN_OFFSET(llm_session_stats_t, itl_median_ms, 40);
PIN_OFFSET(llm_session_stats_t, itl_p95_ms, 48);
PIN_OFFSET(llm_session_stats_t, prompt_tokens_per_s, 56);
PIN_OFFSET(llm_session_stats_t, gen_tokens_per_s, 64);
PIN_OFFSET(llm_session_stats_t, n_evicted, 72);
PIN_SIZE(llm_session_stats_t, 80);

#endif

// Constants are ABI on every platform.
static_assert(LLM_OK == 0, "status value changed");
static_assert(LLM_ERR_INVALID_ARGUMENT == 1, "status value changed");
static_assert(LLM_ERR_OUT_OF_MEMORY == 2, "status value changed");
static_assert(LLM_ERR_IO == 3, "status value changed");
static_assert(LLM_ERR_FORMAT == 4, "status value changed");
static_assert(LLM_ERR_CHECKSUM == 5, "status value changed");
static_assert(LLM_ERR_UNSUPPORTED == 6, "status value changed");
static_assert(LLM_ERR_DEVICE == 7, "status value changed");
static_assert(LLM_ERR_CONTEXT_FULL == 8, "status value changed");
static_assert(LLM_ERR_CANCELLED == 9, "status value changed");
static_assert(LLM_ERR_BUFFER_TOO_SMALL == 10, "status value changed");
static_assert(LLM_ERR_INTERNAL == 99, "status value changed");
static_assert(LLM_DEVICE_AUTO == 0 && LLM_DEVICE_CPU == 1 && LLM_DEVICE_CUDA == 2, "device value changed");
static_assert(LLM_LOG_DEBUG == 0 && LLM_LOG_INFO == 1 && LLM_LOG_WARN == 2 && LLM_LOG_ERROR == 3, "log level changed");
static_assert(LLM_KV_F16 == 0 && LLM_KV_F32 == 1 && LLM_KV_INT8 == 2 && LLM_KV_INT4 == 3, "kv type changed");
static_assert(LLM_LOAD_VOCAB_ONLY == 1u && LLM_LOAD_REFERENCE_MATH == 2u && LLM_LOAD_NO_HUGE_PAGES == 4u,
              "load flag changed");
static_assert(LLM_TOKENIZE_ADD_BOS == 1u && LLM_TOKENIZE_PARSE_SPECIAL == 2u, "tokenize flag changed");
static_assert(LLM_VERSION_NUMBER == LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH,
              "version number formula changed");

int main() {
  std::printf("llm.h layout pinned (header %d.%d.%d)\n", LLM_VERSION_MAJOR, LLM_VERSION_MINOR, LLM_VERSION_PATCH);
  return 0;
}
