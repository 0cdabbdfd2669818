// SPDX-License-Identifier: Apache-2.0
// Trace: an optional timeline of a run, written as Chrome trace-event JSON
// (the format chrome://tracing and Perfetto's ui.perfetto.dev open), so a
// user can see what overlapped with what: the step's passes, each optimizer
// shard's update, each tensor's move between tiers, each wait.
//
//   recording  off until Start; then every Span and Complete call on any
//              thread adds one "X" (complete) event on its thread's track,
//              the time in microseconds since Start on the steady clock
//              (base/clock.h). Off, a span costs one relaxed atomic load.
//   tracks     one per thread, numbered in the order threads first record;
//              NameThread names the calling thread's ("step", "optimizer
//              (cpu)", "store mover", ...), written as thread_name metadata.
//   memory     events are kept in memory until Stop writes them; past
//              kMaxEvents (about 200 MB) further events are counted, not
//              kept, and the file says how many were dropped.
//   file       Stop writes it whole (a temporary file beside it, renamed
//              into place), so a reader never sees half a trace; Start
//              checks the path can be written before anything runs.
//
// One recording per process at a time (the trainer's --trace FILE).
// Thread-safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "base/clock.h"
#include "base/status.h"

namespace strata::trace {

inline constexpr uint64_t kMaxEvents = 2'000'000;

// Whether a trace file can be created at `path`, without leaving one
// behind: the errno of creating it when it cannot be.
Status CheckPath(const std::string& path);
// Starts recording into `path` (written at Stop). InvalidArgument when a
// recording runs already; CheckPath's error when the file cannot be made.
Status Start(const std::string& path);
// Stops recording and writes the file; OK and nothing written when none ran.
Status Stop();

// A recording as a value: Start at Begin, Stop at Finish (its error), or at
// destruction (its error then on stderr). Move-only; empty when default-made.
class Recording {
 public:
  Recording() = default;
  static Result<Recording> Begin(const std::string& path);
  Status Finish();
  ~Recording();
  Recording(Recording&& o) noexcept : active_(o.active_), path_(std::move(o.path_)) { o.active_ = false; }
  Recording& operator=(Recording&& o) noexcept;
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;
  bool active() const { return active_; }
  const std::string& path() const { return path_; }

 private:
  bool active_ = false;
  std::string path_;
};

namespace internal {
extern std::atomic<bool> g_on;
}
inline bool On() { return internal::g_on.load(std::memory_order_relaxed); }

// One event on the calling thread's track: `name` in category `cat` from
// `begin_s` to `end_s` (NowSeconds values).
void Complete(std::string_view cat, std::string_view name, double begin_s, double end_s);
// Names the calling thread's track (kept for the rest of the recording).
void NameThread(std::string_view name);

// A Complete event from construction to destruction, when recording.
class Span {
 public:
  Span(std::string_view cat, std::string_view name) {
    if (On()) {
      cat_ = cat;
      name_ = name;
      begin_ = NowSeconds();
    }
  }
  // The name built only when recording (a shard's or tensor's name).
  template <typename MakeName>
    requires std::is_invocable_r_v<std::string, MakeName&>
  Span(std::string_view cat, MakeName&& make) {
    if (On()) {
      cat_ = cat;
      name_ = make();
      begin_ = NowSeconds();
    }
  }
  ~Span() {
    if (begin_ >= 0) Complete(cat_, name_, begin_, NowSeconds());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  std::string cat_, name_;
  double begin_ = -1;
};

}  // namespace strata::trace
