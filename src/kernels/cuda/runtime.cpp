#include "kernels/cuda/runtime.h"

#include <fmt/format.h>

#include <mutex>

#include "kernels/cuda/check.h"

namespace dsaserve::kernels::cuda {

namespace {

// Plain cudaMalloc-backed allocator; the caching allocator of the CUDA model runner replaces it.
class CudaAllocator final : public DeviceAllocator {
 public:
  std::shared_ptr<void> allocate(size_t bytes) override {
    void* p = nullptr;
    DSA_CUDA_CHECK(cudaMalloc(&p, bytes));
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) override {
    const cudaMemcpyKind kind =
        src_dev == Device::cpu ? (dst_dev == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                               : (dst_dev == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    DSA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  }
  void memset_zero(void* dst, size_t bytes) override { DSA_CUDA_CHECK(cudaMemset(dst, 0, bytes)); }
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

std::string device_summary() {
  if (device_count() == 0) return "no CUDA device";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA device 0 unreadable";
  return fmt::format("{}, sm_{}{}, {:.1f} GiB, {} SMs", p.name, p.major, p.minor,
                     double(p.totalGlobalMem) / (1024.0 * 1024 * 1024), p.multiProcessorCount);
}

void install() {
  static std::once_flag once;
  DSA_CHECK(device_count() > 0, "no CUDA device present");
  std::call_once(once, [] {
    static CudaAllocator alloc;
    set_device_allocator(Device::cuda, &alloc);
  });
}

}  // namespace dsaserve::kernels::cuda
