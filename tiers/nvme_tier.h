// NvmeTier: tensor bytes in files on one or more NVMe (or other) directories.
//
// - One swap file per directory, opened with O_DIRECT; space is handed out as
//   4 KiB-aligned extents by an extent allocator (first fit over a free list
//   with coalescing); the files grow as needed (fallocate) up to the capacity.
//   Extents are placed on the least-used directory, so several directories
//   (several drives) share the load.
// - I/O goes through io_uring (liburing): registered files, registered
//   buffers where the caller registered them (the pinned host pool does),
//   batched submission, `queue_depth` I/Os in flight per ring, transfers split
//   into `block_size` pieces (DeepSpeed `aio` semantics). Every completion's
//   result is read: short transfers are re-queued for the rest, -EAGAIN and
//   -EINTR are retried, anything else becomes an IoError naming the file,
//   offset and errno.
// - When O_DIRECT is refused (tmpfs) Open fails with Unavailable saying so,
//   unless `buffered_fallback` is set; it never silently falls back.
// - Optional checksums per `checksum_block` of each extent (crc32c or
//   xxhash64) are kept in memory and verified on read: a corrupt or truncated
//   file is a DataLoss error naming the file and offset, never wrong data.
// - All OS access goes through an IoEnv (tiers/io_env.h): tests wrap it to
//   inject EIO, ENOSPC, short transfers, O_DIRECT refusal, deleted files.
//
// The files are scratch space for this process: made at Open, removed at
// destruction. Checkpoints are written elsewhere (engine/).
//
// Thread-safety: all methods may be called from any thread. Completion
// callbacks run on the tier's I/O threads and must not block on other I/O of
// this tier.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tiers/status.h"

namespace strata {

class IoEnv;

enum class ChecksumKind : uint8_t { kNone, kCrc32c, kXxh64 };

struct NvmeOptions {
  std::vector<std::string> dirs;        // at least one; each must exist and be writable
  uint64_t capacity_bytes = 0;          // budget over all files; 0 = no budget but the disk's
  uint32_t block_size = 1u << 20;       // largest single I/O (aio.block_size), multiple of 4096
  uint32_t queue_depth = 32;            // I/Os in flight per ring (aio.queue_depth)
  int rings = 1;                        // rings, one I/O thread each (aio.intra_op_parallelism)
  bool single_submit = false;           // aio.single_submit: one io_uring_submit per I/O
  bool overlap_events = true;           // aio.overlap_events: submit new I/O while reaping
  bool buffered_fallback = false;       // allow buffered I/O where O_DIRECT is refused
  ChecksumKind checksum = ChecksumKind::kNone;
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
  uint32_t max_inflight = 0;                  // deepest queue seen
  uint64_t capacity = 0, used = 0;
};

using IoCallback = std::function<void(Status)>;

class NvmeTier {
 public:
  static Result<std::unique_ptr<NvmeTier>> Open(const NvmeOptions& options);
  ~NvmeTier();  // waits for in-flight I/O, closes and removes the files
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // OutOfMemory (tier nvme) when the capacity is short; IoError (ENOSPC ...)
  // when a file cannot grow.
  Result<Extent> Allocate(uint64_t bytes);
  void Free(const Extent& e);

  // Asynchronous transfer of `bytes` at `offset` within extent `e`
  // (offset + bytes <= e.bytes; offset, bytes and the buffer 4096-aligned).
  // `done` runs exactly once, on an I/O thread, with the final status.
  void Write(const Extent& e, uint64_t offset, const void* src, uint64_t bytes, IoCallback done);
  void Read(const Extent& e, uint64_t offset, void* dst, uint64_t bytes, IoCallback done);
  // Blocking forms of the above.
  Status WriteSync(const Extent& e, uint64_t offset, const void* src, uint64_t bytes);
  Status ReadSync(const Extent& e, uint64_t offset, void* dst, uint64_t bytes);

  // Registers [base, base+bytes) for fixed-buffer I/O; transfers whose buffer
  // lies inside a registered range use IORING_OP_{READ,WRITE}_FIXED.
  Status RegisterBuffer(void* base, uint64_t bytes);
  void UnregisterBuffer(void* base);

  const std::vector<std::string>& files() const;
  bool direct_io() const;  // false only with buffered_fallback on a file system that refused O_DIRECT
  NvmeStats stats() const;

 private:
  NvmeTier() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
