#pragma once
// Plain parameters of the absorbed projections' activation conversion (absorb.cu): f32 rows rounded to
// bf16 (round to nearest even, as __float2bfloat16_rn) into a packed buffer the batched GEMM reads.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

struct CastBf16Params {
  const float* x;  // [rows, cols] f32, row stride x_stride (elements); 16-byte aligned, x_stride % 4 == 0
  uint16_t* out;   // [rows, cols] bf16 bits, contiguous, 8-byte aligned
  int64_t rows, cols, x_stride;  // cols % 4 == 0
  bool pdl = false;              // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
// Returns cudaErrorInvalidValue (launching nothing) when the alignment rules above do not hold.
cudaError_t launch_cast_bf16_x4(const CastBf16Params& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
