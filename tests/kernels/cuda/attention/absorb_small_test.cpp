// The absorbed projections' small-T kernel (attention/absorb_small.cu): both forms against the exact sum (in
// double on the host, from the same bf16 weights and f32 activations) at 1..8 tokens, 8 to 128 heads,
// GLM-5.x's and DeepSeek-V3.2's head dims, activations read through a strided view (q_nope is a slice of
// q); then absorb_q / absorb_v through a backend with KernelOptions::absorb_small_max_tokens, which must be
// the kernel's output bit for bit up to the limit (the dispatch) and the cuBLASLt path's above it; bad
// parameters are refused without a launch. Skips without a GPU.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_test.h"
#include "kernels/cuda/attention/absorb_params.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::rand_f32;
using testing::rand_weight;
using testing::to_cuda;

class CudaAbsorbSmall : public testing::GpuTest {};

struct Dims {
  int64_t heads, nope, dv, latent;
};

// The kernel on kv_b [heads (nope + dv), latent] bf16: rows form (absorb_q) over q [T, heads, nope + 64]'s
// first nope channels, or cols form (absorb_v) over lat [T, heads, latent]. Returns the worst |got - want|
// / sum |terms| over every output.
double check_form(const Dims& d, int64_t T, bool rows_form, uint64_t seed) {
  const int64_t P = d.nope + d.dv;
  const WeightRef w = rand_weight(d.heads * P, d.latent, DType::bf16, seed), wd = to_cuda(w);
  const int64_t K = rows_form ? d.nope : d.latent, N = rows_form ? d.latent : d.dv;
  const int64_t width = rows_form ? d.nope + 64 : d.latent;  // q carries its rope channels after nope
  const Tensor x = rand_f32({T, d.heads, width}, seed + 1, 2.0f), xd = x.to(Device::cuda);
  Tensor out = Tensor::empty({T, d.heads, N}, DType::f32, Device::cuda);
  EXPECT_EQ(cudaMemset(out.raw_data(), 0xff, out.nbytes()), cudaSuccess);  // NaN: every output is written
  AbsorbSmallParams p{};
  p.w = static_cast<const uint16_t*>(wd.weight.raw_data()) + (rows_form ? 0 : d.nope * d.latent);
  p.w_ld = d.latent;
  p.w_bs = P * d.latent;
  p.x = xd.data<float>();
  p.x_ts = d.heads * width;
  p.x_hs = width;
  p.out = out.data<float>();
  p.out_ts = d.heads * N;
  p.out_hs = N;
  p.T = T;
  p.heads = d.heads;
  p.K = K;
  p.N = N;
  p.rows_form = rows_form;
  EXPECT_EQ(launch_absorb_small(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = out.to(Device::cpu).to_f32_vector(), wf = w.weight.to_f32_vector(),
                           xf = x.to_f32_vector();
  double worst = 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t n = 0; n < N; ++n) {
        double want = 0.0, mag = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t row = rows_form ? h * P + k : h * P + d.nope + n, col = rows_form ? n : k;
          const double v =
              double(xf[size_t((t * d.heads + h) * width + k)]) * double(wf[size_t(row * d.latent + col)]);
          want += v;
          mag += std::fabs(v);
        }
        const float g = got[size_t((t * d.heads + h) * N + n)];
        const double e = std::isfinite(g) ? std::fabs(double(g) - want) / std::max(mag, 1e-30) : INFINITY;
        worst = std::max(worst, e);
      }
  return worst;
}

TEST_F(CudaAbsorbSmall, BothFormsAreTheExactSum) {
  constexpr double kTol = 1e-5;              // f32 products and sums of <= 512 terms: ~1e-7 of the magnitudes
  const Dims dims[] = {{64, 192, 256, 512},  // GLM-5.x, one GPU
                       {8, 192, 256, 512},   // GLM-5.x at TP 8
                       {16, 128, 128, 512},  // DeepSeek-V3.2 at TP 8
                       {128, 128, 128, 512},  // DeepSeek-V3.2, one GPU
                       {3, 24, 40, 200}};     // odd: a partial CTA of outputs in both forms
  double worst = 0.0;
  for (const Dims& d : dims)
    for (int64_t T : {1, 2, 3, 4, 5, 8})
      for (bool rows_form : {true, false}) {
        const double e = check_form(d, T, rows_form, 100 + uint64_t(d.heads + T));
        worst = std::max(worst, e);
        EXPECT_LE(e, kTol) << (rows_form ? "rows" : "cols") << " heads " << d.heads << " nope " << d.nope
                           << " dv " << d.dv << " latent " << d.latent << " T " << T;
      }
  fmt::print("RESULT op=absorb_small_exact max_err_rel_to_abs_sum={:.3g}\n", worst);
}

// absorb_q / absorb_v through backends: up to the limit the small kernel's output bit for bit (the
// backend dispatches to it), past it (and with the limit 0) the cuBLASLt path, within the op table's bf16
// tolerance of the small kernel's (which does not round the activations to bf16).
TEST_F(CudaAbsorbSmall, BackendDispatchesUpToTheLimit) {
  const int64_t H = 64, nope = 192, dv = 256, L = 512, P = nope + dv;
  WeightRef w = to_cuda(rand_weight(H * P, L, DType::bf16, 77));
  KernelOptions small_o, off_o;
  small_o.absorb_small_max_tokens = 4;
  off_o.absorb_small_max_tokens = 0;
  const std::shared_ptr<Backend> small_be = make_backend(small_o), off_be = make_backend(off_o);
  for (int64_t T : {1, 4, 5}) {
    const Tensor q = rand_f32({T, H, nope + 64}, 80 + uint64_t(T)).to(Device::cuda);
    const Tensor lat = rand_f32({T, H, L}, 90 + uint64_t(T)).to(Device::cuda);
    const Tensor q_nope = q.slice(2, 0, nope);
    const Tensor aq = small_be->absorb_q(q_nope, w, {}), av = small_be->absorb_v(lat, w, dv, {});
    const Tensor bq = off_be->absorb_q(q_nope, w, {}), bv = off_be->absorb_v(lat, w, dv, {});
    // The kernel launched directly on the same operands.
    Tensor kq = Tensor::empty({T, H, L}, DType::f32, Device::cuda),
           kv = Tensor::empty({T, H, dv}, DType::f32, Device::cuda);
    for (bool rows_form : {true, false}) {
      AbsorbSmallParams p{};
      p.w = static_cast<const uint16_t*>(w.weight.raw_data()) + (rows_form ? 0 : nope * L);
      p.w_ld = L;
      p.w_bs = P * L;
      p.x = rows_form ? q.data<float>() : lat.data<float>();
      p.x_ts = rows_form ? H * (nope + 64) : H * L;
      p.x_hs = rows_form ? nope + 64 : L;
      p.out = rows_form ? kq.data<float>() : kv.data<float>();
      p.out_ts = H * (rows_form ? L : dv);
      p.out_hs = rows_form ? L : dv;
      p.T = T;
      p.heads = H;
      p.K = rows_form ? nope : L;
      p.N = rows_form ? L : dv;
      p.rows_form = rows_form;
      ASSERT_EQ(launch_absorb_small(p, nullptr), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto same = [](const Tensor& a, const Tensor& b) {
      const std::vector<float> x = a.to(Device::cpu).to_f32_vector(), y = b.to(Device::cpu).to_f32_vector();
      return x == y;
    };
    const bool small = T <= small_o.absorb_small_max_tokens;
    EXPECT_EQ(same(aq, kq), small) << "absorb_q T=" << T;
    EXPECT_EQ(same(av, kv), small) << "absorb_v T=" << T;
    EXPECT_LE(testing::row_l2_rel_error(bq, kq), 1e-2) << "absorb_q T=" << T;
    EXPECT_LE(testing::row_l2_rel_error(bv, kv), 1e-2) << "absorb_v T=" << T;
    if (!small) {
      EXPECT_TRUE(same(aq, bq)) << "absorb_q T=" << T;
      EXPECT_TRUE(same(av, bv)) << "absorb_v T=" << T;
    }
  }
}

// An FP8 kv_b takes the kernel on its bf16 dequantisation: with the derived copy a model holds, and without
// one (dequantised by the call, in the kernel just before: with programmatic dependent launches on, the
// kernel must not read the weight before that kernel's writes are visible). All three equal bit for bit.
TEST_F(CudaAbsorbSmall, Fp8KvBWithAndWithoutItsDerivedCopy) {
  const int64_t H = 64, nope = 192, dv = 256, L = 512, P = nope + dv;
  const WeightRef w = to_cuda(rand_weight(H * P, L, DType::f8e4m3fn, 78));
  KernelOptions o, o_pdl;
  o.absorb_small_max_tokens = 8;
  o_pdl.absorb_small_max_tokens = 8;
  o_pdl.pdl = true;
  const std::shared_ptr<Backend> be = make_backend(o), be_pdl = make_backend(o_pdl);
  WeightRef held = w;
  held.derived = be->derive_weight(w, WeightUse::absorb);
  ASSERT_TRUE(held.derived && held.derived->bf16.defined());
  auto bits = [](const Tensor& t) { return t.to(Device::cpu).to_f32_vector(); };
  for (int64_t T : {1, 8}) {
    const Tensor q = rand_f32({T, H, nope + 64}, 81 + uint64_t(T)).to(Device::cuda).slice(2, 0, nope);
    const Tensor lat = rand_f32({T, H, L}, 91 + uint64_t(T)).to(Device::cuda);
    const std::vector<float> q_held = bits(be->absorb_q(q, held, {})),
                             v_held = bits(be->absorb_v(lat, held, dv, {}));
    for (int rep = 0; rep < 3; ++rep) {  // the per-call dequantisation's buffer is new each time
      EXPECT_EQ(bits(be->absorb_q(q, w, {})), q_held) << "T=" << T;
      EXPECT_EQ(bits(be->absorb_v(lat, w, dv, {})), v_held) << "T=" << T;
      EXPECT_EQ(bits(be_pdl->absorb_q(q, w, {})), q_held) << "pdl T=" << T;
      EXPECT_EQ(bits(be_pdl->absorb_v(lat, w, dv, {})), v_held) << "pdl T=" << T;
    }
  }
}

TEST_F(CudaAbsorbSmall, BadParametersAreRefused) {
  Tensor w = Tensor::empty({64, 64}, DType::bf16, Device::cuda),
         x = Tensor::empty({8, 64}, DType::f32, Device::cuda),
         o = Tensor::empty({8, 64}, DType::f32, Device::cuda);
  AbsorbSmallParams good{};
  good.w = static_cast<const uint16_t*>(w.raw_data());
  good.w_ld = 64;
  good.w_bs = 0;
  good.x = x.data<float>();
  good.x_ts = 64;
  good.x_hs = 0;
  good.out = o.data<float>();
  good.out_ts = 64;
  good.T = 1;
  good.heads = 1;
  good.K = 64;
  good.N = 64;
  good.rows_form = true;
  EXPECT_EQ(launch_absorb_small(good, nullptr), cudaSuccess);
  auto refused = [&](auto change) {
    AbsorbSmallParams p = good;
    change(p);
    return launch_absorb_small(p, nullptr) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.T = 0; }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.T = kAbsorbSmallMaxTokens + 1; }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.K = kAbsorbSmallMaxK + 8; }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) {
    p.rows_form = false;
    p.K = kAbsorbSmallColsMaxK + 8;
  }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.N = 60; }));  // rows form: N % 8
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) {
    p.rows_form = false;
    p.K = 60;  // cols form: K % 8
  }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.w_ld = 60; }));
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.w = p.w + 1; }));  // not 16-byte aligned
  EXPECT_TRUE(refused([](AbsorbSmallParams& p) { p.x = nullptr; }));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
