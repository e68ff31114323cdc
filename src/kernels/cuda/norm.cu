// RMSNorm (+ fused residual add) and LayerNorm: one block per row, fp64 statistics like the CPU reference.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void sm90_rms_norm_kernel(RmsNormParams p) {
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;
  float* res = p.residual ? p.residual + row * p.res_stride : nullptr;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
    float v = x[i];
    if (res) {
      v = res[i] + v;
      res[i] = v;
    }
    ss += double(v) * double(v);
  }
  ss = block_sum(ss);
  const float r = float(1.0 / sqrt(ss / double(p.cols) + p.eps));
  const float* src = res ? res : x;
  float* out = p.out + row * p.cols;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
    out[i] = load_any(p.weight, p.weight_bf16, i) * (src[i] * r);
  }
}

__global__ void sm90_layer_norm_kernel(LayerNormParams p) {
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) s += double(x[i]);
  const double mean = block_sum(s) / double(p.cols);
  double v = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) v += (x[i] - mean) * (x[i] - mean);
  const double var = block_sum(v) / double(p.cols);
  const double r = 1.0 / sqrt(var + p.eps);
  float* out = p.out + row * p.cols;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
    out[i] =
        float((x[i] - mean) * r * double(load_any(p.w, p.w_bf16, i)) + double(load_any(p.b, p.b_bf16, i)));
  }
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  sm90_rms_norm_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  sm90_layer_norm_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
