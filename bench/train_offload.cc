// SPDX-License-Identifier: Apache-2.0
// strata-bench train --workload NAME: the offload trainer on a named workload.
//
// Workloads (docs/benchmarks.md has the figures measured so far):
//   gpt-6.7b          32 layers, d 4096, 32 heads, seq 2048, vocab 50304,
//                     micro-batch 4, accumulation 8, bf16, GPU limit 24 GiB,
//                     optimizer state on the host. Figure: MFU against the
//                     bf16 GEMM rate measured in the same run; target >= 45%.
//   gpt-1.3b-offload  24 layers, d 2048, 16 heads, seq 2048, micro-batch 8,
//                     bf16, GPU limit 8 GiB, optimizer state on the host.
//                     Baseline: the same trainer all-resident (no limit,
//                     GPU Adam), measured first in the same run; target
//                     >= 95% of its tokens/s.
//   llama-8b          the Llama-3-8B shape: 32 layers, d 4096, 32 heads, 8
//                     key/value heads, SwiGLU FFN 14336, vocab 128256,
//                     untied head, rope_theta 500000; seq 4096, micro-batch
//                     2, accumulation 8, bf16, GPU limit 24 GiB, optimizer
//                     state on the host within 110 GiB, its Adam moments in
//                     bf16 (bf16.bf16_optimizer_states). Figure: MFU
//                     against the GEMM rate measured in the same run;
//                     target >= 50%. Why bf16 moments: fp32 master/m/v of
//                     8.03B parameters are 96 GB, and with the bf16
//                     gradients and the streamed bf16 parameters on the
//                     host too the plan needs 128 GiB of host memory; bf16
//                     m and v (8 bytes of state per parameter, 64 GB) bring
//                     it within the 110 GiB budget (docs/training.md has
//                     the fidelity cost measured).
//   gpt-1.3b-nvme     the 1.3B shape with optimizer state on NVMe (pipelined
//                     read/write), host limit 8 GiB. Baseline: a plain
//                     io_uring O_DIRECT loop (1 MiB I/Os, depth 32) writing,
//                     reading, and reading and writing at once (alternate
//                     64 MiB pieces) a file in the same directory in the
//                     same run; bound = the longest of read bytes / read
//                     GB/s, write bytes / write GB/s and all the bytes /
//                     mixed GB/s per step (the disk's limit when the
//                     pipeline overlaps its reads and writes), target step
//                     time <= 1.10 x bound; beside it, labelled, the old
//                     bound with reads then writes, their sum (<= 1.15 x).
//                     The swap files carry block checksums as a run's do
//                     (crc32c); --nvme-checksum none measures without them.
//
// Every workload trains with gradient_clipping 1.0 unless --clip says
// otherwise (--clip 0: no clipping, so the offloaded optimizer state is
// updated during the backward; the report's "optimizer update" line says
// which mode ran and why). With clipping and the state on the host the
// update is speculative (engine/trainer.h): a step after one whose global
// norm was within the threshold updates during the backward and commits, or
// redoes the update when its own norm is not. The report counts the timed
// steps that committed and missed and lists their norms. From a fresh
// initialization the norm stays above 1.0 for many steps (the 1.3B's is
// about 150), so a short run at --clip 1 speculates on none (the
// post-backward speed); a threshold the norm never reaches (--clip 1000
// there) commits every step after the first: the speed of a run whose norms
// are within its threshold. The report prints the norms to pick one by.
//
// Every workload prints the plan, tokens/s, MFU, GPU peak memory (the tier's
// accounting and cudaMemGetInfo of the whole process), the time split
// (forward, backward, optimizer, waiting) and bytes per link, medians over
// --steps timed steps after --warmup; --json writes them with the losses.
// With the optimizer state off the GPU, the step is also set against the
// host memory it needs: the CPU Adam pass's bytes plus every byte a copy
// or an NVMe transfer moves through host memory, at the rate the roof pass
// of strata-bench adam (the Adam's byte pattern, all threads) measures in
// the same run after the steps. The offloaded step shares that bandwidth
// between the update and the transfers: with every byte going through DRAM
// it cannot be shorter (a CPU's DDIO may keep some copy bytes in its cache).
#include "bench/train_offload.h"

#include <sys/stat.h>

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "base/bytes.h"
#include "base/clock.h"
#include "base/trace.h"
#include "bench/adam_shard.h"
#include "bench/args.h"
#include "bench/offload_bound.h"
#include "bench/peers.h"
#include "bench/raw_io.h"
#include "engine/trainer.h"
#include "tiers/nvme/checksum.h"

namespace strata::bench {

namespace {

#ifndef STRATA_DATA_DIR
#define STRATA_DATA_DIR "data"
#endif

std::string Fixed(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
std::string ThreeDigits(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

struct Spec {
  const char* name;
  int64_t layers, d, heads, seq, batch, accum;
  const char* gpu_limit;   // "" = the card's free memory
  const char* host_limit;  // "" = the default
  const char* optimizer_device;
  // The architecture (models/family.h) and its fields beyond GPT-2's.
  const char* arch = "gpt2";
  int64_t vocab = 50304, kv_heads = 0, ffn = 0;
  double rope_theta = 10000;
  double mfu_target = 0;  // percent; 0: no MFU target
  bool bf16_moments = false;  // bf16.bf16_optimizer_states
};

const Spec kSpecs[] = {
    {"gpt-6.7b", 32, 4096, 32, 2048, 4, 8, "24GiB", "110GiB", "cpu", "gpt2", 50304, 0, 0, 10000, 45.0},
    {"gpt-1.3b-offload", 24, 2048, 16, 2048, 8, 1, "8GiB", "", "cpu"},
    {"gpt-1.3b-nvme", 24, 2048, 16, 2048, 8, 1, "", "8GiB", "nvme"},
    {"llama-8b", 32, 4096, 32, 4096, 2, 8, "24GiB", "110GiB", "cpu", "llama", 128256, 8, 14336, 500000, 50.0, true},
};

struct Run {
  std::vector<StepReport> steps;
  TrainerInfo info;
  std::string plan;
  uint64_t cpu_adam_params = 0;  // parameters the CPU Adam updates each step (the plan's)
  StepReport median;
};

double MedianOf(const std::vector<StepReport>& v, double StepReport::*f) {
  std::vector<double> x;
  for (const auto& r : v) x.push_back(r.*f);
  return Median(x);
}

Result<Run> Train(const TrainOptions& t, int warmup, int steps) {
  std::ostringstream log;
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(t, log));
  Run run;
  run.plan = trainer->PlanTable();
  run.cpu_adam_params = trainer->plan().offloaded_optimizer_params();
  for (int i = 0; i < warmup + steps; ++i) {
    ASSIGN_OR_RETURN(StepReport r, trainer->Step());
    std::cerr << "  step " << r.step << ": loss " << r.loss << ", grad norm " << r.grad_norm << ", " << r.seconds
              << " s";
    if (r.speculation != Speculation::kNone) std::cerr << ", speculation " << SpeculationName(r.speculation);
    std::cerr << "\n";
    if (i >= warmup) run.steps.push_back(r);
  }
  run.info = trainer->Info();
  RETURN_IF_ERROR(trainer->FinishTrace());
  if (!t.trace_path.empty()) std::cerr << "trace: " << t.trace_path << " (open it in ui.perfetto.dev)\n";
  StepReport& m = run.median;
  m.seconds = MedianOf(run.steps, &StepReport::seconds);
  m.forward_s = MedianOf(run.steps, &StepReport::forward_s);
  m.backward_s = MedianOf(run.steps, &StepReport::backward_s);
  m.optimizer_s = MedianOf(run.steps, &StepReport::optimizer_s);
  m.wait_s = MedianOf(run.steps, &StepReport::wait_s);
  m.tokens = run.steps.empty() ? 0 : run.steps.back().tokens;
  for (const auto& r : run.steps) {
    m.h2d = std::max(m.h2d, r.h2d), m.d2h = std::max(m.d2h, r.d2h);
    m.nvme_read = std::max(m.nvme_read, r.nvme_read), m.nvme_write = std::max(m.nvme_write, r.nvme_write);
  }
  return run;
}

// Raw io_uring bandwidth of `dir`: write, read, then read the even 64 MiB
// pieces of a file of `bytes` while writing the odd ones (mixed: the rate of
// all the bytes moved, reads and writes in flight together).
struct RawBandwidth {
  double read_gbs = 0, write_gbs = 0, mixed_gbs = 0;
};
constexpr uint64_t kMixedPiece = 64ull << 20;
RawBandwidth MeasureRaw(const std::string& dir, uint64_t bytes) {
  std::string path = dir + "/strata-bench-raw.bin";
  {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) Die(ErrnoStatus("create", path), "raw baseline");
    // posix_fallocate returns the error (errno is left alone); a file it
    // could not fill (ENOSPC: the baseline wants `bytes` of free space) is
    // removed before the benchmark stops.
    if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
      ::close(fd);
      ::unlink(path.c_str());
      Die(IoError("fallocate " + FormatBytes(bytes), rc, path), "raw baseline");
    }
    ::close(fd);
  }
  AlignedBuffer buf(bytes);
  std::memset(buf.p, 0x5a, bytes);
  RawLoop raw(path, 32, buf.p, bytes, false);
  RawBandwidth b;
  b.write_gbs = bytes / raw.Run(true, buf.p, bytes, 1 << 20, 32) / 1e9;
  b.read_gbs = bytes / raw.Run(false, buf.p, bytes, 1 << 20, 32) / 1e9;
  b.mixed_gbs = bytes / raw.RunMixed(buf.p, bytes, 1 << 20, 32, kMixedPiece) / 1e9;
  ::unlink(path.c_str());
  return b;
}

// The step against the disk's bound at the mean of the raw rates before and
// after the steps: overlapped (the target) and the old sum, each labelled;
// the overlapped bound at the rates before the steps alone; the raw rates.
void AddNvmeBoundRows(const StepReport& m, const RawBandwidth& mean, const RawBandwidth& before,
                      const RawBandwidth& after, Report& rep) {
  auto bound = [&](const RawBandwidth& b) {
    return NvmeBoundOf(m.nvme_read, m.nvme_write, b.read_gbs, b.write_gbs, b.mixed_gbs);
  };
  const NvmeStepBound nb = bound(mean);
  rep.Add(Report::WithRatio(
      {{"figure", "step time vs NVMe bound, reads and writes overlapped"}, {"unit", "s"},
       {"baseline_name", "max(read B / read GB/s " + ThreeDigits(nb.read_s) + " s, write B / write GB/s " +
                             ThreeDigits(nb.write_s) + " s, (read + write B) / mixed GB/s " + ThreeDigits(nb.mixed_s) +
                             " s), raw io_uring (target ratio <= 1.10)"}},
      m.seconds, nb.overlapped_s()));
  rep.Add(Report::WithRatio({{"figure", "step time vs NVMe bound, reads then writes (sum)"}, {"unit", "s"},
                             {"baseline_name", "read B / read GB/s + write B / write GB/s, raw io_uring (the old "
                                               "bound; target ratio <= 1.15)"}},
                            m.seconds, nb.sum_s()));
  rep.Add(Report::WithRatio({{"figure", "step time vs NVMe bound, overlapped (raw before only)"}, {"unit", "s"},
                             {"baseline_name", "the same at the raw rates measured before the steps"}},
                            m.seconds, bound(before).overlapped_s()));
  for (const auto& [name, b] : {std::pair<const char*, RawBandwidth>{"before", before}, {"after", after}})
    rep.Add({{"figure", std::string("raw io_uring read / write / mixed, ") + name}, {"unit", "GB/s"},
             {"value", Fixed(b.read_gbs) + " / " + Fixed(b.write_gbs) + " / " + Fixed(b.mixed_gbs)}});
}

// The host memory's rate for the CPU Adam's bytes, measured in this run on
// all hardware threads: the roof pass (bench/adam_shard.h: the Adam pass's
// arrays and byte pattern, trivial arithmetic) over a shard of the
// trainer's dtypes, best of 5 passes. The shard holds the step's offloaded
// parameters, at least 16 Mi (over 400 MB: past the caches) and at most
// 64 Mi; none (0 GB/s) when that is more than 80% of the host memory
// available, so a run near the host's limit keeps its other figures.
volatile uint64_t g_roof_sink = 0;
double MeasureHostRoofGBs(const AdamDTypes& dt, uint64_t params) {
  const size_t n = static_cast<size_t>(std::clamp<uint64_t>(params, 16ull << 20, 64ull << 20));
  if (ShardBytes(n, dt, false) > AvailableHostBytes() / 10 * 8) return 0;
  optim::CpuAdam::Options o;  // every hardware thread
  std::unique_ptr<optim::CpuAdam> adam = BENCH_VALUE(optim::CpuAdam::Create(o));
  tbb::task_arena arena(tbb::info::default_concurrency());
  ShardBuffers shard = MakeShard(n, dt, false, HostHugePages::kAligned, 2ull << 20, arena, adam->tile_elems());
  const RoofKernel kernel = BestRoofKernel();
  double best = 1e30;
  uint64_t sink = 0;
  for (int r = 0; r < 5; ++r) {
    const double t0 = NowSeconds();
    sink ^= RoofPass(shard, *adam, kernel);
    best = std::min(best, NowSeconds() - t0);
  }
  g_roof_sink = g_roof_sink ^ sink;
  return static_cast<double>(n) * optim::AdamBytesPerParam(dt.grad, dt.state, dt.has_out, dt.out) / best / 1e9;
}

// The offloaded step against the host memory it needs: every byte the CPU
// Adam moves (its pass's bytes per parameter) and every byte a DMA or an
// NVMe transfer moves through host memory (HostMemoryBytes), at the roof
// rate measured in this run: a floor on the step when every byte goes
// through DRAM, however well the rest overlaps.
void AddHostMemoryRows(const Run& run, const Config& c, Report& rep) {
  if (run.cpu_adam_params == 0) return;
  const DType moments = c.bf16_optimizer_states ? DType::kBF16 : DType::kF32;
  const StepReport& m = run.median;
  const uint64_t total = HostMemoryBytes(run.cpu_adam_params, moments, m.h2d, m.d2h, m.nvme_read, m.nvme_write);
  const uint64_t links = HostMemoryBytes(0, moments, m.h2d, m.d2h, m.nvme_read, m.nvme_write);
  rep.Add({{"figure", "host memory per step: CPU Adam + H2D, D2H and NVMe"},
           {"value", FormatBytes(total) + " = " + FormatBytes(total - links) + " + " + FormatBytes(links)}});
  const double roof = MeasureHostRoofGBs({DType::kBF16, moments, true, DType::kBF16}, run.cpu_adam_params);
  if (roof <= 0) {
    rep.Note("host roof not measured: its shard needs more than 80% of the host memory available now");
    return;
  }
  rep.Add({{"figure", "host roof (the CPU Adam's byte pattern, all threads, after the steps)"}, {"unit", "GB/s"},
           {"value", roof}});
  rep.Add(Report::WithRatio(
      {{"figure", "step time vs host memory bound"}, {"unit", "s"},
       {"baseline_name", "host memory per step / host roof (a floor on the step when every byte goes through DRAM)"}},
      m.seconds, static_cast<double>(total) / (roof * 1e9)));
}

nlohmann::json RunJson(const Run& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm},
                     {"speculation", SpeculationName(s.speculation)}, {"seconds", s.seconds},
                     {"forward_s", s.forward_s},
                     {"backward_s", s.backward_s}, {"optimizer_s", s.optimizer_s}, {"wait_s", s.wait_s},
                     {"h2d", s.h2d}, {"d2h", s.d2h}, {"nvme_read", s.nvme_read}, {"nvme_write", s.nvme_write}});
  return {{"plan", r.plan},
          {"steps", steps},
          {"gpu_tier_peak", r.info.gpu_tier_peak},
          {"device_in_use", r.info.device_in_use},
          {"host_tier_peak", r.info.host_tier_peak},
          {"backend", r.info.backend},
          {"optimizer_update", r.info.optimizer_update},
          {"peak", r.info.peak_what}};
}

// The peers' run: the workload's shape and its whole step (the update too).
PeerRun PeersOf(const Config& c, const OffloadBenchOptions& o) {
  PeerRun p;
  p.layers = c.model.n_layer, p.d = c.model.n_embd, p.heads = c.model.n_head, p.seq = c.model.seq_len;
  p.vocab = c.model.vocab_size;
  p.batch = c.micro_batch, p.accum = c.grad_accum;
  p.train = true;
  p.clip = c.gradient_clipping;
  p.checkpoint = "all-but-last";  // the trainer keeps the last block's internals too
  p.dtype = "bf16";
  p.steps = o.steps, p.warmup = o.warmup;
  p.cpu = o.backend == "cpu";
  p.peers = o.peer_list;
  return p;
}

}  // namespace

const char* OffloadWorkloadList() { return "gpt-6.7b, gpt-1.3b-offload, gpt-1.3b-nvme, llama-8b"; }

int RunOffloadWorkload(const OffloadBenchOptions& o) {
  const Spec* spec = nullptr;
  for (const auto& s : kSpecs)
    if (o.workload == s.name) spec = &s;
  if (!spec) {
    std::cerr << "strata-bench train: unknown workload '" << o.workload << "' (known: " << OffloadWorkloadList()
              << ")\n";
    return 2;
  }
  auto pick = [](int64_t over, int64_t def) { return over > 0 ? over : def; };
  TrainOptions t;
  Config& c = t.config;
  c.model.n_layer = static_cast<int>(pick(o.layers, spec->layers));
  c.model.n_embd = static_cast<int>(pick(o.d, spec->d));
  c.model.n_head = static_cast<int>(pick(o.heads, spec->heads));
  c.model.seq_len = static_cast<int>(pick(o.seq, spec->seq));
  c.model.vocab_size = static_cast<int>(pick(o.vocab, spec->vocab));
  c.model.arch = spec->arch;
  c.model.n_kv_head = static_cast<int>(spec->kv_heads);
  c.model.intermediate_size = static_cast<int>(spec->ffn);
  c.model.rope_theta = spec->rope_theta;
  c.model.rms_norm_eps = 1e-5;
  c.model.tie_word_embeddings = false;
  c.micro_batch = pick(o.batch, spec->batch);
  c.grad_accum = pick(o.accum, spec->accum);
  c.train_batch_size = c.micro_batch * c.grad_accum;
  c.bf16 = true;
  c.bf16_optimizer_states = spec->bf16_moments;
  c.optimizer.lr = 1e-4;
  c.optimizer.beta2 = 0.95;
  c.optimizer.weight_decay = 0.1;
  c.gradient_clipping = o.clip;
  c.wall_clock_breakdown = true;
  c.scheduler.type = "WarmupLR";
  c.scheduler.params = {{"warmup_num_steps", 500}, {"warmup_type", "linear"}};
  t.default_data = std::string(STRATA_DATA_DIR) + "/kjv.txt";
  t.backend = o.backend;
  t.trace_path = o.trace;
  auto bytes = [](const std::string& text) -> uint64_t {
    return text.empty() ? 0 : BENCH_VALUE(ParseBytes(text));
  };
  t.gpu_memory_limit = bytes(o.gpu_limit.empty() ? spec->gpu_limit : o.gpu_limit);
  t.host_memory_limit = bytes(o.host_limit.empty() ? spec->host_limit : o.host_limit);
  c.zero.offload_optimizer.device = spec->optimizer_device;
  c.zero.offload_optimizer.ratio = o.optimizer_ratio;
  t.host_piece_params = static_cast<uint64_t>(o.piece_params);
  const bool nvme = std::string(spec->optimizer_device) == "nvme";
  if (!o.trace.empty()) {  // (before any baseline runs: the file must be writable)
    if (Status s = trace::CheckPath(o.trace); !s.ok())
      RefuseArgument("--trace " + o.trace + ": " + (s.sys_errno() ? std::strerror(s.sys_errno()) : s.ToString()));
  }
  if (!o.nvme_checksum.empty() && !nvme)
    RefuseArgument("--nvme-checksum applies to a workload with NVMe (" + o.workload + " has none)");
  if (!o.nvme_checksum.empty() && !ParseChecksumKind(o.nvme_checksum))
    RefuseArgument("--nvme-checksum " + o.nvme_checksum + ": not crc32c, xxh64 or none");
  std::optional<BenchDir> dir;
  if (nvme) {
    dir.emplace(BENCH_VALUE(BenchDir::Make(o.common.dir)));
    c.zero.offload_optimizer.nvme_path = dir->path();
    c.zero.offload_optimizer.pipeline_read = c.zero.offload_optimizer.pipeline_write = true;
    c.aio.queue_depth = 32;
    c.aio.intra_op_parallelism = 2;
    if (!o.nvme_checksum.empty()) c.trainer.nvme_checksum = o.nvme_checksum;
  }

  Report rep("train " + o.workload);
  std::cerr << "strata-bench train --workload " << o.workload << ": " << c.model.n_layer << " layers, d "
            << c.model.n_embd << " (" << c.model.arch << "), seq " << c.model.seq_len << ", micro-batch " << c.micro_batch << " x "
            << c.grad_accum << ", bf16" << (c.bf16_optimizer_states ? " (bf16 Adam moments)" : "")
            << (o.optimizer_ratio < 1 ? ", offload_optimizer.ratio " + Fixed(o.optimizer_ratio) : std::string())
            << (o.piece_params ? ", pieces of " + std::to_string(o.piece_params) + " parameters" : std::string())
            << ", gradient_clipping " << o.clip
            << (dir ? ", nvme_checksum " + c.trainer.nvme_checksum : std::string()) << "\n";

  // Baselines measured in this run.
  std::optional<Run> resident;
  RawBandwidth raw;
  if (o.workload == "gpt-1.3b-offload") {
    TrainOptions r = t;
    r.gpu_memory_limit = 0;
    r.config.zero.offload_optimizer.device = "none";
    r.config.zero.offload_optimizer.ratio = 1.0;
    r.trace_path.clear();  // (the trace is the offloaded run's)
    std::cerr << "baseline: the same model all-resident\n";
    resident = BENCH_VALUE(Train(r, o.warmup, o.steps));
  }
  // The virtio disk of the GPU machine swings +-30% from minute to minute
  // and may serve short bursts faster than a sustained stream, so the raw
  // loop moves a sustained volume (up to 4 GiB each way, 1 MiB blocks, depth 32)
  // right before and right after the training steps; the bound uses their
  // mean, and both are printed.
  // As much as a step reads of the fp32 state (12 B per parameter, GPT's
  // 12 L d^2 + (V + T) d parameters), within [256 MiB, 4 GiB]: a sustained
  // stream for the real workloads, not gigabytes for a smoke-sized model.
  RawBandwidth raw_before, raw_after;
  const uint64_t L = static_cast<uint64_t>(c.model.n_layer), d = static_cast<uint64_t>(c.model.n_embd);
  const uint64_t state = 12 * (12 * L * d * d + static_cast<uint64_t>(c.model.vocab_size + c.model.seq_len) * d);
  const uint64_t raw_bytes = std::clamp<uint64_t>(state, 256ull << 20, 4ull << 30) >> 20 << 20;
  auto measure_raw = [&](const char* when, RawBandwidth* b) {
    *b = MeasureRaw(dir->path(), raw_bytes);
    std::cerr << "baseline (" << when << "): raw io_uring O_DIRECT in " << dir->path() << ", "
              << FormatBytes(raw_bytes) << ": read " << b->read_gbs << " GB/s, write " << b->write_gbs
              << " GB/s, mixed " << b->mixed_gbs << " GB/s\n";
  };
  if (dir) measure_raw("before", &raw_before);

  Run run = BENCH_VALUE(Train(t, o.warmup, o.steps));
  if (dir) {
    measure_raw("after", &raw_after);
    raw.read_gbs = (raw_before.read_gbs + raw_after.read_gbs) / 2;
    raw.write_gbs = (raw_before.write_gbs + raw_after.write_gbs) / 2;
    raw.mixed_gbs = (raw_before.mixed_gbs + raw_after.mixed_gbs) / 2;
  }
  const double tps = run.median.tokens / run.median.seconds;
  const double mfu = run.info.peak_flops > 0 ? run.info.flops_per_token * tps / run.info.peak_flops : 0;
  std::cout << "plan:\n" << run.plan;
  rep.Add(Report::WithRatio({{"figure", "tokens/s"}, {"unit", "tok/s"}, {"baseline_name",
                                                                         "model FLOPs at the GEMM peak (ratio = MFU)"}},
                            tps, run.info.peak_flops / std::max(run.info.flops_per_token, 1.0)));
  rep.Add({{"figure", "GEMM peak (same run: the MFU baseline)"}, {"unit", "TFLOP/s"},
           {"value", run.info.peak_flops / 1e12}});
  if (spec->mfu_target > 0)
    rep.Add(Report::WithRatio({{"figure", "MFU"}, {"unit", "%"}, {"baseline_name", "target"}}, 100 * mfu,
                              spec->mfu_target));
  if (mfu > 1)
    rep.Note("warning: MFU above 100% means the GEMM baseline was measured below what the steps reached (the "
             "machine was busier while it ran than during the steps); the MFU figure is not meaningful");
  if (resident) {
    const double rtps = resident->median.tokens / resident->median.seconds;
    rep.Add(Report::WithRatio({{"figure", "tokens/s vs all-resident"}, {"unit", "tok/s"},
                               {"baseline_name", "same trainer, no GPU limit (target ratio >= 0.95)"}},
                              tps, rtps));
  }
  if (dir) AddNvmeBoundRows(run.median, raw, raw_before, raw_after, rep);
  AddHostMemoryRows(run, c, rep);
  const StepReport& m = run.median;
  rep.Add({{"figure", "step"}, {"value", m.seconds}, {"unit", "s"}});
  rep.Add({{"figure", "optimizer update"}, {"value", run.info.optimizer_update}});
  if (run.info.optimizer_speculative) {
    int committed = 0, missed = 0;
    for (const auto& r : run.steps) {
      committed += r.speculation == Speculation::kCommitted;
      missed += r.speculation == Speculation::kMissed;
    }
    rep.Add({{"figure", "speculative update"},
             {"value", std::to_string(committed) + " of " + std::to_string(run.steps.size()) +
                           " timed steps committed, " + std::to_string(missed) + " missed (second master/m/v: " +
                           FormatBytes(run.info.speculative_bytes) + " of host memory)"}});
  }
  if (c.gradient_clipping > 0) {
    std::string norms;
    for (const auto& r : run.steps) norms += (norms.empty() ? "" : ", ") + Fixed(r.grad_norm);
    rep.Add({{"figure", "global norms of the timed steps"}, {"value", norms},
             {"baseline", c.gradient_clipping}, {"baseline_name", "gradient_clipping"}});
  }
  rep.Add({{"figure", "forward / backward / optimizer / waiting"},
           {"value", Fixed(m.forward_s) + " / " + Fixed(m.backward_s) + " / " + Fixed(m.optimizer_s) + " / " +
                         Fixed(m.wait_s)},
           {"unit", "s"}});
  rep.Add({{"figure", "H2D / D2H per step"}, {"value", FormatBytes(m.h2d) + " / " + FormatBytes(m.d2h)}});
  if (m.nvme_read || m.nvme_write)
    rep.Add({{"figure", "NVMe read / write per step"},
             {"value", FormatBytes(m.nvme_read) + " / " + FormatBytes(m.nvme_write)}});
  rep.Add({{"figure", "GPU peak: tier / device (cudaMemGetInfo)"},
           {"value", FormatBytes(run.info.gpu_tier_peak) + " / " + FormatBytes(run.info.device_in_use)},
           {"baseline", t.gpu_memory_limit ? FormatBytes(t.gpu_memory_limit) : std::string("(no limit)")},
           {"baseline_name", "--gpu-memory-limit"}});
  rep.Note("medians of " + std::to_string(o.steps) + " steps after " + std::to_string(o.warmup) +
           " warm-up; " + run.info.backend + "; peak " + run.info.peak_what);
  rep.meta()["run"] = RunJson(run);
  if (resident) rep.meta()["resident"] = RunJson(*resident);
  rep.Print();
  if (o.peers) RunPeers(PeersOf(c, o), tps, rep);
  BENCH_CHECK_OK(rep.WriteJson(o.common.json_path));
  return 0;
}

}  // namespace strata::bench
