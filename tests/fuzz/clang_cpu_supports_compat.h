// Fuzz build only, and only with a clang that rejects
// __builtin_cpu_supports("f16c") (clang < 16): force-included into
// src/backend/cpu/cpu_features.cpp by tests/fuzz/CMakeLists.txt so the
// instrumented library compiles. Same answers from CPUID + XGETBV.
#pragma once

#include <cpuid.h>
#include <cstring>

static inline bool llm_compat_cpu_supports(const char* feature) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u;
  bool ymm = false;
  if (osxsave && avx) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    ymm = (lo & 6u) == 6u;  // XMM and YMM state saved by the OS
  }
  if (std::strcmp(feature, "fma") == 0) return ymm && ((c >> 12) & 1u);
  if (std::strcmp(feature, "f16c") == 0) return ymm && ((c >> 29) & 1u);
  if (std::strcmp(feature, "avx2") == 0) {
    if (!ymm || __get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1u;
  }
  return false;
}
#define __builtin_cpu_supports(feature) llm_compat_cpu_supports(feature)
