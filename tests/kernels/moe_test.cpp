// MoE: the grouped sigmoid router and the routed experts against straightforward references.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
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
  r.ids.data<int32_t>()[0] = int32_t(E);
  EXPECT_THROW(moe_experts(x, r, experts), Error);
}

}  // namespace
}  // namespace dsaserve::kernels
