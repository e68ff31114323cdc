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
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
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
  static constexpr int kStages = 4;  // two CTAs per SM
  static constexpr int kW = kRows * 128;
  static constexpr int kX = kTp * kXLd;
  static constexpr int kBytes = kW + kX + kTp * 4;
  static constexpr size_t kSmem = size_t(kStages) * kBytes;
};

using mma::mma_e4m3;

// The mma.sync form's cp.async pipeline over the K blocks: the first kStages - 1 blocks in flight (one
// commit group each, empty past nkb), then per block i: wait for it (own copies), a barrier (everyone's
// copies landed; the stage block i - 1 held is no longer read), and block i + kStages - 1 issued into that
// stage.
template <int kStages, class Load>
__device__ __forceinline__ void pipeline_start(int64_t nkb, const Load& load) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load(s, s);
    mma::cp_async_commit();
  }
}
template <int kStages, class Load>
__device__ __forceinline__ void pipeline_step(int64_t i, int64_t nkb, const Load& load) {
  mma::cp_async_wait<kStages - 2>();
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
  pdl_enter();  // which experts run (header, active) comes from the grouping kernel: nothing to prefetch
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
        pipeline_step<kStages>(i, nkb, load);
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

// Launches a persistent form: as many CTAs of kBlock threads as fit on the device at once (computed once per
// kernel and device), at most one per work item of every expert (items of kFeat output features).
template <void (*KERNEL)(MoeFp8GemmParams), size_t kSmemBytes, int kFeat, int kBlock = kThreads>
cudaError_t launch_persistent(const MoeFp8GemmParams& p, cudaStream_t stream) {
  const void* fn = reinterpret_cast<const void*>(KERNEL);
  const cudaError_t attr = set_max_dynamic_smem(fn, int(kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const int resident = per_device_value(
      fn, +[]() -> int {
        int dev = 0, sms = 0, per = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, KERNEL, kBlock, kSmemBytes);
        return (sms > 0 ? sms : 1) * (per > 0 ? per : 1);
      });
  const int64_t most = int64_t(p.experts) * ((p.N + kFeat - 1) / kFeat);
  const int grid = int(most < resident ? most : resident);
  return launch_pdl(p.pdl, KERNEL, dim3(unsigned(grid)), dim3(kBlock), kSmemBytes, stream, p);
}

template <bool GATE_UP, int NT>
cudaError_t launch_tile(const MoeFp8GemmParams& p, cudaStream_t stream) {
  return launch_persistent < sm90_moe_fp8_gemm_kernel<GATE_UP, NT>, Tile<NT>::kSmem,
         GATE_UP ? 64 : 128 > (p, stream);
}

// ---- the wgmma form (tile_rows 128: prefill-sized groups), warp-specialised ----
// Work item as above (128 weight rows of one active expert); a pass takes up to 128 packed rows of the
// expert, and a group's last pass takes up to tail_rows (<= 32) more (by default a remainder of 129-160 rows
// is one pass), so a group of <= 160 rows streams its weights once: at 4,096 tokens over 256 experts (128
// rows an expert on average) about half the groups would otherwise stream them twice, the second time for a
// few rows. A pass multiplies the narrowest wgmma N of 16, 32, 64 and 128 that holds its first 128 rows (a
// group's tail pads to 16, not to 128), and its rows past 128 as a second wgmma of N 16 or 32 on the same
// weight tile. Multiplier warpgroup q takes weight rows 64q .. 64q + 63 (gate_up: q = 0 gate, q = 1 up
// features n0 .. n0 + 63; down: features n0 + 64q ..) times the pass's rows, each 128-wide K block as four
// m64nNk32 e4m3 wgmmas (and four more for the rows past 128) into a block accumulator that is then scaled
// (weight block scale x the row's scale) into the pass's sums, the block-scaled recipe of the mma.sync form.
// Weight and row tiles sit in shared memory in the 128-byte swizzle of wgmma_desc_sw128 (row r's 16-byte
// chunk c at chunk c ^ (r % 8)).
// Roles: warpgroup 0 copies (the weight and pass rows of every K block, cp.async into kStages stages, each
// stage's arrival counted on its `full` mbarrier), warpgroups 1 and 2 multiply and release each stage on its
// `empty` mbarrier once their wgmmas on it are done and its row scales read.
// No CTA-wide barrier inside the K loop: the copies run up to kStages blocks ahead, across passes and items,
// and the two multiplying warpgroups drift apart, so one's scale folding overlaps the other's wgmmas.
// Registers move from the copier (72) to the multipliers (200). The gate_up epilogue hands the up sums from
// warpgroup 2 to warpgroup 1 through a buffer of its own (named barrier 1 over the 256 multiplier threads).
namespace ws {
constexpr int kThreads = 384;
constexpr int kTok = 128;                       // rows of a pass's first product
constexpr int kTail = int(kMoeFp8MaxTailRows);  // rows a group's last pass may take past kTok
constexpr int kPassMax = kTok + kTail;          // rows a pass holds at most
constexpr int kStages = 5;
constexpr int kA = kRows * 128;     // weight tile bytes per stage
constexpr int kB = kPassMax * 128;  // row tile bytes per stage (whole 1 KiB swizzle atoms)
constexpr int kXsOff = kStages * (kA + kB);
constexpr int kUpOff = kXsOff + kStages * kPassMax * 4;  // [kPassMax / 2][128] f32 up sums (gate_up)
constexpr int kBarOff = kUpOff + (kPassMax / 2) * 128 * 4;
constexpr size_t kSmem = size_t(kBarOff) + 2 * kStages * 8 + 1024;  // + alignment
static_assert(kSmem <= 227 * 1024, "shared memory");
static_assert(kB % 1024 == 0 && (kTok * 128) % 1024 == 0, "stages and the tail's rows on swizzle atoms");
}  // namespace ws

// Rows of the pass that starts `rem` rows before its group's end: all of them up to kTok + tail (tail:
// MoeFp8GemmParams::tail_rows, 0 .. kTail), else kTok.
__device__ __forceinline__ int ws_pass_rows(int32_t rem, int tail) {
  return rem <= ws::kTok + tail ? int(rem) : ws::kTok;
}
// The wgmma N of a pass of `nr` rows: of its first 128 rows the narrowest of 16, 32, 64, 128 that holds
// them; of the rest (tail) 0, 16 or 32.
__device__ __forceinline__ int ws_width(int nr) { return nr > 64 ? 128 : nr > 32 ? 64 : nr > 16 ? 32 : 16; }
__device__ __forceinline__ int ws_tail(int nr) { return nr <= ws::kTok ? 0 : nr - ws::kTok > 16 ? 32 : 16; }

// Folds one K block's products `blk` (N = NB pass rows from pass row r0) into the pass's sums acc[kOff ..],
// each times the weight block's scale and the row's scale (xs: the stage's row scales).
template <int NB, int kOff, int kAcc>
__device__ __forceinline__ void ws_fold(float (&acc)[kAcc], const float (&blk)[NB / 2], const float* xs,
                                        float sw, int r0, int c4) {
#pragma unroll
  for (int j = 0; j < NB / 8; ++j) {
    const float2 x = *reinterpret_cast<const float2*>(xs + r0 + 8 * j + 2 * c4);
    const float s0 = sw * x.x, s1 = sw * x.y;
    acc[kOff + 4 * j + 0] += blk[4 * j + 0] * s0;
    acc[kOff + 4 * j + 1] += blk[4 * j + 1] * s1;
    acc[kOff + 4 * j + 2] += blk[4 * j + 2] * s0;
    acc[kOff + 4 * j + 3] += blk[4 * j + 3] * s1;
  }
}

// One multiplier warpgroup's pass: nkb K blocks from stages it0, it0 + 1, .. (mod kStages) into the pass's
// sums, then the epilogue. A K block's four m64nNWk32 wgmmas of the warpgroup's 64 weight rows x the pass's
// first NW rows, and with a tail (TW 16 or 32, NW 128) four m64nTWk32 ones x rows 128 .. 128 + TW - 1, are
// one commit group.
template <bool GATE_UP, int NW, int TW>
__device__ __forceinline__ void ws_consume(const MoeFp8GemmParams& p, uint8_t* smem, uint64_t* full,
                                           uint64_t* empty, int64_t it0, int64_t nkb, const float* sc,
                                           int64_t n0, int32_t g0, int nr, int q) {
  using namespace ws;
  static_assert(TW == 0 || NW == kTok, "a tail follows a whole first product");
  constexpr int kAcc = NW / 2 + TW / 2;
  const int t = int(threadIdx.x) & 127, warp = t >> 5, lane = t & 31, g = lane >> 2, c4 = lane & 3;
  const int64_t N = p.N;
  float acc[kAcc];
#pragma unroll
  for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;
  float sw = __ldg(sc);
  for (int64_t i = 0; i < nkb; ++i) {
    const int64_t it = it0 + i;
    const int st = int(it % kStages);
    mma::mbar_wait(full + st, uint32_t(it / kStages) & 1u);
    mma::fence_proxy_async_smem();
    const uint32_t a_addr = mma::smem_addr(smem + size_t(st) * kA + q * 64 * 128);
    const uint32_t b_addr = mma::smem_addr(smem + size_t(kStages) * kA + size_t(st) * kB);
    float blk[NW / 2];
    [[maybe_unused]] float blt[TW > 0 ? TW / 2 : 8];
    mma::wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
      mma::wgmma_m64nk32_e4m3<NW>(blk, mma::wgmma_desc_sw128(a_addr + k * 32),
                                  mma::wgmma_desc_sw128(b_addr + k * 32), k);
    if constexpr (TW > 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mma::wgmma_m64nk32_e4m3<TW>(blt, mma::wgmma_desc_sw128(a_addr + k * 32),
                                    mma::wgmma_desc_sw128(b_addr + kTok * 128 + k * 32), k);
    }
    mma::wgmma_commit();
    const float sw_next = i + 1 < nkb ? __ldg(sc + i + 1) : 0.0f;
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(blk);
    const float* xs = reinterpret_cast<const float*>(smem + kXsOff) + st * kPassMax;
    ws_fold<NW, 0>(acc, blk, xs, sw, 0, c4);
    if constexpr (TW > 0) {
      mma::wgmma_fence_operands(blt);
      ws_fold<TW, NW / 2>(acc, blt, xs, sw, kTok, c4);
    }
    mma::mbar_arrive(empty + st);
    sw = sw_next;
  }
  // acc[4j + e]: weight row 16 warp + g + 8 (e / 2) of this warpgroup's 64, pass row 8j + 2 c4 + e % 2
  // (the tail's sums continue the first product's: j >= 16 are rows 128 ..).
  if (GATE_UP) {
    float* up = reinterpret_cast<float*>(smem + kUpOff);  // [kAcc][128 threads]
    if (q == 1) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) up[j * 128 + t] = acc[j];
    }
    mma::named_sync(1, 256);
    if (q == 0) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) {
        const int r = 8 * (j >> 2) + 2 * c4 + (j & 1);
        const int64_t f = n0 + 16 * warp + g + 8 * ((j >> 1) & 1);
        if (r < nr && f < N) {
          const float gv = acc[j], uv = up[j * 128 + t];
          p.out[int64_t(g0 + r) * N + f] = gv / (1.0f + expf(-gv)) * uv;
        }
      }
    }
    mma::named_sync(1, 256);  // the up buffer free for the next pass
  } else {
#pragma unroll
    for (int j = 0; j < kAcc; ++j) {
      const int r = 8 * (j >> 2) + 2 * c4 + (j & 1);
      const int64_t f = n0 + 64 * q + 16 * warp + g + 8 * ((j >> 1) & 1);
      if (r < nr && f < N) p.out[int64_t(g0 + r) * N + f] = acc[j];
    }
  }
}

template <bool GATE_UP>
__global__ void __launch_bounds__(ws::kThreads, 1) sm90_moe_fp8_ws_kernel(const MoeFp8GemmParams p) {
  using namespace ws;
  constexpr int kFeat = GATE_UP ? 64 : 128;
  constexpr int kCopyRows = kPassMax / 16;  // pass rows a copying thread covers (weight rows: 8)
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (mma::smem_addr(smem_raw) & 1023)) & 1023);  // swizzle atoms: 1 KiB
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);
  uint64_t* empty = full + kStages;
  pdl_enter();
  const int tid = int(threadIdx.x);
  const int role = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform: 0 copies, 1 and 2 multiply
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mma::mbar_init(full + s, 128);
      mma::mbar_init(empty + s, 256);
    }
  }
  __syncthreads();
  const int64_t N = p.N, K = p.K, nkb = K / 128;
  const int64_t tiles = (N + kFeat - 1) / kFeat;
  const int64_t items = int64_t(p.header[0]) * tiles;
  int64_t it = 0;  // K blocks this CTA has gone through (both roles count the same sequence)
  if (role == 0) {
    mma::setmaxnreg_dec<72>();
    // Thread t copies 16-byte chunk t % 8 of tile rows t / 8 + 16 j (a warp: 4 whole rows of 128 bytes,
    // coalesced), weight rows j < 8 and pass rows j < kCopyRows, and the scales of pass rows t and t + 128.
    const int t = tid, c = t & 7, r0 = t >> 3;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const int e = p.active[item / tiles];
      const int64_t n0 = (item % tiles) * kFeat;
      const int32_t m0 = p.offsets[e], m1 = p.offsets[e + 1];
      const MoeExpertWeights ew = p.table[e];
      const uint8_t* w_lo = static_cast<const uint8_t*>(GATE_UP ? ew.gate : ew.down);
      const uint8_t* w_hi = static_cast<const uint8_t*>(GATE_UP ? ew.up : ew.down);
      for (int32_t g0 = m0; g0 < m1;) {
        const int nr = ws_pass_rows(m1 - g0, p.tail_rows);
        const int nw = ws_width(nr < kTok ? nr : kTok), tw = ws_tail(nr);
        // Pass row r is copied when a wgmma reads it: r < nw, or in the tail's kTok .. kTok + tw - 1.
        auto wanted = [&](int r) { return r < nw || (r >= kTok && r < kTok + tw); };
        auto src_of = [&](int r) -> int32_t {
          return r < nr ? (p.in_rows ? p.in_rows[g0 + r] : g0 + r) : -1;
        };
        int32_t src[kCopyRows];
#pragma unroll
        for (int j = 0; j < kCopyRows; ++j) src[j] = src_of(r0 + 16 * j);
        const int32_t srow0 = src_of(t), srow1 = t + kTok < kPassMax ? src_of(t + kTok) : -1;
        for (int64_t kb = 0; kb < nkb; ++kb, ++it) {
          const int st = int(it % kStages);
          if (it >= kStages) mma::mbar_wait(empty + st, uint32_t(it / kStages - 1) & 1u);
          uint8_t* a = smem + size_t(st) * kA;
          uint8_t* b = smem + size_t(kStages) * kA + size_t(st) * kB;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int r = r0 + 16 * j;
            const bool hi = GATE_UP && r >= 64;
            const int64_t f = n0 + (GATE_UP ? (r & 63) : r);
            const bool ok = f < N;
            mma::cp_async16(a + r * 128 + ((c ^ (r & 7)) * 16),
                            (hi ? w_hi : w_lo) + (ok ? f : 0) * K + kb * 128 + c * 16, ok ? 16 : 0);
          }
#pragma unroll
          for (int j = 0; j < kCopyRows; ++j) {
            const int r = r0 + 16 * j;
            if (wanted(r))
              mma::cp_async16(b + r * 128 + ((c ^ (r & 7)) * 16),
                              p.xq + int64_t(src[j] >= 0 ? src[j] : 0) * K + kb * 128 + c * 16,
                              src[j] >= 0 ? 16 : 0);
          }
          float* xs = reinterpret_cast<float*>(smem + kXsOff) + st * kPassMax;
          if (wanted(t))
            mma::cp_async4(xs + t, p.x_scale + kb * p.x_scale_ld + (srow0 >= 0 ? srow0 : 0),
                           srow0 >= 0 ? 4 : 0);
          if (t + kTok < kPassMax && wanted(t + kTok))
            mma::cp_async4(xs + t + kTok, p.x_scale + kb * p.x_scale_ld + (srow1 >= 0 ? srow1 : 0),
                           srow1 >= 0 ? 4 : 0);
          mma::cp_async_mbar_arrive_noinc(full + st);
        }
        g0 += nr;
      }
    }
    mma::cp_async_wait<0>();
  } else {
    mma::setmaxnreg_inc<200>();
    const int q = role - 1;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const int e = p.active[item / tiles];
      const int64_t n0 = (item % tiles) * kFeat;
      const int32_t m0 = p.offsets[e], m1 = p.offsets[e + 1];
      const MoeExpertWeights ew = p.table[e];
      const float* sc = (GATE_UP ? (q ? ew.up_scale : ew.gate_scale) : ew.down_scale) + (n0 / 128) * nkb;
      for (int32_t g0 = m0; g0 < m1;) {
        const int nr = ws_pass_rows(m1 - g0, p.tail_rows);
        switch (ws_tail(nr)) {
          case 32: ws_consume<GATE_UP, 128, 32>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
          case 16: ws_consume<GATE_UP, 128, 16>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
          default:
            switch (ws_width(nr)) {
              case 128: ws_consume<GATE_UP, 128, 0>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
              case 64: ws_consume<GATE_UP, 64, 0>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
              case 32: ws_consume<GATE_UP, 32, 0>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
              default: ws_consume<GATE_UP, 16, 0>(p, smem, full, empty, it, nkb, sc, n0, g0, nr, q); break;
            }
        }
        g0 += nr;
        it += nkb;
      }
    }
  }
}

template <bool GATE_UP>
cudaError_t launch_ws(const MoeFp8GemmParams& p, cudaStream_t stream) {
  return launch_persistent < sm90_moe_fp8_ws_kernel<GATE_UP>, ws::kSmem, GATE_UP ? 64 : 128,
         ws::kThreads > (p, stream);
}

template <bool GATE_UP>
cudaError_t launch_rows(const MoeFp8GemmParams& p, cudaStream_t stream) {
  switch (p.tile_rows) {
    case 8: return launch_tile<GATE_UP, 1>(p, stream);
    case 128: return launch_ws<GATE_UP>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

int moe_fp8_tile_rows(int64_t pairs, int64_t experts) {
  const int64_t mean = experts > 0 ? (pairs + experts - 1) / experts : pairs;
  return mean >= kMoeFp8WgmmaMinMeanRows ? 128 : 8;
}

cudaError_t launch_moe_fp8_gemm(const MoeFp8GemmParams& p, cudaStream_t stream) {
  if (p.N == 0 || p.experts == 0) return cudaSuccess;
  if (p.K <= 0 || p.K % 128 != 0 || p.K > kMoeFp8MaxK || p.experts > 65535 || p.x_scale_ld <= 0 ||
      p.tail_rows < 0 || p.tail_rows > kMoeFp8MaxTailRows)
    return cudaErrorInvalidValue;
  return p.gate_up ? launch_rows<true>(p, stream) : launch_rows<false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda
