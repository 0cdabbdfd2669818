// SPDX-License-Identifier: Apache-2.0
#include "comm/socket_fd.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "base/clock.h"

namespace strata::comm {

void SocketFd::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status SocketFd::SendAll(const void* data, size_t n, const std::string& peer) const {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return ErrnoStatus("send to " + peer);
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::OK();
}

Result<bool> WaitReadable(int fd, double deadline) {
  for (;;) {
    const double left = deadline - NowSeconds();
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int ms = static_cast<int>(std::min(std::ceil(left * 1000), 1e9));
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus("poll");
    if (r > 0) return true;
  }
}

Status SocketFd::RecvAll(void* data, size_t n, double deadline, const std::string& peer) const {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ASSIGN_OR_RETURN(const bool readable, WaitReadable(fd_, deadline));
    if (!readable) return Unavailable("no reply from " + peer + " in time (" + std::to_string(n) + " bytes missing)");
    const ssize_t k = ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return ErrnoStatus("recv from " + peer);
    if (k == 0) return Unavailable(peer + " closed the connection (" + std::to_string(n) + " bytes missing)");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::OK();
}

}  // namespace strata::comm
