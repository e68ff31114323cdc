#pragma once
// The parallel flags of the commands that run a model on several ranks (SGLang's names): --tp,
// --ep-size, --attn-dp-size, --moe-a2a-backend, --deepep-bf16-dispatch, --nnodes, --node-rank,
// --dist-init-addr HOST:PORT,
// --dist-timeout S, and the rank arguments the launcher appends (--dist-rank, --dist-store;
// dist/launcher.h).
//
// With --tp > 1 the command is started once per rank: the process the user started launches its ranks
// (copies of itself) and waits for them; each rank connects its groups and runs its shard. Rank 0 writes
// the command's output.
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>

#include "dist/launcher.h"
#include "dist/layout.h"
#include "dist/process_groups.h"

namespace dsaserve::cli {

struct DistFlags {
  dist::ParallelLayout layout;
  dist::LaunchSpec launch;
  dist::RankArgs rank;
  int64_t timeout_s = 60;
  std::string moe_a2a_backend = "none";  // --moe-a2a-backend none | deepep
  bool deepep_bf16_dispatch = false;     // --deepep-bf16-dispatch (SGLANG_DEEPEP_BF16_DISPATCH)
  bool deepep() const { return moe_a2a_backend == "deepep"; }
  bool multi_rank() const { return layout.tp > 1; }
  bool output_rank() const { return !rank.launched() || rank.rank == 0; }  // the rank that prints / writes
  // Refuses flags that combine into nothing: --moe-a2a-backend deepep on one rank.
  void check(const char* command) const;
};

std::shared_ptr<DistFlags> add_dist_flags(CLI::App& sub);

// The launcher's part: with --tp > 1 in the process the user started, runs the ranks and returns their
// exit status; otherwise nullopt (this process is a rank, or the only process). Validates the flags.
std::optional<int> launch_if_needed(const DistFlags& f);
// The same with `spec` (f.launch plus the caller's front rank and rank environments; world_size set);
// `always`: also for --tp 1 (serve / generate --dist-launch).
std::optional<int> launch_if_needed(const DistFlags& f, const dist::LaunchSpec& spec, bool always);

// A launched rank's groups over Gloo (null for a single process).
std::unique_ptr<dist::ProcessGroups> connect_rank(const DistFlags& f);

}  // namespace dsaserve::cli
