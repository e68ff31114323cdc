#pragma once
// Per-device launch state: what a launcher computes once per GPU (a kernel's raised dynamic shared-memory
// limit, the SM count, an occupancy-derived grid size), keyed by the ordinal of the calling thread's current
// device, so that a value found on device 0 is never reused on device 1 (a function-local `static` would
// be). Thread-safe; declared in plain C++ so .cu launchers and host wrappers both call it.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

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

// Device ordinals the per-device state below distinguishes.
inline constexpr int kMaxDevices = 64;

// The current device's instance of T (the backend's per-device state: its cuBLASLt handle and plans, the
// RoPE tables; nothing keyed by a weight's address: the weights' derived forms are made at model load),
// made by T's default constructor with that device current on first use and kept for the process.
// Thread-safe; one lookup is an atomic load.
template <class T>
T& per_device_state() {
  static std::array<std::atomic<T*>, kMaxDevices> slots{};
  static std::mutex mu;
  int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) dev = 0;
  T* p = slots[size_t(dev)].load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  std::lock_guard<std::mutex> lock(mu);
  p = slots[size_t(dev)].load(std::memory_order_relaxed);
  if (p == nullptr) {
    p = new T();  // leaked on purpose: launches may run during static destruction
    slots[size_t(dev)].store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace dsaserve::kernels::cuda
