// RoPE: interleaved (written de-interleaved) and NeoX pairings against a complex-rotation reference,
// relative-position invariance of q.k, and the yarn frequencies.
#include <gtest/gtest.h>

#include <complex>

#include "core/error.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::randn;

TEST(Rope, InterleavedAndNeoxMatchComplexRotation) {
  std::mt19937 rng(6);
  const int64_t T = 5, n = 3, D = 16;
  for (bool interleaved : {true, false}) {
    RopeParams p;
    p.dim = D;
    p.theta = 10000.0;
    p.interleaved = interleaved;
    const Tensor x = randn({T, n, D}, rng);
    Tensor y = x.clone();
    const std::vector<int32_t> pos{0, 1, 7, 100, 4095};
    rope_inplace(y, testing::i32(pos), p);
    const std::vector<float> xv = x.to_f32_vector(), yv = y.to_f32_vector();
    const std::vector<float> inv = rope_inv_freq(p);
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const float* r = xv.data() + (t * n + h) * D;
          const std::complex<double> z = interleaved ? std::complex<double>(r[2 * i], r[2 * i + 1])
                                                     : std::complex<double>(r[i], r[i + D / 2]);
          const double ang = double(float(inv[size_t(i)] * float(pos[size_t(t)])));
          const std::complex<double> rot = z * std::polar(1.0, ang);
          const float* o = yv.data() + (t * n + h) * D;  // output: evens (real parts) then odds
          worst = std::max({worst, std::fabs(o[i] - rot.real()), std::fabs(o[i + D / 2] - rot.imag())});
        }
    EXPECT_LT(worst, 1e-5) << (interleaved ? "interleaved" : "neox");
  }
}

TEST(Rope, DotProductDependsOnRelativePosition) {
  std::mt19937 rng(7);
  RopeParams p;
  p.dim = 64;
  p.theta = 1e6;
  const Tensor q = randn({1, 1, 64}, rng), k = randn({1, 1, 64}, rng);
  auto score = [&](int32_t pq, int32_t pk) {
    Tensor a = q.clone(), b = k.clone();
    rope_inplace(a, testing::i32({pq}), p);
    rope_inplace(b, testing::i32({pk}), p);
    const auto av = a.to_f32_vector(), bv = b.to_f32_vector();
    double s = 0;
    for (size_t i = 0; i < av.size(); ++i) s += double(av[i]) * bv[i];
    return s;
  };
  EXPECT_NEAR(score(9, 4), score(25, 20), 1e-4);
  EXPECT_NEAR(score(3, 3), score(0, 0), 1e-4);
}

TEST(Rope, YarnFrequencies) {
  RopeParams p;
  p.dim = 64;
  p.theta = 10000.0;
  p.yarn = true;
  p.factor = 40.0;
  p.original_max_position_embeddings = 4096;
  const std::vector<float> inv = rope_inv_freq(p);
  RopeParams base = p;
  base.yarn = false;
  const std::vector<float> plain = rope_inv_freq(base);
  // High frequencies (short wavelengths) are kept; the lowest are divided by the factor.
  EXPECT_FLOAT_EQ(inv[0], plain[0]);
  EXPECT_NEAR(inv.back(), plain.back() / 40.0f, 1e-12);
  for (size_t i = 1; i < inv.size(); ++i) EXPECT_LE(inv[i], inv[i - 1]);
  // The ramp: low = floor(dim*ln(4096/(32*2pi))/(2 ln 1e4)), high = ceil(... beta_slow = 1 ...).
  const double lo = std::floor(64 * std::log(4096 / (32 * 2 * M_PI)) / (2 * std::log(1e4)));
  const double hi = std::ceil(64 * std::log(4096 / (1 * 2 * M_PI)) / (2 * std::log(1e4)));
  const size_t mid = size_t((lo + hi) / 2);
  const double ramp = (double(mid) - lo) / (hi - lo);
  const double expect = plain[mid] / 40.0 * ramp + plain[mid] * (1 - ramp);
  EXPECT_NEAR(inv[mid], expect, 1e-6 * expect);
}

TEST(Rope, RejectsBadInput) {
  RopeParams p;
  p.dim = 8;
  Tensor x = Tensor::zeros({2, 1, 8}, DType::f32);
  EXPECT_THROW(rope_inplace(x, testing::i32({0}), p), Error);
  EXPECT_THROW(rope_inplace(x, testing::i32({0, -3}), p), Error);
  p.dim = 6;
  EXPECT_THROW(rope_inplace(x, testing::i32({0, 1}), p), Error);
}

}  // namespace
}  // namespace dsaserve::kernels
