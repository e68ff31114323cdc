#include "kernels/cuda/common/allocator.h"

#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/views.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr size_t kMinBlock = 512;
constexpr size_t kLargeStep = size_t(2) << 20;   // 2 MiB granularity for large blocks
constexpr size_t kLargeFrom = size_t(64) << 20;  // from 64 MiB on

class CachingAllocator final : public DeviceAllocator {
 public:
  std::shared_ptr<void> allocate(size_t bytes) override {
    const size_t size = allocation_size_class(bytes);
    if (capturing()) return allocate_graph(size);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        stats_.bytes_cached -= int64_t(size);
        ++stats_.hits;
      }
    }
    if (p == nullptr) p = device_malloc(size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.bytes_in_use += int64_t(size);
      if (stats_.bytes_in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.bytes_in_use;
    }
    return std::shared_ptr<void>(p, [this, size](void* q) { release(q, size); });
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

  void memset_zero(void* dst, size_t bytes) override {
    DSA_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, op_stream()));
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
  std::shared_ptr<void> allocate_graph(size_t size) {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = graph_free_.find(size);
      if (it != graph_free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
      }
    }
    if (p == nullptr) {
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
    return std::shared_ptr<void>(p, [this, size](void* q) {
      std::lock_guard<std::mutex> lock(mu_);
      graph_free_[size].push_back(q);
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

  void release(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(p);
    stats_.bytes_in_use -= int64_t(size);
    stats_.bytes_cached += int64_t(size);
  }

  void release_cached_locked() {
    cudaDeviceSynchronize();  // blocks on the lists may still be read by queued work
    for (auto& [size, list] : free_) {
      for (void* p : list) cudaFree(p);
      stats_.bytes_cached -= int64_t(size * list.size());
      list.clear();
    }
  }

  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  // The graph pool's free blocks (graph.h): never released, never handed to eager allocations.
  std::map<size_t, std::vector<void*>> graph_free_;
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
AllocatorStats allocator_stats() { return instance().stats(); }
void release_cached_memory() { instance().release_cached(); }

}  // namespace dsaserve::kernels::cuda
