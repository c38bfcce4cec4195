//! Raw declarations of include/llm.h, written by hand (no bindgen: the crate
//! builds offline). Struct layouts must match the C header exactly; the tests
//! pin their sizes and the C side pins them in tests/abi/layout_test.cpp.
//! C enums are plain `i32` here: a Rust `enum` would be undefined behaviour
//! if the library ever returned a value this crate does not know.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub type llm_token = i32;
pub type llm_status = c_int;
pub type llm_device = c_int;
pub type llm_log_level = c_int;
pub type llm_kv_type = c_int;

#[repr(C)]
pub struct llm_model {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct llm_session {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct llm_grammar {
    _opaque: [u8; 0],
}
#[repr(C)]
pub struct llm_text_stream {
    _opaque: [u8; 0],
}

pub const LLM_OK: llm_status = 0;
pub const LLM_ERR_INVALID_ARGUMENT: llm_status = 1;
pub const LLM_ERR_OUT_OF_MEMORY: llm_status = 2;
pub const LLM_ERR_IO: llm_status = 3;
pub const LLM_ERR_FORMAT: llm_status = 4;
pub const LLM_ERR_CHECKSUM: llm_status = 5;
pub const LLM_ERR_UNSUPPORTED: llm_status = 6;
pub const LLM_ERR_DEVICE: llm_status = 7;
pub const LLM_ERR_CONTEXT_FULL: llm_status = 8;
pub const LLM_ERR_CANCELLED: llm_status = 9;
pub const LLM_ERR_BUFFER_TOO_SMALL: llm_status = 10;
pub const LLM_ERR_INTERNAL: llm_status = 99;

pub const LLM_DEVICE_AUTO: llm_device = 0;
pub const LLM_DEVICE_CPU: llm_device = 1;
pub const LLM_DEVICE_CUDA: llm_device = 2;

pub const LLM_LOG_DEBUG: llm_log_level = 0;
pub const LLM_LOG_INFO: llm_log_level = 1;
pub const LLM_LOG_WARN: llm_log_level = 2;
pub const LLM_LOG_ERROR: llm_log_level = 3;

pub const LLM_KV_F16: llm_kv_type = 0;
pub const LLM_KV_F32: llm_kv_type = 1;
pub const LLM_KV_INT8: llm_kv_type = 2;
pub const LLM_KV_INT4: llm_kv_type = 3;

pub const LLM_LOAD_VOCAB_ONLY: u32 = 1;
pub const LLM_LOAD_REFERENCE_MATH: u32 = 2;
pub const LLM_LOAD_NO_HUGE_PAGES: u32 = 4;
pub const LLM_TOKENIZE_ADD_BOS: u32 = 1;
pub const LLM_TOKENIZE_PARSE_SPECIAL: u32 = 2;

pub const LLM_VERSION_MAJOR: u32 = 0;
pub const LLM_VERSION_MINOR: u32 = 4;
pub const LLM_VERSION_PATCH: u32 = 0;
pub const LLM_VERSION_NUMBER: u32 = LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH;

pub type llm_progress_fn = Option<unsafe extern "C" fn(progress: f32, user_data: *mut c_void) -> c_int>;
pub type llm_log_fn =
    Option<unsafe extern "C" fn(level: llm_log_level, message: *const c_char, user_data: *mut c_void)>;
pub type llm_cancel_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> c_int>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_load_params {
    pub struct_size: u32,
    pub device: llm_device,
    pub n_threads: i32,
    pub flags: u32,
    pub progress: llm_progress_fn,
    pub progress_user_data: *mut c_void,
    pub log: llm_log_fn,
    pub log_user_data: *mut c_void,
    pub kv_budget_bytes: u64,
    pub kv_page_tokens: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_model_properties {
    pub struct_size: u32,
    pub vocab_size: u32,
    pub context_length: u32,
    pub bos: llm_token,
    pub eos: llm_token,
    pub n_layers: u32,
    pub dim: u32,
    pub hidden_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub device: llm_device,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub architecture: [c_char; 32],
    pub weight_type: [c_char; 16],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_detok_state {
    pub struct_size: u32,
    pub prev_token: llm_token,
    pub n_pending: u32,
    pub pending: [u8; 4],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_session_params {
    pub struct_size: u32,
    pub max_tokens: u32,
    pub window: u32,
    pub n_sink: u32,
    pub kv_type: llm_kv_type,
    pub cancel: llm_cancel_fn,
    pub cancel_user_data: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_sampling {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
    pub repeat_last_n: i32,
    pub grammar: *const llm_grammar,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_chat_params {
    pub struct_size: u32,
    pub template_source: *const c_char,
    pub add_generation_prompt: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct llm_session_stats_t {
    pub struct_size: u32,
    pub n_tokens: u32,
    pub n_cached: u32,
    pub n_prompt: u32,
    pub n_generated: u32,
    pub kv_pages: u32,
    pub kv_bytes: u64,
    pub ttft_ms: f64,
    pub itl_median_ms: f64,
    pub itl_p95_ms: f64,
    pub prompt_tokens_per_s: f64,
    pub gen_tokens_per_s: f64,
    pub n_evicted: u32,
}

extern "C" {
    pub fn llm_version() -> u32;
    pub fn llm_version_string() -> *const c_char;
    pub fn llm_status_string(status: llm_status) -> *const c_char;
    pub fn llm_last_error() -> *const c_char;

    pub fn llm_load_params_init(params: *mut llm_load_params);
    pub fn llm_load(path: *const c_char, params: *const llm_load_params, out_model: *mut *mut llm_model) -> llm_status;
    pub fn llm_model_free(model: *mut llm_model);
    pub fn llm_model_info(model: *const llm_model, info: *mut llm_model_properties) -> llm_status;

    pub fn llm_tokenize(
        model: *const llm_model,
        text: *const c_char,
        text_len: usize,
        flags: u32,
        tokens: *mut llm_token,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> llm_status;
    pub fn llm_token_to_text(
        model: *const llm_model,
        token: llm_token,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_detokenize(
        model: *const llm_model,
        tokens: *const llm_token,
        n_tokens: usize,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_token_is_eog(model: *const llm_model, token: llm_token) -> c_int;
    pub fn llm_detok_init(state: *mut llm_detok_state, prev_token: llm_token);
    pub fn llm_detok_push(
        model: *const llm_model,
        state: *mut llm_detok_state,
        token: llm_token,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_detok_flush(
        state: *mut llm_detok_state,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;

    pub fn llm_session_params_init(params: *mut llm_session_params);
    pub fn llm_session_create(
        model: *mut llm_model,
        params: *const llm_session_params,
        out_session: *mut *mut llm_session,
    ) -> llm_status;
    pub fn llm_session_free(session: *mut llm_session);
    pub fn llm_session_reset(session: *mut llm_session) -> llm_status;
    pub fn llm_prefill(session: *mut llm_session, tokens: *const llm_token, n_tokens: usize) -> llm_status;
    pub fn llm_logits(session: *mut llm_session, logits: *mut *const f32, n_vocab: *mut usize) -> llm_status;
    pub fn llm_sampling_init(sampling: *mut llm_sampling);
    pub fn llm_decode_step(
        session: *mut llm_session,
        sampling: *const llm_sampling,
        out_token: *mut llm_token,
    ) -> llm_status;
    pub fn llm_decode_batch(
        sessions: *const *mut llm_session,
        n: usize,
        sampling: *const llm_sampling,
        out_tokens: *mut llm_token,
    ) -> llm_status;
    /// Since 0.3.
    pub fn llm_decode_batch_each(
        sessions: *const *mut llm_session,
        n: usize,
        samplings: *const *const llm_sampling,
        out_tokens: *mut llm_token,
    ) -> llm_status;
    /// Since 0.4.
    pub fn llm_decode_batch_prefill(
        sessions: *const *mut llm_session,
        n: usize,
        prompts: *const *const llm_token,
        n_prompts: *const usize,
        sample: *const i32,
        samplings: *const *const llm_sampling,
        out_tokens: *mut llm_token,
    ) -> llm_status;
    pub fn llm_kv_evict(session: *mut llm_session, n_keep: u32, n_discard: u32) -> llm_status;
    pub fn llm_session_stats(session: *const llm_session, stats: *mut llm_session_stats_t) -> llm_status;
    pub fn llm_session_fork(src: *const llm_session, out_session: *mut *mut llm_session) -> llm_status;
    pub fn llm_session_save(
        session: *const llm_session,
        buf: *mut c_void,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_session_restore(
        model: *mut llm_model,
        buf: *const c_void,
        length: usize,
        out_session: *mut *mut llm_session,
    ) -> llm_status;

    pub fn llm_chat_params_init(params: *mut llm_chat_params);
    pub fn llm_chat_render(
        model: *const llm_model,
        messages: *const llm_chat_message,
        n_messages: usize,
        params: *const llm_chat_params,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_model_chat_template(
        model: *const llm_model,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;

    pub fn llm_grammar_create(
        model: *const llm_model,
        gbnf: *const c_char,
        root: *const c_char,
        out_grammar: *mut *mut llm_grammar,
    ) -> llm_status;
    pub fn llm_grammar_from_json_schema(
        model: *const llm_model,
        schema_json: *const c_char,
        out_grammar: *mut *mut llm_grammar,
    ) -> llm_status;
    pub fn llm_json_schema_to_gbnf(
        schema_json: *const c_char,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_grammar_free(grammar: *mut llm_grammar);

    pub fn llm_text_stream_create(
        model: *const llm_model,
        stops: *const *const c_char,
        n_stops: usize,
        out_stream: *mut *mut llm_text_stream,
    ) -> llm_status;
    pub fn llm_text_stream_push(
        stream: *mut llm_text_stream,
        token: llm_token,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
        stopped: *mut i32,
    ) -> llm_status;
    pub fn llm_text_stream_flush(
        stream: *mut llm_text_stream,
        buf: *mut c_char,
        capacity: usize,
        length: *mut usize,
    ) -> llm_status;
    pub fn llm_text_stream_reset(stream: *mut llm_text_stream) -> llm_status;
    pub fn llm_text_stream_free(stream: *mut llm_text_stream);
}
