#include "runtime/engine/model_runner.h"

#include <utility>

#include "core/error.h"

#ifdef DSASERVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dsaserve::runtime {

ForwardModelRunner::ForwardModelRunner(const model::Model& model, model::KvCache& cache,
                                       model::ForwardOptions opt, bool async, bool logits_on_device,
                                       std::unique_ptr<CudaGraphRunner> graphs)
    : model_(model),
      cache_(cache),
      opt_(opt),
      async_(async),
      logits_on_device_(logits_on_device),
      graphs_(std::move(graphs)) {
  if (async_) thread_ = std::thread([this] { worker(); });
}

ForwardModelRunner::~ForwardModelRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // a step in flight finishes first
}

void ForwardModelRunner::run(const model::ForwardBatch& fb) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (chained_)
      gap_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - last_finish_).count();
  }
  Tensor logits, hidden;
  std::exception_ptr err;
  bool replayed = false;
  // The step's logits where the forward computed them: a graph replay, else the eager forward.
  auto forward = [&] {
    if (graphs_) {
      if (std::optional<Tensor> g = graphs_->run(fb)) {
        replayed = true;
        return std::move(*g);
      }
    }
    model::ForwardOutput o = model_.forward(fb, cache_, opt_);
    hidden = std::move(o.hidden);  // opt_.keep_hidden (speculative decoding)
    return std::move(o.logits);
  };
  try {
    if (logits_on_device_) {
      logits = forward();
#ifdef DSASERVE_HAVE_CUDA
      // The step ends when its kernels have run (as the host copy would make it): errors surface here.
      if (logits.device() == Device::cuda) {
        const cudaError_t e = cudaDeviceSynchronize();
        DSA_CHECK(e == cudaSuccess, "forward: {}", cudaGetErrorString(e));
      }
#endif
    } else {
      logits = forward().to(Device::cpu).contiguous();  // no copy on the CPU
    }
  } catch (...) {
    err = std::current_exception();
  }
  std::lock_guard<std::mutex> lk(mu_);
  result_ = std::move(logits);
  hidden_ = std::move(hidden);
  error_ = err;
  done_ = true;
  chained_ = true;
  graph_replays_ += replayed ? 1 : 0;
  last_finish_ = std::chrono::steady_clock::now();
}

double ForwardModelRunner::gap_seconds() {
  std::lock_guard<std::mutex> lk(mu_);
  return gap_s_;
}

int64_t ForwardModelRunner::graph_replays() {
  std::lock_guard<std::mutex> lk(mu_);
  return graph_replays_;
}

void ForwardModelRunner::idle() {
  std::lock_guard<std::mutex> lk(mu_);
  chained_ = false;
}

void ForwardModelRunner::launch(model::ForwardBatch fb) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DSA_CHECK(!busy_, "model runner: a step is already in flight");
    busy_ = true;
    done_ = false;
    if (async_) job_.emplace(std::move(fb));
  }
  if (async_) {
    cv_.notify_all();
  } else {
    run(fb);
  }
}

Tensor ForwardModelRunner::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  DSA_CHECK(busy_, "model runner: no step in flight");
  cv_.wait(lk, [&] { return done_; });
  busy_ = false;
  done_ = false;
  Tensor r = std::move(result_);
  result_ = Tensor();
  if (std::exception_ptr e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
  return r;
}

Tensor ForwardModelRunner::hidden() {
  std::lock_guard<std::mutex> lk(mu_);
  return std::exchange(hidden_, Tensor());
}

void ForwardModelRunner::worker() {
  for (;;) {
    model::ForwardBatch fb;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_.has_value(); });
      if (!job_) return;  // stop with nothing queued
      fb = std::move(*job_);
      job_.reset();
    }
    run(fb);
    cv_.notify_all();
  }
}

}  // namespace dsaserve::runtime
