// Host wrapper of fill_dummy on CUDA (dummy.cu): validates, launches on op_stream().
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dummy/dummy_params.h"

namespace dsaserve::kernels::cuda {

void fill_dummy(Tensor& t, const dummy::FillSpec& f) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.is_contiguous(),
            "fill_dummy: needs a contiguous CUDA tensor, got {}", t.defined() ? t.describe() : "undefined");
  const DType dt = t.dtype();
  DSA_CHECK(dt == DType::bf16 || dt == DType::f32 || dt == DType::f8e4m3fn,
            "fill_dummy: dtype {} (bf16, f32 or f8e4m3fn)", dtype_name(dt));
  const DummyOut o = dt == DType::bf16 ? DummyOut::bf16 : dt == DType::f32 ? DummyOut::f32 : DummyOut::fp8;
  check_launch(launch_dummy_fill({t.raw_data(), t.numel(), o, f}, op_stream()), "fill_dummy");
}

}  // namespace dsaserve::kernels::cuda
