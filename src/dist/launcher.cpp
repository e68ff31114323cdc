// fork + exec of the ranks, then a waitpid loop: the first failure ends the others.
#include "dist/launcher.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "dist/store.h"

extern char** environ;  // the launcher passes its environment on (execve)

namespace dsaserve::dist {

void LaunchSpec::validate() const {
  DSA_CHECK(world_size >= 1, "--tp must be >= 1, got {}", world_size);
  DSA_CHECK(nnodes >= 1, "--nnodes must be >= 1, got {}", nnodes);
  DSA_CHECK(node_rank >= 0 && node_rank < nnodes, "--node-rank must be in [0, --nnodes {}), got {}", nnodes,
            node_rank);
  DSA_CHECK(world_size % nnodes == 0, "--tp {} is not divisible by --nnodes {}", world_size, nnodes);
  DSA_CHECK(nnodes == 1 || !dist_init_addr.empty(), "--nnodes {} needs --dist-init-addr HOST:PORT (node 0's)",
            nnodes);
  if (!dist_init_addr.empty()) parse_host_port(dist_init_addr, "--dist-init-addr");
  DSA_CHECK(rank_env.empty() || int64_t(rank_env.size()) == ranks_per_node(),
            "launcher: {} rank environments for {} ranks on this node", rank_env.size(), ranks_per_node());
}

namespace {

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("stopped (status {})", status);
}

// The launcher's SIGTERM / SIGINT: a handler may only set these (the wait loop reads them).
volatile std::sig_atomic_t g_signals = 0;
volatile std::sig_atomic_t g_last_signal = 0;
extern "C" void on_launcher_signal(int sig) {
  g_last_signal = sig;
  g_signals = g_signals + 1;
}

// Installs the handler for the launcher's lifetime and restores the previous ones after.
class SignalGuard {
 public:
  SignalGuard() {
    g_signals = 0;
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  ~SignalGuard() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

// The launcher's environment with `extra` (NAME=VALUE) replacing or adding entries.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  auto name = [](const std::string& e) { return e.substr(0, e.find('=')); };
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    const std::string e = *p;
    bool replaced = false;
    for (const std::string& x : extra) replaced = replaced || name(x) == name(e);
    if (!replaced) env.push_back(e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

}  // namespace

int launch_ranks(const std::string& exe, const std::vector<std::string>& args, const LaunchSpec& spec) {
  spec.validate();
  // The store: node 0 hosts it (on --dist-init-addr, else on an ephemeral port of 127.0.0.1).
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  if (!spec.dist_init_addr.empty())
    std::tie(host, port) = parse_host_port(spec.dist_init_addr, "--dist-init-addr");
  std::unique_ptr<TcpStoreServer> server;
  if (spec.node_rank == 0) {
    server = std::make_unique<TcpStoreServer>(spec.dist_init_addr.empty() ? host : "0.0.0.0", port);
    port = server->port();
  }
  const std::string store = fmt::format("{}:{}", host, port);

  const int64_t n = spec.ranks_per_node(), first = spec.node_rank * n;
  const int64_t front =
      spec.front_rank >= first && spec.front_rank < first + n ? spec.front_rank - first : -1;
  std::vector<pid_t> pids(size_t(n), -1);
  std::vector<bool> done(size_t(n), false);
  auto end_all = [&](int sig) {
    for (int64_t i = 0; i < n; ++i)
      if (pids[size_t(i)] > 0 && !done[size_t(i)]) kill(pids[size_t(i)], sig);
  };
  const SignalGuard signals;
  const pid_t parent = getpid();
  for (int64_t i = 0; i < n; ++i) {
    // argv and envp prepared before fork: the child only calls async-signal-safe functions until exec.
    std::vector<std::string> a{exe};
    a.insert(a.end(), args.begin(), args.end());
    a.insert(a.end(), {"--dist-rank", std::to_string(first + i), "--dist-store", store});
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    std::vector<std::string> e;
    if (!spec.rank_env.empty()) e = environment_with(spec.rank_env[size_t(i)]);
    std::vector<char*> envp;
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      end_all(SIGKILL);
      for (int64_t j = 0; j < i; ++j) waitpid(pids[size_t(j)], nullptr, 0);
      fail("launcher: fork of rank {} failed: {}", first + i, std::strerror(err));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher died before prctl
      setpgid(0, 0);                        // terminal signals reach the launcher only
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      if (spec.rank_env.empty()) {
        execv(exe.c_str(), argv.data());
      } else {
        execve(exe.c_str(), argv.data(), envp.data());
      }
      _exit(127);
    }
    pids[size_t(i)] = pid;
  }

  // Wait (polling, so that a signal to the launcher is seen at once): the first failure ends the others
  // (SIGTERM, then SIGKILL after the grace period).
  using clock = std::chrono::steady_clock;
  int64_t left = n, failed = -1;
  std::string why;
  bool ending = false;                             // the survivors got SIGTERM; SIGKILL at kill_at
  clock::time_point kill_at{}, follow_deadline{};  // follow_deadline: set when the front rank exited
  bool front_exited = false;
  int seen_signals = 0;
  auto end_survivors = [&] {
    if (ending) return;
    ending = true;
    end_all(SIGTERM);
    kill_at = clock::now() + spec.grace;
  };
  while (left > 0) {
    if (const int s = int(g_signals); s != seen_signals) {
      const int sig = int(g_last_signal);
      if (seen_signals == 0 && front >= 0 && !done[size_t(front)]) {
        fmt::print(stderr, "launcher: signal {}: passed to rank {}, which stops the others\n", sig,
                   spec.front_rank);
        std::fflush(stderr);
        kill(pids[size_t(front)], sig);
      } else if (front >= 0) {
        end_survivors();  // a second signal: every rank now
      } else {
        end_all(sig);  // no front: every rank gets it
        if (s > 1) end_survivors();
      }
      seen_signals = s;
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // no children left
    }
    if (pid == 0) {
      const auto now = clock::now();
      if (ending && now >= kill_at) end_all(SIGKILL);
      if (front_exited && !ending && now >= follow_deadline) {
        for (int64_t i = 0; i < n && failed < 0; ++i) {
          if (!done[size_t(i)]) {
            failed = first + i;
            why =
                fmt::format("did not exit within {} ms of rank {}", spec.exit_grace.count(), spec.front_rank);
          }
        }
        fmt::print(stderr, "error: rank {} {}; ending the {} rank(s) left\n", failed, why, left);
        std::fflush(stderr);
        end_survivors();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int64_t i = 0;
    while (i < n && pids[size_t(i)] != pid) ++i;
    if (i == n) continue;
    done[size_t(i)] = true;
    --left;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (i == front && !front_exited) {
      front_exited = true;
      follow_deadline = clock::now() + spec.exit_grace;
    }
    if (!ok && failed < 0) {
      failed = first + i;
      why = describe_status(status);
      if (!WIFSIGNALED(status)) {
        // A peer already dead by a signal is the cause (this rank failed when that peer vanished): name
        // it (peeked at, not reaped: the loop reaps it next). That peer's exit can trail this rank's error by
        // a moment (its closed sockets are seen before it is a zombie), so look again for up to 200 ms.
        for (int attempt = 0; attempt < 20 && failed == first + i; ++attempt) {
          if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          for (int64_t j = 0; j < n; ++j) {
            if (done[size_t(j)] || pids[size_t(j)] <= 0) continue;
            siginfo_t si{};
            if (waitid(P_PID, id_t(pids[size_t(j)]), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                si.si_pid == pids[size_t(j)] && (si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED)) {
              failed = first + j;
              why = fmt::format("was killed by signal {} ({})", si.si_status, strsignal(si.si_status));
              break;
            }
          }
        }
      }
      fmt::print(stderr, "error: rank {} {}; ending the other {} rank(s)\n", failed, why, left);
      std::fflush(stderr);
      end_survivors();
    }
  }
  if (failed >= 0) {
    fmt::print(stderr, "error: launcher: rank {} of {} {}\n", failed, spec.world_size, why);
    return 1;
  }
  return 0;
}

}  // namespace dsaserve::dist
