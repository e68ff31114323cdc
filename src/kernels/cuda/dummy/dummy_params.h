#pragma once
// Plain parameters of the dummy-weight fill kernel (dummy.cu): core/dummy_fill.h's values.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dummy_fill.h"

namespace dsaserve::kernels::cuda {

enum class DummyOut : int32_t { bf16, f32, fp8 };

struct DummyFillParams {
  void* out;  // [n] of `out_type` (bf16: u16 bits, fp8: e4m3fn codes), not null
  int64_t n;
  DummyOut out_type;
  dummy::FillSpec spec;
};

cudaError_t launch_dummy_fill(const DummyFillParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
