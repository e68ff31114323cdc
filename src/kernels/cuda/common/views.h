#pragma once
// Host-side validation shared by the CUDA wrappers (.cpp only): typed row views of CUDA tensors, index
// tensors, launch-status checks. Every check throws dsaserve::Error naming the operator.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace dsaserve::kernels::cuda {

// Throws unless CUDA tensor `t` lives on the calling thread's current device (Tensor::device_index()).
void check_current_device(const Tensor& t, const char* what);

// A 2-D f32 view [rows, cols] (last dimension contiguous, rows `stride` floats apart).
// (rows_f32, rows3_f32, i32_vec and vec_bf16 refuse a tensor off the current device.)
struct RowView {
  float* p = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
};
RowView rows_f32(const Tensor& t, const char* what);

// A 3-D f32 view [n0, n1, n2] (last dimension contiguous).
struct Rows3View {
  float* p = nullptr;
  int64_t n0 = 0, n1 = 0, n2 = 0, s0 = 0, s1 = 0;
};
Rows3View rows3_f32(const Tensor& t, const char* what);

// A contiguous CUDA i32 vector.
const int32_t* i32_vec(const Tensor& t, const char* what);
// Copies a (small) CUDA or CPU i32 tensor to the host.
std::vector<int32_t> i32_to_host(const Tensor& t);
// A 1-D CUDA vector of n values, bf16 or f32; returns whether it is bf16.
bool vec_bf16(const Tensor& w, int64_t n, const char* what);

// `out` when given (checked [rows, cols] f32 row view on CUDA), else a new contiguous CUDA tensor.
Tensor out_or_new(Tensor out, int64_t rows, int64_t cols, const char* what);

// Throws when a launch (or an earlier asynchronous error) failed.
void check_launch(cudaError_t e, const char* what);

namespace detail {
inline thread_local cudaStream_t op_stream_override = nullptr;
}

// The stream every operator runs on: the current device's compute stream (device_context.h: a blocking
// stream, so it orders with the legacy stream's synchronous copies and the allocator's reuse), unless this
// thread installed another one with OpStreamScope (a CUDA-graph capture: graph.h).
cudaStream_t op_stream();
// Whether this thread installed a stream of its own with OpStreamScope (then op_stream() is that one).
inline bool op_stream_overridden() { return detail::op_stream_override != nullptr; }

// While alive, this thread's operators run on `s` (e.g. a stream being captured into a CUDA graph); the
// previous stream comes back on destruction.
class OpStreamScope {
 public:
  explicit OpStreamScope(cudaStream_t s) : prev_(detail::op_stream_override) {
    detail::op_stream_override = s;
  }
  ~OpStreamScope() { detail::op_stream_override = prev_; }
  OpStreamScope(const OpStreamScope&) = delete;
  OpStreamScope& operator=(const OpStreamScope&) = delete;

 private:
  cudaStream_t prev_;
};

}  // namespace dsaserve::kernels::cuda
