#pragma once
// ModelRunner: the seam between the engine thread and the device. launch() starts one step's forward
// and returns at once; wait() returns its last-token logits. The engine prepares the next step between
// the two (overlap scheduling). ForwardModelRunner serves every device: it calls Model::forward on
// whatever device the model's weights and the KV cache live on (the ForwardBatch it receives has every
// input id resolved, so it needs no knowledge of the scheduler's future tokens) and brings the logits
// to the host for the CPU sampler, or leaves them on the device for the device sampler
// (engine/device_sampling.h, serve --sampling-device gpu). Another runner can be injected into the Engine
// (Engine's RunnerFactory constructor): tests and benches drive the real engine loop with a model-free one.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/tensor.h"
#include "model/model.h"
#include "runtime/engine/cuda_graph_runner.h"

namespace dsaserve::runtime {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Starts the forward of `fb` over `cache`; at most one step is in flight.
  virtual void launch(model::ForwardBatch fb) = 0;
  // Waits for the launched step; returns its logits [R, vocab] (f32, contiguous, host; on the model's
  // device when the runner keeps them there). Rethrows the step's error.
  virtual Tensor wait() = 0;
  // The device's idle time between back-to-back steps so far (a step's end to the next one's start);
  // idle() says the engine has no work, so the next start does not count.
  virtual double gap_seconds() { return 0; }
  virtual void idle() {}
  // Steps that replayed a CUDA graph so far.
  virtual int64_t graph_replays() { return 0; }
  // After wait(): the step's final normed hidden states [T, H] when the forward keeps them
  // (ForwardOptions::keep_hidden: speculative decoding's MTP input), else undefined. Taken once.
  virtual Tensor hidden() { return Tensor(); }
};

// Model::forward on the model's device (CPU, or CUDA with the weights uploaded and a CUDA KV cache).
// `async` runs each forward on a worker thread (so launch() returns at once); otherwise launch() computes
// inline. The results are the same. On CUDA the worker thread needs no per-thread setup: the process
// uses device 0 (every host thread's default) and the backend queues every kernel on that device's compute
// stream (a blocking stream), which orders them against the other threads' work (weights, warm-up) and the
// collectives (ordered with it by events on the comm stream); the logits copy to the
// host ends the step, so wait() returns only finished results. With a CudaGraphRunner, the decode steps
// it accepts replay captured graphs (cuda_graph_runner.h); every other step runs Model::forward.
class ForwardModelRunner final : public ModelRunner {
 public:
  // `logits_on_device`: wait() returns the logits where the forward computed them (the step still ends
  // with a device synchronisation), for a sampler on the device; else they are copied to the host.
  ForwardModelRunner(const model::Model& model, model::KvCache& cache, model::ForwardOptions opt, bool async,
                     bool logits_on_device = false, std::unique_ptr<CudaGraphRunner> graphs = nullptr);
  ~ForwardModelRunner() override;
  ForwardModelRunner(const ForwardModelRunner&) = delete;
  ForwardModelRunner& operator=(const ForwardModelRunner&) = delete;

  void launch(model::ForwardBatch fb) override;
  Tensor wait() override;
  double gap_seconds() override;
  void idle() override;
  int64_t graph_replays() override;
  Tensor hidden() override;

 private:
  void run(const model::ForwardBatch& fb);
  void worker();

  const model::Model& model_;
  model::KvCache& cache_;
  model::ForwardOptions opt_;
  bool async_;
  bool logits_on_device_;
  std::unique_ptr<CudaGraphRunner> graphs_;  // used by the thread that runs the steps

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<model::ForwardBatch> job_;  // launched, not yet picked up
  bool busy_ = false;                       // launched, not yet waited for
  bool done_ = false;                       // result_/error_ ready
  bool stop_ = false;
  Tensor result_;
  Tensor hidden_;
  std::exception_ptr error_;
  bool chained_ = false;  // a step finished and the engine was not idle since
  std::chrono::steady_clock::time_point last_finish_;
  double gap_s_ = 0;
  int64_t graph_replays_ = 0;
  std::thread thread_;
};

}  // namespace dsaserve::runtime
