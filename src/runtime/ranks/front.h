#pragma once
// What serve's HTTP front and generate talk to: an EngineFront, the one engine (LocalFront: one
// process, or rank 0 of --tp N, whose engine leads the other ranks) or, with attention DP
// (--attn-dp-size > 1), the DP controller (DpFront, runtime/ranks/dp.h): it routes each request to one
// DP group's engine (round robin, or the group with the fewest unfinished requests), forwards aborts to
// the owning group, and merges every group's outputs into one queue. Thread-safe as Engine is.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/ranks/dp.h"
#include "runtime/ranks/ranks.h"

namespace dsaserve::runtime {

class EngineFront {
 public:
  virtual ~EngineFront() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  virtual void submit(GenerateRequest req) = 0;
  virtual void abort(uint64_t id) = 0;
  virtual bool wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout) = 0;
  // Summed over the DP groups (counters and gauges alike: running requests, KV pages, ...).
  virtual EngineStats stats() const = 0;
  // Per DP group (one entry without attention DP).
  virtual std::vector<EngineStats> group_stats() const = 0;
  // The (front's) engine's settings.
  virtual const EngineConfig& config() const = 0;
};

class LocalFront final : public EngineFront {
 public:
  LocalFront(std::shared_ptr<const model::Model> model, EngineConfig cfg)
      : engine_(std::move(model), std::move(cfg)) {}
  void start() override { engine_.start(); }
  void stop() override { engine_.stop(); }
  void submit(GenerateRequest req) override { engine_.submit(std::move(req)); }
  void abort(uint64_t id) override { engine_.abort(id); }
  bool wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout) override {
    return engine_.wait_outputs(out, timeout);
  }
  EngineStats stats() const override { return engine_.stats(); }
  std::vector<EngineStats> group_stats() const override { return {engine_.stats()}; }
  const EngineConfig& config() const override { return engine_.config(); }

 private:
  Engine engine_;
};

// The DP groups' stats summed (counters and gauges alike), as stats() reports them: /metrics renders the
// total and the per-group lines from one group_stats() snapshot, so that they agree with each other.
EngineStats sum_stats(const std::vector<EngineStats>& groups);

// SGLang's --load-balance-method.
enum class LoadBalance { round_robin, shortest_queue };
LoadBalance parse_load_balance(const std::string& name);  // throws naming the flag
const char* to_string(LoadBalance lb);

class DpFront final : public EngineFront {
 public:
  // On global rank 0 of an attention DP layout: sends `cfg` to the other DP leaders (serve_dp_group)
  // and makes DP group 0's engine.
  DpFront(std::shared_ptr<const model::Model> model, EngineConfig cfg, std::shared_ptr<Ranks> ranks,
          LoadBalance lb);
  ~DpFront() override;
  void start() override;
  // Stops group 0's engine, then every DP group (the rounds' last), then the output pump.
  void stop() override;
  void submit(GenerateRequest req) override;
  void abort(uint64_t id) override;
  bool wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout) override;
  EngineStats stats() const override;
  std::vector<EngineStats> group_stats() const override;
  const EngineConfig& config() const override { return engine_->config(); }

  // Requests routed to each group so far (tests, logs).
  std::vector<int64_t> routed() const;

 private:
  void push(int64_t group, std::vector<StepOutput>& outs);
  void pump();

  std::shared_ptr<DpLink> link_;
  std::unique_ptr<Engine> engine_;  // DP group 0's (after link_: destroyed first)
  LoadBalance lb_;
  int64_t groups_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StepOutput> out_;
  std::unordered_map<uint64_t, int64_t> owner_;  // unfinished request -> its DP group
  std::vector<int64_t> unfinished_, routed_;
  std::vector<EngineStats> remote_;  // the other groups' last reported stats (index 0 unused)
  int64_t next_ = 0;                 // round robin
  std::atomic<bool> pump_stop_{false};
  std::thread pump_;
  bool stopped_ = false;
};

// The front for `cfg` (cfg.ranks with attention DP: a DpFront; else a LocalFront).
std::unique_ptr<EngineFront> make_front(std::shared_ptr<const model::Model> model, EngineConfig cfg,
                                        LoadBalance lb = LoadBalance::round_robin);

}  // namespace dsaserve::runtime
