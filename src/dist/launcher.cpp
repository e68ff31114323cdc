// fork + exec of the ranks, then a waitpid loop: the first failure ends the others.
#include "dist/launcher.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.h"
#include "dist/store.h"

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
}

namespace {

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("stopped (status {})", status);
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
  std::vector<pid_t> pids(size_t(n), -1);
  std::vector<bool> done(size_t(n), false);
  auto end_all = [&](int sig) {
    for (int64_t i = 0; i < n; ++i)
      if (pids[size_t(i)] > 0 && !done[size_t(i)]) kill(pids[size_t(i)], sig);
  };
  const pid_t parent = getpid();
  for (int64_t i = 0; i < n; ++i) {
    // argv prepared before fork: the child only calls async-signal-safe functions until exec.
    std::vector<std::string> a{exe};
    a.insert(a.end(), args.begin(), args.end());
    a.insert(a.end(), {"--dist-rank", std::to_string(first + i), "--dist-store", store});
    std::vector<char*> argv;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
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
      execv(exe.c_str(), argv.data());
      _exit(127);
    }
    pids[size_t(i)] = pid;
  }

  // Wait: the first failure ends the others (SIGTERM, then SIGKILL after the grace period).
  int64_t left = n, failed = -1;
  std::string why;
  std::chrono::steady_clock::time_point kill_at{};
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, failed >= 0 ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // no children left
    }
    if (pid == 0) {  // ending the survivors: escalate after the grace period
      if (std::chrono::steady_clock::now() >= kill_at) end_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    int64_t i = 0;
    while (i < n && pids[size_t(i)] != pid) ++i;
    if (i == n) continue;
    done[size_t(i)] = true;
    --left;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failed < 0) {
      failed = first + i;
      why = describe_status(status);
      fmt::print(stderr, "error: rank {} {}; ending the other {} rank(s)\n", failed, why, left);
      std::fflush(stderr);
      end_all(SIGTERM);
      kill_at = std::chrono::steady_clock::now() + spec.grace;
    }
  }
  if (failed >= 0) {
    fmt::print(stderr, "error: launcher: rank {} of {} {}\n", failed, spec.world_size, why);
    return 1;
  }
  return 0;
}

}  // namespace dsaserve::dist
