// See cublaslt_api.h. Empty without LLM_WITH_CUDA.
#ifdef LLM_WITH_CUDA

#include "backend/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

#define LLM_STR2(x) #x
#define LLM_STR(x) LLM_STR2(x)

namespace llm::cuda {

namespace {

struct Loaded {
  CublasLtApi api{};
  std::string error;  // empty when every entry point resolved
};

// f = the library's `name`; the first one missing is named in error.
template <class F>
void resolve(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr && error.empty()) error = std::string("no symbol ") + name;
}

Loaded open_library() {
  Loaded l;
  // Kept open for the process's lifetime (the backend's handles point into it).
  void* lib = dlopen(cublaslt_library_name(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    l.error = why ? why : "dlopen failed";
    return l;
  }
  CublasLtApi& a = l.api;
  std::string& e = l.error;
  resolve(lib, "cublasLtCreate", a.create, e);
  resolve(lib, "cublasLtDestroy", a.destroy, e);
  resolve(lib, "cublasLtGetStatusName", a.status_name, e);
  resolve(lib, "cublasLtGetStatusString", a.status_string, e);
  resolve(lib, "cublasLtMatmul", a.matmul, e);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", a.algo_get_heuristic, e);
  resolve(lib, "cublasLtMatmulDescCreate", a.desc_create, e);
  resolve(lib, "cublasLtMatmulDescDestroy", a.desc_destroy, e);
  resolve(lib, "cublasLtMatmulDescSetAttribute", a.desc_set_attribute, e);
  resolve(lib, "cublasLtMatmulPreferenceCreate", a.pref_create, e);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", a.pref_destroy, e);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", a.pref_set_attribute, e);
  resolve(lib, "cublasLtMatrixLayoutCreate", a.layout_create, e);
  resolve(lib, "cublasLtMatrixLayoutDestroy", a.layout_destroy, e);
  return l;
}

}  // namespace

const char* cublaslt_library_name() { return "libcublasLt.so." LLM_STR(CUBLAS_VER_MAJOR); }

const CublasLtApi& cublaslt() {
  static const Loaded loaded = open_library();  // once, thread-safe
  LLM_CHECK(loaded.error.empty(), LLM_ERR_DEVICE, "cuBLASLt (%s) could not be loaded: %s", cublaslt_library_name(),
            loaded.error.c_str());
  return loaded.api;
}

}  // namespace llm::cuda

#endif  // LLM_WITH_CUDA
