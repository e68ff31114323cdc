#pragma once
// Per-device launch state: what a launcher computes once per GPU (a kernel's raised dynamic shared-memory
// limit, the SM count, an occupancy-derived grid size), keyed by the ordinal of the calling thread's current
// device, so that a value found on device 0 is never reused on device 1 (a function-local `static` would
// be). Thread-safe; declared in plain C++ so .cu launchers and host wrappers both call it.
#include <cuda_runtime.h>

namespace dsaserve::kernels::cuda {

// The ordinal of the calling thread's current device (0 when it cannot be read).
int current_device();
// cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) on the current device, once
// per (device, func, bytes); later calls return the first call's result.
cudaError_t set_max_dynamic_smem(const void* func, int bytes);
// The current device's SM count (`fallback` when it cannot be read), read once per device.
int device_sm_count(int fallback = 132);
// compute() run once per (current device, key) and its result kept (e.g. an occupancy query for kernel
// `key`); compute runs with the cache unlocked and may call CUDA.
int per_device_value(const void* key, int (*compute)());

}  // namespace dsaserve::kernels::cuda
