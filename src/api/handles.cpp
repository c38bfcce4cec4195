#include "api/handles.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

namespace llm::api {

namespace {
std::shared_mutex& registry_mutex() {
  static std::shared_mutex m;
  return m;
}
std::unordered_set<const void*>& registry() {
  static std::unordered_set<const void*> s;
  return s;
}
// A fixed buffer, not a std::string: recording an error must not allocate
// (the error may be that memory ran out, and a bad_alloc thrown while
// reporting it would escape the C boundary). Longer messages are truncated.
thread_local char t_last_error[1024];
}  // namespace

void register_handle(const void* h) {
  std::unique_lock<std::shared_mutex> lk(registry_mutex());
  registry().insert(h);
}

void unregister_handle(const void* h) {
  std::unique_lock<std::shared_mutex> lk(registry_mutex());
  registry().erase(h);
}

llm_status copy_out(const std::string& s, char* buf, size_t capacity, size_t* length, bool nul) {
  *length = s.size();
  if (s.size() + (nul ? 1 : 0) > capacity) {
    set_last_error("text buffer too small; *length holds the size needed");
    return LLM_ERR_BUFFER_TOO_SMALL;
  }
  if (!s.empty()) std::memcpy(buf, s.data(), s.size());
  if (nul) buf[s.size()] = '\0';
  return LLM_OK;
}

bool is_live(const void* h) {
  if (!h) return false;
  std::shared_lock<std::shared_mutex> lk(registry_mutex());
  return registry().count(h) != 0;
}

llm::Model& model_of(const llm_model* m) {
  LLM_CHECK(m != nullptr, LLM_ERR_INVALID_ARGUMENT, "model is NULL");
  LLM_CHECK(is_live(m) && m->magic == kModelMagic, LLM_ERR_INVALID_ARGUMENT,
            "model handle %p is not a live llm_model (freed, or not from llm_load)", static_cast<const void*>(m));
  return *m->impl;
}

llm::Session& session_of(const llm_session* s) {
  LLM_CHECK(s != nullptr, LLM_ERR_INVALID_ARGUMENT, "session is NULL");
  LLM_CHECK(is_live(s) && s->magic == kSessionMagic, LLM_ERR_INVALID_ARGUMENT,
            "session handle %p is not a live llm_session (freed, or not from llm_session_create)",
            static_cast<const void*>(s));
  return *s->impl;
}

void set_last_error(const char* msg) noexcept {
  const size_t n = msg ? std::min(std::strlen(msg), sizeof t_last_error - 1) : 0;
  if (n) std::memcpy(t_last_error, msg, n);
  t_last_error[n] = '\0';
}
void clear_last_error() noexcept { t_last_error[0] = '\0'; }
const char* last_error() noexcept { return t_last_error; }

llm_status status_from_current_exception() {
  try {
    throw;
  } catch (const llm::Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of memory");
    return LLM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return LLM_ERR_INTERNAL;
  } catch (...) {
    set_last_error("unknown internal error");
    return LLM_ERR_INTERNAL;
  }
}

}  // namespace llm::api
