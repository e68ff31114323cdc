// RMSNorm's cluster kernel (elementwise/norm.cu: a decode step's few rows, each split over a cluster of 2-8
// CTAs) against its twin, the one-CTA-a-row kernel, bit for bit: the normed rows, the updated residual, the
// FP8 copy's codes and scales (padding rows included), at GLM-5.x's and DeepSeek-V3.2's hidden widths (6,144
// and 7,168 over 8 CTAs) and 4,096 (4 CTAs), bf16 and f32 weights, with and without the residual, row counts
// up to the cluster path's limit. The two differ only in the order of the fp64 sum of squares, which rounds
// to the same f32 scale. The CPU twin is checked by the operator table (rms_norm, add_rms_norm, norm_fp8
// cases).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu_test.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::bits_equal;
using testing::rand_bf16;
using testing::rand_f32;

class CudaRmsNormCluster : public testing::GpuTest {};

// Which CTA count a row gets: the most of 8 / 4 / 2 with >= 512 columns each, whole 128-column groups and at
// most one float4 a thread; one CTA past the row limit or where none fits.
TEST(RmsNormClusterChoice, CtasPerRow) {
  EXPECT_EQ(rms_norm_cluster_ctas(1, 6144), 8);
  EXPECT_EQ(rms_norm_cluster_ctas(1, 7168), 8);
  EXPECT_EQ(rms_norm_cluster_ctas(1, 4096), 4);
  EXPECT_EQ(rms_norm_cluster_ctas(kRmsNormClusterMaxRows, 6144), 8);
  EXPECT_EQ(rms_norm_cluster_ctas(kRmsNormClusterMaxRows + 1, 6144), 1);
  EXPECT_EQ(rms_norm_cluster_ctas(0, 6144), 1);
  EXPECT_EQ(rms_norm_cluster_ctas(1, 2048), 1);   // q_lora: as fast on one CTA
  EXPECT_EQ(rms_norm_cluster_ctas(1, 512), 1);    // the kv latent
  EXPECT_EQ(rms_norm_cluster_ctas(1, 4100), 1);   // not whole groups
  EXPECT_EQ(rms_norm_cluster_ctas(1, 16384), 1);  // more than one float4 a thread at 8 CTAs
}

TEST_F(CudaRmsNormCluster, EqualsOneCtaPerRowBitForBit) {
  int cases = 0;
  for (int64_t cols : {int64_t(6144), int64_t(7168), int64_t(4096)}) {
    for (int64_t rows : {int64_t(1), int64_t(3), int64_t(8), int64_t(17), kRmsNormClusterMaxRows}) {
      ASSERT_GT(rms_norm_cluster_ctas(rows, cols), 1) << cols << " x " << rows;
      for (bool f32_weight : {false, true}) {
        for (bool with_res : {false, true}) {
          for (bool fp8 : {false, true}) {
            const uint64_t seed = uint64_t(cols + rows * 10 + (f32_weight ? 1 : 0) + (with_res ? 2 : 0));
            // x a view inside wider rows (its stride is not its width), as the model's are.
            const Tensor xw = rand_f32({rows, cols + 64}, seed, 3.0f).to(Device::cuda);
            const Tensor x = xw.slice(1, 0, cols);
            const Tensor w =
                (f32_weight ? rand_f32({cols}, seed + 1) : rand_bf16({cols}, seed + 1)).to(Device::cuda);
            const Tensor r0 = rand_f32({rows, cols}, seed + 2).to(Device::cuda);
            const int64_t pad = fp8 ? rows + 5 : 0;  // padding rows too
            struct Run {
              Tensor out, res, codes, scales;
            };
            auto run = [&](bool one_cta) {
              Run r{Tensor::empty({rows, cols}, DType::f32, Device::cuda), r0.clone(), {}, {}};
              RmsNormParams p{x.data<float>(),
                              with_res ? r.res.data<float>() : nullptr,
                              w.raw_data(),
                              r.out.data<float>(),
                              rows,
                              cols,
                              x.stride(0),
                              cols,
                              !f32_weight,
                              1e-5};
              if (fp8) {
                r.codes = Tensor::empty({pad, cols}, DType::u8, Device::cuda);
                r.scales = Tensor::empty({cols / 128, pad}, DType::f32, Device::cuda);
                p.q_codes = r.codes.data_u8();
                p.q_scales = r.scales.data<float>();
                p.q_rows_pad = pad;
              }
              p.one_cta_per_row = one_cta;
              EXPECT_EQ(launch_rms_norm(p, nullptr), cudaSuccess);
              EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              return r;
            };
            const Run a = run(false), b = run(true);
            const std::string what = fmt::format("cols {} rows {} f32 weight {} residual {} fp8 {}", cols,
                                                 rows, f32_weight, with_res, fp8);
            EXPECT_TRUE(bits_equal(a.out, b.out)) << "out " << what;
            EXPECT_TRUE(bits_equal(a.res, b.res)) << "residual " << what;
            if (fp8) {
              EXPECT_TRUE(bits_equal(a.codes, b.codes)) << "codes " << what;
              EXPECT_TRUE(bits_equal(a.scales, b.scales)) << "scales " << what;
            }
            ++cases;
          }
        }
      }
    }
  }
  fmt::print("RESULT op=rms_norm_cluster cases={} out/residual/codes/scales == one CTA a row ok\n", cases);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
