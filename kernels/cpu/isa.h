// SPDX-License-Identifier: Apache-2.0
// Which instruction set the CPU backend's hot loops use, chosen once at run
// time: the AVX2+FMA+F16C builds of the GEMM kernel and the fp16/bf16
// conversions (files *_avx2.cc) when the CPU has them, else the generic x86-64
// (or other) builds. STRATA_CPU_ISA=generic forces the generic builds (tests
// and comparisons); STRATA_CPU_ISA=avx2 is the default where supported.
#pragma once

namespace strata::kernels::cpu {

enum class Isa { kGeneric, kAvx2 };

// The instruction set in use (decided on the first call; thread-safe).
Isa ActiveIsa();
// True when this binary contains the AVX2 builds and this CPU can run them.
bool Avx2Usable();
const char* IsaName(Isa isa);

}  // namespace strata::kernels::cpu
