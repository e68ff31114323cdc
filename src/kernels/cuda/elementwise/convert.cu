#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/elementwise/convert_params.h"

namespace dsaserve::kernels::cuda {

namespace {

__device__ float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::f8e4m3fn: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return float(v);
    }
    case DType::f8e5m2: {
      __nv_fp8_e5m2 v;
      v.__x = static_cast<const __nv_fp8_storage_t*>(p)[i];
      return float(v);
    }
    default: return 0.0f;
  }
}

__device__ void store(void* p, DType t, int64_t i, float x, bool saturate) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = x; break;
    case DType::f16: {
      // torch: NaN -> 0x7e00 with the sign kept; the intrinsic's NaN payload differs, so set it.
      __half h = __float2half_rn(x);
      if (isnan(x)) h = __ushort_as_half(uint16_t((__float_as_uint(x) >> 16) & 0x8000) | 0x7e00);
      static_cast<__half*>(p)[i] = h;
      break;
    }
    case DType::bf16: {
      __nv_bfloat16 b = __float2bfloat16_rn(x);
      if (isnan(x)) b = __ushort_as_bfloat16(0x7fc0);
      static_cast<__nv_bfloat16*>(p)[i] = b;
      break;
    }
    case DType::f8e4m3fn: {
      // Hardware conversion rounds to nearest even; overflow is NaN (torch) or +-448 (satfinite).
      const float a = fabsf(x);
      __nv_fp8_storage_t v;
      // (464, 480) rounds to 480, which e4m3fn spends on NaN; 464 itself ties to even (448).
      if (isnan(x) || (!saturate && a > 464.0f)) {
        v = __nv_fp8_storage_t(((__float_as_uint(x) >> 24) & 0x80) | 0x7f);
      } else {
        v = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      }
      static_cast<__nv_fp8_storage_t*>(p)[i] = v;
      break;
    }
    case DType::f8e5m2: {
      __nv_fp8_storage_t v = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
      if (isnan(x)) v = __nv_fp8_storage_t(((__float_as_uint(x) >> 24) & 0x80) | 0x7f);
      static_cast<__nv_fp8_storage_t*>(p)[i] = v;
      break;
    }
    default: break;
  }
}

__global__ void sm90_convert_kernel(const void* src, DType from, void* dst, DType to, int64_t n,
                                    bool saturate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store(dst, to, i, load(src, from, i), saturate);
  }
}

}  // namespace

cudaError_t launch_convert(const ConvertParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = int((p.n + threads - 1) / threads < 65536 ? (p.n + threads - 1) / threads : 65536);
  sm90_convert_kernel<<<blocks, threads, 0, stream>>>(p.src, p.from, p.dst, p.to, p.n, p.saturate);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
