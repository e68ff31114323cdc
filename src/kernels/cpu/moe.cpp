// Mixture of experts on the CPU: sigmoid router with grouped top-k, and the routed experts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

// Indices of the k largest values (ties: lower index first), in descending order of value.
std::vector<int32_t> top_indices(const std::vector<float>& v, int64_t k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

}  // namespace

Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p,
                  const TopkObserver* observer) {
  const Rows lr = as_rows(logits, "moe_route logits");
  const int64_t T = lr.rows, E = lr.cols;
  DSA_CHECK(bias.defined() && bias.dtype() == DType::f32 && bias.dim() == 1 && bias.size(0) == E &&
                bias.is_contiguous() && bias.device() == Device::cpu,
            "moe_route: correction bias must be CPU f32 [{}]", E);
  p.validate(E);
  const int64_t per_group = E / p.n_group;
  const float* b = bias.data<float>();
  Routing r{Tensor::empty({T, p.top_k}, DType::i32), Tensor::empty({T, p.top_k}, DType::f32)};
  int32_t* ids = r.ids.data<int32_t>();
  float* wts = r.weights.data<float>();
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E)),
      group(static_cast<size_t>(p.n_group));
  Tensor observed = observer ? Tensor::empty({T, E}, DType::f32) : Tensor();
  for (int64_t t = 0; t < T; ++t) {
    const float* l = lr.row(t);
    for (int64_t e = 0; e < E; ++e) {
      s[size_t(e)] = 1.0f / (1.0f + std::exp(-l[e]));
      choice[size_t(e)] = s[size_t(e)] + b[e];
    }
    if (p.n_group > 1) {
      // Group score: the sum of its two best choices; keep topk_group groups, mask the others.
      const int64_t best = std::min<int64_t>(2, per_group);
      for (int64_t g = 0; g < p.n_group; ++g) {
        std::vector<float> in(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
        const std::vector<int32_t> top = top_indices(in, best);
        float sum = 0.0f;
        for (int32_t i : top) sum += in[size_t(i)];
        group[size_t(g)] = sum;
      }
      const std::vector<int32_t> keep = top_indices(group, p.topk_group);
      std::vector<bool> kept(size_t(p.n_group), false);
      for (int32_t g : keep) kept[size_t(g)] = true;
      for (int64_t e = 0; e < E; ++e) {
        if (!kept[size_t(e / per_group)]) choice[size_t(e)] = -std::numeric_limits<float>::infinity();
      }
    }
    if (observer) std::copy(choice.begin(), choice.end(), observed.data<float>() + t * E);
    const std::vector<int32_t> chosen = top_indices(choice, p.top_k);
    float sum = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) sum += s[size_t(chosen[size_t(k)])];
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int32_t e = chosen[size_t(k)];
      float w = s[size_t(e)];
      if (p.norm_topk_prob) w /= (sum + 1e-20f);
      ids[t * p.top_k + k] = e;
      wts[t * p.top_k + k] = float(w * p.routed_scaling_factor);
    }
  }
  if (observer) (*observer)("moe_route", observed, r.ids);
  return r;
}

Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const Fp8Emulation* emu, const Fp8Act* q) {
  const Rows xr = as_rows(x, "moe_experts input");
  const int64_t T = xr.rows, H = xr.cols, E = int64_t(experts.size());
  // The input's FP8 copy read instead of quantising x (an enabled group128 emulation only): the gate / up
  // linears then run with the emulation's arithmetic but no input quantisation (Fp8ActScale::none), on
  // q's values, which are fp8_quant_dequant's values of x when q was quantised from x
  // (fp8_quantize_row128): quantising once on a DeepEP sender gives the receiver's numbers exactly.
  const bool pre =
      q != nullptr && q->defined() && emu != nullptr && emu->enabled && emu->scale == Fp8ActScale::group128;
  Tensor xdq;  // f32 [T, H]: q's values
  Fp8Emulation gate_up_emu;
  if (pre) {
    const int64_t G = H / 128, Tp = q->codes.dim() == 2 ? q->codes.size(0) : -1;
    DSA_CHECK(H % 128 == 0 && q->rows == T && Tp >= T && q->codes.device() == Device::cpu &&
                  q->codes.dtype() == DType::u8 && q->codes.is_contiguous() && q->codes.size(1) == H &&
                  q->scales.defined() && q->scales.device() == Device::cpu &&
                  q->scales.dtype() == DType::f32 && q->scales.is_contiguous() && q->scales.dim() == 2 &&
                  q->scales.size(0) == G && q->scales.size(1) == Tp,
              "moe_experts: the input's FP8 copy (codes {}, scales {}, {} rows) does not match {} rows of {}",
              q->codes.describe(), q->scales.describe(), q->rows, T, H);
    xdq = Tensor::empty({T, H}, DType::f32);
    const uint8_t* c = q->codes.data_u8();
    const float* sc = q->scales.data<float>();
    float* d = xdq.data<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) d[t * H + i] = f8e4m3fn_to_f32(c[t * H + i]) * sc[(i / 128) * Tp + t];
    gate_up_emu = *emu;
    gate_up_emu.scale = Fp8ActScale::none;
  }
  const Rows in = pre ? as_rows(xdq, "moe_experts input") : xr;
  const Fp8Emulation* in_emu = pre ? &gate_up_emu : emu;
  DSA_CHECK(routing.ids.dim() == 2 && routing.ids.size(0) == T && routing.ids.is_contiguous() &&
                routing.weights.dim() == 2 && routing.weights.is_contiguous() &&
                routing.weights.size(1) == routing.ids.size(1),
            "moe_experts: routing does not match {} tokens", T);
  const int64_t K = routing.ids.size(1);
  const int32_t* ids = routing.ids.data<int32_t>();
  const float* wts = routing.weights.data<float>();
  // Tokens per expert, in token order.
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(E));
  std::vector<std::vector<float>> w_of(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids[t * K + k];
      DSA_CHECK(e >= 0 && e < E, "moe_experts: expert {} of token {} outside [0, {})", e, t, E);
      rows_of[size_t(e)].push_back(int32_t(t));
      w_of[size_t(e)].push_back(wts[t * K + k]);
    }
  }
  Tensor out = Tensor::zeros({T, H}, DType::f32);
  float* o = out.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = rows_of[size_t(e)];
    if (rows.empty()) continue;
    const int64_t m = int64_t(rows.size());
    Tensor xe = Tensor::empty({m, H}, DType::f32);
    for (int64_t i = 0; i < m; ++i) std::copy_n(in.row(rows[size_t(i)]), H, xe.data<float>() + i * H);
    const MlpRef& mlp = experts[size_t(e)];
    const Tensor a = cpu::silu_mul(cpu::linear(xe, mlp.gate, 0, -1, {}, in_emu),
                                   cpu::linear(xe, mlp.up, 0, -1, {}, in_emu));
    const Tensor y = cpu::linear(a, mlp.down, 0, -1, {}, emu);
    DSA_CHECK(y.size(1) == H, "moe_experts: expert {} returns {} features, expected {}", e, y.size(1), H);
    const float* yp = y.data<float>();
    for (int64_t i = 0; i < m; ++i) {
      const float w = w_of[size_t(e)][size_t(i)];
      float* dst = o + int64_t(rows[size_t(i)]) * H;
      for (int64_t c = 0; c < H; ++c) dst[c] += w * yp[i * H + c];
    }
  }
  return out;
}

}  // namespace dsaserve::kernels::cpu
