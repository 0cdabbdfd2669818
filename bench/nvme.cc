// strata-bench nvme: sequential write and read through the NvmeTier, beside a
// plain io_uring O_DIRECT loop on the same file in the same run.
//
// For each (tensor size, block size, queue depth) the run alternates four
// timed passes over `--size` bytes, `--reps` times, and reports medians:
//   raw write / raw read    the baseline: one ring, `qd` I/Os of
//                           min(block, tensor) bytes in flight, sequential over
//                           the tier's own swap file (its own O_DIRECT
//                           descriptor), every cqe checked
//   tier write / tier read  the same bytes as tensors of `--tensor` bytes, one
//                           extent each, all queued at once through
//                           NvmeTier::Write / Read (block_size = block,
//                           queue_depth = qd)
// Both write into extents that were written once before (no first-touch
// conversion of fallocated space in the timings). O_DIRECT keeps the page
// cache out.
//
// Flags (strata-bench nvme --help): --size, --tensor, --block, --qd, --reps,
// --rings, --fixed, --checksum, and the common --dir, --json, --full.
#include <fcntl.h>
#include <liburing.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include "base/bytes.h"
#include "bench/bench.h"
#include "bench/raw_io.h"
#include "tiers/nvme/nvme_tier.h"

namespace po = boost::program_options;

namespace strata::bench {
namespace {

struct Config {
  uint64_t size = 256 * kMiB;
  std::string tensors = "1MiB,16MiB";
  std::string blocks = "128KiB,1MiB";
  std::string depths = "1,8,32";
  int reps = 3;
  int rings = 1;
  bool fixed = false;
  std::string checksum = "none";
};

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
      char* end = nullptr;
      unsigned long v = std::strtoul(item.c_str(), &end, 10);
      if (end == item.c_str() || *end != '\0' || v == 0)
        return InvalidArgument(std::string(what) + ": '" + item + "' is not a positive integer");
      out.push_back(v);
    }
  }
  if (out.empty()) return InvalidArgument(std::string(what) + ": empty list");
  return out;
}

// Moves all tensors through the tier at once; seconds.
double TierPass(NvmeTier& tier, bool write, const std::vector<Extent>& ext, char* buf,
                uint64_t tensor) {
  std::mutex mu;
  std::condition_variable cv;
  size_t finished = 0;
  Status first;
  const double t0 = NowSeconds();
  for (size_t i = 0; i < ext.size(); ++i) {
    auto done = [&](Status s) {
      std::lock_guard<std::mutex> l(mu);
      if (first.ok() && !s.ok()) first = s;
      if (++finished == ext.size()) cv.notify_one();
    };
    if (write)
      tier.Write(ext[i], 0, buf + i * tensor, tensor, done);
    else
      tier.Read(ext[i], 0, buf + i * tensor, tensor, done);
  }
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return finished == ext.size(); });
  const double secs = NowSeconds() - t0;
  BENCH_CHECK_OK(first);
  return secs;
}

std::string FsType(const std::string& dir) {
  struct statfs s {};
  if (statfs(dir.c_str(), &s) != 0) return "?";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x6969: return "nfs";
    case 0x794c7630: return "overlayfs";
    default: {
      std::ostringstream os;
      os << "0x" << std::hex << s.f_type;
      return os.str();
    }
  }
}

int RunNvme(int argc, char** argv) {
  CommonOptions common;
  Config cfg;
  std::string size_text;
  po::options_description desc("strata-bench nvme: NvmeTier vs a plain io_uring O_DIRECT loop");
  AddCommonOptions(desc, common);
  desc.add_options()("size", po::value(&size_text)->value_name("BYTES"),
                     "bytes moved per pass (default 256MiB; --full: 1GiB)")(
      "tensor", po::value(&cfg.tensors)->value_name("LIST"),
      "tensor sizes, one extent each (default 1MiB,16MiB; --full: 1MiB,16MiB,64MiB)")(
      "block", po::value(&cfg.blocks)->value_name("LIST"),
      "block sizes, aio.block_size (default 128KiB,1MiB; --full: 128KiB..16MiB)")(
      "qd", po::value(&cfg.depths)->value_name("LIST"),
      "queue depths, aio.queue_depth (default 1,8,32; --full: 1,2,4,...,128)")(
      "reps", po::value(&cfg.reps)->value_name("N"),
      "passes per figure; the median is shown (default 3)")(
      "rings", po::value(&cfg.rings)->value_name("N"),
      "NvmeTier rings, aio.intra_op_parallelism (default 1)")(
      "fixed", po::bool_switch(&cfg.fixed), "register the buffer with both (fixed-buffer I/O)")(
      "checksum", po::value(&cfg.checksum)->value_name("KIND"),
      "NvmeTier checksums: none, crc32c, xxh64");
  int code = 0;
  if (!ParseOptions(argc, argv, desc, &code)) return code;
  if (common.full) {
    if (size_text.empty()) cfg.size = kGiB;
    if (cfg.tensors == Config().tensors) cfg.tensors = "1MiB,16MiB,64MiB";
    if (cfg.blocks == Config().blocks)
      cfg.blocks = "128KiB,256KiB,512KiB,1MiB,2MiB,4MiB,8MiB,16MiB";
    if (cfg.depths == Config().depths) cfg.depths = "1,2,4,8,16,32,64,128";
  }
  if (!size_text.empty()) cfg.size = BENCH_VALUE(ParseBytes(size_text));
  auto tensors = BENCH_VALUE(ParseList(cfg.tensors, true, "--tensor"));
  auto blocks = BENCH_VALUE(ParseList(cfg.blocks, true, "--block"));
  auto depths = BENCH_VALUE(ParseList(cfg.depths, false, "--qd"));
  auto checksum = ParseChecksumKind(cfg.checksum);
  if (!checksum) Die(InvalidArgument("--checksum: none, crc32c or xxh64"), "options");
  if (cfg.reps < 1) Die(InvalidArgument("--reps must be at least 1"), "options");
  if (cfg.size == 0 || cfg.size % 4096 != 0)
    Die(InvalidArgument("--size must be a positive multiple of 4 KiB"), "options");
  for (uint64_t t : tensors)
    if (t % 4096 != 0 || cfg.size % t != 0)
      Die(InvalidArgument("--tensor " + FormatBytes(t) +
                          " must be a multiple of 4 KiB dividing --size " + FormatBytes(cfg.size)),
          "options");
  for (uint64_t b : blocks)
    if (b % 4096 != 0 || b > kGiB)
      Die(InvalidArgument("--block sizes must be multiples of 4 KiB, at most 1 GiB"), "options");

  BenchDir dir = BENCH_VALUE(BenchDir::Make(common.dir));
  AlignedBuffer buf(cfg.size);
  {
    std::mt19937_64 rng(1);
    for (uint64_t i = 0; i < cfg.size; i += 8) {
      uint64_t v = rng();
      std::memcpy(buf.p + i, &v, 8);
    }
  }

  Report report("nvme");
  report.meta()["dir"] = dir.path();
  report.meta()["filesystem"] = FsType(dir.path());
  report.meta()["size_bytes"] = cfg.size;
  report.meta()["reps"] = cfg.reps;
  report.meta()["rings"] = cfg.rings;
  report.meta()["fixed"] = cfg.fixed;
  report.meta()["checksum"] = std::string(ChecksumName(*checksum));
  std::cout << "strata-bench nvme: " << FormatBytes(cfg.size) << " per pass in " << dir.path()
            << " (" << FsType(dir.path()) << "), median of " << cfg.reps << "; GB/s = 1e9 B/s\n";

  double worst_ratio = 1e9;
  std::string worst;
  for (uint64_t tensor : tensors) {
    std::set<uint64_t> io_sizes;  // a block larger than the tensor repeats block == tensor
    for (uint64_t block : blocks) {
      if (!io_sizes.insert(std::min(block, tensor)).second) continue;
      for (uint64_t qd : depths) {
        NvmeOptions o;
        o.dirs = {dir.path()};
        o.block_size = static_cast<uint32_t>(block);
        o.queue_depth = static_cast<uint32_t>(qd);
        o.rings = cfg.rings;
        o.checksum = *checksum;
        auto tier = BENCH_VALUE(NvmeTier::Open(o));
        if (cfg.fixed) BENCH_CHECK_OK(tier->RegisterBuffer(buf.p, cfg.size));
        std::vector<Extent> ext;
        for (uint64_t off = 0; off < cfg.size; off += tensor)
          ext.push_back(BENCH_VALUE(tier->Allocate(tensor)));
        // Sequential: the extents of a fresh tier tile the file in order.
        for (size_t i = 0; i < ext.size(); ++i)
          if (ext[i].offset != i * tensor) Die(Internal("extents are not sequential"), "setup");
        const uint32_t io = static_cast<uint32_t>(std::min(block, tensor));
        RawLoop raw(tier->files()[0], static_cast<uint32_t>(qd), buf.p, cfg.size, cfg.fixed);
        raw.Run(true, buf.p, cfg.size, io, static_cast<uint32_t>(qd));  // first touch, untimed
        std::vector<double> rw, tw, rr, tr;
        for (int rep = 0; rep < cfg.reps; ++rep) {
          // Alternate who goes first so drift in the device does not favour one.
          if (rep % 2 == 0) {
            rw.push_back(raw.Run(true, buf.p, cfg.size, io, qd));
            tw.push_back(TierPass(*tier, true, ext, buf.p, tensor));
            rr.push_back(raw.Run(false, buf.p, cfg.size, io, qd));
            tr.push_back(TierPass(*tier, false, ext, buf.p, tensor));
          } else {
            tw.push_back(TierPass(*tier, true, ext, buf.p, tensor));
            rw.push_back(raw.Run(true, buf.p, cfg.size, io, qd));
            tr.push_back(TierPass(*tier, false, ext, buf.p, tensor));
            rr.push_back(raw.Run(false, buf.p, cfg.size, io, qd));
          }
        }
        NvmeStats st = tier->stats();
        auto add = [&](const char* op, const std::vector<double>& tier_s,
                       const std::vector<double>& raw_s) {
          const double t = cfg.size / Median(tier_s) / 1e9, r = cfg.size / Median(raw_s) / 1e9;
          nlohmann::json row{{"op", op},
                             {"tensor", FormatBytes(tensor)},
                             {"block", FormatBytes(block)},
                             {"qd", qd},
                             {"unit", "GB/s"},
                             {"baseline_name", "raw io_uring"}};
          report.Add(Report::WithRatio(row, t, r));
          if (tensor >= kMiB && r > 0 && t / r < worst_ratio) {
            worst_ratio = t / r;
            worst = std::string(op) + " tensor " + FormatBytes(tensor) + " block " +
                    FormatBytes(block) + " qd " + std::to_string(qd);
          }
        };
        add("write", tw, rw);
        add("read", tr, rr);
        if (cfg.fixed && (st.fixed_ios == 0 || !raw.fixed()))
          report.Note("fixed buffers requested but not used by " +
                      std::string(st.fixed_ios == 0 ? "the tier" : "the raw loop") +
                      " (kernel refused)");
      }
    }
  }
  report.Note("tier: NvmeTier (" + std::to_string(cfg.rings) +
              " ring(s)), all tensors queued at once; raw: one ring, "
              "min(block, tensor)-byte I/Os; same file, same run, O_DIRECT");
  if (worst_ratio < 1e9) {
    std::ostringstream os;
    os.precision(3);
    os << "lowest tier/raw ratio for tensors >= 1 MiB: " << worst_ratio << " (" << worst
       << "; target >= 0.90)";
    report.Note(os.str());
  }
  report.Print();
  BENCH_CHECK_OK(report.WriteJson(common.json_path));
  return 0;
}

}  // namespace

STRATA_BENCH_COMMAND("nvme", "NVMe tier vs a plain io_uring O_DIRECT loop (GB/s, ratio)", RunNvme);

}  // namespace strata::bench
