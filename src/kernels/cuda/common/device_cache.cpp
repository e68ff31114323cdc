#include "kernels/cuda/common/device_cache.h"

#include <map>
#include <mutex>
#include <tuple>

namespace dsaserve::kernels::cuda {

namespace {

// (device, what, extra) -> value. `what` is a kernel's address or a tag's; extra: bytes for the smem limit.
struct Cache {
  std::mutex mu;
  std::map<std::tuple<int, const void*, int>, int> values;
};
Cache& cache() {
  static Cache* c = new Cache();  // leaked on purpose: launches may run during static destruction
  return *c;
}

bool lookup(const std::tuple<int, const void*, int>& key, int* out) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  const auto it = c.values.find(key);
  if (it == c.values.end()) return false;
  *out = it->second;
  return true;
}

int store(const std::tuple<int, const void*, int>& key, int v) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.values.emplace(key, v).first->second;  // a concurrent first caller's value wins
}

const char kSmCountTag = 0;

}  // namespace

int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return dev;
}

cudaError_t set_max_dynamic_smem(const void* func, int bytes) {
  const auto key = std::make_tuple(current_device(), func, bytes);
  int v = 0;
  if (lookup(key, &v)) return cudaError_t(v);
  const cudaError_t e = cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return cudaError_t(store(key, int(e)));
}

int device_sm_count(int fallback) {
  const int dev = current_device();
  const auto key = std::make_tuple(dev, static_cast<const void*>(&kSmCountTag), fallback);
  int v = 0;
  if (lookup(key, &v)) return v;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
    cudaGetLastError();
    v = fallback;
  }
  return store(key, v);
}

int per_device_value(const void* key, int (*compute)()) {
  const auto k = std::make_tuple(current_device(), key, -1);
  int v = 0;
  if (lookup(k, &v)) return v;
  return store(k, compute());
}

}  // namespace dsaserve::kernels::cuda
