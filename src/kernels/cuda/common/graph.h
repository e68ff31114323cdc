#pragma once
// CUDA graph capture for the operator backend.
//
// Every operator launches on op_stream() (views.h): the current device's compute stream
// (device_context.h), except on a thread inside a GraphCapture, where it is that capture's own
// non-blocking stream (installed with OpStreamScope; capturing the compute stream itself, a blocking
// stream, would make every legacy-stream call of another thread fail meanwhile). Capture uses
// cudaStreamCaptureModeThreadLocal, so other threads keep running eager work meanwhile. While a thread
// captures, the caching allocator (allocator.h) serves that thread from the graph pool: memory shared by
// every captured graph and never handed to eager work, so a graph's intermediates stay valid for its
// replays. Graphs replay one at a time on the compute stream (ordered with the operators and, a blocking
// stream, with the legacy stream's copies), so they may share that pool: a graph's outputs in pool memory
// are valid only until the next replay; copy them out.
//
// Rules for code that may run under capture (capturing() says so): no device->host copies or
// synchronisation, no pageable uploads (Tensor::to between host and device fails with a clear error), no
// lazily created device data (run one eager step of the same shapes first).
#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "kernels/cuda/common/views.h"

namespace dsaserve::kernels::cuda {

// Whether this thread's op_stream() is being captured into a graph (a GraphCapture, or any capture of a
// stream installed with OpStreamScope).
bool capturing();

// An instantiated graph: replay() launches it on the current device's compute stream (asynchronous).
class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec);
  ~CudaGraph();
  CudaGraph(CudaGraph&& o) noexcept;
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  bool valid() const { return exec_ != nullptr; }
  // Kernel (and other) nodes of the graph.
  size_t num_nodes() const;
  void replay() const;

 private:
  void reset();
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Captures the operators this thread launches between construction and finish(). Construction begins the
// capture on a fresh non-blocking stream; finish() ends it and instantiates the graph, throwing
// dsaserve::Error with the reason when the capture was invalidated (an illegal call inside it). Destroyed
// without finish(): the capture is abandoned. One capture per thread at a time.
class GraphCapture {
 public:
  GraphCapture();
  ~GraphCapture();
  GraphCapture(const GraphCapture&) = delete;
  GraphCapture& operator=(const GraphCapture&) = delete;

  CudaGraph finish();

 private:
  void end_capture(cudaGraph_t* graph);
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<OpStreamScope> scope_;
  bool open_ = false;
};

// GPU microseconds per call of `fn` without the host's launch overhead (benchmarks): `calls` calls captured
// into one graph, replayed `replays` times after one warm replay. Run fn eagerly once first.
double graph_time_us(const std::function<void()>& fn, int calls = 20, int replays = 5);

}  // namespace dsaserve::kernels::cuda
