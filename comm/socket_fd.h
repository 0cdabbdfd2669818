// SPDX-License-Identifier: Apache-2.0
// A TCP socket: the file descriptor, closed at destruction (move-only), and
// whole-buffer send and receive bounded by a deadline (comm/
// tcp_rendezvous.h's only transport).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "base/status.h"

namespace strata::comm {

class SocketFd {
 public:
  SocketFd() = default;
  explicit SocketFd(int fd) : fd_(fd) {}
  ~SocketFd() { Close(); }
  SocketFd(SocketFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  SocketFd& operator=(SocketFd&& o) noexcept {
    if (this != &o) {
      Close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  SocketFd(const SocketFd&) = delete;
  SocketFd& operator=(const SocketFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close();

  // All `n` bytes, or IoError naming `peer` (a broken connection included).
  Status SendAll(const void* data, size_t n, const std::string& peer) const;
  // All `n` bytes before `deadline` (NowSeconds()); kUnavailable naming
  // `peer` when it passes or the peer closes first.
  Status RecvAll(void* data, size_t n, double deadline, const std::string& peer) const;

 private:
  int fd_ = -1;
};

// Waits until `fd` is readable or `deadline` passes: true when readable.
Result<bool> WaitReadable(int fd, double deadline);

}  // namespace strata::comm
