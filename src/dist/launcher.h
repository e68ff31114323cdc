#pragma once
// Ranks as processes: the launcher starts this node's ranks of the same binary (fork + exec of the
// running executable with rank arguments appended), hosts the rendezvous store on node 0, and watches them:
// when one rank dies (a non-zero exit or a signal), the others are ended (SIGTERM, then SIGKILL after a
// grace period) and the launcher reports which rank failed and how. A rank that hangs in a collective is
// ended by its peers' collective timeout (--dist-timeout), which fails them, which ends it: never a silent
// hang. A rank dies with its launcher (PR_SET_PDEATHSIG). Each rank runs in a process group of its own,
// so a terminal's Ctrl-C (and `timeout`'s signal) reaches the launcher alone, which passes SIGTERM /
// SIGINT on: to every rank, or to the front rank alone when there is one (serve: rank 0 drains its
// requests, then stops the others); a second signal ends every rank. Once the front rank has exited, the
// others get the grace period to follow it.
//
// SGLang's flags: --tp (ranks in all), --nnodes, --node-rank, --dist-init-addr HOST:PORT (the store; node 0
// listens there), --dist-timeout (seconds). Each rank gets "--dist-rank R --dist-store HOST:PORT".
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dsaserve::dist {

struct LaunchSpec {
  int64_t world_size = 1;      // --tp: ranks over all nodes
  int64_t nnodes = 1;          // --nnodes
  int64_t node_rank = 0;       // --node-rank
  std::string dist_init_addr;  // --dist-init-addr HOST:PORT; empty: 127.0.0.1 on an ephemeral port (1 node)
  std::chrono::milliseconds grace{std::chrono::seconds(3)};  // SIGTERM -> SIGKILL of the surviving ranks
  // The rank (global) that receives the launcher's SIGTERM / SIGINT and ends the others itself (serve's
  // HTTP front, rank 0); -1: the signal goes to every rank.
  int64_t front_rank = -1;
  // After the front rank exits, how long the others may take to follow it before they are ended (and the
  // launcher fails naming the first one left).
  std::chrono::milliseconds exit_grace{std::chrono::seconds(10)};
  // Per rank of this node (index: local rank), NAME=VALUE entries set in its environment on top of the
  // launcher's (e.g. CUDA_VISIBLE_DEVICES: one GPU per rank); empty: the launcher's environment.
  std::vector<std::vector<std::string>> rank_env;
  // Throws dsaserve::Error naming the flag at fault.
  void validate() const;
  int64_t ranks_per_node() const { return world_size / nnodes; }
};

// What a launched rank was told (parsed from its --dist-rank / --dist-store arguments).
struct RankArgs {
  int64_t rank = -1;  // -1: not a launched rank (the launcher itself, or a single process)
  std::string store;  // HOST:PORT of the rendezvous store
  bool launched() const { return rank >= 0; }
};

// Runs this node's ranks of `exe` (normally "/proc/self/exe") with `args` (argv without argv[0]) and the
// rank arguments; returns 0 when all exit 0, else 1 after ending the rest (the reason on stderr).
int launch_ranks(const std::string& exe, const std::vector<std::string>& args, const LaunchSpec& spec);

}  // namespace dsaserve::dist
