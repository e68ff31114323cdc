// The small-T block-scaled FP8 GEMM (gemm_small.cu): the kernel against the exact arithmetic it
// implements (sum over 128-blocks of code products x weight scale x activation scale, in double on the
// host from the quantised activations the GPU produced), for token counts 1..32 across the three tile
// widths, output widths that are not multiples of 16 or 128, row slices, with and without the split over
// K; then linear() through it against linear() through cuBLASLt (the same quantised arithmetic) at
// GLM-5.3 shapes, timed eagerly and as CUDA-graph replays (which leave out the host's launch overhead).
// Skips without a GPU.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemm_small_params.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::bits_equal;
using testing::rand_f32;
using testing::rand_weight;
using testing::row_rel_error;
using testing::to_cuda;

class CudaFp8SmallGemm : public testing::GpuTest {};

// The small-T kernels' split counters (kFp8SmallCounters, zero on entry) and how many of the first n a
// launch left set: every split launch must leave them zero for the next.
struct SplitCounters {
  Tensor t = Tensor::zeros({kFp8SmallCounters}, DType::i32, Device::cuda);
  uint32_t* get() { return static_cast<uint32_t*>(t.raw_data()); }
  int64_t set_among(int64_t n) const {
    const Tensor h = t.to(Device::cpu);
    return std::count_if(h.data<int32_t>(), h.data<int32_t>() + n, [](int32_t c) { return c != 0; });
  }
};

// The worst |got - want| / sum|terms| of got[t][n] (row stride ld) over T x N against the exact block-scaled
// sum (in double) of the GPU's activation codes xq / scales xs times rows [r0, r0 + N) of the host weight w.
double exact_sum_error(const WeightRef& w, int64_t r0, const Tensor& xq_dev, const Tensor& xs_dev,
                       const Tensor& got_dev, int64_t T, int64_t N, int64_t ld) {
  const Tensor q = xq_dev.to(Device::cpu), s = xs_dev.to(Device::cpu), got = got_dev.to(Device::cpu);
  const int64_t K = q.size(1), Tp = q.size(0);
  const uint8_t* wc = w.weight.data_u8();
  const float* ws = w.scale_inv.data<float>();
  const int64_t kb_n = K / 128, ws_ld = w.scale_inv.size(1);
  double worst = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double want = 0.0, mag = 0.0;
      for (int64_t kb = 0; kb < kb_n; ++kb) {
        double blk = 0.0, blk_abs = 0.0;
        for (int64_t k = kb * 128; k < kb * 128 + 128; ++k) {
          const double v =
              double(f8e4m3fn_to_f32(q.data_u8()[t * K + k])) * double(f8e4m3fn_to_f32(wc[(r0 + n) * K + k]));
          blk += v;
          blk_abs += std::fabs(v);
        }
        const double sc = double(ws[((r0 + n) / 128) * ws_ld + kb]) * double(s.data<float>()[kb * Tp + t]);
        want += blk * sc;
        mag += blk_abs * std::fabs(sc);
      }
      const double d = std::fabs(double(got.data<float>()[t * ld + n]) - want) / std::max(mag, 1e-30);
      worst = std::max(worst, d);
    }
  }
  return worst;
}

// Runs the kernel directly on W rows [r0, r0 + N) and checks every output against the exact sum.
// Returns the worst |got - want| / sum|terms|.
// ctas_per_sm: Fp8SmallGemmParams::ctas_per_sm (0: the default for the shape; 3: the 8-row three-CTA build).
double check_kernel(int64_t N_total, int64_t K, int64_t r0, int64_t N, int64_t T, int splits, uint64_t seed,
                    int ctas_per_sm = 0, int stages = 0, bool tma = false) {
  const WeightRef w = rand_weight(N_total, K, DType::f8e4m3fn, seed), wd = to_cuda(w);
  const Tensor x = rand_f32({T, K}, seed + 1, 2.0f);
  const int64_t Tp = T <= 8 ? 8 : T <= 16 ? 16 : 32;
  const Tensor xd = x.to(Device::cuda);
  Tensor xq = Tensor::empty({Tp, K}, DType::u8, Device::cuda);
  Tensor xs = Tensor::empty({K / 128, Tp}, DType::f32, Device::cuda);
  EXPECT_EQ(launch_quant_fp8({xd.data<float>(), xq.data_u8(), xs.data<float>(), T, Tp, K, K}, nullptr),
            cudaSuccess);
  Tensor out = Tensor::empty({T, N}, DType::f32, Device::cuda);
  Tensor partial = Tensor::empty({std::max(splits, 1), T, N}, DType::f32, Device::cuda);
  SplitCounters counters;
  Fp8SmallGemmParams p{};
  p.w = static_cast<const uint8_t*>(wd.weight.raw_data()) + r0 * K;
  p.w_scale = wd.scale_inv.data<float>();
  p.row0 = r0;
  p.w_scale_ld = wd.scale_inv.size(1);
  p.xq = xq.data_u8();
  p.x_scale = xs.data<float>();
  p.out = out.data<float>();
  p.out_stride = N;
  p.T = T;
  p.Tp = Tp;
  p.N = N;
  p.K = K;
  p.partial = partial.data<float>();
  p.counters = counters.get();
  p.splits = splits;
  p.ctas_per_sm = ctas_per_sm;
  p.stages = stages;
  p.tma = tma;
  // Twice: the split's counters must be left at zero by the first launch.
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counters.set_among((N + 127) / 128), 0) << "a split launch left a counter set";

  const double worst = exact_sum_error(w, r0, xq, xs, out, T, N, out.size(1));
  fmt::print("RESULT op=fp8_small_gemm_exact N={} K={} r0={} T={} splits={} max_err_rel_to_abs_sum={:.3g}\n",
             N, K, r0, T, splits, worst);
  return worst;
}

TEST_F(CudaFp8SmallGemm, KernelIsTheExactBlockScaledSum) {
  struct Case {
    int64_t n_total, k, r0, n;
    int splits;
  };
  // f32 accumulation of exact e4m3 products: ~1e-6 of the sum of magnitudes.
  constexpr double kTol = 2e-5;
  const Case cases[] = {{576, 1024, 0, 576, 1},  {576, 1024, 0, 576, 3},  {200, 512, 0, 200, 4},
                        {384, 768, 128, 256, 2}, {1000, 256, 0, 1000, 1}, {2048, 6144, 0, 2048, 8},
                        {130, 384, 0, 130, 3}};
  for (const Case& c : cases)
    for (int64_t T : {1, 3, 8, 9, 16, 17, 31, 32})
      for (int occ : {2, 3}) {  // both builds at 8 rows (3 is the default from 64 row slices on)
        if (occ == 3 && T > 8) continue;
        EXPECT_LE(check_kernel(c.n_total, c.k, c.r0, c.n, T, c.splits, 7 + uint64_t(c.n + T), occ), kTol)
            << "N " << c.n << " K " << c.k << " r0 " << c.r0 << " T " << T << " splits " << c.splits
            << " CTAs/SM " << occ;
      }
}

// The deeper pipeline (Fp8SmallGemmParams::stages = kFp8SmallDeepStages) and the tensor-map kernel
// (Fp8SmallGemmParams::tma), ops_gpu_bench stages' experiments: the same exact sums at up to 8 tokens with
// and without the split, K ranges shorter and longer than the pipeline, widths not multiples of 128 (the
// tensor map reads the rows past N as zero), a part from row 128; other depths, more token rows, 3 CTAs an
// SM and several weights are refused.
TEST_F(CudaFp8SmallGemm, DeepPipelineAndTensorMapCopiesAreTheExactBlockScaledSum) {
  struct Case {
    int64_t n_total, k, r0, n;
    int splits;
  };
  const Case cases[] = {{576, 1024, 0, 576, 1},   {576, 1024, 0, 576, 3}, {384, 768, 128, 256, 2},
                        {2048, 6144, 0, 2048, 8}, {130, 384, 0, 130, 3},  {6144, 16384, 0, 256, 5}};
  for (const Case& c : cases)
    for (int64_t T : {1, 3, 8})
      for (int stages : {4, kFp8SmallDeepStages})
        for (bool tma : {false, true}) {
          if (stages == 4 && !tma) continue;  // the default kernel: KernelIsTheExactBlockScaledSum
          EXPECT_LE(
              check_kernel(c.n_total, c.k, c.r0, c.n, T, c.splits, 17 + uint64_t(c.n + T), 2, stages, tma),
              2e-5)
              << "N " << c.n << " K " << c.k << " T " << T << " splits " << c.splits << " stages " << stages
              << " tma " << tma;
        }
  // Refusals on otherwise valid operands (the same launch with the default depth runs).
  const WeightRef w = to_cuda(rand_weight(128 * 64, 128, DType::f8e4m3fn, 5));
  Tensor xq = Tensor::zeros({16, 128}, DType::u8, Device::cuda),
         xs = Tensor::zeros({1, 16}, DType::f32, Device::cuda);
  Tensor out = Tensor::empty({1, 128 * 64}, DType::f32, Device::cuda);
  Fp8SmallGemmParams p{};
  p.w = static_cast<const uint8_t*>(w.weight.raw_data());
  p.w_scale = w.scale_inv.data<float>();
  p.w_scale_ld = w.scale_inv.size(1);
  p.xq = xq.data_u8();
  p.x_scale = xs.data<float>();
  p.out = out.data<float>();
  p.out_stride = 128 * 64;
  p.T = 1;
  p.Tp = 8;
  p.N = 128 * 64;  // 64 row slices: 3 CTAs an SM by default at 8 rows
  p.K = 128;
  p.splits = 1;
  p.ctas_per_sm = 2;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  p.stages = kFp8SmallDeepStages;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  p.stages = 5;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.stages = kFp8SmallDeepStages;
  p.ctas_per_sm = 3;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.ctas_per_sm = 0;  // the default for 64 slices is 3
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.ctas_per_sm = 2;
  p.Tp = 16;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  // The tensor-map kernel: likewise 8 token rows at 2 CTAs an SM, one weight (its scales are read as they
  // are: any 4-byte alignment).
  p.Tp = 8;
  p.stages = 0;
  p.tma = true;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  p.ctas_per_sm = 0;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.ctas_per_sm = 2;
  p.x_scale = xs.data<float>() + 1;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
  p.x_scale = xs.data<float>();
  p.Tp = 16;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.Tp = 8;
  p.n_more = 1;
  p.more[0] = {p.w, p.w_scale, 0, p.w_scale_ld, p.out, p.out_stride, 128};
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// One launch over several weights (Fp8SmallGemmParams::more, linear_multi's fused FP8 parts): every part's
// outputs are the exact block-scaled sums, for widths that are not multiples of 128, a part taken from row
// 128 of its weight, an output with a row stride wider than its part, with and without the K split (the
// split's partial sums of each part in its own scratch range), at 1..32 tokens and both 8-row builds; the
// split's counters are left zero.
TEST_F(CudaFp8SmallGemm, FusedLaunchIsEachPartsExactBlockScaledSum) {
  constexpr double kTol = 2e-5;  // as KernelIsTheExactBlockScaledSum
  const int64_t K = 1024;
  struct Part {
    int64_t n_total, r0, n, ld;  // the weight's rows; this launch's rows [r0, r0 + n); the output's stride
  };
  const Part parts[] = {{2048, 0, 2048, 2048}, {576, 0, 576, 600}, {384, 128, 200, 200}, {130, 0, 130, 130}};
  std::vector<WeightRef> host, dev;
  for (size_t i = 0; i < 4; ++i) {
    host.push_back(rand_weight(parts[i].n_total, K, DType::f8e4m3fn, 40 + i));
    dev.push_back(to_cuda(host.back()));
  }
  SplitCounters counters;
  double worst = 0.0;
  for (int n_parts : {2, 4})
    for (int64_t T : {1, 3, 8, 9, 16, 32})
      for (int splits : {1, 3, 0})  // 0: fp8_small_fused_splits' choice
        for (int occ : {2, 3}) {
          if (occ == 3 && T > 8) continue;
          const int64_t Tp = T <= 8 ? 8 : T <= 16 ? 16 : 32;
          const Tensor xd = rand_f32({T, K}, 90 + uint64_t(T), 2.0f).to(Device::cuda);
          Tensor xq = Tensor::empty({Tp, K}, DType::u8, Device::cuda);
          Tensor xs = Tensor::empty({K / 128, Tp}, DType::f32, Device::cuda);
          ASSERT_EQ(
              launch_quant_fp8({xd.data<float>(), xq.data_u8(), xs.data<float>(), T, Tp, K, K}, nullptr),
              cudaSuccess);
          std::vector<Tensor> outs;
          Fp8SmallGemmParams p{};
          for (int i = 0; i < n_parts; ++i) {
            const Part& c = parts[i];
            outs.push_back(Tensor::zeros({T, c.ld}, DType::f32, Device::cuda));
            const Fp8SmallSegment seg{
                static_cast<const uint8_t*>(dev[size_t(i)].weight.raw_data()) + c.r0 * K,
                dev[size_t(i)].scale_inv.data<float>(),
                c.r0,
                dev[size_t(i)].scale_inv.size(1),
                outs.back().data<float>(),
                c.ld,
                c.n};
            if (i == 0) {
              p.w = seg.w;
              p.w_scale = seg.w_scale;
              p.row0 = seg.row0;
              p.w_scale_ld = seg.w_scale_ld;
              p.out = seg.out;
              p.out_stride = seg.out_stride;
              p.N = seg.N;
            } else {
              p.more[i - 1] = seg;
            }
          }
          p.n_more = n_parts - 1;
          p.xq = xq.data_u8();
          p.x_scale = xs.data<float>();
          p.T = T;
          p.Tp = Tp;
          p.K = K;
          p.ctas_per_sm = occ;
          p.splits = splits > 0 ? splits : fp8_small_fused_splits(fp8_small_slices(p), K, Tp, occ);
          Tensor partial =
              Tensor::empty({std::max<int64_t>(fp8_small_fused_scratch(p), 1)}, DType::f32, Device::cuda);
          p.partial = partial.data<float>();
          p.counters = counters.get();
          // Twice: the split's counters must be left at zero by the first launch.
          ASSERT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
          ASSERT_EQ(launch_fp8_small_gemm(p, nullptr), cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          for (int i = 0; i < n_parts; ++i) {
            const Part& c = parts[i];
            const double e = exact_sum_error(host[size_t(i)], c.r0, xq, xs, outs[size_t(i)], T, c.n, c.ld);
            worst = std::max(worst, e);
            EXPECT_LE(e, kTol) << "part " << i << " of " << n_parts << " T " << T << " splits " << p.splits
                               << " CTAs/SM " << occ;
            if (c.ld > c.n) {  // the columns past the part are not written
              const std::vector<float> o = outs[size_t(i)].to(Device::cpu).to_f32_vector();
              for (int64_t t = 0; t < T; ++t)
                for (int64_t n = c.n; n < c.ld; ++n) ASSERT_EQ(o[size_t(t * c.ld + n)], 0.0f) << "part " << i;
            }
          }
        }
  EXPECT_EQ(counters.set_among(256), 0) << "a split launch left a counter set";
  fmt::print("RESULT op=fp8_small_gemm_fused_exact K={} max_err_rel_to_abs_sum={:.3g}\n", K, worst);
}

TEST_F(CudaFp8SmallGemm, BadParametersAreRejected) {
  Fp8SmallGemmParams p{};
  p.T = 4;
  p.Tp = 8;
  p.N = 128;
  p.K = 100;  // not a multiple of 128
  p.splits = 1;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.K = 128;
  p.Tp = 12;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.Tp = 8;
  p.splits = 2;  // no scratch
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  // A fused launch: too many parts, a part without rows, a part off its 128-row scale block.
  p.splits = 1;
  p.n_more = kFp8SmallMaxMore + 1;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);
  p.n_more = 1;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);  // more[0] is empty
  const uint8_t w = 0;
  const float sc = 1.0f;
  float out = 0.0f;
  p.more[0] = {&w, &sc, 64, 1, &out, 1, 8};
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);  // row0 % 128 != 0
  p.more[0].row0 = 0;
  p.more[0].N = 0;
  EXPECT_EQ(launch_fp8_small_gemm(p, nullptr), cudaErrorInvalidValue);  // no rows
  cudaGetLastError();
}

// Median microseconds of fn over 30 runs (CUDA events).
template <class F>
double time_us(F&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> us;
  for (int i = 0; i < 30; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST_F(CudaFp8SmallGemm, LinearMatchesCublasLtPathAtGlmShapes) {
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"q_a_proj", 2048, 6144},    {"q_b_proj", 64 * 256, 2048},
                          {"kv_a_proj", 576, 6144},    {"o_proj", 6144, 64 * 256},
                          {"expert_gate", 2048, 6144}, {"expert_down", 6144, 2048},
                          {"lm_head", 154880, 6144}};
  // The small-T limit is the backend's option: one backend takes every T <= 32 to the small kernel, the
  // other none (0: cuBLASLt for every FP8 GEMM).
  KernelOptions all_small, none_small;
  all_small.gemm_fp8_small_max_tokens = kFp8SmallMaxTokens;
  none_small.gemm_fp8_small_max_tokens = 0;
  const std::shared_ptr<Backend> small_be = make_backend(all_small), lt_be = make_backend(none_small);
  double worst = 0.0;
  for (const Shape& s : shapes) {
    WeightRef w = to_cuda(rand_weight(s.n, s.k, DType::f8e4m3fn, 71 + uint64_t(s.n)));
    w.derived = lt_be->derive_weight(w, WeightUse::linear);  // the padded scales, as a model holds them
    for (int64_t T : {1, 8, 32}) {
      const Tensor x = rand_f32({T, s.k}, 5 + uint64_t(T)).to(Device::cuda);
      Tensor a = Tensor::empty({T, s.n}, DType::f32, Device::cuda), b = a.clone();
      const int64_t small_before = gemm_stats().fp8_small_calls;
      small_be->linear(x, w, 0, -1, a);
      EXPECT_GT(gemm_stats().fp8_small_calls, small_before) << s.name << " T=" << T;
      const double us_small = time_us([&] { small_be->linear(x, w, 0, -1, a); });
      const double g_small = graph_time_us([&] { small_be->linear(x, w, 0, -1, a); });
      const int64_t lt_before = gemm_stats().fp8_calls;
      lt_be->linear(x, w, 0, -1, b);
      EXPECT_GT(gemm_stats().fp8_calls, lt_before) << s.name << " T=" << T;
      const double us_lt = time_us([&] { lt_be->linear(x, w, 0, -1, b); });
      const double g_lt = graph_time_us([&] { lt_be->linear(x, w, 0, -1, b); });
      // cuBLASLt sums in another order (and rounds its output to bf16 where it has no f32-output algorithm).
      const double d = row_rel_error(a, b);
      worst = std::max(worst, d);
      const double bytes = double(s.n * s.k) + 4.0 * double(T * (s.k + s.n));
      const double floor_us = bytes / 4.3e12 * 1e6;
      fmt::print(
          "RESULT op=fp8_linear_small_vs_cublaslt {:<12} T={:<3} N={} K={} eager_us small={:.1f} "
          "cublaslt={:.1f} | "
          "graph_us small={:.1f} cublaslt={:.1f} floor_us={:.2f} ratio small={:.2f} cublaslt={:.2f} | "
          "max_row_rel_diff={:.3g}\n",
          s.name, T, s.n, s.k, us_small, us_lt, g_small, g_lt, floor_us, floor_us / g_small, floor_us / g_lt,
          d);
    }
  }
  EXPECT_LE(worst, 8e-3);
}

// linear_multi shares one activation quantisation between FP8 weights: without the fused small-T launch
// the results are linear()'s, bit for bit (same codes, same GEMM), mixed with a bf16 weight, small and
// large T. With it (KernelOptions::gemm_small_fuse) the FP8 parts at <= the small-T limit take one
// launch (counted) and differ from linear()'s only in the order of the K split's partial sums; the bf16
// part and the large-T rows stay bit for bit.
TEST_F(CudaFp8SmallGemm, LinearMultiEqualsSeparateLinears) {
  const WeightRef a = to_cuda(rand_weight(2048, 1024, DType::f8e4m3fn, 3)),
                  b = to_cuda(rand_weight(576, 1024, DType::f8e4m3fn, 4)),
                  c = to_cuda(rand_weight(64, 1024, DType::bf16, 5));
  for (bool fuse : {false, true}) {
    KernelOptions ko;
    ko.gemm_small_fuse = fuse;
    ko.gemm_fp8_small_max_tokens = kFp8SmallMaxTokens;
    const std::shared_ptr<Backend> be = make_backend(ko);
    for (int64_t T : {1, 7, 32, 300}) {
      const Tensor x = rand_f32({T, 1024}, 9 + uint64_t(T)).to(Device::cuda);
      const int64_t fused_before = gemm_stats().fp8_small_fused_calls;
      const std::vector<Tensor> got = be->linear_multi(x, {a, b, c}, nullptr);
      const bool fused = fuse && T <= kFp8SmallMaxTokens;
      EXPECT_EQ(gemm_stats().fp8_small_fused_calls - fused_before, fused ? 1 : 0) << "T=" << T;
      ASSERT_EQ(got.size(), 3u);
      Tensor want[3];
      for (size_t i = 0; i < 3; ++i) {
        const WeightRef& w = i == 0 ? a : i == 1 ? b : c;
        want[i] = Tensor::empty({T, w.rows()}, DType::f32, Device::cuda);
        be->linear(x, w, 0, -1, want[i]);
      }
      for (size_t i = 0; i < 3; ++i) {
        const std::vector<float> g = got[i].to(Device::cpu).to_f32_vector(),
                                 w = want[i].to(Device::cpu).to_f32_vector();
        ASSERT_EQ(g.size(), w.size());
        if (fused && i < 2) {
          const double d = row_rel_error(got[i], want[i]);
          EXPECT_LE(d, 1e-5) << "part " << i << " T=" << T;
          continue;
        }
        int64_t diff = 0;
        for (size_t j = 0; j < g.size(); ++j) diff += g[j] != w[j];
        EXPECT_EQ(diff, 0) << "part " << i << " T=" << T << " fuse " << fuse;
      }
    }
  }
}

// The norms' FP8 copy (rms_norm_fp8 / add_rms_norm_fp8) is the recipe's quantisation of the norm output
// bit for bit (codes, scales, padding rows), the output equals the plain norm's, and linear_multi with the
// copy equals linear() without it.
TEST_F(CudaFp8SmallGemm, NormFp8CopyIsTheQuantisationOfItsOutput) {
  for (int64_t K : {256, 2048, 6144}) {
    const Tensor w = testing::rand_bf16({K}, 3 + uint64_t(K));
    const Tensor wd = w.to(Device::cuda);
    const WeightRef lin = to_cuda(rand_weight(384, K, DType::f8e4m3fn, 5 + uint64_t(K)));
    for (int64_t T : {1, 7, 33, 300}) {
      const Tensor x = rand_f32({T, K}, 11 + uint64_t(T + K), 3.0f).to(Device::cuda);
      const Tensor r0 = rand_f32({T, K}, 13 + uint64_t(T + K)).to(Device::cuda);
      for (bool add : {false, true}) {
        Tensor res_a = r0.clone(), res_b = r0.clone();
        Fp8Act q;
        const Tensor plain = add ? kernels::add_rms_norm(res_a, x, wd, 1e-6) : kernels::rms_norm(x, wd, 1e-6);
        const Tensor fused =
            add ? kernels::add_rms_norm_fp8(res_b, x, wd, 1e-6, q) : kernels::rms_norm_fp8(x, wd, 1e-6, q);
        ASSERT_TRUE(q.defined()) << "K " << K << " T " << T;
        EXPECT_TRUE(bits_equal(plain, fused)) << "norm output K " << K << " T " << T << " add " << add;
        if (add) {
          EXPECT_TRUE(bits_equal(res_a, res_b)) << "residual K " << K << " T " << T;
        }
        const Fp8Act want = quantize_fp8_activations(plain);
        EXPECT_EQ(q.rows, T);
        EXPECT_TRUE(bits_equal(q.codes, want.codes)) << "codes K " << K << " T " << T << " add " << add;
        EXPECT_TRUE(bits_equal(q.scales, want.scales)) << "scales K " << K << " T " << T << " add " << add;
        EXPECT_TRUE(bits_equal(kernels::linear_multi(fused, {lin}, &q)[0], kernels::linear(plain, lin)))
            << "linear with the copy, K " << K << " T " << T;
      }
    }
  }
  fmt::print("RESULT op=rms_norm_fp8_copy K=256,2048,6144 T=1,7,33,300 bitwise == quantize(norm) ok\n");
}

// The narrow bf16 linears' small-T kernel (launch_bf16_small_gemm): every output against the exact
// two-term sum (hi = bf16(x), lo = bf16(x - hi), times the bf16 weight, in double on the host), at router /
// indexer-head widths and odd ones, token counts across the three tile widths (1, 8, 9, 16, 17, 32), an
// activation view with a row stride wider than K, with and without the split over K; then linear() on a
// router-shaped weight takes it and matches the CPU linear.
double split_term(float x, bool hi) {
  const float h = bf16_to_f32(f32_to_bf16(x));
  return hi ? double(h) : double(bf16_to_f32(f32_to_bf16(x - h)));
}

TEST_F(CudaFp8SmallGemm, Bf16SmallKernelIsTheExactTwoTermSum) {
  struct Case {
    int64_t N, K, T, x_stride;
  };
  for (const Case& c : {Case{256, 6144, 1, 6144}, Case{160, 6144, 8, 6144}, Case{256, 6144, 9, 6160},
                        Case{200, 1024, 16, 1024}, Case{72, 2048, 17, 2052}, Case{512, 6144, 32, 6144},
                        Case{136, 64, 5, 64}}) {
    for (bool split : {false, true}) {
      const WeightRef w = rand_weight(c.N, c.K, DType::bf16, uint64_t(c.N + c.T)), wd = to_cuda(w);
      const Tensor x = rand_f32({c.T, c.x_stride}, uint64_t(c.K + c.T), 3.0f), xd = x.to(Device::cuda);
      Tensor out = Tensor::empty({c.T, c.N}, DType::f32, Device::cuda);
      const int splits = split ? bf16_small_gemm_splits(c.N, c.K) : 1;
      Tensor partial = Tensor::empty({splits, c.T, c.N}, DType::f32, Device::cuda);
      SplitCounters counters;
      Bf16SmallGemmParams p{};
      p.w = wd.weight.data_u16();
      p.x = xd.data<float>();
      p.x_stride = c.x_stride;
      p.out = out.data<float>();
      p.out_stride = c.N;
      p.T = c.T;
      p.N = c.N;
      p.K = c.K;
      p.splits = splits;
      p.partial = partial.data<float>();
      p.counters = counters.get();
      ASSERT_EQ(launch_bf16_small_gemm(p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // Twice: the counters are left zero for the next launch.
      ASSERT_EQ(launch_bf16_small_gemm(p, nullptr), cudaSuccess);
      const Tensor got = out.to(Device::cpu);
      EXPECT_EQ(counters.set_among((c.N + 127) / 128), 0) << "a split launch left a counter set";
      double worst = 0;
      for (int64_t t = 0; t < c.T; ++t) {
        for (int64_t n = 0; n < c.N; ++n) {
          double want = 0, mag = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double wv = bf16_to_f32(w.weight.data_u16()[n * c.K + k]);
            const float xv = x.data<float>()[t * c.x_stride + k];
            const double term = wv * (split_term(xv, true) + split_term(xv, false));
            want += term;
            mag += std::fabs(term);
          }
          worst = std::max(worst, std::fabs(double(got.data<float>()[t * c.N + n]) - want) / mag);
        }
      }
      fmt::print(
          "RESULT op=bf16_small_gemm N={} K={} T={} x_stride={} splits={} worst_err/sum|terms|={:.3g}\n", c.N,
          c.K, c.T, c.x_stride, splits, worst);
      EXPECT_LE(worst, 1e-5) << c.N << " " << c.K << " " << c.T << " splits " << splits;
    }
  }
  // Through linear(): a router-shaped bf16 weight at decode sizes takes the kernel.
  const GemmStats before = gemm_stats();
  const WeightRef w = rand_weight(256, 6144, DType::bf16, 7), wd = to_cuda(w);
  for (int64_t T : {int64_t(1), int64_t(4), int64_t(32)}) {
    const Tensor x = rand_f32({T, 6144}, uint64_t(T), 2.0f);
    const double err =
        testing::row_l2_rel_error(kernels::linear(x.to(Device::cuda), wd), kernels::linear(x, w));
    fmt::print("RESULT op=linear bf16 router_gate(small-T) T={} l2_rel_err={:.3g}\n", T, err);
    EXPECT_LE(err, 1e-4);
  }
  EXPECT_EQ(gemm_stats().bf16_small_calls, before.bf16_small_calls + 3);
}

// The bf16 small-T kernel over several weights in one launch (Bf16SmallGemmParams::more): each part's
// outputs are the exact two-term sum (the indexer's wk + weights_proj widths, a part of 200 rows, an output
// stride wider than its part), with and without the K split, 1..32 tokens; then linear_multi with
// KernelOptions::gemm_small_fuse takes one launch for the pair (counted) within 1e-5 of separate linears.
TEST_F(CudaFp8SmallGemm, Bf16FusedLaunchIsEachPartsExactTwoTermSum) {
  const int64_t K = 6144;
  struct Part {
    int64_t n, ld;
  };
  const Part parts[] = {{128, 128}, {32, 40}, {200, 200}};
  std::vector<WeightRef> host, dev;
  for (size_t i = 0; i < 3; ++i) {
    host.push_back(rand_weight(parts[i].n, K, DType::bf16, 60 + i));
    dev.push_back(to_cuda(host.back()));
  }
  SplitCounters counters;
  double worst = 0;
  for (int n_parts : {2, 3})
    for (int64_t T : {1, 7, 9, 32})
      for (int splits : {1, 0}) {  // 0: bf16_small_fused_splits' choice
        const Tensor x = rand_f32({T, K}, 70 + uint64_t(T), 3.0f), xd = x.to(Device::cuda);
        std::vector<Tensor> outs;
        Bf16SmallGemmParams p{};
        for (int i = 0; i < n_parts; ++i) {
          outs.push_back(Tensor::zeros({T, parts[i].ld}, DType::f32, Device::cuda));
          if (i == 0) {
            p.w = dev[0].weight.data_u16();
            p.out = outs.back().data<float>();
            p.out_stride = parts[0].ld;
            p.N = parts[0].n;
          } else {
            p.more[i - 1] = {dev[size_t(i)].weight.data_u16(), outs.back().data<float>(), parts[i].ld,
                             parts[i].n};
          }
        }
        p.n_more = n_parts - 1;
        p.x = xd.data<float>();
        p.x_stride = K;
        p.T = T;
        p.K = K;
        p.splits = splits > 0 ? splits : bf16_small_fused_splits(bf16_small_slices(p), K);
        Tensor partial =
            Tensor::empty({std::max<int64_t>(bf16_small_fused_scratch(p), 1)}, DType::f32, Device::cuda);
        p.partial = partial.data<float>();
        p.counters = counters.get();
        ASSERT_EQ(launch_bf16_small_gemm(p, nullptr), cudaSuccess);
        ASSERT_EQ(launch_bf16_small_gemm(p, nullptr), cudaSuccess);  // the counters are left zero
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (int i = 0; i < n_parts; ++i) {
          const Part& c = parts[i];
          const std::vector<float> got = outs[size_t(i)].to(Device::cpu).to_f32_vector();
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t n = 0; n < c.ld; ++n) {
              if (n >= c.n) {
                ASSERT_EQ(got[size_t(t * c.ld + n)], 0.0f) << "part " << i << " wrote past its rows";
                continue;
              }
              double want = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double wv = bf16_to_f32(host[size_t(i)].weight.data_u16()[n * K + k]);
                const float xv = x.data<float>()[t * K + k];
                const double term = wv * (split_term(xv, true) + split_term(xv, false));
                want += term;
                mag += std::fabs(term);
              }
              const double e = std::fabs(double(got[size_t(t * c.ld + n)]) - want) / mag;
              worst = std::max(worst, e);
              ASSERT_LE(e, 1e-5) << "part " << i << " of " << n_parts << " T " << T << " splits " << p.splits;
            }
          }
        }
      }
  EXPECT_EQ(counters.set_among(16), 0) << "a split launch left a counter set";
  fmt::print("RESULT op=bf16_small_gemm_fused worst_err/sum|terms|={:.3g}\n", worst);

  KernelOptions ko, sep_o;
  ko.gemm_small_fuse = true;
  sep_o.gemm_small_fuse = false;
  const std::shared_ptr<Backend> be = make_backend(ko), sep = make_backend(sep_o);
  for (int64_t T : {1, 8, 32, 33}) {
    const Tensor x = rand_f32({T, K}, 80 + uint64_t(T)).to(Device::cuda);
    const int64_t before = gemm_stats().bf16_small_fused_calls;
    const std::vector<Tensor> got = be->linear_multi(x, {dev[0], dev[1]}, nullptr);
    EXPECT_EQ(gemm_stats().bf16_small_fused_calls - before, T <= kBf16SmallMaxTokens ? 1 : 0) << "T=" << T;
    const std::vector<Tensor> want = sep->linear_multi(x, {dev[0], dev[1]}, nullptr);
    for (size_t i = 0; i < 2; ++i)
      EXPECT_LE(row_rel_error(got[i], want[i]), 1e-5) << "part " << i << " T=" << T;
  }
}

// A fused bf16 launch refuses a part it cannot run: too many, empty, misaligned (cp.async's 16 bytes).
TEST_F(CudaFp8SmallGemm, Bf16FusedBadPartsAreRefused) {
  Tensor w = Tensor::zeros({128, 64}, DType::bf16, Device::cuda),
         x = Tensor::zeros({1, 64}, DType::f32, Device::cuda),
         o = Tensor::empty({1, 128}, DType::f32, Device::cuda);
  Bf16SmallGemmParams p{};
  p.w = w.data_u16();
  p.x = x.data<float>();
  p.x_stride = 64;
  p.out = o.data<float>();
  p.out_stride = 128;
  p.T = 1;
  p.N = 64;
  p.K = 64;
  p.splits = 1;
  p.n_more = 1;
  p.more[0] = {w.data_u16() + 64 * 64, o.data<float>() + 64, 128, 64};
  EXPECT_EQ(launch_bf16_small_gemm(p, nullptr), cudaSuccess);
  Bf16SmallGemmParams bad = p;
  bad.n_more = kBf16SmallMaxMore + 1;
  EXPECT_EQ(launch_bf16_small_gemm(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.more[0].N = 0;
  EXPECT_EQ(launch_bf16_small_gemm(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.more[0].w = p.more[0].w + 1;
  EXPECT_EQ(launch_bf16_small_gemm(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.more[0].out = nullptr;
  EXPECT_EQ(launch_bf16_small_gemm(bad, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// KernelOptions::gemm_bf16_small_wide: a wide bf16 weight (an LM head's rows, past kSplitMaxRows) at <= 32
// tokens takes the small-T kernel (two-term: closer to the f32 product than cuBLASLt's bf16 x), off by
// default; above 32 tokens, and with the option off, cuBLASLt.
TEST_F(CudaFp8SmallGemm, WideBf16TakesTheSmallKernelWhenAsked) {
  EXPECT_FALSE(KernelOptions{}.gemm_bf16_small_wide);
  KernelOptions on_o;
  on_o.gemm_bf16_small_wide = true;
  const std::shared_ptr<Backend> on = make_backend(on_o), off = make_backend({});
  const WeightRef w = rand_weight(4096 + 72, 6144, DType::bf16, 11), wd = to_cuda(w);
  for (int64_t T : {int64_t(1), int64_t(7), int64_t(32), int64_t(33)}) {
    const Tensor x = rand_f32({T, 6144}, uint64_t(100 + T), 2.0f), xd = x.to(Device::cuda);
    const Tensor want = kernels::linear(x, w);
    const GemmStats before = gemm_stats();
    const Tensor a = on->linear(xd, wd, 0, -1, Tensor());
    const int64_t small_calls = gemm_stats().bf16_small_calls - before.bf16_small_calls;
    const Tensor b = off->linear(xd, wd, 0, -1, Tensor());
    EXPECT_EQ(gemm_stats().bf16_small_calls - before.bf16_small_calls, small_calls) << "off: cuBLASLt";
    EXPECT_EQ(small_calls, T <= kBf16SmallMaxTokens ? 1 : 0) << "T=" << T;
    const double err_on = testing::row_l2_rel_error(a, want), err_off = testing::row_l2_rel_error(b, want);
    fmt::print("RESULT op=linear bf16 wide [4168 x 6144] T={} small-T l2_rel_err={:.3g} cuBLASLt {:.3g}\n", T,
               err_on, err_off);
    EXPECT_LE(err_on, T <= kBf16SmallMaxTokens ? 1e-4 : 1e-2);
    EXPECT_LE(err_off, 1e-2);
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
