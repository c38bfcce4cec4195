// Package llm is a cgo binding of libllm (include/llm.h), an embeddable LLM
// inference engine.
//
// Threading follows the C contract: a *Model may be used from any number of
// goroutines at once; a *Session must be used by one goroutine at a time.
// Every session keeps its model alive: Model.Close frees the C model only
// once the last session is closed.
//
// Build: the header comes from this repository (../../include) or the
// system include path; point the linker at libllm with
// CGO_LDFLAGS="-L<libdir> -Wl,-rpath,<libdir>".
package llm

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -lllm
#include <stdlib.h>
#include "llm.h"

// The session cancel callback reads a flag in C memory that Go sets atomically.
static int llm_go_cancel(void *flag) { return __atomic_load_n((int32_t *)flag, __ATOMIC_RELAXED); }
static llm_cancel_fn llm_go_cancel_fn(void) { return llm_go_cancel; }
*/
import "C"

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Token is a token id.
type Token = int32

// Status is an llm_status value. Its values are ABI and never change.
type Status int32

const (
	StatusOK              Status = C.LLM_OK
	StatusInvalidArgument Status = C.LLM_ERR_INVALID_ARGUMENT
	StatusOutOfMemory     Status = C.LLM_ERR_OUT_OF_MEMORY
	StatusIO              Status = C.LLM_ERR_IO
	StatusFormat          Status = C.LLM_ERR_FORMAT
	StatusChecksum        Status = C.LLM_ERR_CHECKSUM
	StatusUnsupported     Status = C.LLM_ERR_UNSUPPORTED
	StatusDevice          Status = C.LLM_ERR_DEVICE
	StatusContextFull     Status = C.LLM_ERR_CONTEXT_FULL
	StatusCancelled       Status = C.LLM_ERR_CANCELLED
	StatusBufferTooSmall  Status = C.LLM_ERR_BUFFER_TOO_SMALL
	StatusInternal        Status = C.LLM_ERR_INTERNAL
)

// String is the library's static description of the status.
func (s Status) String() string { return C.GoString(C.llm_status_string(C.llm_status(s))) }

// Error is a failed call: its status and the llm_last_error text.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Status.String()
	}
	return e.Message + " (" + e.Status.String() + ")"
}

// Is makes errors.Is(err, llm.ErrFormat) match any error with that status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status && (t.Message == "" || t.Message == e.Message)
}

// Sentinel errors for errors.Is.
var (
	ErrInvalidArgument = &Error{Status: StatusInvalidArgument}
	ErrOutOfMemory     = &Error{Status: StatusOutOfMemory}
	ErrIO              = &Error{Status: StatusIO}
	ErrFormat          = &Error{Status: StatusFormat}
	ErrChecksum        = &Error{Status: StatusChecksum}
	ErrUnsupported     = &Error{Status: StatusUnsupported}
	ErrDevice          = &Error{Status: StatusDevice}
	ErrContextFull     = &Error{Status: StatusContextFull}
	ErrCancelled       = &Error{Status: StatusCancelled}
	ErrBufferTooSmall  = &Error{Status: StatusBufferTooSmall}
	ErrInternal        = &Error{Status: StatusInternal}
	// ErrClosed is returned by calls on a closed Model or Session.
	ErrClosed = errors.New("llm: use of a closed handle")
)

// call runs one C call and, on failure, reads llm_last_error on the same OS
// thread (it is thread-local and a goroutine may otherwise migrate between
// the two cgo calls).
func call(f func() C.llm_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.LLM_OK {
		return nil
	}
	return &Error{Status: Status(st), Message: C.GoString(C.llm_last_error())}
}

// growBytes calls f with growing byte buffers until the result fits.
func growBytes(initial int, f func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status) ([]byte, error) {
	buf := make([]byte, initial+1)
	for {
		var n C.size_t
		err := call(func() C.llm_status { return f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n) })
		var e *Error
		if errors.As(err, &e) && e.Status == StatusBufferTooSmall && int(n) > len(buf) {
			buf = make([]byte, int(n))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:int(n)], nil
	}
}

// growString is growBytes for calls that write a NUL-terminated string.
func growString(initial int, f func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status) (string, error) {
	buf := make([]byte, initial+1)
	for {
		var n C.size_t
		err := call(func() C.llm_status { return f((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n) })
		if errors.Is(err, ErrBufferTooSmall) {
			size := 2 * len(buf)
			if int(n)+1 > size {
				size = int(n) + 1
			}
			buf = make([]byte, size)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:int(n)]), nil
	}
}

// Version is the run-time LLM_VERSION_NUMBER of the linked library.
func Version() uint32 { return uint32(C.llm_version()) }

// VersionString is the run-time version, e.g. "0.1.0".
func VersionString() string { return C.GoString(C.llm_version_string()) }

// HeaderVersion is LLM_VERSION_NUMBER of the header this package was built with.
const HeaderVersion = uint32(C.LLM_VERSION_NUMBER)

// Device selects where a model runs.
type Device int32

const (
	DeviceAuto Device = C.LLM_DEVICE_AUTO
	DeviceCPU  Device = C.LLM_DEVICE_CPU
	DeviceCUDA Device = C.LLM_DEVICE_CUDA
)

// KVType is the element type of a session's KV cache.
type KVType int32

const (
	KVF16  KVType = C.LLM_KV_F16
	KVF32  KVType = C.LLM_KV_F32
	KVInt8 KVType = C.LLM_KV_INT8
	KVInt4 KVType = C.LLM_KV_INT4
)

// LoadOptions are the options of Load. A nil *LoadOptions means defaults;
// zero fields mean the library's defaults.
type LoadOptions struct {
	Device        Device
	Threads       int32 // 0 = all cores
	VocabOnly     bool  // metadata and tokenizer only; no sessions
	ReferenceMath bool  // f32 math on dequantized weights (slower; matches reference implementations)
	KVBudgetBytes uint64
	KVPageTokens  uint32
}

// Model is a loaded model, safe for concurrent use.
type Model struct {
	mu     sync.RWMutex // write-held only while freeing the C model
	ptr    *C.llm_model
	refs   int32 // atomic: the owner's reference (until Close) plus one per open session
	closed bool
}

// Load opens a model file (native .llm or GGUF).
func Load(path string, opts *LoadOptions) (*Model, error) {
	var p C.llm_load_params
	C.llm_load_params_init(&p)
	if opts != nil {
		p.device = C.llm_device(opts.Device)
		p.n_threads = C.int32_t(opts.Threads)
		if opts.VocabOnly {
			p.flags |= C.LLM_LOAD_VOCAB_ONLY
		}
		if opts.ReferenceMath {
			p.flags |= C.LLM_LOAD_REFERENCE_MATH
		}
		if opts.KVBudgetBytes != 0 {
			p.kv_budget_bytes = C.uint64_t(opts.KVBudgetBytes)
		}
		if opts.KVPageTokens != 0 {
			p.kv_page_tokens = C.uint32_t(opts.KVPageTokens)
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var out *C.llm_model
	if err := call(func() C.llm_status { return C.llm_load(cpath, &p, &out) }); err != nil {
		return nil, err
	}
	m := &Model{ptr: out, refs: 1}
	runtime.SetFinalizer(m, func(m *Model) { m.Close() })
	return m, nil
}

// release drops one reference; the last one frees the C model.
func (m *Model) release() {
	if atomic.AddInt32(&m.refs, -1) != 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Re-check under the write lock: references are only taken under the read lock.
	if atomic.LoadInt32(&m.refs) == 0 && m.ptr != nil {
		C.llm_model_free(m.ptr)
		m.ptr = nil
	}
}

// Close releases the caller's reference. The C model is freed once every
// session on it is closed too. Closing twice is a no-op.
func (m *Model) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.release()
	return nil
}

// with runs f with the C model held alive (read lock). Sessions use it even
// after the owner's Close, since they hold references of their own.
func (m *Model) with(f func(p *C.llm_model) error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.ptr == nil {
		return ErrClosed
	}
	return f(m.ptr)
}

// withOpen is with for the owner's calls: they fail after Close.
func (m *Model) withOpen(f func(p *C.llm_model) error) error {
	m.mu.RLock()
	closed := m.closed
	m.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return m.with(f)
}

// Info describes a loaded model.
type Info struct {
	VocabSize     uint32
	ContextLength uint32
	BOS, EOS      Token // -1 if none
	Layers        uint32
	Dim           uint32
	HiddenDim     uint32
	Heads         uint32
	KVHeads       uint32
	HeadDim       uint32
	Device        Device
	Params        uint64
	WeightBytes   uint64
	Architecture  string
	WeightType    string
}

// Info returns the model's properties.
func (m *Model) Info() (Info, error) {
	var p C.llm_model_properties
	p.struct_size = C.uint32_t(unsafe.Sizeof(p))
	err := m.withOpen(func(mp *C.llm_model) error {
		return call(func() C.llm_status { return C.llm_model_info(mp, &p) })
	})
	if err != nil {
		return Info{}, err
	}
	return Info{
		VocabSize: uint32(p.vocab_size), ContextLength: uint32(p.context_length),
		BOS: Token(p.bos), EOS: Token(p.eos), Layers: uint32(p.n_layers), Dim: uint32(p.dim),
		HiddenDim: uint32(p.hidden_dim), Heads: uint32(p.n_heads), KVHeads: uint32(p.n_kv_heads),
		HeadDim: uint32(p.head_dim), Device: Device(p.device), Params: uint64(p.n_params),
		WeightBytes:  uint64(p.weight_bytes),
		Architecture: C.GoString(&p.architecture[0]), WeightType: C.GoString(&p.weight_type[0]),
	}, nil
}

// Tokenize converts text to ids; addBOS prepends the model's BOS token and
// parseSpecial turns text like "<s>" into special ids.
func (m *Model) Tokenize(text string, addBOS, parseSpecial bool) ([]Token, error) {
	if m.isClosed() {
		return nil, ErrClosed
	}
	return m.tokenize(text, addBOS, parseSpecial)
}

func (m *Model) isClosed() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.closed
}

func (m *Model) tokenize(text string, addBOS, parseSpecial bool) ([]Token, error) {
	var flags C.uint32_t
	if addBOS {
		flags |= C.LLM_TOKENIZE_ADD_BOS
	}
	if parseSpecial {
		flags |= C.LLM_TOKENIZE_PARSE_SPECIAL
	}
	ctext := C.CBytes([]byte(text)) // C memory: the text need not stay pinned
	defer C.free(ctext)
	tokens := make([]Token, len(text)+3)
	for {
		var n C.size_t
		err := m.with(func(mp *C.llm_model) error {
			return call(func() C.llm_status {
				return C.llm_tokenize(mp, (*C.char)(ctext), C.size_t(len(text)), flags,
					(*C.llm_token)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)), &n)
			})
		})
		if errors.Is(err, ErrBufferTooSmall) && int(n) > len(tokens) {
			tokens = make([]Token, int(n))
			continue
		}
		if err != nil {
			return nil, err
		}
		return tokens[:int(n)], nil
	}
}

// TokenBytes returns the raw bytes of one token's piece.
func (m *Model) TokenBytes(token Token) ([]byte, error) {
	var out []byte
	err := m.withOpen(func(mp *C.llm_model) error {
		var err error
		out, err = growBytes(32, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
			return C.llm_token_to_text(mp, C.llm_token(token), buf, capacity, length)
		})
		return err
	})
	return out, err
}

// Detokenize returns the text of a whole token array.
func (m *Model) Detokenize(tokens []Token) (string, error) {
	var out []byte
	err := m.withOpen(func(mp *C.llm_model) error {
		var tp *C.llm_token
		if len(tokens) > 0 {
			tp = (*C.llm_token)(unsafe.Pointer(&tokens[0]))
		}
		var err error
		out, err = growBytes(8*len(tokens)+16, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
			return C.llm_detokenize(mp, tp, C.size_t(len(tokens)), buf, capacity, length)
		})
		return err
	})
	return string(out), err
}

// IsEOG reports whether token ends generation.
func (m *Model) IsEOG(token Token) bool {
	return !m.isClosed() && m.isEOG(token)
}

func (m *Model) isEOG(token Token) bool {
	eog := false
	_ = m.with(func(mp *C.llm_model) error {
		eog = C.llm_token_is_eog(mp, C.llm_token(token)) != 0
		return nil
	})
	return eog
}

// Detokenizer turns a token stream into text, emitting only complete UTF-8
// sequences. One per stream; not for concurrent use.
type Detokenizer struct {
	model *Model
	state C.llm_detok_state
	buf   []byte
}

// NewDetokenizer starts a stream whose previous token is prev (-1 if none).
func (m *Model) NewDetokenizer(prev Token) *Detokenizer {
	d := &Detokenizer{model: m, buf: make([]byte, 64)}
	C.llm_detok_init(&d.state, C.llm_token(prev))
	return d
}

// Push appends token and returns the complete text now available.
func (d *Detokenizer) Push(token Token) (string, error) {
	for {
		var n C.size_t
		err := d.model.with(func(mp *C.llm_model) error {
			return call(func() C.llm_status {
				return C.llm_detok_push(mp, &d.state, C.llm_token(token),
					(*C.char)(unsafe.Pointer(&d.buf[0])), C.size_t(len(d.buf)), &n)
			})
		})
		if errors.Is(err, ErrBufferTooSmall) && int(n) > len(d.buf) {
			d.buf = make([]byte, int(n)) // the state is unchanged on this status
			continue
		}
		if err != nil {
			return "", err
		}
		return string(d.buf[:int(n)]), nil
	}
}

// Flush ends the stream; held-back bytes come out as U+FFFD.
func (d *Detokenizer) Flush() (string, error) {
	out, err := growBytes(16, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
		return C.llm_detok_flush(&d.state, buf, capacity, length)
	})
	return string(out), err
}

// SessionOptions are the options of NewSession; nil or zero fields mean the
// library's defaults.
type SessionOptions struct {
	MaxTokens uint32 // 0 = the model's context length
	Window    uint32 // sliding window; 0 = none
	Sink      uint32 // attention-sink tokens kept by the window; 0 = default
	KVType    KVType
}

// cancelFlag is C memory polled by a session's cancel callback. A fork
// inherits the callback, so the flag is shared and reference counted.
type cancelFlag struct {
	ptr  *C.int32_t
	refs int32 // atomic
}

func newCancelFlag() *cancelFlag {
	return &cancelFlag{ptr: (*C.int32_t)(C.calloc(1, 4)), refs: 1}
}

func (f *cancelFlag) retain() *cancelFlag {
	if f != nil {
		atomic.AddInt32(&f.refs, 1)
	}
	return f
}

func (f *cancelFlag) release() {
	if f != nil && atomic.AddInt32(&f.refs, -1) == 0 {
		C.free(unsafe.Pointer(f.ptr))
	}
}

func (f *cancelFlag) set(v int32) {
	if f != nil {
		atomic.StoreInt32((*int32)(unsafe.Pointer(f.ptr)), v)
	}
}

// Session is one sequence on a model. Not safe for concurrent use.
type Session struct {
	model   *Model
	ptr     *C.llm_session
	cancel  *cancelFlag // nil for restored sessions (no callback)
	last    Token       // last token appended or returned; -1 if unknown
	counted bool        // holds a model reference
}

// newSession wraps a C session that holds one model reference already.
func newSession(m *Model, ptr *C.llm_session, cancel *cancelFlag, last Token) *Session {
	s := &Session{model: m, ptr: ptr, cancel: cancel, last: last, counted: true}
	runtime.SetFinalizer(s, func(s *Session) { s.Close() })
	return s
}

// NewSession creates an empty session.
func (m *Model) NewSession(opts *SessionOptions) (*Session, error) {
	var p C.llm_session_params
	C.llm_session_params_init(&p)
	if opts != nil {
		p.max_tokens = C.uint32_t(opts.MaxTokens)
		p.window = C.uint32_t(opts.Window)
		if opts.Sink != 0 {
			p.n_sink = C.uint32_t(opts.Sink)
		}
		p.kv_type = C.llm_kv_type(opts.KVType)
	}
	flag := newCancelFlag()
	p.cancel = C.llm_go_cancel_fn()
	p.cancel_user_data = unsafe.Pointer(flag.ptr)
	var out *C.llm_session
	err := m.withOpen(func(mp *C.llm_model) error {
		if err := call(func() C.llm_status { return C.llm_session_create(mp, &p, &out) }); err != nil {
			return err
		}
		atomic.AddInt32(&m.refs, 1) // under the read lock, so release cannot free meanwhile
		return nil
	})
	if err != nil {
		flag.release()
		return nil, err
	}
	return newSession(m, out, flag, -1), nil
}

// RestoreSession rebuilds a session saved with Session.Save on m (same shape
// and KV page size). Malformed bytes give ErrFormat or ErrChecksum.
func (m *Model) RestoreSession(saved []byte) (*Session, error) {
	var bp unsafe.Pointer
	if len(saved) > 0 {
		bp = unsafe.Pointer(&saved[0])
	}
	var out *C.llm_session
	err := m.withOpen(func(mp *C.llm_model) error {
		if err := call(func() C.llm_status { return C.llm_session_restore(mp, bp, C.size_t(len(saved)), &out) }); err != nil {
			return err
		}
		atomic.AddInt32(&m.refs, 1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newSession(m, out, nil, -1), nil
}

// Fork returns an independent copy that shares this session's KV pages
// (copy on write); it may be used on another goroutine. It shares this
// session's cancel flag.
func (s *Session) Fork() (*Session, error) {
	if s.ptr == nil {
		return nil, ErrClosed
	}
	var out *C.llm_session
	err := s.model.with(func(*C.llm_model) error {
		if err := call(func() C.llm_status { return C.llm_session_fork(s.ptr, &out) }); err != nil {
			return err
		}
		atomic.AddInt32(&s.model.refs, 1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newSession(s.model, out, s.cancel.retain(), s.last), nil
}

// Save serialises the session (tokens, KV cache, logits, sampler state)
// into versioned, checksummed bytes for Model.RestoreSession.
func (s *Session) Save() ([]byte, error) {
	if s.ptr == nil {
		return nil, ErrClosed
	}
	var need C.size_t
	err := call(func() C.llm_status { return C.llm_session_save(s.ptr, nil, 0, &need) })
	if err != nil && !errors.Is(err, ErrBufferTooSmall) {
		return nil, err
	}
	buf := make([]byte, int(need)+1)
	for {
		var n C.size_t
		err := call(func() C.llm_status {
			return C.llm_session_save(s.ptr, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), &n)
		})
		if errors.Is(err, ErrBufferTooSmall) && int(n) > len(buf) {
			buf = make([]byte, int(n))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:int(n)], nil
	}
}

// Close frees the session and releases its model reference. Idempotent.
func (s *Session) Close() error {
	if s.ptr != nil {
		C.llm_session_free(s.ptr)
		s.ptr = nil
		s.cancel.release()
		s.cancel = nil
	}
	if s.counted {
		s.counted = false
		s.model.release()
	}
	return nil
}

// Model returns the session's model.
func (s *Session) Model() *Model { return s.model }

// Cancel makes a running or later Prefill fail with ErrCancelled until
// ResetCancel. Safe to call from any goroutine.
func (s *Session) Cancel() { s.cancel.set(1) }

// ResetCancel clears a Cancel request.
func (s *Session) ResetCancel() { s.cancel.set(0) }

func (s *Session) do(f func(p *C.llm_session) C.llm_status) error {
	if s.ptr == nil {
		return ErrClosed
	}
	return call(func() C.llm_status { return f(s.ptr) })
}

// Prefill appends tokens in one batched forward pass; on failure nothing is appended.
func (s *Session) Prefill(tokens []Token) error {
	var tp *C.llm_token
	if len(tokens) > 0 {
		tp = (*C.llm_token)(unsafe.Pointer(&tokens[0]))
	}
	err := s.do(func(p *C.llm_session) C.llm_status { return C.llm_prefill(p, tp, C.size_t(len(tokens))) })
	if err == nil && len(tokens) > 0 {
		s.last = tokens[len(tokens)-1]
	}
	return err
}

// Sampling configures DecodeStep. The zero value is NOT the default: use
// DefaultSampling (greedy) and change fields.
type Sampling struct {
	Temperature   float32 // <= 0: greedy
	TopK          int32   // <= 0: off
	TopP          float32 // >= 1: off
	MinP          float32 // <= 0: off
	RepeatPenalty float32 // 1: off
	Seed          uint64
	RepeatLastN   int32
	// Grammar constrains the tokens (nil: none). Tokens it forbids get
	// probability 0; once it has ended only end-of-generation tokens remain.
	// It may be shared by many sessions; Close waits for calls using it.
	Grammar *Grammar
}

// DefaultSampling returns the library's defaults (greedy).
func DefaultSampling() Sampling {
	var c C.llm_sampling
	C.llm_sampling_init(&c)
	return Sampling{
		Temperature: float32(c.temperature), TopK: int32(c.top_k), TopP: float32(c.top_p),
		MinP: float32(c.min_p), RepeatPenalty: float32(c.repeat_penalty), Seed: uint64(c.seed),
		RepeatLastN: int32(c.repeat_last_n),
	}
}

func (sp *Sampling) toC() C.llm_sampling {
	var c C.llm_sampling
	C.llm_sampling_init(&c)
	if sp != nil {
		c.temperature = C.float(sp.Temperature)
		c.top_k = C.int32_t(sp.TopK)
		c.top_p = C.float(sp.TopP)
		c.min_p = C.float(sp.MinP)
		c.repeat_penalty = C.float(sp.RepeatPenalty)
		c.seed = C.uint64_t(sp.Seed)
		c.repeat_last_n = C.int32_t(sp.RepeatLastN)
	}
	return c
}

// withC runs f with the C settings. A grammar stays open (Close waits) until f returns.
func (sp *Sampling) withC(f func(c *C.llm_sampling) error) error {
	c := sp.toC()
	if sp != nil && sp.Grammar != nil {
		g := sp.Grammar
		g.mu.RLock()
		defer g.mu.RUnlock()
		if g.ptr == nil {
			return ErrClosed
		}
		c.grammar = g.ptr
	}
	return f(&c)
}

// DecodeStep returns the next token; sp == nil is greedy.
func (s *Session) DecodeStep(sp *Sampling) (Token, error) {
	var tok C.llm_token
	err := sp.withC(func(c *C.llm_sampling) error {
		return s.do(func(p *C.llm_session) C.llm_status { return C.llm_decode_step(p, c, &tok) })
	})
	if err != nil {
		return -1, err
	}
	s.last = Token(tok)
	return Token(tok), nil
}

// DecodeBatch runs DecodeStep on each session, in order, as one call
// (llm_decode_batch); sp == nil is greedy. On a CUDA model the sessions'
// pending tokens run as one batched pass, so they share one read of the
// weights. tokens[i] is the token of sessions[i], the one it would have
// sampled alone. The sessions must be distinct and belong to the same C
// model (two Loads of one file are two models), else ErrInvalidArgument and
// nothing advances. The calling goroutine must own every session.
//
// On a failure the returned slice is still filled: the sessions before the
// failing one have advanced and their tokens are in it; the failing session
// and those after it are unchanged and have -1. A nil or closed session
// gives ErrClosed and a nil slice; nothing advances.
func DecodeBatch(sessions []*Session, sp *Sampling) ([]Token, error) {
	ptrs, err := sessionPtrs(sessions)
	if err != nil {
		return nil, err
	}
	tokens := newBatchTokens(len(sessions))
	if len(sessions) == 0 {
		return tokens, nil
	}
	err = sp.withC(func(c *C.llm_sampling) error {
		return call(func() C.llm_status {
			return C.llm_decode_batch(&ptrs[0], C.size_t(len(ptrs)), c, (*C.llm_token)(unsafe.Pointer(&tokens[0])))
		})
	})
	// Sessions that advanced (also before a failure) continue their streams after their token.
	for i, tok := range tokens {
		if tok >= 0 {
			sessions[i].last = tok
		}
	}
	return tokens, err
}

// DecodeBatchEach is DecodeBatch with settings of their own for every
// session (llm_decode_batch_each, library 0.3): sessions[i] samples with
// sps[i] (a nil entry is greedy; a nil slice is greedy for all), so other
// temperatures, seeds and grammars share one batched pass. len(sps) must be
// len(sessions), else ErrInvalidArgument. Every setting is checked before
// any session moves. Each session gets the token DecodeStep with its
// settings would have given it alone. Failures are reported as by
// DecodeBatch: the returned slice holds the tokens of the sessions that
// advanced before the failing one, and -1 for the rest.
func DecodeBatchEach(sessions []*Session, sps []*Sampling) ([]Token, error) {
	ptrs, err := sessionPtrs(sessions)
	if err != nil {
		return nil, err
	}
	if err := checkBatchLen(len(sessions), len(sps), sps == nil, "samplings"); err != nil {
		return nil, err
	}
	tokens := newBatchTokens(len(sessions))
	if len(sessions) == 0 {
		return tokens, nil
	}
	err = withCSamplings(sps, func(cs **C.llm_sampling) error {
		return call(func() C.llm_status {
			return C.llm_decode_batch_each(&ptrs[0], C.size_t(len(ptrs)), cs, (*C.llm_token)(unsafe.Pointer(&tokens[0])))
		})
	})
	for i, tok := range tokens {
		if tok >= 0 {
			sessions[i].last = tok
		}
	}
	return tokens, err
}

// DecodeBatchPrefill is DecodeBatchEach where sessions may first append
// prompt tokens (llm_decode_batch_prefill, library 0.4): sessions[i]
// appends prompts[i] (nil or empty: nothing) as Prefill would, in the same
// batched pass as the other sessions' pending tokens, so a new request's
// prompt, or a chunk of a long one, joins the running generations instead
// of stalling them. Then it samples with sps[i] (nil: greedy), unless sample
// is non-nil and sample[i] is false: then it only appends (a chunk of a
// longer prompt) and tokens[i] is -1. prompts has one entry per session;
// sample and sps are nil or have one entry per session, else
// ErrInvalidArgument. Each session ends as Prefill then DecodeStep alone
// would leave it. Every token id and setting is checked before any session
// moves (ErrInvalidArgument, nothing appended).
//
// On a failure the returned slice is still filled: the sampled tokens of
// the sessions before the failing one (they have advanced), -1 for the
// rest, which are unchanged, except that when a grammar allows no token
// for a session the sessions after it that joined the pass have appended
// their prompt.
func DecodeBatchPrefill(sessions []*Session, prompts [][]Token, sample []bool, sps []*Sampling) ([]Token, error) {
	ptrs, err := sessionPtrs(sessions)
	if err != nil {
		return nil, err
	}
	n := len(sessions)
	if err := checkBatchLen(n, len(prompts), false, "prompts"); err != nil {
		return nil, err
	}
	if err := checkBatchLen(n, len(sample), sample == nil, "sample flags"); err != nil {
		return nil, err
	}
	if err := checkBatchLen(n, len(sps), sps == nil, "samplings"); err != nil {
		return nil, err
	}
	tokens := newBatchTokens(n)
	if n == 0 {
		return tokens, nil
	}
	// cgo lets C see no Go memory that holds Go pointers: the prompts and the
	// array of pointers to them are copied into C memory.
	total := 0
	for _, p := range prompts {
		total += len(p)
	}
	cTokens := (*C.llm_token)(C.calloc(C.size_t(total+1), C.size_t(unsafe.Sizeof(C.llm_token(0)))))
	defer C.free(unsafe.Pointer(cTokens))
	cPrompts := (**C.llm_token)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof((*C.llm_token)(nil)))))
	defer C.free(unsafe.Pointer(cPrompts))
	tokArr, promptArr := unsafe.Slice(cTokens, total+1), unsafe.Slice(cPrompts, n)
	counts := make([]C.size_t, n)
	at := 0
	for i, p := range prompts {
		if len(p) == 0 {
			continue
		}
		for j, tok := range p {
			tokArr[at+j] = C.llm_token(tok)
		}
		promptArr[i] = &tokArr[at]
		counts[i] = C.size_t(len(p))
		at += len(p)
	}
	var flags *C.int32_t
	if sample != nil {
		fs := make([]C.int32_t, n)
		for i, b := range sample {
			if b {
				fs[i] = 1
			}
		}
		flags = &fs[0]
	}
	err = withCSamplings(sps, func(cs **C.llm_sampling) error {
		return call(func() C.llm_status {
			return C.llm_decode_batch_prefill(&ptrs[0], C.size_t(n), cPrompts, &counts[0], flags, cs,
				(*C.llm_token)(unsafe.Pointer(&tokens[0])))
		})
	})
	for i, tok := range tokens {
		switch {
		case tok >= 0:
			sessions[i].last = tok
		case len(prompts[i]) > 0 && err == nil:
			sessions[i].last = prompts[i][len(prompts[i])-1]
		case len(prompts[i]) > 0:
			sessions[i].last = -1 // the prompt may or may not have been appended
		}
	}
	return tokens, err
}

// sessionPtrs returns the C handles of a batch (C pointers in Go memory:
// allowed by cgo); a nil or closed session is ErrClosed.
func sessionPtrs(sessions []*Session) ([]*C.llm_session, error) {
	ptrs := make([]*C.llm_session, len(sessions))
	for i, s := range sessions {
		if s == nil || s.ptr == nil {
			return nil, ErrClosed
		}
		ptrs[i] = s.ptr
	}
	return ptrs, nil
}

// newBatchTokens is -1 for every session: the library may reject the call
// before it writes them.
func newBatchTokens(n int) []Token {
	tokens := make([]Token, n)
	for i := range tokens {
		tokens[i] = -1
	}
	return tokens
}

// checkBatchLen checks that a per-session argument has one entry per
// session (or is nil, where that is allowed).
func checkBatchLen(nSessions, n int, isNil bool, what string) error {
	if n == nSessions || (isNil && n == 0) {
		return nil
	}
	return &Error{Status: StatusInvalidArgument,
		Message: strconv.Itoa(n) + " " + what + " for " + strconv.Itoa(nSessions) + " sessions"}
}

// withCSamplings runs f with an array of len(sps) pointers to C copies of
// the settings (NULL for nil entries), or with NULL for a nil slice. The
// array and the structs are in C memory, as cgo requires for an array of
// pointers. Every grammar stays open (Close waits) until f returns.
func withCSamplings(sps []*Sampling, f func(cs **C.llm_sampling) error) error {
	if sps == nil {
		return f(nil)
	}
	unlock, err := lockGrammars(sps)
	if err != nil {
		return err
	}
	defer unlock()
	n := len(sps)
	structs := (*C.llm_sampling)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.llm_sampling{}))))
	defer C.free(unsafe.Pointer(structs))
	ptrs := (**C.llm_sampling)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof((*C.llm_sampling)(nil)))))
	defer C.free(unsafe.Pointer(ptrs))
	structArr, ptrArr := unsafe.Slice(structs, n), unsafe.Slice(ptrs, n)
	for i, sp := range sps {
		if sp == nil {
			continue
		}
		structArr[i] = sp.toC()
		if sp.Grammar != nil {
			structArr[i].grammar = sp.Grammar.ptr
		}
		ptrArr[i] = &structArr[i]
	}
	return f(ptrs)
}

// lockGrammars read-locks each distinct grammar of sps once (a second RLock
// of one RWMutex can deadlock behind a waiting Close), in address order, so
// that batches sharing grammars cannot wait on each other in a cycle. A
// closed grammar is ErrClosed and leaves nothing locked.
func lockGrammars(sps []*Sampling) (unlock func(), err error) {
	var gs []*Grammar
	seen := make(map[*Grammar]bool)
	for _, sp := range sps {
		if sp != nil && sp.Grammar != nil && !seen[sp.Grammar] {
			seen[sp.Grammar] = true
			gs = append(gs, sp.Grammar)
		}
	}
	sort.Slice(gs, func(i, j int) bool { return uintptr(unsafe.Pointer(gs[i])) < uintptr(unsafe.Pointer(gs[j])) })
	unlock = func() {
		for _, g := range gs {
			g.mu.RUnlock()
		}
	}
	for i, g := range gs {
		g.mu.RLock()
		if g.ptr == nil {
			gs = gs[:i+1]
			unlock()
			return nil, ErrClosed
		}
	}
	return unlock, nil
}

// Logits returns a copy of the logits the next DecodeStep samples from.
func (s *Session) Logits() ([]float32, error) {
	var lp *C.float
	var n C.size_t
	if err := s.do(func(p *C.llm_session) C.llm_status { return C.llm_logits(p, &lp, &n) }); err != nil {
		return nil, err
	}
	out := make([]float32, int(n))
	copy(out, unsafe.Slice((*float32)(unsafe.Pointer(lp)), int(n)))
	return out, nil
}

// Reset drops all tokens, keeping the options.
func (s *Session) Reset() error {
	err := s.do(func(p *C.llm_session) C.llm_status { return C.llm_session_reset(p) })
	if err == nil {
		s.last = -1
	}
	return err
}

// KVEvict removes cached tokens [nKeep, nKeep+nDiscard).
func (s *Session) KVEvict(nKeep, nDiscard uint32) error {
	st, err := s.Stats()
	if err != nil {
		return err
	}
	err = s.do(func(p *C.llm_session) C.llm_status {
		return C.llm_kv_evict(p, C.uint32_t(nKeep), C.uint32_t(nDiscard))
	})
	if err == nil && uint64(nKeep)+uint64(nDiscard) >= uint64(st.Tokens) {
		s.last = -1 // the tail went; its new last token is not known here
	}
	return err
}

// Stats are a session's counters and timings.
type Stats struct {
	Tokens, Cached, Prompt, Generated uint32
	KVPages                           uint32
	KVBytes                           uint64
	TTFTms, ITLMedianMs, ITLP95Ms     float64
	PromptTokensPerS, GenTokensPerS   float64
	Evicted                           uint32
}

// Stats returns the session's counters and timings.
func (s *Session) Stats() (Stats, error) {
	var c C.llm_session_stats_t
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	if err := s.do(func(p *C.llm_session) C.llm_status { return C.llm_session_stats(p, &c) }); err != nil {
		return Stats{}, err
	}
	return Stats{
		Tokens: uint32(c.n_tokens), Cached: uint32(c.n_cached), Prompt: uint32(c.n_prompt),
		Generated: uint32(c.n_generated), KVPages: uint32(c.kv_pages), KVBytes: uint64(c.kv_bytes),
		TTFTms: float64(c.ttft_ms), ITLMedianMs: float64(c.itl_median_ms), ITLP95Ms: float64(c.itl_p95_ms),
		PromptTokensPerS: float64(c.prompt_tokens_per_s), GenTokensPerS: float64(c.gen_tokens_per_s),
		Evicted: uint32(c.n_evicted),
	}, nil
}

// Piece is one generated token and the complete text it makes available
// (empty while a multi-byte character is unfinished).
type Piece struct {
	Token Token
	Text  string
}

// Stream generates up to maxTokens tokens after what the session holds and
// calls fn with each; fn returns false to stop. An end-of-generation token
// ends the stream and is not passed to fn, except when bytes were still held
// back: they come (as U+FFFD) in one last piece carrying that token. After
// the last of maxTokens tokens, held-back bytes are appended to its text.
func (s *Session) Stream(maxTokens int, sp *Sampling, fn func(Piece) bool) error {
	d := s.model.NewDetokenizer(s.last)
	for i := 0; i < maxTokens; i++ {
		tok, err := s.DecodeStep(sp)
		if err != nil {
			return err
		}
		if s.model.isEOG(tok) {
			rest, err := d.Flush()
			if err != nil {
				return err
			}
			if rest != "" {
				fn(Piece{Token: tok, Text: rest})
			}
			return nil
		}
		text, err := d.Push(tok)
		if err != nil {
			return err
		}
		if i == maxTokens-1 {
			rest, err := d.Flush()
			if err != nil {
				return err
			}
			text += rest
		}
		if !fn(Piece{Token: tok, Text: text}) {
			return nil
		}
	}
	return nil
}

// Generate tokenizes prompt (with BOS), prefills it and streams the continuation.
func (s *Session) Generate(prompt string, maxTokens int, sp *Sampling, fn func(Piece) bool) error {
	tokens, err := s.model.tokenize(prompt, true, false)
	if err != nil {
		return err
	}
	if err := s.Prefill(tokens); err != nil {
		return err
	}
	return s.Stream(maxTokens, sp, fn)
}

// Result is one element of StreamChan: a piece, or the error that ended the stream.
type Result struct {
	Piece
	Err error
}

// StreamChan runs Stream on a new goroutine and delivers its pieces on a
// channel that is closed at the end; a failure arrives as a last Result
// with Err set. Cancelling ctx stops generation (the error is then only
// delivered if the receiver is still reading). The session must not be used
// until the channel is closed.
func (s *Session) StreamChan(ctx context.Context, maxTokens int, sp *Sampling) <-chan Result {
	ch := make(chan Result)
	go func() {
		defer close(ch)
		err := s.Stream(maxTokens, sp, func(p Piece) bool {
			select {
			case ch <- Result{Piece: p}:
				return true
			case <-ctx.Done():
				return false
			}
		})
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			// After cancellation the receiver may be gone: never block on it.
			select {
			case ch <- Result{Err: err}:
			case <-ctx.Done():
			}
		}
	}()
	return ch
}

// cStructSizes reports sizeof of the public C structs (checked by the tests).
func cStructSizes() map[string]uintptr {
	return map[string]uintptr{
		"llm_load_params":      unsafe.Sizeof(C.llm_load_params{}),
		"llm_model_properties": unsafe.Sizeof(C.llm_model_properties{}),
		"llm_detok_state":      unsafe.Sizeof(C.llm_detok_state{}),
		"llm_session_params":   unsafe.Sizeof(C.llm_session_params{}),
		"llm_sampling":         unsafe.Sizeof(C.llm_sampling{}),
		"llm_session_stats_t":  unsafe.Sizeof(C.llm_session_stats_t{}),
		"llm_chat_message":     unsafe.Sizeof(C.llm_chat_message{}),
		"llm_chat_params":      unsafe.Sizeof(C.llm_chat_params{}),
	}
}

// ---------------------------------------------------------------- chat

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role    string // "system", "user", "assistant", ...
	Content string
}

func render(mp *C.llm_model, messages []ChatMessage, addGenerationPrompt bool, template string) (string, error) {
	// The messages and their strings live in C memory for the call.
	var cm *C.llm_chat_message
	if len(messages) > 0 {
		cm = (*C.llm_chat_message)(C.calloc(C.size_t(len(messages)), C.size_t(unsafe.Sizeof(C.llm_chat_message{}))))
		defer C.free(unsafe.Pointer(cm))
	}
	arr := unsafe.Slice(cm, len(messages))
	size := 256
	for i, msg := range messages {
		arr[i].role = C.CString(msg.Role)
		arr[i].content = C.CString(msg.Content)
		defer C.free(unsafe.Pointer(arr[i].role))
		defer C.free(unsafe.Pointer(arr[i].content))
		size += len(msg.Role) + len(msg.Content)
	}
	var p C.llm_chat_params
	C.llm_chat_params_init(&p)
	p.add_generation_prompt = 0
	if addGenerationPrompt {
		p.add_generation_prompt = 1
	}
	if template != "" {
		p.template_source = C.CString(template)
		defer C.free(unsafe.Pointer(p.template_source))
	}
	return growString(size, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
		return C.llm_chat_render(mp, cm, C.size_t(len(messages)), &p, buf, capacity, length)
	})
}

// ChatRender renders a conversation into prompt text through template (Jinja2
// source), or the model's own template when template is "". The text usually
// begins with the BOS text: tokenize it with parseSpecial and without addBOS.
// A model without a template (and no built-in that fits) gives
// ErrUnsupported; a malformed template ErrInvalidArgument with line and column.
func (m *Model) ChatRender(messages []ChatMessage, addGenerationPrompt bool, template string) (string, error) {
	var out string
	err := m.withOpen(func(mp *C.llm_model) error {
		var err error
		out, err = render(mp, messages, addGenerationPrompt, template)
		return err
	})
	return out, err
}

// ChatRender without a model: template is required; bos_token and eos_token are "".
func ChatRender(messages []ChatMessage, addGenerationPrompt bool, template string) (string, error) {
	if template == "" {
		return "", &Error{Status: StatusInvalidArgument, Message: "ChatRender without a model needs a template"}
	}
	return render(nil, messages, addGenerationPrompt, template)
}

// ChatTemplate returns the template ChatRender uses when none is passed: the
// file's, or the built-in one (ErrUnsupported if there is none).
func (m *Model) ChatTemplate() (string, error) {
	var out string
	err := m.withOpen(func(mp *C.llm_model) error {
		var err error
		out, err = growString(4096, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
			return C.llm_model_chat_template(mp, buf, capacity, length)
		})
		return err
	})
	return out, err
}

// ---------------------------------------------------------------- grammars

// Grammar is a compiled grammar bound to a model's vocabulary: immutable and
// safe for concurrent use by many sessions (Sampling.Grammar). It does not
// need its model to stay open. Close it, or leave it to the finalizer.
type Grammar struct {
	mu  sync.RWMutex // write-held only while freeing; read-held by calls using it
	ptr *C.llm_grammar
}

func newGrammar(ptr *C.llm_grammar) *Grammar {
	g := &Grammar{ptr: ptr}
	runtime.SetFinalizer(g, func(g *Grammar) { g.Close() })
	return g
}

// NewGrammar compiles a GBNF grammar whose start rule is root ("" = "root").
// A syntax error gives ErrInvalidArgument with the line and column.
func (m *Model) NewGrammar(gbnf, root string) (*Grammar, error) {
	cg := C.CString(gbnf)
	defer C.free(unsafe.Pointer(cg))
	var cr *C.char
	if root != "" {
		cr = C.CString(root)
		defer C.free(unsafe.Pointer(cr))
	}
	var out *C.llm_grammar
	err := m.withOpen(func(mp *C.llm_model) error {
		return call(func() C.llm_status { return C.llm_grammar_create(mp, cg, cr, &out) })
	})
	if err != nil {
		return nil, err
	}
	return newGrammar(out), nil
}

// NewJSONSchemaGrammar compiles a JSON Schema (the subset of docs/GRAMMAR.md)
// into the grammar of the JSON texts it accepts.
func (m *Model) NewJSONSchemaGrammar(schema string) (*Grammar, error) {
	cs := C.CString(schema)
	defer C.free(unsafe.Pointer(cs))
	var out *C.llm_grammar
	err := m.withOpen(func(mp *C.llm_model) error {
		return call(func() C.llm_status { return C.llm_grammar_from_json_schema(mp, cs, &out) })
	})
	if err != nil {
		return nil, err
	}
	return newGrammar(out), nil
}

// JSONSchemaToGBNF returns the GBNF text NewJSONSchemaGrammar compiles for schema.
func JSONSchemaToGBNF(schema string) (string, error) {
	cs := C.CString(schema)
	defer C.free(unsafe.Pointer(cs))
	return growString(4096, func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
		return C.llm_json_schema_to_gbnf(cs, buf, capacity, length)
	})
}

// Close frees the grammar once no call uses it. Closing twice is a no-op;
// a Sampling with a closed grammar gives ErrClosed.
func (g *Grammar) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ptr != nil {
		C.llm_grammar_free(g.ptr)
		g.ptr = nil
	}
	return nil
}

// ---------------------------------------------------------------- text streams

// TextStream turns generated tokens into text to show: complete UTF-8 only,
// stop strings found across token boundaries (the text before a stop is
// delivered; the stop and everything after it never are), and an
// end-of-generation token ends the stream. Not safe for concurrent use.
// It keeps its model alive until Close.
type TextStream struct {
	model   *Model
	ptr     *C.llm_text_stream
	buf     []byte
	stopped bool
}

// NewTextStream creates a stream that ends at any of stops (non-empty, at
// most 64 of at most 1024 bytes each, else ErrInvalidArgument).
func (m *Model) NewTextStream(stops []string) (*TextStream, error) {
	var cs **C.char
	longest := 0
	if len(stops) > 0 {
		cs = (**C.char)(C.calloc(C.size_t(len(stops)), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		defer C.free(unsafe.Pointer(cs))
		arr := unsafe.Slice(cs, len(stops))
		for i, stop := range stops {
			arr[i] = C.CString(stop)
			defer C.free(unsafe.Pointer(arr[i]))
			if len(stop) > longest {
				longest = len(stop)
			}
		}
	}
	var out *C.llm_text_stream
	err := m.withOpen(func(mp *C.llm_model) error {
		if err := call(func() C.llm_status { return C.llm_text_stream_create(mp, cs, C.size_t(len(stops)), &out) }); err != nil {
			return err
		}
		atomic.AddInt32(&m.refs, 1) // under the read lock, so release cannot free meanwhile
		return nil
	})
	if err != nil {
		return nil, err
	}
	t := &TextStream{model: m, ptr: out, buf: make([]byte, 256+3*longest)}
	runtime.SetFinalizer(t, func(t *TextStream) { t.Close() })
	return t, nil
}

// Push feeds one generated token and returns the text that became safe to
// show (often "" while a stop string may be starting) and whether the
// stream has ended (a stop string or an end-of-generation token; later
// pushes return "", true).
func (t *TextStream) Push(token Token) (string, bool, error) {
	if t.ptr == nil {
		return "", t.stopped, ErrClosed
	}
	for {
		var n C.size_t
		var stopped C.int32_t
		err := call(func() C.llm_status {
			return C.llm_text_stream_push(t.ptr, C.llm_token(token), (*C.char)(unsafe.Pointer(&t.buf[0])),
				C.size_t(len(t.buf)), &n, &stopped)
		})
		if errors.Is(err, ErrBufferTooSmall) && int(n) > len(t.buf) {
			t.buf = make([]byte, int(n)) // the stream is unchanged on this status
			continue
		}
		if err != nil {
			return "", t.stopped, err
		}
		t.stopped = stopped != 0
		return string(t.buf[:int(n)]), t.stopped, nil
	}
}

// Stopped reports whether a stop string or an end-of-generation token ended the stream.
func (t *TextStream) Stopped() bool { return t.stopped }

// Flush ends the stream: the text still held back (a partial stop string is
// text after all; an unfinished character becomes U+FFFD).
func (t *TextStream) Flush() (string, error) {
	if t.ptr == nil {
		return "", ErrClosed
	}
	out, err := growBytes(len(t.buf), func(buf *C.char, capacity C.size_t, length *C.size_t) C.llm_status {
		return C.llm_text_stream_flush(t.ptr, buf, capacity, length)
	})
	return string(out), err
}

// Reset starts the stream over with the same stops.
func (t *TextStream) Reset() error {
	if t.ptr == nil {
		return ErrClosed
	}
	err := call(func() C.llm_status { return C.llm_text_stream_reset(t.ptr) })
	if err == nil {
		t.stopped = false
	}
	return err
}

// Close frees the stream and releases its model reference. Closing twice is a no-op.
func (t *TextStream) Close() error {
	if t.ptr != nil {
		C.llm_text_stream_free(t.ptr)
		t.ptr = nil
		t.model.release()
	}
	return nil
}
