// Every case of the operator table (tests/kernels/op_table.h: each Backend operator at GLM-5.3 shapes,
// ragged token counts) on the CUDA backend against the CPU reference; one test per case, one RESULT line
// per token count and output. Tolerances are the table's: elementwise 1e-5 (max |diff| / max |ref| per
// row), fp32 attention reductions 1e-4, bf16 GEMMs 1e-2 and FP8 GEMMs 5e-2 (per row ||diff|| / ||ref||),
// selections exact (indexer top-k: 1e-3 of entries for near-ties of fp32 sums), dummy fills bit-exact.
#include "kernels/op_table.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cctype>

#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"

namespace dsaserve::kernels::cuda {
namespace {

using kernels::testing::OpCase;

class CudaOpTable : public testing::GpuTest, public ::testing::WithParamInterface<OpCase> {};

TEST_P(CudaOpTable, MatchesCpu) {
  const OpCase& c = GetParam();
  Backend& gpu = cuda_backend();
  Backend& ref = backend(Device::cpu);
  for (int64_t T : c.tokens) {
    const kernels::testing::OpRun run = c.make(gpu, ref, T);
    const std::vector<Tensor> got = run.device(), want = run.reference();
    ASSERT_EQ(got.size(), run.checks.size()) << c.op << " " << c.variant;
    ASSERT_EQ(want.size(), run.checks.size()) << c.op << " " << c.variant;
    for (size_t i = 0; i < got.size(); ++i) {
      const kernels::testing::Check& k = run.checks[i];
      const double err = kernels::testing::measure(k.measure, got[i], want[i]);
      fmt::print("RESULT op={:<22} case={:<44} T={:<5} out={} {}={:<10.3g} tol={:<8.3g} {}\n", c.op,
                 c.variant, T, i, kernels::testing::measure_name(k.measure), err, k.tol,
                 err <= k.tol ? "ok" : "FAIL");
      EXPECT_LE(err, k.tol) << c.op << " / " << c.variant << " T=" << T << " output " << i;
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string s = fmt::format("{}_{}_{}", info.index, info.param.op, info.param.variant);
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(CudaOps, CudaOpTable, ::testing::ValuesIn(kernels::testing::op_table()), case_name);

}  // namespace
}  // namespace dsaserve::kernels::cuda
