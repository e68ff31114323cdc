#pragma once
// Shared by the GPU benchmarks: seeded random f32 tensors uploaded to the GPU.
#include <cstdint>

#include "core/tensor.h"

namespace dsaserve::bench {

// Values in [-scale, scale) (xorshift on the host, seeded), copied to the GPU.
inline Tensor rand_f32_gpu(const Shape& s, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(s, DType::f32);
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    z ^= z << 13;
    z ^= z >> 7;
    z ^= z << 17;
    p[i] = (float(z >> 40) * (1.0f / 8388608.0f) - 1.0f) * scale;
  }
  return t.to(Device::cuda);
}

}  // namespace dsaserve::bench
