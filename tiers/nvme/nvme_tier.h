// SPDX-License-Identifier: Apache-2.0
// NvmeTier: tensor bytes in files on one or more NVMe (or other) directories.
//
// The tier composes the pieces of tiers/nvme/: swap files (swap_file.h),
// extents (extent_allocator.h), io_uring rings with their I/O threads
// (ring.h), block checksums (block_checksums.h, checksum.h), registered
// buffers (buffer_table.h), all reaching the OS through an IoEnv (io_env.h).
//
// - One swap file per directory, opened with O_DIRECT; space is handed out as
//   4 KiB-aligned extents by an extent allocator (best fit over the holes,
//   coalescing; tiers/nvme/extent_allocator.h); the files grow as needed
//   (fallocate; ftruncate where fallocate is unsupported) up to the capacity.
//   Extents are placed on the least-used directory, so several directories
//   (several drives) share the load.
// - I/O goes through io_uring (liburing): registered files, registered
//   buffers where the caller registered them (the pinned host pool does),
//   batched submission, `queue_depth` I/Os in flight per ring, transfers split
//   into `block_size` pieces (DeepSpeed `aio` semantics). Every completion's
//   result is read: short transfers are re-queued for the rest, -EAGAIN and
//   -EINTR are retried (16 times per piece, then a retryable IoError),
//   anything else becomes an IoError naming the file, offset and errno. A
//   transfer with several failing pieces reports the error at the lowest
//   offset. Reading where a file cut short now ends is DataLoss.
// - `rings` > 1: a transfer longer than a block is split into contiguous
//   runs of whole blocks, one per ring, so one large tensor uses them all.
// - When O_DIRECT is refused (tmpfs) Open fails with Unavailable saying so,
//   unless `buffered_fallback` is set; it never silently falls back.
// - Checksums per `checksum_block` of each extent (crc32c by default, with
//   the CPU's crc32 instruction: several GB/s per I/O thread, more than a
//   drive reads; or xxhash64; kNone turns them off) are kept in memory and
//   verified on read: a swap file overwritten in place, corrupt or truncated
//   is a DataLoss error naming the file and offset, never wrong data.
//   A write that covers a block only in part leaves it unverified until it is
//   written whole again; a failed write makes reads of the blocks it touched
//   DataLoss until they are rewritten.
// - All OS access goes through an IoEnv (tiers/nvme/io_env.h): tests wrap it to
//   inject EIO, ENOSPC, short transfers, O_DIRECT refusal, deleted files.
//
// The files are scratch space for this process: made at Open, locked while
// they live, removed at destruction. Open first removes the swap files a
// killed run left in each directory (their lock free, their process gone:
// tiers/nvme/leftovers.h) and says so on stderr. Checkpoints are written
// elsewhere (engine/).
//
// Ownership: the tier owns its swap files, rings and I/O threads; the IoEnv
// (NvmeOptions::env) is not owned and outlives the tier; transfer buffers and
// registered ranges are the caller's.
//
// Thread-safety: all methods may be called from any thread. Completion
// callbacks run on the tier's I/O threads; they may start I/O (Read, Write)
// and Free extents, but must not wait for I/O of this tier (ReadSync and
// WriteSync refuse there with FailedPrecondition) nor destroy the tier. The
// caller keeps the buffer of a transfer valid and untouched until its
// callback, and does not Free an extent or UnregisterBuffer a buffer while a
// transfer on it is in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "tiers/nvme/checksum.h"  // ChecksumKind

namespace strata {

class IoEnv;

struct NvmeOptions {
  std::vector<std::string> dirs;        // at least one; each must exist and be writable
  uint64_t capacity_bytes = 0;          // budget over all files; 0 = no budget but the disk's
  uint32_t block_size = 1u << 20;       // largest single I/O (aio.block_size), multiple of 4096
  uint32_t queue_depth = 32;            // I/Os in flight per ring (aio.queue_depth)
  int rings = 1;                        // rings, one I/O thread each (aio.intra_op_parallelism)
  bool single_submit = false;           // aio.single_submit: one io_uring_submit per I/O
  bool overlap_events = true;           // aio.overlap_events: submit new I/O while reaping
  bool buffered_fallback = false;       // allow buffered I/O where O_DIRECT is refused
  ChecksumKind checksum = ChecksumKind::kCrc32c;  // kNone: reads are not verified
  uint32_t checksum_block = 1u << 20;   // checksum granularity within an extent
  IoEnv* env = nullptr;                 // not owned; nullptr = the real OS (IoEnv::Default())
};

// A piece of one swap file. `bytes` is the aligned length reserved.
struct Extent {
  uint32_t file = 0;     // index into NvmeTier::files()
  uint64_t offset = 0;   // 4096-aligned
  uint64_t bytes = 0;    // 4096-aligned
  bool valid() const { return bytes != 0; }
};

struct NvmeStats {
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t reads = 0, writes = 0;             // caller-level transfers
  uint64_t ios_submitted = 0;                 // block-level I/Os (SQEs)
  uint64_t short_requeued = 0, retried = 0;   // short transfers re-queued, EAGAIN/EINTR retries
  double read_seconds = 0, write_seconds = 0; // summed caller-level latency
  uint32_t max_inflight = 0;                  // deepest queue seen (block-level I/Os in one ring)
  uint64_t capacity = 0, used = 0;
  // Registered I/O, errors and checksums:
  uint64_t fixed_ios = 0;          // block-level I/Os that used a registered buffer
  uint64_t registered_bytes = 0;   // bytes currently registered for fixed-buffer I/O
  uint64_t errors = 0;             // caller-level transfers that ended with an error
  uint64_t checksum_failures = 0;  // blocks whose checksum did not match on read
  bool fixed_files = false;        // the rings use registered files
  bool fixed_buffers = false;      // the rings accept registered buffers (RegisterBuffer)
};

using IoCallback = std::function<void(Status)>;

class NvmeTier {
 public:
  // InvalidArgument for bad options; NotFound for a missing directory; IoError
  // (EACCES/EROFS) naming a directory that is not writable; Unavailable
  // (with errno) when io_uring cannot be set up or O_DIRECT is refused.
  static Result<std::unique_ptr<NvmeTier>> Open(const NvmeOptions& options);
  ~NvmeTier();  // waits for in-flight I/O, closes and removes the files
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // OutOfMemory (tier nvme) when the capacity is short; IoError (ENOSPC ...)
  // naming the file and the offset it was to grow from when no file can grow
  // (each directory is tried, least used first). `bytes` is rounded up to
  // 4096. Free of an extent not allocated here is logged and ignored.
  Result<Extent> Allocate(uint64_t bytes);
  void Free(const Extent& e);

  // Asynchronous transfer of `bytes` at `offset` within extent `e`
  // (offset + bytes <= e.bytes; offset, bytes and the buffer 4096-aligned).
  // `done` runs exactly once, on an I/O thread, with the final status.
  void Write(const Extent& e, uint64_t offset, const void* src, uint64_t bytes, IoCallback done);
  void Read(const Extent& e, uint64_t offset, void* dst, uint64_t bytes, IoCallback done);
  // Blocking forms of the above (FailedPrecondition on an I/O thread).
  Status WriteSync(const Extent& e, uint64_t offset, const void* src, uint64_t bytes);
  Status ReadSync(const Extent& e, uint64_t offset, void* dst, uint64_t bytes);

  // Registers [base, base+bytes) for fixed-buffer I/O; transfers whose buffer
  // lies inside a registered range use IORING_OP_{READ,WRITE}_FIXED.
  // InvalidArgument for an empty range or one overlapping a registered one.
  // When the kernel refuses (no sparse buffer table before Linux 5.19,
  // RLIMIT_MEMLOCK too low to pin it, all 64 slots used) the reason is logged
  // and the range is still accepted: its transfers use unregistered I/O
  // (stats().registered_bytes says what the kernel took).
  Status RegisterBuffer(void* base, uint64_t bytes);
  void UnregisterBuffer(void* base);  // `base` as registered

  const std::vector<std::string>& files() const;
  // Each swap file is still the file at its path: IoError naming the file
  // when one was deleted (ENOENT; the tier's descriptor keeps its data alive
  // until the tier closes it, so I/O would still work — but the data would
  // vanish with the process, and whoever deleted it wanted the space) or
  // when its path was taken by another file. Two syscalls per file, no I/O.
  // The destructor removes only files that pass this check.
  Status CheckFiles() const;
  bool direct_io() const;  // false only with buffered_fallback on a file system that refused O_DIRECT
  NvmeStats stats() const;

 private:
  NvmeTier() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
