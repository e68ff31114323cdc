// MoE: the grouped sigmoid router and the routed experts against straightforward references.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::randn;
using testing::random_weight;
using testing::rel_error;

TEST(MoeRoute, GroupedTopkNormalisedAndScaled) {
  std::mt19937 rng(12);
  const int64_t T = 9, E = 8;
  const Tensor logits = randn({T, E}, rng, 2.0f);
  const Tensor bias = randn({E}, rng, 0.1f);
  MoeRouteParams p;
  p.n_group = 2;
  p.topk_group = 1;
  p.top_k = 3;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5;
  const Routing r = moe_route(logits, bias, p);
  const auto lv = testing::as_double(logits), bv = testing::as_double(bias);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), ch(E);
    for (int64_t e = 0; e < E; ++e) {
      s[size_t(e)] = 1 / (1 + std::exp(-lv[size_t(t * E + e)]));
      ch[size_t(e)] = s[size_t(e)] + bv[size_t(e)];
    }
    // Group score = sum of the two best choices of each group of 4; keep the best group.
    double g[2];
    for (int gi = 0; gi < 2; ++gi) {
      std::vector<double> v(ch.begin() + gi * 4, ch.begin() + gi * 4 + 4);
      std::sort(v.rbegin(), v.rend());
      g[gi] = v[0] + v[1];
    }
    const int keep = g[1] > g[0] ? 1 : 0;
    std::vector<int32_t> idx(4);
    std::iota(idx.begin(), idx.end(), keep * 4);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return ch[size_t(a)] > ch[size_t(b)]; });
    double sum = 0;
    for (int k = 0; k < 3; ++k) sum += s[size_t(idx[size_t(k)])];
    std::vector<std::pair<int32_t, double>> expect, got;
    for (int k = 0; k < 3; ++k) {
      expect.emplace_back(idx[size_t(k)], s[size_t(idx[size_t(k)])] / sum * 2.5);
      got.emplace_back(r.ids.data<int32_t>()[t * 3 + k], r.weights.data<float>()[t * 3 + k]);
    }
    std::sort(expect.begin(), expect.end());
    std::sort(got.begin(), got.end());
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(got[size_t(k)].first, expect[size_t(k)].first) << "token " << t;
      EXPECT_NEAR(got[size_t(k)].second, expect[size_t(k)].second, 1e-6);
    }
  }
}

TEST(MoeRoute, TiesPreferLowerExpertsAndBadParamsThrow) {
  const Tensor logits = Tensor::zeros({1, 6}, DType::f32);
  const Tensor bias = Tensor::zeros({6}, DType::f32);
  MoeRouteParams p;
  p.top_k = 2;
  p.norm_topk_prob = false;
  const Routing r = moe_route(logits, bias, p);
  EXPECT_EQ(r.ids.data<int32_t>()[0], 0);
  EXPECT_EQ(r.ids.data<int32_t>()[1], 1);
  EXPECT_FLOAT_EQ(r.weights.data<float>()[0], 0.5f);
  p.n_group = 4;  // 6 experts do not split into 4 groups
  EXPECT_THROW(moe_route(logits, bias, p), Error);
}

TEST(MoeExperts, WeightedSumOfExpertMlps) {
  std::mt19937 rng(13);
  const int64_t T = 6, H = 40, I = 24, E = 5, K = 2;
  std::vector<testing::TestWeight> g, u, d;
  std::vector<MlpRef> experts;
  for (int64_t e = 0; e < E; ++e) {
    const DType dt = e % 2 ? DType::f8e4m3fn : DType::bf16;
    g.push_back(random_weight(I, H, dt, rng));
    u.push_back(random_weight(I, H, dt, rng));
    d.push_back(random_weight(H, I, dt, rng));
    experts.push_back({g.back().ref, u.back().ref, d.back().ref});
  }
  const Tensor x = randn({T, H}, rng);
  Routing r{Tensor::empty({T, K}, DType::i32), Tensor::empty({T, K}, DType::f32)};
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    r.ids.data<int32_t>()[t * K] = int32_t(t % E);
    r.ids.data<int32_t>()[t * K + 1] = int32_t((t + 2) % E);
    r.weights.data<float>()[t * K] = uw(rng);
    r.weights.data<float>()[t * K + 1] = uw(rng);
  }
  const auto xv = testing::as_double(x);
  std::vector<double> ref(size_t(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = r.ids.data<int32_t>()[t * K + k];
      std::vector<double> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double gs = 0, us = 0;
        for (int64_t c = 0; c < H; ++c) {
          gs += xv[size_t(t * H + c)] * g[size_t(e)].value[size_t(i * H + c)];
          us += xv[size_t(t * H + c)] * u[size_t(e)].value[size_t(i * H + c)];
        }
        a[size_t(i)] = gs / (1 + std::exp(-gs)) * us;
      }
      for (int64_t c = 0; c < H; ++c) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += a[size_t(i)] * d[size_t(e)].value[size_t(c * I + i)];
        ref[size_t(t * H + c)] += r.weights.data<float>()[t * K + k] * y;
      }
    }
  EXPECT_LT(rel_error(moe_experts(x, r, experts), ref), 2e-6);
  // An addend (the shared expert's output) is added after the sum: add_inplace's values bit for bit; one of
  // another shape throws.
  const Tensor add = randn({T, H}, rng);
  Tensor want = moe_experts(x, r, experts);
  add_inplace(want, add);
  const Tensor got = moe_experts(x, r, experts, nullptr, nullptr, &add);
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), size_t(want.nbytes())), 0);
  const Tensor bad = Tensor::zeros({T + 1, H}, DType::f32);
  EXPECT_THROW(moe_experts(x, r, experts, nullptr, nullptr, &bad), Error);
  r.ids.data<int32_t>()[0] = int32_t(E);
  EXPECT_THROW(moe_experts(x, r, experts), Error);
}

// The input's FP8 copy (a DeepEP FP8 dispatch's codes and scales, quantised once on the sender by
// fp8_quantize_row128): fp8_quant_dequant's values exactly, and the experts of the FP8 emulation that read
// it give, bit for bit, their own quantisation's result (re-quantising the dequantised rows would not: a
// group's scale amax / 448 does not always survive * 448 / 448, ~10% of f32 scales move by one ulp); the
// reference backend, which quantises nothing, computes on x.
TEST(MoeExperts, PreQuantisedInputIsTheEmulationsOwnQuantisation) {
  std::mt19937 rng(17);
  const int64_t T = 9, H = 256, I = 128, E = 4, K = 2;
  std::vector<MlpRef> experts;
  for (int64_t e = 0; e < E; ++e)
    experts.push_back({random_weight(I, H, DType::f8e4m3fn, rng).ref,
                       random_weight(I, H, DType::f8e4m3fn, rng).ref,
                       random_weight(H, I, DType::f8e4m3fn, rng).ref});
  Tensor x = randn({T, H}, rng);
  x.data<float>()[5] = 0.0f;
  for (int64_t c = 128; c < 256; ++c) x.data<float>()[H + c] *= 1e-3f;  // a small group beside a large one
  for (int64_t c = 0; c < 128; ++c) x.data<float>()[2 * H + c] = 0.0f;  // an all-zero group: scale 1
  Routing r{Tensor::empty({T, K}, DType::i32), Tensor::empty({T, K}, DType::f32)};
  for (int64_t t = 0; t < T; ++t) {
    r.ids.data<int32_t>()[t * K] = int32_t(t % E);
    r.ids.data<int32_t>()[t * K + 1] = int32_t((t + 1) % E);
    r.weights.data<float>()[t * K] = 0.25f + 0.1f * float(t);
    r.weights.data<float>()[t * K + 1] = 0.5f;
  }
  // The sender's quantisation, in the Fp8Act layout (scales [H / 128, Tp], Tp = T + 3 rows of padding).
  const int64_t Tp = T + 3, G = H / 128;
  Fp8Act q{Tensor::zeros({Tp, H}, DType::u8), Tensor::zeros({G, Tp}, DType::f32), T};
  for (int64_t t = 0; t < T; ++t)
    cpu::fp8_quantize_row128(x.data<float>() + t * H, H, q.codes.data_u8() + t * H,
                             q.scales.data<float>() + t, Tp);
  const Tensor ref_dq = cpu::fp8_quant_dequant(x);
  Tensor xdq = Tensor::empty({T, H}, DType::f32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c)
      xdq.data<float>()[t * H + c] =
          f8e4m3fn_to_f32(q.codes.data_u8()[t * H + c]) * q.scales.data<float>()[(c / 128) * Tp + t];
  EXPECT_EQ(std::memcmp(xdq.raw_data(), ref_dq.raw_data(), size_t(xdq.nbytes())), 0);
  EXPECT_EQ(q.scales.data<float>()[2], 1.0f);  // row 2's zero group

  cpu::Fp8Emulation emu;
  emu.enabled = true;
  const std::shared_ptr<Backend> b = make_fp8_emulation_backend(emu);
  const Tensor want = b->moe_experts(x, r, experts, nullptr, nullptr, nullptr);
  const Tensor got = b->moe_experts(xdq, r, experts, &q, nullptr, nullptr);
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), size_t(want.nbytes())), 0);
  // The reference backend ignores q: the experts of the quantised rows.
  const Tensor plain = backend(Device::cpu).moe_experts(xdq, r, experts, &q, nullptr, nullptr);
  const Tensor plain_x = backend(Device::cpu).moe_experts(xdq, r, experts, nullptr, nullptr, nullptr);
  EXPECT_EQ(std::memcmp(plain.raw_data(), plain_x.raw_data(), size_t(plain.nbytes())), 0);
  // A copy that does not match the rows is an error.
  Fp8Act short_q = q;
  short_q.rows = T - 1;
  EXPECT_THROW(b->moe_experts(xdq, r, experts, &short_q, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace dsaserve::kernels
