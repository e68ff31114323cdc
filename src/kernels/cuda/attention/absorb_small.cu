// The absorbed projections for few tokens (absorb_params.h AbsorbSmallParams): one launch over every head,
// each CTA streaming one head's slice of the bf16 weight once with 16-byte loads, the head's f32
// activations staged in shared memory for all T tokens. At a decode step a CTA's time is its chain of
// memory round trips, so each thread issues all (or most) of its weight loads before using any.
//
// Rows form (absorb_q, W_h [K, N]): a CTA owns 64 outputs n of one head. Thread (g = tid / 8, c = tid % 8)
// holds outputs 8c .. 8c + 7 and walks rows k = g, g + 32, ... (8 threads read 128 contiguous bytes of a
// row); the 32 row groups' sums are added in the warp (lanes c, c + 8, c + 16, c + 24: a butterfly), then
// over the 8 warps in warp order through shared memory.
// Cols form (absorb_v, W_h [N, K]): a CTA owns 32 outputs n of one head, 4 per warp; lane l loads k = 8l ..
// 8l + 7 of every 256 of its 4 rows (16 bytes each, all before the arithmetic), sums them in k order per
// token, then the warp adds its lanes (a butterfly, the same order every time).
#include <cuda_bf16.h>

#include "kernels/cuda/attention/absorb_params.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsCols = 64;                              // rows form: outputs per CTA (8 threads x 8)
constexpr int kRowGroups = kThreads / 8;                   // rows form: rows walked side by side
constexpr int kColsRows = 32;                              // cols form: outputs per CTA (4 per warp)
constexpr int kColsPerWarp = kColsRows / kWarps;           // cols form: rows a warp loads before summing any
constexpr int kKChunks = int(kAbsorbSmallColsMaxK / 256);  // cols form: 16-byte loads per lane and row

__device__ __forceinline__ void bf16x8(const uint4 u, float (&w)[8]) {
  w[0] = bf16_lo(u.x);
  w[1] = bf16_hi(u.x);
  w[2] = bf16_lo(u.y);
  w[3] = bf16_hi(u.y);
  w[4] = bf16_lo(u.z);
  w[5] = bf16_hi(u.z);
  w[6] = bf16_lo(u.w);
  w[7] = bf16_hi(u.w);
}

// The head's activations [T, K] into shared memory (rows >= T are zero).
template <int kT>
__device__ __forceinline__ void stage_x(const AbsorbSmallParams& p, int64_t h, float* xs) {
  for (int64_t i = threadIdx.x; i < kT * p.K; i += kThreads) {
    const int64_t t = i / p.K, k = i - t * p.K;
    xs[i] = t < p.T ? p.x[t * p.x_ts + h * p.x_hs + k] : 0.0f;
  }
}

template <int kT>
__global__ void __launch_bounds__(kThreads) sm90_absorb_rows_kernel(const AbsorbSmallParams p) {
  extern __shared__ float xs[];  // [kT, K]
  __shared__ float red[kWarps][kT][kRowsCols];
  const int64_t h = blockIdx.y, n0 = int64_t(blockIdx.x) * kRowsCols;
  const int tid = threadIdx.x, g = tid >> 3, c = tid & 7, warp = tid >> 5, lane = tid & 31;
  const int64_t n = n0 + 8 * c;
  const bool ok = n < p.N;  // N % 8 == 0: a thread's 8 outputs are all in or all out
  const uint16_t* w = p.w + h * p.w_bs + (ok ? n : 0);
  pdl_enter();
  // The thread's first kPre rows are loaded before the activations are staged (the two round trips
  // overlap); the rest as the loop reaches them. Rows in k order either way.
  constexpr int kPre = kT <= 2 ? 8 : 4;
  uint4 pre[kPre];
#pragma unroll
  for (int i = 0; i < kPre; ++i) {
    const int64_t k = g + int64_t(i) * kRowGroups;
    pre[i] = make_uint4(0u, 0u, 0u, 0u);
    if (ok && k < p.K) pre[i] = __ldg(reinterpret_cast<const uint4*>(w + k * p.w_ld));
  }
  stage_x<kT>(p, h, xs);
  __syncthreads();
  float acc[kT][8];
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[t][j] = 0.0f;
  auto add_row = [&](int64_t k, const uint4 u) {
    float wf[8];
    bf16x8(u, wf);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float xv = xs[t * p.K + k];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[t][j] = fmaf(xv, wf[j], acc[t][j]);
    }
  };
  if (ok) {
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      const int64_t k = g + int64_t(i) * kRowGroups;
      if (k < p.K) add_row(k, pre[i]);
    }
#pragma unroll 4
    for (int64_t k = g + int64_t(kPre) * kRowGroups; k < p.K; k += kRowGroups)
      add_row(k, __ldg(reinterpret_cast<const uint4*>(w + k * p.w_ld)));
  }
  // The warp's 4 row groups (lanes c, c + 8, c + 16, c + 24), then the warps in order.
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[t][j] += __shfl_xor_sync(0xffffffffu, acc[t][j], 8);
      acc[t][j] += __shfl_xor_sync(0xffffffffu, acc[t][j], 16);
    }
  if (lane < 8) {
#pragma unroll
    for (int t = 0; t < kT; ++t)
#pragma unroll
      for (int j = 0; j < 8; ++j) red[warp][t][8 * c + j] = acc[t][j];
  }
  __syncthreads();
  for (int i = tid; i < kT * kRowsCols; i += kThreads) {
    const int t = i / kRowsCols, col = i % kRowsCols;
    if (t >= p.T || n0 + col >= p.N) continue;
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) s += red[wi][t][col];
    p.out[t * p.out_ts + h * p.out_hs + n0 + col] = s;
  }
}

template <int kT>
__global__ void __launch_bounds__(kThreads) sm90_absorb_cols_kernel(const AbsorbSmallParams p) {
  extern __shared__ float xs[];  // [kT, K]
  const int64_t h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n_first = int64_t(blockIdx.x) * kColsRows + warp * kColsPerWarp;
  pdl_enter();
  // The warp's rows, loaded before anything waits on them (after pdl_enter: an FP8 kv_b without a derived
  // bf16 copy is dequantised by the kernel just before).
  uint4 wv[kColsPerWarp][kKChunks];
#pragma unroll
  for (int r = 0; r < kColsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < kKChunks; ++m) {
      const int64_t n = n_first + r, k = 8 * lane + 256 * m;
      wv[r][m] = make_uint4(0u, 0u, 0u, 0u);
      if (n < p.N && k < p.K)
        wv[r][m] = __ldg(reinterpret_cast<const uint4*>(p.w + h * p.w_bs + n * p.w_ld + k));
    }
  stage_x<kT>(p, h, xs);
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kColsPerWarp; ++r) {
    const int64_t n = n_first + r;
    float acc[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[t] = 0.0f;
#pragma unroll
    for (int m = 0; m < kKChunks; ++m) {
      const int64_t k = 8 * lane + 256 * m;
      if (k >= p.K) break;
      float wf[8];
      bf16x8(wv[r][m], wf);
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(xs + t * p.K + k);
        const float4 b = *reinterpret_cast<const float4*>(xs + t * p.K + k + 4);
        float s = acc[t];
        s = fmaf(a.x, wf[0], s);
        s = fmaf(a.y, wf[1], s);
        s = fmaf(a.z, wf[2], s);
        s = fmaf(a.w, wf[3], s);
        s = fmaf(b.x, wf[4], s);
        s = fmaf(b.y, wf[5], s);
        s = fmaf(b.z, wf[6], s);
        s = fmaf(b.w, wf[7], s);
        acc[t] = s;
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const float s = warp_sum(acc[t]);
      if (lane == 0 && t < p.T && n < p.N) p.out[t * p.out_ts + h * p.out_hs + n] = s;
    }
  }
}

template <int kT>
cudaError_t launch_t(const AbsorbSmallParams& p, cudaStream_t stream) {
  const size_t smem = size_t(kT) * size_t(p.K) * sizeof(float);  // the staged activations
  auto* kernel = p.rows_form ? sm90_absorb_rows_kernel<kT> : sm90_absorb_cols_kernel<kT>;
  // One limit per kernel, the largest K it takes (set_max_dynamic_smem caches by size: a varying size
  // could leave a smaller limit in place after a larger one).
  const int limit =
      int(size_t(kT) * size_t(p.rows_form ? kAbsorbSmallMaxK : kAbsorbSmallColsMaxK) * sizeof(float));
  const cudaError_t attr = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), limit);
  if (attr != cudaSuccess) return attr;
  const int64_t per_cta = p.rows_form ? kRowsCols : kColsRows;
  const dim3 grid(unsigned((p.N + per_cta - 1) / per_cta), unsigned(p.heads));
  return launch_pdl(p.pdl, kernel, grid, dim3(kThreads), smem, stream, p);
}

}  // namespace

bool absorb_small_supported(const AbsorbSmallParams& p) {
  return !(p.T < 1 || p.T > kAbsorbSmallMaxTokens || p.heads < 1 || p.heads > 65535 || p.K < 1 ||
           p.K > (p.rows_form ? kAbsorbSmallMaxK : kAbsorbSmallColsMaxK) || p.N < 1 || p.w == nullptr ||
           p.x == nullptr || p.out == nullptr || !is_aligned(p.w, 16) || p.w_ld % 8 != 0 || p.w_bs % 8 != 0 ||
           (p.rows_form ? p.N : p.K) % 8 != 0);
}

cudaError_t launch_absorb_small(const AbsorbSmallParams& p, cudaStream_t stream) {
  if (!absorb_small_supported(p)) return cudaErrorInvalidValue;
  if (p.T == 1) return launch_t<1>(p, stream);
  if (p.T == 2) return launch_t<2>(p, stream);
  if (p.T <= 4) return launch_t<4>(p, stream);
  return launch_t<8>(p, stream);
}

}  // namespace dsaserve::kernels::cuda
