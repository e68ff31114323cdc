// The dummy-weight fill: one thread per 4 elements, grid-stride; the values of core/dummy_fill.h (the
// CPU's fill_dummy writes the same bytes).
#include "kernels/cuda/dummy_params.h"

namespace dsaserve::kernels::cuda {

namespace {

__global__ void dummy_fill_kernel(DummyFillParams p) {
  const uint64_t base = dummy::stream_base(p.spec.seed, p.spec.key);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const uint64_t h = dummy::element_bits(base, uint64_t(i));
    switch (p.out_type) {
      case DummyOut::bf16: static_cast<uint16_t*>(p.out)[i] = dummy::bf16_rne(dummy::value_f32(p.spec, h)); break;
      case DummyOut::f32: static_cast<float*>(p.out)[i] = dummy::value_f32(p.spec, h); break;
      case DummyOut::fp8: static_cast<uint8_t*>(p.out)[i] = dummy::fp8_code(h); break;
    }
  }
}

}  // namespace

cudaError_t launch_dummy_fill(const DummyFillParams& p, cudaStream_t stream) {
  if (p.n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, int64_t(132) * 32);
  dummy_fill_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
