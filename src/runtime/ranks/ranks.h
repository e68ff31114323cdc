#pragma once
// One rank of a deployment that serves (serve / generate --tp N): its model groups (dist::ProcessGroups:
// Gloo for a model on the CPU, NCCL for one on CUDA) and the control communicators, Gloo apart from the
// model's groups, as SGLang's CPU groups carry its schedulers' broadcasts:
//   control     the ranks of this rank's attention-TP group (every rank without attention DP): its
//               leader's steps travel on it (runtime/ranks/step_message.h)
//   dp_control  with --attn-dp-size > 1, on the DP groups' leaders only (global ranks 0, attn_tp, ...):
//               the DP controller's rounds (runtime/ranks/dp.h)
// Each attention-TP group's rank 0 leads (its engine schedules, samples and answers: LeaderRunner, or
// with attention DP the DP group's engine); the other ranks follow (follow_steps: the same sharded
// forward, output discarded). Both in runtime/ranks/leader.h. Global rank 0 is the front (serve's HTTP
// server; with attention DP also the controller that routes requests to the DP groups).
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
  // Leads its attention-TP group's steps (with --attn-dp-size 1: rank 0 alone).
  bool leader() const { return layout().attn_tp_rank(rank()) == 0; }
  bool front() const { return rank() == 0; }
  int64_t dp_size() const { return layout().attn_dp_size; }
  int64_t dp_rank() const { return layout().attn_dp_rank(rank()); }
  const dist::ProcessGroups& groups() const { return *groups_; }
  dist::Communicator& control() const { return *control_; }
  // The DP groups' leaders (attention DP, on a leader only; throws elsewhere).
  dist::Communicator& dp_control() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  model::Shard shard() const { return {layout(), rank()}; }

 private:
  std::shared_ptr<dist::Store> store_;
  std::unique_ptr<dist::ProcessGroups> groups_;
  std::unique_ptr<dist::Communicator> control_;
  std::unique_ptr<dist::Communicator> dp_control_;
  std::chrono::milliseconds timeout_;
};

// GPUs this process sees (0 without CUDA or without a device).
int64_t visible_cuda_devices();

}  // namespace dsaserve::runtime
