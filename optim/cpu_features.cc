// SPDX-License-Identifier: Apache-2.0
#include "optim/cpu_features.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define STRATA_X86 1
#else
#define STRATA_X86 0
#endif

namespace strata::optim {

namespace {

#if STRATA_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs Cpuid(unsigned leaf, unsigned subleaf) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.a, r.b, r.c, r.d);
  return r;
}

// XCR0: which register state the OS saves on context switch. Only valid when
// CPUID.1:ECX.OSXSAVE is set.
uint64_t Xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  Regs r0 = Cpuid(0, 0);
  unsigned max_leaf = r0.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  f.vendor = vendor;

  unsigned max_ext = Cpuid(0x80000000u, 0).a;
  if (max_ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = Cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    std::string b = brand;
    size_t s = b.find_first_not_of(' ');
    size_t e = b.find_last_not_of(' ');
    f.brand = s == std::string::npos ? "" : b.substr(s, e - s + 1);
  }
  if (max_leaf < 1) return f;

  Regs r1 = Cpuid(1, 0);
  f.sse2 = r1.d & (1u << 26);
  bool osxsave = r1.c & (1u << 27);
  bool cpu_avx = r1.c & (1u << 28);
  bool cpu_fma = r1.c & (1u << 12);
  bool cpu_f16c = r1.c & (1u << 29);
  uint64_t xcr0 = osxsave ? Xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;            // SSE + AVX (YMM) state
  bool os_avx512 = (xcr0 & 0xe6) == 0xe6;       // + opmask, ZMM_Hi256, Hi16_ZMM
  f.avx = cpu_avx && os_avx;
  f.fma = cpu_fma && f.avx;
  f.f16c = cpu_f16c && f.avx;
  if (max_leaf < 7) return f;

  Regs r7 = Cpuid(7, 0);
  f.avx2 = (r7.b & (1u << 5)) && f.avx;
  bool avx512 = os_avx && os_avx512;
  f.avx512f = (r7.b & (1u << 16)) && avx512;
  f.avx512dq = (r7.b & (1u << 17)) && f.avx512f;
  f.avx512bw = (r7.b & (1u << 30)) && f.avx512f;
  f.avx512vl = (r7.b & (1u << 31)) && f.avx512f;
  f.avx512_fp16 = (r7.d & (1u << 23)) && f.avx512f;
  if (r7.a >= 1) {
    Regs r71 = Cpuid(7, 1);
    f.avx512_bf16 = (r71.a & (1u << 5)) && f.avx512f;
  }
  return f;
}
#else
CpuFeatures Detect() { return CpuFeatures{}; }
#endif

bool HasAvx2Path(const CpuFeatures& f) { return f.avx2 && f.fma && f.f16c; }
bool HasAvx512Path(const CpuFeatures& f) {
  return HasAvx2Path(f) && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl;
}

std::string Missing(Isa isa, const CpuFeatures& f) {
  std::string m;
  auto need = [&](bool have, const char* name) {
    if (!have) m += std::string(m.empty() ? "" : " ") + name;
  };
  need(f.avx2, "avx2");
  need(f.fma, "fma");
  need(f.f16c, "f16c");
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16) {
    need(f.avx512f, "avx512f");
    need(f.avx512bw, "avx512bw");
    need(f.avx512dq, "avx512dq");
    need(f.avx512vl, "avx512vl");
  }
  if (isa == Isa::kAvx512Bf16) need(f.avx512_bf16, "avx512_bf16");
  return m;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures f = Detect();
  return f;
}

bool IsaSupported(Isa isa) {
  const CpuFeatures& f = DetectCpuFeatures();
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar: return true;
    case Isa::kAvx2: return HasAvx2Path(f);
    case Isa::kAvx512: return HasAvx512Path(f);
    case Isa::kAvx512Bf16: return HasAvx512Path(f) && f.avx512_bf16;
  }
  return false;
}

Isa BestIsa() {
  for (Isa i : {Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2})
    if (IsaSupported(i)) return i;
  return Isa::kScalar;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16})
    if (IsaSupported(i)) v.push_back(i);
  return v;
}

Result<Isa> ResolveIsa(Isa requested) {
  if (requested == Isa::kAuto) return BestIsa();
  if (IsaSupported(requested)) return requested;
  const CpuFeatures& f = DetectCpuFeatures();
  return Unavailable("CPU Adam path '" + std::string(IsaName(requested)) +
                     "' is not supported by this CPU/OS (" + f.brand + "); missing: " +
                     Missing(requested, f));
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

Result<Isa> ParseIsa(std::string_view name) {
  for (Isa i : {Isa::kAuto, Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16})
    if (name == IsaName(i)) return i;
  return InvalidArgument("unknown CPU Adam path '" + std::string(name) +
                         "' (allowed: auto, scalar, avx2, avx512, avx512bf16)");
}

std::string CpuFeatureString(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool have, const char* name) {
    if (have) s += std::string(s.empty() ? "" : " ") + name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512dq, "avx512dq");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx512_fp16, "avx512_fp16");
  return s.empty() ? "baseline" : s;
}

}  // namespace strata::optim
