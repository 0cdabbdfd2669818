// SPDX-License-Identifier: Apache-2.0
// FaultIoEnv: the one fault-injecting IoEnv (tiers/nvme/io_env.h) of the
// tests of every layer: the NVMe tier, the tier store, the prefetcher and
// the trainer.
//
// It forwards every call to a target IoEnv (the real OS unless given) until
// a rule fires. A rule is plain data:
//   site     which IoEnv call it watches (FaultSite);
//   filters  which calls of that site match: reads or writes, the I/O at one
//            file offset or from one on, only an I/O's first submission,
//            opens asking for some flags (O_DIRECT);
//   window   which matching calls fire: the (skip + 1)-th to the
//            (skip + times)-th (times -1: every one from there on);
//   action   what a firing call does instead (exactly one): return -error;
//            cut a block-level I/O before it is submitted (len_divisor,
//            len_cap: the kernel really transfers less); or report fewer
//            bytes than a completion moved (result_cap).
//
//   FaultIoEnv env;
//   env.Add({.site = FaultSite::kCompleteIo, .io = FaultIo::kRead, .offset = bad,
//            .times = 1, .error = EIO});                          // one read fails
//   env.Add({.site = FaultSite::kOpen, .open_flags = O_DIRECT, .error = EINVAL});
//   env.Add({.site = FaultSite::kPrepareIo, .times = 3, .error = EAGAIN});
//   env.Clear();                                                  // the fault is gone
//
// Every active rule counts each call that matches its site and filters,
// whether or not another rule fired on it; when several fire on one call,
// the one added first acts. A rule that cannot act where it watches (an
// action or filter of another site, no action, times 0) is a test failure
// at Add. calls(site) counts every call of a site the env saw since it was
// made; fired(id) how often a rule acted.
//
// Ownership: the target is not owned and outlives the env; the env outlives
// whatever it is given to (NvmeOptions::env, TrainOptions::nvme_env).
//
// Thread-safety: all methods may be called from any thread, and rules may be
// added or cleared while the tier's I/O threads run (the per-I/O hooks of
// different rings run concurrently): one mutex orders the rule decisions, so
// a window of `times` fires exactly that often across threads. The call
// counters are atomics (relaxed: counters).
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/bytes.h"
#include "base/thread_annotations.h"
#include "tiers/nvme/io_env.h"

namespace strata::testing {

// The IoEnv calls a rule can watch.
enum class FaultSite : uint8_t {
  kOpen,           // IoEnv::Open (the swap files)
  kFallocate,      // IoEnv::Fallocate (growing a swap file)
  kRingInit,       // IoEnv::RingInit (io_uring_queue_init)
  kSubmitAndWait,  // IoEnv::SubmitAndWait (io_uring_enter on a ring's thread)
  kUpdateBuffers,  // IoEnv::UpdateBuffers that fill a slot (emptying one is the
                   // tier's clean-up: it is always forwarded, though counted)
  kPrepareIo,      // IoEnv::PrepareIo: a block-level I/O before it is submitted
  kCompleteIo,     // IoEnv::CompleteIo: a block-level I/O's result
};
constexpr size_t kFaultSites = 7;

inline const char* FaultSiteName(FaultSite s) {
  static constexpr const char* kNames[kFaultSites] = {
      "Open", "Fallocate", "RingInit", "SubmitAndWait", "UpdateBuffers", "PrepareIo", "CompleteIo"};
  return kNames[static_cast<size_t>(s)];
}

enum class FaultIo : uint8_t { kAny, kRead, kWrite };

struct FaultRule {
  FaultSite site = FaultSite::kCompleteIo;
  // ---- Filters (kPrepareIo and kCompleteIo, except open_flags)
  FaultIo io = FaultIo::kAny;                      // reads, writes, or both
  std::optional<uint64_t> offset = std::nullopt;  // only the I/O at this file offset
  uint64_t from_offset = 0;                       // only I/Os at or beyond this file offset
  bool first_attempt = false;  // only an I/O's first submission (IoOp::attempt 0)
  int open_flags = 0;          // kOpen: only opens whose flags hold all of these
  // ---- Window over the matching calls
  int skip = 0;    // let the first `skip` through
  int times = -1;  // then act this many times; -1: on every one
  // ---- Action (exactly one)
  int error = 0;             // the call returns -error (kCompleteIo: the result is -error)
  uint32_t len_divisor = 0;  // kPrepareIo: op.len above 4096 -> AlignUp(op.len / d, 4096)
  uint32_t len_cap = 0;      // kPrepareIo: op.len -> min(op.len, cap); a multiple of 4096
  uint32_t result_cap = 0;   // kCompleteIo: a result above it becomes it
};

class FaultIoEnv : public IoEnvWrapper {
 public:
  using RuleId = size_t;

  explicit FaultIoEnv(IoEnv* target = IoEnv::Default()) : IoEnvWrapper(target) {}

  // Adds a rule (active at once). A rule that cannot act is reported with
  // ADD_FAILURE and not added (its id then never fires).
  RuleId Add(const FaultRule& rule) {
    std::lock_guard<std::mutex> l(mu_);
    const RuleId id = rules_.size();
    const std::string problem = Problem(rule);
    rules_.push_back({rule, problem.empty()});
    if (!problem.empty()) {
      ADD_FAILURE() << "FaultIoEnv::Add: a " << FaultSiteName(rule.site) << " rule " << problem;
      return id;
    }
    active_.store(true, std::memory_order_release);
    return id;
  }
  // Deactivates every rule (their counts stay readable).
  void Clear() {
    std::lock_guard<std::mutex> l(mu_);
    for (Entry& e : rules_) e.active = false;
    active_.store(false, std::memory_order_release);
  }

  uint64_t calls(FaultSite site) const {
    return calls_[static_cast<size_t>(site)].load(std::memory_order_relaxed);
  }
  uint64_t fired(RuleId id) const {
    std::lock_guard<std::mutex> l(mu_);
    return id < rules_.size() ? rules_[id].fired : 0;
  }

  // ---- IoEnv
  int Open(const std::string& path, int flags, mode_t mode) override {
    if (auto r = Decide(FaultSite::kOpen, nullptr, flags)) return -r->error;
    return IoEnvWrapper::Open(path, flags, mode);
  }
  int Fallocate(int fd, int mode, uint64_t offset, uint64_t len) override {
    if (auto r = Decide(FaultSite::kFallocate)) return -r->error;
    return IoEnvWrapper::Fallocate(fd, mode, offset, len);
  }
  int RingInit(unsigned entries, io_uring* ring, unsigned flags) override {
    if (auto r = Decide(FaultSite::kRingInit)) return -r->error;
    return IoEnvWrapper::RingInit(entries, ring, flags);
  }
  int SubmitAndWait(io_uring* ring, unsigned wait_nr) override {
    if (auto r = Decide(FaultSite::kSubmitAndWait)) return -r->error;
    return IoEnvWrapper::SubmitAndWait(ring, wait_nr);
  }
  int UpdateBuffers(io_uring* ring, unsigned slot, const iovec* iovs, unsigned n) override {
    const bool fills = n > 0 && iovs[0].iov_len > 0;
    if (!fills) {
      Count(FaultSite::kUpdateBuffers);
    } else if (auto r = Decide(FaultSite::kUpdateBuffers)) {
      return -r->error;
    }
    return IoEnvWrapper::UpdateBuffers(ring, slot, iovs, n);
  }
  int PrepareIo(IoOp& op) override {
    if (auto r = Decide(FaultSite::kPrepareIo, &op)) {
      if (r->error) return -r->error;
      if (r->len_divisor && op.len > kPage)
        op.len = static_cast<uint32_t>(
            std::max<uint64_t>(kPage, AlignUp(op.len / r->len_divisor, kPage)));
      if (r->len_cap) op.len = std::min(op.len, r->len_cap);
    }
    return IoEnvWrapper::PrepareIo(op);
  }
  int32_t CompleteIo(const IoOp& op, int32_t res) override {
    res = IoEnvWrapper::CompleteIo(op, res);
    if (auto r = Decide(FaultSite::kCompleteIo, &op)) {
      if (r->error) return -r->error;
      if (r->result_cap && res > static_cast<int64_t>(r->result_cap))
        return static_cast<int32_t>(r->result_cap);
    }
    return res;
  }

 private:
  static constexpr uint32_t kPage = 4096;

  struct Entry {
    FaultRule rule;
    bool active = true;
    uint64_t matched = 0;  // calls that matched site and filters
    uint64_t fired = 0;    // calls it acted on
  };

  // Why `r` cannot act where it watches, or "" when it can.
  static std::string Problem(const FaultRule& r) {
    const bool io_site = r.site == FaultSite::kPrepareIo || r.site == FaultSite::kCompleteIo;
    const int actions = (r.error != 0) + (r.len_divisor != 0) + (r.len_cap != 0) +
                        (r.result_cap != 0);
    if (actions != 1) return "needs exactly one action (error, len_divisor, len_cap, result_cap)";
    if (r.error < 0) return "takes a positive errno";
    if ((r.len_divisor || r.len_cap) && r.site != FaultSite::kPrepareIo)
      return "cannot shorten an I/O: len_divisor and len_cap act at PrepareIo";
    if (r.len_divisor == 1) return "with len_divisor 1 changes nothing";
    if (r.len_cap % kPage != 0) return "needs a len_cap that is a multiple of 4096";
    if (r.result_cap && r.site != FaultSite::kCompleteIo)
      return "cannot cap a result: result_cap acts at CompleteIo";
    if (!io_site && (r.io != FaultIo::kAny || r.offset || r.from_offset || r.first_attempt))
      return "sees no I/O: io, offset, from_offset and first_attempt filter PrepareIo/CompleteIo";
    if (r.open_flags && r.site != FaultSite::kOpen) return "sees no open flags";
    if (r.skip < 0 || r.times == 0 || r.times < -1)
      return "has an empty window (skip >= 0; times > 0, or -1 for ever)";
    return {};
  }

  static bool Matches(const FaultRule& r, const IoOp* op, int open_flags) {
    if ((open_flags & r.open_flags) != r.open_flags) return false;
    if (op == nullptr) return true;
    if (r.io == FaultIo::kRead && op->write) return false;
    if (r.io == FaultIo::kWrite && !op->write) return false;
    if (r.offset && op->offset != *r.offset) return false;
    if (op->offset < r.from_offset) return false;
    return !r.first_attempt || op->attempt == 0;
  }

  void Count(FaultSite site) {
    calls_[static_cast<size_t>(site)].fetch_add(1, std::memory_order_relaxed);
  }

  // Counts the call; the rule that acts on it, if one does.
  std::optional<FaultRule> Decide(FaultSite site, const IoOp* op = nullptr, int open_flags = 0) {
    Count(site);
    if (!active_.load(std::memory_order_acquire)) return std::nullopt;  // no rule: no lock
    std::lock_guard<std::mutex> l(mu_);
    std::optional<FaultRule> acting;
    for (Entry& e : rules_) {
      if (!e.active || e.rule.site != site || !Matches(e.rule, op, open_flags)) continue;
      const uint64_t n = e.matched++;
      const uint64_t skip = static_cast<uint64_t>(e.rule.skip);
      const bool in_window =
          n >= skip && (e.rule.times < 0 || n < skip + static_cast<uint64_t>(e.rule.times));
      if (in_window && !acting) {
        acting = e.rule;
        ++e.fired;
      }
    }
    return acting;
  }

  mutable std::mutex mu_;
  std::vector<Entry> rules_ GUARDED_BY(mu_);  // never shrinks: ids stay valid
  // Some rule is active. Release/acquire: a hook that sees it set also sees
  // the rule (it then takes mu_ anyway); one that misses a rule being added
  // ran before the Add.
  std::atomic<bool> active_{false};
  std::array<std::atomic<uint64_t>, kFaultSites> calls_{};
};

}  // namespace strata::testing
