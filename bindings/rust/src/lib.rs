//! Safe Rust bindings to libllm (`include/llm.h`).
//!
//! ```no_run
//! use libllm::{Model, Sampling};
//! let model = Model::load("stories260K.gguf")?;
//! let mut session = model.session()?;
//! for piece in session.generate("Once upon a time", 64, Sampling::greedy())? {
//!     print!("{}", piece?.text);
//! }
//! # Ok::<(), libllm::Error>(())
//! ```
//!
//! Threading follows the C contract: a [`Model`] is immutable after loading
//! and is `Send + Sync` (clone it to share; clones are reference counts).
//! A [`Session`] is used by one thread at a time: it is `Send` but not
//! `Sync`. Every session holds a reference to its model, so the model is
//! freed only after the last session is gone (the C API requires that order).
//!
//! A session is not shareable between threads:
//! ```compile_fail
//! fn needs_sync<T: Sync>() {}
//! needs_sync::<libllm::Session>();
//! ```

pub mod sys;

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_int, c_void};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A token id.
pub type Token = i32;

/// Failure statuses of the C API (`llm_status` without `LLM_OK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    OutOfMemory,
    Io,
    Format,
    Checksum,
    Unsupported,
    Device,
    ContextFull,
    Cancelled,
    BufferTooSmall,
    Internal,
    /// A status this version of the crate does not know.
    Other(i32),
}

impl Status {
    fn from_code(code: sys::llm_status) -> Option<Status> {
        Some(match code {
            sys::LLM_OK => return None,
            sys::LLM_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::LLM_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::LLM_ERR_IO => Status::Io,
            sys::LLM_ERR_FORMAT => Status::Format,
            sys::LLM_ERR_CHECKSUM => Status::Checksum,
            sys::LLM_ERR_UNSUPPORTED => Status::Unsupported,
            sys::LLM_ERR_DEVICE => Status::Device,
            sys::LLM_ERR_CONTEXT_FULL => Status::ContextFull,
            sys::LLM_ERR_CANCELLED => Status::Cancelled,
            sys::LLM_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::LLM_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        })
    }

    /// The numeric `llm_status` value.
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::LLM_ERR_INVALID_ARGUMENT,
            Status::OutOfMemory => sys::LLM_ERR_OUT_OF_MEMORY,
            Status::Io => sys::LLM_ERR_IO,
            Status::Format => sys::LLM_ERR_FORMAT,
            Status::Checksum => sys::LLM_ERR_CHECKSUM,
            Status::Unsupported => sys::LLM_ERR_UNSUPPORTED,
            Status::Device => sys::LLM_ERR_DEVICE,
            Status::ContextFull => sys::LLM_ERR_CONTEXT_FULL,
            Status::Cancelled => sys::LLM_ERR_CANCELLED,
            Status::BufferTooSmall => sys::LLM_ERR_BUFFER_TOO_SMALL,
            Status::Internal => sys::LLM_ERR_INTERNAL,
            Status::Other(code) => code,
        }
    }

    /// The library's static description (`llm_status_string`).
    pub fn description(self) -> String {
        unsafe { cstr_lossy(sys::llm_status_string(self.code())) }
    }
}

/// A failed call: its status and the thread's `llm_last_error()` text at the
/// time of the failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// Reads `llm_last_error()`; must run on the failing call's thread, right after it.
    fn last(status: Status) -> Error {
        Error::new(status, unsafe { cstr_lossy(sys::llm_last_error()) })
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// The detail text (`llm_last_error`); may be empty.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status.description())
        } else {
            write!(f, "{} ({})", self.message, self.status.description())
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(code: sys::llm_status) -> Result<()> {
    match Status::from_code(code) {
        None => Ok(()),
        Some(status) => Err(Error::last(status)),
    }
}

unsafe fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn array_str(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Calls `f(buf, capacity, &mut needed)` until the buffer is large enough.
fn with_growing_buffer<T: Copy + Default>(
    initial: usize,
    mut f: impl FnMut(*mut T, usize, &mut usize) -> sys::llm_status,
) -> Result<Vec<T>> {
    let mut buf: Vec<T> = vec![T::default(); initial.max(1)];
    loop {
        let mut needed = 0usize;
        let code = f(buf.as_mut_ptr(), buf.len(), &mut needed);
        if code == sys::LLM_ERR_BUFFER_TOO_SMALL && needed > buf.len() {
            buf.resize(needed, T::default());
            continue;
        }
        check(code)?;
        buf.truncate(needed);
        return Ok(buf);
    }
}

/// Run-time version number of the linked library (`LLM_VERSION_NUMBER` format).
pub fn version() -> u32 {
    unsafe { sys::llm_version() }
}

/// Run-time version string of the linked library, e.g. "0.1.0".
pub fn version_string() -> String {
    unsafe { cstr_lossy(sys::llm_version_string()) }
}

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Auto,
    Cpu,
    Cuda,
    Other(i32),
}

impl Device {
    fn code(self) -> sys::llm_device {
        match self {
            Device::Auto => sys::LLM_DEVICE_AUTO,
            Device::Cpu => sys::LLM_DEVICE_CPU,
            Device::Cuda => sys::LLM_DEVICE_CUDA,
            Device::Other(c) => c,
        }
    }
    fn from_code(c: sys::llm_device) -> Device {
        match c {
            sys::LLM_DEVICE_AUTO => Device::Auto,
            sys::LLM_DEVICE_CPU => Device::Cpu,
            sys::LLM_DEVICE_CUDA => Device::Cuda,
            other => Device::Other(other),
        }
    }
}

/// Severity of a log line from the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// KV cache element type of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    F32,
    Int8,
    Int4,
}

type LogFn = dyn Fn(LogLevel, &str) + Send + Sync;
type ProgressFn<'a> = Mutex<Box<dyn FnMut(f32) -> bool + Send + 'a>>;

unsafe extern "C" fn log_trampoline(level: sys::llm_log_level, message: *const c_char, user: *mut c_void) {
    // Never unwind into C: a panicking logger is ignored.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let f = &*(user as *const Arc<LogFn>);
        let level = match level {
            sys::LLM_LOG_DEBUG => LogLevel::Debug,
            sys::LLM_LOG_INFO => LogLevel::Info,
            sys::LLM_LOG_WARN => LogLevel::Warn,
            _ => LogLevel::Error,
        };
        f(level, &cstr_lossy(message));
    }));
}

unsafe extern "C" fn progress_trampoline(progress: f32, user: *mut c_void) -> c_int {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let f = &*(user as *const ProgressFn);
        let mut f = match f.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        (*f)(progress)
    }));
    // Returning non-zero cancels; a panic in the callback cancels too.
    match result {
        Ok(true) => 0,
        _ => 1,
    }
}

unsafe extern "C" fn cancel_trampoline(user: *mut c_void) -> c_int {
    let flag = &*(user as *const AtomicBool);
    flag.load(Ordering::Relaxed) as c_int
}

/// Options of [`Model::load_with`]. Built with chained setters:
/// `LoadParams::new().device(Device::Cpu).n_threads(2)`.
pub struct LoadParams<'a> {
    raw: sys::llm_load_params,
    progress: Option<ProgressFn<'a>>,
    log: Option<Arc<LogFn>>,
}

impl<'a> Default for LoadParams<'a> {
    fn default() -> Self {
        LoadParams::new()
    }
}

impl<'a> LoadParams<'a> {
    /// The library's defaults (`llm_load_params_init`).
    pub fn new() -> Self {
        let mut raw = std::mem::MaybeUninit::<sys::llm_load_params>::zeroed();
        unsafe { sys::llm_load_params_init(raw.as_mut_ptr()) };
        LoadParams {
            raw: unsafe { raw.assume_init() },
            progress: None,
            log: None,
        }
    }
    pub fn device(mut self, device: Device) -> Self {
        self.raw.device = device.code();
        self
    }
    /// Worker threads; 0 = all cores.
    pub fn n_threads(mut self, n: i32) -> Self {
        self.raw.n_threads = n;
        self
    }
    /// Load only metadata and tokenizer; sessions cannot be created.
    pub fn vocab_only(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::LLM_LOAD_VOCAB_ONLY;
        } else {
            self.raw.flags &= !sys::LLM_LOAD_VOCAB_ONLY;
        }
        self
    }
    /// No activation quantization: f32 math on dequantized weights (slower;
    /// reproduces reference implementations exactly).
    pub fn reference_math(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::LLM_LOAD_REFERENCE_MATH;
        } else {
            self.raw.flags &= !sys::LLM_LOAD_REFERENCE_MATH;
        }
        self
    }
    pub fn kv_budget_bytes(mut self, bytes: u64) -> Self {
        self.raw.kv_budget_bytes = bytes;
        self
    }
    pub fn kv_page_tokens(mut self, tokens: u32) -> Self {
        self.raw.kv_page_tokens = tokens;
        self
    }
    /// Called with progress in [0, 1] while loading; return `false` to cancel
    /// (the load then fails with [`Status::Cancelled`]).
    pub fn progress(mut self, f: impl FnMut(f32) -> bool + Send + 'a) -> Self {
        self.progress = Some(Mutex::new(Box::new(f)));
        self
    }
    /// Receives the library's diagnostics for the model's whole lifetime.
    pub fn log(mut self, f: impl Fn(LogLevel, &str) + Send + Sync + 'static) -> Self {
        self.log = Some(Arc::new(f));
        self
    }
}

struct ModelInner {
    raw: NonNull<sys::llm_model>,
    // Kept alive (at a stable address) as long as the C model may call it.
    _log: Option<Box<Arc<LogFn>>>,
}

// The C contract: a model is immutable after llm_load and may be used from
// any number of threads at once.
unsafe impl Send for ModelInner {}
unsafe impl Sync for ModelInner {}

impl Drop for ModelInner {
    fn drop(&mut self) {
        // Sessions hold a clone of the Arc, so none is alive here.
        unsafe { sys::llm_model_free(self.raw.as_ptr()) }
    }
}

/// Description of a loaded model (`llm_model_properties`).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub vocab_size: u32,
    pub context_length: u32,
    pub bos: Option<Token>,
    pub eos: Option<Token>,
    pub n_layers: u32,
    pub dim: u32,
    pub hidden_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub device: Device,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub architecture: String,
    pub weight_type: String,
}

/// Flags of [`Model::tokenize_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenizeFlags(pub u32);

impl TokenizeFlags {
    pub const NONE: TokenizeFlags = TokenizeFlags(0);
    /// Prepend the model's BOS token.
    pub const ADD_BOS: TokenizeFlags = TokenizeFlags(sys::LLM_TOKENIZE_ADD_BOS);
    /// Text like "<s>" becomes its special id.
    pub const PARSE_SPECIAL: TokenizeFlags = TokenizeFlags(sys::LLM_TOKENIZE_PARSE_SPECIAL);
}

impl std::ops::BitOr for TokenizeFlags {
    type Output = TokenizeFlags;
    fn bitor(self, rhs: TokenizeFlags) -> TokenizeFlags {
        TokenizeFlags(self.0 | rhs.0)
    }
}

/// A loaded model. Cloning is cheap (a reference count); the weights are
/// freed when the last clone and the last session are dropped.
#[derive(Clone)]
pub struct Model {
    inner: Arc<ModelInner>,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model").field("raw", &self.inner.raw).finish()
    }
}

fn path_cstring(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path.to_string_lossy().into_owned().into_bytes();
    CString::new(bytes).map_err(|_| Error::new(Status::InvalidArgument, "path contains a NUL byte"))
}

impl Model {
    /// Loads a model file (native `.llm` or GGUF) with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(path, LoadParams::new())
    }

    /// Loads a model file with the given options.
    pub fn load_with(path: impl AsRef<Path>, params: LoadParams<'_>) -> Result<Model> {
        let cpath = path_cstring(path.as_ref())?;
        let mut raw = params.raw;
        let log = params.log.map(Box::new);
        if let Some(log) = &log {
            raw.log = Some(log_trampoline);
            raw.log_user_data = &**log as *const Arc<LogFn> as *mut c_void;
        }
        if let Some(progress) = &params.progress {
            raw.progress = Some(progress_trampoline);
            raw.progress_user_data = progress as *const ProgressFn as *mut c_void;
        }
        let mut out: *mut sys::llm_model = ptr::null_mut();
        check(unsafe { sys::llm_load(cpath.as_ptr(), &raw, &mut out) })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "llm_load returned LLM_OK and a NULL model"))?;
        Ok(Model {
            inner: Arc::new(ModelInner { raw, _log: log }),
        })
    }

    /// The C handle, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::llm_model {
        self.inner.raw.as_ptr()
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut p: sys::llm_model_properties = unsafe { std::mem::zeroed() };
        p.struct_size = std::mem::size_of::<sys::llm_model_properties>() as u32;
        check(unsafe { sys::llm_model_info(self.as_ptr(), &mut p) })?;
        Ok(ModelInfo {
            vocab_size: p.vocab_size,
            context_length: p.context_length,
            bos: if p.bos < 0 { None } else { Some(p.bos) },
            eos: if p.eos < 0 { None } else { Some(p.eos) },
            n_layers: p.n_layers,
            dim: p.dim,
            hidden_dim: p.hidden_dim,
            n_heads: p.n_heads,
            n_kv_heads: p.n_kv_heads,
            head_dim: p.head_dim,
            device: Device::from_code(p.device),
            n_params: p.n_params,
            weight_bytes: p.weight_bytes,
            architecture: array_str(&p.architecture),
            weight_type: array_str(&p.weight_type),
        })
    }

    /// Tokenizes `text`, optionally with the model's BOS first.
    pub fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<Token>> {
        let flags = if add_bos {
            TokenizeFlags::ADD_BOS
        } else {
            TokenizeFlags::NONE
        };
        self.tokenize_with(text.as_bytes(), flags)
    }

    /// Tokenizes raw bytes (invalid UTF-8 is tokenized byte by byte).
    pub fn tokenize_with(&self, text: &[u8], flags: TokenizeFlags) -> Result<Vec<Token>> {
        // Byte fallback bounds the count: one id per byte, plus BOS and a prefix space.
        with_growing_buffer::<Token>(text.len() + 2, |buf, cap, needed| unsafe {
            sys::llm_tokenize(
                self.as_ptr(),
                text.as_ptr() as *const c_char,
                text.len(),
                flags.0,
                buf,
                cap,
                needed,
            )
        })
    }

    /// Raw bytes of one token's piece (may be an incomplete UTF-8 sequence).
    pub fn token_bytes(&self, token: Token) -> Result<Vec<u8>> {
        with_growing_buffer::<u8>(32, |buf, cap, needed| unsafe {
            sys::llm_token_to_text(self.as_ptr(), token, buf as *mut c_char, cap, needed)
        })
    }

    /// Bytes of a whole token array (SentencePiece conventions, see llm.h).
    pub fn detokenize_bytes(&self, tokens: &[Token]) -> Result<Vec<u8>> {
        with_growing_buffer::<u8>(tokens.len() * 8 + 16, |buf, cap, needed| unsafe {
            sys::llm_detokenize(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len(),
                buf as *mut c_char,
                cap,
                needed,
            )
        })
    }

    /// Text of a whole token array; invalid UTF-8 becomes U+FFFD.
    pub fn detokenize(&self, tokens: &[Token]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.detokenize_bytes(tokens)?).into_owned())
    }

    /// True if `token` ends generation.
    pub fn is_eog(&self, token: Token) -> bool {
        unsafe { sys::llm_token_is_eog(self.as_ptr(), token) != 0 }
    }

    /// A new empty session with default options.
    pub fn session(&self) -> Result<Session> {
        Session::new(self, &SessionParams::new())
    }

    /// A new empty session.
    pub fn session_with(&self, params: &SessionParams) -> Result<Session> {
        Session::new(self, params)
    }

    /// A streaming detokenizer whose previous token is `prev` (None at the start).
    pub fn detokenizer(&self, prev: Option<Token>) -> Detokenizer {
        Detokenizer::new(self, prev)
    }

    /// Renders a conversation into prompt text (`llm_chat_render`) through
    /// `template` (Jinja2 source), or the model's own template when None.
    /// The text usually begins with the BOS text: tokenize it with
    /// `TokenizeFlags::PARSE_SPECIAL` and without `ADD_BOS`. A model without
    /// a template (and no built-in that fits) gives [`Status::Unsupported`];
    /// a malformed template [`Status::InvalidArgument`] with line and column.
    pub fn chat_render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        template: Option<&str>,
    ) -> Result<String> {
        render(self.as_ptr(), messages, add_generation_prompt, template)
    }

    /// The template [`chat_render`](Model::chat_render) uses when none is
    /// passed: the file's, or the built-in one ([`Status::Unsupported`] if none).
    pub fn chat_template(&self) -> Result<String> {
        let model = self.as_ptr();
        cstr_with_growing_buffer(4096, |buf, cap, len| unsafe {
            sys::llm_model_chat_template(model, buf, cap, len)
        })
    }

    /// A GBNF grammar whose start rule is `root` ([`Grammar::with_root`]).
    pub fn grammar(&self, gbnf: &str) -> Result<Grammar> {
        Grammar::new(self, gbnf)
    }

    /// A text stream ending at any of `stops` ([`StopStream::new`]).
    pub fn stop_stream<S: AsRef<str>>(&self, stops: &[S]) -> Result<StopStream> {
        StopStream::new(self, stops)
    }
}

/// Turns a token stream into text, emitting only complete UTF-8 sequences
/// (`llm_detok_push`).
pub struct Detokenizer {
    model: Model,
    state: sys::llm_detok_state,
    buf: Vec<u8>,
}

impl Detokenizer {
    pub fn new(model: &Model, prev: Option<Token>) -> Detokenizer {
        let mut state: sys::llm_detok_state = unsafe { std::mem::zeroed() };
        unsafe { sys::llm_detok_init(&mut state, prev.unwrap_or(-1)) };
        Detokenizer {
            model: model.clone(),
            state,
            buf: vec![0; 64],
        }
    }

    /// Text that `token` completes (may be empty while a character is unfinished).
    pub fn push(&mut self, token: Token) -> Result<String> {
        loop {
            let mut len = 0usize;
            let code = unsafe {
                sys::llm_detok_push(
                    self.model.as_ptr(),
                    &mut self.state,
                    token,
                    self.buf.as_mut_ptr() as *mut c_char,
                    self.buf.len(),
                    &mut len,
                )
            };
            if code == sys::LLM_ERR_BUFFER_TOO_SMALL && len > self.buf.len() {
                self.buf.resize(len, 0); // the state is unchanged on this status
                continue;
            }
            check(code)?;
            return Ok(String::from_utf8_lossy(&self.buf[..len]).into_owned());
        }
    }

    /// Ends the stream: held-back bytes come out as U+FFFD.
    pub fn flush(&mut self) -> Result<String> {
        let state = &mut self.state;
        let bytes = with_growing_buffer::<u8>(16, |buf, cap, needed| unsafe {
            sys::llm_detok_flush(state, buf as *mut c_char, cap, needed)
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// One message of a conversation (`llm_chat_message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// "system", "user", "assistant", ...
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

fn cstring(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::new(Status::InvalidArgument, format!("{} contains a NUL byte", what)))
}

/// Calls `f(buf, capacity, &mut length)` for a NUL-terminated string until it fits.
fn cstr_with_growing_buffer(
    initial: usize,
    mut f: impl FnMut(*mut c_char, usize, &mut usize) -> sys::llm_status,
) -> Result<String> {
    let mut buf: Vec<u8> = vec![0; initial.max(1)];
    loop {
        let mut len = 0usize;
        let code = f(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut len);
        if code == sys::LLM_ERR_BUFFER_TOO_SMALL {
            let bigger = (len + 1).max(buf.len() * 2);
            buf.resize(bigger, 0);
            continue;
        }
        check(code)?;
        buf.truncate(len);
        return Ok(String::from_utf8_lossy(&buf).into_owned());
    }
}

fn render(
    model: *const sys::llm_model,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    template: Option<&str>,
) -> Result<String> {
    let mut owned = Vec::with_capacity(messages.len());
    for m in messages {
        owned.push((cstring(&m.role, "a role")?, cstring(&m.content, "a message")?));
    }
    let raw: Vec<sys::llm_chat_message> = owned
        .iter()
        .map(|(role, content)| sys::llm_chat_message {
            role: role.as_ptr(),
            content: content.as_ptr(),
        })
        .collect();
    let template = match template {
        Some(t) => Some(cstring(t, "the template")?),
        None => None,
    };
    let mut params = std::mem::MaybeUninit::<sys::llm_chat_params>::zeroed();
    let mut params = unsafe {
        sys::llm_chat_params_init(params.as_mut_ptr());
        params.assume_init()
    };
    params.struct_size = std::mem::size_of::<sys::llm_chat_params>() as u32;
    params.add_generation_prompt = add_generation_prompt as i32;
    params.template_source = template.as_ref().map_or(ptr::null(), |t| t.as_ptr());
    let size = messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>() + 256;
    cstr_with_growing_buffer(size, |buf, cap, len| unsafe {
        sys::llm_chat_render(model, raw.as_ptr(), raw.len(), &params, buf, cap, len)
    })
}

/// [`Model::chat_render`] without a model: `bos_token` and `eos_token` are "".
pub fn chat_render(messages: &[ChatMessage], template: &str, add_generation_prompt: bool) -> Result<String> {
    render(ptr::null(), messages, add_generation_prompt, Some(template))
}

/// The GBNF text [`Grammar::from_json_schema`] compiles for `schema_json`.
pub fn json_schema_to_gbnf(schema_json: &str) -> Result<String> {
    let schema = cstring(schema_json, "the schema")?;
    cstr_with_growing_buffer(4096, |buf, cap, len| unsafe {
        sys::llm_json_schema_to_gbnf(schema.as_ptr(), buf, cap, len)
    })
}

/// A compiled grammar bound to a model's vocabulary (`llm_grammar`):
/// immutable, `Send + Sync`, usable by many sessions at once through
/// [`Sampling::grammar`]. Freed on drop. It does not need the model to
/// stay alive.
pub struct Grammar {
    raw: NonNull<sys::llm_grammar>,
}

// The C contract: a grammar is immutable and shareable by threads.
unsafe impl Send for Grammar {}
unsafe impl Sync for Grammar {}

impl Drop for Grammar {
    fn drop(&mut self) {
        // Sampling borrows the grammar, so no decode_step is using it here.
        unsafe { sys::llm_grammar_free(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammar").field("raw", &self.raw).finish()
    }
}

/// Two grammars are equal when they are the same object.
impl PartialEq for Grammar {
    fn eq(&self, other: &Grammar) -> bool {
        self.raw == other.raw
    }
}

impl Grammar {
    /// Compiles a GBNF grammar whose start rule is `root`. A syntax error
    /// gives [`Status::InvalidArgument`] with the line and column.
    pub fn new(model: &Model, gbnf: &str) -> Result<Grammar> {
        Grammar::with_root(model, gbnf, "root")
    }

    /// Compiles a GBNF grammar whose start rule is `root`.
    pub fn with_root(model: &Model, gbnf: &str, root: &str) -> Result<Grammar> {
        let gbnf = cstring(gbnf, "the grammar")?;
        let root = cstring(root, "the root rule")?;
        let mut out: *mut sys::llm_grammar = ptr::null_mut();
        check(unsafe { sys::llm_grammar_create(model.as_ptr(), gbnf.as_ptr(), root.as_ptr(), &mut out) })?;
        Grammar::wrap(out)
    }

    /// The grammar of the JSON texts a JSON Schema accepts (the subset of
    /// docs/GRAMMAR.md; others give [`Status::InvalidArgument`]).
    pub fn from_json_schema(model: &Model, schema_json: &str) -> Result<Grammar> {
        let schema = cstring(schema_json, "the schema")?;
        let mut out: *mut sys::llm_grammar = ptr::null_mut();
        check(unsafe { sys::llm_grammar_from_json_schema(model.as_ptr(), schema.as_ptr(), &mut out) })?;
        Grammar::wrap(out)
    }

    fn wrap(out: *mut sys::llm_grammar) -> Result<Grammar> {
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "the library returned LLM_OK and a NULL grammar"))?;
        Ok(Grammar { raw })
    }

    /// The C handle, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_ptr(&self) -> *const sys::llm_grammar {
        self.raw.as_ptr()
    }
}

/// Generated tokens to text to show (`llm_text_stream`): complete UTF-8
/// only, stop strings found across token boundaries (the text before a stop
/// is delivered; the stop and everything after it never are), and an
/// end-of-generation token ends the stream. `Send`, not `Sync`; holds a
/// reference to its model.
pub struct StopStream {
    raw: NonNull<sys::llm_text_stream>,
    model: Model,
    buf: Vec<u8>,
    stopped: bool,
}

unsafe impl Send for StopStream {}

impl Drop for StopStream {
    fn drop(&mut self) {
        unsafe { sys::llm_text_stream_free(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for StopStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopStream")
            .field("raw", &self.raw)
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl StopStream {
    /// A stream for `model` that ends at any of `stops` (non-empty, at most
    /// 64 of at most 1024 bytes each, else [`Status::InvalidArgument`]).
    pub fn new<S: AsRef<str>>(model: &Model, stops: &[S]) -> Result<StopStream> {
        let mut owned = Vec::with_capacity(stops.len());
        for stop in stops {
            owned.push(cstring(stop.as_ref(), "a stop string")?);
        }
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        let mut out: *mut sys::llm_text_stream = ptr::null_mut();
        check(unsafe { sys::llm_text_stream_create(model.as_ptr(), ptrs.as_ptr(), ptrs.len(), &mut out) })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "llm_text_stream_create returned LLM_OK and NULL"))?;
        let longest = owned.iter().map(|c| c.as_bytes().len()).max().unwrap_or(0);
        Ok(StopStream {
            raw,
            model: model.clone(),
            buf: vec![0; 256 + 3 * longest],
            stopped: false,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Feeds one generated token: the text that became safe to show (often
    /// empty while a stop string may be starting), and whether the stream
    /// has ended (a stop string or an end-of-generation token; later pushes
    /// give no text).
    pub fn push(&mut self, token: Token) -> Result<(String, bool)> {
        loop {
            let mut len = 0usize;
            let mut stopped = 0i32;
            let code = unsafe {
                sys::llm_text_stream_push(
                    self.raw.as_ptr(),
                    token,
                    self.buf.as_mut_ptr() as *mut c_char,
                    self.buf.len(),
                    &mut len,
                    &mut stopped,
                )
            };
            if code == sys::LLM_ERR_BUFFER_TOO_SMALL && len > self.buf.len() {
                self.buf.resize(len, 0); // the stream is unchanged on this status
                continue;
            }
            check(code)?;
            self.stopped = stopped != 0;
            return Ok((String::from_utf8_lossy(&self.buf[..len]).into_owned(), self.stopped));
        }
    }

    /// True once a stop string or an end-of-generation token ended the stream.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Ends the stream: the text still held back (a partial stop string is
    /// text after all; an unfinished character becomes U+FFFD).
    pub fn flush(&mut self) -> Result<String> {
        let raw = self.raw.as_ptr();
        let bytes = with_growing_buffer::<u8>(self.buf.len(), |buf, cap, len| unsafe {
            sys::llm_text_stream_flush(raw, buf as *mut c_char, cap, len)
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Starts over with the same stops.
    pub fn reset(&mut self) -> Result<()> {
        check(unsafe { sys::llm_text_stream_reset(self.raw.as_ptr()) })?;
        self.stopped = false;
        Ok(())
    }
}

/// Options of a session (`llm_session_params`).
#[derive(Clone)]
pub struct SessionParams {
    raw: sys::llm_session_params,
    cancel: Option<Arc<AtomicBool>>,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams::new()
    }
}

impl SessionParams {
    /// The library's defaults (`llm_session_params_init`).
    pub fn new() -> Self {
        let mut raw = std::mem::MaybeUninit::<sys::llm_session_params>::zeroed();
        unsafe { sys::llm_session_params_init(raw.as_mut_ptr()) };
        SessionParams {
            raw: unsafe { raw.assume_init() },
            cancel: None,
        }
    }
    /// Context size in tokens; 0 = the model's context length.
    pub fn max_tokens(mut self, n: u32) -> Self {
        self.raw.max_tokens = n;
        self
    }
    /// Sliding window in tokens; 0 = none.
    pub fn window(mut self, n: u32) -> Self {
        self.raw.window = n;
        self
    }
    pub fn n_sink(mut self, n: u32) -> Self {
        self.raw.n_sink = n;
        self
    }
    pub fn kv_type(mut self, t: KvType) -> Self {
        self.raw.kv_type = match t {
            KvType::F16 => sys::LLM_KV_F16,
            KvType::F32 => sys::LLM_KV_F32,
            KvType::Int8 => sys::LLM_KV_INT8,
            KvType::Int4 => sys::LLM_KV_INT4,
        };
        self
    }
    /// A flag polled during prefill; set it (from any thread) to make the
    /// running call fail with [`Status::Cancelled`].
    pub fn cancel_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }
}

/// Sampling settings (`llm_sampling`). The default is greedy.
///
/// `grammar` borrows a [`Grammar`] for as long as the settings live, so the
/// grammar outlives every `decode_step` that uses it (an `Arc<Grammar>`
/// lends one with `Some(&arc)`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling<'g> {
    /// <= 0: greedy.
    pub temperature: f32,
    /// <= 0: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    /// <= 0: off.
    pub min_p: f32,
    /// 1: off.
    pub repeat_penalty: f32,
    pub seed: u64,
    pub repeat_last_n: i32,
    /// Tokens the grammar forbids get probability 0; once it has ended only
    /// end-of-generation tokens remain. None: no constraint.
    pub grammar: Option<&'g Grammar>,
}

impl Default for Sampling<'_> {
    fn default() -> Self {
        let raw = Sampling::raw_defaults();
        Sampling {
            temperature: raw.temperature,
            top_k: raw.top_k,
            top_p: raw.top_p,
            min_p: raw.min_p,
            repeat_penalty: raw.repeat_penalty,
            seed: raw.seed,
            repeat_last_n: raw.repeat_last_n,
            grammar: None,
        }
    }
}

impl<'g> Sampling<'g> {
    /// Argmax (lowest id on ties): the library's defaults.
    pub fn greedy() -> Sampling<'g> {
        Sampling::default()
    }

    fn raw_defaults() -> sys::llm_sampling {
        let mut raw = std::mem::MaybeUninit::<sys::llm_sampling>::zeroed();
        unsafe {
            sys::llm_sampling_init(raw.as_mut_ptr());
            raw.assume_init()
        }
    }

    fn to_raw(self) -> sys::llm_sampling {
        let mut raw = Sampling::raw_defaults();
        raw.struct_size = std::mem::size_of::<sys::llm_sampling>() as u32;
        raw.temperature = self.temperature;
        raw.top_k = self.top_k;
        raw.top_p = self.top_p;
        raw.min_p = self.min_p;
        raw.repeat_penalty = self.repeat_penalty;
        raw.seed = self.seed;
        raw.repeat_last_n = self.repeat_last_n;
        raw.grammar = self.grammar.map_or(ptr::null(), |g| g.as_ptr());
        raw
    }
}

/// What [`Session::decode_batch_prefill`] does with one session: append
/// `prompt` (as [`Session::prefill`] would; empty: nothing), then sample its
/// next token with `sampling` unless `sample` is false (a chunk of a longer
/// prompt). The default appends nothing and samples greedily, so
/// `PrefillStep { prompt: &ids, ..PrefillStep::default() }` is a new request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillStep<'a> {
    pub prompt: &'a [Token],
    pub sample: bool,
    pub sampling: Sampling<'a>,
}

impl Default for PrefillStep<'_> {
    fn default() -> Self {
        PrefillStep {
            prompt: &[],
            sample: true,
            sampling: Sampling::default(),
        }
    }
}

/// Counters and timings of a session (`llm_session_stats_t`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionStats {
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

/// One sequence on a model. `Send` (may move between threads) but not
/// `Sync` (one thread at a time), as the C contract says.
pub struct Session {
    raw: NonNull<sys::llm_session>,
    model: Model,
    // The cancel flag's address is the C callback's user data.
    _cancel: Option<Arc<AtomicBool>>,
    // Last token appended or returned; the streaming detokenizer starts after it.
    last_token: Option<Token>,
}

// NonNull makes Session !Send and !Sync; a session may move between threads
// (the C API only forbids concurrent use), so Send is restored, Sync is not.
unsafe impl Send for Session {}

impl Drop for Session {
    fn drop(&mut self) {
        unsafe { sys::llm_session_free(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("raw", &self.raw)
            .field("model", &self.model)
            .finish()
    }
}

impl Session {
    pub fn new(model: &Model, params: &SessionParams) -> Result<Session> {
        let mut raw = params.raw;
        raw.struct_size = std::mem::size_of::<sys::llm_session_params>() as u32;
        if let Some(flag) = &params.cancel {
            raw.cancel = Some(cancel_trampoline);
            raw.cancel_user_data = Arc::as_ptr(flag) as *mut c_void;
        }
        let mut out: *mut sys::llm_session = ptr::null_mut();
        check(unsafe { sys::llm_session_create(model.as_ptr(), &raw, &mut out) })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "llm_session_create returned LLM_OK and NULL"))?;
        Ok(Session {
            raw,
            model: model.clone(),
            _cancel: params.cancel.clone(),
            last_token: None,
        })
    }

    /// Rebuilds a session saved with [`Session::save`] on `model` (same shape
    /// and KV page size). The bytes are validated: malformed input gives
    /// [`Status::Format`] or [`Status::Checksum`].
    pub fn restore(model: &Model, bytes: &[u8]) -> Result<Session> {
        let mut out: *mut sys::llm_session = ptr::null_mut();
        check(unsafe {
            sys::llm_session_restore(model.as_ptr(), bytes.as_ptr() as *const c_void, bytes.len(), &mut out)
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "llm_session_restore returned LLM_OK and NULL"))?;
        // The last token is not recoverable from the bytes through the C API.
        Ok(Session {
            raw,
            model: model.clone(),
            _cancel: None,
            last_token: None,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// An independent copy that shares this session's KV pages (copy on
    /// write). It keeps this session's cancel flag, if any.
    pub fn fork(&self) -> Result<Session> {
        let mut out: *mut sys::llm_session = ptr::null_mut();
        check(unsafe { sys::llm_session_fork(self.raw.as_ptr(), &mut out) })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "llm_session_fork returned LLM_OK and NULL"))?;
        // The fork may poll the same cancel callback: keep its flag alive too.
        Ok(Session {
            raw,
            model: self.model.clone(),
            _cancel: self._cancel.clone(),
            last_token: self.last_token,
        })
    }

    /// Serialises the session (tokens, KV cache, logits, sampler state) into
    /// versioned, checksummed bytes for [`Session::restore`].
    pub fn save(&self) -> Result<Vec<u8>> {
        let mut needed = 0usize;
        let code = unsafe { sys::llm_session_save(self.raw.as_ptr(), ptr::null_mut(), 0, &mut needed) };
        if code != sys::LLM_ERR_BUFFER_TOO_SMALL {
            check(code)?;
        }
        with_growing_buffer::<u8>(needed, |buf, cap, len| unsafe {
            sys::llm_session_save(self.raw.as_ptr(), buf as *mut c_void, cap, len)
        })
    }

    /// The C handle, for calls this crate does not wrap.
    pub fn as_ptr(&mut self) -> *mut sys::llm_session {
        self.raw.as_ptr()
    }

    /// Appends tokens in one batched forward pass. On failure nothing is appended.
    pub fn prefill(&mut self, tokens: &[Token]) -> Result<()> {
        check(unsafe { sys::llm_prefill(self.raw.as_ptr(), tokens.as_ptr(), tokens.len()) })?;
        if let Some(&t) = tokens.last() {
            self.last_token = Some(t);
        }
        Ok(())
    }

    /// Samples the next token (see `llm_decode_step`).
    pub fn decode_step(&mut self, sampling: &Sampling) -> Result<Token> {
        let raw = sampling.to_raw();
        let mut token: Token = -1;
        check(unsafe { sys::llm_decode_step(self.raw.as_ptr(), &raw, &mut token) })?;
        self.last_token = Some(token);
        Ok(token)
    }

    /// One [`decode_step`](Session::decode_step) on each session, in order, as
    /// one call (`llm_decode_batch`): on a CUDA model the sessions' pending
    /// tokens run as one batched pass, so they share one read of the weights.
    /// Returns the tokens in the order of `sessions`; they are the ones each
    /// session would have sampled alone. All sessions must belong to the same
    /// C model (clones of one [`Model`] do; two loads of one file do not):
    /// otherwise [`Status::InvalidArgument`] and nothing advances.
    ///
    /// On a failure the sessions before the failing one have advanced, and
    /// their tokens are lost to the caller: use
    /// [`decode_batch_into`](Session::decode_batch_into) to keep them.
    ///
    /// ```no_run
    /// # use libllm::{Model, Sampling, Session};
    /// let model = Model::load("stories260K.gguf")?;
    /// let (mut a, mut b) = (model.session()?, model.session()?);
    /// a.prefill(&model.tokenize("Once upon a time", true)?)?;
    /// b.prefill(&model.tokenize("Lily had a", true)?)?;
    /// let tokens = Session::decode_batch(&mut [&mut a, &mut b], &Sampling::greedy())?;
    /// assert_eq!(tokens.len(), 2);
    /// # Ok::<(), libllm::Error>(())
    /// ```
    ///
    /// The mutable borrows prove the sessions distinct; one session twice
    /// does not compile:
    /// ```compile_fail,E0499
    /// # use libllm::{Model, Sampling, Session};
    /// # let model = Model::load("stories260K.gguf").unwrap();
    /// let mut a = model.session().unwrap();
    /// let _ = Session::decode_batch(&mut [&mut a, &mut a], &Sampling::greedy());
    /// ```
    pub fn decode_batch(sessions: &mut [&mut Session], sampling: &Sampling) -> Result<Vec<Token>> {
        let mut tokens = vec![-1; sessions.len()];
        Session::decode_batch_into(sessions, sampling, &mut tokens)?;
        Ok(tokens)
    }

    /// [`decode_batch`](Session::decode_batch) writing into `tokens`, which
    /// must be as long as `sessions` (else [`Status::InvalidArgument`]).
    /// After a failure `tokens[i]` still holds the token of every session
    /// that advanced before it, and -1 for the failing session and those
    /// after it (they are unchanged).
    pub fn decode_batch_into(sessions: &mut [&mut Session], sampling: &Sampling, tokens: &mut [Token]) -> Result<()> {
        if tokens.len() != sessions.len() {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("{} tokens for {} sessions", tokens.len(), sessions.len()),
            ));
        }
        if sessions.is_empty() {
            return Ok(()); // nothing to do (and llm_decode_batch 0.2.0 reads sessions[0] even for n == 0)
        }
        let raw = sampling.to_raw();
        let ptrs: Vec<*mut sys::llm_session> = sessions.iter().map(|s| s.raw.as_ptr()).collect();
        for t in tokens.iter_mut() {
            *t = -1;
        }
        let code = unsafe { sys::llm_decode_batch(ptrs.as_ptr(), ptrs.len(), &raw, tokens.as_mut_ptr()) };
        // Sessions that advanced (also before a failure) continue their streams after their token.
        for (s, &t) in sessions.iter_mut().zip(tokens.iter()) {
            if t >= 0 {
                s.last_token = Some(t);
            }
        }
        check(code)
    }

    /// [`decode_batch`](Session::decode_batch) with settings of their own for
    /// every session (`llm_decode_batch_each`, library 0.3): `sessions[i]`
    /// samples with `samplings[i]`, so other temperatures, seeds and grammars
    /// share one batched pass. Every setting is checked before any session
    /// moves (a bad one is [`Status::InvalidArgument`], nothing advances).
    /// `samplings` must be as long as `sessions`. Each session gets the token
    /// it would have sampled alone with its settings.
    ///
    /// ```no_run
    /// # use libllm::{Model, Sampling, Session};
    /// # let model = Model::load("stories260K.gguf")?;
    /// # let (mut a, mut b) = (model.session()?, model.session()?);
    /// let hot = Sampling { temperature: 0.9, seed: 5, ..Sampling::default() };
    /// let tokens = Session::decode_batch_each(&mut [&mut a, &mut b], &[Sampling::greedy(), hot])?;
    /// # Ok::<(), libllm::Error>(())
    /// ```
    pub fn decode_batch_each(sessions: &mut [&mut Session], samplings: &[Sampling]) -> Result<Vec<Token>> {
        let mut tokens = vec![-1; sessions.len()];
        Session::decode_batch_each_into(sessions, samplings, &mut tokens)?;
        Ok(tokens)
    }

    /// [`decode_batch_each`](Session::decode_batch_each) writing into
    /// `tokens`; after a failure it holds the tokens of the sessions that
    /// advanced, as [`decode_batch_into`](Session::decode_batch_into) does.
    pub fn decode_batch_each_into(
        sessions: &mut [&mut Session],
        samplings: &[Sampling],
        tokens: &mut [Token],
    ) -> Result<()> {
        check_batch_lengths(sessions.len(), samplings.len(), "samplings")?;
        check_batch_lengths(sessions.len(), tokens.len(), "tokens")?;
        if sessions.is_empty() {
            return Ok(());
        }
        let raws: Vec<sys::llm_sampling> = samplings.iter().map(|s| s.to_raw()).collect();
        let raw_ptrs: Vec<*const sys::llm_sampling> = raws.iter().map(|r| r as *const sys::llm_sampling).collect();
        let ptrs: Vec<*mut sys::llm_session> = sessions.iter().map(|s| s.raw.as_ptr()).collect();
        for t in tokens.iter_mut() {
            *t = -1;
        }
        let code =
            unsafe { sys::llm_decode_batch_each(ptrs.as_ptr(), ptrs.len(), raw_ptrs.as_ptr(), tokens.as_mut_ptr()) };
        for (s, &t) in sessions.iter_mut().zip(tokens.iter()) {
            if t >= 0 {
                s.last_token = Some(t);
            }
        }
        check(code)
    }

    /// [`decode_batch_each`](Session::decode_batch_each) where sessions may
    /// first append prompt tokens (`llm_decode_batch_prefill`, library 0.4):
    /// `sessions[i]` does `steps[i]` (see [`PrefillStep`]). The prompts join
    /// the same batched pass as the other sessions' pending tokens, so a new
    /// request, or a chunk of a long prompt, does not stall the running
    /// generations. Returns one entry per session: its token, or -1 where
    /// `sample` was false. Each session ends exactly as
    /// [`prefill`](Session::prefill) then [`decode_step`](Session::decode_step)
    /// alone would leave it. Every token id and setting is checked before
    /// any session moves ([`Status::InvalidArgument`], nothing appended).
    /// `steps` must be as long as `sessions`.
    ///
    /// On a failure it stops at the failing session: those before it have
    /// advanced (use [`decode_batch_prefill_into`](Session::decode_batch_prefill_into)
    /// to keep their tokens), it and those after it are unchanged, except
    /// when a grammar allows no token: then the sessions after it that joined
    /// the pass have appended their prompt.
    ///
    /// ```no_run
    /// # use libllm::{Model, PrefillStep, Session};
    /// # let model = Model::load("stories260K.gguf")?;
    /// # let (mut running, mut new) = (model.session()?, model.session()?);
    /// let prompt = model.tokenize("Lily had a", true)?;
    /// let steps = [PrefillStep::default(), PrefillStep { prompt: &prompt, ..PrefillStep::default() }];
    /// let tokens = Session::decode_batch_prefill(&mut [&mut running, &mut new], &steps)?;
    /// # Ok::<(), libllm::Error>(())
    /// ```
    pub fn decode_batch_prefill(sessions: &mut [&mut Session], steps: &[PrefillStep]) -> Result<Vec<Token>> {
        let mut tokens = vec![-1; sessions.len()];
        Session::decode_batch_prefill_into(sessions, steps, &mut tokens)?;
        Ok(tokens)
    }

    /// [`decode_batch_prefill`](Session::decode_batch_prefill) writing into
    /// `tokens` (as long as `sessions`). After a failure `tokens[i]` holds the
    /// token of every sampled session that advanced before the failing one,
    /// and -1 for the others. A session with a prompt and no token there
    /// may or may not have appended it: its [`stream`](Session::stream)
    /// then starts without a previous token.
    pub fn decode_batch_prefill_into(
        sessions: &mut [&mut Session],
        steps: &[PrefillStep],
        tokens: &mut [Token],
    ) -> Result<()> {
        check_batch_lengths(sessions.len(), steps.len(), "steps")?;
        check_batch_lengths(sessions.len(), tokens.len(), "tokens")?;
        if sessions.is_empty() {
            return Ok(());
        }
        let prompts: Vec<*const Token> = steps
            .iter()
            .map(|st| {
                if st.prompt.is_empty() {
                    ptr::null()
                } else {
                    st.prompt.as_ptr()
                }
            })
            .collect();
        let n_prompts: Vec<usize> = steps.iter().map(|st| st.prompt.len()).collect();
        let sample: Vec<i32> = steps.iter().map(|st| st.sample as i32).collect();
        let raws: Vec<sys::llm_sampling> = steps.iter().map(|st| st.sampling.to_raw()).collect();
        let raw_ptrs: Vec<*const sys::llm_sampling> = raws.iter().map(|r| r as *const sys::llm_sampling).collect();
        let ptrs: Vec<*mut sys::llm_session> = sessions.iter().map(|s| s.raw.as_ptr()).collect();
        for t in tokens.iter_mut() {
            *t = -1;
        }
        let code = unsafe {
            sys::llm_decode_batch_prefill(
                ptrs.as_ptr(),
                ptrs.len(),
                prompts.as_ptr(),
                n_prompts.as_ptr(),
                sample.as_ptr(),
                raw_ptrs.as_ptr(),
                tokens.as_mut_ptr(),
            )
        };
        for ((s, st), &t) in sessions.iter_mut().zip(steps).zip(tokens.iter()) {
            if t >= 0 {
                s.last_token = Some(t);
            } else if let Some(&last) = st.prompt.last() {
                // Appended on success; unknown after a failure.
                s.last_token = if code == sys::LLM_OK { Some(last) } else { None };
            }
        }
        check(code)
    }

    /// The logits the next `decode_step` samples from. Borrowed until the
    /// session is used again.
    pub fn logits(&mut self) -> Result<&[f32]> {
        let mut p: *const f32 = ptr::null();
        let mut n = 0usize;
        check(unsafe { sys::llm_logits(self.raw.as_ptr(), &mut p, &mut n) })?;
        if p.is_null() || n == 0 {
            return Err(Error::new(Status::Internal, "llm_logits returned no array"));
        }
        Ok(unsafe { std::slice::from_raw_parts(p, n) })
    }

    /// Drops all tokens, keeping the options.
    pub fn reset(&mut self) -> Result<()> {
        check(unsafe { sys::llm_session_reset(self.raw.as_ptr()) })?;
        self.last_token = None;
        Ok(())
    }

    /// Removes cached tokens `[n_keep, n_keep + n_discard)`.
    pub fn kv_evict(&mut self, n_keep: u32, n_discard: u32) -> Result<()> {
        let before = self.stats()?.n_tokens;
        check(unsafe { sys::llm_kv_evict(self.raw.as_ptr(), n_keep, n_discard) })?;
        if n_keep as u64 + n_discard as u64 >= before as u64 {
            self.last_token = None; // the tail went; the new last token is unknown here
        }
        Ok(())
    }

    pub fn stats(&self) -> Result<SessionStats> {
        let mut s: sys::llm_session_stats_t = unsafe { std::mem::zeroed() };
        s.struct_size = std::mem::size_of::<sys::llm_session_stats_t>() as u32;
        check(unsafe { sys::llm_session_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(SessionStats {
            n_tokens: s.n_tokens,
            n_cached: s.n_cached,
            n_prompt: s.n_prompt,
            n_generated: s.n_generated,
            kv_pages: s.kv_pages,
            kv_bytes: s.kv_bytes,
            ttft_ms: s.ttft_ms,
            itl_median_ms: s.itl_median_ms,
            itl_p95_ms: s.itl_p95_ms,
            prompt_tokens_per_s: s.prompt_tokens_per_s,
            gen_tokens_per_s: s.gen_tokens_per_s,
            n_evicted: s.n_evicted,
        })
    }

    /// Streams up to `max_tokens` generated tokens with their text, stopping
    /// early at an end-of-generation token. The session must hold a prompt.
    pub fn stream<'s>(&'s mut self, max_tokens: usize, sampling: Sampling<'s>) -> TextStream<'s> {
        let detok = Detokenizer::new(&self.model, self.last_token);
        TextStream {
            session: self,
            detok,
            sampling,
            remaining: max_tokens,
            done: false,
        }
    }

    /// Tokenizes `prompt` (with BOS), prefills it and streams the continuation.
    pub fn generate<'s>(
        &'s mut self,
        prompt: &str,
        max_tokens: usize,
        sampling: Sampling<'s>,
    ) -> Result<TextStream<'s>> {
        let tokens = self.model.tokenize(prompt, true)?;
        self.prefill(&tokens)?;
        Ok(self.stream(max_tokens, sampling))
    }
}

// A per-session argument of a batch call must have one entry per session.
fn check_batch_lengths(n_sessions: usize, n: usize, what: &str) -> Result<()> {
    if n == n_sessions {
        return Ok(());
    }
    Err(Error::new(
        Status::InvalidArgument,
        format!("{} {} for {} sessions", n, what, n_sessions),
    ))
}

/// One generated token and the text it completes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub token: Token,
    /// Complete UTF-8 text available after this token (may be empty while a
    /// multi-byte character is unfinished).
    pub text: String,
}

/// Iterator of [`Piece`]s from [`Session::stream`]. An end-of-generation token
/// ends the stream and is not yielded, except when bytes were still held back:
/// then they come (as U+FFFD) in one last piece carrying that token. After the
/// last token of `max_tokens`, held-back bytes are appended to its text.
pub struct TextStream<'s> {
    session: &'s mut Session,
    detok: Detokenizer,
    sampling: Sampling<'s>,
    remaining: usize,
    done: bool,
}

impl<'s> TextStream<'s> {
    /// Collects the remaining text.
    pub fn text(self) -> Result<String> {
        let mut out = String::new();
        for piece in self {
            out.push_str(&piece?.text);
        }
        Ok(out)
    }
}

impl<'s> Iterator for TextStream<'s> {
    type Item = Result<Piece>;

    fn next(&mut self) -> Option<Result<Piece>> {
        if self.done || self.remaining == 0 {
            return None;
        }
        let step = (|| {
            let token = self.session.decode_step(&self.sampling)?;
            self.remaining -= 1;
            if self.session.model.is_eog(token) {
                self.done = true;
                let rest = self.detok.flush()?;
                return Ok(if rest.is_empty() {
                    None
                } else {
                    Some(Piece { token, text: rest })
                });
            }
            let mut text = self.detok.push(token)?;
            if self.remaining == 0 {
                text.push_str(&self.detok.flush()?);
            }
            Ok(Some(Piece { token, text }))
        })();
        match step {
            Ok(Some(piece)) => Some(Ok(piece)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
