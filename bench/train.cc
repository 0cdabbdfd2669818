// SPDX-License-Identifier: Apache-2.0
// strata-bench train: training-step throughput of the GPT model.
//
// Workloads (pick one; each is a function in kWorkloads below):
//   --resident   the whole model in GPU memory: parameters, gradients and one
//                checkpoint per layer (its input), backward recomputing each
//                layer from its checkpoint (models/resident_model.h). Default
//                shape: GPT 1.3B — 24 layers, d 2048, 16 heads, seq 2048,
//                micro-batch 8, vocabulary 50257 (padded to 50304), bf16.
//   --workload NAME  the offload trainer on a named workload (gpt-6.7b,
//                gpt-1.3b-offload, gpt-1.3b-nvme): bench/train_offload.cc.
//
// Figures, each beside its baseline:
//   peak         a bf16 GEMM of --peak-size^3 (8192) on random data through
//                the backend's GEMM, measured in this run; the ceiling for MFU.
//   tokens/s     B*T / median step time (forward + backward, no optimizer);
//                baseline: the tokens/s the step's model FLOPs would allow at
//                the measured peak, so the ratio is the MFU
//                  MFU = (6 N tokens + 12 L d seq tokens) / time / peak.
//   per op       one profiled step with CUDA events around every op: time per
//                op and its share of the step; GEMMs and attention also in
//                TFLOP/s against the peak.
//
// Flags: --layers --d --heads --seq --batch --vocab pick another shape;
// --steps (timed steps), --warmup; --dtype, --grad-dtype; --attention
// auto|flash|simple; --recompute-last (recompute the last block too, as a
// checkpoint of every block would; by default its forward's internals are
// kept for its backward); --no-profile; --backend cuda|cpu (cpu: a smoke test on
// the CPU backend with a tiny default shape, never a performance figure);
// --peers [--peer-list LIST]: after strata's figure, PyTorch and DeepSpeed
// on the same shape in the same run, each beside strata (bench/peers.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/device.h"
#include "base/half.h"
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/peers.h"
#include "bench/train_offload.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/gpt2.h"
#include "models/resident_model.h"

namespace po = boost::program_options;

namespace strata::bench {
namespace {

using kernels::Backend;
using kernels::GemmArgs;
using models::GptConfig;
using models::ResidentModel;

struct TrainOptions {
  CommonOptions common;
  bool resident = false;
  std::string backend = "cuda";
  int64_t layers = 0, d = 0, heads = 0, seq = 0, batch = 0, vocab = 0;  // 0: workload default
  int steps = 10, warmup = 3;
  std::string dtype = "bf16", grad_dtype = "bf16", attention = "auto";
  int64_t peak_size = 0;  // 0: 8192 on CUDA, 1024 on the CPU
  bool profile = true;
  bool recompute_last = false;
  bool peers = false;     // --peers
  std::string peer_list;  // --peer-list (empty: the script's default)
  uint64_t seed = 1234;
};

// ---- peak: a big GEMM on random data ---------------------------------------------------

// Median TFLOP/s of an n x n x n GEMM in `dt` (f32 accumulate, C in dt).
Result<double> MeasureGemmPeak(Backend* be, int64_t n, DType dt) {
  const size_t es = DTypeSize(dt), bytes = static_cast<size_t>(n * n) * es;
  ASSIGN_OR_RETURN(kernels::DeviceBuffer a, be->Allocate(bytes));
  ASSIGN_OR_RETURN(kernels::DeviceBuffer b, be->Allocate(bytes));
  ASSIGN_OR_RETURN(kernels::DeviceBuffer c, be->Allocate(bytes));
  // Random data in [-1, 1) (never zeros: they can run faster than real data).
  auto fill = [&](kernels::DeviceBuffer& buf, uint64_t seed) -> Status {
    std::vector<uint8_t> host(bytes);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < host.size() / es; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const float f = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) / (1 << 23);
      if (dt == DType::kF32) {
        std::memcpy(&host[4 * i], &f, 4);
      } else {
        const uint16_t h = dt == DType::kBF16 ? FloatToBF16(f) : FloatToHalf(f);
        std::memcpy(&host[2 * i], &h, 2);
      }
    }
    return be->CopyToDevice(buf.data(), host.data(), bytes);
  };
  RETURN_IF_ERROR(fill(a, 1));
  RETURN_IF_ERROR(fill(b, 2));
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data(), g.b = b.data(), g.c = c.data();
  g.lda = g.ldb = g.ldc = n;
  g.ab_dtype = g.c_dtype = dt;
  const int reps = be->kind() == kernels::BackendKind::kCuda ? 10 : 1;
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(be->Gemm(g));  // warm-up: plan, clocks
  RETURN_IF_ERROR(be->Synchronize());
  std::vector<double> rates;
  for (int trial = 0; trial < 5; ++trial) {
    const double t0 = NowSeconds();
    for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(be->Gemm(g));
    RETURN_IF_ERROR(be->Synchronize());
    const double dt_s = NowSeconds() - t0;
    rates.push_back(2.0 * n * n * n * reps / dt_s / 1e12);
  }
  return Median(rates);
}

// ---- the resident workload -------------------------------------------------------------

int RunResident(const TrainOptions& o) {
  const bool cpu = o.backend == "cpu";
  std::unique_ptr<Backend> be;
  if (cpu) {
    be = kernels::MakeCpuBackend(0);
  } else if (o.backend == "cuda") {
    kernels::CudaBackendOptions co;
    co.attention = o.attention == "flash"    ? kernels::AttentionImpl::kFlash
                   : o.attention == "simple" ? kernels::AttentionImpl::kSimple
                                             : kernels::AttentionImpl::kAuto;
    auto r = kernels::MakeCudaBackend(co);
    if (!r.ok()) {
      std::cerr << "strata-bench train --resident: needs a CUDA GPU, and none is usable: "
                << r.status().ToString()
                << "\n  (--backend cpu runs a tiny model on the CPU backend as a smoke test.)\n";
      return 1;
    }
    be = std::move(r).value();
  } else {
    std::cerr << "strata-bench train: --backend must be cuda or cpu, not '" << o.backend << "'\n";
    return 2;
  }
  auto dtype = ParseDType(o.dtype), grad_dtype = ParseDType(o.grad_dtype);
  if (!dtype || !grad_dtype) {
    std::cerr << "strata-bench train: unknown --dtype or --grad-dtype\n";
    return 2;
  }
  if (o.attention != "auto" && o.attention != "flash" && o.attention != "simple") {
    std::cerr << "strata-bench train: --attention must be auto, flash or simple\n";
    return 2;
  }

  // Shape: GPT 1.3B on CUDA, a tiny model on the CPU, each flag overriding.
  auto pick = [](int64_t v, int64_t def) { return v > 0 ? v : def; };
  GptConfig cfg;
  cfg.n_layer = pick(o.layers, cpu ? 2 : 24);
  cfg.n_embd = pick(o.d, cpu ? 128 : 2048);
  cfg.n_head = pick(o.heads, cpu ? 4 : 16);
  cfg.vocab_size = pick(o.vocab, cpu ? 1000 : 50257);
  cfg.seq_len = pick(o.seq, cpu ? 64 : 2048);
  const int64_t B = pick(o.batch, cpu ? 2 : 8), T = cfg.seq_len;
  BENCH_CHECK_OK(cfg.Validate());

  std::cout << "strata-bench train --resident on " << be->name()
            << (cpu ? "  [CPU backend: a smoke test, not a performance figure]" : "") << "\n"
            << "model: " << cfg.n_layer << " layers, d " << cfg.n_embd << ", " << cfg.n_head
            << " heads, vocab " << cfg.vocab_size << " (padded " << cfg.Vp() << "), seq " << T
            << ", micro-batch " << B << ", " << o.dtype << " (grads " << o.grad_dtype
            << "), per-layer recompute" << (o.recompute_last ? "" : " (the last block's internals kept)") << "\n";

  const int64_t peak_n = pick(o.peak_size, cpu ? 1024 : 8192);
  const double peak = BENCH_VALUE(MeasureGemmPeak(be.get(), peak_n, *dtype));
  std::cout << "peak: " << o.dtype << " GEMM " << peak_n << "^3: " << peak << " TFLOP/s\n";

  ResidentModel::Options mo;
  mo.dtype = *dtype;
  mo.grad_dtype = *grad_dtype;
  mo.batch = B;
  mo.seq = T;
  mo.keep_last_block = !o.recompute_last;
  const models::ModelSpec spec = BENCH_VALUE(models::Gpt2Spec(cfg));
  auto model = BENCH_VALUE(ResidentModel::Create(be.get(), spec, mo));
  BENCH_CHECK_OK(model->InitRandom(o.seed));
  std::vector<int32_t> tokens(B * T), targets(B * T);
  std::mt19937_64 rng(o.seed);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (int64_t i = 0; i < B * T; ++i)
    targets[i] = (i % T == T - 1) ? -1 : tokens[i + 1];  // next token; none after the last

  double loss = 0;
  for (int i = 0; i < o.warmup; ++i) loss = BENCH_VALUE(model->ForwardBackward(tokens.data(), targets.data()));
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    const double t0 = NowSeconds();
    loss = BENCH_VALUE(model->ForwardBackward(tokens.data(), targets.data()));
    times.push_back(NowSeconds() - t0);
  }
  const double step_s = Median(times);
  const double tokens_per_step = static_cast<double>(B * T);
  const double N = static_cast<double>(cfg.NumParameters());
  const double flops_per_step =
      6.0 * N * tokens_per_step +
      12.0 * cfg.n_layer * cfg.n_embd * static_cast<double>(T) * tokens_per_step;
  const double tok_s = tokens_per_step / step_s;
  const double roof_tok_s = peak * 1e12 / (flops_per_step / tokens_per_step);
  const double mfu = flops_per_step / step_s / (peak * 1e12);

  Report rep("train --resident");
  rep.meta() = {{"backend", be->name()},
                {"layers", cfg.n_layer},
                {"d", cfg.n_embd},
                {"heads", cfg.n_head},
                {"vocab", cfg.vocab_size},
                {"seq", T},
                {"batch", B},
                {"dtype", o.dtype},
                {"grad_dtype", o.grad_dtype},
                {"attention", o.attention},
                {"recompute", o.recompute_last ? "every block" : "every block but the last"},
                {"parameters", N},
                {"steps", o.steps},
                {"step_times_s", times},
                {"final_loss", loss}};
  rep.Add({{"figure", "GEMM peak"}, {"unit", "TFLOP/s"}, {"value", peak}, {"baseline_name", "(the baseline of the rows below)"}});
  rep.Add(Report::WithRatio({{"figure", "step (fwd+bwd)"}, {"unit", "ms"},
                             {"baseline_name", "model FLOPs at the peak"}},
                            step_s * 1e3, flops_per_step / (peak * 1e12) * 1e3));
  rep.Add(Report::WithRatio({{"figure", "tokens/s"}, {"unit", "tok/s"},
                             {"baseline_name", "model FLOPs at the peak (ratio = MFU)"}},
                            tok_s, roof_tok_s));
  rep.Note("MFU = (6*N*tokens + 12*L*d*seq*tokens) / time / peak = " +
           std::to_string(100.0 * mfu) + " %  (N = " + std::to_string(static_cast<int64_t>(N)) +
           " parameters, " + std::to_string(static_cast<int64_t>(tokens_per_step)) +
           " tokens per step, median of " + std::to_string(o.steps) + " steps; loss " +
           std::to_string(loss) + ")");
  if (mfu > 1)
    rep.Note("warning: MFU above 100% means the GEMM baseline (" + std::to_string(peak) +
             " TFLOP/s) was measured below what the step reached: the machine was busier while the baseline ran "
             "than during the steps, or --peak-size " + std::to_string(peak_n) +
             " is too small to reach the peak; the MFU figure is not meaningful");
  rep.Print();

  if (o.profile && !cpu) {
    BENCH_CHECK_OK(kernels::SetOpTiming(be.get(), true));
    const double t0 = NowSeconds();
    BENCH_VALUE(model->ForwardBackward(tokens.data(), targets.data()));
    const double prof_s = NowSeconds() - t0;
    BENCH_CHECK_OK(kernels::SetOpTiming(be.get(), false));
    auto ops = BENCH_VALUE(kernels::TakeOpTimings(be.get()));
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
    double sum_ms = 0;
    std::map<std::string, double> by_class;
    for (const auto& op : ops) {
      sum_ms += op.ms;
      by_class[op.op.rfind("gemm", 0) == 0 ? std::string("gemm (all shapes)") : op.op] += op.ms;
    }
    Report ops_rep("train --resident: ops of one profiled step");
    for (const auto& op : ops) {
      nlohmann::json row = {{"op", op.op}, {"calls", op.calls}, {"ms", op.ms},
                            {"share %", 100.0 * op.ms / sum_ms}};
      if (op.flops > 0) {
        row = Report::WithRatio(row, op.flops / (op.ms * 1e-3) / 1e12, peak);
        row["unit"] = "TFLOP/s";
        row["baseline_name"] = "GEMM peak";
      }
      ops_rep.Add(row);
    }
    ops_rep.Note("sum of op times " + std::to_string(sum_ms) + " ms; the profiled step took " +
                 std::to_string(prof_s * 1e3) + " ms wall (events add a little), the timed steps " +
                 std::to_string(step_s * 1e3) + " ms; the difference is launch gaps and host work");
    std::string classes = "by class:";
    for (const auto& [name, ms] : by_class)
      classes += " " + name + " " + std::to_string(static_cast<int>(std::lround(100.0 * ms / sum_ms))) + "%;";
    ops_rep.Note(classes);
    ops_rep.Print();
    nlohmann::json op_rows = nlohmann::json::array();
    for (const auto& op : ops)
      op_rows.push_back({{"op", op.op}, {"calls", op.calls}, {"ms", op.ms}, {"flops", op.flops}});
    rep.meta()["ops"] = op_rows;
  }
  if (o.peers) {
    // strata's model and backend go first: the peers have the GPU to themselves.
    model.reset();
    be.reset();
    PeerRun pr;
    pr.layers = cfg.n_layer, pr.d = cfg.n_embd, pr.heads = cfg.n_head, pr.seq = T, pr.vocab = cfg.vocab_size;
    pr.batch = B;
    pr.checkpoint = o.recompute_last ? "all" : "all-but-last";
    pr.dtype = o.dtype;
    pr.steps = o.steps, pr.warmup = o.warmup;
    pr.cpu = cpu;
    pr.peers = o.peer_list;
    RunPeers(pr, tok_s, rep);
  }
  BENCH_CHECK_OK(rep.WriteJson(o.common.json_path));
  return 0;
}

// ---- registry ------------------------------------------------------------------------------

struct Workload {
  const char* flag;
  const char* summary;
  int (*run)(const TrainOptions&);
};
const Workload kWorkloads[] = {
    {"resident", "the whole model on the GPU, per-layer recompute (default GPT 1.3B)", RunResident},
};

// `flag` is on the command line (as "--flag V" or "--flag=V").
bool Given(int argc, char** argv, const char* flag) {
  const size_t n = std::strlen(flag);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], flag, n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '=')) return true;
  return false;
}
bool vm_backend_given(int argc, char** argv) { return Given(argc, argv, "--backend"); }
bool vm_steps_given(int argc, char** argv) { return Given(argc, argv, "--steps"); }
bool vm_warmup_given(int argc, char** argv) { return Given(argc, argv, "--warmup"); }

int RunTrain(int argc, char** argv) {
  TrainOptions o;
  bool no_profile = false;
  std::string workload, gpu_limit, host_limit, nvme_checksum, trace;
  int64_t accum = 0, piece_params = 0;
  double ratio = 1.0, clip = 1.0;
  po::options_description desc("strata-bench train: training-step throughput");
  AddCommonOptions(desc, o.common);
  desc.add_options()("resident", po::bool_switch(&o.resident), kWorkloads[0].summary)(
      "workload", po::value(&workload)->value_name("NAME"),
      "the offload trainer on a named workload: gpt-6.7b, gpt-1.3b-offload, gpt-1.3b-nvme, llama-8b")(
      "gpu-memory-limit", po::value(&gpu_limit)->value_name("SIZE"), "--workload: override its GPU limit")(
      "host-memory-limit", po::value(&host_limit)->value_name("SIZE"), "--workload: override its host limit")(
      "accum", po::value(&accum), "--workload: gradient accumulation steps (default: the workload's)")(
      "optimizer-ratio", po::value(&ratio)->default_value(1.0),
      "--workload: zero_optimization.offload_optimizer.ratio (the share of the optimizer state offloaded)")(
      "piece-params", po::value(&piece_params)->value_name("N"),
      "--workload: the CPU worker's pipelining piece, in parameters (default 8388608): each piece's gradient "
      "comes down, is updated and goes up as a unit")(
      "clip", po::value(&clip)->default_value(1.0),
      "--workload: gradient_clipping (0: none, and then the optimizer update runs during the backward)")(
      "nvme-checksum", po::value(&nvme_checksum)->value_name("KIND"),
      "--workload with NVMe: trainer.nvme_checksum, crc32c (the default), xxh64 or none")(
      "trace", po::value(&trace)->value_name("FILE"),
      "--workload: the offloaded run's timeline as Chrome trace-event JSON (open it in ui.perfetto.dev)")(
      "backend", po::value(&o.backend)->default_value("cuda"), "cuda, or cpu (a smoke test)")(
      "layers", po::value(&o.layers), "transformer blocks (default 24)")(
      "d", po::value(&o.d), "model width (default 2048)")(
      "heads", po::value(&o.heads), "attention heads (default 16)")(
      "seq", po::value(&o.seq), "tokens per sequence (default 2048)")(
      "batch", po::value(&o.batch), "sequences per micro-batch (default 8)")(
      "vocab", po::value(&o.vocab), "vocabulary (default 50257, padded to a multiple of 128)")(
      "steps", po::value(&o.steps)->default_value(10), "timed steps (the median is reported)")(
      "warmup", po::value(&o.warmup)->default_value(3), "untimed steps first")(
      "dtype", po::value(&o.dtype)->default_value("bf16"), "parameters and activations")(
      "grad-dtype", po::value(&o.grad_dtype)->default_value("bf16"), "gradients (bf16 or f32)")(
      "attention", po::value(&o.attention)->default_value("auto"), "auto, flash or simple")(
      "peak-size", po::value(&o.peak_size), "n of the n^3 GEMM measuring the peak (default 8192)")(
      "recompute-last", po::bool_switch(&o.recompute_last),
      "recompute the last block in backward too (default: its forward's internals are kept)")(
      "no-profile", po::bool_switch(&no_profile), "skip the per-op profiled step")(
      "peers", po::bool_switch(&o.peers),
      "after strata's figure, what a user would run instead on the same shape (bench/peers/train_peers.py, under "
      "$STRATA_TORCH_PYTHON or python3 with torch), each peer's tokens/s beside strata's with the ratio")(
      "peer-list", po::value(&o.peer_list)->value_name("LIST"),
      "with --peers: the peers to run (default all; eager with --backend cpu): eager, compile, fsdp2-offload, "
      "deepspeed-zero3-offload, deepspeed-zero2-offload");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  o.profile = !no_profile;
  // Every value given in its range (bench/args.h): 0 is the options' own
  // "the workload's default", never a value a user gives.
  CheckIntArg("--steps", o.steps, 1, 1000000);
  CheckIntArg("--warmup", o.warmup, 0, 1000000);
  const struct {
    const char* flag;
    int64_t value, lo, hi;
  } dims[] = {{"--layers", o.layers, 1, 10000},  {"--d", o.d, 1, 1 << 16},         {"--heads", o.heads, 1, 1024},
              {"--seq", o.seq, 1, 1 << 20},      {"--batch", o.batch, 1, 1 << 16}, {"--vocab", o.vocab, 2, 1 << 24},
              {"--peak-size", o.peak_size, 256, 65536}, {"--accum", accum, 1, 1 << 16},
              {"--piece-params", piece_params, 64, int64_t{1} << 34}};
  for (const auto& d : dims)
    if (Given(argc, argv, d.flag)) CheckIntArg(d.flag, d.value, d.lo, d.hi);
  CheckRealArg("--optimizer-ratio", ratio, 0, 1);
  CheckRealArg("--clip", clip, 0, 1e30);
  if (o.resident && !workload.empty()) RefuseArgument("--resident and --workload exclude each other");
  if (Given(argc, argv, "--peer-list") && !o.peers) RefuseArgument("--peer-list applies with --peers only");
  if (o.peers && Given(argc, argv, "--peer-list")) CheckPeerList(o.peer_list);
  if (workload.empty())
    for (const char* f :
         {"--gpu-memory-limit", "--host-memory-limit", "--accum", "--optimizer-ratio", "--piece-params", "--clip",
          "--nvme-checksum", "--trace"})
      if (Given(argc, argv, f)) RefuseArgument(std::string(f) + " applies to --workload runs only");
  if (!workload.empty()) {
    OffloadBenchOptions w;
    w.common = o.common;
    w.workload = workload;
    w.backend = o.backend == "cuda" && !vm_backend_given(argc, argv) ? "auto" : o.backend;
    w.steps = vm_steps_given(argc, argv) ? o.steps : 4;
    w.warmup = vm_warmup_given(argc, argv) ? o.warmup : 1;
    w.gpu_limit = gpu_limit;
    w.host_limit = host_limit;
    w.layers = o.layers, w.d = o.d, w.heads = o.heads, w.seq = o.seq, w.batch = o.batch, w.vocab = o.vocab;
    w.accum = accum;
    w.optimizer_ratio = ratio;
    w.piece_params = piece_params;
    w.clip = clip;
    w.nvme_checksum = nvme_checksum;
    w.trace = trace;
    w.peers = o.peers;
    w.peer_list = o.peer_list;
    return RunOffloadWorkload(w);
  }
  if (o.resident) return RunResident(o);
  std::cerr << "strata-bench train: pick a workload:";
  for (const auto& w : kWorkloads) std::cerr << "\n  --" << w.flag << "  " << w.summary;
  std::cerr << "\n";
  return 2;
}

}  // namespace

STRATA_BENCH_COMMAND("train", "training-step throughput: --resident, or --workload gpt-6.7b|gpt-1.3b-offload|gpt-1.3b-nvme|llama-8b",
                     RunTrain);

}  // namespace strata::bench
