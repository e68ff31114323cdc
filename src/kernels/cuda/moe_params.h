#pragma once
// Plain parameters of the MoE kernels (moe.cu).
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

// Router: s = sigmoid(logits); choice = s + bias; the topk_group groups with the best sum of their two
// best choices survive; top_k of the survivors by choice (ties: lower index); weights = s of the chosen,
// normalised (+1e-20) when asked, times scaling. One block per token; experts <= 1024.
struct MoeRouteKernelParams {
  const float* logits;  // [tokens, experts] stride logits_stride
  const float* bias;    // [experts]
  int32_t* ids;         // [tokens, top_k]
  float* weights;       // [tokens, top_k]
  int64_t tokens, experts, logits_stride;
  int n_group, topk_group, top_k;
  bool norm_topk_prob;
  double scaling;
};
cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream);

// out[t] = sum_k weights[t, k] * y[pos[t, k]] (the expert outputs packed by expert).
struct MoeCombineParams {
  const float* y;        // [tokens * top_k, cols] contiguous
  const int32_t* pos;    // [tokens, top_k] row of y holding expert k's output of token t
  const float* weights;  // [tokens, top_k]
  float* out;            // [tokens, cols] contiguous
  int64_t tokens, top_k, cols;
};
cudaError_t launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
