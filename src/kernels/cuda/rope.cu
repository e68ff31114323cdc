// Rotary position embedding in place: one block per (token, head); the pairs are read before any is
// written (the interleaved form writes its result de-interleaved, over other threads' inputs).
#include "kernels/cuda/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

__global__ void sm90_rope_kernel(RopeKernelParams p) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t half = p.dim / 2;
  float* r = p.x + t * p.s0 + h * p.s1;
  const float pos = float(p.positions[t]);
  const int64_t i = threadIdx.x;
  float a = 0.0f, c = 0.0f;
  if (i < half) {
    a = p.interleaved ? r[2 * i] : r[i];
    c = p.interleaved ? r[2 * i + 1] : r[i + half];
  }
  __syncthreads();
  if (i < half) {
    // fp32 angle, cos/sin in fp64 rounded to fp32 (times attention_factor), as the CPU reference.
    const float ang = p.inv_freq[i] * pos;
    const float cs = float(cos(double(ang)) * p.attention_factor);
    const float sn = float(sin(double(ang)) * p.attention_factor);
    r[i] = a * cs - c * sn;
    r[i + half] = c * cs + a * sn;
  }
}

}  // namespace

cudaError_t launch_rope(const RopeKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  if (p.dim / 2 > 1024 || p.heads > 65535) return cudaErrorInvalidValue;
  const int threads = int((p.dim / 2 + 31) / 32 * 32);
  sm90_rope_kernel<<<dim3(unsigned(p.tokens), unsigned(p.heads)), threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
