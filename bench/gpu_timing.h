#pragma once
// Shared by the GPU benchmarks: the median time of a GPU call measured with CUDA events around each run
// (so host work inside the call shows), after warm-up runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace dsaserve::bench {

// Median microseconds of fn() over `iters` runs after `warm` runs.
template <class F>
double median_event_us(F&& fn, int warm = 3, int iters = 20) {
  for (int i = 0; i < warm; ++i) fn();
  cudaDeviceSynchronize();
  std::vector<cudaEvent_t> ev(size_t(2 * iters));
  for (auto& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(ev[size_t(2 * i)]);
    fn();
    cudaEventRecord(ev[size_t(2 * i + 1)]);
  }
  cudaEventSynchronize(ev.back());
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
    us.push_back(double(ms) * 1e3);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace dsaserve::bench
