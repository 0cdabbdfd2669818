// SPDX-License-Identifier: Apache-2.0
// strata-bench store: moving tensors gpu <-> host <-> nvme through the
// TierStore API, beside the raw links measured in the same run, and the
// store's bookkeeping cost per operation.
//
// Workloads (--tensors tensors of --tensor-size each; --reps passes; medians):
//   host->gpu   Prefetch(gpu) of host-home tensors, all queued, then waited
//               vs pinned cudaMemcpyAsync of the same bytes (stand-in: memcpy)
//   gpu->host   Evict(gpu) of those tensors made dirty on the gpu (write-back)
//               vs pinned cudaMemcpyAsync (stand-in: memcpy)
//   host->nvme  Flush of nvme-home tensors made dirty on the host
//               vs NvmeTier::Write of as many extents, all queued at once
//   nvme->host  Prefetch(host) of them (no copy anywhere else)
//               vs NvmeTier::Read likewise
//   nvme->gpu   Prefetch(gpu) with no host copy: chunks pipelined through
//               pinned staging (vs the slower of nvme->host and host->gpu)
//   gpu->nvme   Flush of tensors made dirty on the gpu, through staging
//               (vs the slower of gpu->host and host->nvme)
// Bookkeeping, in microseconds per call (target < 20 us; lower is better):
//   acquire/release hit, prefetch hit, and a 4 KiB prefetch+evict round trip
//   through the worker threads (includes two 4 KiB copies).
//
// Defaults finish in well under a minute on a 2-core machine without a GPU
// (8 tensors of 16 MiB); --full moves 32 x 64 MiB. `make run` runs this with
// no arguments until the trainer exists.
//
// Flags (strata-bench store --help): --tensors, --tensor-size, --reps,
// --block, --qd, --workers, --ops, --stand-in, and the common --dir, --json,
// --full.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <iostream>
#include <string>
#include <vector>

#include "base/bytes.h"
#include "base/device.h"
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/sweep.h"
#include "tiers/tier_store.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace po = boost::program_options;

namespace strata::bench {
namespace {

struct Config {
  int tensors = 8;
  std::string tensor_size = "16MiB";
  int reps = 3;
  std::string block = "1MiB";
  int qd = 32;
  int workers = 4;
  int ops = 100000;
  bool stand_in = false;
};

// Waits on every ticket; dies on the first error (a benchmark, not the library).
void WaitAll(std::vector<Ticket>& tickets) {
  for (auto& t : tickets) BENCH_CHECK_OK(t.Wait());
  tickets.clear();
}

double Rate(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }

nlohmann::json LinkRow(const std::string& link, double value, double baseline, const std::string& baseline_name) {
  nlohmann::json row;
  row["link"] = link;
  row["unit"] = "GB/s";
  row["baseline_name"] = baseline_name;
  return Report::WithRatio(row, value, baseline);
}

nlohmann::json CostRow(const std::string& what, double us) {
  nlohmann::json row;
  row["link"] = what;
  row["unit"] = "us/call";
  row["baseline_name"] = "target (lower is better)";
  return Report::WithRatio(row, us, 20.0);
}

int RunStore(int argc, char** argv) {
  Config cfg;
  CommonOptions common;
  po::options_description desc("strata-bench store: tensors through the TierStore, per link and per call");
  AddCommonOptions(desc, common);
  desc.add_options()("tensors", po::value(&cfg.tensors), "tensors per set (default 8; --full 32)")(
      "tensor-size", po::value(&cfg.tensor_size)->value_name("SIZE"), "bytes per tensor (default 16MiB; --full 64MiB)")(
      "reps", po::value(&cfg.reps), "timed passes per figure; the median is reported (default 3)")(
      "block", po::value(&cfg.block)->value_name("SIZE"), "NVMe block size, aio.block_size (default 1MiB)")(
      "qd", po::value(&cfg.qd), "NVMe queue depth, aio.queue_depth (default 32)")(
      "workers", po::value(&cfg.workers), "store worker threads (default 4)")(
      "ops", po::value(&cfg.ops), "calls per bookkeeping figure (default 100000)")(
      "stand-in", po::bool_switch(&cfg.stand_in), "use the gpu stand-in even when a GPU is usable");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  if (common.full) {
    if (cfg.tensors == Config{}.tensors) cfg.tensors = 32;
    if (cfg.tensor_size == Config{}.tensor_size) cfg.tensor_size = "64MiB";
    if (cfg.reps == Config{}.reps) cfg.reps = 5;
  }
  Result<uint64_t> size_r = ParseBytes(cfg.tensor_size);
  if (!size_r.ok()) size_r = size_r.status().WithContext("--tensor-size");
  Result<uint64_t> block_r = ParseBytes(cfg.block);
  if (!block_r.ok()) block_r = block_r.status().WithContext("--block");
  if (!size_r.ok() || !block_r.ok()) {
    std::cerr << "strata-bench store: bad options: " << (!size_r.ok() ? size_r.status() : block_r.status()).ToString()
              << "\n";
    return 2;
  }
  // Every value in its range (bench/args.h), before anything is allocated.
  CheckIntArg("--tensors", cfg.tensors, 1, 4096);
  CheckIntArg("--reps", cfg.reps, 1, 1000);
  CheckIntArg("--qd", cfg.qd, 1, 4096);
  CheckIntArg("--workers", cfg.workers, 1, 64);
  CheckIntArg("--ops", cfg.ops, 1, 1'000'000'000);
  CheckBytesArg("--tensor-size", *size_r, 1, 64 * kGiB);
  CheckBytesArg("--block", *block_r, 4 * kKiB, kGiB, 4 * kKiB);
  const uint64_t size = AlignUp(*size_r, 4096);
  const int n = cfg.tensors;
  const uint64_t set_bytes = size * n;
  // The host tier's budget below, and the GPU stand-in's without a GPU.
  CheckHostMemoryArg("--tensors x --tensor-size", 3 * set_bytes + 96 * kMiB + (CudaDeviceCount() == 0 ? 2 * set_bytes : 0),
                     "the store's tiers for " + std::to_string(n) + " tensors of " + FormatBytes(size));
  BenchDir dir = BENCH_VALUE(BenchDir::Make(common.dir));

  TierStoreOptions o;
  o.gpu_tier.stand_in = cfg.stand_in;
  o.gpu_tier.budget_bytes = 2 * set_bytes + 16 * kMiB;  // one set, the baseline's buffers, small tensors
  o.gpu_tier.slab_bytes = 0;
  o.host_tier.budget_bytes = 3 * set_bytes + 96 * kMiB;  // homes of A, caches of B, baseline, staging
  o.host_tier.slab_bytes = std::min<uint64_t>(kGiB, o.host_tier.budget_bytes);
  o.worker_threads = cfg.workers;
  if ((CudaDeviceCount() == 0 || cfg.stand_in) && !HasIpcLockCapability() && MemlockLimit() < o.host_tier.budget_bytes) {
    // mlock would be refused (the library says so and fails); a benchmark
    // that must run anywhere uses pageable memory instead, and says so.
    o.host_tier.pin = false;
    std::cout << "note: RLIMIT_MEMLOCK is " << FormatBytes(MemlockLimit())
              << " and the process lacks CAP_IPC_LOCK: the host tier runs unpinned (pin_memory false)\n";
  }
  NvmeOptions nv;
  nv.dirs = {dir.path()};
  nv.block_size = static_cast<uint32_t>(*block_r);
  nv.queue_depth = static_cast<uint32_t>(cfg.qd);
  o.nvme = nv;
  auto opened = TierStore::Open(o);
  if (!opened.ok() && opened.status().code() == StatusCode::kUnavailable &&
      opened.status().message().find("O_DIRECT") != std::string_view::npos) {
    std::cout << "note: " << opened.status().ToString()
              << "\n      running with buffered I/O instead; give --dir on a disk for O_DIRECT figures\n";
    o.nvme->buffered_fallback = true;
    opened = TierStore::Open(o);
  }
  auto store = BENCH_VALUE(std::move(opened));
  GpuTier* gpu = store->gpu_tier();
  CopyEngine* engine = store->copy_engine();
  NvmeTier* nvme = store->nvme_tier();
  const bool real_gpu = !gpu->stand_in();
  std::cout << "gpu tier: " << gpu->description() << "\nhost tier: " << FormatBytes(store->host_tier()->budget())
            << ", pinned with " << store->host_tier()->pin_method() << "\nnvme: " << nvme->files()[0]
            << (nvme->direct_io() ? " (O_DIRECT)" : " (buffered)") << "\ncopy engine: " << engine->description()
            << "\n" << n << " tensors of " << FormatBytes(size) << " per set, " << cfg.reps << " passes\n\n";

  // Set A: host-home tensors for the PCIe links; set B: nvme-home tensors.
  std::vector<TensorId> A, B;
  std::vector<uint8_t> init(size);
  for (uint64_t i = 0; i < size; ++i) init[i] = static_cast<uint8_t>(i * 131 + 7);
  for (int i = 0; i < n; ++i) {
    A.push_back(BENCH_VALUE(store->Create("a" + std::to_string(i), DType::kU8, Shape{int64_t(size)}, TierKind::kHost)));
    B.push_back(BENCH_VALUE(store->Create("b" + std::to_string(i), DType::kU8, Shape{int64_t(size)}, TierKind::kNvme)));
    BENCH_CHECK_OK(store->Write(A.back(), init.data(), size));
    BENCH_CHECK_OK(store->Write(B.back(), init.data(), size));
  }
  BENCH_CHECK_OK(store->FlushAll());
  std::vector<Ticket> tk;
  auto evict_all = [&](const std::vector<TensorId>& set, TierKind tier) {
    for (TensorId id : set) tk.push_back(BENCH_VALUE(store->Evict(id, tier)));
    WaitAll(tk);
  };
  auto dirty_all = [&](const std::vector<TensorId>& set, TierKind tier) {
    for (TensorId id : set) {
      TensorView v = BENCH_VALUE(store->Acquire(id, tier, Access::kReadWrite));
      BENCH_CHECK_OK(store->Release(id, tier, /*dirty=*/true));
      (void)v;
    }
  };
  auto timed = [&](auto&& body) {
    double t0 = NowSeconds();
    body();
    return NowSeconds() - t0;
  };
  evict_all(B, TierKind::kHost);

  // Baseline buffers from the tiers themselves (pinned / registered like the
  // store's), one per tensor so that the baseline moves as much distinct
  // memory as the store does.
  std::vector<TierBlock> hbuf, gbuf;
  for (int i = 0; i < n; ++i) {
    hbuf.push_back(BENCH_VALUE(store->host_tier()->Allocate(size, "baseline")));
    gbuf.push_back(BENCH_VALUE(gpu->Allocate(size, "baseline")));
    std::memset(hbuf.back().data(), 1, size);
    if (!real_gpu) std::memset(gbuf.back().data(), 1, size);
  }
  std::vector<Extent> extents;
  for (int i = 0; i < n; ++i) extents.push_back(BENCH_VALUE(nvme->Allocate(size)));
#if STRATA_WITH_CUDA
  cudaStream_t stream = nullptr;
  if (real_gpu) {
    cudaSetDevice(gpu->device());
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  }
#endif
  auto raw_copy = [&](bool h2d) {
    for (int i = 0; i < n; ++i) {
#if STRATA_WITH_CUDA
      if (real_gpu) {
        cudaMemcpyAsync(h2d ? gbuf[i].data() : hbuf[i].data(), h2d ? hbuf[i].data() : gbuf[i].data(), size,
                        h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
        continue;
      }
#endif
      std::memcpy(h2d ? gbuf[i].data() : hbuf[i].data(), h2d ? hbuf[i].data() : gbuf[i].data(), size);
    }
#if STRATA_WITH_CUDA
    if (real_gpu) cudaStreamSynchronize(stream);
#endif
  };
  auto raw_nvme = [&](bool write) {
    std::mutex mu;
    std::condition_variable cv;
    int left = n;
    Status first;
    for (int i = 0; i < n; ++i) {
      auto done = [&](Status s) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok() && !s.ok()) first = s;
        if (--left == 0) cv.notify_all();
      };
      if (write)
        nvme->Write(extents[i], 0, hbuf[i].data(), size, done);
      else
        nvme->Read(extents[i], 0, hbuf[i].data(), size, done);
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return left == 0; });
    BENCH_CHECK_OK(first);
  };
  raw_nvme(true);  // first touch of the extents, untimed

  std::vector<double> s_h2d, s_d2h, s_hn, s_nh, s_ng, s_gn, b_h2d, b_d2h, b_w, b_r;
  Progress progress("store", static_cast<size_t>(cfg.reps));
  for (int rep = 0; rep < cfg.reps; ++rep) {
    if (rep > 0 && StopRequested()) break;  // one pass at least: every row has a figure
    progress.Next("pass " + std::to_string(rep + 1));
    // host -> gpu
    s_h2d.push_back(Rate(set_bytes, timed([&] {
      for (TensorId id : A) tk.push_back(BENCH_VALUE(store->Prefetch(id, TierKind::kGpu)));
      WaitAll(tk);
    })));
    b_h2d.push_back(Rate(set_bytes, timed([&] { raw_copy(true); })));
    // gpu -> host (write-back of dirty copies)
    dirty_all(A, TierKind::kGpu);
    s_d2h.push_back(Rate(set_bytes, timed([&] { evict_all(A, TierKind::kGpu); })));
    b_d2h.push_back(Rate(set_bytes, timed([&] { raw_copy(false); })));
    // host -> nvme
    dirty_all(B, TierKind::kHost);
    s_hn.push_back(Rate(set_bytes, timed([&] {
      for (TensorId id : B) tk.push_back(BENCH_VALUE(store->Flush(id)));
      WaitAll(tk);
    })));
    b_w.push_back(Rate(set_bytes, timed([&] { raw_nvme(true); })));
    // nvme -> host
    evict_all(B, TierKind::kHost);
    s_nh.push_back(Rate(set_bytes, timed([&] {
      for (TensorId id : B) tk.push_back(BENCH_VALUE(store->Prefetch(id, TierKind::kHost)));
      WaitAll(tk);
    })));
    b_r.push_back(Rate(set_bytes, timed([&] { raw_nvme(false); })));
    // nvme -> gpu through staging
    evict_all(B, TierKind::kHost);
    s_ng.push_back(Rate(set_bytes, timed([&] {
      for (TensorId id : B) tk.push_back(BENCH_VALUE(store->Prefetch(id, TierKind::kGpu)));
      WaitAll(tk);
    })));
    // gpu -> nvme through staging
    dirty_all(B, TierKind::kGpu);
    s_gn.push_back(Rate(set_bytes, timed([&] {
      for (TensorId id : B) tk.push_back(BENCH_VALUE(store->Flush(id)));
      WaitAll(tk);
    })));
    evict_all(B, TierKind::kGpu);
  }
  // Contents survived every trip.
  {
    std::vector<uint8_t> back(size);
    BENCH_CHECK_OK(store->Read(B[0], back.data(), size));
    if (back != init) Die(Internal("tensor b0 came back different"), "checking the data");
  }

  Report report("store");
  const std::string pcie = real_gpu ? "cudaMemcpyAsync pinned" : "memcpy (gpu stand-in)";
  double bh2d = Median(b_h2d), bd2h = Median(b_d2h), bw = Median(b_w), br = Median(b_r);
  report.Add(LinkRow("host->gpu", Median(s_h2d), bh2d, pcie));
  report.Add(LinkRow("gpu->host", Median(s_d2h), bd2h, pcie));
  report.Add(LinkRow("host->nvme", Median(s_hn), bw, "NvmeTier::Write"));
  report.Add(LinkRow("nvme->host", Median(s_nh), br, "NvmeTier::Read"));
  report.Add(LinkRow("nvme->gpu (staged)", Median(s_ng), std::min(br, bh2d), "slower of nvme read, h2d"));
  report.Add(LinkRow("gpu->nvme (staged)", Median(s_gn), std::min(bw, bd2h), "slower of nvme write, d2h"));

  // ---- bookkeeping per call ----
  // Hits touch only the store's bookkeeping. Misses are measured as the time
  // the Prefetch/Evict call itself takes (the move runs on a worker), and as
  // the latency of a whole 4 KiB move, which adds two thread hand-offs.
  const int ops = cfg.ops;
  const int smalls = std::max(1, std::min(ops / 20, 4096));
  std::vector<TensorId> small;
  for (int i = 0; i < smalls; ++i) {
    small.push_back(BENCH_VALUE(store->Create("small" + std::to_string(i), DType::kU8, Shape{4096}, TierKind::kHost)));
    BENCH_CHECK_OK(store->Write(small.back(), init.data(), 4096));
  }
  double t_acq = timed([&] {
    for (int i = 0; i < ops; ++i) {
      TensorView v = BENCH_VALUE(store->Acquire(small[0], TierKind::kHost, Access::kRead));
      (void)v;
      BENCH_CHECK_OK(store->Release(small[0], TierKind::kHost, false));
    }
  });
  report.Add(CostRow("acquire+release (hit), per call", t_acq / (2.0 * ops) * 1e6));
  double t_pf = timed([&] {
    for (int i = 0; i < ops; ++i) (void)BENCH_VALUE(store->Prefetch(small[0], TierKind::kHost));
  });
  report.Add(CostRow("prefetch (hit), per call", t_pf / ops * 1e6));
  double t_miss = 0, t_ev = 0;
  for (int rep = 0; rep < 3; ++rep) {
    t_miss += timed([&] {
      for (TensorId id : small) tk.push_back(BENCH_VALUE(store->Prefetch(id, TierKind::kGpu)));
    });
    WaitAll(tk);
    t_ev += timed([&] {
      for (TensorId id : small) tk.push_back(BENCH_VALUE(store->Evict(id, TierKind::kGpu)));
    });
    WaitAll(tk);
  }
  report.Add(CostRow("prefetch (miss), per call", t_miss / (3.0 * smalls) * 1e6));
  report.Add(CostRow("evict, per call", t_ev / (3.0 * smalls) * 1e6));
  const int trips = std::max(1, ops / 100);
  double t_trip = timed([&] {
    for (int i = 0; i < trips; ++i) {
      BENCH_CHECK_OK(BENCH_VALUE(store->Prefetch(small[0], TierKind::kGpu)).Wait());
      BENCH_CHECK_OK(BENCH_VALUE(store->Evict(small[0], TierKind::kGpu)).Wait());
    }
  });
  nlohmann::json lat;
  lat["link"] = "4 KiB move latency (prefetch or evict + wait)";
  lat["value"] = t_trip / (2.0 * trips) * 1e6;
  lat["unit"] = "us";
  lat["baseline_name"] = "(latency: includes worker hand-offs; not bookkeeping)";
  report.Add(lat);

  TierStoreStats st = store->stats();
  auto link = [](const LinkStats& l) {
    return nlohmann::json{{"bytes", l.bytes}, {"transfers", l.transfers}, {"seconds", l.seconds}};
  };
  report.meta()["store_links"] = {{"gpu_to_host", link(st.gpu_to_host)}, {"host_to_gpu", link(st.host_to_gpu)},
                                  {"host_to_nvme", link(st.host_to_nvme)}, {"nvme_to_host", link(st.nvme_to_host)}};
  report.meta()["tensors"] = n;
  report.meta()["tensor_bytes"] = size;
  report.meta()["gpu"] = gpu->description();
  report.meta()["stand_in"] = !real_gpu;
  report.meta()["max_queue_depth"] = st.max_queue_depth;
  report.meta()["nvme_fixed_ios"] = st.nvme.fixed_ios;
  report.Note(std::string("gpu tier: ") + gpu->description() + "; host pinned with " +
              std::string(store->host_tier()->pin_method()) + "; nvme " +
              (nvme->direct_io() ? "O_DIRECT" : "buffered") + ", block " + cfg.block + ", qd " +
              std::to_string(cfg.qd) + ", fixed-buffer I/Os " + std::to_string(st.nvme.fixed_ios) + "/" +
              std::to_string(st.nvme.ios_submitted));
  report.Note("store counters: gpu hits " + std::to_string(st.tiers[0].hits) + ", misses " +
              std::to_string(st.tiers[0].misses) + ", evictions " + std::to_string(st.tiers[0].evictions) +
              ", write-backs " + std::to_string(st.tiers[0].writebacks) + "; max queue depth " +
              std::to_string(st.max_queue_depth));
  report.Note("target: store bookkeeping < 20 us per call (the per-call rows)");
  if (StopRequested()) report.Note("stopped by Ctrl-C: the passes measured so far");
  report.Print();
  BENCH_CHECK_OK(report.WriteJson(common.json_path));

  for (const Extent& e : extents) nvme->Free(e);
  hbuf.clear();
  gbuf.clear();
#if STRATA_WITH_CUDA
  if (stream) cudaStreamDestroy(stream);
#endif
  return StopRequested() ? kStoppedExit : 0;
}

}  // namespace

STRATA_BENCH_COMMAND("store", "tensors through the TierStore per link (GB/s vs raw) and per call (us)", RunStore);

}  // namespace strata::bench
