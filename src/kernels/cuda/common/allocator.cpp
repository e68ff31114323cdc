#include "kernels/cuda/common/allocator.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_context.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kLargeStep = size_t(2) << 20;   // 2 MiB granularity for large blocks
constexpr size_t kLargeFrom = size_t(64) << 20;  // from 64 MiB on

// A free list's key: the device ordinal and the size class (a block is only ever handed out again on the
// device it was allocated on).
using BlockKey = std::pair<int, size_t>;

class CachingAllocator final : public DeviceAllocator {
 public:
  // On device ordinal `index` (Tensor::empty(..., Device::cuda, index)).
  std::shared_ptr<void> allocate(size_t bytes, int index) override { return allocate_on(index, bytes); }
  int current_index() override { return current_device(); }

  std::shared_ptr<void> allocate_on(int device, size_t bytes) {
    DSA_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {}: outside [0, {})", device, kMaxDevices);
    const size_t size = allocation_size_class(bytes);
    const BlockKey key{device, size};
    if (capturing()) return allocate_graph(key);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(key);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= int64_t(size);
        ++stats_.hits;
      }
    }
    if (p == nullptr) {
      const DeviceGuard guard(device);
      p = device_malloc(size);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_in_use += int64_t(size);
      if (stats_.bytes_in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.bytes_in_use;
    }
    return std::shared_ptr<void>(p, [this, key](void* q) { release(q, key); });
  }

  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) override {
    DSA_CHECK(
        !capturing(),
        "a synchronous {} byte copy ({} -> {}) inside a CUDA graph capture: an operator on the captured "
        "path reads device data back or uploads host data (not capturable)",
        bytes, device_name(src_dev), device_name(dst_dev));
    const cudaMemcpyKind kind =
        src_dev == Device::cpu ? (dst_dev == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                               : (dst_dev == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    DSA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  }

  // On the tensor's device: queued on the current one's op stream; on another device, on that device's
  // compute stream and waited for (nothing orders the caller's streams after it otherwise).
  void memset_zero(void* dst, size_t bytes, int index) override {
    if (index == current_device()) {
      DSA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, op_stream()));
      return;
    }
    DSA_CHECK(!capturing(), "zeroing a tensor of device {} while capturing a CUDA graph on device {}", index,
              current_device());
    const DeviceGuard guard(index);
    const cudaStream_t s = device_context(index).compute;
    DSA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, s));
    DSA_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

 private:
  // Under capture: the graph pool's free list, else a new block (cudaMalloc is legal during capture in
  // relaxed mode; the graph only records the address). Pool blocks return to the pool only.
  std::shared_ptr<void> allocate_graph(const BlockKey& key) {
    const size_t size = key.second;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = graph_free_.find(key);
      if (it != graph_free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (p == nullptr) {
      const DeviceGuard guard(key.first);
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      DSA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      const cudaError_t e = cudaMalloc(&p, size);
      DSA_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      if (e != cudaSuccess) {
        cudaGetLastError();
        fail("CUDA graph pool: allocation of {} bytes failed: {}", size, cudaGetErrorString(e));
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.device_mallocs;
      stats_.graph_pool_bytes += int64_t(size);
    }
    return std::shared_ptr<void>(p, [this, key](void* q) {
      std::lock_guard<std::mutex> lock(mu_);
      graph_free_[key].push_back(q);
    });
  }

  void* device_malloc(size_t size) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it, give the cached blocks back, try once more
      {
        std::lock_guard<std::mutex> lock(mu_);
        release_cached_locked();
      }
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      const AllocatorStats s = stats();
      fail("CUDA allocation of {} bytes failed: {} ({} bytes in use, {} cached)", size, cudaGetErrorString(e),
           s.bytes_in_use, s.bytes_cached);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.device_mallocs;
    return p;
  }

  void release(void* p, const BlockKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[key].push_back(p);
    stats_.bytes_in_use -= int64_t(key.second);
    stats_.bytes_cached += int64_t(key.second);
  }

  void release_cached_locked() {
    int synced = -1;
    for (auto& [key, list] : free_) {
      if (list.empty()) continue;
      const DeviceGuard guard(key.first);
      if (synced != key.first)
        cudaDeviceSynchronize();  // blocks on the lists may still be read by queued work
      synced = key.first;         // (the map is ordered by device first)
      for (void* p : list) cudaFree(p);
      stats_.bytes_cached -= int64_t(key.second * list.size());
      list.clear();
    }
  }

  std::mutex mu_;
  std::map<BlockKey, std::vector<void*>> free_;
  // The graph pool's free blocks (graph.h): never released, never handed to eager allocations.
  std::map<BlockKey, std::vector<void*>> graph_free_;
  AllocatorStats stats_;
};

CachingAllocator& instance() {
  static CachingAllocator* a = new CachingAllocator();  // leaked on purpose: outlives every tensor
  return *a;
}

}  // namespace

size_t allocation_size_class(size_t bytes) {
  if (bytes <= kMinBlock) return kMinBlock;
  if (bytes >= kLargeFrom) return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
  // Four classes per power of two: 2^k, 1.25, 1.5, 1.75 x 2^k.
  size_t pow2 = kMinBlock;
  while (pow2 * 2 < bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

DeviceAllocator& caching_allocator() { return instance(); }

Tensor empty_on_device(const Shape& shape, DType dtype, int device) {
  DSA_CHECK(device >= 0 && device < kMaxDevices, "CUDA device {}: outside [0, {})", device, kMaxDevices);
  install();
  return Tensor::empty(shape, dtype, Device::cuda, device);
}

int pointer_device(const void* p) {
  cudaPointerAttributes a{};
  DSA_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  DSA_CHECK(a.type == cudaMemoryTypeDevice, "pointer_device: {} is not device memory", p);
  return a.device;
}
AllocatorStats allocator_stats() { return instance().stats(); }
void release_cached_memory() { instance().release_cached(); }

}  // namespace dsaserve::kernels::cuda
