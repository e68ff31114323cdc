#include "kernels/cuda/elementwise/convert.h"

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/elementwise/convert_params.h"

namespace dsaserve::kernels::cuda {

void convert(const Tensor& src, Tensor& dst, bool saturate) {
  DSA_CHECK(src.device() == Device::cuda && dst.device() == Device::cuda, "cuda::convert: {} -> {}",
            src.describe(), dst.describe());
  DSA_CHECK(src.shape() == dst.shape() && src.is_contiguous() && dst.is_contiguous(),
            "cuda::convert: shapes or layouts differ: {} -> {}", src.describe(), dst.describe());
  DSA_CHECK(dtype_is_float(src.dtype()) && dtype_is_float(dst.dtype()), "cuda::convert: {} -> {} unsupported",
            dtype_name(src.dtype()), dtype_name(dst.dtype()));
  DSA_CUDA_CHECK(launch_convert(
      {src.raw_data(), dst.raw_data(), src.dtype(), dst.dtype(), src.numel(), saturate}, op_stream()));
  DSA_CUDA_CHECK(cudaStreamSynchronize(op_stream()));
}

}  // namespace dsaserve::kernels::cuda
