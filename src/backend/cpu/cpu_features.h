// Run-time CPU feature detection for the CPU backend's SIMD kernels.
//
// The library is built for baseline x86-64; kernels in *_avx2.cpp files are
// compiled with -mavx2 -mfma -mf16c and may only run when use_avx2_kernels()
// says so, those in *_avx512.cpp (AVX-512 F/BW/VL/DQ/VNNI) only when
// use_avx512_kernels() does. Detection happens once (first call); the answer
// is cached.
//
// Which family runs can be capped below what the CPU offers, process-wide:
// by the environment variable LLM_CPU_ISA=scalar|avx2|avx512 (read once, at
// first detection; unknown values are ignored) or by set_max_isa() (tests,
// benchmarks). Each family is batch invariant with itself, not with the
// others, so the cap must not change while a model is generating.
#pragma once

namespace llm::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  // AVX-512 subsets the *_avx512.cpp kernels need, each only reported when
  // the OS also saves the opmask and ZMM state (XCR0 bits 5, 6, 7).
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
};

// Kernel families, in increasing order.
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// What this CPU (and OS, for the AVX register state) supports.
const CpuFeatures& cpu_features();

// True if the AVX2 + FMA + F16C kernels may run (all three present, the cap
// allows them and the scalar path is not forced).
bool use_avx2_kernels();

// True if the AVX-512 kernels may run: use_avx2_kernels(), the five AVX-512
// subsets present, the kernels compiled in and the cap at Avx512.
bool use_avx512_kernels();

// The family matmul uses now (the highest one the above allow).
Isa active_isa();

// The best family this build can run on this CPU, ignoring the cap.
Isa best_isa();

// The cap. Defaults to LLM_CPU_ISA if set and valid, else Avx512 (no cap).
// Process-wide; not meant to be changed while other threads run matmuls.
void set_max_isa(Isa isa);
Isa max_isa();

// "scalar", "avx2", "avx512" (case-insensitive) -> Isa; false otherwise.
bool parse_isa(const char* s, Isa* out);
const char* isa_name(Isa isa);

// Test hook: force the portable scalar kernels even on an AVX2 machine so
// both paths can be checked against each other. Process-wide; not meant to be
// flipped while other threads are running matmuls. Independent of the cap.
void set_force_scalar(bool force);
bool force_scalar();

}  // namespace llm::cpu
