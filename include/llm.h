/*
 * llm.h — the public C API of libllm, an embeddable LLM inference engine.
 *
 * This header is the whole published API. It compiles as C99 and as C++.
 *
 * Conventions
 * -----------
 * - Every fallible call returns an llm_status. LLM_OK is 0. On failure the
 *   calling thread's llm_last_error() holds a human-readable detail.
 * - Nothing but a status crosses this boundary: the library never throws,
 *   aborts, exits or prints. Diagnostics go to the log callback of
 *   llm_load_params.
 * - Objects are opaque handles. Constructors return a status and the object
 *   through an out-parameter; every *_free accepts NULL as a no-op.
 * - Parameter structs start with `uint32_t struct_size` (the size the caller
 *   compiled against), are passed by pointer, get their defaults from an
 *   *_init function, and only ever grow at the end. The library reads
 *   min(struct_size, its own sizeof) bytes and treats the rest as defaults.
 * - Strings and token arrays go into caller buffers with a capacity. A buffer
 *   that is too small returns LLM_ERR_BUFFER_TOO_SMALL and the size needed.
 *
 * Threads
 * -------
 * An llm_model is immutable after llm_load and may be used from any number
 * of threads at once (tokenize, detokenize, session creation, info).
 * An llm_session belongs to one thread at a time; different sessions of the
 * same model may run in parallel on different threads without locks.
 * Calls block until done. The library owns its worker threads.
 *
 * Status values and struct field offsets are ABI: they never change.
 */
#ifndef LLM_H
#define LLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  if defined(LLM_BUILDING_LIBRARY)
#    define LLM_API __declspec(dllexport)
#  else
#    define LLM_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define LLM_API __attribute__((visibility("default")))
#else
#  define LLM_API
#endif

/* ---------------------------------------------------------------- version */

#define LLM_VERSION_MAJOR 0
#define LLM_VERSION_MINOR 4
#define LLM_VERSION_PATCH 0
#define LLM_VERSION_NUMBER (LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH)

/* Run-time LLM_VERSION_NUMBER of the library actually linked. Since 0.1. */
LLM_API uint32_t llm_version(void);
/* Run-time version as a static string, e.g. "0.1.0". Since 0.1. */
LLM_API const char *llm_version_string(void);

/* ---------------------------------------------------------------- handles */

typedef struct llm_model llm_model;     /* immutable after load, shareable across threads */
typedef struct llm_session llm_session; /* one sequence; one thread at a time */
typedef int32_t llm_token;

/* ---------------------------------------------------------------- status */

typedef enum llm_status {
  LLM_OK = 0,
  LLM_ERR_INVALID_ARGUMENT = 1, /* NULL where not allowed, out-of-range value, foreign handle */
  LLM_ERR_OUT_OF_MEMORY = 2,    /* host or device allocation failed; nothing half-built remains */
  LLM_ERR_IO = 3,               /* file could not be opened or read */
  LLM_ERR_FORMAT = 4,           /* file is not a valid model file (truncated, bad header, bad table) */
  LLM_ERR_CHECKSUM = 5,         /* stored bytes do not match their checksum */
  LLM_ERR_UNSUPPORTED = 6,      /* valid request the library cannot do (dtype, architecture, option) */
  LLM_ERR_DEVICE = 7,           /* device missing or failed (CUDA driver, kernel launch) */
  LLM_ERR_CONTEXT_FULL = 8,     /* no room in the session's context or the KV page pool */
  LLM_ERR_CANCELLED = 9,        /* a cancel/progress callback asked to stop */
  LLM_ERR_BUFFER_TOO_SMALL = 10,/* caller buffer too small; the size needed was written */
  LLM_ERR_INTERNAL = 99,        /* a bug in libllm; please report */
  LLM_STATUS_FORCE_32BIT = 0x7fffffff
} llm_status;

/* Static English name of a status ("LLM_ERR_FORMAT: ..."). Never NULL. Since 0.1. */
LLM_API const char *llm_status_string(llm_status status);

/* Detail of this thread's last failed llm_* call ("" if none). The pointer is
 * valid until this thread's next llm_* call. Thread-local. Since 0.1. */
LLM_API const char *llm_last_error(void);

/* ---------------------------------------------------------------- loading */

typedef enum llm_device {
  LLM_DEVICE_AUTO = 0, /* CUDA if a device and driver exist, else CPU */
  LLM_DEVICE_CPU = 1,
  LLM_DEVICE_CUDA = 2, /* LLM_ERR_DEVICE if no usable GPU; LLM_ERR_UNSUPPORTED if built without CUDA */
  LLM_DEVICE_FORCE_32BIT = 0x7fffffff
} llm_device;

typedef enum llm_log_level {
  LLM_LOG_DEBUG = 0,
  LLM_LOG_INFO = 1,
  LLM_LOG_WARN = 2,
  LLM_LOG_ERROR = 3,
  LLM_LOG_FORCE_32BIT = 0x7fffffff
} llm_log_level;

/* Progress in [0, 1]. Return non-zero to cancel (the call returns LLM_ERR_CANCELLED). */
typedef int (*llm_progress_fn)(float progress, void *user_data);
/* One log line, without trailing newline. Called from the thread doing the work. */
typedef void (*llm_log_fn)(llm_log_level level, const char *message, void *user_data);

/* llm_load_params.flags */
#define LLM_LOAD_VOCAB_ONLY 1u     /* load metadata and tokenizer only; sessions cannot be created */
#define LLM_LOAD_REFERENCE_MATH 2u /* no activation quantization: f32 math on dequantized weights
                                      (slower; reproduces reference implementations exactly) */
#define LLM_LOAD_NO_HUGE_PAGES 4u  /* CPU on Linux: compute on the weights where the file reader left
                                      them (the file mapping or decompressed buffers) instead of a copy
                                      on transparent huge pages, in the file's row layout. Less memory
                                      while loading, slower decode, and slower Q4_0 prefill with the
                                      AVX2/AVX-512 kernels (see docs/PERFORMANCE.md). No effect
                                      elsewhere. */

typedef struct llm_load_params {
  uint32_t struct_size;        /* sizeof(llm_load_params) as the caller compiled it */
  llm_device device;           /* default LLM_DEVICE_AUTO */
  int32_t n_threads;           /* worker threads for compute and loading; 0 = all cores */
  uint32_t flags;              /* LLM_LOAD_* */
  llm_progress_fn progress;    /* optional; called during loading */
  void *progress_user_data;
  llm_log_fn log;              /* optional; NULL = silent */
  void *log_user_data;
  uint64_t kv_budget_bytes;    /* hard byte budget of the KV page pool; 0 = default (see docs) */
  uint32_t kv_page_tokens;     /* tokens per KV page; 0 = 16 */
} llm_load_params;

/* Writes the defaults into *params (and sets struct_size). NULL is a no-op. Since 0.1. */
LLM_API void llm_load_params_init(llm_load_params *params);

/* Opens a model file: the native .llm format or GGUF (detected from the
 * bytes). params may be NULL for defaults. On success *out_model owns the
 * weights, the tokenizer and the KV page pool; free with llm_model_free.
 * On failure *out_model is NULL and nothing is leaked.
 * Returns LLM_OK, LLM_ERR_INVALID_ARGUMENT, LLM_ERR_IO, LLM_ERR_FORMAT,
 * LLM_ERR_CHECKSUM, LLM_ERR_UNSUPPORTED, LLM_ERR_DEVICE, LLM_ERR_OUT_OF_MEMORY,
 * LLM_ERR_CANCELLED. Thread-safe. Since 0.1. */
LLM_API llm_status llm_load(const char *path, const llm_load_params *params, llm_model **out_model);

/* Frees a model. All its sessions must be freed first. NULL is a no-op. Since 0.1. */
LLM_API void llm_model_free(llm_model *model);

typedef struct llm_model_properties {
  uint32_t struct_size;      /* set by the caller before llm_model_info */
  uint32_t vocab_size;
  uint32_t context_length;   /* trained context */
  llm_token bos;             /* -1 if none */
  llm_token eos;             /* -1 if none */
  uint32_t n_layers;
  uint32_t dim;
  uint32_t hidden_dim;
  uint32_t n_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  llm_device device;         /* the device the model runs on (never AUTO) */
  uint64_t n_params;
  uint64_t weight_bytes;     /* bytes of weights as held for compute */
  char architecture[32];     /* e.g. "llama", NUL-terminated */
  char weight_type[16];      /* dominant weight format: "f32", "f16", "bf16", "q8", "q4", NUL-terminated */
} llm_model_properties;

/* Fills *info (caller sets info->struct_size). Thread-safe. Since 0.1.
 * Returns LLM_OK or LLM_ERR_INVALID_ARGUMENT. */
LLM_API llm_status llm_model_info(const llm_model *model, llm_model_properties *info);

/* ---------------------------------------------------------------- tokens */

#define LLM_TOKENIZE_ADD_BOS 1u       /* prepend the model's BOS token */
#define LLM_TOKENIZE_PARSE_SPECIAL 2u /* text like "<s>" or "<|eot_id|>" becomes its special id */

/* Converts UTF-8 text (text_len bytes, need not be NUL-terminated; invalid
 * UTF-8 is tokenized byte by byte) to token ids. Writes at most `capacity`
 * ids; *n_tokens receives the number of ids the text needs. If capacity is
 * too small, returns LLM_ERR_BUFFER_TOO_SMALL (tokens may be NULL when
 * capacity is 0, to ask for the size). Thread-safe. Since 0.1. */
LLM_API llm_status llm_tokenize(const llm_model *model, const char *text, size_t text_len, uint32_t flags,
                                llm_token *tokens, size_t capacity, size_t *n_tokens);

/* Raw bytes of one token's piece (SentencePiece '▁' becomes ' ', byte tokens
 * become their byte, control tokens become ""). The bytes may be an
 * incomplete UTF-8 sequence: for streaming use llm_detok_push. Not
 * NUL-terminated. Returns LLM_ERR_BUFFER_TOO_SMALL with *length = size
 * needed. Thread-safe. Since 0.1. */
LLM_API llm_status llm_token_to_text(const llm_model *model, llm_token token, char *buf, size_t capacity,
                                     size_t *length);

/* Text of a whole token array: pieces concatenated, the leading space of
 * the first piece after BOS dropped (SentencePiece convention), control
 * tokens skipped. Not NUL-terminated. Thread-safe. Since 0.1. */
LLM_API llm_status llm_detokenize(const llm_model *model, const llm_token *tokens, size_t n_tokens, char *buf,
                                  size_t capacity, size_t *length);

/* Non-zero if `token` ends generation (the model's EOS or end-of-turn tokens). */
LLM_API int llm_token_is_eog(const llm_model *model, llm_token token);

/* Streaming detokenizer state, held by the caller (one per stream). Start it
 * with llm_detok_init; feed tokens with llm_detok_push, which emits only
 * complete UTF-8 sequences and holds back the bytes of an unfinished one. */
typedef struct llm_detok_state {
  uint32_t struct_size;
  llm_token prev_token; /* -1 at the start */
  uint32_t n_pending;   /* held-back bytes */
  uint8_t pending[4];
} llm_detok_state;

/* Resets *state for a new stream whose previous token is prev_token (-1 if none). */
LLM_API void llm_detok_init(llm_detok_state *state, llm_token prev_token);
/* Appends the text of `token` to the stream and writes the complete UTF-8
 * text now available to buf (at most 3 * (3 + longest piece) bytes: every
 * byte may become a 3-byte U+FFFD). Invalid bytes
 * that can never complete are emitted as U+FFFD. On LLM_ERR_BUFFER_TOO_SMALL
 * the state is unchanged. Thread-safe for distinct states. Since 0.1. */
LLM_API llm_status llm_detok_push(const llm_model *model, llm_detok_state *state, llm_token token, char *buf,
                                  size_t capacity, size_t *length);
/* Ends the stream: writes held-back bytes as U+FFFD each. */
LLM_API llm_status llm_detok_flush(llm_detok_state *state, char *buf, size_t capacity, size_t *length);

/* ---------------------------------------------------------------- sessions */

typedef enum llm_kv_type {
  LLM_KV_F16 = 0, /* default */
  LLM_KV_F32 = 1,
  LLM_KV_INT8 = 2,
  LLM_KV_INT4 = 3,
  LLM_KV_FORCE_32BIT = 0x7fffffff
} llm_kv_type;

/* Return non-zero to cancel the running call (LLM_ERR_CANCELLED, session unchanged). */
typedef int (*llm_cancel_fn)(void *user_data);

typedef struct llm_session_params {
  uint32_t struct_size;
  uint32_t max_tokens;      /* 0 = the model's context length */
  uint32_t window;          /* sliding window in tokens; 0 = none */
  uint32_t n_sink;          /* attention-sink tokens kept by the window; default 4 */
  llm_kv_type kv_type;      /* default LLM_KV_F16 */
  llm_cancel_fn cancel;     /* optional; polled during prefill */
  void *cancel_user_data;
} llm_session_params;

/* Writes the defaults into *params (and sets struct_size). NULL is a no-op. Since 0.1. */
LLM_API void llm_session_params_init(llm_session_params *params);

/* Creates an empty session (no tokens) on `model`. params may be NULL.
 * Returns LLM_OK, LLM_ERR_INVALID_ARGUMENT, LLM_ERR_UNSUPPORTED (e.g. a
 * vocab-only model, an unsupported kv_type), LLM_ERR_OUT_OF_MEMORY.
 * Thread-safe with respect to the model. Since 0.1. */
LLM_API llm_status llm_session_create(llm_model *model, const llm_session_params *params, llm_session **out_session);

/* Frees a session and returns its KV pages to the pool. NULL is a no-op. */
LLM_API void llm_session_free(llm_session *session);

/* Drops all tokens of the session (KV pages return to the pool), keeping its params. */
LLM_API llm_status llm_session_reset(llm_session *session);

/* Appends n_tokens tokens in one batched forward pass. Afterwards the logits
 * for the next position are available (llm_logits) and the next
 * llm_decode_step samples from them. If a token returned by llm_decode_step
 * is still pending, it is run first. On any failure the session is unchanged
 * (no partial append); with a sliding window, tokens the window already
 * evicted to make room stay evicted (the session stays consistent and
 * usable). The next llm_decode_step starts its seed's random stream again
 * (since 0.4), so a prompt and a seed give the same tokens however the
 * session came to hold the prompt (fresh, forked, restored, reused).
 * Returns LLM_OK, LLM_ERR_INVALID_ARGUMENT (bad id),
 * LLM_ERR_CONTEXT_FULL, LLM_ERR_CANCELLED, LLM_ERR_OUT_OF_MEMORY. Since 0.1. */
LLM_API llm_status llm_prefill(llm_session *session, const llm_token *tokens, size_t n_tokens);

/* Points *logits at the vocab-sized logits that the next llm_decode_step
 * will sample from (running the pending token's forward pass first if
 * needed; with a sliding window that pass may first evict tokens, as
 * llm_decode_step would). The array is owned by the session and valid until
 * its next call. LLM_ERR_INVALID_ARGUMENT if the session holds no token yet.
 * Since 0.1. */
LLM_API llm_status llm_logits(llm_session *session, const float **logits, size_t *n_vocab);

typedef struct llm_sampling {
  uint32_t struct_size;
  float temperature;     /* <= 0: greedy (argmax, lowest id on ties); default 0 */
  int32_t top_k;         /* keep the k most likely; <= 0: off */
  float top_p;           /* nucleus: keep the smallest set with mass >= p; >= 1: off */
  float min_p;           /* drop tokens with p < min_p * p_max; <= 0: off */
  float repeat_penalty;  /* CTRL-style penalty on recent tokens; 1: off */
  uint64_t seed;         /* the same seed and inputs give the same tokens */
  int32_t repeat_last_n; /* window of recent tokens for repeat_penalty; default 64 */
  /* Since 0.2. Optional grammar (llm_grammar_create / llm_grammar_from_json_schema;
   * NULL = none): tokens it forbids get probability 0 before the other
   * settings apply. The session keeps the grammar's state from the first
   * llm_decode_step that passes it; llm_prefill, llm_session_reset or a
   * different grammar start it over. End-of-generation tokens are allowed
   * only where the grammar may end, and once it has ended they are the only
   * tokens allowed, so a grammar that reaches its end ends the generation.
   * The grammar must outlive its use in llm_decode_step; sessions keep no
   * pointer to it after llm_prefill/reset. */
  const struct llm_grammar *grammar;
} llm_sampling;

/* Writes the defaults (greedy) into *sampling. NULL is a no-op. Since 0.1. */
LLM_API void llm_sampling_init(llm_sampling *sampling);

/* Returns the next token as soon as it is known. The first call after
 * llm_prefill samples from the prefill's logits (so TTFT is the prefill
 * alone); every later call first runs the forward pass of the token it
 * returned last time (the "pending" token), then samples. sampling == NULL
 * is greedy. Returns LLM_OK, LLM_ERR_INVALID_ARGUMENT (empty session),
 * LLM_ERR_CONTEXT_FULL (no room for the pending token; session unchanged).
 * Since 0.1. */
LLM_API llm_status llm_decode_step(llm_session *session, const llm_sampling *sampling, llm_token *out_token);

/* llm_decode_step on each of n distinct sessions of the same model, in
 * order; out_tokens[i] receives session i's token. The pending tokens of
 * the sessions run as one batched forward pass (CPU since 0.2, and CUDA),
 * so N sessions share one read of the weights. On the CPU each session's
 * logits, KV cache and tokens are bit-identical to stepping it alone with
 * llm_decode_step, whatever else is in the batch and whatever the thread
 * count. Sessions that cannot join the pass (a window eviction due, a
 * re-run after llm_kv_evict, no room) are stepped alone, in order. One
 * sampling (and grammar) serves every session; each session keeps its own
 * RNG and grammar state. Stops at the first failure and returns its
 * status: sessions before it have advanced, the failing one and those
 * after it are unchanged (their out_tokens are -1), except that when the
 * grammar allows no token for a session, the sessions after it already
 * hold their pending token in the cache (their next step only samples).
 * The cancel callback is not polled. The calling thread must own every
 * session. Since 0.1. */
LLM_API llm_status llm_decode_batch(llm_session *const *sessions, size_t n, const llm_sampling *sampling,
                                    llm_token *out_tokens);

/* llm_decode_batch with a sampling of its own for every session: session i
 * samples with samplings[i] (NULL entry: greedy), so requests with other
 * temperatures, seeds or grammars share one batched forward pass.
 * samplings == NULL is greedy for all. Every sampling (struct_size, grammar
 * made for this model) is checked before any session moves: an invalid one
 * is LLM_ERR_INVALID_ARGUMENT with every session unchanged. Otherwise the
 * contract is llm_decode_batch's, including bit-identical results to
 * stepping each session alone with its own sampling. Since 0.3. */
LLM_API llm_status llm_decode_batch_each(llm_session *const *sessions, size_t n,
                                         const llm_sampling *const *samplings, llm_token *out_tokens);

/* llm_decode_batch_each where sessions may first append prompt tokens:
 * session i appends prompts[i][0..n_prompts[i]) as llm_prefill would, in
 * the same batched forward pass as the other sessions' pending tokens (on
 * the CPU), so a new request's prompt, or a chunk of a long one, joins the
 * running generations instead of stalling them for a pass of its own. Then
 * it samples its next token as llm_decode_step would (out_tokens[i]),
 * unless sample is non-NULL and sample[i] == 0: then it only appends (a
 * chunk of a longer prompt) and out_tokens[i] is -1. n_prompts NULL, or an
 * entry 0, is no prompt (prompts[i] may then be NULL); sample NULL samples
 * every session. Every token id and every sampling is checked before any
 * session moves (LLM_ERR_INVALID_ARGUMENT, all unchanged). On the CPU each
 * session's logits, KV cache and tokens are bit-identical to llm_prefill of
 * its prompt then llm_decode_step, alone, whatever else is in the pass. A
 * session that cannot join the pass (no room without a window eviction, a
 * prompt of more than 512 tokens, a CUDA model) runs alone, in order.
 * Failures are llm_decode_batch's: it stops at the first failing session,
 * those before it have advanced, it and those after it are unchanged, except
 * that when the grammar allows no token for a session, the sessions after it
 * that joined the pass have appended their prompt (as llm_prefill would)
 * and hold their pending token in the cache. The cancel callback is not
 * polled. Since 0.4. */
LLM_API llm_status llm_decode_batch_prefill(llm_session *const *sessions, size_t n, const llm_token *const *prompts,
                                            const size_t *n_prompts, const int32_t *sample,
                                            const llm_sampling *const *samplings, llm_token *out_tokens);

/* Removes cached tokens [n_keep, n_keep + n_discard). Later tokens move
 * down; their keys are re-rotated to their new positions. A pending token
 * counts as part of the sequence (it is at the end). Returns LLM_OK or
 * LLM_ERR_INVALID_ARGUMENT (range outside the sequence). Since 0.1. */
LLM_API llm_status llm_kv_evict(llm_session *session, uint32_t n_keep, uint32_t n_discard);

typedef struct llm_session_stats_t {
  uint32_t struct_size;     /* set by the caller */
  uint32_t n_tokens;        /* tokens in the sequence, pending one included */
  uint32_t n_cached;        /* tokens whose K/V are in the cache */
  uint32_t n_prompt;        /* tokens appended by llm_prefill since creation/reset */
  uint32_t n_generated;     /* tokens returned by llm_decode_step since creation/reset */
  uint32_t kv_pages;        /* KV pages referenced by this session */
  uint64_t kv_bytes;        /* bytes of those pages */
  double ttft_ms;           /* last prefill (+ first sample) wall time */
  double itl_median_ms;     /* inter-token latency of llm_decode_step calls after the first */
  double itl_p95_ms;
  double prompt_tokens_per_s;
  double gen_tokens_per_s;
  uint32_t n_evicted;       /* tokens evicted since creation (window or llm_kv_evict) */
} llm_session_stats_t;

/* Fills *stats (caller sets stats->struct_size). Since 0.1. */
LLM_API llm_status llm_session_stats(const llm_session *session, llm_session_stats_t *stats);

/* Creates *out_session as a copy of `src` that shares all of src's KV pages
 * (reference counted; the first write to a shared page copies it), so a
 * common prefix such as a system prompt is stored once for many sessions.
 * Sampling state, pending token and logits are copied too. The fork is an
 * independent session (it may be used on another thread). Returns LLM_OK,
 * LLM_ERR_INVALID_ARGUMENT, LLM_ERR_OUT_OF_MEMORY. Since 0.1. */
LLM_API llm_status llm_session_fork(const llm_session *src, llm_session **out_session);

/* Serialises the session (tokens, KV cache, logits, sampler state) into buf:
 * versioned, checksummed bytes that llm_session_restore turns back into an
 * identical session (continuing from it gives bit-identical results). With
 * capacity too small (buf may be NULL) returns LLM_ERR_BUFFER_TOO_SMALL and
 * *length = bytes needed. Since 0.1. */
LLM_API llm_status llm_session_save(const llm_session *session, void *buf, size_t capacity, size_t *length);

/* Rebuilds a saved session on `model` (which must have the same shape and KV
 * page size as the one that saved it). Untrusted bytes are validated:
 * LLM_ERR_FORMAT (malformed/truncated), LLM_ERR_CHECKSUM, LLM_ERR_UNSUPPORTED
 * (newer version, different model), LLM_ERR_CONTEXT_FULL (no pages left).
 * Since 0.1. */
LLM_API llm_status llm_session_restore(llm_model *model, const void *buf, size_t length, llm_session **out_session);

/* ---------------------------------------------------------------- chat (since 0.2) */

typedef struct llm_chat_message {
  const char *role;    /* "system", "user", "assistant", ...: NUL-terminated UTF-8 */
  const char *content; /* NUL-terminated UTF-8 */
} llm_chat_message;

typedef struct llm_chat_params {
  uint32_t struct_size;
  /* Jinja2 chat template text (NUL-terminated). NULL (default): the model's
   * own template (GGUF tokenizer.chat_template, the safetensors folder's
   * chat_template), or, when the file has none, the built-in format the
   * documented rule picks from the architecture and the special tokens
   * (docs/CHAT.md). */
  const char *template_source;
  int32_t add_generation_prompt; /* non-zero (default): end with the header of the assistant's turn */
} llm_chat_params;

/* Writes the defaults into *params (and sets struct_size). NULL is a no-op. Since 0.2. */
LLM_API void llm_chat_params_init(llm_chat_params *params);

/* Renders a conversation into prompt text through a chat template, byte for
 * byte as Python's jinja2 renders it for transformers' apply_chat_template
 * (trim_blocks, lstrip_blocks; variables messages, add_generation_prompt,
 * bos_token, eos_token; raise_exception). The template runs sandboxed and
 * bounded in steps, memory and recursion. `model` may be NULL when
 * params->template_source is set (bos_token and eos_token are then "").
 * The text usually begins with the BOS text already: tokenize it with
 * LLM_TOKENIZE_PARSE_SPECIAL and without LLM_TOKENIZE_ADD_BOS then.
 * Writes a NUL-terminated string; *length = its length without the NUL.
 * Returns LLM_OK, LLM_ERR_BUFFER_TOO_SMALL (*length = length needed; buf
 * may be NULL with capacity 0), LLM_ERR_INVALID_ARGUMENT (malformed
 * template, with line and column in llm_last_error; raise_exception; a
 * bound exceeded), LLM_ERR_UNSUPPORTED (a construct outside the supported
 * subset; never a wrong string; or no template and no built-in applies).
 * Thread-safe. Since 0.2. */
LLM_API llm_status llm_chat_render(const llm_model *model, const llm_chat_message *messages, size_t n_messages,
                                   const llm_chat_params *params, char *buf, size_t capacity, size_t *length);

/* The template llm_chat_render uses for `model` when none is passed: the
 * file's, or the built-in one chosen by the rule. NUL-terminated like
 * llm_chat_render. Returns LLM_OK, LLM_ERR_BUFFER_TOO_SMALL,
 * LLM_ERR_UNSUPPORTED (no template in the file and no built-in applies).
 * Since 0.2. */
LLM_API llm_status llm_model_chat_template(const llm_model *model, char *buf, size_t capacity, size_t *length);

/* ---------------------------------------------------------------- grammars (since 0.2) */

/* A compiled grammar bound to a model's vocabulary: immutable, shareable by
 * many sessions and threads; pass it in llm_sampling.grammar. Independent of
 * the model's lifetime once created. */
typedef struct llm_grammar llm_grammar;

/* Compiles a GBNF grammar (the format of llama.cpp's grammars/) whose start
 * rule is `root` (NULL: "root") for `model`'s vocabulary. Returns LLM_OK,
 * LLM_ERR_INVALID_ARGUMENT (syntax error, undefined rule...: line and
 * column in llm_last_error), LLM_ERR_OUT_OF_MEMORY. Since 0.2. */
LLM_API llm_status llm_grammar_create(const llm_model *model, const char *gbnf, const char *root,
                                      llm_grammar **out_grammar);

/* Compiles a JSON Schema (the subset OpenAI's structured outputs use; see
 * docs/GRAMMAR.md) into a grammar of the JSON texts it accepts. Returns
 * LLM_OK, LLM_ERR_INVALID_ARGUMENT (malformed JSON with line and column, or
 * a keyword outside the subset that changes what is valid). Since 0.2. */
LLM_API llm_status llm_grammar_from_json_schema(const llm_model *model, const char *schema_json,
                                                llm_grammar **out_grammar);

/* The GBNF text llm_grammar_from_json_schema compiles for a schema
 * (NUL-terminated; LLM_ERR_BUFFER_TOO_SMALL with *length = length needed).
 * Since 0.2. */
LLM_API llm_status llm_json_schema_to_gbnf(const char *schema_json, char *buf, size_t capacity, size_t *length);

/* NULL is a no-op. The grammar must not be in use by a running call. Since 0.2. */
LLM_API void llm_grammar_free(llm_grammar *grammar);

/* ---------------------------------------------------------------- text streams with stops (since 0.2) */

/* Turns generated tokens into text to show: complete UTF-8 only, stop
 * strings honoured across token boundaries (the text before a stop string
 * is delivered, the stop string and everything after it never are), and
 * the model's end-of-generation tokens end the stream. One per generation,
 * used by one thread at a time. */
typedef struct llm_text_stream llm_text_stream;

/* Creates a stream for `model` with n_stops stop strings (NUL-terminated
 * UTF-8, non-empty; copied). Returns LLM_OK, LLM_ERR_INVALID_ARGUMENT
 * (an empty stop string, more than 64 stops, one over 1024 bytes).
 * Since 0.2. */
LLM_API llm_status llm_text_stream_create(const llm_model *model, const char *const *stops, size_t n_stops,
                                          llm_text_stream **out_stream);

/* Feeds one generated token. Writes to buf the text that became safe to
 * show (not NUL-terminated; *length bytes; often 0: bytes that may begin a
 * stop string or finish a UTF-8 sequence are held back). *stopped becomes
 * 1 when a stop string or an end-of-generation token ended the stream
 * (later pushes then write nothing). 3 * (longest stop + longest token
 * piece + 4) bytes are always enough; on LLM_ERR_BUFFER_TOO_SMALL (*length
 * = bytes needed) the stream is unchanged. Since 0.2. */
LLM_API llm_status llm_text_stream_push(llm_text_stream *stream, llm_token token, char *buf, size_t capacity,
                                        size_t *length, int32_t *stopped);

/* Ends the stream: writes the text still held back (a partial stop string
 * that never completed is text after all; an unfinished UTF-8 sequence
 * becomes U+FFFD). Since 0.2. */
LLM_API llm_status llm_text_stream_flush(llm_text_stream *stream, char *buf, size_t capacity, size_t *length);

/* Starts the stream over with the same stops. Since 0.2. */
LLM_API llm_status llm_text_stream_reset(llm_text_stream *stream);

/* NULL is a no-op. Since 0.2. */
LLM_API void llm_text_stream_free(llm_text_stream *stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LLM_H */
