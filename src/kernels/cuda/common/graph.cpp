#include "kernels/cuda/common/graph.h"

#include <utility>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_context.h"
#include "kernels/cuda/common/views.h"

namespace dsaserve::kernels::cuda {

bool capturing() {
  // Captures run on a stream installed with OpStreamScope; without one this thread runs eager work on its
  // device's compute stream (the common case, answered without a CUDA call).
  if (!op_stream_overridden()) return false;
  const cudaStream_t s = op_stream();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;  // active, or invalidated by an illegal call (still inside)
}

CudaGraph::CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}

CudaGraph::~CudaGraph() { reset(); }

CudaGraph::CudaGraph(CudaGraph&& o) noexcept
    : graph_(std::exchange(o.graph_, nullptr)), exec_(std::exchange(o.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    reset();
    graph_ = std::exchange(o.graph_, nullptr);
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

void CudaGraph::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

size_t CudaGraph::num_nodes() const {
  size_t n = 0;
  if (graph_ != nullptr) DSA_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &n));
  return n;
}

void CudaGraph::replay() const {
  DSA_CHECK(exec_ != nullptr, "CUDA graph replay: the graph is empty");
  DSA_CHECK(!capturing(), "CUDA graph replay inside a capture");
  // The device's compute stream (blocking: ordered with the legacy stream's copies and uploads too).
  DSA_CUDA_CHECK(cudaGraphLaunch(exec_, device_context().compute));
}

GraphCapture::GraphCapture() {
  DSA_CHECK(!capturing(), "CUDA graph capture: this thread is already capturing");
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaStreamDestroy(stream_);
    fail("CUDA graph capture: cudaStreamBeginCapture failed: {}", cudaGetErrorString(e));
  }
  open_ = true;
  scope_ = std::make_unique<OpStreamScope>(stream_);
}

void GraphCapture::end_capture(cudaGraph_t* graph) {
  scope_.reset();  // this thread's operators go back to the compute stream
  open_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream_, &g);
  cudaStreamDestroy(stream_);
  stream_ = nullptr;
  if (e != cudaSuccess || graph == nullptr) {
    cudaGetLastError();  // an invalidated capture leaves its error here; the context stays usable
    if (g != nullptr) cudaGraphDestroy(g);
    if (graph != nullptr) {
      fail(
          "CUDA graph capture failed: {} ({}); an operator made a call that capture forbids (a device-host "
          "copy, a synchronisation, the legacy stream)",
          cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return;
  }
  *graph = g;
}

GraphCapture::~GraphCapture() {
  if (open_) end_capture(nullptr);  // abandoned (an exception inside the captured code)
}

CudaGraph GraphCapture::finish() {
  DSA_CHECK(open_, "CUDA graph capture: finish() called twice");
  cudaGraph_t g = nullptr;
  end_capture(&g);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(g);
    fail("CUDA graph instantiation failed: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  return CudaGraph(g, exec);
}

double graph_time_us(const std::function<void()>& fn, int calls, int replays) {
  DSA_CHECK(calls > 0 && replays > 0, "graph_time_us: {} calls x {} replays", calls, replays);
  DSA_CUDA_CHECK(cudaDeviceSynchronize());
  CudaGraph g;
  {
    GraphCapture capture;
    for (int i = 0; i < calls; ++i) fn();
    g = capture.finish();
  }
  cudaEvent_t a = nullptr, b = nullptr;
  DSA_CUDA_CHECK(cudaEventCreate(&a));
  DSA_CUDA_CHECK(cudaEventCreate(&b));
  const cudaStream_t s = device_context().compute;  // where replay() launches
  g.replay();
  DSA_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < replays; ++i) g.replay();
  DSA_CUDA_CHECK(cudaEventRecord(b, s));
  DSA_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  DSA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) * 1e3 / (double(calls) * double(replays));
}

}  // namespace dsaserve::kernels::cuda
