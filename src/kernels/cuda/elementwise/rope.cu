// Rotary position embedding in place: a block per token and group of kHeadsPerBlock heads (grid.y: the
// groups, so that at one token the 64 heads of a decode step are 4 blocks side by side, not one block
// walking 4 groups one memory round trip after another). The block first computes the token's cos/sin
// (fp32 angle, fp64 cos/sin rounded to fp32, times attention_factor: the CPU reference's rounding) into
// shared memory; then each warp rotates 4 whole heads, reading every pair of them before writing any (the
// interleaved form writes its result de-interleaved, over other lanes' inputs).
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/elementwise/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPairsPerLane = 4;  // dim <= 256
constexpr int kMaxHalf = 32 * kMaxPairsPerLane;
constexpr int kHeadsPerWarp = 4;  // heads a warp loads before writing any: four heads' loads in flight
constexpr int kHeadsPerBlock = kWarps * kHeadsPerWarp;  // one pass of the block's warps

// kPairs: pairs per lane (dim / 2 <= 32 * kPairs), a template argument so the registers fit the dim.
template <int kPairs>
__global__ void __launch_bounds__(kWarps * 32) sm90_rope_kernel(RopeKernelParams p) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  pdl_enter();
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
  const int64_t h_end = (int64_t(blockIdx.y) + 1) * kHeadsPerBlock < p.heads
                            ? (int64_t(blockIdx.y) + 1) * kHeadsPerBlock
                            : p.heads;
  for (int64_t h0 = int64_t(blockIdx.y) * kHeadsPerBlock + int64_t(warp) * kHeadsPerWarp; h0 < h_end;
       h0 += kHeadsPerBlock) {
    float a[kHeadsPerWarp][kPairs], c[kHeadsPerWarp][kPairs];
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      const int64_t h = h0 + k;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int64_t i = lane + 32 * j;
        a[k][j] = 0.f;
        c[k][j] = 0.f;
        if (h < h_end && i < half) {
          const float* r = p.x + t * p.s0 + h * p.s1;
          a[k][j] = p.interleaved ? r[2 * i] : r[i];
          c[k][j] = p.interleaved ? r[2 * i + 1] : r[i + half];
        }
      }
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      const int64_t h = h0 + k;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const int64_t i = lane + 32 * j;
        if (h < h_end && i < half) {
          float* r = p.x + t * p.s0 + h * p.s1;
          r[i] = rope_first(a[k][j], c[k][j], cs[i], sn[i]);
          r[i + half] = rope_second(a[k][j], c[k][j], cs[i], sn[i]);
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace

cudaError_t launch_rope(const RopeKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  if (p.dim / 2 > kMaxHalf || p.dim % 2 != 0) return cudaErrorInvalidValue;
  const int64_t half = p.dim / 2;
  void (*kernel)(RopeKernelParams) = half <= 32   ? sm90_rope_kernel<1>
                                     : half <= 64 ? sm90_rope_kernel<2>
                                                  : sm90_rope_kernel<kMaxPairsPerLane>;
  const int64_t groups = (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  if (groups > 65535) return cudaErrorInvalidValue;
  return launch_pdl(p.pdl, kernel, dim3(unsigned(p.tokens), unsigned(groups)), dim3(kWarps * 32), 0, stream,
                    p);
}

}  // namespace dsaserve::kernels::cuda
