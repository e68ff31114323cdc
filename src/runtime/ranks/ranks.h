#pragma once
// One rank of a deployment that serves (serve / generate --tp N): its model groups (dist::ProcessGroups:
// Gloo for a model on the CPU, NCCL for one on CUDA) and the control communicator the leader's steps
// travel on (runtime/ranks/step_message.h: Gloo over every rank, apart from the model's groups, as
// SGLang's CPU group carries its scheduler's broadcasts). Rank 0 leads (its engine schedules, samples and
// answers; LeaderRunner); every other rank follows (follow_steps: the same sharded forward, output
// discarded). Both in runtime/ranks/leader.h.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/launcher.h"
#include "dist/layout.h"
#include "dist/process_groups.h"
#include "dist/store.h"
#include "model/shard.h"

namespace dsaserve::runtime {

struct RanksOptions {
  Device device = Device::cpu;  // the model's: Gloo groups for the CPU, NCCL ones for CUDA
  // A collective (or a step message) not completed by then fails its rank (--dist-timeout).
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  std::string host = "127.0.0.1";  // Gloo's listening address; empty: the hostname's (several machines)
};

class Ranks {
 public:
  // Collective over the layout's ranks: the store client at args.store, the model's groups, the control
  // group. Throws dsaserve::Error when the store or a peer is not reached within opt.timeout.
  Ranks(const dist::ParallelLayout& layout, const dist::RankArgs& args, const RanksOptions& opt);
  ~Ranks();
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  const dist::ParallelLayout& layout() const { return groups_->layout(); }
  int64_t rank() const { return groups_->rank(); }
  int64_t world_size() const { return layout().world_size(); }
  bool leader() const { return rank() == 0; }
  const dist::ProcessGroups& groups() const { return *groups_; }
  dist::Communicator& control() const { return *control_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  model::Shard shard() const { return {layout(), rank()}; }

 private:
  std::shared_ptr<dist::Store> store_;
  std::unique_ptr<dist::ProcessGroups> groups_;
  std::unique_ptr<dist::Communicator> control_;
  std::chrono::milliseconds timeout_;
};

// GPUs this process sees (0 without CUDA or without a device).
int64_t visible_cuda_devices();

}  // namespace dsaserve::runtime
