// CUDA-event timing of op spans (trace/device_timer.h): events come from a pool and go back to it once
// their span is resolved; an anchor event per batch of in-flight spans maps GPU times onto the host clock.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trace/device_timer.h"

namespace dsaserve::trace::device {

namespace {

// The legacy default stream: its events follow all earlier work of the operators' compute stream (a blocking
// stream, kernels/cuda/common/device_context.h) and precede all later work there.
constexpr cudaStream_t kStream = nullptr;

struct Anchor {
  cudaEvent_t ev = nullptr;
  double host_us = 0;
  ~Anchor() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

std::mutex g_mu;
std::vector<cudaEvent_t> g_pool;  // created events not in use
std::shared_ptr<Anchor> g_anchor;
int64_t g_live = 0;  // marks not yet released

std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// With g_mu held.
cudaError_t take(cudaEvent_t* ev) {
  if (!g_pool.empty()) {
    *ev = g_pool.back();
    g_pool.pop_back();
    return cudaSuccess;
  }
  return cudaEventCreate(ev);
}

}  // namespace

struct Mark {
  cudaEvent_t start = nullptr, stop = nullptr;
  std::shared_ptr<Anchor> anchor;
  cudaError_t error = cudaSuccess;
};

bool available() { return true; }

Mark* begin(double host_us, std::string* why) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto m = std::make_unique<Mark>();
  cudaError_t e = cudaSuccess;
  // A fresh anchor when nothing is in flight, and at least every second (elapsed times are floats in ms).
  if (g_live == 0 || g_anchor == nullptr || host_us - g_anchor->host_us > 1e6) {
    auto a = std::make_shared<Anchor>();
    a->host_us = host_us;
    e = cudaEventCreate(&a->ev);
    if (e == cudaSuccess) e = cudaEventRecord(a->ev, kStream);
    if (e == cudaSuccess) g_anchor = std::move(a);
  }
  if (e == cudaSuccess) e = take(&m->start);
  if (e == cudaSuccess) e = take(&m->stop);
  if (e == cudaSuccess) e = cudaEventRecord(m->start, kStream);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = error_text(e);
    cudaGetLastError();  // clear the (non-sticky) error
    if (m->start != nullptr) g_pool.push_back(m->start);
    if (m->stop != nullptr) g_pool.push_back(m->stop);
    return nullptr;
  }
  m->anchor = g_anchor;
  ++g_live;
  return m.release();
}

void end(Mark* m) {
  const cudaError_t e = cudaEventRecord(m->stop, kStream);
  if (e != cudaSuccess) {
    m->error = e;
    cudaGetLastError();
  }
}

bool ready(Mark* m) {
  if (m->error != cudaSuccess) return true;
  const cudaError_t e = cudaEventQuery(m->stop);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) {
    m->error = e;
    cudaGetLastError();
  }
  return true;
}

bool times(Mark* m, double* start_us, double* dur_us, std::string* why) {
  cudaError_t e = m->error;
  if (e == cudaSuccess) e = cudaEventSynchronize(m->stop);
  float from_anchor_ms = 0, dur_ms = 0;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&from_anchor_ms, m->anchor->ev, m->start);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&dur_ms, m->start, m->stop);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = error_text(e);
    cudaGetLastError();
    return false;
  }
  *start_us = m->anchor->host_us + 1e3 * double(from_anchor_ms);
  *dur_us = 1e3 * double(dur_ms);
  return true;
}

void release(Mark* m) {
  std::unique_ptr<Mark> owned(m);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pool.push_back(m->start);
  g_pool.push_back(m->stop);
  if (--g_live == 0) g_anchor.reset();  // the next span records a fresh anchor
  owned->anchor.reset();
}

}  // namespace dsaserve::trace::device
