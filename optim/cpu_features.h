// SPDX-License-Identifier: Apache-2.0
// Which SIMD instruction sets this CPU (and OS) supports, and which code path
// the CPU Adam uses.
//
// The binary is built for baseline x86-64; the AVX2 and AVX-512 kernels live
// in their own translation units compiled with per-file ISA flags
// (optim/CMakeLists.txt) and are only called after DetectCpuFeatures() has
// confirmed, with cpuid and xgetbv, that both the CPU and the OS (saved
// register state) support them. On other architectures only the scalar path
// exists.
//
// Thread-safety: everything here is safe to call from any thread
// (DetectCpuFeatures caches its answer in a function-local static).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace strata::optim {

// The code paths of the CPU Adam. All of them compute bitwise the same
// results (optim/cpu_adam.h, "Determinism"); they differ only in speed.
enum class Isa : uint8_t {
  kAuto = 0,     // the best one this machine supports
  kScalar,       // plain C++ (std::fma, IEEE sqrt and division)
  kAvx2,         // AVX2 + FMA + F16C, 8 lanes
  kAvx512,       // AVX-512 F/BW/DQ/VL, 16 lanes; bf16 rounding done with integer ops
  kAvx512Bf16,   // kAvx512 plus AVX512_BF16's vcvtneps2bf16 for bf16 outputs
};

struct CpuFeatures {
  bool sse2 = false;
  bool avx = false;        // CPU and OS (XCR0 SSE+AVX state)
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;    // CPU and OS (XCR0 opmask + ZMM state)
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;  // reported only; fp32<->fp16 conversion needs just F16C/AVX512F
  std::string vendor;        // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;         // "AMD EPYC 9654 96-Core Processor", ...
};

// The features of the CPU this process runs on (detected once).
const CpuFeatures& DetectCpuFeatures();

// True when `isa` can run here (kAuto always can).
bool IsaSupported(Isa isa);
// The fastest supported path: kAvx512Bf16 > kAvx512 > kAvx2 > kScalar.
Isa BestIsa();
// Every concrete path this machine supports, slowest first (kScalar first).
std::vector<Isa> SupportedIsas();
// kAuto is resolved to BestIsa(); a path the machine lacks is Unavailable,
// naming the path and the missing features.
Result<Isa> ResolveIsa(Isa requested);

// "auto", "scalar", "avx2", "avx512", "avx512bf16".
std::string_view IsaName(Isa isa);
// Parses the names above; InvalidArgument naming the allowed values otherwise.
Result<Isa> ParseIsa(std::string_view name);

// "avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_bf16" (what is present).
std::string CpuFeatureString(const CpuFeatures& f);

}  // namespace strata::optim
