#include "backend/cpu/cpu_features.h"

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace llm::cpu {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // CPUID says what the core implements; XGETBV says whether the OS saves
  // the YMM registers (a hypervisor may hide AVX state even on an AVX2 CPU).
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  (void)xcr0_hi;
  if ((xcr0_lo & 0x6) != 0x6) return f;  // XMM and YMM state enabled
  bool avx2 = false;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    avx2 = (b >> 5) & 1;
  }
  f.avx2 = avx2;
  f.fma = fma;
  f.f16c = f16c;
#endif
  return f;
}

std::atomic<bool> g_force_scalar{false};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool use_avx2_kernels() {
#if defined(__x86_64__) || defined(_M_X64)
  if (g_force_scalar.load(std::memory_order_relaxed)) return false;
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
#else
  return false;  // *_avx2.cpp files are not compiled on other architectures
#endif
}

void set_force_scalar(bool force) { g_force_scalar.store(force, std::memory_order_relaxed); }
bool force_scalar() { return g_force_scalar.load(std::memory_order_relaxed); }

}  // namespace llm::cpu
