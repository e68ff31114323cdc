// SiLU-mul with the FP8 copy of its output (see silu_fp8_params.h).
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/elementwise/silu_fp8_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One warp per (row, 128-group): lane l holds values [4l, 4l + 4) of the group. The amax and the codes
// follow launch_quant_fp8 (fp8_act_scale of the warp's max of |value|, fp8_act_code per value).
__global__ void __launch_bounds__(kThreads) sm90_silu_mul_fp8_kernel(const SiluMulFp8Params p) {
  pdl_enter();
  const int64_t groups = p.cols / 128;
  const int64_t gw = blockIdx.x * int64_t(kThreads / 32) + threadIdx.x / 32;
  if (gw >= p.rows_pad * groups) return;
  const int lane = threadIdx.x & 31;
  const int64_t r = gw / groups, g = gw % groups, c = g * 128 + lane * 4;
  uchar4* q = reinterpret_cast<uchar4*>(p.q_codes + r * p.cols + c);
  if (r >= p.rows) {  // padding rows: codes 0, scale 1 (launch_quant_fp8's rule)
    *q = make_uchar4(0, 0, 0, 0);
    if (lane == 0) p.q_scales[g * p.rows_pad + r] = 1.0f;
    return;
  }
  const float4 gv = *reinterpret_cast<const float4*>(p.gate + r * p.gate_stride + c);
  const float4 uv = *reinterpret_cast<const float4*>(p.up + r * p.up_stride + c);
  const float4 o = make_float4(silu_times(gv.x, uv.x), silu_times(gv.y, uv.y), silu_times(gv.z, uv.z),
                               silu_times(gv.w, uv.w));
  *reinterpret_cast<float4*>(p.out + r * p.out_stride + c) = o;
  float m = 0.0f;
  m = fmaxf(m, fabsf(o.x));
  m = fmaxf(m, fabsf(o.y));
  m = fmaxf(m, fabsf(o.z));
  m = fmaxf(m, fabsf(o.w));
  const float s = fp8_act_scale(warp_max(m));
  *q = make_uchar4(fp8_act_code(o.x, s), fp8_act_code(o.y, s), fp8_act_code(o.z, s), fp8_act_code(o.w, s));
  if (lane == 0) p.q_scales[g * p.rows_pad + r] = s;
}

}  // namespace

bool silu_mul_fp8_supported(const SiluMulFp8Params& p) {
  return p.cols > 0 && p.cols % 128 == 0 && p.rows >= 0 && p.rows_pad >= p.rows && p.q_codes != nullptr &&
         p.q_scales != nullptr && aligned16(p.gate) && aligned16(p.up) && aligned16(p.out) &&
         aligned16(p.q_codes) && p.gate_stride % 4 == 0 && p.up_stride % 4 == 0 && p.out_stride % 4 == 0;
}

cudaError_t launch_silu_mul_fp8(const SiluMulFp8Params& p, cudaStream_t stream) {
  if (!silu_mul_fp8_supported(p)) return cudaErrorInvalidValue;
  const int64_t warps = p.rows_pad * (p.cols / 128);
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps + kThreads / 32 - 1) / (kThreads / 32);
  return launch_pdl(p.pdl, sm90_silu_mul_fp8_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, stream, p);
}

}  // namespace dsaserve::kernels::cuda
