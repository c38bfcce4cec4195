package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func modelsDir() string {
	if d := os.Getenv("LLM_MODELS_DIR"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "..", "shared", "models")
}

// referenceCase is case 0 of reference/stories260K_greedy.json (llama2.c run.c, greedy).
type referenceCase struct {
	Prompt            string  `json:"prompt"`
	PromptTokenIDs    []Token `json:"prompt_token_ids"`
	GeneratedTokenIDs []Token `json:"generated_token_ids"`
	GeneratedText     string  `json:"generated_text"`
}

func loadReference(t *testing.T) referenceCase {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(modelsDir(), "reference", "stories260K_greedy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []referenceCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	c := doc.Cases[0]
	if c.Prompt != "Once upon a time" || len(c.GeneratedTokenIDs) != 64 {
		t.Fatalf("unexpected reference case 0: %q, %d ids", c.Prompt, len(c.GeneratedTokenIDs))
	}
	return c
}

func loadStories(t *testing.T) *Model {
	t.Helper()
	// One compute thread: tests run next to other jobs on small CI machines.
	m, err := Load(filepath.Join(modelsDir(), "stories260K.gguf"), &LoadOptions{Device: DeviceCPU, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func greedy(t *testing.T, s *Session, n int) []Token {
	t.Helper()
	out := make([]Token, 0, n)
	for i := 0; i < n; i++ {
		tok, err := s.DecodeStep(nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
	}
	return out
}

func sameTokens(a, b []Token) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestVersion(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("library version %d, header %d", Version(), HeaderVersion)
	}
	want := fmt.Sprintf("%d.%d.%d", HeaderVersion/10000, HeaderVersion/100%100, HeaderVersion%100)
	if VersionString() != want {
		t.Fatalf("version string %q, want %q", VersionString(), want)
	}
}

func TestStructSizes(t *testing.T) {
	// x86-64 / LP64 values pinned by tests/abi/layout_test.cpp.
	want := map[string]uintptr{
		"llm_load_params": 64, "llm_model_properties": 112, "llm_detok_state": 16,
		"llm_session_params": 40, "llm_sampling": 48, "llm_session_stats_t": 80,
		"llm_chat_message": 16, "llm_chat_params": 24,
	}
	for name, size := range cStructSizes() {
		if want[name] != size {
			t.Errorf("sizeof(%s) = %d, want %d", name, size, want[name])
		}
	}
}

func TestReferenceGreedy(t *testing.T) {
	ref := loadReference(t)
	m := loadStories(t)
	defer m.Close()

	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.VocabSize != 512 || info.Layers != 5 || info.Architecture != "llama" || info.BOS != 1 {
		t.Fatalf("unexpected info %+v", info)
	}

	prompt, err := m.Tokenize(ref.Prompt, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if !sameTokens(prompt, ref.PromptTokenIDs) {
		t.Fatalf("prompt ids %v, want %v", prompt, ref.PromptTokenIDs)
	}
	if text, err := m.Detokenize(prompt); err != nil || text != ref.Prompt {
		t.Fatalf("detokenize: %q, %v", text, err)
	}

	s, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prefill(prompt); err != nil {
		t.Fatal(err)
	}
	logits, err := s.Logits()
	if err != nil {
		t.Fatal(err)
	}
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if len(logits) != 512 || Token(best) != ref.GeneratedTokenIDs[0] {
		t.Fatalf("logits: n=%d argmax=%d", len(logits), best)
	}
	if ids := greedy(t, s, 64); !sameTokens(ids, ref.GeneratedTokenIDs) {
		t.Fatalf("generated %v\nwant %v", ids, ref.GeneratedTokenIDs)
	}
	st, err := s.Stats()
	if err != nil || st.Prompt != 5 || st.Generated != 64 || st.Tokens != 69 {
		t.Fatalf("stats %+v, %v", st, err)
	}

	// The callback stream gives the same ids and the reference text.
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	var ids []Token
	text := ""
	err = s.Generate(ref.Prompt, 64, nil, func(p Piece) bool {
		ids = append(ids, p.Token)
		text += p.Text
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if !sameTokens(ids, ref.GeneratedTokenIDs) || text != ref.GeneratedText {
		t.Fatalf("stream: %q\nwant %q", text, ref.GeneratedText)
	}

	// And so does the channel stream.
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := s.Prefill(prompt); err != nil {
		t.Fatal(err)
	}
	text = ""
	for r := range s.StreamChan(context.Background(), 64, nil) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		text += r.Text
	}
	if text != ref.GeneratedText {
		t.Fatalf("channel stream: %q", text)
	}

	// Stopping early from the callback.
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.Generate(ref.Prompt, 64, nil, func(Piece) bool { n++; return n < 3 }); err != nil || n != 3 {
		t.Fatalf("early stop: n=%d err=%v", n, err)
	}
}

func TestConcurrentSessions(t *testing.T) {
	ref := loadReference(t)
	m := loadStories(t)
	defer m.Close()
	var wg sync.WaitGroup
	results := make([][]Token, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := m.NewSession(nil)
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			if err := s.Prefill(ref.PromptTokenIDs); err != nil {
				errs[i] = err
				return
			}
			for j := 0; j < 24; j++ {
				tok, err := s.DecodeStep(nil)
				if err != nil {
					errs[i] = err
					return
				}
				results[i] = append(results[i], tok)
			}
		}(i)
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !sameTokens(results[i], ref.GeneratedTokenIDs[:24]) {
			t.Fatalf("goroutine %d: %v", i, results[i])
		}
	}
}

func TestSessionKeepsModelAlive(t *testing.T) {
	ref := loadReference(t)
	m := loadStories(t)
	s, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := m.Tokenize("x", false, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("Tokenize after Close: %v", err)
	}
	if _, err := m.NewSession(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSession after Close: %v", err)
	}
	// The session still works: it holds its own reference.
	text := ""
	if err := s.Generate(ref.Prompt, 8, nil, func(p Piece) bool { text += p.Text; return true }); err != nil {
		t.Fatal(err)
	}
	if text == "" || text != ref.GeneratedText[:len(text)] {
		t.Fatalf("text after model Close: %q", text)
	}
	s.Close()
	if m.ptr != nil {
		t.Fatal("C model not freed after the last session closed")
	}
	if _, err := s.DecodeStep(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("DecodeStep after Close: %v", err)
	}
	s.Close() // idempotent
}

func TestErrors(t *testing.T) {
	_, err := Load(filepath.Join(modelsDir(), "does-not-exist.gguf"), nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusIO || e.Message == "" || !errors.Is(err, ErrIO) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := Load(filepath.Join(modelsDir(), "README.md"), nil); !errors.Is(err, ErrFormat) {
		t.Fatalf("README.md: %v", err)
	}
	m := loadStories(t)
	defer m.Close()
	s, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DecodeStep(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("decode on empty session: %v", err)
	}
	if err := s.Prefill([]Token{100000}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad token id: %v", err)
	}
	if err := s.KVEvict(0, 1000); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("evict outside the sequence: %v", err)
	}
}

func TestVocabOnly(t *testing.T) {
	ref := loadReference(t)
	m, err := Load(filepath.Join(modelsDir(), "stories260K.gguf"), &LoadOptions{VocabOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids, err := m.Tokenize(ref.Prompt, true, false)
	if err != nil || !sameTokens(ids, ref.PromptTokenIDs) {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	if _, err := m.NewSession(nil); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("session on a vocab-only model: %v", err)
	}
}

func TestDetokenizerHoldsBackIncompleteUTF8(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	// "ö" is not in the vocabulary: byte fallback gives <0xC3> <0xB6> = ids 198, 185.
	d := m.NewDetokenizer(378)
	for i, step := range []struct {
		tok  Token
		want string
	}{{198, ""}, {185, "ö"}, {198, ""}} {
		got, err := d.Push(step.tok)
		if err != nil || got != step.want {
			t.Fatalf("push %d: %q %v", i, got, err)
		}
	}
	if got, err := d.Flush(); err != nil || got != "\uFFFD" {
		t.Fatalf("flush: %q %v", got, err)
	}
}

func TestForkAndSaveRestore(t *testing.T) {
	ref := loadReference(t)
	m := loadStories(t)
	defer m.Close()
	s, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Prefill(ref.PromptTokenIDs); err != nil {
		t.Fatal(err)
	}
	want := ref.GeneratedTokenIDs
	if ids := greedy(t, s, 10); !sameTokens(ids, want[:10]) {
		t.Fatalf("first 10: %v", ids)
	}
	fork, err := s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := s.Save()
	if err != nil || len(saved) == 0 {
		t.Fatalf("save: %d bytes, %v", len(saved), err)
	}
	if ids := greedy(t, s, 10); !sameTokens(ids, want[10:20]) {
		t.Fatalf("original after fork: %v", ids)
	}
	done := make(chan []Token)
	go func() {
		defer fork.Close()
		out := make([]Token, 0, 10)
		for i := 0; i < 10; i++ {
			tok, err := fork.DecodeStep(nil)
			if err != nil {
				break
			}
			out = append(out, tok)
		}
		done <- out
	}()
	if ids := <-done; !sameTokens(ids, want[10:20]) {
		t.Fatalf("fork: %v", ids)
	}
	r, err := m.RestoreSession(saved)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st, err := r.Stats(); err != nil || st.Tokens != 15 {
		t.Fatalf("restored stats %+v %v", st, err)
	}
	if ids := greedy(t, r, 10); !sameTokens(ids, want[10:20]) {
		t.Fatalf("restored: %v", ids)
	}
	bad := append([]byte(nil), saved...)
	bad[len(bad)/2] ^= 0x55
	if _, err := m.RestoreSession(bad); !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrFormat) {
		t.Fatalf("damaged bytes: %v", err)
	}
	if _, err := m.RestoreSession(saved[:len(saved)/3]); !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrFormat) {
		t.Fatalf("truncated bytes: %v", err)
	}
}

var batchPrompts = []string{"Once upon a time", "Lily had a", "Tom and Sam went"}

func prompted(t *testing.T, m *Model, prompt string, opts *SessionOptions) *Session {
	t.Helper()
	s, err := m.NewSession(opts)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.Tokenize(prompt, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Prefill(ids); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecodeBatchEqualsSteppingAlone(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	sp := DefaultSampling()
	sp.Temperature = 0.9
	sp.Seed = 5
	var batch, alone []*Session
	for _, p := range batchPrompts {
		batch = append(batch, prompted(t, m, p, nil))
		alone = append(alone, prompted(t, m, p, nil))
	}
	defer func() {
		for _, s := range append(batch, alone...) {
			s.Close()
		}
	}()
	streams := make([][]Token, len(batchPrompts))
	for step := 0; step < 20; step++ {
		got, err := DecodeBatch(batch, &sp)
		if err != nil || len(got) != len(batch) {
			t.Fatalf("step %d: %v %v", step, got, err)
		}
		for i, s := range alone {
			want, err := s.DecodeStep(&sp)
			if err != nil {
				t.Fatal(err)
			}
			if got[i] != want {
				t.Fatalf("session %d step %d: batch %d, alone %d", i, step, got[i], want)
			}
			streams[i] = append(streams[i], got[i])
		}
	}
	if sameTokens(streams[0], streams[1]) || sameTokens(streams[1], streams[2]) {
		t.Fatalf("different prompts gave the same continuation: %v", streams)
	}
	if got, err := DecodeBatch(nil, &sp); err != nil || len(got) != 0 {
		t.Fatalf("empty batch: %v %v", got, err)
	}
}

func TestDecodeBatchRejectsDuplicatesAndForeignModels(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	other := loadStories(t) // the same file loaded twice is another C model
	defer other.Close()
	a := prompted(t, m, "Lily had a", nil)
	defer a.Close()
	b := prompted(t, other, "Lily had a", nil)
	defer b.Close()
	fresh := prompted(t, m, "Lily had a", nil)
	defer fresh.Close()
	got, err := DecodeBatch([]*Session{a, a}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || e.Message == "" {
		t.Fatalf("duplicate session: %v", err)
	}
	if !sameTokens(got, []Token{-1, -1}) {
		t.Fatalf("duplicate session tokens: %v", got)
	}
	if _, err := DecodeBatch([]*Session{a, b}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("sessions of two models: %v", err)
	}
	closed := prompted(t, m, "Lily had a", nil)
	closed.Close()
	if _, err := DecodeBatch([]*Session{a, closed}, nil); err != ErrClosed {
		t.Fatalf("closed session: %v", err)
	}
	// Nothing advanced: a's next greedy token is still the first one.
	x, err1 := a.DecodeStep(nil)
	y, err2 := fresh.DecodeStep(nil)
	if err1 != nil || err2 != nil || x != y {
		t.Fatalf("a advanced: %d %d %v %v", x, y, err1, err2)
	}
}

func TestDecodeBatchFailureKeepsAdvancedTokens(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	ids, err := m.Tokenize(batchPrompts[1], true, false)
	if err != nil {
		t.Fatal(err)
	}
	// Room for the prompt and one pending token: the third step is out of context.
	tight := &SessionOptions{MaxTokens: uint32(len(ids)) + 1}
	a := prompted(t, m, batchPrompts[0], nil)
	b := prompted(t, m, batchPrompts[1], tight)
	c := prompted(t, m, batchPrompts[2], nil)
	twinA := prompted(t, m, batchPrompts[0], nil)
	twinC := prompted(t, m, batchPrompts[2], nil)
	for _, s := range []*Session{a, b, c, twinA, twinC} {
		defer s.Close()
	}
	for step := 0; step < 2; step++ {
		got, err := DecodeBatch([]*Session{a, b, c}, nil)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if wa, wc := greedy(t, twinA, 1)[0], greedy(t, twinC, 1)[0]; got[0] != wa || got[2] != wc {
			t.Fatalf("step %d: %v, want %d _ %d", step, got, wa, wc)
		}
	}
	got, err := DecodeBatch([]*Session{a, b, c}, nil)
	if !errors.Is(err, ErrContextFull) {
		t.Fatalf("full session: %v", err)
	}
	if wa := greedy(t, twinA, 1)[0]; !sameTokens(got, []Token{wa, -1, -1}) {
		t.Fatalf("partial tokens %v, want [%d -1 -1]", got, wa)
	}
	// c is unchanged: its next token is the one its twin samples now.
	if x, y := greedy(t, c, 1)[0], greedy(t, twinC, 1)[0]; x != y {
		t.Fatalf("c advanced: %d vs %d", x, y)
	}
}

func hotSampling(seed uint64) *Sampling {
	sp := DefaultSampling()
	sp.Temperature = 0.9
	sp.Seed = seed
	return &sp
}

// stepAlone runs DecodeStep on each session with its own settings.
func stepAlone(t *testing.T, sessions []*Session, sps []*Sampling) []Token {
	t.Helper()
	out := make([]Token, len(sessions))
	for i, s := range sessions {
		tok, err := s.DecodeStep(sps[i])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = tok
	}
	return out
}

func closeAll(sessions ...*Session) {
	for _, s := range sessions {
		s.Close()
	}
}

func TestDecodeBatchEachUsesEachSessionsSampling(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	sps := []*Sampling{nil, hotSampling(5)}
	batch := []*Session{prompted(t, m, batchPrompts[0], nil), prompted(t, m, batchPrompts[1], nil)}
	alone := []*Session{prompted(t, m, batchPrompts[0], nil), prompted(t, m, batchPrompts[1], nil)}
	defer closeAll(append(batch, alone...)...)
	for step := 0; step < 12; step++ {
		got, err := DecodeBatchEach(batch, sps)
		if want := stepAlone(t, alone, sps); err != nil || !sameTokens(got, want) {
			t.Fatalf("step %d: %v %v, want %v", step, got, err, want)
		}
	}
	if _, err := DecodeBatchEach(batch, sps[:1]); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("one sampling for two sessions: %v", err)
	}
	// A nil slice is greedy for all.
	got, err := DecodeBatchEach(batch, nil)
	if want := stepAlone(t, alone, []*Sampling{nil, nil}); err != nil || !sameTokens(got, want) {
		t.Fatalf("nil samplings: %v %v, want %v", got, err, want)
	}
	// A closed grammar is refused before anything moves.
	g, err := m.NewGrammar(`root ::= "yes"`, "")
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	closedG := DefaultSampling()
	closedG.Grammar = g
	if _, err := DecodeBatchEach(batch, []*Sampling{nil, &closedG}); err != ErrClosed {
		t.Fatalf("closed grammar: %v", err)
	}
}

func TestDecodeBatchEachSharesOneGrammar(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	g, err := m.NewGrammar(`root ::= ("yes" | "no") "."`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// One grammar in two settings: it is locked once for the call.
	plain, hot := DefaultSampling(), hotSampling(5)
	plain.Grammar, hot.Grammar = g, g
	sps := []*Sampling{&plain, hot}
	batch := []*Session{prompted(t, m, batchPrompts[0], nil), prompted(t, m, batchPrompts[1], nil)}
	alone := []*Session{prompted(t, m, batchPrompts[0], nil), prompted(t, m, batchPrompts[1], nil)}
	defer closeAll(append(batch, alone...)...)
	for step := 0; step < 4; step++ {
		got, err := DecodeBatchEach(batch, sps)
		if want := stepAlone(t, alone, sps); err != nil || !sameTokens(got, want) {
			t.Fatalf("step %d: %v %v, want %v", step, got, err, want)
		}
	}
}

func TestDecodeBatchPrefillJoinsRunningSessions(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	sps := []*Sampling{nil, hotSampling(5), nil, hotSampling(11)}
	var running, twins []*Session
	for _, p := range batchPrompts {
		running = append(running, prompted(t, m, p, nil))
		twins = append(twins, prompted(t, m, p, nil))
	}
	if a, b := stepAlone(t, running, sps), stepAlone(t, twins, sps); !sameTokens(a, b) {
		t.Fatalf("first steps differ: %v %v", a, b)
	}
	newPrompt, err := m.Tokenize("The little dog", true, false)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	running = append(running, fresh)
	twins = append(twins, prompted(t, m, "The little dog", nil))
	defer closeAll(append(running, twins...)...)
	prompts := [][]Token{nil, {}, nil, newPrompt}
	for step := 0; step < 8; step++ {
		got, err := DecodeBatchPrefill(running, prompts, nil, sps)
		if want := stepAlone(t, twins, sps); err != nil || !sameTokens(got, want) {
			t.Fatalf("step %d: %v %v, want %v", step, got, err, want)
		}
		prompts = make([][]Token, 4) // later calls only step
	}
	if st, err := fresh.Stats(); err != nil || int(st.Prompt) != len(newPrompt) {
		t.Fatalf("new session stats %+v %v", st, err)
	}
	if _, err := DecodeBatchPrefill(running, prompts[:2], nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("two prompts for four sessions: %v", err)
	}
	if got, err := DecodeBatchPrefill(nil, nil, nil, nil); err != nil || len(got) != 0 {
		t.Fatalf("empty batch: %v %v", got, err)
	}
}

func TestDecodeBatchPrefillInChunks(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	hot := hotSampling(5)
	a := prompted(t, m, batchPrompts[0], nil)
	twinA := prompted(t, m, batchPrompts[0], nil)
	prompt, err := m.Tokenize("Tom and Sam went to the park", true, false)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	twin := prompted(t, m, "Tom and Sam went to the park", nil)
	defer closeAll(a, twinA, fresh, twin)
	sps := []*Sampling{nil, hot}
	got, err := DecodeBatchPrefill([]*Session{a, fresh}, [][]Token{nil, prompt[:3]}, []bool{true, false}, sps)
	if want := []Token{greedy(t, twinA, 1)[0], -1}; err != nil || !sameTokens(got, want) {
		t.Fatalf("first chunk: %v %v, want %v", got, err, want)
	}
	if st, err := fresh.Stats(); err != nil || st.Tokens != 3 {
		t.Fatalf("after the first chunk: %+v %v", st, err)
	}
	got, err = DecodeBatchPrefill([]*Session{a, fresh}, [][]Token{nil, prompt[3:]}, []bool{true, true}, sps)
	if want := stepAlone(t, []*Session{twinA, twin}, sps); err != nil || !sameTokens(got, want) {
		t.Fatalf("second chunk: %v %v, want %v", got, err, want)
	}
}

func TestDecodeBatchPrefillRejectsBadTokenBeforeAnythingMoves(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	a := prompted(t, m, batchPrompts[0], nil)
	twinA := prompted(t, m, batchPrompts[0], nil)
	fresh, err := m.NewSession(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(a, twinA, fresh)
	got, err := DecodeBatchPrefill([]*Session{a, fresh}, [][]Token{nil, {1, 100000}}, nil, nil)
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || e.Message == "" {
		t.Fatalf("bad token id: %v", err)
	}
	if !sameTokens(got, []Token{-1, -1}) {
		t.Fatalf("bad token id tokens: %v", got)
	}
	if st, err := fresh.Stats(); err != nil || st.Tokens != 0 {
		t.Fatalf("the new session moved: %+v %v", st, err)
	}
	if x, y := greedy(t, a, 1)[0], greedy(t, twinA, 1)[0]; x != y {
		t.Fatalf("a moved: %d vs %d", x, y)
	}
}

func TestDecodeBatchPrefillFailureKeepsAdvancedTokens(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	ids, err := m.Tokenize(batchPrompts[1], true, false)
	if err != nil {
		t.Fatal(err)
	}
	// b has room for its prompt and one more token: a 4-token chunk does not fit.
	tight := &SessionOptions{MaxTokens: uint32(len(ids)) + 1}
	a := prompted(t, m, batchPrompts[0], nil)
	b := prompted(t, m, batchPrompts[1], tight)
	c := prompted(t, m, batchPrompts[2], nil)
	twinA := prompted(t, m, batchPrompts[0], nil)
	twinC := prompted(t, m, batchPrompts[2], nil)
	defer closeAll(a, b, c, twinA, twinC)
	got, err := DecodeBatchPrefill([]*Session{a, b, c}, [][]Token{nil, {10, 11, 12, 13}, nil}, nil, nil)
	if !errors.Is(err, ErrContextFull) {
		t.Fatalf("full session: %v", err)
	}
	if wa := greedy(t, twinA, 1)[0]; !sameTokens(got, []Token{wa, -1, -1}) {
		t.Fatalf("partial tokens %v, want [%d -1 -1]", got, wa)
	}
	if x, y := greedy(t, c, 1)[0], greedy(t, twinC, 1)[0]; x != y {
		t.Fatalf("c advanced: %d vs %d", x, y)
	}
}

// chatML is a ChatML-like template in the subset llm_chat_render runs.
const chatML = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" +
	"{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

var chatMessages = []ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi!"}}

func TestChatRenderWithoutModel(t *testing.T) {
	text, err := ChatRender(chatMessages, true, chatML)
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
	if err != nil || text != want {
		t.Fatalf("ChatRender = %q, %v; want %q", text, err, want)
	}
	if text, err = ChatRender(chatMessages, false, chatML); err != nil || strings.HasSuffix(text, "assistant\n") {
		t.Fatalf("without generation prompt: %q, %v", text, err)
	}
	if _, err = ChatRender(chatMessages, true, "{% for m in messages %}{{ m['role'] }"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("malformed template: %v", err)
	}
}

func TestChatRenderWithModel(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	text, err := m.ChatRender(chatMessages, true, "{{ bos_token }}"+chatML+"{{ eos_token }}")
	if err != nil || !strings.HasPrefix(text, "<s><s><|im_start|>system\n") ||
		!strings.HasSuffix(text, "<|im_start|>assistant\n</s>") {
		t.Fatalf("ChatRender = %q, %v", text, err)
	}
	// A long conversation takes the buffer-too-small path.
	many := make([]ChatMessage, 20)
	for i := range many {
		many[i] = ChatMessage{Role: "user", Content: strings.Repeat("x", 1000)}
	}
	if text, err = m.ChatRender(many, true, chatML); err != nil || len(text) != 3+20*(17+1000+11)+22 {
		t.Fatalf("long conversation: %d bytes, %v", len(text), err)
	}
	// stories260K has no template and no built-in fits it.
	if _, err = m.ChatTemplate(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("ChatTemplate: %v", err)
	}
	if _, err = m.ChatRender(chatMessages, true, ""); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("ChatRender with the model's template: %v", err)
	}
}

// generateIDs returns the tokens after prompt, up to and including an
// end-of-generation token. It returns an error (no t.Fatal): goroutines call it.
func generateIDs(m *Model, prompt string, sp *Sampling, maxTokens int) ([]Token, error) {
	s, err := m.NewSession(nil)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	ids, err := m.Tokenize(prompt, true, false)
	if err == nil {
		err = s.Prefill(ids)
	}
	var out []Token
	for err == nil && len(out) < maxTokens {
		var tok Token
		if tok, err = s.DecodeStep(sp); err == nil {
			out = append(out, tok)
			if m.IsEOG(tok) {
				break
			}
		}
	}
	if err == nil && len(out) == 0 {
		err = errors.New("no tokens")
	}
	return out, err
}

func TestGrammarYesNo(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	g, err := m.NewGrammar(`root ::= ("yes" | "no") "."`, "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		sp := DefaultSampling()
		sp.Grammar = g
		if i > 0 { // the same grammar from goroutines, sampled
			sp.Temperature, sp.Seed = 1, uint64(i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids, err := generateIDs(m, "Once upon a time", &sp, 32)
			if err != nil {
				t.Error(err)
				return
			}
			text, err := m.Detokenize(ids[:len(ids)-1])
			if err != nil || !m.IsEOG(ids[len(ids)-1]) || (strings.TrimSpace(text) != "yes." && strings.TrimSpace(text) != "no.") {
				t.Errorf("grammar output %q (%v), ids %v", text, err, ids)
			}
		}()
	}
	wg.Wait()
	g.Close()
	sp := DefaultSampling()
	sp.Grammar = g
	s, _ := m.NewSession(nil)
	defer s.Close()
	_ = s.Prefill([]Token{1})
	if _, err := s.DecodeStep(&sp); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed grammar: %v", err)
	}
}

func TestGrammarJSONSchema(t *testing.T) {
	schema := `{"type": "object", "properties": {"ok": {"type": "boolean"},
		"name": {"type": "string", "maxLength": 6}}, "required": ["ok", "name"], "additionalProperties": false}`
	if gbnf, err := JSONSchemaToGBNF(schema); err != nil || !strings.Contains(gbnf, "root") {
		t.Fatalf("JSONSchemaToGBNF = %q, %v", gbnf, err)
	}
	m := loadStories(t)
	defer m.Close()
	g, err := m.NewJSONSchemaGrammar(schema)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	sp := DefaultSampling()
	sp.Grammar = g
	ids, err := generateIDs(m, "Once upon a time", &sp, 200)
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsEOG(ids[len(ids)-1]) {
		t.Fatalf("no end of generation: %v", ids)
	}
	text, _ := m.Detokenize(ids[:len(ids)-1])
	var v struct {
		OK   *bool   `json:"ok"`
		Name *string `json:"name"`
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || v.OK == nil || v.Name == nil || len(*v.Name) > 6 {
		t.Fatalf("output %q does not match the schema: %v", text, err)
	}
}

func TestGrammarErrors(t *testing.T) {
	m := loadStories(t)
	defer m.Close()
	_, err := m.NewGrammar("root ::= \"a\"\nitem ::= ( \"b\"", "")
	var e *Error
	if !errors.As(err, &e) || e.Status != StatusInvalidArgument || !strings.Contains(e.Message, "line 2") {
		t.Fatalf("bad GBNF: %v", err)
	}
	if _, err = m.NewJSONSchemaGrammar(`{"type": `); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad schema: %v", err)
	}
	g, err := m.NewGrammar(`start ::= "x"`, "start")
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	g.Close()
}

func TestTextStreamStopAcrossTokens(t *testing.T) {
	ref := loadReference(t)
	m := loadStories(t)
	defer m.Close()
	ids, text := ref.GeneratedTokenIDs, ref.GeneratedText
	// A stop string that begins inside the 10th piece and ends inside the 11th.
	prefix, err := m.Detokenize(append(append([]Token{}, ref.PromptTokenIDs...), ids[:10]...))
	if err != nil {
		t.Fatal(err)
	}
	cut := len(prefix) - len(ref.Prompt)
	stop := text[cut-2 : cut+2]
	want := text[:strings.Index(text, stop)]

	ts, err := m.NewTextStream([]string{stop, "never seen"})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	got := ""
	for _, tok := range ids {
		piece, stopped, err := ts.Push(tok)
		if err != nil {
			t.Fatal(err)
		}
		got += piece
		if stopped {
			break
		}
	}
	if !ts.Stopped() || got != want {
		t.Fatalf("stream text %q (stopped %v), want %q", got, ts.Stopped(), want)
	}
	if piece, stopped, err := ts.Push(ids[0]); piece != "" || !stopped || err != nil {
		t.Fatalf("push after the stop: %q %v %v", piece, stopped, err)
	}
	if err := ts.Reset(); err != nil {
		t.Fatal(err)
	}
	got = ""
	for _, tok := range ids[:5] {
		piece, _, _ := ts.Push(tok)
		got += piece
	}
	rest, err := ts.Flush()
	five, _ := m.Detokenize(append(append([]Token{}, ref.PromptTokenIDs...), ids[:5]...))
	if err != nil || got+rest != five[len(ref.Prompt):] {
		t.Fatalf("after reset: %q, %v; want %q", got+rest, err, five[len(ref.Prompt):])
	}

	info, _ := m.Info()
	plain, err := m.NewTextStream(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if piece, stopped, err := plain.Push(info.EOS); piece != "" || !stopped || err != nil {
		t.Fatalf("EOS: %q %v %v", piece, stopped, err)
	}
	if _, err := m.NewTextStream([]string{""}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("empty stop: %v", err)
	}
}
