#include "kernels/cuda/common/runtime.h"

#include <fmt/format.h>

#include <mutex>

#include "kernels/cuda/common/allocator.h"
#include "kernels/cuda/common/check.h"

namespace dsaserve::kernels::cuda {

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
  std::call_once(once, [] { set_device_allocator(Device::cuda, &caching_allocator()); });
}

}  // namespace dsaserve::kernels::cuda
