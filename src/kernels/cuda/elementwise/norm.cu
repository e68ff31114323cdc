// RMSNorm (+ fused residual add) and LayerNorm: one block per row, fp64 statistics like the CPU reference.
// RMSNorm of rows whose width is a multiple of 4 (<= 8192) and whose views are 16-byte aligned keeps the
// row in registers (float4 loads, up to 8 per thread) between the sum of squares and the scaling, so x
// (and the residual) are read from global memory once; other rows take the scalar two-pass kernel.
// A decode step's few wide rows (<= kRmsNormClusterMaxRows rows of >= kRmsNormClusterMinCols) are each split
// over a cluster of 2-8 CTAs instead (sm90_rms_norm_cluster_kernel): one CTA moving a whole 6,144-wide row
// with its residual (~110 KB in and out) took 7.6 us of a batch-1 step's kernel on an H100, bound by one SM's
// share of the bandwidth.
#include <cooperative_groups.h>

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

// The FP8 copy of the normed float4 `o` at float4 index i4 of `row`, when the calling warp holds one whole
// quantisation group of 128 columns (its 32 lanes, consecutive float4s): launch_quant_fp8's rule, the same
// helpers; lane 0 writes the group's scale.
__device__ __forceinline__ void store_fp8_group_part(const RmsNormParams& p, int64_t row, int64_t i4,
                                                     float4 o) {
  const float m = fmaxf(fmaxf(fabsf(o.x), fabsf(o.y)), fmaxf(fabsf(o.z), fabsf(o.w)));
  const float s = fp8_act_scale(warp_max(m));
  const uchar4 c =
      make_uchar4(fp8_act_code(o.x, s), fp8_act_code(o.y, s), fp8_act_code(o.z, s), fp8_act_code(o.w, s));
  reinterpret_cast<uchar4*>(p.q_codes + row * p.cols)[i4] = c;
  if ((threadIdx.x & 31) == 0) p.q_scales[(i4 * 4 / 128) * p.q_rows_pad + row] = s;
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
      // Warp w at step j holds columns [128 (w + 8j), +128): one quantisation group (cols % 128 == 0, so a
      // warp is wholly inside or outside the row).
      if (p.q_codes) store_fp8_group_part(p, row, i, o);
    }
  }
}

// One row over a cluster of kC CTAs (grid (kC, rows or q_rows_pad), cluster (kC, 1, 1)): CTA `rank` holds
// the row's columns [rank * cols / kC, +cols / kC), one float4 a thread (cols / kC <= 4 * kVecThreads), and
// whole FP8 groups (cols % (128 kC) == 0, so warp w holds the group of columns [128 w, +128) of its part).
// Each CTA sums its squares in fp64 (block_sum), publishes the sum in its shared memory, and after the
// cluster barrier adds the kC sums in rank order through distributed shared memory (every CTA the same
// order, so they all scale by the same r); a second barrier keeps each CTA's shared memory alive until the
// others have read it. The outputs are the one-CTA kernel's up to the order of the fp64 sum.
template <int kC>
__global__ void __cluster_dims__(kC, 1, 1) __launch_bounds__(kVecThreads)
    sm90_rms_norm_cluster_kernel(RmsNormParams p) {
  __shared__ double s_part;
  pdl_enter();
  const int64_t row = blockIdx.y;
  const int rank = int(blockIdx.x);
  const int64_t part = p.cols / kC, n4 = part / 4, c4 = int64_t(rank) * n4;  // float4 offset of the part
  const int64_t i = threadIdx.x;
  const bool mine = i < n4;
  if (row >= p.rows) {  // a padding row's cluster (all of it): codes 0, scale 1
    if (mine) reinterpret_cast<uchar4*>(p.q_codes + row * p.cols)[c4 + i] = make_uchar4(0, 0, 0, 0);
    if (threadIdx.x < part / 128) p.q_scales[(rank * (part / 128) + threadIdx.x) * p.q_rows_pad + row] = 1.0f;
    return;
  }
  const float4* x = reinterpret_cast<const float4*>(p.x + row * p.x_stride) + c4;
  float4* res = p.residual ? reinterpret_cast<float4*>(p.residual + row * p.res_stride) + c4 : nullptr;
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f), w = v;
  if (mine) {
    v = x[i];
    w = load4_any(p.weight, p.weight_bf16, c4 + i);
    if (res) {
      const float4 r4 = res[i];
      v = make_float4(r4.x + v.x, r4.y + v.y, r4.z + v.z, r4.w + v.w);
      res[i] = v;
    }
  }
  double ss = 0.0;
  if (mine) {
    ss += double(v.x) * double(v.x);
    ss += double(v.y) * double(v.y);
    ss += double(v.z) * double(v.z);
    ss += double(v.w) * double(v.w);
  }
  ss = block_sum(ss);
  if (threadIdx.x == 0) s_part = ss;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // every CTA's part published
  double total = 0.0;
#pragma unroll
  for (int r = 0; r < kC; ++r) total += *cluster.map_shared_rank(&s_part, r);
  cluster.sync();  // every CTA has read every part: shared memory may go
  if (!mine) return;
  const float rr = float(1.0 / sqrt(total / double(p.cols) + p.eps));
  const float4 o = make_float4(w.x * (v.x * rr), w.y * (v.y * rr), w.z * (v.z * rr), w.w * (v.w * rr));
  reinterpret_cast<float4*>(p.out + row * p.cols)[c4 + i] = o;
  // Warp w holds the part's columns [128 w, +128): one quantisation group.
  if (p.q_codes) store_fp8_group_part(p, row, c4 + i, o);
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

int rms_norm_cluster_ctas(int64_t rows, int64_t cols) {
  if (rows < 1 || rows > kRmsNormClusterMaxRows || cols < kRmsNormClusterMinCols) return 1;
  // The most CTAs (8, 4, 2) that keep at least 768 columns each, whole FP8 groups and one float4 a thread.
  for (int c : {8, 4, 2})
    if (cols >= int64_t(c) * 768 && cols % (int64_t(c) * 128) == 0 && cols / c <= int64_t(kVecThreads) * 4)
      return c;
  return 1;
}

cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.q_codes && (!rms_norm_fp8_fusable(p) || p.q_scales == nullptr || p.q_rows_pad < p.rows))
    return cudaErrorInvalidValue;
  if (rms_norm_vectorizable(p) && !p.one_cta_per_row) {
    const int kC = rms_norm_cluster_ctas(p.rows, p.cols);
    const unsigned grid_rows = unsigned(p.q_codes ? p.q_rows_pad : p.rows);
    if (kC == 8)
      return launch_pdl(p.pdl, sm90_rms_norm_cluster_kernel<8>, dim3(8, grid_rows), dim3(kVecThreads), 0,
                        stream, p);
    if (kC == 4)
      return launch_pdl(p.pdl, sm90_rms_norm_cluster_kernel<4>, dim3(4, grid_rows), dim3(kVecThreads), 0,
                        stream, p);
    if (kC == 2)
      return launch_pdl(p.pdl, sm90_rms_norm_cluster_kernel<2>, dim3(2, grid_rows), dim3(kVecThreads), 0,
                        stream, p);
  }
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
