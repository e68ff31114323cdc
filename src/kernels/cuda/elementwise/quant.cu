// FP8 helpers of the GEMMs: activation quantisation per token per 128-group, weight dequantisation to
// bf16 (fallback path), and the padded weight-scale layout cuBLASLt's BLK128x128 mode reads. The
// quantisation and the bf16 split run in a step (programmatic dependent launches with p.pdl); the
// dequantisation and the scale padding make a weight's derived forms (model load) and launch the ordinary
// way.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/elementwise/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

// One warp per (token, group): 4 values per lane.
__global__ void sm90_quant_fp8_kernel(QuantFp8Params p) {
  pdl_enter();
  const int64_t groups = p.cols / 128;
  const int64_t gw = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (gw >= p.rows_pad * groups) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = gw / groups, g = gw % groups;
  uint8_t* q = p.q + t * p.cols + g * 128;
  if (t >= p.rows) {
    for (int j = 0; j < 4; ++j) q[lane + 32 * j] = 0;
    if (lane == 0) p.scales[g * p.rows_pad + t] = 1.0f;
    return;
  }
  const float* x = p.x + t * p.x_stride + g * 128;
  float v[4];
  float m = 0.0f;
  for (int j = 0; j < 4; ++j) {
    v[j] = x[lane + 32 * j];
    m = fmaxf(m, fabsf(v[j]));
  }
  const float s = fp8_act_scale(warp_max(m));
  for (int j = 0; j < 4; ++j) q[lane + 32 * j] = fp8_act_code(v[j], s);
  if (lane == 0) p.scales[g * p.rows_pad + t] = s;
}

__global__ void sm90_dequant_fp8_kernel(DequantFp8Params p) {
  const int64_t n = p.rows * p.cols;
  const int64_t kb = (p.cols + p.bk - 1) / p.bk;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i % p.cols;
    __nv_fp8_e4m3 w;
    w.__x = p.w[i];
    const float v = float(w) * p.scale_inv[(r / p.bn) * kb + c / p.bk];
    if (p.out_f32) {
      static_cast<float*>(p.out)[i] = v;
    } else {
      static_cast<uint16_t*>(p.out)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  }
}

__global__ void sm90_pad_scales_kernel(PadScalesParams p) {
  const int64_t n = p.nb * p.ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.ld, c = i % p.ld;
    p.out[i] = c < p.kb ? p.in[r * p.kb + c] : 1.0f;
  }
}

__global__ void sm90_split_bf16_kernel(SplitBf16Params p) {
  pdl_enter();
  const int64_t n = p.rows * p.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / p.cols, c = i % p.cols;
    const float x = p.x[r * p.x_stride + c];
    const __nv_bfloat16 hi = __float2bfloat16_rn(x);
    p.hi[i] = __bfloat16_as_ushort(hi);
    p.lo[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(hi)));
  }
}

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace

cudaError_t launch_quant_fp8(const QuantFp8Params& p, cudaStream_t stream) {
  if (p.rows_pad == 0) return cudaSuccess;
  if (p.cols % 128 != 0) return cudaErrorInvalidValue;
  const int64_t warps = p.rows_pad * (p.cols / 128);
  const int64_t blocks = (warps + 7) / 8;
  return launch_pdl(p.pdl, sm90_quant_fp8_kernel, dim3(unsigned(blocks)), dim3(256), 0, stream, p);
}

cudaError_t launch_dequant_fp8(const DequantFp8Params& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return cudaSuccess;
  sm90_dequant_fp8_kernel<<<blocks_for(p.rows * p.cols, 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_pad_scales(const PadScalesParams& p, cudaStream_t stream) {
  if (p.nb * p.ld == 0) return cudaSuccess;
  sm90_pad_scales_kernel<<<blocks_for(p.nb * p.ld, 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_split_bf16(const SplitBf16Params& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return cudaSuccess;
  return launch_pdl(p.pdl, sm90_split_bf16_kernel, dim3(blocks_for(p.rows * p.cols, 256)), dim3(256), 0,
                    stream, p);
}

}  // namespace dsaserve::kernels::cuda
