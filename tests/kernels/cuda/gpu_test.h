#pragma once
// The GPU tests' common start: without a CUDA device they skip (they run on the GPU machine through
// scripts/gpu.sh; CI runs the skip); with one, the caching allocator and the CUDA backend are installed.
#include <gtest/gtest.h>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"

namespace dsaserve::kernels::cuda::testing {

inline constexpr const char* kNoGpu =
    "no CUDA device here: GPU tests run on the GPU machine (scripts/gpu.sh)";

// Base fixture of the GPU tests. A fixture with more to set up calls GpuTest::SetUp() first and returns
// when IsSkipped().
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << kNoGpu;
    install_backend();
  }
  static bool has_gpu() { return device_count() > 0; }
};

}  // namespace dsaserve::kernels::cuda::testing

// The same start inside a TEST / TEST_P body (returns from it when skipping).
#define DSA_SKIP_WITHOUT_GPU()                                    \
  do {                                                            \
    if (::dsaserve::kernels::cuda::device_count() == 0)           \
      GTEST_SKIP() << ::dsaserve::kernels::cuda::testing::kNoGpu; \
    ::dsaserve::kernels::cuda::install_backend();                 \
  } while (0)
