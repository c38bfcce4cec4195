// cuBLASLt, opened when the first device GEMM is made rather than linked:
// loading libcublasLt maps and relocates about 150 MB that every process
// using libllm would carry, GPU or not (measured: a process's resident set
// grows from 14 to 165 MB when the library loads). Host code; CUDA builds only.
#pragma once

#include <cublasLt.h>

namespace llm::cuda {

// The entry points the backend calls, with cuBLASLt's own signatures.
struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusName) status_name;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set_attribute;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
};

// The library (libcublasLt.so.<major> of the toolkit built against) opened
// once per process, every entry point resolved; throws Error(LLM_ERR_DEVICE)
// naming the library and the loader's message when that fails (then again
// on every call).
const CublasLtApi& cublaslt();

// The file name cublaslt() opens.
const char* cublaslt_library_name();

}  // namespace llm::cuda
