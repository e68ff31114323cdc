// Row-wise kernels: embedding, SiLU-and-mul, row copies / adds / casts / gathers / scatters, argmax.
// 2-D grids: blockIdx.y walks rows (wrapping for more than 65535), x-blocks and threads walk columns.
#include <cuda_bf16.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

dim3 rows_grid(int64_t rows, int64_t cols) {
  const int64_t bx = (cols + kThreads - 1) / kThreads;
  return dim3(unsigned(bx < 1 ? 1 : bx), unsigned(rows < kMaxGridY ? rows : kMaxGridY));
}

__global__ void sm90_embedding_kernel(EmbeddingParams p) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    p.out[r * p.cols + c] = load_any(p.table, p.table_bf16, int64_t(p.ids[r]) * p.cols + c);
  }
}

__global__ void sm90_silu_mul_kernel(SiluMulParams p) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float g = p.gate[r * p.gate_stride + c];
    p.out[r * p.out_stride + c] = g / (1.0f + expf(-g)) * p.up[r * p.up_stride + c];
  }
}

__global__ void sm90_rows_kernel(RowsParams p) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    int64_t sr = p.src_rows ? int64_t(p.src_rows[r]) : r;
    if (p.page_table) sr = int64_t(p.page_table[sr / p.page_size]) * p.page_size + sr % p.page_size;
    const int64_t dr = p.dst_rows ? int64_t(p.dst_rows[r]) : r;
    const float v = load_any(p.src, p.src_bf16, sr * p.src_stride + c);
    const int64_t di = dr * p.dst_stride + c;
    if (p.dst_bf16) {
      static_cast<__nv_bfloat16*>(p.dst)[di] = __float2bfloat16_rn(v);
    } else if (p.op == RowOp::add) {
      static_cast<float*>(p.dst)[di] += v;
    } else {
      static_cast<float*>(p.dst)[di] = v;
    }
  }
}

__global__ void sm90_argmax_kernel(ArgmaxParams p) {
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  ValIdx best{-__int_as_float(0x7f800000), 0x7fffffff};
  for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
    const ValIdx c{x[i], int32_t(i)};
    if (better(c, best)) best = c;
  }
  best = block_argmax(best);
  if (threadIdx.x == 0) p.out[r] = best.i == 0x7fffffff ? 0 : best.i;
}

}  // namespace

cudaError_t launch_embedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  sm90_embedding_kernel<<<rows_grid(p.rows, p.cols), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  sm90_silu_mul_kernel<<<rows_grid(p.rows, p.cols), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_rows(const RowsParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  sm90_rows_kernel<<<rows_grid(p.rows, p.cols), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  sm90_argmax_kernel<<<unsigned(p.rows), 1024, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
