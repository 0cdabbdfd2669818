// SPDX-License-Identifier: Apache-2.0
#include "engine/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "base/clock.h"

namespace strata {

namespace {

// The self-pipe the handlers write each signal's number into (the loop reads it).
int g_signal_pipe[2] = {-1, -1};
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe[1] >= 0) (void)!::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

// The handlers while Run runs; the previous ones back on destruction.
class SignalScope {
 public:
  SignalScope() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) g_signal_pipe[0] = g_signal_pipe[1] = -1;
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    for (int& fd : g_signal_pipe) {
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
  }
  int fd() const { return g_signal_pipe[0]; }

 private:
  struct sigaction old_[std::size(kSignals)] {};
};

// One stream of a child: its pipe and the line not yet complete.
struct Stream {
  int fd = -1;
  std::string partial;
};

struct Child {
  const ChildSpec* spec = nullptr;
  pid_t pid = -1;
  Stream out, err;
  bool ended = false;
  int status = 0;
  double ended_at = 0;
};

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// mpirun --tag-output prefixes every chunk it forwards with "[J,R]<stderr>:"
// (or <stdout>), at a line's start or, when a rank wrote part of a line,
// in its middle. One line from mpirun's pipe -> its (rank, text) pieces;
// rank -1 for text of mpirun's own.
std::vector<std::pair<int, std::string>> MpirunPieces(const std::string& line) {
  std::vector<std::pair<int, std::string>> pieces;
  int rank = -1;
  size_t text_from = 0;
  auto tag_at = [&](size_t p, int* r, size_t* end) {  // "[digits,digits]<std...>:" at p
    if (line[p] != '[') return false;
    size_t q = p + 1;
    while (q < line.size() && std::isdigit(static_cast<unsigned char>(line[q]))) ++q;
    if (q == p + 1 || q >= line.size() || line[q] != ',') return false;
    const size_t rank_from = ++q;
    while (q < line.size() && std::isdigit(static_cast<unsigned char>(line[q]))) ++q;
    if (q == rank_from || line.compare(q, 5, "]<std") != 0) return false;
    const size_t close = line.find(">:", q);
    if (close == std::string::npos || close > q + 12) return false;
    *r = std::atoi(line.c_str() + rank_from);
    *end = close + 2;
    return true;
  };
  for (size_t p = 0; p < line.size(); ++p) {
    int r = 0;
    size_t end = 0;
    if (!tag_at(p, &r, &end)) continue;
    if (p > text_from || rank >= 0) pieces.push_back({rank, line.substr(text_from, p - text_from)});
    rank = r;
    text_from = end;
    p = end - 1;
  }
  pieces.push_back({rank, line.substr(text_from)});
  // (A leading empty piece of mpirun's own is no piece.)
  if (pieces.size() > 1 && pieces.front().first < 0 && pieces.front().second.empty()) pieces.erase(pieces.begin());
  return pieces;
}

// What mpirun says of the first rank it saw fail (Open MPI 4's messages).
struct MpirunVerdict {
  int pending_rank = -1;  // "Process name: [[J,1],R]" seen, its "Exit code:" next
  int rank = -1;
  std::string what;
  void See(const std::string& line) {
    if (rank >= 0) return;
    if (size_t p = line.find("Process name: [["); p != std::string::npos) {
      const size_t comma = line.find("],", p);
      if (comma != std::string::npos) pending_rank = std::atoi(line.c_str() + comma + 2);
      return;
    }
    if (size_t p = line.find("Exit code:"); p != std::string::npos && pending_rank >= 0) {
      rank = pending_rank;
      what = "exit status " + std::to_string(std::atoi(line.c_str() + p + 10));
      return;
    }
    if (size_t p = line.find("noticed that process rank "); p != std::string::npos) {
      const int r = std::atoi(line.c_str() + p + 26);
      const size_t sig = line.find("exited on signal ");
      if (sig != std::string::npos) {
        rank = r;
        std::string s = line.substr(sig + 17);
        while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();
        what = "signal " + s;
      }
    }
  }
};

}  // namespace

std::string WaitStatusText(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int s = WTERMSIG(status);
    return "signal " + std::to_string(s) + " (" + strsignal(s) + ")";
  }
  return "wait status " + std::to_string(status);
}

GroupResult ProcessGroup::Run(const std::vector<ChildSpec>& specs, std::ostream& out, std::ostream& err) {
  SignalScope signals;
  std::vector<Child> children(specs.size());
  std::map<std::string, std::deque<std::string>> tails;
  MpirunVerdict verdict;

  // ---- start ----
  for (size_t i = 0; i < specs.size(); ++i) {
    Child& c = children[i];
    c.spec = &specs[i];
    int po[2], pe[2];
    if (::pipe2(po, O_CLOEXEC) != 0 || ::pipe2(pe, O_CLOEXEC) != 0) {
      err << "strata: cannot make the pipes for " << c.spec->label << ": " << std::strerror(errno) << "\n";
      c.ended = true;
      c.status = 127 << 8;
      continue;
    }
    std::vector<char*> argv;
    for (const std::string& a : c.spec->argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    out.flush();
    err.flush();
    const pid_t pid = ::fork();
    if (pid == 0) {  // the child: one thread, until exec
      ::setpgid(0, 0);
      for (int s : kSignals) ::signal(s, SIG_DFL);
      ::signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(po[1], STDOUT_FILENO);
      ::dup2(pe[1], STDERR_FILENO);
      for (const auto& [k, v] : c.spec->env) ::setenv(k.c_str(), v.c_str(), 1);
      if (c.spec->prepare) {
        const std::string w = c.spec->prepare();
        if (!w.empty()) (void)!::write(STDERR_FILENO, (w + "\n").data(), w.size() + 1);
      }
      ::execvp(argv[0], argv.data());
      const std::string m = "cannot run " + c.spec->argv[0] + ": " + std::strerror(errno) + "\n";
      (void)!::write(STDERR_FILENO, m.data(), m.size());
      ::_exit(127);
    }
    ::close(po[1]);
    ::close(pe[1]);
    if (pid < 0) {
      err << "strata: cannot start " << c.spec->label << ": fork: " << std::strerror(errno) << "\n";
      ::close(po[0]);
      ::close(pe[0]);
      c.ended = true;
      c.status = 127 << 8;
      continue;
    }
    ::setpgid(pid, pid);  // (also in the child: whichever runs first)
    c.pid = pid;
    c.out.fd = po[0];
    c.err.fd = pe[0];
  }

  // ---- watch ----
  int stop_signal = 0;         // a signal the launcher was sent and passed on
  std::optional<size_t> failed;
  double kill_at = 0;          // after a failure: when the others get SIGKILL
  double drain_until = 0;      // once every child ended: how long pipes may stay open
  // A whole line of `label` on `c`'s stdout or stderr.
  auto emit = [&](Child& c, bool is_err, const std::string& label, const std::string& text) {
    if (c.spec->mpirun_tagged && label == c.spec->label && is_err) verdict.See(text);
    if (!is_err) {
      out << text << "\n";
      out.flush();
      return;
    }
    err << "[" << label << "] " << text << "\n";
    err.flush();
    std::deque<std::string>& t = tails[label];
    t.push_back(text);
    if (t.size() > static_cast<size_t>(kTailLines)) t.pop_front();
  };
  // mpirun's ranks' partial lines, by stream and rank.
  std::map<std::pair<bool, int>, std::string> rank_partial;
  auto line_of = [&](Child& c, bool is_err, const std::string& line) {
    if (!c.spec->mpirun_tagged) return emit(c, is_err, c.spec->label, line);
    const auto pieces = MpirunPieces(line);
    for (size_t k = 0; k < pieces.size(); ++k) {
      const auto& [rank, text] = pieces[k];
      std::string& partial = rank_partial[{is_err, rank}];
      partial += text;
      if (k + 1 < pieces.size()) continue;  // (the line's newline ends only its last piece)
      emit(c, is_err, rank < 0 ? c.spec->label : "rank " + std::to_string(rank), partial);
      partial.clear();
    }
  };
  auto read_stream = [&](Child& c, Stream& s, bool is_err) {
    char buf[65536];
    const ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      if (!s.partial.empty()) line_of(c, is_err, s.partial);
      s.partial.clear();
      ::close(s.fd);
      s.fd = -1;
      return;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
      line_of(c, is_err, s.partial.substr(start, nl - start));
    s.partial.erase(0, start);
  };
  auto signal_others = [&](int sig, bool group) {
    for (Child& c : children)
      if (!c.ended && c.pid > 0) ::kill(group ? -c.pid : c.pid, sig);
  };
  auto reap = [&] {
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.ended || c.pid <= 0) continue;
      int st = 0;
      const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
      if (r != c.pid) continue;
      c.ended = true;
      c.status = st;
      c.ended_at = NowSeconds();
      if (st != 0 && !failed && stop_signal == 0) {
        failed = i;
        signal_others(SIGTERM, false);
        kill_at = NowSeconds() + grace_s_;
      }
    }
  };
  for (;;) {
    reap();
    bool all_ended = true, pipes_open = false;
    for (const Child& c : children) {
      all_ended = all_ended && c.ended;
      pipes_open = pipes_open || c.out.fd >= 0 || c.err.fd >= 0;
    }
    if (all_ended && !pipes_open) break;
    const double now = NowSeconds();
    if (all_ended && drain_until == 0) drain_until = now + 2;  // a grandchild may hold a pipe
    if (all_ended && now > drain_until) break;
    if (kill_at > 0 && now >= kill_at) {
      signal_others(SIGKILL, true);
      kill_at = 0;
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> who;
    fds.push_back({signals.fd(), POLLIN, 0});
    who.push_back({nullptr, false});
    for (Child& c : children) {
      if (c.out.fd >= 0) fds.push_back({c.out.fd, POLLIN, 0}), who.push_back({&c, false});
      if (c.err.fd >= 0) fds.push_back({c.err.fd, POLLIN, 0}), who.push_back({&c, true});
    }
    // (Wake at least every 100 ms: a SIGCHLD that came before poll started is still reaped.)
    const int r = ::poll(fds.data(), fds.size(), 100);
    if (r < 0 && errno != EINTR) break;
    for (size_t k = 0; r > 0 && k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (who[k].first == nullptr) {
        unsigned char sig[64];
        const ssize_t n = ::read(fds[k].fd, sig, sizeof sig);
        for (ssize_t j = 0; j < n; ++j) {
          if (sig[j] == SIGCHLD) continue;  // (reaped at the top of the loop)
          if (stop_signal == 0) stop_signal = sig[j];
          err << "strata: " << strsignal(sig[j]) << ": passing it on to the ranks\n";
          for (Child& c : children)
            if (!c.ended && c.pid > 0) ::kill(c.pid, c.spec->stop_as ? c.spec->stop_as : sig[j]);
        }
        continue;
      }
      Child& c = *who[k].first;
      read_stream(c, who[k].second ? c.err : c.out, who[k].second);
    }
  }
  for (Child& c : children)  // the ranks' unfinished lines under mpirun
    if (c.spec->mpirun_tagged)
      for (auto& [key, text] : rank_partial)
        if (!text.empty())
          emit(c, key.first, key.second < 0 ? c.spec->label : "rank " + std::to_string(key.second), text);
  for (Child& c : children) {
    for (Stream* s : {&c.out, &c.err})
      if (s->fd >= 0) ::close(s->fd), s->fd = -1;
    if (!c.ended && c.pid > 0) {  // (the drain gave up: the child is gone, its grandchildren not)
      int st = 0;
      ::waitpid(c.pid, &st, 0);
      c.ended = true;
      c.status = st;
    }
  }

  // ---- report ----
  GroupResult res;
  std::string rep;
  auto tail_of = [&](const std::string& label) {
    std::string s;
    auto it = tails.find(label);
    if (it == tails.end() || it->second.empty()) return "strata: " + label + " wrote nothing on stderr\n";
    s = "strata: " + label + "'s last " + std::to_string(it->second.size()) + " lines of stderr:\n";
    for (const std::string& l : it->second) s += "  [" + label + "] " + l + "\n";
    return s;
  };
  if (failed) {
    const Child& f = children[*failed];
    res.exit_code = ExitCode(f.status);
    if (f.spec->mpirun_tagged && verdict.rank >= 0) {
      res.failed = "rank " + std::to_string(verdict.rank);
      rep += "strata: " + res.failed + " failed first: " + verdict.what + " (as mpirun reports it)\n";
      rep += tail_of(res.failed);
      rep += "strata: mpirun then stopped the job and ended with " + WaitStatusText(f.status) + "\n";
    } else {
      res.failed = f.spec->label;
      rep += "strata: " + res.failed + " failed first: " + WaitStatusText(f.status) + "\n";
      rep += tail_of(res.failed);
      for (const Child& c : children) {
        if (&c == &f) continue;
        rep += "strata: " + c.spec->label + " then ended with " + WaitStatusText(c.status) +
               (c.ended_at > 0 && c.ended_at >= f.ended_at ? " (stopped by the launcher)" : "") + "\n";
      }
    }
  } else if (stop_signal != 0) {
    // The stop's code (as strata train's own: 128 + the signal), whatever the
    // children were sent (mpirun's ranks: SIGUSR1); 0 when all finished anyway.
    for (const Child& c : children)
      if (c.status != 0) res.exit_code = 128 + stop_signal;
    rep += std::string("strata: stopped by ") + strsignal(stop_signal) + ": ";
    for (size_t i = 0; i < children.size(); ++i)
      rep += (i ? ", " : "") + children[i].spec->label + " ended with " + WaitStatusText(children[i].status);
    rep += "\n";
  }
  err << rep;
  err.flush();
  res.report = rep;
  return res;
}

}  // namespace strata
