// MoE router (sigmoid, bias, grouped top-k, normalise, scale) and the weighted combine of expert outputs.
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/moe/moe_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 64;

// One block per token, one thread per expert.
__global__ void sm90_moe_route_kernel(MoeRouteKernelParams p) {
  __shared__ float choice[kMaxExperts];
  __shared__ float group_score[kMaxGroups];
  __shared__ bool group_kept[kMaxGroups];
  __shared__ int32_t chosen[kMaxTopK];
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int e = threadIdx.x;
  const float ninf = -__int_as_float(0x7f800000);
  const bool valid = e < p.experts;
  float s = 0.0f;
  if (valid) {
    const float l = p.logits[t * p.logits_stride + e];
    s = 1.0f / (1.0f + expf(-l));
    choice[e] = s + p.bias[e];
  }
  __syncthreads();
  if (p.n_group > 1) {
    const int per_group = int(p.experts) / p.n_group;
    if (e < p.n_group) {
      // The sum of the group's best two choices (first maximum, then the best of the rest).
      const float* g = choice + e * per_group;
      int b1 = 0;
      for (int i = 1; i < per_group; ++i)
        if (g[i] > g[b1]) b1 = i;
      float sum = 0.0f;
      sum += g[b1];
      if (per_group >= 2) {
        int b2 = b1 == 0 ? 1 : 0;
        for (int i = 0; i < per_group; ++i)
          if (i != b1 && (g[i] > g[b2] || (g[i] == g[b2] && i < b2))) b2 = i;
        sum += g[b2];
      }
      group_score[e] = sum;
      group_kept[e] = false;
    }
    __syncthreads();
    if (e == 0) {
      for (int k = 0; k < p.topk_group; ++k) {
        int best = -1;
        for (int g = 0; g < p.n_group; ++g)
          if (!group_kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
        group_kept[best] = true;
      }
    }
    __syncthreads();
    if (valid && !group_kept[e / per_group]) choice[e] = ninf;
    __syncthreads();
  }
  // top_k rounds of a block argmax; a chosen expert leaves the race.
  bool taken = !valid;
  for (int k = 0; k < p.top_k; ++k) {
    const ValIdx mine = taken ? ValIdx{ninf, 0x7fffffff} : ValIdx{choice[e], int32_t(e)};
    const ValIdx best = block_argmax(mine);
    if (e == best.i) taken = true;
    if (e == 0) chosen[k] = best.i;
  }
  __syncthreads();
  if (valid) choice[e] = s;  // reuse: the sigmoid scores
  __syncthreads();
  if (e == 0) {
    float sum = 0.0f;
    for (int k = 0; k < p.top_k; ++k) sum += choice[chosen[k]];
    for (int k = 0; k < p.top_k; ++k) {
      float w = choice[chosen[k]];
      if (p.norm_topk_prob) w /= (sum + 1e-20f);
      p.ids[t * p.top_k + k] = chosen[k];
      p.weights[t * p.top_k + k] = float(double(w) * p.scaling);
    }
  }
}

__global__ void sm90_moe_combine_kernel(MoeCombineParams p) {
  pdl_enter();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    float acc = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int32_t m = p.pos[t * p.top_k + k];
      if (m >= 0) acc += p.weights[t * p.top_k + k] * p.y[int64_t(m) * p.cols + c];
    }
    if (p.add != nullptr) acc += p.add[t * p.cols + c];  // after the sum: the CPU's add_inplace order
    p.out[t * p.cols + c] = acc;
  }
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.experts > kMaxExperts || p.n_group > kMaxGroups || p.top_k > kMaxTopK) return cudaErrorInvalidValue;
  const int threads = int((p.experts + 31) / 32 * 32);
  return launch_pdl(p.pdl, sm90_moe_route_kernel, dim3(unsigned(p.tokens)), dim3(threads), 0, stream, p);
}

cudaError_t launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.cols == 0) return cudaSuccess;
  const int64_t bx = (p.cols + 255) / 256;
  const int64_t gy = p.tokens < 65535 ? p.tokens : 65535;
  return launch_pdl(p.pdl, sm90_moe_combine_kernel, dim3(unsigned(bx), unsigned(gy)), dim3(256), 0, stream,
                    p);
}

}  // namespace dsaserve::kernels::cuda
