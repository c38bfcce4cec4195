#include "backend/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace llm::cpu {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // CPUID says what the core implements; XGETBV says whether the OS saves
  // the YMM / ZMM registers (a hypervisor may hide that state even on a CPU
  // that has the instructions).
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
  // Opmask (bit 5), upper halves of ZMM0-15 (6) and ZMM16-31 (7).
  const bool zmm_state = (xcr0_lo & 0xe0) == 0xe0;
  bool avx2 = false;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    avx2 = (b >> 5) & 1;
    if (zmm_state) {
      f.avx512f = (b >> 16) & 1;
      f.avx512dq = (b >> 17) & 1;
      f.avx512bw = (b >> 30) & 1;
      f.avx512vl = (b >> 31) & 1;
      f.avx512vnni = (c >> 11) & 1;
    }
  }
  f.avx2 = avx2;
  f.fma = fma;
  f.f16c = f16c;
#endif
  return f;
}

std::atomic<bool> g_force_scalar{false};

// -1: not set by set_max_isa, use the environment's value.
std::atomic<int> g_max_isa{-1};

Isa env_max_isa() {
  static const Isa isa = [] {
    Isa v = Isa::Avx512;
    const char* s = std::getenv("LLM_CPU_ISA");
    if (s != nullptr && *s != '\0') parse_isa(s, &v);  // invalid: no cap
    return v;
  }();
  return isa;
}

bool avx2_supported() {
#if defined(__x86_64__) || defined(_M_X64)
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
#else
  return false;  // *_avx2.cpp files are not compiled on other architectures
#endif
}

bool avx512_supported() {
#if defined(LLM_AVX512_KERNELS)
  const CpuFeatures& f = cpu_features();
  return avx2_supported() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
#else
  return false;  // the compiler could not build *_avx512.cpp
#endif
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    env_max_isa();  // "read once at first detection"
    return detect();
  }();
  return features;
}

bool use_avx2_kernels() {
  if (g_force_scalar.load(std::memory_order_relaxed)) return false;
  return max_isa() >= Isa::Avx2 && avx2_supported();
}

bool use_avx512_kernels() {
  if (g_force_scalar.load(std::memory_order_relaxed)) return false;
  return max_isa() >= Isa::Avx512 && avx512_supported();
}

Isa active_isa() {
  if (use_avx512_kernels()) return Isa::Avx512;
  if (use_avx2_kernels()) return Isa::Avx2;
  return Isa::Scalar;
}

Isa best_isa() {
  if (avx512_supported()) return Isa::Avx512;
  if (avx2_supported()) return Isa::Avx2;
  return Isa::Scalar;
}

void set_max_isa(Isa isa) { g_max_isa.store(int(isa), std::memory_order_relaxed); }

Isa max_isa() {
  const int v = g_max_isa.load(std::memory_order_relaxed);
  return v < 0 ? env_max_isa() : static_cast<Isa>(v);
}

bool parse_isa(const char* s, Isa* out) {
  if (s == nullptr) return false;
  auto eq = [s](const char* name) {
    const char* p = s;
    for (; *p != '\0' && *name != '\0'; ++p, ++name) {
      const char c = (*p >= 'A' && *p <= 'Z') ? char(*p - 'A' + 'a') : *p;
      if (c != *name) return false;
    }
    return *p == '\0' && *name == '\0';
  };
  if (eq("scalar")) {
    *out = Isa::Scalar;
  } else if (eq("avx2")) {
    *out = Isa::Avx2;
  } else if (eq("avx512")) {
    *out = Isa::Avx512;
  } else {
    return false;
  }
  return true;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

void set_force_scalar(bool force) { g_force_scalar.store(force, std::memory_order_relaxed); }
bool force_scalar() { return g_force_scalar.load(std::memory_order_relaxed); }

}  // namespace llm::cpu
