// The CUDA backend's machinery beside its operators (whose CPU-twin cases are the operator table:
// op_table_test.cpp): the linear's GEMM paths all run at GLM-5.3 shapes, the caching allocator serves
// a steady state without cudaMalloc, and the weights' derived forms change no bit.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/allocator.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/gemm/gemm.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace testing;

constexpr int64_t kH = 6144;

class CudaOps : public testing::GpuTest {
 protected:
  Backend& gpu() { return cuda_backend(); }
};

Tensor on_gpu(const Tensor& t) { return t.to(Device::cuda); }

// FP8 linears at one token (the small-T kernel) and at 257 (cuBLASLt's block-scaled GEMM), bf16 ones.
TEST_F(CudaOps, EveryGemmPathRuns) {
  const GemmStats before = gemm_stats();
  for (DType dt : {DType::f8e4m3fn, DType::bf16}) {
    const WeightRef w = to_cuda(rand_weight(2048, kH, dt, 1));
    for (int64_t T : {int64_t(1), int64_t(257)})
      (void)gpu().linear(on_gpu(rand_f32({T, kH}, 2 + T)), w, 0, -1, {});
  }
  cudaDeviceSynchronize();
  const GemmStats st = gemm_stats();
  fmt::print(
      "RESULT op=gemm_paths fp8_block_scaled_calls={} fp8_small_t_calls={} bf16_calls={} f32_calls={} "
      "fp8_weights_dequantised={} tuned_plans={} failed_plans={} {}\n",
      st.fp8_calls, st.fp8_small_calls, st.bf16_calls, st.f32_calls, st.dequantised, st.tuned_plans,
      st.failed_plans, st.last_failure);
  EXPECT_GT(st.fp8_calls, before.fp8_calls) << "the FP8 block-scaled cuBLASLt path never ran";
  EXPECT_GT(st.fp8_small_calls, before.fp8_small_calls) << "the small-T FP8 kernel never ran";
  EXPECT_GT(st.bf16_calls, before.bf16_calls) << "the bf16 path never ran";
}

TEST_F(CudaOps, CachingAllocatorReusesBlocks) {
  const Tensor x = on_gpu(rand_f32({257, kH}, 1));
  const Tensor w = on_gpu(rand_bf16({kH}, 2));
  for (int i = 0; i < 3; ++i) (void)gpu().silu_mul(gpu().rms_norm(x, w, 1e-5), x);  // warm the size classes
  cudaDeviceSynchronize();
  const int64_t before = allocator_stats().device_mallocs;
  for (int i = 0; i < 100; ++i) (void)gpu().silu_mul(gpu().rms_norm(x, w, 1e-5), x);
  EXPECT_EQ(allocator_stats().device_mallocs, before) << "steady state must not call cudaMalloc";
  EXPECT_EQ(allocation_size_class(1), 512u);
  EXPECT_EQ(allocation_size_class(1025), 1280u);
  EXPECT_EQ(allocation_size_class(size_t(100) << 20), size_t(100) << 20);
}

// The forms a backend derives from a weight at model load (DerivedWeight: derive_gemm_weight) change no
// number: each path that reads one gives the same bits with it as with the form it makes per call
// without it. FP8 through cuBLASLt (padded scales) and the small-T kernel, an FP8 weight outside the
// recipe (K % 128 != 0: bf16 copy), linear_t and the absorbed projections on kv_b (bf16 copy), fp32 mode
// (f32 copy of bf16 and FP8 weights), bf16 weights (nothing derived in fast mode).
TEST_F(CudaOps, DerivedWeightFormsChangeNoBit) {
  auto same = [](const Tensor& a, const Tensor& b) {
    const Tensor x = cpu(a), y = cpu(b);
    return x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  KernelOptions fp32;
  fp32.gemm = GemmPrecision::fp32;
  struct Case {
    int64_t n, k;
    DType dt;
    WeightUse use;
  };
  constexpr int64_t kHeads = 8, kNope = 192, kV = 256, kL = 512;
  const Case cases[] = {{2048, kH, DType::f8e4m3fn, WeightUse::linear},
                        {384, 200, DType::f8e4m3fn, WeightUse::linear},
                        {1024, kH, DType::bf16, WeightUse::linear},
                        {kHeads * (kNope + kV), kL, DType::f8e4m3fn, WeightUse::absorb},
                        {kHeads * (kNope + kV), kL, DType::bf16, WeightUse::absorb}};
  for (const KernelOptions& o : {KernelOptions{}, fp32}) {
    const std::shared_ptr<Backend> be = make_backend(o);
    const Ops ops(be.get());
    for (const Case& c : cases) {
      const WeightRef plain = to_cuda(rand_weight(c.n, c.k, c.dt, 11 + uint64_t(c.n + c.k)));
      WeightRef derived = plain;
      derived.derived = be->derive_weight(plain, c.use);
      const bool fp8 = c.dt == DType::f8e4m3fn;
      if (o.gemm == GemmPrecision::fp32 || fp8) {
        ASSERT_NE(derived.derived, nullptr) << c.n << "x" << c.k;
      } else {
        EXPECT_EQ(derived.derived, nullptr) << "a bf16 weight in fast mode needs no derived form";
      }
      const std::string what = fmt::format("{} {}x{} gemm={}", dtype_name(c.dt), c.n, c.k, int(o.gemm));
      for (int64_t T : {int64_t(1), int64_t(257)}) {
        const Tensor x = on_gpu(rand_f32({T, c.k}, 40 + uint64_t(T)));
        EXPECT_TRUE(same(ops.linear(x, plain), ops.linear(x, derived))) << what << " linear T=" << T;
        const Tensor xt = on_gpu(rand_f32({T, 128}, 50 + uint64_t(T)));
        EXPECT_TRUE(same(ops.linear_t(xt, plain, 0, 128), ops.linear_t(xt, derived, 0, 128)))
            << what << " linear_t T=" << T;
        if (c.use != WeightUse::absorb) continue;
        const Tensor q = on_gpu(rand_f32({T, kHeads, kNope}, 60 + uint64_t(T)));
        EXPECT_TRUE(same(ops.absorb_q(q, plain), ops.absorb_q(q, derived))) << what << " absorb_q T=" << T;
        const Tensor lat = on_gpu(rand_f32({T, kHeads, kL}, 70 + uint64_t(T)));
        EXPECT_TRUE(same(ops.absorb_v(lat, plain, kV), ops.absorb_v(lat, derived, kV)))
            << what << " absorb_v T=" << T;
      }
    }
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
