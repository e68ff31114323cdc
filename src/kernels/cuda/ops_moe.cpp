// Host wrappers of the MoE operators. moe_experts groups the (token, expert) pairs by expert on the host
// (the routing is copied back: one small transfer), gathers the tokens once into a buffer packed by
// expert, runs each active expert's three GEMMs on its slice (experts without tokens are never read),
// SiLU-mul over the whole buffer, and combines the weighted outputs per token in one kernel.
#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise_params.h"
#include "kernels/cuda/moe_params.h"
#include "kernels/cuda/views.h"

namespace dsaserve::kernels::cuda {

Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) {
  const RowView lv = rows_f32(logits, "moe_route logits");
  const int64_t T = lv.rows, E = lv.cols;
  DSA_CHECK(bias.defined() && bias.dtype() == DType::f32 && bias.dim() == 1 && bias.size(0) == E &&
                bias.is_contiguous() && bias.device() == Device::cuda,
            "moe_route: correction bias must be CUDA f32 [{}]", E);
  p.validate(E);
  DSA_CHECK(E <= 1024 && p.n_group <= 64 && p.top_k <= 64,
            "moe_route: {} experts / {} groups / top-{} unsupported", E, p.n_group, p.top_k);
  Routing r{Tensor::empty({T, p.top_k}, DType::i32, Device::cuda),
            Tensor::empty({T, p.top_k}, DType::f32, Device::cuda)};
  MoeRouteKernelParams kp{lv.p,
                          bias.data<float>(),
                          r.ids.data<int32_t>(),
                          r.weights.data<float>(),
                          T,
                          E,
                          lv.stride,
                          int(p.n_group),
                          int(p.topk_group),
                          int(p.top_k),
                          p.norm_topk_prob,
                          p.routed_scaling_factor};
  check_launch(launch_moe_route(kp, op_stream()), "moe_route");
  return r;
}

Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts) {
  const RowView xv = rows_f32(x, "moe_experts input");
  const int64_t T = xv.rows, H = xv.cols, E = int64_t(experts.size());
  DSA_CHECK(routing.ids.defined() && routing.weights.defined() && routing.ids.dim() == 2 &&
                routing.ids.size(0) == T && routing.ids.is_contiguous() && routing.weights.dim() == 2 &&
                routing.weights.is_contiguous() && routing.weights.size(0) == T &&
                routing.weights.size(1) == routing.ids.size(1) && routing.ids.dtype() == DType::i32 &&
                routing.weights.dtype() == DType::f32 && routing.weights.device() == Device::cuda,
            "moe_experts: routing does not match {} tokens", T);
  const int64_t K = routing.ids.size(1);
  Tensor out = Tensor::empty({T, H}, DType::f32, Device::cuda);
  if (T == 0) return out;
  const std::vector<int32_t> ids = i32_to_host(routing.ids);
  // Pairs grouped by expert, tokens in order within an expert.
  std::vector<int64_t> count(size_t(E) + 1, 0);
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t e = ids[size_t(i)];
    DSA_CHECK(e >= 0 && e < E, "moe_experts: expert {} of token {} outside [0, {})", e, i / K, E);
    ++count[size_t(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) count[size_t(e) + 1] += count[size_t(e)];
  // host buffer: rows [M] (token of packed row m), then pos [T * K] (packed row of pair (t, k))
  const int64_t M = T * K;
  std::vector<int32_t> host(size_t(2 * M));
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t m = fill[size_t(ids[size_t(i)])]++;
    host[size_t(m)] = int32_t(i / K);
    host[size_t(M + i)] = int32_t(m);
  }
  Tensor idx = Tensor::empty({2 * M}, DType::i32);
  std::memcpy(idx.raw_data(), host.data(), host.size() * sizeof(int32_t));
  idx = idx.to(Device::cuda);
  const int32_t* rows_d = static_cast<const int32_t*>(idx.raw_data());
  const int32_t* pos_d = rows_d + M;

  Tensor xg = Tensor::empty({M, H}, DType::f32, Device::cuda);  // [M, H] tokens packed by expert
  {
    RowsParams p{};
    p.src = xv.p;
    p.dst = xg.raw_data();
    p.rows = M;
    p.cols = H;
    p.src_stride = xv.stride;
    p.dst_stride = H;
    p.op = RowOp::copy;
    p.src_rows = rows_d;
    p.page_size = 1;
    check_launch(launch_rows(p, op_stream()), "moe_experts gather");
  }
  int64_t I = -1;
  for (int64_t e = 0; e < E; ++e) {
    if (count[size_t(e) + 1] == count[size_t(e)]) continue;
    const int64_t ie = experts[size_t(e)].gate.rows();
    DSA_CHECK(I < 0 || I == ie, "moe_experts: experts of different widths ({} and {})", I, ie);
    I = ie;
  }
  Tensor gate = Tensor::empty({M, I}, DType::f32, Device::cuda),
         up = Tensor::empty({M, I}, DType::f32, Device::cuda);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m0 = count[size_t(e)], m1 = count[size_t(e) + 1];
    if (m0 == m1) continue;
    const MlpRef& mlp = experts[size_t(e)];
    const Tensor xe = xg.slice(0, m0, m1);
    cuda::linear(xe, mlp.gate, 0, -1, gate.slice(0, m0, m1));
    cuda::linear(xe, mlp.up, 0, -1, up.slice(0, m0, m1));
  }
  const Tensor act = cuda::silu_mul(gate, up);  // [M, I]
  Tensor y = Tensor::empty({M, H}, DType::f32, Device::cuda);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m0 = count[size_t(e)], m1 = count[size_t(e) + 1];
    if (m0 == m1) continue;
    const MlpRef& mlp = experts[size_t(e)];
    DSA_CHECK(mlp.down.rows() == H, "moe_experts: expert {} returns {} features, expected {}", e,
              mlp.down.rows(), H);
    cuda::linear(act.slice(0, m0, m1), mlp.down, 0, -1, y.slice(0, m0, m1));
  }
  check_launch(
      launch_moe_combine({y.data<float>(), pos_d, static_cast<const float*>(routing.weights.raw_data()),
                          out.data<float>(), T, K, H},
                         op_stream()),
      "moe_experts combine");
  return out;
}

}  // namespace dsaserve::kernels::cuda
