// SPDX-License-Identifier: Apache-2.0
// One NVMe setting measured: the NvmeTier beside the raw io_uring loop on
// the tier's own swap file, in the same run (strata-bench nvme's sweep and
// its --tune both call it, and so does `strata-bench all` through them).
//
// For a setting (tensor size, block size, queue depth, rings) the passes,
// each over `size` bytes, alternate `reps` times (who goes first alternates
// too, so drift in the device favours neither), and the medians are kept:
//   write / read  all tensors (one extent each) queued at once through
//                 NvmeTier::Write / Read  vs  RawLoop::Run, min(block,
//                 tensor)-byte I/Os, queue depth x rings in flight (the
//                 same concurrency from one ring)
//   mixed         the even tensors read while the odd ones are written, all
//                 queued at once (the NVMe optimizer's read-ahead beside its
//                 write-behind)  vs  RawLoop::RunMixed, the same split;
//                 measured when size holds at least two tensors
// The extents are written once, untimed, before any timing (no first-touch
// conversion of fallocated space in the figures). O_DIRECT keeps the page
// cache out. A stop (bench/sweep.h) ends the repetitions early; the medians
// are then of those done (at least one).
#pragma once

#include <cstdint>
#include <string>

#include "tiers/nvme/checksum.h"

namespace strata::bench {

struct NvmeSetting {
  uint64_t tensor = 16ull << 20;
  uint64_t block = 1ull << 20;
  uint32_t qd = 32;
  int rings = 1;  // aio.intra_op_parallelism
  bool fixed = false;
  ChecksumKind checksum = ChecksumKind::kNone;
};

struct NvmeFigures {  // GB/s (1e9 B/s), medians
  double tier_write = 0, tier_read = 0, tier_mixed = 0;
  double raw_write = 0, raw_read = 0, raw_mixed = 0;
  bool mixed = false;          // measured (size holds at least two tensors)
  bool fixed_by_tier = false;  // fixed buffers were asked for and the tier used them
  bool fixed_by_raw = false;   // likewise the raw loop
  int reps = 0;                // repetitions done
};

// `buf` holds `size` bytes, 4 KiB-aligned; `dir` exists. Dies (bench.h) on
// an I/O error, naming the file.
NvmeFigures MeasureNvme(const std::string& dir, const NvmeSetting& s, char* buf, uint64_t size, int reps);

}  // namespace strata::bench
