// The absorbed projections' activation conversion: four f32 per thread (one 16-byte load, one 8-byte
// store), grid-stride over the rows.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/attention/absorb_params.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

__global__ void __launch_bounds__(kThreads) sm90_cast_bf16_x4_kernel(const CastBf16Params p) {
  pdl_enter();
  const int64_t n4 = p.cols / 4, total = p.rows * n4;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / n4, c = i - r * n4;
    const float4 v = reinterpret_cast<const float4*>(p.x + r * p.x_stride)[c];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    reinterpret_cast<uint2*>(p.out + r * p.cols)[c] = u;
  }
}

}  // namespace

cudaError_t launch_cast_bf16_x4(const CastBf16Params& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.cols % 4 != 0 || p.x_stride % 4 != 0 || !is_aligned(p.x, 16) || !is_aligned(p.out, 8))
    return cudaErrorInvalidValue;
  const int64_t total = p.rows * (p.cols / 4);
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks);
  return launch_pdl(p.pdl, sm90_cast_bf16_x4_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
}

}  // namespace dsaserve::kernels::cuda
