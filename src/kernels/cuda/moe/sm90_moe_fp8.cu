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

// The cp.async pipeline both forms run over the K blocks: the first kStages - 1 blocks in flight (one commit
// group each, empty past nkb), then per block i: wait for it (own copies), make it visible (the wgmma form:
// also to the async proxy), a barrier (everyone's copies landed; the stage block i - 1 held is no longer
// read), and block i + kStages - 1 issued into that stage.
template <int kStages, class Load>
__device__ __forceinline__ void pipeline_start(int64_t nkb, const Load& load) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load(s, s);
    mma::cp_async_commit();
  }
}
template <int kStages, bool ASYNC_PROXY, class Load>
__device__ __forceinline__ void pipeline_step(int64_t i, int64_t nkb, const Load& load) {
  mma::cp_async_wait<kStages - 2>();
  if (ASYNC_PROXY) mma::fence_proxy_async_smem();
  __syncthreads();
  if (i + kStages - 1 < nkb) load(i + kStages - 1, int((i + kStages - 1) % kStages));
  mma::cp_async_commit();
}

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
      pipeline_start<kStages>(nkb, load);
      for (int64_t i = 0; i < nkb; ++i) {
        pipeline_step<kStages, false>(i, nkb, load);
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

// Launches a persistent form: as many CTAs as fit on the device at once (computed once per kernel and
// device), at most one per work item of every expert (items of kFeat output features).
template <void (*KERNEL)(MoeFp8GemmParams), size_t kSmemBytes, int kFeat>
cudaError_t launch_persistent(const MoeFp8GemmParams& p, cudaStream_t stream) {
  const void* fn = reinterpret_cast<const void*>(KERNEL);
  const cudaError_t attr = set_max_dynamic_smem(fn, int(kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const int resident = per_device_value(
      fn, +[]() -> int {
        int dev = 0, sms = 0, per = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, KERNEL, kThreads, kSmemBytes);
        return (sms > 0 ? sms : 1) * (per > 0 ? per : 1);
      });
  const int64_t most = int64_t(p.experts) * ((p.N + kFeat - 1) / kFeat);
  const int grid = int(most < resident ? most : resident);
  KERNEL<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <bool GATE_UP, int NT>
cudaError_t launch_tile(const MoeFp8GemmParams& p, cudaStream_t stream) {
  return launch_persistent < sm90_moe_fp8_gemm_kernel<GATE_UP, NT>, Tile<NT>::kSmem,
         GATE_UP ? 64 : 128 > (p, stream);
}

// ---- the wgmma form (tile_rows 128: prefill-sized groups) ----
// Work item as above (128 weight rows of one active expert); a pass takes up to 128 packed rows of the
// expert, so a group of <= 128 rows streams its weights once; the pass multiplies the narrowest wgmma N of
// 16, 32, 64 and 128 that holds its rows (a group's tail pads to 16, not to 128). Two warpgroups: warpgroup q
// multiplies weight rows 64q .. 64q + 63 (gate_up: q = 0 gate, q = 1 up features n0 .. n0 + 63; down:
// features n0 + 64q ..) by the pass's rows, each 128-wide K block as four m64n128k32 e4m3 wgmmas into a
// block accumulator that is then scaled (weight block scale x the row's scale) into the pass's sums, the
// block-scaled recipe of the mma.sync form. Weight and row tiles sit in shared memory in the 128-byte
// swizzle of wgmma_desc_sw128 (row r's 16-byte chunk c at chunk c ^ (r % 8)), copied with cp.async
// kStages - 1 blocks ahead by all 256 threads.
namespace wg {
static_assert(kThreads == 256, "two warpgroups");
constexpr int kTok = 128;  // packed rows per pass
constexpr int kStages = 5;
constexpr int kA = kRows * 128;  // weight tile bytes per stage
constexpr int kB = kTok * 128;   // row tile bytes per stage
constexpr size_t kSmem = size_t(kStages) * (kA + kB) + size_t(kStages) * kTok * 4 + 1024;  // + alignment
}  // namespace wg

// One pass of the wgmma form: the item's 128 weight rows x the pass's rows (s_src, -1 past the last),
// NW of them multiplied (16, 32, 64 or 128: the wgmma N, the narrowest that holds them).
struct WgPass {
  uint8_t* s_a;
  uint8_t* s_b;
  float* s_xs;
  const float (*s_wscale)[kMaxKb];
  const int64_t* s_src;
  const uint8_t* w_lo;
  const uint8_t* w_hi;
  int64_t n0;
  int32_t g0;
  int nr;
};

template <bool GATE_UP, int NW>
__device__ __forceinline__ void wgmma_pass(const MoeFp8GemmParams& p, const WgPass& w) {
  using namespace wg;
  constexpr int kAcc = NW / 2;
  const int tid = int(threadIdx.x), q = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, c4 = lane & 3;
  const int64_t K = p.K, N = p.N, nkb = K / 128;
  auto load = [&](int64_t kb, int stage) {
    uint8_t* a = w.s_a + size_t(stage) * kA;
    uint8_t* b = w.s_b + size_t(stage) * kB;
#pragma unroll
    for (int j = 0; j < kRows * 8 / kThreads; ++j) {
      const int i = tid + j * kThreads, r = i >> 3, c = i & 7;
      const bool hi = GATE_UP && r >= 64;
      const int64_t f = w.n0 + (GATE_UP ? (r & 63) : r);
      const bool ok = f < N;
      const uint8_t* src = (hi ? w.w_hi : w.w_lo) + (ok ? f : 0) * K + kb * 128 + c * 16;
      mma::cp_async16(a + r * 128 + ((c ^ (r & 7)) * 16), src, ok ? 16 : 0);
    }
    for (int i = tid; i < NW * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      const int64_t row = w.s_src[r];
      const uint8_t* src = p.xq + (row >= 0 ? row : 0) * K + kb * 128 + c * 16;
      mma::cp_async16(b + r * 128 + ((c ^ (r & 7)) * 16), src, row >= 0 ? 16 : 0);
    }
    if (tid < NW) {
      const int64_t row = w.s_src[tid];
      mma::cp_async4(w.s_xs + stage * kTok + tid, p.x_scale + kb * p.x_scale_ld + (row >= 0 ? row : 0),
                     row >= 0 ? 4 : 0);
    }
  };
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
  pipeline_start<kStages>(nkb, load);
  for (int64_t i = 0; i < nkb; ++i) {
    pipeline_step<kStages, true>(i, nkb, load);
    const int stage = int(i % kStages);
    const uint32_t a_addr = mma::smem_addr(w.s_a + size_t(stage) * kA + q * 64 * 128);
    const uint32_t b_addr = mma::smem_addr(w.s_b + size_t(stage) * kB);
    float blk[kAcc];
    mma::wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
      mma::wgmma_m64nk32_e4m3<NW>(blk, mma::wgmma_desc_sw128(a_addr + k * 32),
                                  mma::wgmma_desc_sw128(b_addr + k * 32), k);
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(blk);
    const float sw = w.s_wscale[GATE_UP ? q : 0][i];
    const float* xs = w.s_xs + stage * kTok;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      const float2 x = *reinterpret_cast<const float2*>(xs + 8 * j + 2 * c4);
      const float s0 = sw * x.x, s1 = sw * x.y;
      acc[4 * j + 0] += blk[4 * j + 0] * s0;
      acc[4 * j + 1] += blk[4 * j + 1] * s1;
      acc[4 * j + 2] += blk[4 * j + 2] * s0;
      acc[4 * j + 3] += blk[4 * j + 3] * s1;
    }
  }
  mma::cp_async_wait<0>();
  __syncthreads();  // every stage read: the weight tiles may hold the up half below
  // acc[4j + e]: weight row 16 warp + g + 8 (e / 2) of this warpgroup's 64, pass row 8j + 2 c4 + e % 2.
  if (GATE_UP) {
    float* up = reinterpret_cast<float*>(w.s_a);  // [kAcc][128 threads]
    if (q == 1) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) up[j * 128 + (tid & 127)] = acc[j];
    }
    __syncthreads();
    if (q == 0) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) {
        const int r = 8 * (j >> 2) + 2 * c4 + (j & 1);
        const int64_t f = w.n0 + 16 * warp + g + 8 * ((j >> 1) & 1);
        if (r < w.nr && f < N) {
          const float gv = acc[j], uv = up[j * 128 + tid];
          p.out[int64_t(w.g0 + r) * N + f] = gv / (1.0f + expf(-gv)) * uv;
        }
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      const int r = 8 * (j >> 2) + 2 * c4 + (j & 1);
      const int64_t f = w.n0 + 64 * q + 16 * warp + g + 8 * ((j >> 1) & 1);
      if (r < w.nr && f < N) p.out[int64_t(w.g0 + r) * N + f] = acc[j];
    }
  }
  __syncthreads();  // the pass's shared memory (s_src, stages, the up half) free for the next
}

template <bool GATE_UP>
__global__ void __launch_bounds__(kThreads, 1) sm90_moe_fp8_wgmma_kernel(const MoeFp8GemmParams p) {
  using namespace wg;
  constexpr int kFeat = GATE_UP ? 64 : 128;
  extern __shared__ uint8_t smem_raw[];
  __shared__ float s_wscale[2][kMaxKb];
  __shared__ int64_t s_src[kTok];
  uint8_t* smem = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1 KiB
  WgPass w{};
  w.s_a = smem;
  w.s_b = smem + size_t(kStages) * kA;
  w.s_xs = reinterpret_cast<float*>(smem + size_t(kStages) * (kA + kB));
  w.s_wscale = s_wscale;
  w.s_src = s_src;
  const int tid = int(threadIdx.x);
  const int64_t N = p.N, nkb = p.K / 128;
  const int64_t tiles = (N + kFeat - 1) / kFeat;
  const int64_t items = int64_t(p.header[0]) * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int e = p.active[item / tiles];
    w.n0 = (item % tiles) * kFeat;
    const int32_t m0 = p.offsets[e], m1 = p.offsets[e + 1];
    const MoeExpertWeights ew = p.table[e];
    w.w_lo = static_cast<const uint8_t*>(GATE_UP ? ew.gate : ew.down);
    w.w_hi = static_cast<const uint8_t*>(GATE_UP ? ew.up : ew.down);
    {
      // The previous item's last pass ended with a barrier: nobody reads the old scales any more.
      const float* sc_lo = (GATE_UP ? ew.gate_scale : ew.down_scale) + (w.n0 / 128) * nkb;
      const float* sc_hi = (GATE_UP ? ew.up_scale : ew.down_scale) + (w.n0 / 128) * nkb;
      for (int64_t i = tid; i < nkb; i += kThreads) {
        s_wscale[0][i] = sc_lo[i];
        s_wscale[1][i] = sc_hi[i];
      }
    }
    for (int32_t g0 = m0; g0 < m1; g0 += kTok) {
      const int nr = m1 - g0 < kTok ? int(m1 - g0) : kTok;
      w.g0 = g0;
      w.nr = nr;
      if (tid < kTok)
        s_src[tid] = tid < nr ? (p.in_rows ? int64_t(p.in_rows[g0 + tid]) : int64_t(g0 + tid)) : -1;
      __syncthreads();  // s_src (and, the first time, s_wscale) visible to every thread
      if (nr > 64)
        wgmma_pass<GATE_UP, 128>(p, w);
      else if (nr > 32)
        wgmma_pass<GATE_UP, 64>(p, w);
      else if (nr > 16)
        wgmma_pass<GATE_UP, 32>(p, w);
      else
        wgmma_pass<GATE_UP, 16>(p, w);
    }
  }
}

template <bool GATE_UP>
cudaError_t launch_wgmma(const MoeFp8GemmParams& p, cudaStream_t stream) {
  return launch_persistent < sm90_moe_fp8_wgmma_kernel<GATE_UP>, wg::kSmem, GATE_UP ? 64 : 128 > (p, stream);
}

template <bool GATE_UP>
cudaError_t launch_rows(const MoeFp8GemmParams& p, cudaStream_t stream) {
  switch (p.tile_rows) {
    case 8: return launch_tile<GATE_UP, 1>(p, stream);
    case 16: return launch_tile<GATE_UP, 2>(p, stream);
    case 32: return launch_tile<GATE_UP, 4>(p, stream);
    case 64: return launch_tile<GATE_UP, 8>(p, stream);
    case 128: return launch_wgmma<GATE_UP>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int moe_fp8_tile_rows(int64_t pairs, int64_t experts) {
  const int64_t mean = experts > 0 ? (pairs + experts - 1) / experts : pairs;
  if (mean >= kMoeFp8WgmmaMinMeanRows) return 128;  // prefill-sized groups: the wgmma form
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
