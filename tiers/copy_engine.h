// SPDX-License-Identifier: Apache-2.0
// CopyEngine: asynchronous host<->device copies over PCIe.
//
// - Two dedicated non-blocking CUDA streams, one per direction, so an H2D
//   and a D2H run at the same time on the GPU's two copy engines and beside
//   compute (which runs on the caller's streams).
// - Copies are split into `chunk_bytes` pieces (default 8 MiB). Each copy
//   ends with an event; a CopyTicket waits on it (Wait), polls it (Poll), or
//   makes another stream wait for it without blocking the host (StreamWait).
// - Pinned host memory (HostTier blocks, cudaHostAlloc/Register'd buffers)
//   is copied directly. Pageable host memory goes through the engine's own
//   pinned staging buffers (double-buffered, per direction) on a worker
//   thread: the CPU fills buffer i+1 while the GPU copies buffer i. kAuto
//   asks CUDA which kind a pointer is (cudaPointerGetAttributes).
// - A copy can be ordered after other GPU work: CopyAfter names a stream
//   (everything queued on it when the copy is submitted) and/or events; the
//   copy stream waits for them on the GPU (cudaStreamWaitEvent), the host
//   does not block.
// - Stand-in mode (no usable GPU, a build without CUDA, or `stand_in`): the
//   "device" is host memory and each direction has a worker thread that
//   copies with memcpy; tickets have the same asynchronous semantics
//   (Submit returns at once, Wait/Poll report completion). CopyAfter must be
//   empty there (there are no streams).
//
// Ownership: the engine owns its streams, staging buffers and threads; its
// destructor waits for every submitted copy. Source and destination memory
// belong to the caller and must stay valid until the ticket completes.
// Tickets may outlive the engine (they then report what they knew).
//
// Thread-safety: all methods are thread-safe; copies submitted from several
// threads to one direction are queued in submission order.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "base/bytes.h"
#include "base/status.h"

namespace strata {

enum class CopyDirection : uint8_t { kHostToDevice = 0, kDeviceToHost = 1 };

// What the host side of a copy is.
enum class HostMemory : uint8_t {
  kAuto,      // ask CUDA (cudaPointerGetAttributes, ~1 us)
  kPinned,    // page-locked: copied directly
  kPageable,  // ordinary memory: copied through staging buffers
};

struct CopyEngineOptions {
  int device = 0;
  bool stand_in = false;            // memcpy on worker threads even when a GPU is usable
  uint64_t chunk_bytes = 8 * kMiB;  // a copy is issued in pieces of this size
  uint64_t staging_bytes = 8 * kMiB;  // each pinned staging buffer (pageable copies)
  int staging_buffers = 2;          // per direction, >= 2 for double buffering
};

// GPU work a copy must wait for. Handles are cudaStream_t / cudaEvent_t.
struct CopyAfter {
  void* stream = nullptr;            // all work queued on this stream at submission
  std::span<void* const> events{};   // and these events (null entries are ignored)
};

namespace detail {
struct CopyState;
}

// The handle of one submitted copy. Copyable (all copies share the state).
// A default-constructed ticket is complete and OK.
class CopyTicket {
 public:
  CopyTicket() = default;  // no copy: Wait and StreamWait return OK at once
  // Whether it stands for a copy.
  bool valid() const { return state_ != nullptr; }
  // Blocks until the copy has landed; returns its status.
  Status Wait() const;
  // True when the copy has landed; an error if it failed.
  Result<bool> Poll() const;
  // Makes `stream` wait on the GPU for this copy (the host waits only until
  // the copy is fully submitted). In the stand-in: Wait().
  Status StreamWait(void* stream) const;

 private:
  friend class CopyEngine;
  explicit CopyTicket(std::shared_ptr<detail::CopyState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::CopyState> state_;
};

struct CopyDirectionStats {
  uint64_t copies = 0;         // submitted
  uint64_t bytes = 0;
  uint64_t chunks = 0;         // pieces issued to the GPU (or memcpy'd)
  uint64_t staged_copies = 0;  // copies of pageable memory through staging
  uint64_t staged_bytes = 0;
  uint64_t failures = 0;
};

struct CopyEngineStats {
  CopyDirectionStats h2d, d2h;
};

class CopyEngine {
 public:
  static Result<std::unique_ptr<CopyEngine>> Create(const CopyEngineOptions& options);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // dst (device) <- src (host), `bytes` bytes. Returns at once.
  // InvalidArgument for null pointers with bytes > 0 and for CopyAfter in
  // the stand-in; CUDA errors of the submission itself.
  Result<CopyTicket> HostToDevice(void* dst, const void* src, uint64_t bytes, const CopyAfter& after = {},
                                  HostMemory host = HostMemory::kAuto);
  // dst (host) <- src (device).
  Result<CopyTicket> DeviceToHost(void* dst, const void* src, uint64_t bytes, const CopyAfter& after = {},
                                  HostMemory host = HostMemory::kAuto);
  Result<CopyTicket> Copy(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                          const CopyAfter& after = {}, HostMemory host = HostMemory::kAuto);

  bool stand_in() const;
  int device() const;
  // cudaStream_t of a direction (nullptr in the stand-in).
  void* stream(CopyDirection dir) const;
  // Waits for every copy submitted so far; the first error among them.
  Status Drain();
  CopyEngineStats stats() const;
  // "cuda:0 (2 copy streams, 8 MiB chunks)" or "stand-in (memcpy ...)".
  std::string description() const;

 private:
  CopyEngine() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
