// The C ABI's handle objects and the firewall around every export.
//
// Handles are registered in a process-wide set while alive, so a NULL,
// foreign or already-freed pointer passed to any llm_* call is reported as
// LLM_ERR_INVALID_ARGUMENT instead of being dereferenced.
#pragma once

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "core/error.h"
#include "engine/session.h"
#include "llm.h"
#include "model/model.h"

// What the chat and grammar calls build once per model handle (c_api_chat.cpp).
struct llm_model_extras;
namespace llm::api {
llm_model_extras* new_model_extras();
void free_model_extras(llm_model_extras* x);
struct ExtrasDeleter {
  void operator()(llm_model_extras* x) const { free_model_extras(x); }
};
}  // namespace llm::api

struct llm_model {
  uint64_t magic;
  std::shared_ptr<llm::Model> impl;
  std::unique_ptr<llm_model_extras, llm::api::ExtrasDeleter> extras{llm::api::new_model_extras()};
};

struct llm_session {
  uint64_t magic;
  std::shared_ptr<llm::Model> model;  // keeps the model alive while the session lives
  std::unique_ptr<llm::Session> impl;
};

namespace llm::api {

constexpr uint64_t kModelMagic = 0x4c4c4d4d4f44454cULL;    // "LLMMODEL"
constexpr uint64_t kSessionMagic = 0x4c4c4d5345535349ULL;  // "LLMSESSI"

void register_handle(const void* h);
void unregister_handle(const void* h);
bool is_live(const void* h);

llm::Model& model_of(const llm_model* m);     // throws INVALID_ARGUMENT
// The session-side view of sampling->grammar (NULL when none); throws
// INVALID_ARGUMENT for a dead handle or a grammar of another model.
const TokenConstraint* constraint_of(const llm_sampling* sampling, const std::shared_ptr<llm::Model>& model);
llm::Session& session_of(const llm_session* s);

// Copies s into a caller's buffer: *length = s.size(); with nul, a NUL
// follows (capacity must be >= s.size() + 1). Too small a buffer is
// LLM_ERR_BUFFER_TOO_SMALL (the size needed is in *length), nothing written.
llm_status copy_out(const std::string& s, char* buf, size_t capacity, size_t* length, bool nul = false);

void set_last_error(const char* msg) noexcept;  // never allocates
void clear_last_error() noexcept;
llm_status status_from_current_exception();

// Copies a caller's params struct over `defaults`: reads min(struct_size,
// sizeof(T)) bytes. struct_size 0 (params never initialised) is an error.
template <typename T>
T read_params(const T* user, T defaults) {
  if (!user) return defaults;
  LLM_CHECK(user->struct_size >= sizeof(uint32_t), LLM_ERR_INVALID_ARGUMENT,
            "params struct_size is %u: initialise the struct with its *_init function", user->struct_size);
  const size_t n = user->struct_size < sizeof(T) ? user->struct_size : sizeof(T);
  std::memcpy(&defaults, user, n);
  defaults.struct_size = sizeof(T);
  return defaults;
}

}  // namespace llm::api

#define LLM_API_BEGIN \
  ::llm::api::clear_last_error(); \
  try {
#define LLM_API_END                                   \
  }                                                   \
  catch (...) {                                       \
    return ::llm::api::status_from_current_exception(); \
  }
#define LLM_CHECK_ARG(cond) LLM_CHECK(cond, LLM_ERR_INVALID_ARGUMENT, "invalid argument: %s", #cond)
