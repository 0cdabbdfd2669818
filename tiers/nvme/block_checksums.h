// SPDX-License-Identifier: Apache-2.0
// BlockChecksums: the NVMe tier's checksums of data at rest, one per
// `checksum_block` of every extent (crc32c or xxhash64; tiers/nvme/checksum.h).
//
// Block b of an extent is [b * block, min((b + 1) * block, extent bytes)).
// Each block is in one of three states: kUnknown (never written whole since
// it was allocated, or last written in part), kValid (its checksum is known)
// or kPoisoned (a write to it failed: what reached the disk is unknown).
//
// A transfer records (write) or verifies (read) the blocks it covers whole:
// - Begin sizes the transfer's sums; a read snapshots the blocks' states and
//   stored checksums, so a write racing with it cannot change what it checks.
// - PieceDone, as each block-level piece lands: a piece that holds a block
//   whole computes (and, reading, checks) it at once, overlapping the I/O
//   still in flight.
// - Finish, when the transfer is over: the blocks no piece held whole are
//   done; a read of a kValid block that does not match, or of a kPoisoned
//   block, is DataLoss naming the file and the block's offset.
// - Publish (writes): blocks covered whole become kValid with their new
//   checksum, blocks covered in part kUnknown; after a failed write every
//   block it touched is kPoisoned until written whole again.
//
// Ownership: the tier keeps one ExtentSums per live extent (under its extent
// mutex) and one TransferSums per transfer; BlockChecksums holds only the
// kind, the block size and a counter.
//
// Thread-safety: PieceDone and Finish run on the rings' I/O threads; each
// element of a TransferSums is written by the one ring whose piece covers
// the block and read by the ring completing the transfer (ordered by
// Transfer::parts_left). Begin and Publish read or write an ExtentSums: the
// caller holds the lock that guards it. failures() is an atomic counter.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "tiers/nvme/checksum.h"

namespace strata::nvme {

struct Transfer;

enum class BlockState : uint8_t { kUnknown = 0, kValid = 1, kPoisoned = 2 };

// The checksum state of one extent's blocks.
struct ExtentSums {
  std::vector<BlockState> state;
  std::vector<uint64_t> sums;
};

// One transfer's checksum blocks, [first_block, first_block + sums.size()) of
// its extent. Empty when checksums are off (or the transfer is empty).
struct TransferSums {
  size_t first_block = 0;
  std::vector<uint64_t> sums;             // the data's checksum per block
  std::vector<uint8_t> computed;          // sums[i] is set
  std::vector<BlockState> expect_state;   // reads: the blocks' state at submission
  std::vector<uint64_t> expect;           // reads: the stored checksums at submission
  bool empty() const { return sums.empty(); }
};

class BlockChecksums {
 public:
  // `kind` kNone: off (every method is a no-op). `block`: a multiple of 4096.
  BlockChecksums(ChecksumKind kind, uint32_t block) : kind_(kind), block_(block) {}
  BlockChecksums(const BlockChecksums&) = delete;
  BlockChecksums& operator=(const BlockChecksums&) = delete;

  bool on() const { return kind_ != ChecksumKind::kNone; }

  // The state of a new extent of `bytes`: every block unknown. Empty when off.
  ExtentSums NewExtent(uint64_t bytes) const;
  // Sizes `t->sums` for a non-empty transfer; a read snapshots `extent`.
  void Begin(Transfer* t, const ExtentSums& extent) const;
  // The piece at [pos, pos + len) of the transfer landed: computes the blocks
  // it holds whole; a read that does not match is DataLoss naming `path`.
  Status PieceDone(Transfer* t, uint64_t pos, uint64_t len, const std::string& path);
  // The transfer is over (`ok`: every piece landed). For a read: DataLoss
  // when a block does not match or was poisoned; for a write: OK (Publish
  // then records the result).
  Status Finish(Transfer* t, bool ok, const std::string& path);
  // A write is over: records what it left on disk in `extent`.
  void Publish(const Transfer& t, bool ok, ExtentSums* extent) const;

  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  uint64_t BlockStart(size_t b) const { return b * block_; }
  uint64_t BlockEnd(const Transfer& t, size_t b) const;
  bool FullyCovered(const Transfer& t, size_t b) const;
  // Computes block b's checksum from the transfer's buffer and, for a read
  // of a block stored valid, compares it.
  Status Compute(Transfer* t, size_t b, const std::string& path);
  Status Mismatch(const Transfer& t, size_t b, uint64_t stored, uint64_t read,
                  const std::string& path);

  const ChecksumKind kind_;
  const uint32_t block_;
  std::atomic<uint64_t> failures_{0};  // blocks that did not match (relaxed: a counter)
};

}  // namespace strata::nvme
