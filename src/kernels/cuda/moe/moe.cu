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

constexpr int kRouteWarps = 4;  // tokens a block, one warp each

// One warp per token: lane l holds experts l, l + 32, ... (a per-warp slice of shared memory keeps the
// choice scores and the sigmoid scores). The same arithmetic in the same order as cpu::moe_route (the
// sigmoid's expf aside, so the weights may differ in their last bits): the group scores (the sum of a group's
// best two choices), the groups kept one by one, then top_k rounds of a warp argmax (ties toward the lower
// expert), a chosen expert leaving the race, and the weights normalised in choice order. A warp reads its
// token's logits once (coalesced) and needs no block barrier: at T = 4,096 the block-per-token form spent 55
// us a layer in its top_k rounds of two __syncthreads each.
__global__ void __launch_bounds__(kRouteWarps * 32) sm90_moe_route_kernel(MoeRouteKernelParams p) {
  extern __shared__ float route_smem[];  // [kRouteWarps][2][experts]
  __shared__ float group_score[kRouteWarps][kMaxGroups];
  __shared__ bool group_kept[kRouteWarps][kMaxGroups];
  __shared__ int32_t chosen[kRouteWarps][kMaxTopK];
  pdl_enter();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.tokens) return;
  const int experts = int(p.experts);
  float* choice = route_smem + int64_t(warp) * 2 * experts;
  float* score = choice + experts;
  const float ninf = -__int_as_float(0x7f800000);
  const float* logits = p.logits + t * p.logits_stride;
  for (int e = lane; e < experts; e += 32) {
    const float s = 1.0f / (1.0f + expf(-logits[e]));
    score[e] = s;
    choice[e] = s + p.bias[e];
  }
  __syncwarp();
  if (p.n_group > 1) {
    const int per_group = experts / p.n_group;
    for (int g = lane; g < p.n_group; g += 32) {
      // The sum of the group's best two choices (first maximum, then the best of the rest).
      const float* c = choice + g * per_group;
      int b1 = 0;
      for (int i = 1; i < per_group; ++i)
        if (c[i] > c[b1]) b1 = i;
      float sum = 0.0f;
      sum += c[b1];
      if (per_group >= 2) {
        int b2 = b1 == 0 ? 1 : 0;
        for (int i = 0; i < per_group; ++i)
          if (i != b1 && (c[i] > c[b2] || (c[i] == c[b2] && i < b2))) b2 = i;
        sum += c[b2];
      }
      group_score[warp][g] = sum;
      group_kept[warp][g] = false;
    }
    __syncwarp();
    if (lane == 0) {
      for (int k = 0; k < p.topk_group; ++k) {
        int best = -1;
        for (int g = 0; g < p.n_group; ++g)
          if (!group_kept[warp][g] && (best < 0 || group_score[warp][g] > group_score[warp][best])) best = g;
        group_kept[warp][best] = true;
      }
    }
    __syncwarp();
    for (int e = lane; e < experts; e += 32)
      if (!group_kept[warp][e / per_group]) choice[e] = ninf;
    __syncwarp();
  }
  // Each lane's best untaken expert; after a round only the winner's lane looks again. A NaN choice (logits
  // that overflowed) counts as -inf, so every round picks an expert in range.
  uint32_t taken = 0;  // bit j: expert lane + 32 j chosen (experts <= 1024)
  auto lane_best = [&]() {
    ValIdx b{ninf, 0x7fffffff};
    for (int j = 0, e = lane; e < experts; ++j, e += 32)
      if (!(taken >> j & 1u)) {
        const float v = choice[e];
        const ValIdx c{v == v ? v : ninf, int32_t(e)};
        if (better(c, b)) b = c;
      }
    return b;
  };
  ValIdx mine = lane_best();
  for (int k = 0; k < p.top_k; ++k) {
    const ValIdx best = warp_argmax(mine);
    if (lane == 0) chosen[warp][k] = best.i;
    if (best.i >= 0 && best.i < experts && (best.i & 31) == lane) {
      taken |= 1u << (best.i >> 5);
      mine = lane_best();
    }
  }
  __syncwarp();
  if (lane == 0) {
    float sum = 0.0f;
    for (int k = 0; k < p.top_k; ++k) sum += score[chosen[warp][k]];
    for (int k = 0; k < p.top_k; ++k) {
      float w = score[chosen[warp][k]];
      if (p.norm_topk_prob) w /= (sum + 1e-20f);
      p.ids[t * p.top_k + k] = chosen[warp][k];
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
  const int64_t blocks = (p.tokens + kRouteWarps - 1) / kRouteWarps;
  const size_t smem = size_t(kRouteWarps) * 2 * size_t(p.experts) * sizeof(float);  // <= 32 KB
  return launch_pdl(p.pdl, sm90_moe_route_kernel, dim3(unsigned(blocks)), dim3(kRouteWarps * 32), smem,
                    stream, p);
}

cudaError_t launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.tokens == 0 || p.cols == 0) return cudaSuccess;
  const int64_t bx = (p.cols + 255) / 256;
  const int64_t gy = p.tokens < 65535 ? p.tokens : 65535;
  return launch_pdl(p.pdl, sm90_moe_combine_kernel, dim3(unsigned(bx), unsigned(gy)), dim3(256), 0, stream,
                    p);
}

}  // namespace dsaserve::kernels::cuda
