// RMSNorm (+ fused residual add) and LayerNorm: one block per row, fp64 statistics like the CPU reference.
// RMSNorm of rows whose width is a multiple of 4 (<= 8192) and whose views are 16-byte aligned keeps the
// row in registers (float4 loads, up to 8 per thread) between the sum of squares and the scaling, so x
// (and the residual) are read from global memory once; other rows take the scalar two-pass kernel.
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/elementwise/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void sm90_rms_norm_kernel(RmsNormParams p) {
  pdl_enter();
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

constexpr int kVecThreads = 256;
constexpr int kMaxVec = 8;  // float4 per thread: rows up to 256 * 8 * 4 = 8192 columns

// kVec: float4 per thread (cols <= 4 * kVecThreads * kVec), a template argument so registers fit the row.
template <int kVec>
__global__ void __launch_bounds__(kVecThreads) sm90_rms_norm_vec_kernel(RmsNormParams p) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  const int64_t n4 = p.cols / 4;
  if (row >= p.rows) {  // FP8 padding rows (q_rows_pad > rows): codes 0, scale 1, as launch_quant_fp8
    for (int64_t i = threadIdx.x; i < n4; i += kVecThreads)
      reinterpret_cast<uchar4*>(p.q_codes + row * p.cols)[i] = make_uchar4(0, 0, 0, 0);
    for (int64_t g = threadIdx.x; g < p.cols / 128; g += kVecThreads)
      p.q_scales[g * p.q_rows_pad + row] = 1.0f;
    return;
  }
  const float4* x = reinterpret_cast<const float4*>(p.x + row * p.x_stride);
  float4* res = p.residual ? reinterpret_cast<float4*>(p.residual + row * p.res_stride) : nullptr;
  // The weights are loaded with the row (not after the reduction): a row of a decode step is one block,
  // whose time is its chain of memory round trips.
  float4 v[kVec], r4[kVec], w4[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kVecThreads;
    v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    r4[j] = v[j];
    w4[j] = v[j];
    if (i < n4) {
      v[j] = x[i];
      if (res) r4[j] = res[i];
      w4[j] = load4_any(p.weight, p.weight_bf16, i);
    }
  }
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kVecThreads;
    if (i < n4) {
      if (res) {
        v[j] = make_float4(r4[j].x + v[j].x, r4[j].y + v[j].y, r4[j].z + v[j].z, r4[j].w + v[j].w);
        res[i] = v[j];
      }
      ss += double(v[j].x) * double(v[j].x);
      ss += double(v[j].y) * double(v[j].y);
      ss += double(v[j].z) * double(v[j].z);
      ss += double(v[j].w) * double(v[j].w);
    }
  }
  ss = block_sum(ss);
  const float r = float(1.0 / sqrt(ss / double(p.cols) + p.eps));
  float4* out = reinterpret_cast<float4*>(p.out + row * p.cols);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kVecThreads;
    if (i < n4) {
      const float4 w = w4[j];
      const float4 o =
          make_float4(w.x * (v[j].x * r), w.y * (v[j].y * r), w.z * (v[j].z * r), w.w * (v[j].w * r));
      out[i] = o;
      if (p.q_codes) {
        // Warp w at step j holds columns [128 (w + 8j), +128): one quantisation group (cols % 128 == 0,
        // so a warp is wholly inside or outside the row). launch_quant_fp8's rule: the same helpers.
        const float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
        const float s = fp8_act_scale(warp_max(m));
        const uchar4 c = make_uchar4(fp8_act_code(o.x, s), fp8_act_code(o.y, s), fp8_act_code(o.z, s),
                                     fp8_act_code(o.w, s));
        reinterpret_cast<uchar4*>(p.q_codes + row * p.cols)[i] = c;
        if ((threadIdx.x & 31) == 0) p.q_scales[(i * 4 / 128) * p.q_rows_pad + row] = s;
      }
    }
  }
}

bool rms_norm_vectorizable(const RmsNormParams& p) {
  return p.cols % 4 == 0 && p.cols <= int64_t(kVecThreads) * kMaxVec * 4 && is_aligned(p.x, 16) &&
         p.x_stride % 4 == 0 && is_aligned(p.out, 16) &&
         (!p.residual || (is_aligned(p.residual, 16) && p.res_stride % 4 == 0)) &&
         is_aligned(p.weight, p.weight_bf16 ? 8 : 16);
}

__global__ void sm90_layer_norm_kernel(LayerNormParams p) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  const float* x = p.x + row * p.x_stride;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) s += double(x[i]);
  const double mean = block_sum(s) / double(p.cols);
  double v = 0.0;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) v = layer_norm_sq_add(v, x[i], mean);
  const double var = block_sum(v) / double(p.cols);
  const double r = 1.0 / sqrt(var + p.eps);
  float* out = p.out + row * p.cols;
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
    out[i] = layer_norm_out(x[i], mean, r, load_any(p.w, p.w_bf16, i), load_any(p.b, p.b_bf16, i));
  }
}

}  // namespace

bool rms_norm_fp8_fusable(const RmsNormParams& p) { return rms_norm_vectorizable(p) && p.cols % 128 == 0; }

cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.q_codes && (!rms_norm_fp8_fusable(p) || p.q_scales == nullptr || p.q_rows_pad < p.rows))
    return cudaErrorInvalidValue;
  if (rms_norm_vectorizable(p)) {
    const int64_t per_thread = (p.cols / 4 + kVecThreads - 1) / kVecThreads;
    const unsigned grid = unsigned(p.q_codes ? p.q_rows_pad : p.rows);
    void (*kernel)(RmsNormParams) = per_thread <= 1   ? sm90_rms_norm_vec_kernel<1>
                                    : per_thread <= 2 ? sm90_rms_norm_vec_kernel<2>
                                    : per_thread <= 4 ? sm90_rms_norm_vec_kernel<4>
                                    : per_thread <= 6 ? sm90_rms_norm_vec_kernel<6>
                                                      : sm90_rms_norm_vec_kernel<kMaxVec>;
    return launch_pdl(p.pdl, kernel, dim3(grid), dim3(kVecThreads), 0, stream, p);
  }
  return launch_pdl(p.pdl, sm90_rms_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_layer_norm(const LayerNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  return launch_pdl(p.pdl, sm90_layer_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, stream, p);
}

}  // namespace dsaserve::kernels::cuda
