#pragma once
// ModelRunner: the seam between the engine thread and the device. launch() starts one step's forward
// and returns at once; wait() returns its last-token logits. The engine prepares the next step between
// the two (overlap scheduling). The CPU runner computes on a worker thread; a CUDA runner would enqueue
// the step on a stream and keep the same contract (the ForwardBatch it receives has every input id
// resolved, so it needs no knowledge of the scheduler's future tokens).
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/tensor.h"
#include "model/model.h"

namespace dsaserve::runtime {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Starts the forward of `fb` over `cache`; at most one step is in flight.
  virtual void launch(model::ForwardBatch fb) = 0;
  // Waits for the launched step; returns its logits [R, vocab] (f32, contiguous, host). Rethrows the
  // step's error.
  virtual Tensor wait() = 0;
  // The device's idle time between back-to-back steps so far (a step's end to the next one's start);
  // idle() says the engine has no work, so the next start does not count.
  virtual double gap_seconds() = 0;
  virtual void idle() = 0;
};

// The CPU path: `async` runs each forward on a worker thread (so launch() returns at once); otherwise
// launch() computes inline. The results are the same.
class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(const model::Model& model, model::KvCache& cache, model::ForwardOptions opt, bool async);
  ~CpuModelRunner() override;
  CpuModelRunner(const CpuModelRunner&) = delete;
  CpuModelRunner& operator=(const CpuModelRunner&) = delete;

  void launch(model::ForwardBatch fb) override;
  Tensor wait() override;
  double gap_seconds() override;
  void idle() override;

 private:
  void run(const model::ForwardBatch& fb);
  void worker();

  const model::Model& model_;
  model::KvCache& cache_;
  model::ForwardOptions opt_;
  bool async_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<model::ForwardBatch> job_;  // launched, not yet picked up
  bool busy_ = false;                       // launched, not yet waited for
  bool done_ = false;                       // result_/error_ ready
  bool stop_ = false;
  Tensor result_;
  std::exception_ptr error_;
  bool chained_ = false;  // a step finished and the engine was not idle since
  std::chrono::steady_clock::time_point last_finish_;
  double gap_s_ = 0;
  std::thread thread_;
};

}  // namespace dsaserve::runtime
