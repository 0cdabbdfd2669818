// SPDX-License-Identifier: Apache-2.0
#include "comm/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "comm/communicator.h"
#include "comm/socket_fd.h"

namespace strata::comm {

namespace {

constexpr uint32_t kMagic = 0x53545241;  // "STRA": a strata rank, not some other client
// A rank's hello: magic, rank, world size. Rank 0's reply: status (0 ok,
// 1 error), length, then the blob or the error's text.
struct Hello {
  uint32_t magic, rank, world;
};
struct ReplyHead {
  uint32_t status, length;
};

std::string Where(const RankEnv& e) { return e.master_addr + ":" + std::to_string(e.master_port); }

Status Reply(const SocketFd& fd, uint32_t status, const std::string& body, const std::string& peer) {
  const ReplyHead h{status, static_cast<uint32_t>(body.size())};
  RETURN_IF_ERROR(fd.SendAll(&h, sizeof h, peer));
  return fd.SendAll(body.data(), body.size(), peer);
}

Result<SocketFd> Listen(const RankEnv& e) {
  SocketFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket");
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(e.master_port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return ErrnoStatus("bind to port " + std::to_string(e.master_port) + " (MASTER_PORT) on rank 0");
  if (::listen(fd.get(), e.world_size) != 0) return ErrnoStatus("listen on port " + std::to_string(e.master_port));
  return fd;
}

// Rank 0: every other rank's connection by rank, or the error sent to those
// that came when some did not.
Result<std::string> Serve(const RankEnv& e, const std::string& blob, double timeout_s) {
  ASSIGN_OR_RETURN(SocketFd listener, Listen(e));
  const double deadline = NowSeconds() + timeout_s;
  std::vector<SocketFd> peers(e.world_size);
  int arrived = 1;
  while (arrived < e.world_size) {
    ASSIGN_OR_RETURN(const bool ready, WaitReadable(listener.get(), deadline));
    if (!ready) break;
    SocketFd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) continue;  // the client gave up meanwhile
    Hello h{};
    if (!c.RecvAll(&h, sizeof h, std::min(deadline, NowSeconds() + 5), "a connecting rank").ok() ||
        h.magic != kMagic)
      continue;  // not a strata rank: ignore it
    if (h.world != static_cast<uint32_t>(e.world_size) || h.rank == 0 || h.rank >= h.world || peers[h.rank].valid()) {
      const std::string why = "rank " + std::to_string(h.rank) + " of " + std::to_string(h.world) +
                              " does not fit rank 0's job of " + std::to_string(e.world_size) +
                              " ranks (a second job on MASTER_PORT " + std::to_string(e.master_port) + "?)";
      (void)Reply(c, 1, why, "rank " + std::to_string(h.rank));
      continue;
    }
    peers[h.rank] = std::move(c);
    ++arrived;
  }
  if (arrived < e.world_size) {
    std::string missing;
    for (int r = 1; r < e.world_size; ++r)
      if (!peers[r].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    const std::string why = "rendezvous at " + Where(e) + ": rank(s) " + missing + " of " +
                            std::to_string(e.world_size) + " did not arrive within " + SecondsText(timeout_s) +
                            " (not started, crashed, or started with another MASTER_ADDR/MASTER_PORT)";
    for (int r = 1; r < e.world_size; ++r)
      if (peers[r].valid()) (void)Reply(peers[r], 1, why, "rank " + std::to_string(r));
    return Unavailable(why);
  }
  for (int r = 1; r < e.world_size; ++r) RETURN_IF_ERROR(Reply(peers[r], 0, blob, "rank " + std::to_string(r)));
  return blob;
}

// Another rank: connects (retrying while rank 0 is not listening yet).
Result<SocketFd> Connect(const RankEnv& e, double deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(e.master_port);
  if (int rc = ::getaddrinfo(e.master_addr.c_str(), port.c_str(), &hints, &res); rc != 0)
    return InvalidArgument("MASTER_ADDR " + e.master_addr + " does not resolve: " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(res, &::freeaddrinfo);
  int last_errno = 0;
  while (NowSeconds() < deadline) {
    SocketFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus("socket");
    if (::connect(fd.get(), res->ai_addr, res->ai_addrlen) == 0) return fd;
    last_errno = errno;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Unavailable("rank " + std::to_string(e.rank) + " could not reach rank 0 at " + Where(e) + " (MASTER_ADDR:" +
                     "MASTER_PORT) within the timeout: " + std::strerror(last_errno));
}

Result<std::string> Join(const RankEnv& e, double timeout_s) {
  const double start = NowSeconds();
  ASSIGN_OR_RETURN(SocketFd fd, Connect(e, start + timeout_s));
  const std::string peer = "rank 0 at " + Where(e);
  const Hello h{kMagic, static_cast<uint32_t>(e.rank), static_cast<uint32_t>(e.world_size)};
  RETURN_IF_ERROR(fd.SendAll(&h, sizeof h, peer));
  // Rank 0 waits up to its own timeout from its own start: leave it time to
  // tell this rank which ranks are missing.
  const double deadline = start + 2 * timeout_s + 5;
  ReplyHead head{};
  RETURN_IF_ERROR(fd.RecvAll(&head, sizeof head, deadline, peer));
  std::string body(head.length, '\0');
  RETURN_IF_ERROR(fd.RecvAll(body.data(), body.size(), deadline, peer));
  if (head.status != 0) return Unavailable("rank " + std::to_string(e.rank) + ": " + body);
  return body;
}

}  // namespace

Result<std::string> ShareFromRankZero(const RankEnv& env, const std::string& blob, double timeout_s) {
  if (env.world_size == 1) return blob;
  return env.rank == 0 ? Serve(env, blob, timeout_s) : Join(env, timeout_s);
}

}  // namespace strata::comm
