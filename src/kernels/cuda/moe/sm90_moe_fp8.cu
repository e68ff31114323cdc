// Grouped FP8 expert GEMMs on tensor cores (see moe_params.h MoeFp8GemmParams).
//
// Work item: 128 weight rows of one active expert (gate_up: rows 0-63 are gate features n0 .. n0 + 63,
// rows 64-127 the same features of up; down: features n0 .. n0 + 127), for a CTA of 8 warps. Per pass of up
// to Tp packed rows of that expert, each 128-wide K block's weight tile [128 rows, 128 B], the pass's
// activation codes [Tp, 128] (gathered through in_rows) and their scales [Tp] are copied into shared memory
// with cp.async, kStages - 1 blocks ahead; every warp feeds its 16 weight rows x Tp rows to mma.sync m16n8k32
// and folds the block's sums with the weight scales (per CTA and K block) x the row scales.
//
// Warp w's 16 A rows: gate_up: gate feature n0 + 8w + g (A row g) and up feature n0 + 8w + g (A row
// g + 8), so that lane (g, t) ends holding gate and up of one feature for the same rows and applies the
// SiLU-mul in registers; down: features n0 + 16w + g and + 8. The fragment layout is gemm_small.cu's:
// lane (g, t) feeds the 8 bytes at physical k [16t, 16t + 8) of a 64-byte half to one mma and the next 8
// to a second (A and B agree on which k sits in which slot), weight chunks XOR-swizzled by row parity.
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/sm90_mma.cuh"
#include "kernels/cuda/moe/moe_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 128;  // weight rows per CTA
constexpr int kMaxKb = int(kMoeFp8MaxK / 128);
// Bytes per row of the activation tile: 128 + 64 of padding puts the two rows a quarter-warp reads in
// different bank halves.
constexpr int kXLd = 192;

template <int NT>
struct Tile {
  static constexpr int kTp = NT * 8;
  static constexpr int kStages = NT >= 8 ? 3 : 4;  // two CTAs per SM either way
  static constexpr int kW = kRows * 128;
  static constexpr int kX = kTp * kXLd;
  static constexpr int kBytes = kW + kX + kTp * 4;
  static constexpr size_t kSmem = size_t(kStages) * kBytes;
};

using mma::mma_e4m3;

template <bool GATE_UP, int NT>
__global__ void __launch_bounds__(kThreads, 2) sm90_moe_fp8_gemm_kernel(const MoeFp8GemmParams p) {
  using S = Tile<NT>;
  constexpr int Tp = S::kTp, kStages = S::kStages;
  constexpr int kFeat = GATE_UP ? 64 : 128;  // output features per CTA
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float s_wscale[2][kMaxKb];  // weight scales of this CTA's rows (lo: gate / down, hi: up)
  __shared__ int64_t s_src[64];          // source row in xq of the pass's rows (-1: none)
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3;
  const int64_t K = p.K, N = p.N, nkb = K / 128;
  const int64_t tiles = (N + kFeat - 1) / kFeat;
  const int64_t items = int64_t(p.header[0]) * tiles;
  const int r_lo = GATE_UP ? warp * 8 + g : warp * 16 + g;  // A rows g and g + 8 in the tile
  const int r_hi = GATE_UP ? 64 + warp * 8 + g : r_lo + 8;
  // Persistent: work item = (active slot, feature tile), consecutive items on one expert.
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int e = p.active[item / tiles];
    const int64_t n0 = (item % tiles) * kFeat;
    const int32_t m0 = p.offsets[e], m1 = p.offsets[e + 1];
    const MoeExpertWeights ew = p.table[e];
    const uint8_t* w_lo = static_cast<const uint8_t*>(GATE_UP ? ew.gate : ew.down);
    const uint8_t* w_hi = static_cast<const uint8_t*>(GATE_UP ? ew.up : ew.down);
    {
      // The previous item's last pass ended with a barrier: nobody reads the old scales any more.
      const float* sc_lo = (GATE_UP ? ew.gate_scale : ew.down_scale) + (n0 / 128) * nkb;
      const float* sc_hi = (GATE_UP ? ew.up_scale : ew.down_scale) + (n0 / 128) * nkb;
      for (int64_t i = threadIdx.x; i < nkb; i += kThreads) {
        s_wscale[0][i] = sc_lo[i];
        s_wscale[1][i] = sc_hi[i];
      }
    }
    // Tile row r's weight row (features past N read row 0 of the matrix, zero-filled).
    auto weight_row = [&](int r, bool& ok) -> const uint8_t* {
      const bool hi = GATE_UP && r >= 64;
      const int64_t f = n0 + (GATE_UP ? (r & 63) : r);
      ok = f < N;
      return (hi ? w_hi : w_lo) + (ok ? f : 0) * K;
    };
    auto load = [&](int64_t kb, int stage) {
      uint8_t* st = smem + size_t(stage) * S::kBytes;
      for (int i = threadIdx.x; i < kRows * 8; i += kThreads) {
        const int r = i >> 3, c = i & 7;
        bool ok = false;
        const uint8_t* src = weight_row(r, ok) + kb * 128 + c * 16;
        mma::cp_async16(st + r * 128 + ((c ^ ((r & 1) << 2)) * 16), src, ok ? 16 : 0);
      }
      for (int i = threadIdx.x; i < Tp * 8; i += kThreads) {
        const int r = i >> 3, c = i & 7;
        const int64_t row = s_src[r];
        const uint8_t* src = p.xq + (row >= 0 ? row : 0) * K + kb * 128 + c * 16;
        mma::cp_async16(st + S::kW + r * kXLd + c * 16, src, row >= 0 ? 16 : 0);
      }
      for (int i = threadIdx.x; i < Tp; i += kThreads) {
        const int64_t row = s_src[i];
        mma::cp_async4(st + S::kW + S::kX + i * 4, p.x_scale + kb * p.x_scale_ld + (row >= 0 ? row : 0),
                       row >= 0 ? 4 : 0);
      }
    };

    for (int32_t g0 = m0; g0 < m1; g0 += Tp) {
      const int nr = m1 - g0 < Tp ? int(m1 - g0) : Tp;
      if (threadIdx.x < Tp) {
        const int r = int(threadIdx.x);
        s_src[r] = r < nr ? (p.in_rows ? int64_t(p.in_rows[g0 + r]) : int64_t(g0 + r)) : int64_t(-1);
      }
      __syncthreads();  // s_src (and, the first time, s_wscale) visible to every thread
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < nkb) load(s, s);
        mma::cp_async_commit();
      }
      for (int64_t i = 0; i < nkb; ++i) {
        mma::cp_async_wait<kStages - 2>();  // this K block has landed (own copies) ...
        __syncthreads();                    // ... everyone's, and the stage refilled below is no longer read
        if (i + kStages - 1 < nkb) load(i + kStages - 1, int((i + kStages - 1) % kStages));
        mma::cp_async_commit();
        const uint8_t* st = smem + size_t(i % kStages) * S::kBytes;
        const float* xs = reinterpret_cast<const float*>(st + S::kW + S::kX);
        float blk[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) blk[nt][0] = blk[nt][1] = blk[nt][2] = blk[nt][3] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = h * 4 + t;  // this lane's 16-byte chunk of the half
          const uint4 alo = *reinterpret_cast<const uint4*>(st + r_lo * 128 + ((c ^ ((r_lo & 1) << 2)) * 16));
          const uint4 ahi = *reinterpret_cast<const uint4*>(st + r_hi * 128 + ((c ^ ((r_hi & 1) << 2)) * 16));
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint4 b = *reinterpret_cast<const uint4*>(st + S::kW + (nt * 8 + g) * kXLd + c * 16);
            mma_e4m3(blk[nt], alo.x, ahi.x, alo.y, ahi.y, b.x, b.y);
            mma_e4m3(blk[nt], alo.z, ahi.z, alo.w, ahi.w, b.z, b.w);
          }
        }
        const float sw_lo = s_wscale[0][i], sw_hi = s_wscale[1][i];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float x0 = xs[nt * 8 + 2 * t], x1 = xs[nt * 8 + 2 * t + 1];
          acc[nt][0] += blk[nt][0] * (sw_lo * x0);
          acc[nt][1] += blk[nt][1] * (sw_lo * x1);
          acc[nt][2] += blk[nt][2] * (sw_hi * x0);
          acc[nt][3] += blk[nt][3] * (sw_hi * x1);
        }
      }
      mma::cp_async_wait<0>();
      // Lane (g, t) holds A rows g (acc 0, 1) and g + 8 (acc 2, 3) for the pass's rows nt * 8 + 2t and + 1.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int r = nt * 8 + 2 * t + j;
          if (r >= nr) continue;
          float* o = p.out + int64_t(g0 + r) * N;
          if (GATE_UP) {
            const int64_t f = n0 + warp * 8 + g;
            const float gv = acc[nt][j], uv = acc[nt][2 + j];
            if (f < N) o[f] = gv / (1.0f + expf(-gv)) * uv;
          } else {
            const int64_t f_lo = n0 + r_lo, f_hi = n0 + r_hi;
            if (f_lo < N) o[f_lo] = acc[nt][j];
            if (f_hi < N) o[f_hi] = acc[nt][2 + j];
          }
        }
      }
      __syncthreads();  // every load of this pass landed and read before s_src and the stages are reused
    }
  }
}

template <bool GATE_UP, int NT>
cudaError_t launch_tile(const MoeFp8GemmParams& p, cudaStream_t stream) {
  constexpr int kFeat = GATE_UP ? 64 : 128;
  const void* fn = reinterpret_cast<const void*>(sm90_moe_fp8_gemm_kernel<GATE_UP, NT>);
  const cudaError_t attr = set_max_dynamic_smem(fn, int(Tile<NT>::kSmem));
  if (attr != cudaSuccess) return attr;
  // As many CTAs as fit on the device at once (computed once per instantiation and device), at most one
  // per work item of every expert active.
  const int resident = per_device_value(
      fn, +[]() -> int {
        int dev = 0, sms = 0, per = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, sm90_moe_fp8_gemm_kernel<GATE_UP, NT>, kThreads,
                                                      Tile<NT>::kSmem);
        return (sms > 0 ? sms : 1) * (per > 0 ? per : 1);
      });
  const int64_t most = int64_t(p.experts) * ((p.N + kFeat - 1) / kFeat);
  const int grid = int(most < resident ? most : resident);
  sm90_moe_fp8_gemm_kernel<GATE_UP, NT><<<grid, kThreads, Tile<NT>::kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <bool GATE_UP>
cudaError_t launch_rows(const MoeFp8GemmParams& p, cudaStream_t stream) {
  switch (p.tile_rows) {
    case 8: return launch_tile<GATE_UP, 1>(p, stream);
    case 16: return launch_tile<GATE_UP, 2>(p, stream);
    case 32: return launch_tile<GATE_UP, 4>(p, stream);
    case 64: return launch_tile<GATE_UP, 8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int moe_fp8_tile_rows(int64_t pairs, int64_t experts) {
  const int64_t mean = experts > 0 ? (pairs + experts - 1) / experts : pairs;
  int tp = 8;
  while (tp < 64 && tp < 4 * mean) tp *= 2;
  return tp;
}

cudaError_t launch_moe_fp8_gemm(const MoeFp8GemmParams& p, cudaStream_t stream) {
  if (p.N == 0 || p.experts == 0) return cudaSuccess;
  if (p.K <= 0 || p.K % 128 != 0 || p.K > kMoeFp8MaxK || p.experts > 65535 || p.x_scale_ld <= 0)
    return cudaErrorInvalidValue;
  return p.gate_up ? launch_rows<true>(p, stream) : launch_rows<false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda
