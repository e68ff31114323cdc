#pragma once
// Driving the ranks of a deployment from rank 0's engine (serve / generate --tp N):
//   LeaderRunner  rank 0's ModelRunner: sends each step's ForwardBatch to the other ranks (a step
//                 message, runtime/ranks/step_message.h) before the model runner it wraps runs the same
//                 forward; while no step is in flight a beat thread sends an idle message every
//                 beat interval, so that the followers' wait never reaches --dist-timeout while rank 0 is
//                 up; destroyed (the engine stopped), it sends shutdown.
//   follow_steps  every other rank's loop: the same sharded forward per step on a KV cache of the
//                 leader's pages (the leader's page ids index it), output discarded; returns on shutdown.
// Ranks run only the steps' forwards in lockstep. The failure of any rank is the failure of them all: a
// step or message that fails on rank 0 (a peer died or hung past --dist-timeout) ends the process with
// exit status 1 and the reason on stderr (the launcher then ends the others); on a follower it throws.
// With pure TP every rank runs every step, so an idle rank never needs an empty forward (SGLang's IDLE
// batches are for DP attention, --attn-dp-size > 1: runtime/ranks/dp.h, whose DP group leaders send their
// followers dp_step / dp_idle messages, which follow_steps runs too).
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "model/model.h"
#include "runtime/engine/model_runner.h"
#include "runtime/ranks/ranks.h"
#include "runtime/ranks/step_message.h"

namespace dsaserve::runtime {

class LeaderRunner final : public ModelRunner {
 public:
  // Sends `init` to the followers, then serves steps through `inner`.
  LeaderRunner(std::unique_ptr<ModelRunner> inner, std::shared_ptr<Ranks> ranks, const StepInit& init);
  ~LeaderRunner() override;
  LeaderRunner(const LeaderRunner&) = delete;
  LeaderRunner& operator=(const LeaderRunner&) = delete;

  void launch(model::ForwardBatch fb) override;
  Tensor wait() override;
  double gap_seconds() override { return inner_->gap_seconds(); }
  void idle() override { inner_->idle(); }
  int64_t graph_replays() override { return inner_->graph_replays(); }
  Tensor hidden() override { return inner_->hidden(); }

 private:
  void send(StepMessage m);  // under mu_
  void beat();
  [[noreturn]] void die(const char* what, const std::exception& e) const;

  std::unique_ptr<ModelRunner> inner_;
  std::shared_ptr<Ranks> ranks_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;  // a step is in flight (no beats: the followers are in its forward)
  bool stop_ = false;
  int64_t seq_ = 0;
  std::chrono::steady_clock::time_point last_;
  std::thread beat_;
};

// The beat interval for a --dist-timeout: a quarter of it, at most one second.
std::chrono::milliseconds beat_interval(std::chrono::milliseconds timeout);

// A follower's loop over `model` (this rank's shard, on its device): waits for the leader's init, makes
// its KV cache, runs every step's forward; returns the steps run when the leader says shutdown. Throws
// when the leader is gone or silent past the timeout, or a step fails.
int64_t follow_steps(const model::Model& model, const Ranks& ranks);

}  // namespace dsaserve::runtime
