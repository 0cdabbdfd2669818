// SPDX-License-Identifier: Apache-2.0
#include "bench/nvme_measure.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "bench/bench.h"
#include "bench/raw_io.h"
#include "bench/sweep.h"
#include "tiers/nvme/nvme_tier.h"

namespace strata::bench {

namespace {

enum class Op { kWrite, kRead, kMixed };

// Moves the tensors through the tier at once (mixed: even ones read, odd
// ones written); seconds.
double TierPass(NvmeTier& tier, Op op, const std::vector<Extent>& ext, char* buf, uint64_t tensor) {
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
    const bool write = op == Op::kWrite || (op == Op::kMixed && i % 2 == 1);
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

}  // namespace

NvmeFigures MeasureNvme(const std::string& dir, const NvmeSetting& s, char* buf, uint64_t size, int reps) {
  NvmeOptions o;
  o.dirs = {dir};
  o.block_size = static_cast<uint32_t>(s.block);
  o.queue_depth = s.qd;
  o.rings = s.rings;
  o.checksum = s.checksum;
  auto tier = BENCH_VALUE(NvmeTier::Open(o));
  if (s.fixed) BENCH_CHECK_OK(tier->RegisterBuffer(buf, size));
  std::vector<Extent> ext;
  for (uint64_t off = 0; off < size; off += s.tensor) ext.push_back(BENCH_VALUE(tier->Allocate(s.tensor)));
  // Sequential: the extents of a fresh tier tile the file in order.
  for (size_t i = 0; i < ext.size(); ++i)
    if (ext[i].offset != i * s.tensor) Die(Internal("extents are not sequential"), "setup");
  const uint32_t io = static_cast<uint32_t>(std::min(s.block, s.tensor));
  const uint32_t raw_qd = s.qd * static_cast<uint32_t>(std::max(1, s.rings));
  RawLoop raw(tier->files()[0], raw_qd, buf, size, s.fixed);
  raw.Run(true, buf, size, io, raw_qd);  // first touch, untimed
  NvmeFigures f;
  f.mixed = ext.size() >= 2;
  std::vector<double> rw, tw, rr, tr, rm, tm;
  for (int rep = 0; rep < reps && (rep == 0 || !StopRequested()); ++rep) {
    auto raw_w = [&] { rw.push_back(raw.Run(true, buf, size, io, raw_qd)); };
    auto raw_r = [&] { rr.push_back(raw.Run(false, buf, size, io, raw_qd)); };
    auto raw_m = [&] { rm.push_back(raw.RunMixed(buf, size, io, raw_qd, s.tensor)); };
    auto tier_w = [&] { tw.push_back(TierPass(*tier, Op::kWrite, ext, buf, s.tensor)); };
    auto tier_r = [&] { tr.push_back(TierPass(*tier, Op::kRead, ext, buf, s.tensor)); };
    auto tier_m = [&] { tm.push_back(TierPass(*tier, Op::kMixed, ext, buf, s.tensor)); };
    if (rep % 2 == 0) {
      raw_w(), tier_w(), raw_r(), tier_r();
      if (f.mixed) raw_m(), tier_m();
    } else {
      tier_w(), raw_w(), tier_r(), raw_r();
      if (f.mixed) tier_m(), raw_m();
    }
    ++f.reps;
  }
  auto gbs = [&](const std::vector<double>& secs) { return secs.empty() ? 0.0 : size / Median(secs) / 1e9; };
  f.tier_write = gbs(tw), f.tier_read = gbs(tr), f.tier_mixed = gbs(tm);
  f.raw_write = gbs(rw), f.raw_read = gbs(rr), f.raw_mixed = gbs(rm);
  f.fixed_by_tier = s.fixed && tier->stats().fixed_ios > 0;
  f.fixed_by_raw = s.fixed && raw.fixed();
  return f;
}

}  // namespace strata::bench
