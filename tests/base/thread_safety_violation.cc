// SPDX-License-Identifier: Apache-2.0
// Breaks the lock rules on purpose: scripts/check_thread_safety.sh expects
// clang's analysis to reject it (a guarded field read without its mutex, a
// REQUIRES function called without it). Not built into any target.
#include "base/mutex.h"

namespace strata {

class Counter {
 public:
  int Read() const { return n_; }  // no lock held
  void Bump() {
    Add(1);  // REQUIRES(mu_), not held
  }

 private:
  void Add(int k) REQUIRES(mu_) { n_ += k; }
  mutable Mutex mu_;
  int n_ GUARDED_BY(mu_) = 0;
};

int Use() {
  Counter c;
  c.Bump();
  return c.Read();
}

}  // namespace strata
