#pragma once
// Plain parameters of the dtype conversion kernel (convert.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dsaserve::kernels::cuda {

struct ConvertParams {
  const void* src;  // [n] of `from`, not null
  void* dst;        // [n] of `to`, not null
  DType from;
  DType to;
  int64_t n;
  bool saturate;  // fp8 e4m3fn: clamp to +-448 instead of NaN on overflow
};

cudaError_t launch_convert(const ConvertParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
