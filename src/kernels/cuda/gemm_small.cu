// Block-scaled FP8 GEMM for few tokens (see gemm_small_params.h).
//
// CTA: 8 warps x 16 weight rows = 128 rows (one scale block of rows when row0 % 128 == 0), a range of
// 128-wide K blocks. Per K block each lane loads 16 bytes of its two rows (g, g + 8) for each 64-byte
// half (two 16-byte loads per row), straight into registers, one block ahead of the math. The
// activations' K block ([Tp, 128] codes) is copied into shared memory (cp.async, 3 stages).
//
// mma.sync m16n8k32 wants lane (g, t) to hold k slots {4t..4t+3} and {16+4t..16+4t+3} of A row g / g+8
// and of B column g. The dot product does not care which physical k sits in which slot as long as A
// and B agree, so lane (g, t) feeds the 8 bytes at physical k [16t, 16t + 8) of a 64-byte half into one
// mma and the next 8 into a second: both operands are then plain 16-byte loads.
#include <cuda_fp8.h>

#include "kernels/cuda/gemm_small_params.h"
#include "kernels/cuda/sm90_mma.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16;  // weight rows per CTA
constexpr int kStages = 3;          // activation K blocks in flight
// Bytes per token row in shared memory: 128 + 64 of padding puts the two token rows a quarter-warp
// reads at different bank halves (16-byte reads without conflicts).
constexpr int kXLd = 192;
constexpr int kTargetCtas = 3 * 132;  // ~3 CTAs per SM on the H200's 132 SMs
constexpr int64_t kMaxCounters = kFp8SmallCounters;

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int NT>
__global__ void __launch_bounds__(kThreads) sm90_fp8_small_gemm_kernel(const Fp8SmallGemmParams p) {
  constexpr int Tp = NT * 8;
  __shared__ __align__(16) uint8_t sx[kStages][Tp * kXLd];
  __shared__ bool s_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t kb_total = p.K / 128;
  const int64_t per = (kb_total + p.splits - 1) / p.splits;
  const int64_t kb0 = int64_t(blockIdx.y) * per;
  const int64_t kb1 = kb0 + per < kb_total ? kb0 + per : kb_total;
  const int64_t nkb = kb1 - kb0;
  const int64_t r_lo = int64_t(blockIdx.x) * kRows + warp * 16 + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < p.N, ok_hi = r_hi < p.N;
  const uint8_t* w_lo = p.w + (ok_lo ? r_lo : 0) * p.K + 16 * t;
  const uint8_t* w_hi = p.w + (ok_hi ? r_hi : 0) * p.K + 16 * t;
  const float* ws_lo = p.w_scale + ((p.row0 + (ok_lo ? r_lo : 0)) / 128) * p.w_scale_ld;
  const float* ws_hi = p.w_scale + ((p.row0 + (ok_hi ? r_hi : 0)) / 128) * p.w_scale_ld;

  auto load_x = [&](int64_t kb, int stage) {  // [Tp, 128] codes: Tp * 8 chunks of 16 bytes
    for (int i = threadIdx.x; i < Tp * 8; i += kThreads) {
      const int row = i >> 3, c = i & 7;
      mma::cp_async16(&sx[stage][row * kXLd + c * 16], p.xq + row * p.K + kb * 128 + c * 16, 16);
    }
  };
  auto load_w = [&](int64_t kb, uint4(&w)[4]) {  // w[0..1]: row lo halves 0, 1; w[2..3]: row hi
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    w[0] = ok_lo ? __ldg(reinterpret_cast<const uint4*>(w_lo + kb * 128)) : z;
    w[1] = ok_lo ? __ldg(reinterpret_cast<const uint4*>(w_lo + kb * 128 + 64)) : z;
    w[2] = ok_hi ? __ldg(reinterpret_cast<const uint4*>(w_hi + kb * 128)) : z;
    w[3] = ok_hi ? __ldg(reinterpret_cast<const uint4*>(w_hi + kb * 128 + 64)) : z;
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load_x(kb0 + s, s);
    mma::cp_async_commit();
  }
  uint4 wc[4], wn[4];
  if (nkb > 0) load_w(kb0, wc);
  for (int64_t i = 0; i < nkb; ++i) {
    mma::cp_async_wait<kStages - 2>();  // this K block's activations have landed (own copies) ...
    __syncthreads();                    // ... everyone's, and the stage refilled below is no longer read
    if (i + kStages - 1 < nkb) load_x(kb0 + i + kStages - 1, int((i + kStages - 1) % kStages));
    mma::cp_async_commit();
    if (i + 1 < nkb) load_w(kb0 + i + 1, wn);
    const uint8_t* xs = sx[i % kStages];
    float blk[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) blk[nt][0] = blk[nt][1] = blk[nt][2] = blk[nt][3] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 alo = wc[h], ahi = wc[2 + h];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 b = *reinterpret_cast<const uint4*>(xs + (nt * 8 + g) * kXLd + h * 64 + 16 * t);
        mma_e4m3(blk[nt], alo.x, ahi.x, alo.y, ahi.y, b.x, b.y);
        mma_e4m3(blk[nt], alo.z, ahi.z, alo.w, ahi.w, b.z, b.w);
      }
    }
    const int64_t kb = kb0 + i;
    const float sl = ok_lo ? ws_lo[kb] : 0.0f, sh = ok_hi ? ws_hi[kb] : 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float x0 = p.x_scale[kb * p.Tp + nt * 8 + 2 * t], x1 = p.x_scale[kb * p.Tp + nt * 8 + 2 * t + 1];
      acc[nt][0] += blk[nt][0] * sl * x0;
      acc[nt][1] += blk[nt][1] * sl * x1;
      acc[nt][2] += blk[nt][2] * sh * x0;
      acc[nt][3] += blk[nt][3] * sh * x1;
    }
    if (i + 1 < nkb) {
#pragma unroll
      for (int j = 0; j < 4; ++j) wc[j] = wn[j];
    }
  }
  mma::cp_async_wait<0>();

  // Lane (g, t) holds rows r_lo / r_hi for tokens nt * 8 + 2t and + 1.
  auto store = [&](float* dst, int64_t stride) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tok0 = nt * 8 + 2 * t, tok1 = tok0 + 1;
      if (ok_lo && tok0 < p.T) dst[tok0 * stride + r_lo] = acc[nt][0];
      if (ok_lo && tok1 < p.T) dst[tok1 * stride + r_lo] = acc[nt][1];
      if (ok_hi && tok0 < p.T) dst[tok0 * stride + r_hi] = acc[nt][2];
      if (ok_hi && tok1 < p.T) dst[tok1 * stride + r_hi] = acc[nt][3];
    }
  };
  if (p.splits == 1) {
    store(p.out, p.out_stride);
    return;
  }
  // Split K: publish this CTA's partial sums; the last CTA of the row slice adds them in split order.
  store(p.partial + int64_t(blockIdx.y) * p.T * p.N, p.N);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(&p.counters[blockIdx.x], 1u) == uint32_t(p.splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int64_t i = threadIdx.x; i < int64_t(kRows) * p.T; i += kThreads) {
    const int64_t tok = i / kRows, r = int64_t(blockIdx.x) * kRows + i % kRows;
    if (r >= p.N) continue;
    float s = 0.0f;
    for (int sp = 0; sp < p.splits; ++sp) s += __ldcg(p.partial + (int64_t(sp) * p.T + tok) * p.N + r);
    p.out[tok * p.out_stride + r] = s;
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0u;  // ready for the next launch on the stream
}

}  // namespace

int fp8_small_gemm_splits(int64_t N, int64_t K) {
  const int64_t ctas = (N + kRows - 1) / kRows, kb = K / 128;
  if (kb <= 1 || ctas >= kTargetCtas || ctas > kMaxCounters) return 1;
  int64_t s = (kTargetCtas + ctas - 1) / ctas;
  if (s > kb) s = kb;
  const int64_t per = (kb + s - 1) / s;
  return int((kb + per - 1) / per);  // every split gets at least one K block
}

cudaError_t launch_fp8_small_gemm(const Fp8SmallGemmParams& p, cudaStream_t stream) {
  if (p.T == 0 || p.N == 0) return cudaSuccess;
  if (p.K <= 0 || p.K % 128 != 0 || p.T > p.Tp || (p.Tp != 8 && p.Tp != 16 && p.Tp != 32) || p.splits < 1 ||
      (p.splits > 1 && (p.partial == nullptr || p.counters == nullptr)))
    return cudaErrorInvalidValue;
  const int64_t ctas = (p.N + kRows - 1) / kRows;
  if (p.splits > 1 && ctas > kMaxCounters) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(ctas), unsigned(p.splits));
  switch (p.Tp) {
    case 8: sm90_fp8_small_gemm_kernel<1><<<grid, kThreads, 0, stream>>>(p); break;
    case 16: sm90_fp8_small_gemm_kernel<2><<<grid, kThreads, 0, stream>>>(p); break;
    default: sm90_fp8_small_gemm_kernel<4><<<grid, kThreads, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
