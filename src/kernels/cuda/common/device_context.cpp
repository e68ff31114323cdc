#include "kernels/cuda/common/device_context.h"

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/runtime.h"

namespace dsaserve::kernels::cuda {

namespace {

// per_device_state makes it with its device current, so the streams belong to that device.
struct ContextSlot {
  ContextSlot() {
    ctx.ordinal = current_device();
    DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.compute, cudaStreamDefault));
    DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.copy, cudaStreamNonBlocking));
    DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx.comm, cudaStreamNonBlocking));
  }
  DeviceContext ctx;  // the streams are never destroyed (work may be queued during static destruction)
};

}  // namespace

DeviceContext& device_context() { return per_device_state<ContextSlot>().ctx; }

DeviceContext& device_context(int ordinal) {
  const int n = device_count();
  DSA_CHECK(ordinal >= 0 && ordinal < n && ordinal < kMaxDevices, "CUDA device {}: {} device(s) visible",
            ordinal, n);
  const DeviceGuard guard(ordinal);
  return device_context();
}

void stream_wait(cudaStream_t waiter, cudaStream_t s) {
  if (waiter == s) return;
  cudaEvent_t e = nullptr;
  DSA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t r = cudaEventRecord(e, s);
  const cudaError_t w = r == cudaSuccess ? cudaStreamWaitEvent(waiter, e, 0) : r;
  cudaEventDestroy(e);  // the wait is enqueued: the event may go
  DSA_CUDA_CHECK(w);
}

DeviceGuard::DeviceGuard(int ordinal) {
  DSA_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != ordinal) {
    DSA_CUDA_CHECK(cudaSetDevice(ordinal));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(prev_);
}

}  // namespace dsaserve::kernels::cuda
