// SPDX-License-Identifier: Apache-2.0
// BlockChecksums: recording and verifying the checksum blocks a transfer
// covers (tiers/nvme/block_checksums.h).
#include "tiers/nvme/block_checksums.h"

#include <algorithm>

#include "tiers/nvme/common.h"
#include "tiers/nvme/transfer.h"

namespace strata::nvme {

ExtentSums BlockChecksums::NewExtent(uint64_t bytes) const {
  ExtentSums e;
  if (!on()) return e;
  const size_t blocks = (bytes + block_ - 1) / block_;
  e.state.assign(blocks, BlockState::kUnknown);
  e.sums.assign(blocks, 0);
  return e;
}

void BlockChecksums::Begin(Transfer* t, const ExtentSums& extent) const {
  if (!on() || t->bytes == 0) return;
  const size_t first = t->offset / block_;
  const size_t last = (t->offset + t->bytes - 1) / block_;
  const size_t n = last - first + 1;
  TransferSums& s = t->sums;
  s.first_block = first;
  s.sums.assign(n, 0);
  s.computed.assign(n, 0);
  if (!t->write) {
    s.expect_state.assign(extent.state.begin() + first, extent.state.begin() + last + 1);
    s.expect.assign(extent.sums.begin() + first, extent.sums.begin() + last + 1);
  }
}

uint64_t BlockChecksums::BlockEnd(const Transfer& t, size_t b) const {
  return std::min<uint64_t>(BlockStart(b) + block_, t.extent.bytes);
}

bool BlockChecksums::FullyCovered(const Transfer& t, size_t b) const {
  return BlockStart(b) >= t.offset && BlockEnd(t, b) <= t.offset + t.bytes;
}

Status BlockChecksums::Compute(Transfer* t, size_t b, const std::string& path) {
  TransferSums& s = t->sums;
  const size_t i = b - s.first_block;
  s.sums[i] = ComputeChecksum(kind_, t->buf + (BlockStart(b) - t->offset),
                              BlockEnd(*t, b) - BlockStart(b));
  s.computed[i] = 1;
  if (!t->write && s.expect_state[i] == BlockState::kValid && s.expect[i] != s.sums[i])
    return Mismatch(*t, b, s.expect[i], s.sums[i], path);
  return Status::OK();
}

Status BlockChecksums::PieceDone(Transfer* t, uint64_t pos, uint64_t len,
                                 const std::string& path) {
  if (t->sums.empty()) return Status::OK();
  const uint64_t lo = t->offset + pos, hi = lo + len;  // within the extent
  for (size_t b = (lo + block_ - 1) / block_; BlockEnd(*t, b) <= hi && BlockStart(b) < hi; ++b)
    RETURN_IF_ERROR(Compute(t, b, path));
  return Status::OK();
}

Status BlockChecksums::Finish(Transfer* t, bool ok, const std::string& path) {
  const TransferSums& s = t->sums;
  const size_t n = s.sums.size();
  if (ok)
    for (size_t i = 0; i < n; ++i)
      if (!s.computed[i] && FullyCovered(*t, s.first_block + i))
        RETURN_IF_ERROR(Compute(t, s.first_block + i, path));
  if (t->write || !ok) return Status::OK();
  for (size_t i = 0; i < n; ++i)
    if (s.expect_state[i] == BlockState::kPoisoned)
      return DataLoss(
          "NVMe block of the extent was not written completely: an earlier write to it failed",
          path, t->extent.offset + BlockStart(s.first_block + i));
  return Status::OK();
}

void BlockChecksums::Publish(const Transfer& t, bool ok, ExtentSums* extent) const {
  const TransferSums& s = t.sums;
  for (size_t i = 0; i < s.sums.size(); ++i) {
    const size_t b = s.first_block + i;
    if (!ok) {
      extent->state[b] = BlockState::kPoisoned;  // what reached the disk is unknown
    } else if (s.computed[i]) {
      extent->state[b] = BlockState::kValid;
      extent->sums[b] = s.sums[i];
    } else if (extent->state[b] != BlockState::kPoisoned) {
      extent->state[b] = BlockState::kUnknown;  // written in part: no longer known
    }
  }
}

Status BlockChecksums::Mismatch(const Transfer& t, size_t b, uint64_t stored, uint64_t read,
                                const std::string& path) {
  failures_.fetch_add(1, std::memory_order_relaxed);
  return DataLoss("NVMe checksum mismatch (" + std::string(ChecksumName(kind_)) +
                      "): the block read back is not what was written (stored " + Hex(stored) +
                      ", read " + Hex(read) + "); the swap file was modified or corrupted",
                  path, t.extent.offset + BlockStart(b));
}

}  // namespace strata::nvme
