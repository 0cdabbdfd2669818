// SPDX-License-Identifier: Apache-2.0
// strata-bench nvme: sequential write, read and mixed transfers through the
// NvmeTier, beside a plain io_uring O_DIRECT loop on the same file in the
// same run (bench/nvme_measure.h says what each pass does).
//
// Two workloads:
//   (default)  the sweep: every (tensor size, block size, queue depth,
//              rings) of the lists given; a row per op (write, read, mixed)
//              with the tier's GB/s beside the raw loop's and the ratio.
//   --tune     DeepSpeed's ds_nvme_tune: block size x queue depth x
//              submission threads (aio.intra_op_parallelism = the tier's
//              rings), by default block {1M, 8M} x queue depth {32, 128} x
//              threads {1, 8} over 1 GiB per pass in 64 MiB tensors; prints
//              the best read and write settings and, as the `aio` block to
//              paste into a ds_config.json, the setting with the least
//              1/read + 1/write (an offloaded optimizer step reads and writes
//              the same bytes). strata's config reader accepts exactly what
//              it prints (tests/bench).
// --quick shrinks either to seconds (CI); --full widens it. Ctrl-C stops
// after the setting in flight; what was measured is printed and written,
// and the exit code is 130. The files live in a private directory inside
// --dir, removed on exit; --dir itself must exist (bench.h, BenchDir).
//
// Flags (strata-bench nvme --help): --size, --tensor, --block, --qd,
// --rings, --reps, --fixed, --checksum, --tune, --quick, and the common
// --dir, --json, --full.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "base/bytes.h"
#include "bench/aio_block.h"
#include "bench/args.h"
#include "bench/bench.h"
#include "bench/nvme_measure.h"
#include "bench/raw_io.h"
#include "bench/sweep.h"
#include "engine/path_probe.h"
#include "tiers/nvme/nvme_tier.h"

namespace po = boost::program_options;

namespace strata::bench {
namespace {

struct Lists {
  std::string size, tensors, blocks, depths, rings;
  int reps;
};

// The defaults of each workload and size; a flag given replaces its list.
Lists Defaults(bool tune, bool quick, bool full) {
  if (tune) {
    if (quick) return {"128MiB", "16MiB", "1MiB,8MiB", "32", "1,2", 1};
    if (full) return {"2GiB", "64MiB", "256KiB,1MiB,4MiB,8MiB,16MiB", "8,32,128", "1,2,4,8", 3};
    return {"1GiB", "64MiB", "1MiB,8MiB", "32,128", "1,8", 2};
  }
  if (quick) return {"32MiB", "8MiB", "1MiB", "8,32", "1", 1};
  if (full) return {"1GiB", "1MiB,16MiB,64MiB", "128KiB,256KiB,512KiB,1MiB,2MiB,4MiB,8MiB,16MiB",
                    "1,2,4,8,16,32,64,128", "1", 3};
  return {"256MiB", "1MiB,16MiB", "128KiB,1MiB", "1,8,32", "1", 3};
}

Result<std::vector<uint64_t>> ParseList(const std::string& text, bool bytes, const char* what) {
  std::vector<uint64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (bytes) {
      auto v = ParseBytes(item);
      if (!v.ok()) return v.status().WithContext(what);
      out.push_back(*v);
    } else {
      out.push_back(static_cast<uint64_t>(ParseIntArg(what, item, 1, INT64_MAX)));
    }
  }
  if (out.empty()) return InvalidArgument(std::string(what) + ": empty list");
  return out;
}

int BadOption(const Status& s) {
  std::cerr << "strata-bench nvme: " << s.message() << "\ntry: strata-bench nvme --help\n";
  return 2;
}

struct Point {
  NvmeSetting s;
  NvmeFigures f;
};

std::string SettingText(const NvmeSetting& s) {
  return "block_size " + FormatBytes(s.block) + ", queue_depth " + std::to_string(s.qd) +
         ", intra_op_parallelism " + std::to_string(s.rings);
}

// The tuner's verdict under the table: best read, best write, the aio block.
void PrintTuneResult(const std::vector<Point>& points, bool stopped, Report& report) {
  if (points.empty()) return;
  auto best = [&](auto score) {
    return *std::max_element(points.begin(), points.end(),
                             [&](const Point& a, const Point& b) { return score(a.f) < score(b.f); });
  };
  const Point r = best([](const NvmeFigures& f) { return f.tier_read; });
  const Point w = best([](const NvmeFigures& f) { return f.tier_write; });
  const Point both = best([](const NvmeFigures& f) {
    return f.tier_read > 0 && f.tier_write > 0 ? -(1 / f.tier_read + 1 / f.tier_write) : -1e30;
  });
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  os << "\nbest read:  " << r.f.tier_read << " GB/s (raw io_uring " << r.f.raw_read << " GB/s) at "
     << SettingText(r.s) << "\nbest write: " << w.f.tier_write << " GB/s (raw io_uring " << w.f.raw_write
     << " GB/s) at " << SettingText(w.s) << "\nfor an offloaded step (reads and writes the same bytes, the "
     << "least 1/read + 1/write): read " << both.f.tier_read << ", write " << both.f.tier_write << " GB/s at "
     << SettingText(both.s) << "\n";
  if (stopped) os << "(stopped early: the best of the " << points.size() << " settings measured)\n";
  AioConfig aio;
  aio.block_size = both.s.block;
  aio.queue_depth = static_cast<int>(both.s.qd);
  aio.intra_op_parallelism = both.s.rings;
  os << "\npaste into your ds_config.json:\n" << AioBlock(aio) << "\n";
  std::cout << os.str() << std::flush;
  report.meta()["aio"] = {{"block_size", aio.block_size},
                          {"queue_depth", aio.queue_depth},
                          {"intra_op_parallelism", aio.intra_op_parallelism},
                          {"single_submit", aio.single_submit},
                          {"overlap_events", aio.overlap_events}};
  report.meta()["best_read"] = {{"gbs", r.f.tier_read}, {"block", r.s.block}, {"qd", r.s.qd}, {"rings", r.s.rings}};
  report.meta()["best_write"] = {{"gbs", w.f.tier_write}, {"block", w.s.block}, {"qd", w.s.qd}, {"rings", w.s.rings}};
}

int RunNvme(int argc, char** argv) {
  CommonOptions common;
  std::string size_text, tensors_text, blocks_text, depths_text, rings_text,
      checksum_text(ChecksumName(NvmeOptions{}.checksum));  // as the tier runs by default
  std::string reps_text;
  bool fixed = false, tune = false, quick = false;
  po::options_description desc(
      "strata-bench nvme: the NvmeTier vs a plain io_uring O_DIRECT loop on the same file (GB/s, ratio)");
  AddCommonOptions(desc, common);
  desc.add_options()("tune", po::bool_switch(&tune),
                     "sweep block size x queue depth x submission threads (DeepSpeed's ds_nvme_tune) and print "
                     "the best settings as the aio block of a ds_config.json")(
      "quick", po::bool_switch(&quick), "a reduced sweep that runs in seconds (CI)")(
      "size", po::value(&size_text)->value_name("BYTES"),
      "bytes moved per pass (default 256MiB; --tune 1GiB; --quick 32MiB / 128MiB; --full 1GiB / 2GiB)")(
      "tensor", po::value(&tensors_text)->value_name("LIST"),
      "tensor sizes, one extent each (default 1MiB,16MiB; --tune 64MiB)")(
      "block", po::value(&blocks_text)->value_name("LIST"),
      "block sizes, aio.block_size (default 128KiB,1MiB; --tune 1MiB,8MiB)")(
      "qd", po::value(&depths_text)->value_name("LIST"),
      "queue depths per ring, aio.queue_depth (default 1,8,32; --tune 32,128)")(
      "rings", po::value(&rings_text)->value_name("LIST"),
      "NvmeTier rings (one submission thread each), aio.intra_op_parallelism (default 1; --tune 1,8)")(
      "reps", po::value(&reps_text)->value_name("N"), "passes per figure; the median is shown (default 3; --tune 2)")(
      "fixed", po::bool_switch(&fixed), "register the buffer with both (fixed-buffer I/O)")(
      "checksum", po::value(&checksum_text)->value_name("KIND"),
      "NvmeTier checksums: none, crc32c, xxh64 (default crc32c, as training runs the tier)");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  if (quick && common.full) return BadOption(InvalidArgument("--quick and --full exclude each other"));
  const Lists def = Defaults(tune, quick, common.full);
  auto size_r = ParseBytes(size_text.empty() ? def.size : size_text);
  if (!size_r.ok()) return BadOption(size_r.status().WithContext("--size"));
  const uint64_t size = *size_r;
  auto tensors = ParseList(tensors_text.empty() ? def.tensors : tensors_text, true, "--tensor");
  auto blocks = ParseList(blocks_text.empty() ? def.blocks : blocks_text, true, "--block");
  auto depths = ParseList(depths_text.empty() ? def.depths : depths_text, false, "--qd");
  auto rings = ParseList(rings_text.empty() ? def.rings : rings_text, false, "--rings");
  for (const auto* l : {&tensors, &blocks, &depths, &rings})
    if (!l->ok()) return BadOption(l->status());
  auto checksum = ParseChecksumKind(checksum_text);
  if (!checksum) return BadOption(InvalidArgument("--checksum '" + checksum_text + "': none, crc32c or xxh64"));
  // Every value in its range (bench/args.h): a zero tensor once divided by zero.
  const int reps = reps_text.empty() ? def.reps : static_cast<int>(ParseIntArg("--reps", reps_text, 1, 1000));
  CheckBytesArg("--size", size, 4096, uint64_t{1} << 40, 4096);
  CheckBytesArgs("--tensor", *tensors, 4096, size, 4096);
  for (uint64_t t : *tensors)
    if (size % t != 0)
      RefuseArgument("--tensor " + FormatBytes(t) + ": must divide --size " + FormatBytes(size));
  CheckBytesArgs("--block", *blocks, 4096, kGiB, 4096);
  for (uint64_t q : *depths) CheckIntArg("--qd", static_cast<int64_t>(q), 1, 4096);
  for (uint64_t r : *rings) CheckIntArg("--rings", static_cast<int64_t>(r), 1, 64);

  BenchDir dir = BENCH_VALUE(BenchDir::Make(common.dir));
  AlignedBuffer buf(size);
  {
    std::mt19937_64 rng(1);
    for (uint64_t i = 0; i < size; i += 8) {
      uint64_t v = rng();
      std::memcpy(buf.p + i, &v, 8);
    }
  }

  // The settings, in sweep order; a block larger than the tensor repeats block == tensor.
  std::vector<NvmeSetting> settings;
  for (uint64_t tensor : *tensors) {
    std::set<uint64_t> io_sizes;
    for (uint64_t block : *blocks) {
      if (!io_sizes.insert(std::min(block, tensor)).second) continue;
      for (uint64_t qd : *depths)
        for (uint64_t r : *rings)
          settings.push_back({tensor, block, static_cast<uint32_t>(qd), static_cast<int>(r), fixed, *checksum});
    }
  }

  const std::string fs = FilesystemName(dir.path());
  Report report(tune ? "nvme --tune" : "nvme");
  report.meta()["dir"] = common.dir.empty() ? dir.path() : common.dir;
  report.meta()["filesystem"] = fs;
  report.meta()["size_bytes"] = size;
  report.meta()["reps"] = reps;
  report.meta()["fixed"] = fixed;
  report.meta()["checksum"] = std::string(ChecksumName(*checksum));
  std::cout << "strata-bench nvme" << (tune ? " --tune" : "") << ": " << settings.size() << " settings, "
            << FormatBytes(size) << " per pass in " << dir.path() << " (" << fs << "), median of " << reps
            << "; GB/s = 1e9 B/s\n"
            << std::flush;

  double worst_ratio = 1e9;
  std::string worst;
  std::vector<Point> points;
  Progress progress(tune ? "nvme --tune" : "nvme", settings.size());
  for (const NvmeSetting& s : settings) {
    if (StopRequested()) break;
    progress.Next("block " + FormatBytes(s.block) + " qd " + std::to_string(s.qd) + " rings " +
                  std::to_string(s.rings));
    const NvmeFigures f = MeasureNvme(dir.path(), s, buf.p, size, reps);
    points.push_back({s, f});
    auto add = [&](const char* op, double tier, double raw) {
      nlohmann::json row{{"op", op},
                         {"tensor", FormatBytes(s.tensor)},
                         {"block", FormatBytes(s.block)},
                         {"qd", s.qd},
                         {"rings", s.rings},
                         {"unit", "GB/s"},
                         {"baseline_name", "raw io_uring"}};
      report.Add(Report::WithRatio(row, tier, raw));
      if (s.tensor >= kMiB && raw > 0 && tier / raw < worst_ratio) {
        worst_ratio = tier / raw;
        worst = std::string(op) + " tensor " + FormatBytes(s.tensor) + " " + SettingText(s);
      }
    };
    add("write", f.tier_write, f.raw_write);
    add("read", f.tier_read, f.raw_read);
    if (f.mixed) add("mixed", f.tier_mixed, f.raw_mixed);
    if (fixed && (!f.fixed_by_tier || !f.fixed_by_raw))
      report.Note(std::string("fixed buffers requested but not used by ") +
                  (!f.fixed_by_tier ? "the tier" : "the raw loop") + " (kernel refused)");
  }
  const bool stopped = StopRequested();
  report.Note("tier: NvmeTier, all tensors queued at once; raw: one ring, min(block, tensor)-byte I/Os, "
              "qd x rings in flight; mixed: the even tensors read while the odd ones are written; same file, "
              "same run, O_DIRECT");
  if (worst_ratio < 1e9) {
    std::ostringstream os;
    os.precision(3);
    os << "lowest tier/raw ratio for tensors >= 1 MiB: " << worst_ratio << " (" << worst << "; target >= 0.90)";
    report.Note(os.str());
  }
  if (stopped)
    report.Note("stopped by Ctrl-C after " + std::to_string(points.size()) + " of " +
                std::to_string(settings.size()) + " settings");
  report.Print();
  if (tune) PrintTuneResult(points, stopped, report);
  BENCH_CHECK_OK(report.WriteJson(common.json_path));
  return stopped ? kStoppedExit : 0;
}

}  // namespace

STRATA_BENCH_COMMAND("nvme", "NVMe tier vs a plain io_uring O_DIRECT loop (GB/s, ratio); --tune: the aio block",
                     RunNvme);

}  // namespace strata::bench
