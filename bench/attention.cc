// SPDX-License-Identifier: Apache-2.0
// strata-bench attention: the causal flash attention kernels of the CUDA
// backend, forward and backward, for every kernel variant
// (kernels/cuda/cuda_backend.h, kFlashVariants), beside the bf16 GEMM rate
// measured in the same run.
//
// Shapes: GPT 1.3B (B 8, H 16, T 2048, D 128) and GPT 6.7B (B 4, H 32,
// T 2048, D 128) by default; --shape B,H,T,D (repeatable) replaces them.
//
// FLOPs counted (the model's causal FLOPs, whatever the kernels execute):
//   forward  = 2 matmuls (S = Q K^T, O = P V) x 2*B*H*T*T*D / 2 (causal half)
//            = 2*B*H*T^2*D
//   backward = 2.5 x forward = 5 matmuls (S, dP, dV, dK, dQ) x B*H*T^2*D
//            = 5*B*H*T^2*D (the two-pass backward executes 7 matmuls; it is
//            still credited with 5, so its rate is comparable).
// Times: median over --trials of --reps back-to-back calls (synchronized
// around each trial, wall clock). The backward of each variant consumes that
// variant's own forward output and lse.
//
// Baseline: a bf16 n^3 GEMM (--peak-size, default 8192) through the backend's
// GEMM (cuBLASLt), measured in this run; ratio = attention TFLOP/s / GEMM
// TFLOP/s. Each variant's out and dqkv are also compared with the first
// variant's (relative L2 error), a cheap cross-check; the real correctness
// tests are tests/kernels/cuda_attention_gpu_test.cc.
//
// Without a usable GPU it says so and exits 0.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "base/device.h"
#include "base/half.h"
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/sweep.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace po = boost::program_options;

namespace strata::bench {
namespace {

using kernels::AttentionShape;
using kernels::Backend;
using kernels::DeviceBuffer;

struct AttnOptions {
  CommonOptions common;
  std::vector<std::string> shapes;  // "B,H,T,D"
  std::string variants;             // comma-separated; empty: all
  std::string dtype = "bf16";
  int reps = 10, trials = 5, warmup = 2;
  int64_t peak_size = 8192;
  bool check = true;
};

struct NamedShape {
  std::string name;
  int64_t B, H, T, D;
};

// Random 16-bit values of `dt` in [lo, hi) (never all zeros).
std::vector<uint16_t> RandomHalfs(size_t n, uint64_t seed, float lo, float hi, DType dt) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
    const float f = lo + (hi - lo) * u;
    v[i] = dt == DType::kBF16 ? FloatToBF16(f) : FloatToHalf(f);
  }
  return v;
}

Status Fill(Backend* be, DeviceBuffer& buf, size_t n, uint64_t seed, float lo, float hi, DType dt) {
  std::vector<uint16_t> h = RandomHalfs(n, seed, lo, hi, dt);
  return be->CopyToDevice(buf.data(), h.data(), n * 2);
}

Result<std::vector<float>> ToHost(Backend* be, const DeviceBuffer& buf, size_t n, DType dt) {
  std::vector<uint16_t> h(n);
  RETURN_IF_ERROR(be->CopyToHost(h.data(), buf.data(), n * 2));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = dt == DType::kBF16 ? BF16ToFloat(h[i]) : HalfToFloat(h[i]);
  return f;
}

double RelErr(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Median TFLOP/s of an n x n x n GEMM in `dt` through the backend (as
// strata-bench train measures its peak).
Result<double> MeasureGemmPeak(Backend* be, int64_t n, DType dt) {
  const size_t elems = static_cast<size_t>(n * n);
  ASSIGN_OR_RETURN(DeviceBuffer a, be->Allocate(elems * 2));
  ASSIGN_OR_RETURN(DeviceBuffer b, be->Allocate(elems * 2));
  ASSIGN_OR_RETURN(DeviceBuffer c, be->Allocate(elems * 2));
  RETURN_IF_ERROR(Fill(be, a, elems, 1, -1.f, 1.f, dt));
  RETURN_IF_ERROR(Fill(be, b, elems, 2, -1.f, 1.f, dt));
  kernels::GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  g.lda = g.ldb = g.ldc = n;
  g.ab_dtype = g.c_dtype = dt;
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(be->Gemm(g));
  RETURN_IF_ERROR(be->Synchronize());
  std::vector<double> rates;
  for (int trial = 0; trial < 5; ++trial) {
    const double t0 = NowSeconds();
    for (int i = 0; i < 10; ++i) RETURN_IF_ERROR(be->Gemm(g));
    RETURN_IF_ERROR(be->Synchronize());
    rates.push_back(2.0 * n * n * n * 10 / (NowSeconds() - t0) / 1e12);
  }
  return Median(rates);
}

// Median seconds per call of `fn` (reps calls per trial).
template <typename Fn>
Result<double> TimeCalls(Backend* be, const AttnOptions& o, Fn&& fn) {
  for (int i = 0; i < o.warmup; ++i) RETURN_IF_ERROR(fn());
  RETURN_IF_ERROR(be->Synchronize());
  std::vector<double> t;
  for (int trial = 0; trial < o.trials; ++trial) {
    const double t0 = NowSeconds();
    for (int i = 0; i < o.reps; ++i) RETURN_IF_ERROR(fn());
    RETURN_IF_ERROR(be->Synchronize());
    t.push_back((NowSeconds() - t0) / o.reps);
  }
  return Median(t);
}

bool ParseShape(const std::string& s, NamedShape* out) {
  int64_t v[4];
  char c1, c2, c3;
  std::istringstream is(s);
  if (!(is >> v[0] >> c1 >> v[1] >> c2 >> v[2] >> c3 >> v[3]) || c1 != ',' || c2 != ',' || c3 != ',')
    return false;
  std::string rest;
  if (is >> rest) return false;
  for (int64_t x : v)
    if (x <= 0) return false;
  *out = NamedShape{"B" + std::to_string(v[0]) + " H" + std::to_string(v[1]) + " T" +
                        std::to_string(v[2]) + " D" + std::to_string(v[3]),
                    v[0], v[1], v[2], v[3]};
  return true;
}

int RunAttention(int argc, char** argv) {
  AttnOptions o;
  bool no_check = false;
  po::options_description desc("strata-bench attention: flash attention kernels (every variant) vs the GEMM rate");
  AddCommonOptions(desc, o.common);
  desc.add_options()(
      "shape", po::value(&o.shapes)->value_name("B,H,T,D"),
      "a shape to time (repeatable; default GPT 1.3B 8,16,2048,128 and GPT 6.7B 4,32,2048,128)")(
      "variants", po::value(&o.variants)->value_name("A,B,..."), "variants to time (default all)")(
      "dtype", po::value(&o.dtype)->default_value("bf16"), "bf16 or f16")(
      "reps", po::value(&o.reps)->default_value(10), "calls per trial")(
      "trials", po::value(&o.trials)->default_value(5), "trials (the median is reported)")(
      "warmup", po::value(&o.warmup)->default_value(2), "untimed calls first")(
      "peak-size", po::value(&o.peak_size)->default_value(8192), "n of the n^3 GEMM baseline")(
      "no-check", po::bool_switch(&no_check), "skip comparing each variant's outputs with the first's");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  o.check = !no_check;
  // Every value in its range (bench/args.h).
  CheckIntArg("--reps", o.reps, 1, 1000000);
  CheckIntArg("--trials", o.trials, 1, 1000);
  CheckIntArg("--warmup", o.warmup, 0, 1000000);
  CheckIntArg("--peak-size", o.peak_size, 16, 65536);
  DType dt;
  if (o.dtype == "bf16") {
    dt = DType::kBF16;
  } else if (o.dtype == "f16") {
    dt = DType::kF16;
  } else {
    std::cerr << "strata-bench attention: --dtype must be bf16 or f16, not '" << o.dtype << "'\n";
    return 2;
  }
  std::vector<NamedShape> shapes;
  for (const std::string& s : o.shapes) {
    NamedShape ns;
    if (!ParseShape(s, &ns)) {
      std::cerr << "strata-bench attention: --shape '" << s << "': expected B,H,T,D (positive integers)\n";
      return 2;
    }
    CheckIntArg("--shape B", ns.B, 1, 1 << 16);
    CheckIntArg("--shape H", ns.H, 1, 1 << 12);
    CheckIntArg("--shape T", ns.T, 1, 1 << 20);
    CheckIntArg("--shape D", ns.D, 1, 1024);
    shapes.push_back(ns);
  }
  if (shapes.empty())
    shapes = {{"GPT 1.3B (B8 H16 T2048 D128)", 8, 16, 2048, 128},
              {"GPT 6.7B (B4 H32 T2048 D128)", 4, 32, 2048, 128}};
  std::vector<std::string> variants;
  if (o.variants.empty()) {
    for (const auto& v : kernels::kFlashVariants) variants.push_back(v.name);
  } else {
    std::istringstream is(o.variants);
    for (std::string v; std::getline(is, v, ',');) {
      if (!kernels::FindFlashVariant(v)) {
        std::cerr << "strata-bench attention: unknown variant '" << v << "'; known:";
        for (const auto& k : kernels::kFlashVariants) std::cerr << " " << k.name;
        std::cerr << "\n";
        return 2;
      }
      variants.push_back(v);
    }
  }

  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    std::cout << "strata-bench attention: no usable GPU (" << why
              << "); the flash attention kernels need one. Nothing measured.\n";
    return 0;
  }
  if (auto g = QueryGpu(0); g.ok()) {
    // Variants this GPU and build cannot run (the wgmma kernels off Hopper) are left out, said once.
    std::vector<std::string> runs;
    for (const std::string& v : variants) {
      if (kernels::FlashVariantRuns(*kernels::FindFlashVariant(v), g->cc_major, g->cc_minor))
        runs.push_back(v);
      else
        std::cout << "strata-bench attention: variant " << v << " does not run on " << g->name << " (compute "
                  << g->cc_major << "." << g->cc_minor << ") with this build; left out\n";
    }
    variants = std::move(runs);
  }
  if (variants.empty()) {
    std::cout << "strata-bench attention: no variant to measure on this GPU.\n";
    return 0;
  }
  kernels::CudaBackendOptions co;
  co.attention = kernels::AttentionImpl::kFlash;
  co.flash_variant = variants[0];
  auto be_r = kernels::MakeCudaBackend(co);
  if (!be_r.ok()) {
    std::cout << "strata-bench attention: the CUDA backend is not usable: " << be_r.status().ToString()
              << ". Nothing measured.\n";
    return 0;
  }
  std::unique_ptr<Backend> be = std::move(be_r).value();

  const double peak = BENCH_VALUE(MeasureGemmPeak(be.get(), o.peak_size, dt));
  std::cout << "strata-bench attention on " << be->name() << "\npeak: " << o.dtype << " GEMM "
            << o.peak_size << "^3 through the backend: " << peak << " TFLOP/s\n";

  Report rep("attention");
  rep.meta() = {{"backend", be->name()}, {"dtype", o.dtype}, {"peak_tflops", peak},
                {"peak_size", o.peak_size}, {"reps", o.reps}, {"trials", o.trials}};
  const std::string base_name = o.dtype + " GEMM " + std::to_string(o.peak_size) + "^3 (this run)";

  Progress progress("attention", shapes.size() * variants.size());
  for (const NamedShape& sh : shapes) {
    if (StopRequested()) break;
    AttentionShape s{sh.B, sh.T, sh.H, sh.D, dt, 0.f};
    const int64_t C = sh.H * sh.D;
    const size_t n_qkv = static_cast<size_t>(sh.B * sh.T * 3 * C), n_out = static_cast<size_t>(sh.B * sh.T * C);
    size_t ws_bytes = 0;
    for (const std::string& v : variants) {
      BENCH_CHECK_OK(kernels::SetFlashVariant(be.get(), v));
      ws_bytes = std::max(ws_bytes, be->AttentionWorkspaceBytes(s));
    }
    auto qkv = BENCH_VALUE(be->Allocate(n_qkv * 2));
    auto dout = BENCH_VALUE(be->Allocate(n_out * 2));
    auto out = BENCH_VALUE(be->Allocate(n_out * 2));
    auto dqkv = BENCH_VALUE(be->Allocate(n_qkv * 2));
    auto lse = BENCH_VALUE(be->Allocate(static_cast<size_t>(sh.B * sh.H * sh.T) * 4));
    auto ws = BENCH_VALUE(be->Allocate(std::max<size_t>(ws_bytes, 16)));
    BENCH_CHECK_OK(Fill(be.get(), qkv, n_qkv, 11, -2.f, 2.f, dt));
    BENCH_CHECK_OK(Fill(be.get(), dout, n_out, 12, -1.f, 1.f, dt));
    const double fwd_flops = 2.0 * sh.B * sh.H * static_cast<double>(sh.T) * sh.T * sh.D;
    const double bwd_flops = 2.5 * fwd_flops;
    std::vector<float> ref_out, ref_dqkv;
    std::cout << "\n" << sh.name << ": forward " << fwd_flops / 1e9 << " GFLOP, backward "
              << bwd_flops / 1e9 << " GFLOP (causal, model count); workspace up to "
              << ws_bytes / 1048576.0 << " MiB\n";
    for (const std::string& v : variants) {
      if (StopRequested()) break;
      progress.Next(sh.name + " " + v);
      BENCH_CHECK_OK(kernels::SetFlashVariant(be.get(), v));
      auto fwd = [&] {
        return be->AttentionForward(s, out.data(), lse.as<float>(), qkv.data(), ws.data());
      };
      auto bwd = [&] {
        return be->AttentionBackward(s, dqkv.data(), dout.data(), qkv.data(), out.data(),
                                     lse.as<float>(), ws.data());
      };
      const double t_fwd = BENCH_VALUE(TimeCalls(be.get(), o, fwd));
      BENCH_CHECK_OK(fwd());  // out, lse of this variant feed its backward
      const double t_bwd = BENCH_VALUE(TimeCalls(be.get(), o, bwd));
      double err_out = 0, err_dqkv = 0;
      if (o.check) {
        BENCH_CHECK_OK(fwd());
        BENCH_CHECK_OK(bwd());
        BENCH_CHECK_OK(be->Synchronize());
        std::vector<float> ho = BENCH_VALUE(ToHost(be.get(), out, n_out, dt));
        std::vector<float> hd = BENCH_VALUE(ToHost(be.get(), dqkv, n_qkv, dt));
        if (ref_out.empty()) {
          ref_out = std::move(ho);
          ref_dqkv = std::move(hd);
        } else {
          err_out = RelErr(ho, ref_out);
          err_dqkv = RelErr(hd, ref_dqkv);
        }
      }
      for (int pass = 0; pass < 2; ++pass) {
        const double t = pass == 0 ? t_fwd : t_bwd;
        const double tf = (pass == 0 ? fwd_flops : bwd_flops) / t / 1e12;
        nlohmann::json row = {{"shape", sh.name},
                              {"variant", v},
                              {"pass", pass == 0 ? "fwd" : "bwd"},
                              {"ms", t * 1e3},
                              {"unit", "TFLOP/s"},
                              {"baseline_name", base_name}};
        if (o.check) row["relerr_vs_" + variants[0]] = pass == 0 ? err_out : err_dqkv;
        rep.Add(Report::WithRatio(row, tf, peak));
      }
    }
  }
  rep.Note("TFLOP/s = causal model FLOPs / time: fwd 2*B*H*T^2*D (2 matmuls, half the square), "
           "bwd 2.5 x fwd (5 matmuls; the two-pass backward executes 7 and is credited with 5)");
  rep.Note("ratio = attention TFLOP/s / the bf16 GEMM rate measured above; relerr = ||x - x_" +
           variants[0] + "|| / ||x_" + variants[0] + "|| over out (fwd) and dqkv (bwd)");
  std::string vs = "variants:";
  for (const auto& v : kernels::kFlashVariants) vs += std::string(" ") + v.name + " = " + v.summary + ";";
  rep.Note(vs);
  if (StopRequested()) rep.Note("stopped by Ctrl-C: the variants measured so far");
  rep.Print();
  BENCH_CHECK_OK(rep.WriteJson(o.common.json_path));
  return StopRequested() ? kStoppedExit : 0;
}

}  // namespace

STRATA_BENCH_COMMAND("attention", "flash attention fwd/bwd TFLOP/s per kernel variant vs the GEMM rate",
                     RunAttention);

}  // namespace strata::bench
