// Host wrappers of the MoE operators.
//
// moe_experts groups the (token, expert) pairs by expert on the device (moe_grouped.cu: counts, offsets,
// packed rows in token order, the list of active experts), then takes one of three paths
// (kernels::select_moe_path):
// - device_fp8 (FP8 experts with fast GEMMs, the default for them at every size): the tokens quantised once
//   per 128-group (the dense FP8 recipe), a grouped tensor-core kernel for gate + up + SiLU-mul
//   (sm90_moe_fp8.cu: mma.sync or, for prefill-sized groups, wgmma), the result quantised per 128-group,
//   the grouped kernel for down, the combine;
// - device (decode and graph capture by default): the same two grouped steps on the CUDA cores
//   (moe_grouped.cu), weights dequantised in registers, f32 activations;
// Both device paths visit only the active experts, need no host synchronisation and have launch
// configurations that depend on shapes only; the experts' weight pointers reach the kernels through a
// small device table, a derived form of the layer's experts made at model load (derive_moe_experts,
// ops.h DerivedExperts) and handed to each call, or made for a call given none (outside capture only).
// - host path (prefill sizes): the expert offsets (E + 5 integers) come back to the host, then one
//   cuBLASLt GEMM per active expert and matrix on its slice of the gathered tokens, SiLU-mul, the combine.
// Every path reads only the experts that received tokens.
//
// With the input's FP8 copy (q: a DeepEP FP8 dispatch's codes and scales) the device_fp8 path reads it
// instead of quantising x; the other paths compute on x (its dequantised value; the host path's FP8 GEMMs
// quantise it again, which can move a group's scale by one ulp).
//
// Routing ids outside [0, E): the host path throws dsaserve::Error (it reads the count back anyway). The
// device path cannot look without a host sync: it drops such pairs (they add nothing to their token),
// never touches memory with them, and counts them on the device (moe_take_dropped_pairs).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/moe/moe_params.h"
#include "kernels/kernel_options.h"

namespace dsaserve::kernels::cuda {

Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p, const KernelOptions& o) {
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
  kp.pdl = o.pdl;
  check_launch(launch_moe_route(kp, op_stream()), "moe_route");
  return r;
}

namespace {

bool stream_capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(op_stream(), &st) != cudaSuccess) {
    cudaGetLastError();
    return true;  // e.g. the legacy stream while another stream captures: no host sync either way
  }
  return st != cudaStreamCaptureStatusNone;
}

std::vector<const void*> pointers_of(const std::vector<MlpRef>& experts) {
  std::vector<const void*> v;
  v.reserve(experts.size() * 6);
  for (const MlpRef& m : experts) {
    for (const WeightRef* w : {&m.gate, &m.up, &m.down})
      v.push_back(w->weight.defined() ? w->weight.raw_data() : nullptr);
    for (const WeightRef* w : {&m.gate, &m.up, &m.down})
      v.push_back(w->scale_inv.defined() ? w->scale_inv.raw_data() : nullptr);
  }
  return v;
}

// Why `w` cannot be a [rows, cols] weight of the device path (same dtype and blocks as the table), or "".
std::string weight_problem(const WeightRef& w, int64_t rows, int64_t cols, const DerivedExperts& t) {
  if (!w.weight.defined() || w.weight.device() != Device::cuda || w.weight.dim() != 2 ||
      !w.weight.is_contiguous())
    return "a weight is not a contiguous 2-D CUDA tensor";
  if (w.weight.dtype() != t.dtype) return "the experts' weights differ in dtype";
  if (w.rows() != rows || w.cols() != cols)
    return fmt::format("a weight is {}, expected [{}, {}]", w.weight.describe(), rows, cols);
  if (reinterpret_cast<uintptr_t>(w.weight.raw_data()) % 16 != 0) return "a weight is not 16-byte aligned";
  if (t.dtype != DType::f8e4m3fn) return "";
  if (w.block_n != t.block_n || w.block_k != t.block_k) return "the experts' fp8 blocks differ";
  const int64_t sn = (rows + w.block_n - 1) / w.block_n, sk = (cols + w.block_k - 1) / w.block_k;
  if (!w.scale_inv.defined() || w.scale_inv.device() != Device::cuda || w.scale_inv.dtype() != DType::f32 ||
      !w.scale_inv.is_contiguous() || w.scale_inv.dim() != 2 || w.scale_inv.size(0) != sn ||
      w.scale_inv.size(1) != sk)
    return fmt::format("an fp8 weight needs a CUDA f32 scale_inv [{}, {}]", sn, sk);
  return "";
}

// Whether `t` was made from `experts` (the same weights, expert 0 of the same dtype, shape and blocks).
bool made_from(const DerivedExperts& t, const std::vector<MlpRef>& experts) {
  if (t.weights != pointers_of(experts)) return false;
  if (!t.table.defined()) return true;  // unusable whatever they are
  const WeightRef& g0 = experts[0].gate;
  return g0.weight.dtype() == t.dtype && g0.rows() == t.inter && g0.cols() == t.hidden &&
         g0.block_n == t.block_n && g0.block_k == t.block_k;
}

MoeWeightType weight_type(DType dt) {
  return dt == DType::f8e4m3fn ? MoeWeightType::fp8
         : dt == DType::bf16   ? MoeWeightType::bf16
                               : MoeWeightType::f32;
}

// Offsets (in i32) of the parts of the grouping's output buffer.
struct PlanLayout {
  int64_t experts, pairs;
  int64_t header() const { return 0; }
  int64_t offsets() const { return 4; }
  int64_t counts() const { return offsets() + experts + 1; }
  int64_t active() const { return counts() + experts; }
  int64_t rows() const { return active() + experts; }
  int64_t pos() const { return rows() + pairs; }
  int64_t size() const { return pos() + pairs; }
};

// [M, H] f32: the rows of xv listed by the device array rows_d (the token of each (token, expert) pair,
// packed by expert), one launch (programmatic with pdl: KernelOptions::pdl, as every launch below).
Tensor gather_pair_rows(const RowView& xv, const int32_t* rows_d, int64_t M, bool pdl) {
  const int64_t H = xv.cols;
  Tensor xg = Tensor::empty({M, H}, DType::f32, Device::cuda);
  RowsParams g{};
  g.src = xv.p;
  g.dst = xg.raw_data();
  g.rows = M;
  g.cols = H;
  g.src_stride = xv.stride;
  g.dst_stride = H;
  g.op = RowOp::copy;
  g.src_rows = rows_d;
  g.page_size = 1;
  g.pdl = pdl;
  check_launch(launch_rows(g, op_stream()), "moe_experts gather");
  return xg;
}

// out[t] = the routing-weighted sum of token t's expert rows of y [M, H] (packed by expert), + add[t] when
// add is given ([T, H] contiguous).
void combine(const Tensor& y, const int32_t* plan, const PlanLayout& l, const Routing& routing, Tensor& out,
             int64_t T, int64_t K, int64_t H, const float* add, bool pdl) {
  MoeCombineParams c{y.data<float>(),
                     plan + l.pos(),
                     static_cast<const float*>(routing.weights.raw_data()),
                     out.data<float>(),
                     T,
                     K,
                     H};
  c.add = add;
  c.pdl = pdl;
  check_launch(launch_moe_combine(c, op_stream()), "moe_experts combine");
}

void device_experts(const RowView& xv, const Routing& routing, const DerivedExperts& tab, const int32_t* plan,
                    const PlanLayout& l, int64_t K, const float* add, Tensor& out, bool pdl) {
  const int64_t T = xv.rows, H = xv.cols, E = l.experts, M = l.pairs, I = tab.inter;
  DSA_CHECK(tab.hidden == H, "moe_experts: experts take {} features, the input has {}", tab.hidden, H);
  const int32_t* rows_d = plan + l.rows();
  MoeExpertGemmParams p{};
  p.experts = int(E);
  p.header = plan + l.header();
  p.offsets = plan + l.offsets();
  p.active = plan + l.active();
  p.block_n = int(tab.block_n);
  p.block_k = int(tab.block_k);
  p.wtype = weight_type(tab.dtype);
  p.pdl = pdl;
  // Rows held in registers: the mean rows per expert rounded up to 2, 4 or 8 (shapes only).
  const int64_t mean = (M + E - 1) / E;
  p.group_rows = mean <= 2 ? 2 : mean <= 4 ? 4 : 8;
  p.table = static_cast<const MoeExpertWeights*>(tab.table.raw_data());
  Tensor xg;
  if (reinterpret_cast<uintptr_t>(xv.p) % 16 == 0 && xv.stride % 4 == 0) {
    p.in = xv.p;
    p.in_stride = xv.stride;
    p.in_rows = rows_d;
  } else {  // unaligned rows: gather the tokens packed by expert first
    xg = gather_pair_rows(xv, rows_d, M, pdl);
    p.in = xg.data<float>();
    p.in_stride = H;
    p.in_rows = nullptr;
  }
  Tensor act = Tensor::empty({M, I}, DType::f32, Device::cuda);  // [M, I] silu(gate) * up, packed by expert
  p.out = act.data<float>();
  p.n_in = H;
  p.n_out = I;
  p.gate_up = true;
  check_launch(launch_moe_expert_gemm(p, op_stream()), "moe_experts gate/up");
  Tensor y = Tensor::empty({M, H}, DType::f32, Device::cuda);  // [M, H] expert outputs, packed by expert
  p.in = act.data<float>();
  p.in_stride = I;
  p.in_rows = nullptr;
  p.out = y.data<float>();
  p.n_in = I;
  p.n_out = H;
  p.gate_up = false;
  check_launch(launch_moe_expert_gemm(p, op_stream()), "moe_experts down");
  combine(y, plan, l, routing, out, T, K, H, add, pdl);
}

// The experts' shapes the FP8 tensor-core kernels take (the table's dtype and blocks are checked for every
// expert when it is derived).
bool fp8_grouped_fits(const WeightRef& g0, int64_t H, GemmPrecision prec) {
  if (prec != GemmPrecision::fast || !g0.weight.defined() || g0.weight.dim() != 2) return false;
  const int64_t I = g0.rows();
  return g0.weight.dtype() == DType::f8e4m3fn && g0.block_n == 128 && g0.block_k == 128 && g0.cols() == H &&
         H % 128 == 0 && I % 128 == 0 && H <= kMoeFp8MaxK && I <= kMoeFp8MaxK;
}

}  // namespace

std::shared_ptr<const DerivedExperts> derive_moe_experts(const std::vector<MlpRef>& experts) {
  if (experts.empty()) return nullptr;
  DerivedExperts t;
  t.weights = pointers_of(experts);
  const WeightRef& g0 = experts[0].gate;
  if (!g0.weight.defined() || g0.weight.dim() != 2) {
    t.unusable = "expert 0 has no gate weight";
    return std::make_shared<const DerivedExperts>(std::move(t));
  }
  t.dtype = g0.weight.dtype();
  t.inter = g0.rows();
  t.hidden = g0.cols();
  t.block_n = g0.block_n;
  t.block_k = g0.block_k;
  const int64_t v = t.dtype == DType::f8e4m3fn ? 16 : t.dtype == DType::bf16 ? 8 : 4;
  if (t.dtype != DType::f8e4m3fn && t.dtype != DType::bf16 && t.dtype != DType::f32) {
    t.unusable = fmt::format("weights of dtype {}", dtype_name(t.dtype));
  } else if (t.hidden % v != 0 || t.inter % v != 0) {
    t.unusable = fmt::format("hidden {} / intermediate {} not multiples of {}", t.hidden, t.inter, v);
  } else if (t.dtype == DType::f8e4m3fn && (t.block_n <= 0 || t.block_k <= 0 || t.block_k % 16 != 0)) {
    t.unusable = fmt::format("fp8 blocks {}x{}", t.block_n, t.block_k);
  }
  for (size_t e = 0; e < experts.size() && t.unusable.empty(); ++e) {
    const MlpRef& m = experts[e];
    std::string why = weight_problem(m.gate, t.inter, t.hidden, t);
    if (why.empty()) why = weight_problem(m.up, t.inter, t.hidden, t);
    if (why.empty()) why = weight_problem(m.down, t.hidden, t.inter, t);
    if (!why.empty()) t.unusable = fmt::format("expert {}: {}", e, why);
  }
  if (!t.unusable.empty()) return std::make_shared<const DerivedExperts>(std::move(t));
  std::vector<MoeExpertWeights> host(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const void* const* p = t.weights.data() + 6 * e;
    host[e] = {p[0],
               p[1],
               p[2],
               static_cast<const float*>(p[3]),
               static_cast<const float*>(p[4]),
               static_cast<const float*>(p[5])};
  }
  Tensor h = Tensor::empty({int64_t(host.size() * sizeof(MoeExpertWeights))}, DType::u8);
  std::memcpy(h.raw_data(), host.data(), host.size() * sizeof(MoeExpertWeights));
  t.table = h.to(Device::cuda);
  return std::make_shared<const DerivedExperts>(std::move(t));
}

bool moe_fp8_grouped_weight(const WeightRef& w, const KernelOptions& o) {
  if (o.moe == MoePath::host || o.gemm != GemmPrecision::fast || !w.weight.defined() || w.weight.dim() != 2)
    return false;
  const int64_t r = w.rows(), c = w.cols();
  return w.weight.dtype() == DType::f8e4m3fn && w.block_n == 128 && w.block_k == 128 && r % 128 == 0 &&
         c % 128 == 0 && r <= kMoeFp8MaxK && c <= kMoeFp8MaxK;
}

namespace {

// x's rows quantised per 128-group (codes [rows, cols], scales [cols / 128, rows]): the FP8 recipe.
struct Quantised {
  Tensor codes, scales;
};
Quantised quantise(const float* x, int64_t stride, int64_t rows, int64_t cols, const char* what, bool pdl) {
  Quantised q{Tensor::empty({rows, cols}, DType::u8, Device::cuda),
              Tensor::empty({cols / 128, rows}, DType::f32, Device::cuda)};
  QuantFp8Params p{x, q.codes.data_u8(), q.scales.data<float>(), rows, rows, cols, stride};
  p.pdl = pdl;
  check_launch(launch_quant_fp8(p, op_stream()), what);
  return q;
}

// The input's FP8 copy `pre` when given (codes [Tp, H], scales [H / 128, Tp], Tp >= T), else x's.
void device_fp8_experts(const RowView& xv, const Routing& routing, const DerivedExperts& tab,
                        const int32_t* plan, const PlanLayout& l, int64_t K, int tile_rows, int tail_rows,
                        const Fp8Act* pre, const float* add, Tensor& out, bool pdl) {
  const int64_t T = xv.rows, H = xv.cols, E = l.experts, M = l.pairs, I = tab.inter;
  DSA_CHECK(tab.hidden == H, "moe_experts: experts take {} features, the input has {}", tab.hidden, H);
  Quantised xq;
  int64_t x_ld = T;
  if (pre != nullptr) {
    xq = {pre->codes, pre->scales};
    x_ld = pre->codes.size(0);
  } else {
    xq = quantise(xv.p, xv.stride, T, H, "moe_experts fp8 input", pdl);
  }
  MoeFp8GemmParams p{};
  p.table = static_cast<const MoeExpertWeights*>(tab.table.raw_data());
  p.header = plan + l.header();
  p.offsets = plan + l.offsets();
  p.active = plan + l.active();
  p.experts = int(E);
  p.tile_rows = tile_rows != 0 ? tile_rows : moe_fp8_tile_rows(M, E);
  p.tail_rows = tail_rows;
  p.pdl = pdl;
  Tensor act = Tensor::empty({M, I}, DType::f32, Device::cuda);  // [M, I] silu(gate) * up, packed by expert
  p.in_rows = plan + l.rows();
  p.xq = xq.codes.data_u8();
  p.x_scale = xq.scales.data<float>();
  p.x_scale_ld = x_ld;
  p.out = act.data<float>();
  p.N = I;
  p.K = H;
  p.gate_up = true;
  check_launch(launch_moe_fp8_gemm(p, op_stream()), "moe_experts fp8 gate/up");
  // Rows past the last expert's (dropped pairs) hold no value; their codes are never read.
  const Quantised aq = quantise(act.data<float>(), I, M, I, "moe_experts fp8 act", pdl);
  Tensor y = Tensor::empty({M, H}, DType::f32, Device::cuda);  // [M, H] expert outputs, packed by expert
  p.in_rows = nullptr;
  p.xq = aq.codes.data_u8();
  p.x_scale = aq.scales.data<float>();
  p.x_scale_ld = M;
  p.out = y.data<float>();
  p.N = H;
  p.K = I;
  p.gate_up = false;
  check_launch(launch_moe_fp8_gemm(p, op_stream()), "moe_experts fp8 down");
  combine(y, plan, l, routing, out, T, K, H, add, pdl);
}

void host_experts(const RowView& xv, const Routing& routing, const std::vector<MlpRef>& experts,
                  const int32_t* plan, const PlanLayout& l, int64_t K, const float* add, Tensor& out,
                  const KernelOptions& o) {
  const int64_t T = xv.rows, H = xv.cols, E = l.experts, M = l.pairs;
  // One small copy back: the header and the expert offsets.
  std::vector<int32_t> h(size_t(l.counts()));
  check_launch(
      cudaMemcpyAsync(h.data(), plan, h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, op_stream()),
      "moe_experts offsets");
  check_launch(cudaStreamSynchronize(op_stream()), "moe_experts offsets");
  DSA_CHECK(h[1] == 0, "moe_experts: expert {} outside [0, {}) ({} of {} pairs)", h[2], E, h[1], M);
  const int32_t* off = h.data() + l.offsets();
  const int32_t* rows_d = plan + l.rows();

  const Tensor xg = gather_pair_rows(xv, rows_d, M, o.pdl);  // [M, H] tokens packed by expert
  int64_t I = -1;
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    const int64_t ie = experts[size_t(e)].gate.rows();
    DSA_CHECK(I < 0 || I == ie, "moe_experts: experts of different widths ({} and {})", I, ie);
    I = ie;
  }
  Tensor gate = Tensor::empty({M, I}, DType::f32, Device::cuda),
         up = Tensor::empty({M, I}, DType::f32, Device::cuda);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m0 = off[e], m1 = off[e + 1];
    if (m0 == m1) continue;
    const MlpRef& mlp = experts[size_t(e)];
    const Tensor xe = xg.slice(0, m0, m1);
    cuda::linear(xe, mlp.gate, 0, -1, gate.slice(0, m0, m1), o);
    cuda::linear(xe, mlp.up, 0, -1, up.slice(0, m0, m1), o);
  }
  const Tensor act = cuda::silu_mul(gate, up, o);  // [M, I]
  Tensor y = Tensor::empty({M, H}, DType::f32, Device::cuda);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m0 = off[e], m1 = off[e + 1];
    if (m0 == m1) continue;
    const MlpRef& mlp = experts[size_t(e)];
    DSA_CHECK(mlp.down.rows() == H, "moe_experts: expert {} returns {} features, expected {}", e,
              mlp.down.rows(), H);
    cuda::linear(act.slice(0, m0, m1), mlp.down, 0, -1, y.slice(0, m0, m1), o);
  }
  combine(y, plan, l, routing, out, T, K, H, add, o.pdl);
}

}  // namespace

Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const KernelOptions& o, const Fp8Act* q, const DerivedExperts* derived,
                   const Tensor* add) {
  const RowView xv = rows_f32(x, "moe_experts input");
  const int64_t T = xv.rows, H = xv.cols, E = int64_t(experts.size());
  const Fp8Act* pre = q != nullptr && q->defined() ? q : nullptr;
  if (pre != nullptr) {
    const int64_t Tp = pre->codes.dim() == 2 ? pre->codes.size(0) : -1;
    DSA_CHECK(H % 128 == 0 && pre->rows == T && Tp >= T && pre->codes.device() == Device::cuda &&
                  pre->codes.dtype() == DType::u8 && pre->codes.is_contiguous() && pre->codes.size(1) == H &&
                  pre->scales.defined() && pre->scales.device() == Device::cuda &&
                  pre->scales.dtype() == DType::f32 && pre->scales.is_contiguous() &&
                  pre->scales.dim() == 2 && pre->scales.size(0) == H / 128 && pre->scales.size(1) == Tp,
              "moe_experts: the input's FP8 copy (codes {}, scales {}, {} rows) does not match {} rows of {}",
              pre->codes.describe(), pre->scales.describe(), pre->rows, T, H);
  }
  DSA_CHECK(routing.ids.defined() && routing.weights.defined() && routing.ids.dim() == 2 &&
                routing.ids.size(0) == T && routing.ids.is_contiguous() && routing.weights.dim() == 2 &&
                routing.weights.is_contiguous() && routing.weights.size(0) == T &&
                routing.weights.size(1) == routing.ids.size(1) && routing.ids.dtype() == DType::i32 &&
                routing.ids.device() == Device::cuda && routing.weights.dtype() == DType::f32 &&
                routing.weights.device() == Device::cuda,
            "moe_experts: routing does not match {} tokens", T);
  DSA_CHECK(E >= 1 && E <= 1024, "moe_experts: {} experts (1..1024 supported)", E);
  const int64_t K = routing.ids.size(1);
  const bool has_add = add != nullptr && add->defined();
  DSA_CHECK(!has_add || (add->dim() == 2 && add->size(0) == T && add->size(1) == H &&
                         add->dtype() == DType::f32 && add->device() == Device::cuda && add->is_contiguous()),
            "moe_experts: the addend {} should be a contiguous CUDA f32 [{}, {}]",
            has_add ? add->describe() : "", T, H);
  const float* add_p = has_add ? add->data<float>() : nullptr;
  Tensor out = Tensor::empty({T, H}, DType::f32, Device::cuda);
  if (T == 0 || K == 0) {
    if (T > 0)
      check_launch(add_p != nullptr ? cudaMemcpyAsync(out.raw_data(), add_p, out.nbytes(),
                                                      cudaMemcpyDeviceToDevice, op_stream())
                                    : cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), op_stream()),
                   "moe_experts");
    return out;
  }
  const PlanLayout l{E, T * K};
  Tensor plan = Tensor::empty({l.size()}, DType::i32, Device::cuda);
  int32_t* pd = plan.data<int32_t>();
  MoeGroupParams g{routing.ids.data<int32_t>(),
                   pd + l.header(),
                   pd + l.offsets(),
                   pd + l.counts(),
                   pd + l.active(),
                   pd + l.rows(),
                   pd + l.pos(),
                   l.pairs,
                   K,
                   int(E)};
  g.pdl = o.pdl;
  check_launch(launch_moe_group(g, op_stream()), "moe_experts grouping");

  const bool capturing = stream_capturing();
  const WeightRef& g0 = experts[0].gate;
  MoeCall call;
  call.pairs = l.pairs;
  call.experts = E;
  call.hidden = H;
  call.inter = g0.weight.defined() && g0.weight.dim() == 2 ? g0.rows() : 0;
  call.fp8_grouped = fp8_grouped_fits(g0, H, o.gemm);
  call.capturing = capturing;
  const MoePath path = select_moe_path(o.moe, call);
  if (path != MoePath::host) {
    // The experts' table: derived at model load, else made for this call (never kept).
    std::shared_ptr<const DerivedExperts> made;
    if (derived == nullptr) {
      DSA_CHECK(!capturing,
                "moe_experts: {} experts without their derived table (Backend::derive_experts, made at model "
                "load) inside a CUDA graph capture, which cannot upload one: derive it before the capture",
                E);
      made = derive_moe_experts(experts);
      derived = made.get();
    } else {
      DSA_CHECK(made_from(*derived, experts),
                "moe_experts: the derived expert table was made from other experts than these {} (derive it "
                "from the experts it is handed with: Backend::derive_experts)",
                E);
    }
    const DerivedExperts& tab = *derived;
    const bool fp8 = path == MoePath::device_fp8 && tab.dtype == DType::f8e4m3fn && tab.block_n == 128 &&
                     tab.block_k == 128;
    if (tab.unusable.empty()) {
      if (fp8) {
        device_fp8_experts(xv, routing, tab, pd, l, K, o.moe_fp8_tile_rows, o.moe_fp8_tail_rows, pre, add_p,
                           out, o.pdl);
      } else {
        device_experts(xv, routing, tab, pd, l, K, add_p, out, o.pdl);
      }
      return out;
    }
    DSA_CHECK(!capturing && o.moe != MoePath::device && o.moe != MoePath::device_fp8,
              "moe_experts: the device path cannot run these experts: {}", tab.unusable);
  }
  host_experts(xv, routing, experts, pd, l, K, add_p, out, o);
  return out;
}

}  // namespace dsaserve::kernels::cuda
