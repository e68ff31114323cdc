#pragma once
// Helpers of the CUDA-vs-CPU operator tests: the random inputs and error measures of
// tests/kernels/tensor_compare.h, and the "RESULT" lines scripts/gpu.sh collects.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "kernels/tensor_compare.h"

namespace dsaserve::kernels::cuda::testing {

using kernels::testing::mismatch;
using kernels::testing::rand_bf16;
using kernels::testing::rand_f32;
using kernels::testing::rand_weight;
using kernels::testing::Rng;
using kernels::testing::row_l2_rel_error;
using kernels::testing::row_rel_error;

inline WeightRef to_cuda(const WeightRef& w) { return kernels::testing::weight_on(w, Device::cuda); }

inline Tensor cpu(const Tensor& t) { return kernels::testing::host(t); }

// Whether two tensors (on any device) hold the same bytes: the bit-for-bit checks of fused launches against
// the passes they replace.
inline bool bits_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = cpu(a).contiguous(), y = cpu(b).contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// Prints "RESULT op=... shape=... max_rel_err=... tol=..." and checks err <= tol.
inline void report(const std::string& op, const std::string& shape, double err, double tol) {
  fmt::print("RESULT op={:<22} shape={:<34} max_rel_err={:<10.3g} tol={:<8.3g} {}\n", op, shape, err, tol,
             err <= tol ? "ok" : "FAIL");
  EXPECT_LE(err, tol) << op << " " << shape;
}

// GEMM rows: prints both measures, checks the L2 one.
inline void report_gemm(const std::string& op, const std::string& shape, const Tensor& got,
                        const Tensor& want, double tol) {
  const double l2 = row_l2_rel_error(got, want), mx = row_rel_error(got, want);
  fmt::print("RESULT op={:<22} shape={:<34} l2_rel_err={:<10.3g} tol={:<8.3g} {} (max_rel_err={:.3g})\n", op,
             shape, l2, tol, l2 <= tol ? "ok" : "FAIL", mx);
  EXPECT_LE(l2, tol) << op << " " << shape;
}

}  // namespace dsaserve::kernels::cuda::testing
