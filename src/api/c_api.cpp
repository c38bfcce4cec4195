// The C ABI. Every export validates its arguments, resolves handles through
// the registry, and converts any exception into a status (LLM_API_BEGIN/END).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "api/handles.h"
#include "api/utf8.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/release_memory.h"

using llm::api::model_of;
using llm::api::session_of;

namespace llm::api {
const char* last_error() noexcept;
}

// Enum fields of parameter structs come from C, where any int is a valid
// value; in C++ loading one outside the enumeration's range is undefined.
// Read the bits, validate, then convert.
template <typename E>
static int32_t enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "enums of the C API are 32-bit");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// ---------------------------------------------------------------- version / status

extern "C" LLM_API uint32_t llm_version(void) { return LLM_VERSION_NUMBER; }

extern "C" LLM_API const char* llm_version_string(void) {
#define LLM_STR2(x) #x
#define LLM_STR(x) LLM_STR2(x)
  return LLM_STR(LLM_VERSION_MAJOR) "." LLM_STR(LLM_VERSION_MINOR) "." LLM_STR(LLM_VERSION_PATCH);
}

extern "C" LLM_API const char* llm_status_string(llm_status status) {
  switch (enum_bits(status)) {  // any int from a C caller, including negative ones
    case LLM_OK: return "LLM_OK: success";
    case LLM_ERR_INVALID_ARGUMENT: return "LLM_ERR_INVALID_ARGUMENT: invalid argument";
    case LLM_ERR_OUT_OF_MEMORY: return "LLM_ERR_OUT_OF_MEMORY: out of memory";
    case LLM_ERR_IO: return "LLM_ERR_IO: input/output error";
    case LLM_ERR_FORMAT: return "LLM_ERR_FORMAT: invalid model file";
    case LLM_ERR_CHECKSUM: return "LLM_ERR_CHECKSUM: checksum mismatch";
    case LLM_ERR_UNSUPPORTED: return "LLM_ERR_UNSUPPORTED: not supported";
    case LLM_ERR_DEVICE: return "LLM_ERR_DEVICE: device error";
    case LLM_ERR_CONTEXT_FULL: return "LLM_ERR_CONTEXT_FULL: context full";
    case LLM_ERR_CANCELLED: return "LLM_ERR_CANCELLED: cancelled";
    case LLM_ERR_BUFFER_TOO_SMALL: return "LLM_ERR_BUFFER_TOO_SMALL: buffer too small";
    case LLM_ERR_INTERNAL: return "LLM_ERR_INTERNAL: internal error";
    default: return "unknown status";
  }
}

extern "C" LLM_API const char* llm_last_error(void) { return llm::api::last_error(); }

// ---------------------------------------------------------------- loading

extern "C" LLM_API void llm_load_params_init(llm_load_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->device = LLM_DEVICE_AUTO;
  p->n_threads = 0;
  p->kv_page_tokens = 16;
}

extern "C" LLM_API llm_status llm_load(const char* path, const llm_load_params* params, llm_model** out_model) {
  if (out_model) *out_model = nullptr;
  LLM_API_BEGIN
  LLM_CHECK_ARG(path != nullptr && out_model != nullptr);
  llm_load_params d;
  llm_load_params_init(&d);
  const llm_load_params p = llm::api::read_params(params, d);
  const int32_t device = enum_bits(p.device);
  LLM_CHECK(device == LLM_DEVICE_AUTO || device == LLM_DEVICE_CPU || device == LLM_DEVICE_CUDA,
            LLM_ERR_INVALID_ARGUMENT, "unknown device %d", device);
  LLM_CHECK(p.n_threads >= 0 && p.n_threads <= 1024, LLM_ERR_INVALID_ARGUMENT, "n_threads %d out of range",
            p.n_threads);
  LLM_CHECK((p.flags & ~(LLM_LOAD_VOCAB_ONLY | LLM_LOAD_REFERENCE_MATH | LLM_LOAD_NO_HUGE_PAGES)) == 0,
            LLM_ERR_INVALID_ARGUMENT,
            "unknown load flags 0x%x", p.flags);
  LLM_CHECK(p.kv_page_tokens <= 4096, LLM_ERR_INVALID_ARGUMENT, "kv_page_tokens %u out of range", p.kv_page_tokens);
  if (p.device == LLM_DEVICE_CUDA) llm::cuda::check_device();  // fails fast: DEVICE / UNSUPPORTED

  llm::LoadOptions o;
  o.device = p.device;
  o.n_threads = p.n_threads;
  o.vocab_only = (p.flags & LLM_LOAD_VOCAB_ONLY) != 0;
  o.reference_math = (p.flags & LLM_LOAD_REFERENCE_MATH) != 0;
  o.huge_pages = (p.flags & LLM_LOAD_NO_HUGE_PAGES) == 0;
  o.kv_budget_bytes = p.kv_budget_bytes;
  o.kv_page_tokens = p.kv_page_tokens ? p.kv_page_tokens : 16;
  o.progress = p.progress;
  o.progress_user = p.progress_user_data;
  o.log.fn = p.log;
  o.log.user = p.log_user_data;
  if (o.progress && o.progress(0.0f, o.progress_user)) llm::fail(LLM_ERR_CANCELLED, "load cancelled");
  std::unique_ptr<llm_model> h(new llm_model{llm::api::kModelMagic, nullptr});
  h->impl = std::shared_ptr<llm::Model>(llm::Model::load(path, o).release());
  llm::release_free_memory();  // the parsed metadata the load freed (docs/QUANTIZATION.md, memory)
  if (o.progress && o.progress(1.0f, o.progress_user)) llm::fail(LLM_ERR_CANCELLED, "load cancelled");
  llm::api::register_handle(h.get());
  *out_model = h.release();
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API void llm_model_free(llm_model* model) {
  // A live handle of the other kind (a session passed as a model) is not
  // freed: both kinds share the registry, the magic tells them apart.
  if (!model || !llm::api::is_live(model) || model->magic != llm::api::kModelMagic) return;
  llm::api::unregister_handle(model);
  model->magic = 0;
  delete model;  // sessions still alive keep the Model itself alive
}

extern "C" LLM_API llm_status llm_model_info(const llm_model* model, llm_model_properties* info) {
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(info != nullptr);
  LLM_CHECK(info->struct_size >= sizeof(uint32_t), LLM_ERR_INVALID_ARGUMENT,
            "info->struct_size must be set to sizeof(llm_model_properties)");
  const llm::ModelConfig& c = m.config();
  llm_model_properties p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.vocab_size = uint32_t(m.tokenizer().n_vocab());
  p.context_length = uint32_t(std::max(c.seq_len, 0));
  p.bos = m.tokenizer().bos();
  p.eos = m.tokenizer().eos();
  p.n_layers = uint32_t(c.n_layers);
  p.dim = uint32_t(c.dim);
  p.hidden_dim = uint32_t(c.hidden_dim);
  p.n_heads = uint32_t(c.n_heads);
  p.n_kv_heads = uint32_t(c.n_kv_heads);
  p.head_dim = uint32_t(c.head_dim);
  p.device = m.device();
  p.n_params = m.n_params();
  p.weight_bytes = m.weight_bytes();
  std::snprintf(p.architecture, sizeof p.architecture, "%s", c.arch.c_str());
  std::snprintf(p.weight_type, sizeof p.weight_type, "%s", m.vocab_only() ? "none" : llm::dtype_name(m.weight_type()));
  const size_t n = std::min<size_t>(info->struct_size, sizeof p);
  std::memcpy(info, &p, n);
  info->struct_size = uint32_t(n);
  return LLM_OK;
  LLM_API_END
}

// ---------------------------------------------------------------- tokens

extern "C" LLM_API llm_status llm_tokenize(const llm_model* model, const char* text, size_t text_len, uint32_t flags,
                                           llm_token* tokens, size_t capacity, size_t* n_tokens) {
  if (n_tokens) *n_tokens = 0;
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(n_tokens != nullptr);
  LLM_CHECK_ARG(text != nullptr || text_len == 0);
  LLM_CHECK_ARG(tokens != nullptr || capacity == 0);
  LLM_CHECK((flags & ~(LLM_TOKENIZE_ADD_BOS | LLM_TOKENIZE_PARSE_SPECIAL)) == 0, LLM_ERR_INVALID_ARGUMENT,
            "unknown tokenize flags 0x%x", flags);
  std::vector<int32_t> ids;
  m.tokenizer().encode(std::string_view(text ? text : "", text_len), (flags & LLM_TOKENIZE_ADD_BOS) != 0,
                       (flags & LLM_TOKENIZE_PARSE_SPECIAL) != 0, ids);
  *n_tokens = ids.size();
  if (ids.size() > capacity) {
    llm::api::set_last_error("token buffer too small; *n_tokens holds the size needed");
    return LLM_ERR_BUFFER_TOO_SMALL;
  }
  if (!ids.empty()) std::memcpy(tokens, ids.data(), ids.size() * sizeof(llm_token));
  return LLM_OK;
  LLM_API_END
}

using llm::api::copy_out;

static void check_token(const llm::Model& m, llm_token token) {
  LLM_CHECK(token >= 0 && token < m.tokenizer().n_vocab(), LLM_ERR_INVALID_ARGUMENT, "token id %d outside [0, %d)",
            token, m.tokenizer().n_vocab());
}

extern "C" LLM_API llm_status llm_token_to_text(const llm_model* model, llm_token token, char* buf, size_t capacity,
                                                size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  check_token(m, token);
  std::string s;
  m.tokenizer().append_piece(token, s);
  return copy_out(s, buf, capacity, length);
  LLM_API_END
}

extern "C" LLM_API llm_status llm_detokenize(const llm_model* model, const llm_token* tokens, size_t n_tokens,
                                             char* buf, size_t capacity, size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(tokens != nullptr || n_tokens == 0);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  const llm::Tokenizer& tk = m.tokenizer();
  std::string s;
  bool at_start = true;  // no text emitted yet and no ordinary token seen
  for (size_t i = 0; i < n_tokens; ++i) {
    check_token(m, tokens[i]);
    const size_t before = s.size();
    tk.append_piece(tokens[i], s);
    if (at_start && s.size() > before) {
      if (tk.strip_space_after_bos() && s[before] == ' ') s.erase(before, 1);
      at_start = false;
    }
  }
  return copy_out(s, buf, capacity, length);
  LLM_API_END
}

extern "C" LLM_API int llm_token_is_eog(const llm_model* model, llm_token token) {
  try {
    if (!llm::api::is_live(model)) return 0;
    const llm::Model& m = model_of(model);
    if (token < 0 || token >= m.tokenizer().n_vocab()) return 0;
    return m.tokenizer().is_eog(token) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

extern "C" LLM_API void llm_detok_init(llm_detok_state* state, llm_token prev_token) {
  if (!state) return;
  std::memset(state, 0, sizeof *state);
  state->struct_size = sizeof *state;
  state->prev_token = prev_token;
}

extern "C" LLM_API llm_status llm_detok_push(const llm_model* model, llm_detok_state* state, llm_token token,
                                             char* buf, size_t capacity, size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(state != nullptr && length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  LLM_CHECK(state->struct_size == sizeof *state && state->n_pending <= sizeof state->pending,
            LLM_ERR_INVALID_ARGUMENT, "detok state is not initialised (call llm_detok_init)");
  check_token(m, token);
  const llm::Tokenizer& tk = m.tokenizer();
  std::string bytes(reinterpret_cast<const char*>(state->pending), state->n_pending);
  const size_t before = bytes.size();
  tk.append_piece(token, bytes);
  const bool at_start = state->prev_token < 0 || state->prev_token == tk.bos();
  if (at_start && tk.strip_space_after_bos() && bytes.size() > before && bytes[before] == ' ') bytes.erase(before, 1);
  std::string out;
  size_t held = llm::api::utf8_complete(bytes, out);
  LLM_CHECK(held <= sizeof state->pending, LLM_ERR_INTERNAL, "utf8 hold-back overflow");
  const llm_status st = copy_out(out, buf, capacity, length);
  if (st != LLM_OK) return st;  // state unchanged
  std::memcpy(state->pending, bytes.data() + bytes.size() - held, held);
  state->n_pending = uint32_t(held);
  // The leading-space rule looks at the last token that produced text.
  if (!(tk.is_control(token) && bytes.size() == before)) state->prev_token = token;
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_detok_flush(llm_detok_state* state, char* buf, size_t capacity, size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  LLM_CHECK_ARG(state != nullptr && length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  LLM_CHECK(state->struct_size == sizeof *state && state->n_pending <= sizeof state->pending,
            LLM_ERR_INVALID_ARGUMENT, "detok state is not initialised (call llm_detok_init)");
  std::string out;
  for (uint32_t i = 0; i < state->n_pending; ++i) out += "\xEF\xBF\xBD";
  const llm_status st = copy_out(out, buf, capacity, length);
  if (st != LLM_OK) return st;
  state->n_pending = 0;
  return LLM_OK;
  LLM_API_END
}

// ---------------------------------------------------------------- sessions

static llm_session* register_session(std::shared_ptr<llm::Model> model, std::unique_ptr<llm::Session> impl) {
  std::unique_ptr<llm_session> h(new llm_session{llm::api::kSessionMagic, std::move(model), std::move(impl)});
  llm::api::register_handle(h.get());
  return h.release();
}


extern "C" LLM_API void llm_session_params_init(llm_session_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->n_sink = 4;
  p->kv_type = LLM_KV_F16;
}

extern "C" LLM_API llm_status llm_session_create(llm_model* model, const llm_session_params* params,
                                                 llm_session** out_session) {
  if (out_session) *out_session = nullptr;
  LLM_API_BEGIN
  model_of(model);
  LLM_CHECK_ARG(out_session != nullptr);
  llm_session_params d;
  llm_session_params_init(&d);
  const llm_session_params p = llm::api::read_params(params, d);
  llm::SessionOptions o;
  o.max_tokens = p.max_tokens;
  o.window = p.window;
  o.n_sink = p.n_sink;
  const int32_t kv_type = enum_bits(p.kv_type);
  LLM_CHECK(kv_type >= LLM_KV_F16 && kv_type <= LLM_KV_INT4, LLM_ERR_INVALID_ARGUMENT, "unknown kv_type %d", kv_type);
  o.kv_type = llm_kv_type(kv_type);
  o.cancel = p.cancel;
  o.cancel_user = p.cancel_user_data;
  *out_session = register_session(model->impl, std::make_unique<llm::Session>(*model->impl, o));
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API void llm_session_free(llm_session* session) {
  if (!session || !llm::api::is_live(session) || session->magic != llm::api::kSessionMagic) return;
  llm::api::unregister_handle(session);
  session->magic = 0;
  delete session;
}

extern "C" LLM_API llm_status llm_session_reset(llm_session* session) {
  LLM_API_BEGIN
  session_of(session).reset();
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_prefill(llm_session* session, const llm_token* tokens, size_t n_tokens) {
  LLM_API_BEGIN
  llm::Session& s = session_of(session);
  LLM_CHECK_ARG(tokens != nullptr || n_tokens == 0);
  LLM_CHECK(n_tokens <= (size_t(1) << 31), LLM_ERR_INVALID_ARGUMENT, "n_tokens %zu is absurd", n_tokens);
  s.prefill(tokens, n_tokens);
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_logits(llm_session* session, const float** logits, size_t* n_vocab) {
  if (logits) *logits = nullptr;
  if (n_vocab) *n_vocab = 0;
  LLM_API_BEGIN
  llm::Session& s = session_of(session);
  LLM_CHECK_ARG(logits != nullptr && n_vocab != nullptr);
  *logits = s.logits();
  *n_vocab = size_t(s.model().config().vocab_size);
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API void llm_sampling_init(llm_sampling* s) {
  if (!s) return;
  std::memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  s->temperature = 0.0f;
  s->top_k = 0;
  s->top_p = 1.0f;
  s->min_p = 0.0f;
  s->repeat_penalty = 1.0f;
  s->seed = 0;
  s->repeat_last_n = 64;
}

extern "C" LLM_API llm_status llm_decode_step(llm_session* session, const llm_sampling* sampling,
                                              llm_token* out_token) {
  if (out_token) *out_token = -1;
  LLM_API_BEGIN
  llm::Session& s = session_of(session);
  LLM_CHECK_ARG(out_token != nullptr);
  LLM_CHECK(!sampling || sampling->struct_size >= sizeof(uint32_t), LLM_ERR_INVALID_ARGUMENT,
            "sampling->struct_size is 0: initialise it with llm_sampling_init");
  *out_token = s.decode_step(sampling, llm::api::constraint_of(sampling, session->model));
  return LLM_OK;
  LLM_API_END
}

namespace {

// llm_decode_batch and llm_decode_batch_each: sampling[i] is session i's
// (or shared by all when per_session is false).
llm_status decode_batch_impl(llm_session* const* sessions, size_t n, const llm_sampling* const* samplings,
                             bool per_session, llm_token* out_tokens, const llm_token* const* prompts = nullptr,
                             const size_t* n_prompts = nullptr, const int32_t* sample = nullptr) {
  LLM_API_BEGIN
  LLM_CHECK_ARG(sessions != nullptr || n == 0);
  LLM_CHECK_ARG(out_tokens != nullptr || n == 0);
  LLM_CHECK(n <= 4096, LLM_ERR_INVALID_ARGUMENT, "n %zu sessions is absurd", n);
  for (size_t i = 0; i < n; ++i) out_tokens[i] = -1;
  std::vector<llm::Session*> ss(n);
  for (size_t i = 0; i < n; ++i) {
    ss[i] = &session_of(sessions[i]);
    LLM_CHECK(sessions[i]->model == sessions[0]->model, LLM_ERR_INVALID_ARGUMENT,
              "session %zu belongs to another model", i);
    for (size_t j = 0; j < i; ++j)
      LLM_CHECK(sessions[j] != sessions[i], LLM_ERR_INVALID_ARGUMENT, "session %zu appears twice", i);
  }
  // Every sampling and grammar is checked before any session moves.
  std::vector<const llm_sampling*> samp(n, nullptr);
  std::vector<const llm::TokenConstraint*> cons(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const llm_sampling* s = samplings ? samplings[per_session ? i : 0] : nullptr;
    LLM_CHECK(!s || s->struct_size >= sizeof(uint32_t), LLM_ERR_INVALID_ARGUMENT,
              "sampling%s->struct_size is 0: initialise it with llm_sampling_init",
              per_session ? (" " + std::to_string(i)).c_str() : "");
    samp[i] = s;
    cons[i] = llm::api::constraint_of(s, sessions[0]->model);
  }
  if (n == 0) return LLM_OK;
  std::vector<llm::PromptChunk> chunks;
  if (n_prompts || sample) {
    chunks.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t np = n_prompts ? n_prompts[i] : 0;
      LLM_CHECK(np == 0 || (prompts != nullptr && prompts[i] != nullptr), LLM_ERR_INVALID_ARGUMENT,
                "prompts[%zu] is NULL with n_prompts[%zu] = %zu", i, i, np);
      chunks[i].tokens = np ? prompts[i] : nullptr;
      chunks[i].n = np;
      chunks[i].sample = !sample || sample[i] != 0;
    }
  }
  llm::Session::decode_batch(ss.data(), n, samp.data(), out_tokens, cons.data(), chunks.empty() ? nullptr : chunks.data());
  return LLM_OK;
  LLM_API_END
}

}  // namespace

extern "C" LLM_API llm_status llm_decode_batch(llm_session* const* sessions, size_t n, const llm_sampling* sampling,
                                               llm_token* out_tokens) {
  return decode_batch_impl(sessions, n, &sampling, false, out_tokens);
}

extern "C" LLM_API llm_status llm_decode_batch_each(llm_session* const* sessions, size_t n,
                                                    const llm_sampling* const* samplings, llm_token* out_tokens) {
  return decode_batch_impl(sessions, n, samplings, true, out_tokens);
}

extern "C" LLM_API llm_status llm_decode_batch_prefill(llm_session* const* sessions, size_t n,
                                                       const llm_token* const* prompts, const size_t* n_prompts,
                                                       const int32_t* sample, const llm_sampling* const* samplings,
                                                       llm_token* out_tokens) {
  return decode_batch_impl(sessions, n, samplings, true, out_tokens, prompts, n_prompts, sample);
}

extern "C" LLM_API llm_status llm_kv_evict(llm_session* session, uint32_t n_keep, uint32_t n_discard) {
  LLM_API_BEGIN
  session_of(session).evict(n_keep, n_discard);
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_session_stats(const llm_session* session, llm_session_stats_t* stats) {
  LLM_API_BEGIN
  const llm::Session& s = session_of(session);
  LLM_CHECK_ARG(stats != nullptr);
  LLM_CHECK(stats->struct_size >= sizeof(uint32_t), LLM_ERR_INVALID_ARGUMENT,
            "stats->struct_size must be set to sizeof(llm_session_stats_t)");
  s.stats(stats);
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_session_fork(const llm_session* src, llm_session** out_session) {
  if (out_session) *out_session = nullptr;
  LLM_API_BEGIN
  const llm::Session& s = session_of(src);
  LLM_CHECK_ARG(out_session != nullptr);
  *out_session = register_session(src->model, s.fork());
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_session_save(const llm_session* session, void* buf, size_t capacity,
                                               size_t* length) {
  if (length) *length = 0;
  LLM_API_BEGIN
  const llm::Session& s = session_of(session);
  LLM_CHECK_ARG(length != nullptr);
  LLM_CHECK_ARG(buf != nullptr || capacity == 0);
  std::vector<uint8_t> bytes;
  s.save(bytes);
  *length = bytes.size();
  if (bytes.size() > capacity) {
    llm::api::set_last_error("snapshot buffer too small; *length holds the size needed");
    return LLM_ERR_BUFFER_TOO_SMALL;
  }
  std::memcpy(buf, bytes.data(), bytes.size());
  return LLM_OK;
  LLM_API_END
}

extern "C" LLM_API llm_status llm_session_restore(llm_model* model, const void* buf, size_t length,
                                                  llm_session** out_session) {
  if (out_session) *out_session = nullptr;
  LLM_API_BEGIN
  const llm::Model& m = model_of(model);
  LLM_CHECK_ARG(out_session != nullptr);
  LLM_CHECK_ARG(buf != nullptr || length == 0);
  *out_session = register_session(model->impl, llm::Session::restore(m, static_cast<const uint8_t*>(buf), length));
  return LLM_OK;
  LLM_API_END
}
