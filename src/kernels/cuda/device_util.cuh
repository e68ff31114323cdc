#pragma once
// Device helpers shared by the .cu files: warp/block reductions and bf16 loads.
#include <cuda_bf16.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

__device__ __forceinline__ float load_any(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Two packed bf16 (element 0 in the low half, little-endian) as f32: the same bits as __bfloat162float.
__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// Four consecutive f32 from p (float4 units, i4-th group): f32 p must be 16-byte aligned, bf16 p 8-byte.
__device__ __forceinline__ float4 load4_any(const void* p, bool bf16, int64_t i4) {
  if (bf16) {
    const uint2 u = static_cast<const uint2*>(p)[i4];
    return make_float4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
  }
  return static_cast<const float4*>(p)[i4];
}

// Whether a pointer is aligned to `bytes` (a power of two): the launchers pick vectorized paths with it.
__host__ __device__ inline bool is_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by an earlier call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T r = lane < nw ? part[lane] : T(0);
  return warp_sum(r);
}

// (value, index) maximum, ties toward the lower index; every thread gets the winner.
struct ValIdx {
  float v;
  int32_t i;
};
__device__ __forceinline__ bool better(ValIdx a, ValIdx b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
__device__ __forceinline__ ValIdx warp_argmax(ValIdx x) {
  for (int o = 16; o > 0; o >>= 1) {
    ValIdx y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    if (better(y, x)) x = y;
  }
  return x;
}
__device__ inline ValIdx block_argmax(ValIdx x) {
  __shared__ float pv[32];
  __shared__ int32_t pi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  x = warp_argmax(x);
  __syncthreads();
  if (lane == 0) {
    pv[warp] = x.v;
    pi[warp] = x.i;
  }
  __syncthreads();
  ValIdx r = lane < nw ? ValIdx{pv[lane], pi[lane]} : ValIdx{-__int_as_float(0x7f800000), 0x7fffffff};
  return warp_argmax(r);
}

}  // namespace dsaserve::kernels::cuda
