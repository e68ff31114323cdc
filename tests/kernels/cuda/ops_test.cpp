// The CUDA backend's machinery beside its operators (whose CPU-twin cases are the operator table:
// op_table_test.cpp): the linear's GEMM paths all run at GLM-5.3 shapes, and the caching allocator serves
// a steady state without cudaMalloc.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

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
  void TearDown() override {
    if (has_gpu()) clear_gemm_caches();
  }
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

}  // namespace
}  // namespace dsaserve::kernels::cuda
