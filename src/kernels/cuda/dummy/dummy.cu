// The dummy-weight fill: one thread per 4 elements, grid-stride; the values of core/dummy_fill.h (the
// CPU's fill_dummy writes the same bytes).
#include "kernels/cuda/dummy/dummy_params.h"

namespace dsaserve::kernels::cuda {

namespace {

// One thread per hash group (2 values or 4 FP8 codes), grid-stride.
__global__ void dummy_fill_kernel(DummyFillParams p) {
  const uint64_t base = dummy::stream_base(p.spec.seed, p.spec.key);
  const int per = p.out_type == DummyOut::fp8 ? dummy::kGroupFp8 : dummy::kGroupValues;
  const int64_t groups = (p.n + per - 1) / per;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const uint64_t h = dummy::element_bits(base, uint64_t(g));
    for (int64_t i = g * per; i < min(p.n, (g + 1) * per); ++i) {
      switch (p.out_type) {
        case DummyOut::bf16:
          static_cast<uint16_t*>(p.out)[i] =
              dummy::bf16_rne(dummy::value_f32(p.spec, dummy::value_bits(h, i)));
          break;
        case DummyOut::f32:
          static_cast<float*>(p.out)[i] = dummy::value_f32(p.spec, dummy::value_bits(h, i));
          break;
        case DummyOut::fp8: static_cast<uint8_t*>(p.out)[i] = dummy::fp8_code(dummy::code_bits(h, i)); break;
      }
    }
  }
}

}  // namespace

cudaError_t launch_dummy_fill(const DummyFillParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.n / 2 + kThreads) / kThreads, int64_t(132) * 32);
  dummy_fill_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
