// SPDX-License-Identifier: Apache-2.0
#include "base/trace.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/mutex.h"
#include "base/thread_annotations.h"

namespace strata::trace {

namespace internal {
std::atomic<bool> g_on{false};
}

namespace {

struct Event {
  double begin, end;
  uint32_t track;
  std::string cat, name;
};

struct State {
  Mutex mu;
  std::string path GUARDED_BY(mu);
  double t0 GUARDED_BY(mu) = 0;
  std::vector<Event> events GUARDED_BY(mu);
  uint64_t dropped GUARDED_BY(mu) = 0;
  uint32_t next_track GUARDED_BY(mu) = 1;
  uint64_t generation GUARDED_BY(mu) = 0;  // a thread's track number is this recording's
  std::map<uint32_t, std::string> names GUARDED_BY(mu);
};

State& R() {
  static State r;
  return r;
}

thread_local uint32_t tls_track = 0;
thread_local uint64_t tls_generation = 0;

uint32_t TrackLocked(State& r) REQUIRES(r.mu) {
  if (tls_generation != r.generation || tls_track == 0) {
    tls_track = r.next_track++;
    tls_generation = r.generation;
  }
  return tls_track;
}

std::string Quote(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

Status WriteFile(const std::string& path, const std::string& tmp, double t0, const std::vector<Event>& events,
                 const std::map<uint32_t, std::string>& names, uint64_t dropped) {
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return IoError("cannot create the trace file", errno, tmp);
  const int pid = static_cast<int>(getpid());
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%llu},\"traceEvents\":[\n",
               static_cast<unsigned long long>(dropped));
  bool first = true;
  auto sep = [&] {
    if (!first) std::fputs(",\n", f);
    first = false;
  };
  for (const auto& [track, name] : names) {
    sep();
    std::fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%u,\"args\":{\"name\":%s}}", pid, track,
                 Quote(name).c_str());
  }
  for (const Event& e : events) {
    sep();
    const double ts = (e.begin - t0) * 1e6, dur = std::max(0.0, (e.end - e.begin) * 1e6);
    std::fprintf(f, "{\"ph\":\"X\",\"cat\":%s,\"name\":%s,\"pid\":%d,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f}",
                 Quote(e.cat).c_str(), Quote(e.name).c_str(), pid, e.track, ts, dur);
  }
  std::fputs("\n]}\n", f);
  const bool bad = std::ferror(f) != 0;
  const int err = errno;
  if (std::fclose(f) != 0 || bad) {
    std::remove(tmp.c_str());
    return IoError("writing the trace file failed", bad ? err : errno, tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    return IoError("renaming the trace file into place failed", e, path);
  }
  return Status::OK();
}

}  // namespace

Status CheckPath(const std::string& path) {
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return IoError("cannot create the trace file", errno, path);
  std::fclose(f);
  if (!existed) std::remove(path.c_str());  // (Stop writes it whole, or nothing is left)
  return Status::OK();
}

Status Start(const std::string& path) {
  State& r = R();
  MutexLock l(&r.mu);
  if (internal::g_on.load()) return InvalidArgument("a trace is being recorded already (into " + r.path + ")");
  RETURN_IF_ERROR(CheckPath(path));  // now, not after the run
  r.path = path;
  r.t0 = NowSeconds();
  r.events.clear();
  r.names.clear();
  r.dropped = 0;
  r.next_track = 1;
  ++r.generation;
  internal::g_on.store(true);
  return Status::OK();
}

Status Stop() {
  State& r = R();
  std::vector<Event> events;
  std::map<uint32_t, std::string> names;
  std::string path;
  double t0;
  uint64_t dropped;
  {
    MutexLock l(&r.mu);
    if (!internal::g_on.load()) return Status::OK();
    internal::g_on.store(false);
    events.swap(r.events);
    names.swap(r.names);
    path = r.path;
    t0 = r.t0;
    dropped = r.dropped;
  }
  return WriteFile(path, path + ".tmp." + std::to_string(getpid()), t0, events, names, dropped);
}

Result<Recording> Recording::Begin(const std::string& path) {
  RETURN_IF_ERROR(Start(path));
  Recording r;
  r.active_ = true;
  r.path_ = path;
  return r;
}

Status Recording::Finish() {
  if (!active_) return Status::OK();
  active_ = false;
  return Stop();
}

Recording::~Recording() {
  if (Status s = Finish(); !s.ok()) std::fprintf(stderr, "strata: the trace was not written: %s\n", s.ToString().c_str());
}

Recording& Recording::operator=(Recording&& o) noexcept {
  if (this != &o) {
    if (Status s = Finish(); !s.ok())
      std::fprintf(stderr, "strata: the trace was not written: %s\n", s.ToString().c_str());
    active_ = o.active_;
    path_ = std::move(o.path_);
    o.active_ = false;
  }
  return *this;
}

void Complete(std::string_view cat, std::string_view name, double begin_s, double end_s) {
  if (!On()) return;
  State& r = R();
  MutexLock l(&r.mu);
  if (!internal::g_on.load(std::memory_order_relaxed)) return;  // stopped meanwhile
  if (r.events.size() >= kMaxEvents) {
    ++r.dropped;
    return;
  }
  r.events.push_back(Event{begin_s, end_s, TrackLocked(r), std::string(cat), std::string(name)});
}

void NameThread(std::string_view name) {
  if (!On()) return;
  State& r = R();
  MutexLock l(&r.mu);
  if (!internal::g_on.load(std::memory_order_relaxed)) return;
  r.names[TrackLocked(r)] = std::string(name);
}

}  // namespace strata::trace
