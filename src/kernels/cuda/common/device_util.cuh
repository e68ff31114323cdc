#pragma once
// Device helpers shared by the .cu files: warp/block reductions, bf16 loads and the FP8 quantisation rules.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

__device__ __forceinline__ float load_any(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// RoPE's rotation of the pair (a, c) and the LayerNorm's variance term and output, with every rounding
// explicit (no contraction into FMA: each product is rounded, then summed) so that the kernels that share
// them (rope.cu and the fused cache writes; norm.cu's LayerNorm and the fused index-key write) agree bit for
// bit whatever the compiler chooses for each, and round as the CPU twin does.
__device__ __forceinline__ float rope_first(float a, float c, float cs, float sn) {
  return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(c, sn));
}
__device__ __forceinline__ float rope_second(float a, float c, float cs, float sn) {
  return __fadd_rn(__fmul_rn(c, cs), __fmul_rn(a, sn));
}
__device__ __forceinline__ double layer_norm_sq_add(double acc, float x, double mean) {
  const double d = __dsub_rn(double(x), mean);
  return __dadd_rn(acc, __dmul_rn(d, d));
}
__device__ __forceinline__ float layer_norm_out(float x, double mean, double r, float w, float b) {
  return float(__dadd_rn(__dmul_rn(__dmul_rn(__dsub_rn(double(x), mean), r), double(w)), double(b)));
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

// FP8 (e4m3) activation quantisation of one block (launch_quant_fp8, the fused RMSNorm FP8 copy; the CPU
// twins are cpu::fp8_act_scale and cpu::fp8_quantize). The scale of a block whose largest magnitude is
// amax: amax / 448, or 1 when that is not positive (an all-zero block, or an f32-subnormal amax whose
// quotient underflows: its values quantise to 0; a zero scale would make them 0 / 0 = NaN).
__device__ __forceinline__ float fp8_act_scale(float amax) {
  float s = amax / 448.0f;
  if (!(s > 0.0f)) s = 1.0f;
  return s;
}

// The e4m3 code of x in a block of scale s (from fp8_act_scale): x / s (IEEE division, round to nearest
// even), saturated to +-448 (NaN stays NaN).
__device__ __forceinline__ __nv_fp8_storage_t fp8_act_code(float x, float s) {
  return __nv_cvt_float_to_fp8(x / s, __NV_SATFINITE, __NV_E4M3);
}

// FP8 (e4m3) MLA latent-cache quantisation of one 128-value block (launch_mla_cache_store, the fused KV
// write): a different rule from the activations'. The stored scale is amax / 448 (0 for an all-zero
// block) and the codes multiply by the reciprocal 448 / amax (0 when amax is not positive) instead of
// dividing by the scale, so the two rules may differ in the last bit of a code.
__device__ __forceinline__ float fp8_kv_scale(float amax) { return amax / 448.f; }
__device__ __forceinline__ float fp8_kv_inv_scale(float amax) { return amax > 0.f ? 448.f / amax : 0.f; }

// The e4m3 codes of four consecutive values (x0 in the low byte) at reciprocal scale inv (from
// fp8_kv_inv_scale): e4m3_satfinite(x * inv) each.
__device__ __forceinline__ uint32_t fp8_kv_codes4(float x0, float x1, float x2, float x3, float inv) {
  return uint32_t(__nv_cvt_float_to_fp8(x0 * inv, __NV_SATFINITE, __NV_E4M3)) |
         uint32_t(__nv_cvt_float_to_fp8(x1 * inv, __NV_SATFINITE, __NV_E4M3)) << 8 |
         uint32_t(__nv_cvt_float_to_fp8(x2 * inv, __NV_SATFINITE, __NV_E4M3)) << 16 |
         uint32_t(__nv_cvt_float_to_fp8(x3 * inv, __NV_SATFINITE, __NV_E4M3)) << 24;
}

// SiLU(g) * u as every SiLU-mul kernel computes it (elementwise.cu, silu_fp8.cu: their f32 outputs equal
// bit for bit).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// The two-term bf16 split of a pair of f32 values (the narrow linears' recipe, gemm/gemm.h): hi = the bf16
// pair of (a, b) (a in the low half), lo = the bf16 pair of what hi leaves.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

}  // namespace dsaserve::kernels::cuda
