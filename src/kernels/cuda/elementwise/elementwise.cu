// Row-wise kernels: embedding, SiLU-and-mul, row copies / adds / casts / gathers / scatters, argmax.
// 2-D grids: blockIdx.y walks rows (wrapping for more than 65535), x-blocks and threads walk columns.
// Each kernel has a 16-byte vectorized form (float4, or 8 bf16 for the bf16 embedding) taken when the row
// width is a multiple of the vector width and every pointer and row stride is 16-byte aligned; otherwise
// the scalar form runs. Both compute each element with the same expression (bit-identical results).
#include <cuda_bf16.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/elementwise/elementwise_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

dim3 rows_grid(int64_t rows, int64_t cols) {
  const int64_t bx = (cols + kThreads - 1) / kThreads;
  return dim3(unsigned(bx < 1 ? 1 : bx), unsigned(rows < kMaxGridY ? rows : kMaxGridY));
}

constexpr int kVecPer = 2;  // vectors per thread per row in the vectorized row kernels

dim3 vec_grid(int64_t rows, int64_t vecs) {
  const int64_t per_block = int64_t(kThreads) * kVecPer;
  const int64_t bx = (vecs + per_block - 1) / per_block;
  return dim3(unsigned(bx < 1 ? 1 : bx), unsigned(rows < kMaxGridY ? rows : kMaxGridY));
}

// Rows kernel on f32 data in float4 units (cols % 4 == 0, aligned pointers and strides).
__global__ void sm90_rows_f32x4_kernel(RowsParams p) {
  pdl_enter();
  const int64_t n4 = p.cols / 4;
  const int64_t c0 = blockIdx.x * int64_t(kThreads * kVecPer) + threadIdx.x;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    int64_t sr = p.src_rows ? int64_t(p.src_rows[r]) : r;
    if (p.page_table) sr = int64_t(p.page_table[sr / p.page_size]) * p.page_size + sr % p.page_size;
    const int64_t dr = p.dst_rows ? int64_t(p.dst_rows[r]) : r;
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.src) + sr * p.src_stride);
    float4* dst = reinterpret_cast<float4*>(static_cast<float*>(p.dst) + dr * p.dst_stride);
    float4 v[kVecPer], d[kVecPer];
#pragma unroll
    for (int j = 0; j < kVecPer; ++j) {
      const int64_t c = c0 + int64_t(j) * kThreads;
      v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      d[j] = v[j];
      if (c < n4) {
        v[j] = src[c];
        if (p.op == RowOp::add) d[j] = dst[c];
      }
    }
#pragma unroll
    for (int j = 0; j < kVecPer; ++j) {
      const int64_t c = c0 + int64_t(j) * kThreads;
      if (c < n4) {
        if (p.op == RowOp::add) {
          dst[c] = make_float4(d[j].x + v[j].x, d[j].y + v[j].y, d[j].z + v[j].z, d[j].w + v[j].w);
        } else {
          dst[c] = v[j];
        }
      }
    }
  }
}

bool rows_vectorizable(const RowsParams& p) {
  return !p.src_bf16 && !p.dst_bf16 && p.cols % 4 == 0 && is_aligned(p.src, 16) && is_aligned(p.dst, 16) &&
         p.src_stride % 4 == 0 && p.dst_stride % 4 == 0;
}

// bf16 table -> f32 rows, 8 columns (one 16-byte load, two float4 stores) per thread.
__global__ void sm90_embedding_bf16x8_kernel(EmbeddingParams p) {
  pdl_enter();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols / 8) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const uint4 u = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.table) +
                                                   int64_t(p.ids[r]) * p.cols)[c];
    float4* o = reinterpret_cast<float4*>(p.out + r * p.cols) + 2 * c;
    o[0] = make_float4(bf16_lo(u.x), bf16_hi(u.x), bf16_lo(u.y), bf16_hi(u.y));
    o[1] = make_float4(bf16_lo(u.z), bf16_hi(u.z), bf16_lo(u.w), bf16_hi(u.w));
  }
}

__global__ void sm90_silu_mul_x4_kernel(SiluMulParams p) {
  pdl_enter();
  const int64_t n4 = p.cols / 4;
  const int64_t c0 = blockIdx.x * int64_t(kThreads * kVecPer) + threadIdx.x;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float4* gate = reinterpret_cast<const float4*>(p.gate + r * p.gate_stride);
    const float4* up = reinterpret_cast<const float4*>(p.up + r * p.up_stride);
    float4* out = reinterpret_cast<float4*>(p.out + r * p.out_stride);
    float4 g[kVecPer], u[kVecPer];
#pragma unroll
    for (int j = 0; j < kVecPer; ++j) {
      const int64_t c = c0 + int64_t(j) * kThreads;
      g[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      u[j] = g[j];
      if (c < n4) {
        g[j] = gate[c];
        u[j] = up[c];
      }
    }
#pragma unroll
    for (int j = 0; j < kVecPer; ++j) {
      const int64_t c = c0 + int64_t(j) * kThreads;
      if (c < n4) {
        out[c] = make_float4(silu_times(g[j].x, u[j].x), silu_times(g[j].y, u[j].y),
                             silu_times(g[j].z, u[j].z), silu_times(g[j].w, u[j].w));
      }
    }
  }
}

// Argmax in float4 units (cols % 4 == 0, aligned row starts): each thread keeps the best of its elements
// (four loads in flight per step); the (value, index) order is total, so the winner does not depend on
// the visiting order: the first maximum, NaN never wins, like the scalar kernel.
constexpr int kArgmaxThreads = 512;
constexpr int kArgmaxUnroll = 4;
__global__ void __launch_bounds__(kArgmaxThreads) sm90_argmax_x4_kernel(ArgmaxParams p) {
  pdl_enter();
  const int64_t r = blockIdx.x;
  const float4* x = reinterpret_cast<const float4*>(p.x + r * p.x_stride);
  const int64_t n4 = p.cols / 4;
  ValIdx best{-__int_as_float(0x7f800000), 0x7fffffff};
  for (int64_t base = threadIdx.x; base < n4; base += int64_t(kArgmaxThreads) * kArgmaxUnroll) {
    float4 v[kArgmaxUnroll];
#pragma unroll
    for (int j = 0; j < kArgmaxUnroll; ++j) {
      const int64_t i = base + int64_t(j) * kArgmaxThreads;
      v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i < n4) v[j] = x[i];
    }
#pragma unroll
    for (int j = 0; j < kArgmaxUnroll; ++j) {
      const int64_t i = base + int64_t(j) * kArgmaxThreads;
      if (i < n4) {
        const int32_t e = int32_t(4 * i);
        const ValIdx c0{v[j].x, e}, c1{v[j].y, e + 1}, c2{v[j].z, e + 2}, c3{v[j].w, e + 3};
        if (better(c0, best)) best = c0;
        if (better(c1, best)) best = c1;
        if (better(c2, best)) best = c2;
        if (better(c3, best)) best = c3;
      }
    }
  }
  best = block_argmax(best);
  if (threadIdx.x == 0) p.out[r] = best.i == 0x7fffffff ? 0 : best.i;
}

__global__ void sm90_embedding_kernel(EmbeddingParams p) {
  pdl_enter();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    p.out[r * p.cols + c] = load_any(p.table, p.table_bf16, int64_t(p.ids[r]) * p.cols + c);
  }
}

__global__ void sm90_silu_mul_kernel(SiluMulParams p) {
  pdl_enter();
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= p.cols) return;
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const float g = p.gate[r * p.gate_stride + c];
    p.out[r * p.out_stride + c] = silu_times(g, p.up[r * p.up_stride + c]);
  }
}

__global__ void sm90_rows_kernel(RowsParams p) {
  pdl_enter();
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
  pdl_enter();
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
  if (p.table_bf16 && p.cols % 8 == 0 && is_aligned(p.table, 16) && is_aligned(p.out, 16)) {
    return launch_pdl(p.pdl, sm90_embedding_bf16x8_kernel, rows_grid(p.rows, p.cols / 8), dim3(kThreads), 0,
                      stream, p);
  }
  if (!p.table_bf16) {
    // An f32 table is a row gather: src row t = ids[t].
    RowsParams g{};
    g.src = p.table;
    g.dst = p.out;
    g.rows = p.rows;
    g.cols = p.cols;
    g.src_stride = p.cols;
    g.dst_stride = p.cols;
    g.op = RowOp::copy;
    g.src_rows = p.ids;
    g.page_size = 1;
    g.pdl = p.pdl;
    if (rows_vectorizable(g)) {
      return launch_pdl(g.pdl, sm90_rows_f32x4_kernel, vec_grid(g.rows, g.cols / 4), dim3(kThreads), 0,
                        stream, g);
    }
  }
  return launch_pdl(p.pdl, sm90_embedding_kernel, rows_grid(p.rows, p.cols), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (p.cols % 4 == 0 && is_aligned(p.gate, 16) && is_aligned(p.up, 16) && is_aligned(p.out, 16) &&
      p.gate_stride % 4 == 0 && p.up_stride % 4 == 0 && p.out_stride % 4 == 0) {
    return launch_pdl(p.pdl, sm90_silu_mul_x4_kernel, vec_grid(p.rows, p.cols / 4), dim3(kThreads), 0, stream,
                      p);
  }
  return launch_pdl(p.pdl, sm90_silu_mul_kernel, rows_grid(p.rows, p.cols), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_rows(const RowsParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (rows_vectorizable(p)) {
    return launch_pdl(p.pdl, sm90_rows_f32x4_kernel, vec_grid(p.rows, p.cols / 4), dim3(kThreads), 0, stream,
                      p);
  }
  return launch_pdl(p.pdl, sm90_rows_kernel, rows_grid(p.rows, p.cols), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_argmax(const ArgmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.cols % 4 == 0 && p.x_stride % 4 == 0 && is_aligned(p.x, 16)) {
    return launch_pdl(p.pdl, sm90_argmax_x4_kernel, dim3(unsigned(p.rows)), dim3(kArgmaxThreads), 0, stream,
                      p);
  }
  return launch_pdl(p.pdl, sm90_argmax_kernel, dim3(unsigned(p.rows)), dim3(1024), 0, stream, p);
}

}  // namespace dsaserve::kernels::cuda
