// Run-time CPU feature detection for the CPU backend's SIMD kernels.
//
// The library is built for baseline x86-64; kernels in *_avx2.cpp files are
// compiled with -mavx2 -mfma -mf16c and may only run when has_avx2_kernels()
// says so. Detection happens once (first call); the answer is cached.
#pragma once

namespace llm::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
};

// What this CPU (and OS, for the AVX register state) supports.
const CpuFeatures& cpu_features();

// True if the AVX2 + FMA + F16C kernels may run (all three present and the
// scalar path is not forced).
bool use_avx2_kernels();

// Test hook: force the portable scalar kernels even on an AVX2 machine so
// both paths can be checked against each other. Process-wide; not meant to be
// flipped while other threads are running matmuls.
void set_force_scalar(bool force);
bool force_scalar();

}  // namespace llm::cpu
