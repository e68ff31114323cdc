// The f32-activation bf16 GEMM (gemm_f32act.cu): the kernel against the exact sum it implements (in double
// on the host: the two-term split hi = bf16(x), lo = bf16(x - hi), or x rounded to bf16, times the bf16
// weight), for both weight layouts, both token tiles, ragged token and output counts, two segments, a head
// batch with strided activations and outputs, and outputs that must stay untouched around the written ones;
// then the operators that take it at prefill sizes: linear / linear_multi on router- and indexer-shaped
// weights (the narrow two-term recipe) and absorb_q / absorb_v at GLM-5.3's 64 heads, against the CPU and
// against the paths they replace (split pass + cuBLASLt; conversion pass + cuBLASLt's strided batch).
// Skips without a GPU.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemm_f32act_params.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::bits_equal;
using testing::rand_f32;
using testing::rand_weight;
using testing::report_gemm;
using testing::row_l2_rel_error;
using testing::to_cuda;

class CudaF32ActGemm : public testing::GpuTest {};

double bf16_round(float x) { return double(bf16_to_f32(f32_to_bf16(x))); }
// The activation as the kernel multiplies it: hi + lo (split) or hi.
double act_value(float x, bool split) {
  const float h = bf16_to_f32(f32_to_bf16(x));
  return split ? double(h) + bf16_round(x - h) : double(h);
}

struct KernelCase {
  int64_t T, K, batch;
  std::vector<int64_t> N;  // one per segment
  bool split, trans;
  int tile;             // 0 (the launcher's choice), 32, 64 or 128 (one term only)
  int64_t x_pad = 0;    // extra f32 per activation row (x_ld = K + x_pad, or the head stride)
  int64_t out_pad = 0;  // extra f32 per output row, sentinel-filled: must stay untouched
};

// Runs one launch on random operands and returns the worst |got - want| / sum |terms| over every output;
// fails the test where a padding value changed.
double check_case(const KernelCase& c, uint64_t seed) {
  const int segs = int(c.N.size());
  // Activations [batch][T][K] laid out as [T][batch][K + x_pad] (the absorbed projections' head-strided
  // views): x_ld = batch (K + x_pad), x_bs = K + x_pad.
  const int64_t xs = c.K + c.x_pad, x_ld = c.batch * xs;
  const Tensor x = rand_f32({c.T, x_ld}, seed, 3.0f);
  const Tensor xd = x.to(Device::cuda);
  std::vector<Tensor> w, wd, out_d;
  std::vector<int64_t> out_ld(static_cast<size_t>(segs), 0);
  F32ActGemmParams p{};
  p.x = xd.data<float>();
  p.x_ld = x_ld;
  p.x_bs = xs;
  p.T = c.T;
  p.K = c.K;
  p.batch = int(c.batch);
  p.split = c.split;
  p.trans_w = c.trans;
  p.tile_tokens = c.tile;
  p.segments = segs;
  for (int s = 0; s < segs; ++s) {
    const int64_t N = c.N[size_t(s)];
    // Weights of every head back to back: [batch][N][K] or [batch][K][N].
    w.push_back(testing::rand_bf16({c.batch * N * c.K}, seed + 10 + uint64_t(s)));
    wd.push_back(w.back().to(Device::cuda));
    out_ld[size_t(s)] = c.batch * (N + c.out_pad);  // outputs [T][batch][N + out_pad]
    std::vector<float> sentinel(size_t(c.T * out_ld[size_t(s)]), -7.25f);
    Tensor o = Tensor::empty({c.T, out_ld[size_t(s)]}, DType::f32);
    std::memcpy(o.raw_data(), sentinel.data(), sentinel.size() * 4);
    out_d.push_back(o.to(Device::cuda));
    p.seg[s] = {wd.back().data_u16(), c.trans ? N : c.K, out_d.back().data<float>(), out_ld[size_t(s)], N};
  }
  // One batch stride for every segment: the tests give a batch only with one segment.
  p.w_bs = c.N[0] * c.K;
  p.out_bs = c.N[0] + c.out_pad;
  EXPECT_TRUE(f32act_gemm_supported(p));
  EXPECT_EQ(launch_f32act_gemm(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  double worst = 0.0;
  const float* xv = x.data<float>();
  for (int s = 0; s < segs; ++s) {
    const int64_t N = c.N[size_t(s)], ld = out_ld[size_t(s)];
    const Tensor got = out_d[size_t(s)].to(Device::cpu);
    const float* g = got.data<float>();
    const uint16_t* wv = w[size_t(s)].data_u16();
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t t = 0; t < c.T; ++t) {
        for (int64_t n = 0; n < N + c.out_pad; ++n) {
          const float v = g[t * ld + b * (N + c.out_pad) + n];
          if (n >= N) {
            EXPECT_EQ(v, -7.25f) << "written outside: seg " << s << " b " << b << " t " << t << " n " << n;
            continue;
          }
          double want = 0.0, mag = 0.0;
          for (int64_t k = 0; k < c.K; ++k) {
            const int64_t wi = b * N * c.K + (c.trans ? k * N + n : n * c.K + k);
            const double term = double(bf16_to_f32(wv[wi])) * act_value(xv[t * x_ld + b * xs + k], c.split);
            want += term;
            mag += std::fabs(term);
          }
          worst = std::max(worst, std::fabs(double(v) - want) / std::max(mag, 1e-30));
        }
      }
    }
  }
  return worst;
}

TEST_F(CudaF32ActGemm, KernelIsTheExactSum) {
  // f32 accumulation of exact bf16 products (and of the two terms): ~1e-6 of the sum of magnitudes (the
  // small-T kernel's test holds 1e-5; 2e-5 leaves room for the longer sums of one CTA).
  constexpr double kTol = 2e-5;
  const std::vector<KernelCase> cases = {
      // The narrow linears' split: router [256 x 6144], indexer wk + weights_proj (two segments), ragged.
      {33, 6144, 1, {256}, true, false, 0},
      {70, 6144, 1, {128, 32}, true, false, 64},
      {5, 1024, 1, {200}, true, false, 32, 4, 2},
      {129, 32, 1, {71, 131}, true, false, 0, 0, 1},  // odd widths: the last column stored alone
      // absorb_v: W_UV[h] [dv][L], head-strided activations [T][h][L + pad], a wider output.
      {33, 512, 3, {256}, false, false, 64, 0, 32},
      {1, 512, 5, {40}, false, false, 32},
      // absorb_q: W_UK[h] [nope][L] read transposed, activations the nope part of [T][h][nope + rope].
      {33, 192, 3, {512}, false, true, 64, 64},
      {97, 192, 2, {136}, false, true, 32, 64, 16},
      {3, 64, 4, {8}, true, true, 0},
      // The 128 x 256 tile (the one-term default): absorb_v / absorb_q shapes, ragged tokens and outputs, two
      // segments.
      {130, 512, 3, {256}, false, false, 0, 0, 32},
      {200, 192, 2, {512}, false, true, 128, 64},
      {5, 64, 2, {136}, false, true, 0, 64, 16},
      {129, 512, 2, {200}, false, false, 128},
      {40, 256, 1, {128, 32}, false, false, 0},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const KernelCase& c = cases[i];
    const double err = check_case(c, 100 + 7 * i);
    fmt::print(
        "RESULT op=f32act_gemm case={} T={} K={} batch={} N={} split={} trans={} tile={} "
        "worst_err/sum|terms|={:.3g}\n",
        i, c.T, c.K, c.batch, fmt::join(c.N, "+"), c.split, c.trans, c.tile, err);
    EXPECT_LE(err, kTol) << "case " << i;
  }
}

TEST_F(CudaF32ActGemm, BadParametersAreRejected) {
  Tensor x = Tensor::empty({4, 64}, DType::f32, Device::cuda),
         o = Tensor::empty({4, 64}, DType::f32, Device::cuda);
  Tensor w = Tensor::empty({64, 64}, DType::bf16, Device::cuda);
  F32ActGemmParams p{};
  p.x = x.data<float>();
  p.x_ld = 64;
  p.seg[0] = {w.data_u16(), 64, o.data<float>(), 64, 64};
  p.segments = 1;
  p.T = 4;
  p.K = 64;
  p.batch = 1;
  EXPECT_TRUE(f32act_gemm_supported(p));
  F32ActGemmParams q = p;
  q.K = 48;  // not a multiple of 32
  EXPECT_EQ(launch_f32act_gemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.x_ld = 66;  // rows not 16-byte aligned
  EXPECT_FALSE(f32act_gemm_supported(q));
  q = p;
  q.seg[0].out_ld = 63;  // odd output stride
  EXPECT_FALSE(f32act_gemm_supported(q));
  q = p;
  q.trans_w = true;
  q.seg[0].N = 60;  // [K][N] weights need N % 8 == 0
  EXPECT_FALSE(f32act_gemm_supported(q));
  q = p;
  q.split = true;
  q.tile_tokens = 128;  // the wide tile takes one term only
  EXPECT_FALSE(f32act_gemm_supported(q));
  q = p;
  q.batch = 2;
  q.segments = 2;  // a batch takes one segment
  q.seg[1] = q.seg[0];
  EXPECT_FALSE(f32act_gemm_supported(q));
  cudaGetLastError();
}

// linear / linear_multi on the narrow bf16 weights at prefill sizes: the fused kernel's result against the
// CPU linear (which multiplies the f32 activations exactly) and against the split pass + cuBLASLt path it
// replaces; linear_multi's wk + weights_proj pair is one launch and equals the separate linears bit for bit.
TEST_F(CudaF32ActGemm, NarrowLinearsTakeItAtPrefillSizes) {
  KernelOptions fused, old;
  fused.gemm_split_fused_min_tokens = 1;  // every T above the small-T kernel's 32
  old.gemm_split_fused_min_tokens = 0;
  const std::shared_ptr<Backend> be_fused = make_backend(fused), be_old = make_backend(old);
  Backend& be_default = cuda_backend();
  const WeightRef router = rand_weight(256, 6144, DType::bf16, 11),
                  wk = rand_weight(128, 6144, DType::bf16, 12), wp = rand_weight(32, 6144, DType::bf16, 13);
  const WeightRef router_d = to_cuda(router), wk_d = to_cuda(wk), wp_d = to_cuda(wp);
  for (int64_t T : {int64_t(33), int64_t(300), int64_t(4096)}) {
    const Tensor x = rand_f32({T, 6144}, 20 + uint64_t(T), 2.0f), xd = x.to(Device::cuda);
    // One narrow weight alone keeps the split pass + cuBLASLt (measured faster for router_gate).
    const int64_t calls = gemm_stats().bf16_fused_calls;
    const Tensor got = be_fused->linear(xd, router_d, 0, -1, {});
    EXPECT_EQ(gemm_stats().bf16_fused_calls, calls) << "T " << T;
    if (T <= 300)
      report_gemm("router_gate vs cpu", fmt::format("[{}, 6144] x [256, 6144]^T", T), got,
                  kernels::linear(x, router), 1e-4);
    if (T >= kGemmSplitFusedDefaultTokens) {  // the default options take the fused pair
      const int64_t before = gemm_stats().bf16_fused_calls;
      (void)be_default.linear_multi(xd, {wk_d, wp_d}, nullptr);
      EXPECT_EQ(gemm_stats().bf16_fused_calls, before + 1) << "default options at T " << T;
    }
    // wk + weights_proj: one launch for both parts.
    const int64_t before = gemm_stats().bf16_fused_calls;
    const std::vector<Tensor> parts = be_fused->linear_multi(xd, {wk_d, wp_d}, nullptr);
    EXPECT_EQ(gemm_stats().bf16_fused_calls, before + 1) << "one launch for both parts, T " << T;
    ASSERT_EQ(parts.size(), 2u);
    // Against the separate linears (one narrow weight alone: the split pass + cuBLASLt), the same two terms
    // of the same operands with f32 sums in another order.
    const Tensor prev_wk = be_old->linear(xd, wk_d, 0, -1, {}), prev_wp = be_old->linear(xd, wp_d, 0, -1, {});
    report_gemm("indexer wk fused vs split+cublaslt", fmt::format("[{}, 6144] x [128, 6144]^T", T), parts[0],
                prev_wk, 5e-5);
    report_gemm("indexer weights_proj fused vs split+cublaslt", fmt::format("[{}, 6144] x [32, 6144]^T", T),
                parts[1], prev_wp, 5e-5);
    if (T <= 300) {
      report_gemm("indexer weights_proj fused vs cpu", fmt::format("[{}, 6144] x [32, 6144]^T", T), parts[1],
                  kernels::linear(x, wp), 1e-4);
    }
  }
}

// absorb_q / absorb_v through the fused kernel (the backend's options) at GLM-5.3's 64 heads against the
// CPU op (bf16 operands: 1e-2 per row L2, as the op table) and against the cuBLASLt path it replaces (the
// same bf16 operands and f32 accumulation in another order: 3e-5), for a bf16 and an FP8 kv_b.
TEST_F(CudaF32ActGemm, AbsorbTakesItAtPrefillSizes) {
  constexpr int64_t nh = 64, kNope = 192, kRope = 64, kL = 512, kV = 256;
  KernelOptions fused, old;
  fused.absorb_fused_min_tokens = 1;
  old.absorb_fused_min_tokens = 0;
  const std::shared_ptr<Backend> be_fused = make_backend(fused), be_old = make_backend(old);
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    const WeightRef w = rand_weight(nh * (kNope + kV), kL, dt, 31);
    WeightRef w_d = to_cuda(w);
    w_d.derived = be_fused->derive_weight(w_d, WeightUse::absorb);
    const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
    for (int64_t T : {int64_t(1), int64_t(33), int64_t(4096)}) {
      const Tensor q = rand_f32({T, nh, kNope + kRope}, 40 + uint64_t(T)), q_d = q.to(Device::cuda);
      const Tensor lat = rand_f32({T, nh, kL}, 50 + uint64_t(T)), lat_d = lat.to(Device::cuda);
      const Tensor ql = be_fused->absorb_q(q_d.slice(2, 0, kNope), w_d, {});
      const Tensor ql_old = be_old->absorb_q(q_d.slice(2, 0, kNope), w_d, {});
      const Tensor o = be_fused->absorb_v(lat_d, w_d, kV, {});
      const Tensor o_old = be_old->absorb_v(lat_d, w_d, kV, {});
      const std::string qs = fmt::format("{} {} x [{}, {}] x [{}, {}]", tag, nh, T, kNope, kNope, kL),
                        vs = fmt::format("{} {} x [{}, {}] x [{}, {}]", tag, nh, T, kL, kL, kV);
      // absorb_q keeps cuBLASLt at every size (measured faster): the two backends agree bit for bit.
      EXPECT_TRUE(bits_equal(ql, ql_old)) << tag << " T " << T;
      report_gemm("absorb_v fused vs cublaslt", vs, o, o_old, 3e-5);
      if (T <= 33) {
        report_gemm("absorb_q vs cpu", qs, ql, kernels::absorb_q(q.slice(2, 0, kNope), w), 1e-2);
        report_gemm("absorb_v fused vs cpu", vs, o, kernels::absorb_v(lat, w, kV), 1e-2);
      }
    }
  }
}

// absorb_v_fp8 (o_proj's input): the FP8 copy the fused launch writes is the recipe's quantisation of the f32
// output bit for bit (codes, scales, the padding rows' zeros and ones), and o_proj through linear_multi with
// it equals o_proj quantising the output itself, bit for bit; below the threshold (and in fp32 mode) the copy
// is left empty.
TEST_F(CudaF32ActGemm, AbsorbVFp8CopyIsTheQuantisationOfItsOutput) {
  constexpr int64_t nh = 64, kL = 512, kV = 256, kNope = 192;
  KernelOptions fused;
  fused.absorb_fused_min_tokens = 1;
  fused.absorb_small_max_tokens = 0;  // at T = 1 the small-T kernel (no copy) would come first if on
  const std::shared_ptr<Backend> be = make_backend(fused);
  WeightRef w_d = to_cuda(rand_weight(nh * (kNope + kV), kL, DType::f8e4m3fn, 61));
  w_d.derived = be->derive_weight(w_d, WeightUse::absorb);
  WeightRef o_d = to_cuda(rand_weight(6144, nh * kV, DType::f8e4m3fn, 62));
  o_d.derived = be->derive_weight(o_d, WeightUse::linear);
  for (int64_t T : {int64_t(1), int64_t(33), int64_t(257), int64_t(4096)}) {
    const Tensor lat = rand_f32({T, nh, kL}, 70 + uint64_t(T), 4.0f).to(Device::cuda);
    Fp8Act q;
    const Tensor a = be->absorb_v_fp8(lat, w_d, kV, {}, q);
    ASSERT_TRUE(q.defined()) << "T " << T;
    EXPECT_EQ(q.rows, T);
    const Tensor flat = a.view({T, nh * kV});
    const Fp8Act want = quantize_fp8_activations(flat, fused);
    EXPECT_TRUE(bits_equal(q.codes, want.codes)) << "codes T " << T;
    EXPECT_TRUE(bits_equal(q.scales, want.scales)) << "scales T " << T;
    EXPECT_TRUE(bits_equal(a, be->absorb_v(lat, w_d, kV, {}))) << "the f32 output is absorb_v's, T " << T;
    EXPECT_TRUE(bits_equal(be->linear_multi(flat, {o_d}, &q)[0], be->linear(flat, o_d, 0, -1, {})))
        << "o_proj with the copy, T " << T;
    fmt::print("RESULT op=absorb_v_fp8 T={} codes/scales == quantize(absorb_v) {}\n", T,
               bits_equal(q.codes, want.codes) && bits_equal(q.scales, want.scales) ? "ok" : "FAIL");
  }
  // No copy below the threshold or in fp32 mode: the caller quantises itself.
  KernelOptions off, exact;
  off.absorb_fused_min_tokens = 0;
  exact.gemm = GemmPrecision::fp32;
  exact.absorb_fused_min_tokens = 1;
  for (const KernelOptions& ko : {off, exact}) {
    const std::shared_ptr<Backend> b2 = make_backend(ko);
    WeightRef w2 = to_cuda(rand_weight(nh * (kNope + kV), kL, DType::bf16, 63));
    w2.derived = b2->derive_weight(w2, WeightUse::absorb);
    const Tensor lat = rand_f32({300, nh, kL}, 80).to(Device::cuda);
    Fp8Act q;
    (void)b2->absorb_v_fp8(lat, w2, kV, {}, q);
    EXPECT_FALSE(q.defined());
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
