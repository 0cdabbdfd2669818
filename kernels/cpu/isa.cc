// SPDX-License-Identifier: Apache-2.0
#include "kernels/cpu/isa.h"

#include <cstdlib>
#include <cstring>

#include "kernels/cpu/avx2.h"

namespace strata::kernels::cpu {

bool Avx2Usable() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool usable = Avx2KernelsCompiled() && __builtin_cpu_supports("avx2") &&
                             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return usable;
#else
  return false;
#endif
}

Isa ActiveIsa() {
  static const Isa isa = [] {
    const char* env = std::getenv("STRATA_CPU_ISA");
    if (env && std::strcmp(env, "generic") == 0) return Isa::kGeneric;
    return Avx2Usable() ? Isa::kAvx2 : Isa::kGeneric;
  }();
  return isa;
}

const char* IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "generic"; }

}  // namespace strata::kernels::cpu
