// silu_mul_fp8 (elementwise/silu_fp8.cu): the f32 output is silu_mul's bit for bit, the FP8 copy is the
// recipe's quantisation of it bit for bit (codes, scales, the padding rows' zeros and ones), and the FP8 down
// projection through linear_multi with the copy equals linear() quantising the output itself, bit for bit;
// at the shared expert's and the dense MLP's widths, decode and prefill token counts, gate / up as the two
// halves of linear_multi-style [T, 2I] rows; without a copy where the kernel does not apply. Skips without a
// GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::bits_equal;
using testing::rand_f32;
using testing::rand_weight;
using testing::to_cuda;

class CudaSiluFp8 : public testing::GpuTest {};

TEST_F(CudaSiluFp8, CopyIsTheQuantisationOfSiluMul) {
  Backend& be = cuda_backend();
  for (int64_t I : {int64_t(2048), int64_t(12288)}) {
    WeightRef down = to_cuda(rand_weight(384, I, DType::f8e4m3fn, 5 + uint64_t(I)));
    down.derived = be.derive_weight(down, WeightUse::linear);
    for (int64_t T : {int64_t(1), int64_t(7), int64_t(33), int64_t(257), int64_t(4096)}) {
      const Tensor gu = rand_f32({T, 2 * I}, 11 + uint64_t(T + I), 4.0f).to(Device::cuda);
      const Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
      Fp8Act q;
      const Tensor a = be.silu_mul_fp8(g, u, q);
      ASSERT_TRUE(q.defined()) << "I " << I << " T " << T;
      EXPECT_EQ(q.rows, T);
      const Tensor plain = be.silu_mul(g, u);
      EXPECT_TRUE(bits_equal(a, plain)) << "output I " << I << " T " << T;
      const Fp8Act want = quantize_fp8_activations(plain, be.options());
      const bool codes = bits_equal(q.codes, want.codes), scales = bits_equal(q.scales, want.scales);
      EXPECT_TRUE(codes) << "codes I " << I << " T " << T;
      EXPECT_TRUE(scales) << "scales I " << I << " T " << T;
      EXPECT_TRUE(bits_equal(be.linear_multi(a, {down}, &q)[0], be.linear(plain, down, 0, -1, {})))
          << "down projection with the copy, I " << I << " T " << T;
      fmt::print("RESULT op=silu_mul_fp8 I={} T={} output==silu_mul codes/scales==quantize(silu_mul) {}\n", I,
                 T, codes && scales ? "ok" : "FAIL");
    }
  }
  // No copy where the kernel does not apply: a width that is not whole 128-groups, fp32 GEMMs.
  Fp8Act q;
  const Tensor x = rand_f32({5, 2 * 200}, 3).to(Device::cuda);
  (void)be.silu_mul_fp8(x.slice(1, 0, 200), x.slice(1, 200, 400), q);
  EXPECT_FALSE(q.defined());
  KernelOptions exact;
  exact.gemm = GemmPrecision::fp32;
  const Tensor y = rand_f32({5, 2 * 256}, 4).to(Device::cuda);
  (void)make_backend(exact)->silu_mul_fp8(y.slice(1, 0, 256), y.slice(1, 256, 512), q);
  EXPECT_FALSE(q.defined());
  KernelOptions off;  // the old path, switched by the options
  off.silu_mul_fp8_copy = false;
  (void)make_backend(off)->silu_mul_fp8(y.slice(1, 0, 256), y.slice(1, 256, 512), q);
  EXPECT_FALSE(q.defined());
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
