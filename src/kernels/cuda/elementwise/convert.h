#pragma once
// dtype conversion on the GPU, bit-identical to core/dtype.h (PyTorch's casts).
#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

// dst = src converted elementwise; both contiguous CUDA tensors of the same shape. Float types and
// f32 only (f32, f16, bf16, f8e4m3fn, f8e5m2). saturate: fp8 e4m3fn clamps to +-448 (quantisation rule)
// instead of torch's NaN on overflow.
void convert(const Tensor& src, Tensor& dst, bool saturate = false);

}  // namespace dsaserve::kernels::cuda
