// SPDX-License-Identifier: Apache-2.0
// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations (base/thread_annotations.h), so that
// GUARDED_BY / REQUIRES on code that uses them are checked, not comments
// (leveldb's port::Mutex and port::CondVar).
//
// Thread-safety: a Mutex is what makes other things thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace strata {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// A condition variable. Wait names the Mutex the caller holds (abseil's
// form), so that the analysis checks it is held: call it in a loop over the
// condition, which is then read with the mutex held
// (`while (!ready) cv.Wait(&mu);`).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;
  // Unlocks `mu`, waits for a signal (or a spurious wake-up), locks it again.
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu->mu_, std::adopt_lock);
    cv_.wait(lk);
    lk.release();  // still held: the caller unlocks
  }
  // Wait(mu), at most until `deadline` (steady clock); false when it passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu->mu_, std::adopt_lock);
    const bool signalled = cv_.wait_until(lk, deadline) == std::cv_status::no_timeout;
    lk.release();
    return signalled;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace strata
