"""ctypes binding of libllm (include/llm.h), an embeddable LLM inference engine.

    import libllm
    with libllm.Model("stories260K.gguf") as model, model.session() as session:
        for piece in session.generate("Once upon a time", max_tokens=64):
            print(piece.text, end="", flush=True)

The shared library is found through $LLM_LIB (a file), $LLM_LIB_DIR (a
directory holding libllm.so.0), or the system loader path.

Threading follows the C contract: a Model may be used from many threads at
once; a Session by one thread at a time. ctypes releases the GIL during
every C call, so sessions on different threads really run in parallel.
Each session keeps its model alive: Model.close() frees the C model only
once its last session is closed.
"""
import ctypes
import os
import threading
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union
from ctypes import POINTER, byref, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_size_t, c_uint8, \
    c_uint32, c_uint64, c_void_p

__all__ = [
    "Status", "LlmError", "Device", "KvType", "LogLevel", "Model", "Session", "Sampling", "Detokenizer",
    "Piece", "decode_batch", "decode_batch_prefill", "version", "version_string", "HEADER_VERSION", "Grammar", "TextStream",
    "chat_render", "json_schema_to_gbnf",
]

HEADER_VERSION = 0 * 10000 + 4 * 100 + 0  # LLM_VERSION_NUMBER of the header this file mirrors
_SONAME = "libllm.so.0"


def _load_library():
    # An installed package (pip install ./bindings/python) carries libllm.so next to this file.
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libllm.so")
    if os.path.exists(bundled):
        return ctypes.CDLL(bundled)
    path = os.environ.get("LLM_LIB")
    if not path:
        libdir = os.environ.get("LLM_LIB_DIR")
        if libdir:
            for name in (_SONAME, "libllm.so", "libllm.dylib", "llm.dll"):
                candidate = os.path.join(libdir, name)
                if os.path.exists(candidate):
                    path = candidate
                    break
            else:
                raise OSError("LLM_LIB_DIR=%s holds no libllm shared library" % libdir)
        else:
            path = _SONAME  # the dynamic loader's search path
    return ctypes.CDLL(path)


_lib = _load_library()

llm_token = c_int32
_status = c_int


class Status:
    """llm_status values (ABI: they never change)."""
    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    IO = 3
    FORMAT = 4
    CHECKSUM = 5
    UNSUPPORTED = 6
    DEVICE = 7
    CONTEXT_FULL = 8
    CANCELLED = 9
    BUFFER_TOO_SMALL = 10
    INTERNAL = 99


class Device:
    AUTO = 0
    CPU = 1
    CUDA = 2


class KvType:
    F16 = 0
    F32 = 1
    INT8 = 2
    INT4 = 3


class LogLevel:
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3


LOAD_VOCAB_ONLY = 1
LOAD_REFERENCE_MATH = 2
LOAD_NO_HUGE_PAGES = 4
TOKENIZE_ADD_BOS = 1
TOKENIZE_PARSE_SPECIAL = 2

_progress_fn = ctypes.CFUNCTYPE(c_int, c_float, c_void_p)
_log_fn = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
_cancel_fn = ctypes.CFUNCTYPE(c_int, c_void_p)


class _LoadParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("device", c_int), ("n_threads", c_int32), ("flags", c_uint32),
        ("progress", _progress_fn), ("progress_user_data", c_void_p),
        ("log", _log_fn), ("log_user_data", c_void_p),
        ("kv_budget_bytes", c_uint64), ("kv_page_tokens", c_uint32),
    ]


class _ModelProperties(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("vocab_size", c_uint32), ("context_length", c_uint32),
        ("bos", llm_token), ("eos", llm_token), ("n_layers", c_uint32), ("dim", c_uint32),
        ("hidden_dim", c_uint32), ("n_heads", c_uint32), ("n_kv_heads", c_uint32), ("head_dim", c_uint32),
        ("device", c_int), ("n_params", c_uint64), ("weight_bytes", c_uint64),
        ("architecture", c_char * 32), ("weight_type", c_char * 16),
    ]


class _DetokState(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("prev_token", llm_token), ("n_pending", c_uint32),
                ("pending", c_uint8 * 4)]


class _SessionParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("max_tokens", c_uint32), ("window", c_uint32), ("n_sink", c_uint32),
        ("kv_type", c_int), ("cancel", _cancel_fn), ("cancel_user_data", c_void_p),
    ]


class _Sampling(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
        ("min_p", c_float), ("repeat_penalty", c_float), ("seed", c_uint64), ("repeat_last_n", c_int32),
        ("grammar", c_void_p),
    ]


class _SessionStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32), ("n_tokens", c_uint32), ("n_cached", c_uint32), ("n_prompt", c_uint32),
        ("n_generated", c_uint32), ("kv_pages", c_uint32), ("kv_bytes", c_uint64), ("ttft_ms", c_double),
        ("itl_median_ms", c_double), ("itl_p95_ms", c_double), ("prompt_tokens_per_s", c_double),
        ("gen_tokens_per_s", c_double), ("n_evicted", c_uint32),
    ]


class _ChatMessage(ctypes.Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class _ChatParams(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("template_source", c_char_p), ("add_generation_prompt", c_int32)]


def _declare(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_version = _declare("llm_version", c_uint32)
_version_string = _declare("llm_version_string", c_char_p)
_status_string = _declare("llm_status_string", c_char_p, _status)
_last_error = _declare("llm_last_error", c_char_p)
_load_params_init = _declare("llm_load_params_init", None, POINTER(_LoadParams))
_load = _declare("llm_load", _status, c_char_p, POINTER(_LoadParams), POINTER(c_void_p))
_model_free = _declare("llm_model_free", None, c_void_p)
_model_info = _declare("llm_model_info", _status, c_void_p, POINTER(_ModelProperties))
_tokenize = _declare("llm_tokenize", _status, c_void_p, c_char_p, c_size_t, c_uint32, POINTER(llm_token), c_size_t,
                     POINTER(c_size_t))
_token_to_text = _declare("llm_token_to_text", _status, c_void_p, llm_token, POINTER(c_char), c_size_t,
                          POINTER(c_size_t))
_detokenize = _declare("llm_detokenize", _status, c_void_p, POINTER(llm_token), c_size_t, POINTER(c_char), c_size_t,
                       POINTER(c_size_t))
_token_is_eog = _declare("llm_token_is_eog", c_int, c_void_p, llm_token)
_detok_init = _declare("llm_detok_init", None, POINTER(_DetokState), llm_token)
_detok_push = _declare("llm_detok_push", _status, c_void_p, POINTER(_DetokState), llm_token, POINTER(c_char),
                       c_size_t, POINTER(c_size_t))
_detok_flush = _declare("llm_detok_flush", _status, POINTER(_DetokState), POINTER(c_char), c_size_t,
                        POINTER(c_size_t))
_session_params_init = _declare("llm_session_params_init", None, POINTER(_SessionParams))
_session_create = _declare("llm_session_create", _status, c_void_p, POINTER(_SessionParams), POINTER(c_void_p))
_session_free = _declare("llm_session_free", None, c_void_p)
_session_reset = _declare("llm_session_reset", _status, c_void_p)
_prefill = _declare("llm_prefill", _status, c_void_p, POINTER(llm_token), c_size_t)
_logits = _declare("llm_logits", _status, c_void_p, POINTER(POINTER(c_float)), POINTER(c_size_t))
_sampling_init = _declare("llm_sampling_init", None, POINTER(_Sampling))
_decode_step = _declare("llm_decode_step", _status, c_void_p, POINTER(_Sampling), POINTER(llm_token))
_decode_batch = _declare("llm_decode_batch", _status, POINTER(c_void_p), c_size_t, POINTER(_Sampling),
                        POINTER(llm_token))
_decode_batch_each = _declare("llm_decode_batch_each", _status, POINTER(c_void_p), c_size_t,
                             POINTER(POINTER(_Sampling)), POINTER(llm_token))
_decode_batch_prefill = _declare("llm_decode_batch_prefill", _status, POINTER(c_void_p), c_size_t,
                                POINTER(POINTER(llm_token)), POINTER(c_size_t), POINTER(c_int32),
                                POINTER(POINTER(_Sampling)), POINTER(llm_token))
_kv_evict = _declare("llm_kv_evict", _status, c_void_p, c_uint32, c_uint32)
_session_stats = _declare("llm_session_stats", _status, c_void_p, POINTER(_SessionStats))
_session_fork = _declare("llm_session_fork", _status, c_void_p, POINTER(c_void_p))
_session_save = _declare("llm_session_save", _status, c_void_p, c_void_p, c_size_t, POINTER(c_size_t))
_session_restore = _declare("llm_session_restore", _status, c_void_p, c_char_p, c_size_t, POINTER(c_void_p))
_chat_params_init = _declare("llm_chat_params_init", None, POINTER(_ChatParams))
_chat_render = _declare("llm_chat_render", _status, c_void_p, POINTER(_ChatMessage), c_size_t, POINTER(_ChatParams),
                        POINTER(c_char), c_size_t, POINTER(c_size_t))
_model_chat_template = _declare("llm_model_chat_template", _status, c_void_p, POINTER(c_char), c_size_t,
                                POINTER(c_size_t))
_grammar_create = _declare("llm_grammar_create", _status, c_void_p, c_char_p, c_char_p, POINTER(c_void_p))
_grammar_from_json_schema = _declare("llm_grammar_from_json_schema", _status, c_void_p, c_char_p, POINTER(c_void_p))
_json_schema_to_gbnf = _declare("llm_json_schema_to_gbnf", _status, c_char_p, POINTER(c_char), c_size_t,
                                POINTER(c_size_t))
_grammar_free = _declare("llm_grammar_free", None, c_void_p)
_text_stream_create = _declare("llm_text_stream_create", _status, c_void_p, POINTER(c_char_p), c_size_t,
                               POINTER(c_void_p))
_text_stream_push = _declare("llm_text_stream_push", _status, c_void_p, llm_token, POINTER(c_char), c_size_t,
                             POINTER(c_size_t), POINTER(c_int32))
_text_stream_flush = _declare("llm_text_stream_flush", _status, c_void_p, POINTER(c_char), c_size_t,
                              POINTER(c_size_t))
_text_stream_reset = _declare("llm_text_stream_reset", _status, c_void_p)
_text_stream_free = _declare("llm_text_stream_free", None, c_void_p)


class LlmError(Exception):
    """A failed call: .status (an llm_status value) and .message (llm_last_error).
    A failed decode_batch or decode_batch_prefill also sets .tokens (see
    decode_batch)."""

    def __init__(self, status, message=""):
        self.status = status
        self.message = message
        name = _status_string(status).decode("utf-8", "replace")
        super().__init__("%s (%s)" % (message, name) if message else name)


def _check(status):
    # llm_last_error is thread-local; ctypes runs the next call on this same
    # thread, so reading it right away gives this failure's text.
    if status != Status.OK:
        raise LlmError(status, (_last_error() or b"").decode("utf-8", "replace"))


def _grow(initial, call):
    """call(buf, capacity, byref(length)) with a growing char buffer; returns bytes."""
    cap = max(initial, 1)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = c_size_t(0)
        st = call(buf, cap, byref(n))
        if st == Status.BUFFER_TOO_SMALL and n.value > cap:
            cap = n.value
            continue
        _check(st)
        return buf.raw[:n.value]


def _grow_cstr(initial, call):
    """_grow for calls that write a NUL-terminated string: room for the NUL too."""
    cap = max(initial, 1)
    while True:
        buf = ctypes.create_string_buffer(cap)
        n = c_size_t(0)
        st = call(buf, cap, byref(n))
        if st == Status.BUFFER_TOO_SMALL:
            cap = max(n.value + 1, cap * 2)
            continue
        _check(st)
        return buf.raw[:n.value]


def version():
    """Run-time LLM_VERSION_NUMBER of the loaded library."""
    return _version()


def version_string():
    return _version_string().decode()


class Sampling:
    """llm_sampling; the defaults come from llm_sampling_init (greedy).
    grammar: an optional Grammar that constrains the tokens (it must stay
    open while decode_step uses it; the Sampling keeps it referenced)."""

    def __init__(self, **fields):
        raw = _Sampling()
        _sampling_init(byref(raw))
        self.temperature = raw.temperature
        self.top_k = raw.top_k
        self.top_p = raw.top_p
        self.min_p = raw.min_p
        self.repeat_penalty = raw.repeat_penalty
        self.seed = raw.seed
        self.repeat_last_n = raw.repeat_last_n
        self.grammar = None  # type: Optional[Grammar]
        for k, v in fields.items():
            if not hasattr(self, k):
                raise TypeError("unknown sampling field %r" % k)
            setattr(self, k, v)

    def _raw(self):
        raw = _Sampling()
        _sampling_init(byref(raw))
        raw.struct_size = ctypes.sizeof(_Sampling)
        for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "repeat_last_n"):
            setattr(raw, k, getattr(self, k))
        if self.grammar is not None:
            if not isinstance(self.grammar, Grammar):
                raise TypeError("Sampling.grammar is %s, not a libllm.Grammar" % type(self.grammar).__name__)
            raw.grammar = self.grammar._handle()
        return raw


class Piece:
    """One generated token and the complete UTF-8 text it makes available."""
    __slots__ = ("token", "text")

    def __init__(self, token, text):
        self.token = token
        self.text = text

    def __repr__(self):
        return "Piece(%d, %r)" % (self.token, self.text)


class Model:
    """A loaded model (native .llm or GGUF). Thread-safe. Use as a context
    manager or call close()."""

    def __init__(self, path, device=Device.AUTO, n_threads=0, vocab_only=False, reference_math=False,
                 kv_budget_bytes=0, kv_page_tokens=0, progress=None, log=None):
        params = _LoadParams()
        _load_params_init(byref(params))
        params.device = device
        params.n_threads = n_threads
        if vocab_only:
            params.flags |= LOAD_VOCAB_ONLY
        if reference_math:
            params.flags |= LOAD_REFERENCE_MATH
        if kv_budget_bytes:
            params.kv_budget_bytes = kv_budget_bytes
        if kv_page_tokens:
            params.kv_page_tokens = kv_page_tokens
        self._progress_cb = None
        self._log_cb = None
        if progress is not None:
            # progress(fraction) -> truthy to continue, falsy to cancel.
            def _progress(p, _user):
                try:
                    return 0 if progress(p) else 1
                except BaseException:
                    return 1
            self._progress_cb = _progress_fn(_progress)
            params.progress = self._progress_cb
        if log is not None:
            # The C model may log for its whole life: keep the thunk referenced.
            def _log(level, message, _user):
                try:
                    log(level, (message or b"").decode("utf-8", "replace"))
                except BaseException:
                    pass
            self._log_cb = _log_fn(_log)
            params.log = self._log_cb
        out = c_void_p()
        _check(_load(os.fsencode(path), byref(params), byref(out)))
        self._ptr = out.value
        self._lock = threading.Lock()
        self._refs = 1  # the owner's reference plus one per open session
        self._closed = False

    def _handle(self):
        if self._ptr is None:
            raise LlmError(Status.INVALID_ARGUMENT, "model is closed")
        return self._ptr

    def _open_handle(self):
        if self._closed:
            raise LlmError(Status.INVALID_ARGUMENT, "model is closed")
        return self._handle()

    def _acquire(self):
        with self._lock:
            if self._closed or self._ptr is None:
                raise LlmError(Status.INVALID_ARGUMENT, "model is closed")
            self._refs += 1

    def _acquire_shared(self):
        # For forks: the parent session's reference keeps the model alive even
        # after the owner's close().
        with self._lock:
            if self._ptr is None:
                raise LlmError(Status.INVALID_ARGUMENT, "model is closed")
            self._refs += 1

    def _release(self):
        with self._lock:
            self._refs -= 1
            ptr = self._ptr if self._refs == 0 else None
            if ptr is not None:
                self._ptr = None
        if ptr is not None:
            _model_free(ptr)

    def close(self):
        """Releases the owner's reference; the C model is freed when the last
        session is closed too. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None) is not None and not getattr(self, "_closed", True):
            self.close()

    def info(self):
        """llm_model_properties as a dict."""
        p = _ModelProperties()
        p.struct_size = ctypes.sizeof(p)
        _check(_model_info(self._open_handle(), byref(p)))
        out = {name: getattr(p, name) for name, _ in _ModelProperties._fields_ if name != "struct_size"}
        out["architecture"] = p.architecture.decode("utf-8", "replace")
        out["weight_type"] = p.weight_type.decode("utf-8", "replace")
        return out

    def _tokenize(self, text, add_bos=True, parse_special=False):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        flags = (TOKENIZE_ADD_BOS if add_bos else 0) | (TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        cap = len(data) + 3
        while True:
            buf = (llm_token * cap)()
            n = c_size_t(0)
            st = _tokenize(self._handle(), data, len(data), flags, buf, cap, byref(n))
            if st == Status.BUFFER_TOO_SMALL and n.value > cap:
                cap = n.value
                continue
            _check(st)
            return list(buf[:n.value])

    def tokenize(self, text, add_bos=True, parse_special=False):
        """Token ids of text (str, or bytes tokenized as given)."""
        self._open_handle()
        return self._tokenize(text, add_bos, parse_special)

    def token_bytes(self, token):
        h = self._open_handle()
        return _grow(32, lambda buf, cap, n: _token_to_text(h, token, buf, cap, n))

    def detokenize(self, tokens):
        h = self._open_handle()
        arr = (llm_token * len(tokens))(*tokens)
        raw = _grow(8 * len(tokens) + 16, lambda buf, cap, n: _detokenize(h, arr, len(tokens), buf, cap, n))
        return raw.decode("utf-8", "replace")

    def _is_eog(self, token):
        return _token_is_eog(self._handle(), token) != 0

    def is_eog(self, token):
        self._open_handle()
        return self._is_eog(token)

    def detokenizer(self, prev_token=-1):
        return Detokenizer(self, prev_token)

    def chat_render(self, messages: Iterable[Union[Mapping[str, str], Tuple[str, str]]],
                    add_generation_prompt: bool = True, template: Optional[str] = None) -> str:
        """The conversation as prompt text (llm_chat_render) through `template`
        (Jinja2 source), or the model's own template when None. Messages are
        {"role": ..., "content": ...} mappings or (role, content) pairs. The
        text usually starts with the BOS text: tokenize it with
        add_bos=False, parse_special=True. A model without a template (and no
        built-in that fits) raises LlmError with Status.UNSUPPORTED."""
        return _render(self._open_handle(), messages, add_generation_prompt, template)

    def chat_template(self) -> str:
        """The Jinja2 template chat_render uses when none is passed: the
        file's, or the built-in one. LlmError UNSUPPORTED if there is none."""
        h = self._open_handle()
        return _grow_cstr(4096, lambda buf, cap, n: _model_chat_template(h, buf, cap, n)).decode("utf-8", "replace")

    def grammar(self, gbnf: str, root: str = "root") -> "Grammar":
        return Grammar(self, gbnf, root)

    def text_stream(self, stops: Sequence[str] = ()) -> "TextStream":
        return TextStream(self, stops)

    def session(self, max_tokens=0, window=0, n_sink=None, kv_type=KvType.F16):
        return Session(self, max_tokens=max_tokens, window=window, n_sink=n_sink, kv_type=kv_type)

    def restore_session(self, saved):
        """Rebuilds a session from Session.save() bytes (same model shape and KV
        page size). Malformed bytes raise LlmError (FORMAT or CHECKSUM)."""
        saved = bytes(saved)
        self._acquire()
        out = c_void_p()
        try:
            _check(_session_restore(self._handle(), saved, len(saved), byref(out)))
        except BaseException:
            self._release()
            raise
        return Session._wrap(self, out.value, None, None, -1)


class Detokenizer:
    """Streaming detokenizer (llm_detok_push): emits only complete UTF-8."""

    def __init__(self, model, prev_token=-1):
        self._model = model
        self._state = _DetokState()
        _detok_init(byref(self._state), prev_token)
        self._cap = 64

    def push(self, token):
        while True:
            buf = ctypes.create_string_buffer(self._cap)
            n = c_size_t(0)
            st = _detok_push(self._model._handle(), byref(self._state), token, buf, self._cap, byref(n))
            if st == Status.BUFFER_TOO_SMALL and n.value > self._cap:
                self._cap = n.value  # the state is unchanged on this status
                continue
            _check(st)
            return buf.raw[:n.value].decode("utf-8", "replace")

    def flush(self):
        return _grow(16, lambda buf, cap, n: _detok_flush(byref(self._state), buf, cap, n)).decode("utf-8", "replace")


def _render(model_ptr, messages, add_generation_prompt, template):
    items = []
    for m in messages:
        role, content = (m["role"], m["content"]) if isinstance(m, Mapping) else m
        items.append((role.encode("utf-8"), content.encode("utf-8")))
    arr = (_ChatMessage * max(len(items), 1))()
    for i, (role, content) in enumerate(items):
        arr[i].role = role
        arr[i].content = content
    params = _ChatParams()
    _chat_params_init(byref(params))
    params.add_generation_prompt = 1 if add_generation_prompt else 0
    if template is not None:
        params.template_source = template.encode("utf-8")
    size = sum(len(r) + len(c) for r, c in items) + 256
    raw = _grow_cstr(size, lambda buf, cap, n: _chat_render(model_ptr, arr, len(items), byref(params), buf, cap, n))
    return raw.decode("utf-8", "replace")


def chat_render(messages: Iterable[Union[Mapping[str, str], Tuple[str, str]]], template: str,
                add_generation_prompt: bool = True) -> str:
    """Model.chat_render without a model: `template` is required, and
    bos_token and eos_token are ""."""
    if template is None:
        raise LlmError(Status.INVALID_ARGUMENT, "chat_render without a model needs a template")
    return _render(None, messages, add_generation_prompt, template)


def json_schema_to_gbnf(schema: Union[str, Mapping[str, Any]]) -> str:
    """The GBNF text Grammar.from_json_schema compiles for `schema` (a JSON
    string, or a dict that is serialised with json.dumps)."""
    data = _schema_bytes(schema)
    return _grow_cstr(4096, lambda buf, cap, n: _json_schema_to_gbnf(data, buf, cap, n)).decode("utf-8", "replace")


def _schema_bytes(schema):
    if not isinstance(schema, str):
        import json
        schema = json.dumps(schema)
    return schema.encode("utf-8")


class Grammar:
    """A compiled grammar bound to a model's vocabulary (llm_grammar):
    immutable, shareable by many sessions and threads. Pass it as
    Sampling(grammar=g). It does not keep the model alive (the C grammar is
    independent of the model once created). Close it, or use it as a context
    manager, when no decode_step uses it any more. A syntax error raises
    LlmError INVALID_ARGUMENT whose message names the line and column."""

    def __init__(self, model: Model, gbnf: str, root: str = "root"):
        out = c_void_p()
        _check(_grammar_create(model._open_handle(), gbnf.encode("utf-8"),
                               root.encode("utf-8") if root is not None else None, byref(out)))
        self._ptr = out.value

    @classmethod
    def from_json_schema(cls, model: Model, schema: Union[str, Mapping[str, Any]]) -> "Grammar":
        """The grammar of the JSON texts `schema` accepts (a JSON string or a
        dict; the subset of docs/GRAMMAR.md)."""
        out = c_void_p()
        _check(_grammar_from_json_schema(model._open_handle(), _schema_bytes(schema), byref(out)))
        g = cls.__new__(cls)
        g._ptr = out.value
        return g

    def _handle(self):
        if self._ptr is None:
            raise LlmError(Status.INVALID_ARGUMENT, "grammar is closed")
        return self._ptr

    def close(self) -> None:
        """Frees the grammar. It must not be in use by a running call. Idempotent."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            _grammar_free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None) is not None:
            self.close()


class TextStream:
    """Generated tokens to text to show (llm_text_stream): complete UTF-8
    only, stop strings found across token boundaries (the text before a stop
    is delivered, the stop and what follows never are), and an
    end-of-generation token ends the stream. One thread at a time. Keeps its
    model alive."""

    def __init__(self, model: Model, stops: Sequence[str] = ()):
        encoded = [st.encode("utf-8") for st in stops]
        arr = (c_char_p * max(len(encoded), 1))(*encoded)
        model._acquire()
        out = c_void_p()
        try:
            _check(_text_stream_create(model._handle(), arr, len(encoded), byref(out)))
        except BaseException:
            model._release()
            raise
        self._model = model
        self._ptr = out.value
        self._cap = 256 + 3 * max([len(e) for e in encoded] + [0])
        self.stopped = False

    def _handle(self):
        if self._ptr is None:
            raise LlmError(Status.INVALID_ARGUMENT, "text stream is closed")
        return self._ptr

    def push(self, token: int) -> Tuple[str, bool]:
        """Feeds one generated token: (text now safe to show, stopped). Once
        stopped is True (a stop string or an end-of-generation token), later
        pushes return ("", True)."""
        h = self._handle()
        while True:
            buf = ctypes.create_string_buffer(self._cap)
            n = c_size_t(0)
            stopped = c_int32(0)
            st = _text_stream_push(h, token, buf, self._cap, byref(n), byref(stopped))
            if st == Status.BUFFER_TOO_SMALL and n.value > self._cap:
                self._cap = n.value  # the stream is unchanged on this status
                continue
            _check(st)
            self.stopped = stopped.value != 0
            return buf.raw[:n.value].decode("utf-8", "replace"), self.stopped

    def flush(self) -> str:
        """Ends the stream: the text still held back (a partial stop string is
        text after all; an unfinished character becomes U+FFFD)."""
        h = self._handle()
        return _grow(self._cap, lambda buf, cap, n: _text_stream_flush(h, buf, cap, n)).decode("utf-8", "replace")

    def reset(self) -> None:
        """Starts over with the same stops."""
        _check(_text_stream_reset(self._handle()))
        self.stopped = False

    def close(self) -> None:
        """Frees the stream and releases its model reference. Idempotent."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            _text_stream_free(ptr)
            self._model._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None) is not None:
            self.close()


class Session:
    """One sequence on a model; one thread at a time. Keeps its model alive."""

    def __init__(self, model, max_tokens=0, window=0, n_sink=None, kv_type=KvType.F16):
        params = _SessionParams()
        _session_params_init(byref(params))
        params.max_tokens = max_tokens
        params.window = window
        if n_sink is not None:
            params.n_sink = n_sink
        params.kv_type = kv_type
        # Cancellation: the C callback polls a flag that cancel() sets.
        self._cancel_flag = threading.Event()
        self._cancel_cb = _cancel_fn(lambda _user: 1 if self._cancel_flag.is_set() else 0)
        params.cancel = self._cancel_cb
        model._acquire()
        out = c_void_p()
        try:
            _check(_session_create(model._handle(), byref(params), byref(out)))
        except BaseException:
            model._release()
            raise
        self._model = model
        self._ptr = out.value
        self._last = -1  # last token appended or returned; -1 if unknown

    @classmethod
    def _wrap(cls, model, ptr, cancel_flag, cancel_cb, last):
        # A session whose C handle already holds one model reference.
        s = cls.__new__(cls)
        s._model = model
        s._ptr = ptr
        s._cancel_flag = cancel_flag if cancel_flag is not None else threading.Event()
        s._cancel_cb = cancel_cb  # a fork polls its parent's callback: keep it alive
        s._last = last
        return s

    def fork(self):
        """An independent copy sharing this session's KV pages (copy on write).
        It shares this session's cancel flag."""
        h = self._handle()
        self._model._acquire_shared()
        out = c_void_p()
        try:
            _check(_session_fork(h, byref(out)))
        except BaseException:
            self._model._release()
            raise
        return Session._wrap(self._model, out.value, self._cancel_flag, self._cancel_cb, self._last)

    def save(self):
        """The session as versioned, checksummed bytes for Model.restore_session."""
        h = self._handle()
        need = c_size_t(0)
        st = _session_save(h, None, 0, byref(need))
        if st != Status.BUFFER_TOO_SMALL:
            _check(st)
        return _grow(need.value, lambda buf, cap, n: _session_save(h, buf, cap, n))

    @property
    def model(self):
        return self._model

    def _handle(self):
        if self._ptr is None:
            raise LlmError(Status.INVALID_ARGUMENT, "session is closed")
        return self._ptr

    def close(self):
        """Frees the session and releases its model reference. Idempotent."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            _session_free(ptr)
            self._model._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None) is not None:
            self.close()

    def cancel(self):
        """Makes a running or later prefill fail with CANCELLED (until reset_cancel)."""
        self._cancel_flag.set()

    def reset_cancel(self):
        self._cancel_flag.clear()

    def prefill(self, tokens):
        tokens = list(tokens)
        arr = (llm_token * len(tokens))(*tokens)
        _check(_prefill(self._handle(), arr, len(tokens)))
        if tokens:
            self._last = tokens[-1]

    def decode_step(self, sampling=None):
        """Next token; sampling None is greedy."""
        tok = llm_token(-1)
        _check(_decode_step(self._handle(), byref(sampling._raw()) if sampling else None, byref(tok)))
        self._last = tok.value
        return tok.value

    def logits(self):
        """A copy (list of floats) of the logits the next decode_step samples from."""
        p = POINTER(c_float)()
        n = c_size_t(0)
        _check(_logits(self._handle(), byref(p), byref(n)))
        return p[:n.value]

    def reset(self):
        _check(_session_reset(self._handle()))
        self._last = -1

    def kv_evict(self, n_keep, n_discard):
        before = self.stats()["n_tokens"]
        _check(_kv_evict(self._handle(), n_keep, n_discard))
        if n_keep + n_discard >= before:
            self._last = -1  # the tail went; its new last token is not known here

    def stats(self):
        s = _SessionStats()
        s.struct_size = ctypes.sizeof(s)
        _check(_session_stats(self._handle(), byref(s)))
        return {name: getattr(s, name) for name, _ in _SessionStats._fields_ if name != "struct_size"}

    def stream(self, max_tokens, sampling=None):
        """Yields Piece objects for up to max_tokens generated tokens. An
        end-of-generation token ends the stream and is not yielded, except
        when bytes were still held back: they come (as U+FFFD) in a last
        piece carrying that token. After the last of max_tokens tokens,
        held-back bytes are appended to its text."""
        detok = Detokenizer(self._model, self._last)
        for i in range(max_tokens):
            tok = self.decode_step(sampling)
            if self._model._is_eog(tok):
                rest = detok.flush()
                if rest:
                    yield Piece(tok, rest)
                return
            text = detok.push(tok)
            if i == max_tokens - 1:
                text += detok.flush()
            yield Piece(tok, text)

    def generate(self, prompt, max_tokens=256, sampling=None):
        """Tokenizes prompt (with BOS), prefills it and streams the continuation."""
        self.prefill(self._model._tokenize(prompt, add_bos=True))
        return self.stream(max_tokens, sampling)


def _batch_handles(sessions):
    """The sessions as a list and a C array of their handles."""
    sessions = list(sessions)
    for i, s in enumerate(sessions):
        if not isinstance(s, Session):
            raise TypeError("sessions[%d] is %s, not a libllm.Session" % (i, type(s).__name__))
    return sessions, (c_void_p * len(sessions))(*[s._handle() for s in sessions])


def _sampling_array(sampling, n):
    """(array of n llm_sampling pointers, the structs it points to) for a
    sampling argument: None (greedy), one Sampling for all, or a list with
    one Sampling or None per session. Keep the structs alive for the call."""
    if isinstance(sampling, (list, tuple)):
        if len(sampling) != n:
            raise ValueError("%d samplings for %d sessions" % (len(sampling), n))
        raws = [sp._raw() if sp is not None else None for sp in sampling]
    else:
        raws = [sampling._raw() if sampling else None] * n  # one struct, n pointers to it
    arr = (POINTER(_Sampling) * n)(*[ctypes.pointer(r) if r is not None else None for r in raws])
    return arr, raws


def _finish_batch(st, tokens):
    try:
        _check(st)
    except LlmError as e:
        e.tokens = tokens
        raise
    return tokens


def decode_batch(sessions, sampling=None):
    """Session.decode_step on each session, in order, as one C call; the
    sessions' pending tokens run as one batched pass, so they share one read
    of the weights. sampling is None (greedy), one Sampling for all
    (llm_decode_batch), or a list with one Sampling or None per session
    (llm_decode_batch_each: other temperatures, seeds and grammars in one
    pass; an invalid one fails before any session moves). Returns a list: element i is the token of sessions[i], the one
    it would have sampled alone. The sessions must be distinct and belong to
    the same C model (two Model() loads of one file are two models), else
    LlmError with INVALID_ARGUMENT and nothing advances. The calling thread
    must own every session.

    On a failure the LlmError has a .tokens list: the tokens of the sessions
    that advanced before the failing one, and -1 for the failing session and
    those after it (they are unchanged)."""
    sessions, ptrs = _batch_handles(sessions)
    n = len(sessions)
    if n == 0:
        return []  # nothing to do (and llm_decode_batch 0.2.0 reads sessions[0] even for n == 0)
    # -1 first: the library may reject the call before it writes them.
    out = (llm_token * n)(*([-1] * n))
    if isinstance(sampling, (list, tuple)):
        arr, _raws = _sampling_array(sampling, n)  # _raws: kept alive for the call
        st = _decode_batch_each(ptrs, n, arr, out)
    else:
        raw = sampling._raw() if sampling else None
        st = _decode_batch(ptrs, n, byref(raw) if raw is not None else None, out)
    tokens = list(out)
    # Sessions that advanced (also before a failure) continue their streams after their token.
    for s, tok in zip(sessions, tokens):
        if tok >= 0:
            s._last = tok
    return _finish_batch(st, tokens)


def decode_batch_prefill(sessions, prompts, sample=None, sampling=None):
    """decode_batch where sessions may first append prompt tokens
    (llm_decode_batch_prefill, library 0.4): sessions[i] appends prompts[i]
    (a sequence of token ids; None or empty: none) as Session.prefill would,
    in the same batched pass as the other sessions' pending tokens, so a new
    request's prompt, or a chunk of a long one, joins running generations
    instead of stalling them. Then it samples its next token, unless
    sample is a list and sample[i] is false: then it only appends (a chunk
    of a longer prompt) and its element of the result is -1. sampling is as
    for decode_batch (None, one Sampling, or one Sampling or None per
    session). Each session gets the tokens that prefill then decode_step
    would give it alone.

    Every token id and sampling is checked before any session moves
    (LlmError INVALID_ARGUMENT, nothing appended). The sessions must be
    distinct and of one C model. A failure stops at the failing session as
    in decode_batch and the LlmError's .tokens holds the sampled tokens of
    the sessions before it (-1 for the rest and for those not sampled);
    when a grammar allows no token for a session, those after it may have
    appended their prompt already (see llm_decode_batch_prefill)."""
    sessions, ptrs = _batch_handles(sessions)
    n = len(sessions)
    prompts = [list(p) if p is not None else [] for p in prompts]
    if len(prompts) != n:
        raise ValueError("%d prompts for %d sessions" % (len(prompts), n))
    if sample is not None:
        sample = [bool(x) for x in sample]
        if len(sample) != n:
            raise ValueError("%d sample flags for %d sessions" % (len(sample), n))
    if n == 0:
        return []
    arrays = [(llm_token * len(p))(*p) if p else None for p in prompts]  # kept alive for the call
    prompt_ptrs = (POINTER(llm_token) * n)(*[ctypes.cast(a, POINTER(llm_token)) if a is not None else None
                                             for a in arrays])
    counts = (c_size_t * n)(*[len(p) for p in prompts])
    flags = (c_int32 * n)(*[1 if x else 0 for x in sample]) if sample is not None else None
    samplings, _raws = _sampling_array(sampling, n)  # _raws: kept alive for the call
    out = (llm_token * n)(*([-1] * n))
    st = _decode_batch_prefill(ptrs, n, prompt_ptrs, counts, flags, samplings, out)
    tokens = list(out)
    for s, prompt, tok in zip(sessions, prompts, tokens):
        if tok >= 0:
            s._last = tok
        elif prompt:
            # Appended (on success), or unknown (after a failure): the stream's
            # detokenizer then starts without a previous token.
            s._last = prompt[-1] if st == Status.OK else -1
    return _finish_batch(st, tokens)
