#include "kernels/cuda/common/views.h"

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_context.h"

namespace dsaserve::kernels::cuda {

cudaStream_t op_stream() {
  const cudaStream_t s = detail::op_stream_override;
  return s != nullptr ? s : device_context().compute;
}

void check_current_device(const Tensor& t, const char* what) {
  DSA_CHECK(t.device_index() == current_device(),
            "{}: {} is not on the current device (cuda:{}): an operator runs on its device's tensors", what,
            t.describe(), current_device());
}

namespace {
void check_cuda_f32(const Tensor& t, int64_t dims, const char* what) {
  DSA_CHECK(t.defined(), "{}: tensor is undefined", what);
  DSA_CHECK(t.device() == Device::cuda, "{}: expected a CUDA tensor, got {}", what, t.describe());
  check_current_device(t, what);
  DSA_CHECK(t.dtype() == DType::f32, "{}: expected f32, got {}", what, t.describe());
  DSA_CHECK(t.dim() == dims, "{}: expected {}-D, got {}", what, dims, t.describe());
  DSA_CHECK(t.stride(dims - 1) == 1 || t.size(dims - 1) <= 1, "{}: last dimension must be contiguous ({})",
            what, t.describe());
}
}  // namespace

RowView rows_f32(const Tensor& t, const char* what) {
  check_cuda_f32(t, 2, what);
  return RowView{static_cast<float*>(t.raw_data()), t.size(0), t.size(1), t.stride(0)};
}

Rows3View rows3_f32(const Tensor& t, const char* what) {
  check_cuda_f32(t, 3, what);
  return Rows3View{
      static_cast<float*>(t.raw_data()), t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1)};
}

const int32_t* i32_vec(const Tensor& t, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.dtype() == DType::i32 && t.dim() == 1 &&
                (t.stride(0) == 1 || t.size(0) <= 1),
            "{}: expected a contiguous CUDA i32 vector, got {}", what,
            t.defined() ? t.describe() : "undefined");
  check_current_device(t, what);
  return static_cast<const int32_t*>(t.raw_data());
}

std::vector<int32_t> i32_to_host(const Tensor& t) {
  DSA_CHECK(t.dtype() == DType::i32, "expected i32 indices, got {}", t.describe());
  const Tensor h = t.device() == Device::cpu ? t.contiguous() : t.contiguous().to(Device::cpu);
  const int32_t* p = static_cast<const int32_t*>(h.raw_data());
  return std::vector<int32_t>(p, p + h.numel());
}

bool vec_bf16(const Tensor& w, int64_t n, const char* what) {
  DSA_CHECK(w.defined() && w.device() == Device::cuda && w.dim() == 1 && w.size(0) == n &&
                w.is_contiguous() && (w.dtype() == DType::bf16 || w.dtype() == DType::f32),
            "{}: expected a contiguous CUDA bf16/f32 vector of {} values, got {}", what, n,
            w.defined() ? w.describe() : "undefined");
  check_current_device(w, what);
  return w.dtype() == DType::bf16;
}

Tensor out_or_new(Tensor out, int64_t rows, int64_t cols, const char* what) {
  if (!out.defined()) return Tensor::empty({rows, cols}, DType::f32, Device::cuda);
  const RowView o = rows_f32(out, what);
  DSA_CHECK(o.rows == rows && o.cols == cols, "{}: output {} should be [{}, {}]", what, out.describe(), rows,
            cols);
  return out;
}

void check_launch(cudaError_t e, const char* what) {
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();
    fail("{}: shape outside what the CUDA kernel supports", what);
  }
  if (e != cudaSuccess) fail("{}: CUDA error {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace dsaserve::kernels::cuda
