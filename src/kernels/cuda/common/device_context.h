#pragma once
// DeviceContext: what one CUDA device owns for the operators that run on it (one per device ordinal,
// made on first use with that device current, kept for the process like the rest of per_device_state).
//
// - compute: the stream every operator of the backend launches on outside a graph capture (op_stream(),
//   views.h) and the one graphs replay on (CudaGraph::replay). Created blocking (cudaStreamDefault), so
//   the synchronous copies of Tensor::to / copy_from, which run on the legacy default stream, stay
//   ordered with the kernels on both sides, and a block the caching allocator hands out again is only
//   touched by work queued after its last use (both streams of one device order with each other).
// - copy: host <-> device copies that may overlap compute (non-blocking; ordered with compute by events:
//   stream_wait).
// - comm: collectives (NCCL; non-blocking; ordered with compute by events: dist's NCCL communicator takes
//   both streams).
// A graph is captured on a non-blocking stream of its own (graph.h): capturing a blocking stream makes
// any legacy-stream call of another thread fail (cudaErrorStreamCaptureImplicit).
#include <cuda_runtime.h>

namespace dsaserve::kernels::cuda {

struct DeviceContext {
  int ordinal = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  cudaStream_t comm = nullptr;
};

// The calling thread's current device's context.
DeviceContext& device_context();
// Device `ordinal`'s context (made with that device current; the caller's current device is restored).
// Throws dsaserve::Error for an ordinal outside [0, device_count()).
DeviceContext& device_context(int ordinal);

// Makes `waiter` wait for the work queued on `s` so far (an event recorded on s; capturable: inside a
// capture it adds the edge to the graph). Nothing when they are the same stream.
void stream_wait(cudaStream_t waiter, cudaStream_t s);

// Makes `ordinal` the calling thread's current device while alive; the previous one comes back on
// destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

}  // namespace dsaserve::kernels::cuda
