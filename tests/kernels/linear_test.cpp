// CPU operators against straightforward references: linear (bf16, f32, FP8 blocks; row ranges; the
// transposed form), embedding, norms, SiLU-and-mul, argmax and the row helpers.
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::randn;
using testing::random_weight;
using testing::rel_error;

struct LinearCase {
  DType dt;
  int64_t T, out, in;
};

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, MatchesReference) {
  const LinearCase c = GetParam();
  std::mt19937 rng(1);
  const auto w = random_weight(c.out, c.in, c.dt, rng);
  const Tensor x = randn({c.T, c.in}, rng);
  const float* xp = x.data<float>();
  // All rows, then a ragged row range written into a column slice of a wider output.
  const int64_t r0 = c.out / 3, r1 = c.out - 1;
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t b = pass == 0 ? 0 : r0, e = pass == 0 ? c.out : r1;
    std::vector<double> ref(size_t(c.T * (e - b)));
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t r = b; r < e; ++r) {
        double s = 0;
        for (int64_t k = 0; k < c.in; ++k) s += double(xp[t * c.in + k]) * w.value[size_t(r * c.in + k)];
        ref[size_t(t * (e - b) + (r - b))] = s;
      }
    Tensor y;
    if (pass == 0) {
      y = linear(x, w.ref);
    } else {
      Tensor wide = Tensor::zeros({c.T, (e - b) + 5}, DType::f32);
      y = linear(x, w.ref, b, e, wide.slice(1, 2, 2 + (e - b)));
    }
    EXPECT_LT(rel_error(y, ref), 2e-6) << dtype_name(c.dt) << " pass " << pass;
  }
  // Transposed: x2 [T, rows] @ W[r0:r1] -> [T, in].
  const Tensor x2 = randn({c.T, r1 - r0}, rng);
  const float* x2p = x2.data<float>();
  std::vector<double> ref(size_t(c.T * c.in));
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t k = 0; k < c.in; ++k) {
      double s = 0;
      for (int64_t r = r0; r < r1; ++r)
        s += double(x2p[t * (r1 - r0) + (r - r0)]) * w.value[size_t(r * c.in + k)];
      ref[size_t(t * c.in + k)] = s;
    }
  EXPECT_LT(rel_error(linear_t(x2, w.ref, r0, r1), ref), 2e-6);
}

INSTANTIATE_TEST_SUITE_P(Cpu, LinearTest,
                         ::testing::Values(LinearCase{DType::f32, 3, 37, 29},
                                           LinearCase{DType::bf16, 1, 64, 256},
                                           LinearCase{DType::bf16, 17, 130, 96},
                                           LinearCase{DType::f8e4m3fn, 5, 300, 260},
                                           LinearCase{DType::f8e4m3fn, 1, 129, 512}));

TEST(LinearTest, RejectsBadShapes) {
  std::mt19937 rng(2);
  const auto w = random_weight(8, 16, DType::bf16, rng);
  EXPECT_THROW(linear(randn({2, 15}, rng), w.ref), Error);
  EXPECT_THROW(linear(randn({2, 16}, rng), w.ref, 4, 9), Error);
  WeightRef no_scale = random_weight(8, 16, DType::f8e4m3fn, rng).ref;
  no_scale.scale_inv = Tensor();
  EXPECT_THROW(linear(randn({2, 16}, rng), no_scale), Error);
}

TEST(Embedding, LooksUpRowsAndRejectsBadIds) {
  std::mt19937 rng(3);
  const auto table = random_weight(50, 12, DType::bf16, rng);
  const Tensor y = embedding(table.ref.weight, testing::i32({3, 0, 49, 3}));
  std::vector<double> ref;
  for (int id : {3, 0, 49, 3})
    for (int c = 0; c < 12; ++c) ref.push_back(table.value[size_t(id * 12 + c)]);
  EXPECT_EQ(rel_error(y, ref), 0.0);
  EXPECT_THROW(embedding(table.ref.weight, testing::i32({50})), Error);
  EXPECT_THROW(embedding(table.ref.weight, testing::i32({-1})), Error);
}

TEST(Norms, RmsNormFusedAddAndLayerNorm) {
  std::mt19937 rng(4);
  const int64_t T = 7, D = 300;
  const Tensor x = randn({T, D}, rng, 3.0f), d = randn({T, D}, rng);
  const auto w = random_weight(1, D, DType::bf16, rng);
  const Tensor wv = w.ref.weight.view({D});
  const auto b = random_weight(1, D, DType::f32, rng);
  const double eps = 1e-5;
  auto rms_ref = [&](const std::vector<double>& in) {
    std::vector<double> out(in.size());
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += in[size_t(t * D + i)] * in[size_t(t * D + i)];
      const double r = 1.0 / std::sqrt(ss / D + eps);
      for (int64_t i = 0; i < D; ++i) out[size_t(t * D + i)] = in[size_t(t * D + i)] * r * w.value[size_t(i)];
    }
    return out;
  };
  const std::vector<double> xv = testing::as_double(x), dv = testing::as_double(d);
  EXPECT_LT(rel_error(rms_norm(x, wv, eps), rms_ref(xv)), 1e-6);
  std::vector<double> sum(xv.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(float(xv[i] + dv[i]));
  Tensor residual = x.clone();
  const Tensor y = add_rms_norm(residual, d, wv, eps);
  EXPECT_LT(rel_error(residual, sum), 1e-7);
  EXPECT_LT(rel_error(y, rms_ref(sum)), 1e-6);
  // LayerNorm with bias (biased variance).
  std::vector<double> ln(xv.size());
  for (int64_t t = 0; t < T; ++t) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < D; ++i) m += xv[size_t(t * D + i)];
    m /= D;
    for (int64_t i = 0; i < D; ++i) v += (xv[size_t(t * D + i)] - m) * (xv[size_t(t * D + i)] - m);
    v /= D;
    for (int64_t i = 0; i < D; ++i)
      ln[size_t(t * D + i)] =
          (xv[size_t(t * D + i)] - m) / std::sqrt(v + 1e-6) * w.value[size_t(i)] + b.value[size_t(i)];
  }
  EXPECT_LT(rel_error(layer_norm(x, wv, b.ref.weight.view({D}), 1e-6), ln), 1e-6);
}

TEST(Elementwise, SiluMulArgmaxAddCopyGather) {
  std::mt19937 rng(5);
  const Tensor g = randn({4, 33}, rng, 4.0f), u = randn({4, 33}, rng);
  std::vector<double> ref;
  const std::vector<double> gv = testing::as_double(g), uv = testing::as_double(u);
  for (size_t i = 0; i < gv.size(); ++i) ref.push_back(gv[i] / (1 + std::exp(-gv[i])) * uv[i]);
  EXPECT_LT(rel_error(silu_mul(g, u), ref), 1e-6);

  Tensor x = Tensor::from_vector({1, 5, 5, 2, -1, -3, -1, -2}, {2, 4});
  const Tensor am = argmax(x);
  EXPECT_EQ(am.data<int32_t>()[0], 1);  // ties: the first maximum
  EXPECT_EQ(am.data<int32_t>()[1], 0);

  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  add_inplace(a, Tensor::from_vector({10, 20, 30, 40}, {2, 2}));
  EXPECT_EQ(a.to_f32_vector(), (std::vector<float>{11, 22, 33, 44}));
  Tensor wide = Tensor::zeros({2, 4}, DType::f32);
  Tensor cols = wide.slice(1, 1, 3);
  copy_rows(cols, a);
  EXPECT_EQ(wide.to_f32_vector(), (std::vector<float>{0, 11, 22, 0, 0, 33, 44, 0}));
  const Tensor gr = gather_rows(a, testing::i32({1, 1, 0}));
  EXPECT_EQ(gr.to_f32_vector(), (std::vector<float>{33, 44, 33, 44, 11, 22}));
  EXPECT_THROW(gather_rows(a, testing::i32({2})), Error);
}

}  // namespace
}  // namespace dsaserve::kernels
