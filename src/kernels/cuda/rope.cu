// Rotary position embedding in place: one block per token. The block first computes the token's cos/sin
// (fp32 angle, fp64 cos/sin rounded to fp32, times attention_factor: the CPU reference's rounding) into
// shared memory; then each warp rotates whole heads, reading every pair of a head before writing any (the
// interleaved form writes its result de-interleaved, over other lanes' inputs).
#include "kernels/cuda/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPairsPerLane = 4;  // dim <= 256
constexpr int kMaxHalf = 32 * kMaxPairsPerLane;

__global__ void __launch_bounds__(kWarps * 32) sm90_rope_kernel(RopeKernelParams p) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  const int64_t half = p.dim / 2;
  const float pos = float(p.positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float ang = p.inv_freq[i] * pos;
    cs[i] = float(cos(double(ang)) * p.attention_factor);
    sn[i] = float(sin(double(ang)) * p.attention_factor);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t h = warp; h < p.heads; h += kWarps) {
    float* r = p.x + t * p.s0 + h * p.s1;
    float a[kMaxPairsPerLane], c[kMaxPairsPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < half) {
        a[j] = p.interleaved ? r[2 * i] : r[i];
        c[j] = p.interleaved ? r[2 * i + 1] : r[i + half];
      }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int64_t i = lane + 32 * j;
      if (i < half) {
        r[i] = a[j] * cs[i] - c[j] * sn[i];
        r[i + half] = c[j] * cs[i] + a[j] * sn[i];
      }
    }
    __syncwarp();
  }
}

}  // namespace

cudaError_t launch_rope(const RopeKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  if (p.dim / 2 > kMaxHalf || p.dim % 2 != 0) return cudaErrorInvalidValue;
  sm90_rope_kernel<<<unsigned(p.tokens), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
