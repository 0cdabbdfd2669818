// SPDX-License-Identifier: Apache-2.0
// Transfer and Part: a caller's Read or Write of the NVMe tier, and its share
// on one ring.
//
// NvmeTier::Read/Write make a Transfer on the caller's thread, validate it
// and split it into at most `rings` contiguous Parts of whole blocks, one per
// ring (tiers/nvme/ring.h). Each ring cuts its part into block-level pieces;
// the ring that finishes the transfer's last part completes it (checksums,
// stats, the callback) and deletes it.
//
// Ownership: a Transfer is allocated by NvmeTier (new) and deleted by
// NvmeTier::CompleteTransfer; it owns its Parts. The buffer is the caller's.
//
// Thread-safety: the fields above each struct's "ring" line are set on the
// caller's thread before the parts are enqueued (the ring's inbox mutex
// publishes them). A Part's ring fields belong to its ring's thread. The
// atomics say below why their ordering is enough.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "tiers/nvme/block_checksums.h"
#include "tiers/nvme/nvme_tier.h"

namespace strata::nvme {

struct Transfer;

// One transfer's share on one ring: [file_offset, file_offset + bytes) of a
// file from/to buf.
struct Part {
  Transfer* t = nullptr;
  uint32_t file = 0;
  uint64_t file_offset = 0;
  char* buf = nullptr;
  uint64_t bytes = 0;
  // ---- ring fields
  uint64_t next = 0;    // bytes already cut into pieces (== bytes: nothing left to cut)
  uint32_t active = 0;  // pieces cut and not finished (in flight or waiting to be re-queued)
  bool queued = false;  // in the ring's pending list
  Status error;         // the error at the lowest offset of this part (see ErrorBefore)
};

// A caller's Read or Write.
struct Transfer {
  bool write = false;
  Extent extent;
  uint64_t offset = 0;  // within the extent
  char* buf = nullptr;
  uint64_t bytes = 0;
  IoCallback done;
  uint64_t start_ns = 0;
  Status early;  // a validation error: no I/O is done
  std::vector<Part> parts;
  // Checksum blocks touched (only with checksums on; see block_checksums.h).
  TransferSums sums;
  // ---- ring fields
  // The ring finishing the last part completes the transfer. acq_rel: that
  // ring's acquire sees every other ring's writes to its Part (released by
  // their decrement).
  std::atomic<uint32_t> parts_left{0};
  // Set by the first failing part; other rings stop cutting pieces. Relaxed:
  // only an early stop, the error itself travels through parts_left.
  std::atomic<bool> failed{false};
};

// A transfer reports one error: the one at the lowest file offset (the first
// in the transfer's byte order, whatever order pieces completed in), so the
// report does not depend on timing. Errors without an offset rank last.
inline bool ErrorBefore(const Status& a, const Status& b) {
  if (b.ok()) return !a.ok();
  if (a.ok()) return false;
  return a.offset().value_or(UINT64_MAX) < b.offset().value_or(UINT64_MAX);
}

}  // namespace strata::nvme
