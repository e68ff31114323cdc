// The operator table's perf mode (tests/kernels/op_table.h; llama.cpp's test-backend-ops -mode perf):
// every case's CUDA run at each of its token counts, timed as ops_gpu_bench times (median of 20 after 3
// warm-ups, CUDA events around each run, so host work inside an operator shows), beside its floor: the
// case's least bytes / 4.3 TB/s or its FLOPs / the measured tensor-core peak (797 TFLOP/s bf16, 1434
// FP8; docs/GPU.md), whichever is larger, and floor / measured. The correctness of the same cases is
// op_table_test's. Usage: op_table_gpu_bench [substring of "op / variant" to run only those cases].
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gpu_timing.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/op_table.h"

namespace {

using namespace dsaserve;
constexpr double kHbm = 4.3e12, kBf16 = 797e12, kFp8 = 1434e12;

}  // namespace

int main(int argc, char** argv) {
  if (kernels::cuda::device_count() == 0) {
    std::fprintf(stderr, "op_table_gpu_bench: no CUDA device\n");
    return 1;
  }
  const std::string only = argc > 1 ? argv[1] : "";
  kernels::cuda::install_backend();
  kernels::Backend& gpu = kernels::cuda::cuda_backend();
  kernels::Backend& cpu = kernels::backend(Device::cpu);
  fmt::print("| op | case | T | measured us | floor us | floor / measured | GB/s | TFLOP/s |\n");
  fmt::print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const kernels::testing::OpCase& c : kernels::testing::op_table()) {
    if (!only.empty() && (c.op + " / " + c.variant).find(only) == std::string::npos) continue;
    for (int64_t T : c.tokens) {
      const kernels::testing::OpRun run = c.make(gpu, cpu, T);
      const double us = bench::median_event_us([&] { (void)run.device(); });
      const double floor_us = std::max(run.bytes / kHbm, run.flops / (run.fp8 ? kFp8 : kBf16)) * 1e6;
      fmt::print("| {} | {} | {} | {:.1f} | {:.2f} | {:.2f} | {:.0f} | {:.1f} |\n", c.op, c.variant, T, us,
                 floor_us, floor_us / us, run.bytes / (us * 1e-6) / 1e9, run.flops / (us * 1e-6) / 1e12);
      std::fflush(stdout);
    }
  }
  return 0;
}
