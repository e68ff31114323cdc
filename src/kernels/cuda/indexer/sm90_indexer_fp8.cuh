#pragma once
// Device helpers of the FP8 index-key cache (layout: indexer_topk_params.h). A fused kernel that writes
// index keys (e.g. LayerNorm + RoPE + store) calls indexer_key_store_fp8_warp to produce the same bytes as
// launch_indexer_key_store; the CPU twin is kernels/cpu/indexer_key_fp8.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/indexer/indexer_topk_params.h"

namespace dsaserve::kernels::cuda {

// One warp stores one key: lane l holds v[j] = k[4 * l + j] (j = 0..3). Writes the 128 codes of `slot`
// and its scale; slot must be in [0, num_slots). Scale: amax / 448, or 1 when that is not positive; the
// codes are e4m3_satfinite(k / scale) (IEEE division, round to nearest even), as the CPU twin computes.
__device__ __forceinline__ void indexer_key_store_fp8_warp(const float (&v)[4], int lane, void* cache,
                                                           int64_t num_slots, int64_t slot) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float s = amax / 448.f;
  if (!(s > 0.f)) s = 1.f;  // all zeros, or an f32-subnormal amax: never 0 (0 / 0) or an inf reciprocal
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    word |= uint32_t(__nv_cvt_float_to_fp8(__fdiv_rn(v[j], s), __NV_SATFINITE, __NV_E4M3)) << (8 * j);
  }
  unsigned char* base = static_cast<unsigned char*>(cache);
  *reinterpret_cast<uint32_t*>(base + slot * kIndexerDim + lane * 4) = word;
  if (lane == 0) reinterpret_cast<float*>(base + num_slots * kIndexerDim)[slot] = s;
}

// Two e4m3 codes (low byte first) -> bf16x2 (low half first); exact (every e4m3 value is a bf16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&b);
}

}  // namespace dsaserve::kernels::cuda
