// Block-scaled FP8 GEMM for few tokens (see gemm_small_params.h).
//
// CTA: 8 warps x 16 weight rows = 128 rows (one row block of the weight scales: row0 % 128 == 0), a
// range of 128-wide K blocks. Each K block's weight tile [128 rows, 128 B], activation codes [Tp, 128]
// and activation scales [Tp] are copied into shared memory with cp.async, kStages blocks ahead (no
// registers held for loads in flight); then every warp feeds its 16 rows x Tp tokens to the tensor
// cores and folds the block's sums with the weight scale (one per CTA and K block) x token scale.
//
// mma.sync m16n8k32 wants lane (g, t) to hold k slots {4t..4t+3} and {16+4t..16+4t+3} of A row g / g+8
// and of B column g. The dot product does not care which physical k sits in which slot as long as A
// and B agree, so lane (g, t) feeds the 8 bytes at physical k [16t, 16t + 8) of a 64-byte half into one
// mma and the next 8 into a second: both operands are plain 16-byte shared-memory reads. The weight
// tile's 16-byte chunks are XOR-swizzled by row parity (chunk c of row r at c ^ 4(r & 1)), so the two
// rows a quarter-warp reads sit in different bank halves.
#include <cuda.h>  // CUtensorMap and its enums (the entry point is looked up at run time)
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/sm90_mma.cuh"
#include "kernels/cuda/gemm/gemm_small_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16;  // weight rows per CTA
constexpr int kStages = 4;          // K blocks in flight
// Bytes per token row of the activation tile: 128 + 64 of padding puts the two token rows a
// quarter-warp reads at different bank halves.
constexpr int kXLd = 192;
constexpr int kSms = 132;  // the H200's SMs (the K split aims at whole waves of them)
constexpr int64_t kMaxCounters = kFp8SmallCounters;

template <int NT, int kSt = kStages>
struct Stage {
  static constexpr int kTp = NT * 8;
  static constexpr int kW = kRows * 128;            // weight tile
  static constexpr int kX = kTp * kXLd;             // activation codes
  static constexpr int kBytes = kW + kX + kTp * 4;  // + activation scales
  static constexpr size_t kSmem = size_t(kSt) * kBytes;
};

using mma::mma_e4m3;

// Stages K block kb of a CTA's 128 weight rows: 128 bytes a row (128 FP8 codes or 64 bf16 values), 8
// chunks of 16 bytes, XOR-swizzled by row parity (chunk c of row r at c ^ 4(r & 1)); rows past N are
// zero-filled. `row_bytes`: the bytes of one weight row.
__device__ __forceinline__ void stage_weight_tile(uint8_t* st, const uint8_t* w, int64_t row_bytes,
                                                  int64_t row_base, int64_t N, int64_t kb) {
  for (int i = threadIdx.x; i < kRows * 8; i += kThreads) {
    const int r = i >> 3, c = i & 7;
    const int64_t row = row_base + r;
    const bool ok = row < N;
    const uint8_t* src = w + (ok ? row : 0) * row_bytes + kb * 128 + c * 16;
    mma::cp_async16(st + r * 128 + ((c ^ ((r & 1) << 2)) * 16), src, ok ? 16 : 0);
  }
}

// The K blocks [kb0, kb0 + n) of this CTA's split (blockIdx.y of `splits`) out of `total`.
struct KRange {
  int64_t kb0, n;
};
__device__ __forceinline__ KRange split_k_range(int64_t total, int splits) {
  const int64_t per = (total + splits - 1) / splits;
  const int64_t kb0 = int64_t(blockIdx.y) * per;
  const int64_t kb1 = kb0 + per < total ? kb0 + per : total;
  return {kb0, kb1 - kb0};
}

// Launched programmatically (p.pdl): the weight rows of the CTA's first `blocks` K blocks (128 bytes of a
// row each, one L2 line) are prefetched into L2 before the kernel waits for the previous grid (pdl.cuh: the
// weights are immutable, and a prefetch is only a hint), so the weight stream starts while that grid
// drains; the pipeline's first copies then find them in L2.
__device__ __forceinline__ void prefetch_weight_tiles(const uint8_t* w, int64_t row_bytes, int64_t row_base,
                                                      int64_t N, int64_t kb0, int64_t blocks) {
  for (int64_t i = threadIdx.x; i < blocks * kRows; i += kThreads) {
    const int64_t row = row_base + i % kRows;
    if (row < N) prefetch_l2(w + row * row_bytes + (kb0 + i / kRows) * 128);
  }
}

// The small-T kernels' epilogue (both params structs name out, out_stride, T, N, partial, counters, splits
// alike): lane (g, t) holds rows r_lo / r_lo + 8 for two token columns of each 8 (below). Without a K split
// the sums go to the output; with one, each CTA publishes its partial sums and the last CTA of the row slice
// adds them in split order (deterministic), then leaves its counter zero for the next launch on the stream.
// The lane's two token columns are tok0 and tok0 + tok_step (the fragments' order: 2t and 2t + 1; the
// tensor-map kernel's permuted columns: t and t + 4). kNamed: the split's barriers are named barrier 1 over
// the kThreads consumer threads (the tensor-map kernel's producer warp has left), else __syncthreads.
template <int NT, bool kNamed = false, class P>
__device__ __forceinline__ void small_gemm_epilogue(const P& p, const float (&acc)[NT][4], int64_t row_base,
                                                    int r_lo, int tok0_lane, int tok_step, bool& s_last) {
  const int64_t n_lo = row_base + r_lo, n_hi = n_lo + 8;
  const bool ok_lo = n_lo < p.N, ok_hi = n_hi < p.N;
  auto store = [&](float* dst, int64_t stride) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tok0 = nt * 8 + tok0_lane, tok1 = tok0 + tok_step;
      if (ok_lo && tok0 < p.T) dst[tok0 * stride + n_lo] = acc[nt][0];
      if (ok_lo && tok1 < p.T) dst[tok1 * stride + n_lo] = acc[nt][1];
      if (ok_hi && tok0 < p.T) dst[tok0 * stride + n_hi] = acc[nt][2];
      if (ok_hi && tok1 < p.T) dst[tok1 * stride + n_hi] = acc[nt][3];
    }
  };
  auto sync = [] {
    if constexpr (kNamed)
      mma::named_sync(1, kThreads);
    else
      __syncthreads();
  };
  if (p.splits == 1) {
    store(p.out, p.out_stride);
    return;
  }
  store(p.partial + int64_t(blockIdx.y) * p.T * p.N, p.N);
  __threadfence();
  sync();
  if (threadIdx.x == 0) s_last = atomicAdd(&p.counters[blockIdx.x], 1u) == uint32_t(p.splits - 1);
  sync();
  if (!s_last) return;
  __threadfence();
  for (int64_t i = threadIdx.x; i < int64_t(kRows) * p.T; i += kThreads) {
    const int64_t tok = i / kRows, r = row_base + i % kRows;
    if (r >= p.N) continue;
    float sum = 0.0f;
    for (int sp = 0; sp < p.splits; ++sp) sum += __ldcg(p.partial + (int64_t(sp) * p.T + tok) * p.N + r);
    p.out[tok * p.out_stride + r] = sum;
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0u;
}

// A small-T launch's weights are its own (the params' top-level fields, `own`) and more[0, n_more) after it,
// their 128-row slices one after another along grid.x. kFused: the weight of blockIdx.x's slice and the
// slices before it (`before`), walked with an unrolled loop so that every field is read from the parameters
// at a fixed offset (no local copy); else the call's own (the single-weight kernels read nothing more).
template <bool kFused, class Seg, class P>
__device__ __forceinline__ Seg small_part(const P& p, const Seg& own, int64_t& before) {
  before = 0;
  if constexpr (!kFused) return own;
  Seg s = own;
  int64_t slices = (s.N + kRows - 1) / kRows;
  constexpr int kMore = int(sizeof(p.more) / sizeof(p.more[0]));
#pragma unroll
  for (int i = 0; i < kMore; ++i) {
    if (i < p.n_more && int64_t(blockIdx.x) >= before + slices) {
      before += slices;
      s = p.more[i];
      slices = (s.N + kRows - 1) / kRows;
    }
  }
  return s;
}

// What a CTA of a small-T launch works on: its weight's rows and output, and the epilogue's fields
// (small_gemm_epilogue's); each weight's split partials at splits * T * 128 * (the slices before it).
template <class W>
struct SmallCta {
  const W* w;
  float* out;
  int64_t out_stride, T, N, row_base;
  float* partial;
  uint32_t* counters;
  int splits;
};
template <class W, class Seg, class P>
__device__ __forceinline__ SmallCta<W> small_cta(const P& p, const Seg& s, int64_t before) {
  SmallCta<W> c;
  c.w = s.w;
  c.out = s.out;
  c.out_stride = s.out_stride;
  c.T = p.T;
  c.N = s.N;
  c.row_base = (int64_t(blockIdx.x) - before) * kRows;
  c.partial = p.partial ? p.partial + int64_t(p.splits) * p.T * kRows * before : nullptr;
  c.counters = p.counters;
  c.splits = p.splits;
  return c;
}

// The FP8 kernel's CTA: the SmallCta and its row of weight scales.
struct Fp8SmallCta : SmallCta<uint8_t> {
  const float* ws;
};
template <bool kFused>
__device__ __forceinline__ Fp8SmallCta fp8_small_cta(const Fp8SmallGemmParams& p) {
  const Fp8SmallSegment own{p.w, p.w_scale, p.row0, p.w_scale_ld, p.out, p.out_stride, p.N};
  int64_t before = 0;
  const Fp8SmallSegment s = small_part<kFused>(p, own, before);
  Fp8SmallCta c{small_cta<uint8_t>(p, s, before), nullptr};
  c.ws = s.w_scale + ((s.row0 + c.row_base) / 128) * s.w_scale_ld;
  return c;
}

// kMinBlocks: CTAs an SM holds (2, or 3 at 8 tokens for wide outputs: fp8_small_ctas_per_sm). kSt: K
// blocks in flight (Fp8SmallGemmParams::stages). kFused: several weights (n_more > 0).
template <int NT, int kMinBlocks, int kSt, bool kFused>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    sm90_fp8_small_gemm_kernel(const Fp8SmallGemmParams p) {
  using S = Stage<NT, kSt>;
  constexpr int Tp = S::kTp;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ bool s_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const KRange kr = split_k_range(p.K / 128, p.splits);
  const int64_t kb0 = kr.kb0, nkb = kr.n;
  const Fp8SmallCta cta = fp8_small_cta<kFused>(p);  // this CTA's weight, rows and output
  const int64_t row_base = cta.row_base;
  const float* ws = cta.ws;  // this CTA's scale row
  if (p.pdl) prefetch_weight_tiles(cta.w, p.K, row_base, cta.N, kb0, nkb < kSt - 1 ? nkb : kSt - 1);
  pdl_enter();  // the activations, the output and the split's scratch come from / go to other kernels

  auto load = [&](int64_t kb, int stage) {
    uint8_t* st = smem + size_t(stage) * S::kBytes;
    stage_weight_tile(st, cta.w, p.K, row_base, cta.N, kb);
    for (int i = threadIdx.x; i < Tp * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      mma::cp_async16(st + S::kW + r * kXLd + c * 16, p.xq + r * p.K + kb * 128 + c * 16, 16);
    }
    for (int i = threadIdx.x; i < Tp / 4; i += kThreads)
      mma::cp_async16(st + S::kW + S::kX + i * 16, p.x_scale + kb * p.Tp + i * 4, 16);
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kSt - 1; ++s) {
    if (s < nkb) load(kb0 + s, s);
    mma::cp_async_commit();
  }
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;  // rows in the tile
  for (int64_t i = 0; i < nkb; ++i) {
    mma::cp_async_wait<kSt - 2>();  // this K block has landed (own copies) ...
    __syncthreads();                // ... everyone's, and the stage refilled below is no longer read
    if (i + kSt - 1 < nkb) load(kb0 + i + kSt - 1, int((i + kSt - 1) % kSt));
    mma::cp_async_commit();
    const uint8_t* st = smem + size_t(i % kSt) * S::kBytes;
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
    const float sw = ws[kb0 + i];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float x0 = sw * xs[nt * 8 + 2 * t], x1 = sw * xs[nt * 8 + 2 * t + 1];
      acc[nt][0] += blk[nt][0] * x0;
      acc[nt][1] += blk[nt][1] * x1;
      acc[nt][2] += blk[nt][2] * x0;
      acc[nt][3] += blk[nt][3] * x1;
    }
  }
  mma::cp_async_wait<0>();

  small_gemm_epilogue<NT>(cta, acc, row_base, r_lo, 2 * t, 1, s_last);
}

template <int NT, int kMinBlocks, int kSt = kStages>
cudaError_t launch_nt_occ(const Fp8SmallGemmParams& p, dim3 grid, cudaStream_t stream) {
  auto* kernel = p.n_more > 0 ? sm90_fp8_small_gemm_kernel<NT, kMinBlocks, kSt, true>
                              : sm90_fp8_small_gemm_kernel<NT, kMinBlocks, kSt, false>;
  const cudaError_t attr =
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(Stage<NT, kSt>::kSmem));
  if (attr != cudaSuccess) return attr;
  return launch_pdl(p.pdl, kernel, grid, dim3(kThreads), Stage<NT, kSt>::kSmem, stream, p);
}
// ---- The tensor-map experiment (Fp8SmallGemmParams::tma): 8 token rows, 2 CTAs an SM, one weight ----
//
// The same sums as the kernel above (the same k slots in each mma), staged differently: a producer warp's one
// thread copies each K block's weight tile [128 rows, 128 B] and activation tile [8 tokens, 128 B] with one
// tensor-map copy each (cp.async.bulk.tensor, 128-byte swizzle: 16-byte chunk c of row r at c ^ (r % 8);
// rows past N read as zero), completing on the stage's `full` mbarrier; the 8 consumer warps wait on it,
// run their mma.sync, and release the stage on its `empty` mbarrier (one arrival a warp), so no block
// barrier stands between K blocks and no consumer thread issues a copy. The Nsight look of 2026-12-08 found
// the cp.async kernel bound by its own pipeline (47-56% of cycles with no eligible warp, 1.6 TB/s with its
// weights in L2). With the 128-byte swizzle, the two rows a quarter-warp reads must differ in bit 2 of
// their row to fall in different bank halves, so fragment row / column g takes physical row / token
// perm(g) = (g >> 1) | ((g & 1) << 2): lane (g, t)'s outputs are rows perm(g), perm(g) + 8 and tokens t,
// t + 4.
constexpr int kTmapStage = kRows * 128 + 8 * 128;  // 17,408 bytes: a multiple of the swizzle's 1,024

struct Fp8SmallTmapArgs {
  Fp8SmallGemmParams p;
  CUtensorMap w_map;  // p.w as [N rows, K bytes], box 128 x 128
  CUtensorMap x_map;  // p.xq as [8 rows, K bytes], box 128 x 8
};

__device__ __forceinline__ void tmap_load_2d(void* dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(mma::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(mma::smem_addr(bar))
      : "memory");
}

template <int kSt>
__global__ void __launch_bounds__(kThreads + 32, 2)
    sm90_fp8_small_gemm_tmap_kernel(const __grid_constant__ Fp8SmallTmapArgs a) {
  const Fp8SmallGemmParams& p = a.p;
  extern __shared__ uint8_t tmap_smem_raw[];
  // The swizzled tiles want 1,024-byte alignment (the launch asks for 1,024 bytes more).
  uint8_t* smem =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(tmap_smem_raw) + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t full[kSt], empty[kSt];
  __shared__ bool s_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const KRange kr = split_k_range(p.K / 128, p.splits);
  const int64_t kb0 = kr.kb0, nkb = kr.n;
  const Fp8SmallCta cta = fp8_small_cta<false>(p);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kSt; ++s) {
      mma::mbar_init(&full[s], 1);
      mma::mbar_init(&empty[s], kWarps);
    }
    mma::fence_mbarrier_init();
  }
  __syncthreads();
  pdl_enter();  // the activations, the output and the split's scratch come from / go to other kernels
  if (warp == kWarps) {  // the producer
    if (lane == 0) {
      for (int64_t i = 0; i < nkb; ++i) {
        const int s = int(i % kSt);
        if (i >= kSt) {
          mma::mbar_wait(&empty[s], uint32_t((i / kSt - 1) & 1));  // every consumer has read the stage ...
          mma::fence_proxy_async_smem();  // ... and those generic reads come before the async-proxy write
        }
        uint8_t* st = smem + size_t(s) * kTmapStage;
        mma::mbar_arrive_expect_tx(&full[s], uint32_t(kTmapStage));
        const int x = int((kb0 + i) * 128);
        tmap_load_2d(st, &a.w_map, x, int(cta.row_base), &full[s]);
        tmap_load_2d(st + kRows * 128, &a.x_map, x, 0, &full[s]);
      }
    }
    return;
  }
  const int pg = (g >> 1) | ((g & 1) << 2);
  const int r_lo = warp * 16 + pg, r_hi = r_lo + 8;  // rows in the tile; both are pg modulo 8
  float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  for (int64_t i = 0; i < nkb; ++i) {
    const int s = int(i % kSt);
    mma::mbar_wait(&full[s], uint32_t((i / kSt) & 1));
    const uint8_t* st = smem + size_t(s) * kTmapStage;
    float blk[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = ((h * 4 + t) ^ pg) * 16;  // this lane's 16-byte chunk of the half, swizzled
      const uint4 alo = *reinterpret_cast<const uint4*>(st + r_lo * 128 + c);
      const uint4 ahi = *reinterpret_cast<const uint4*>(st + r_hi * 128 + c);
      const uint4 b = *reinterpret_cast<const uint4*>(st + kRows * 128 + pg * 128 + c);
      mma_e4m3(blk[0], alo.x, ahi.x, alo.y, ahi.y, b.x, b.y);
      mma_e4m3(blk[0], alo.z, ahi.z, alo.w, ahi.w, b.z, b.w);
    }
    __syncwarp();
    if (lane == 0) mma::mbar_arrive(&empty[s]);  // this warp has read the stage
    const float sw = cta.ws[kb0 + i];
    const float* xs = p.x_scale + (kb0 + i) * p.Tp;
    const float x0 = sw * xs[t], x1 = sw * xs[t + 4];
    acc[0][0] += blk[0][0] * x0;
    acc[0][1] += blk[0][1] * x1;
    acc[0][2] += blk[0][2] * x0;
    acc[0][3] += blk[0][3] * x1;
  }
  small_gemm_epilogue<1, true>(cta, acc, cta.row_base, r_lo, t, 4, s_last);
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda), looked up once
// per device (per_device_state).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                   CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                   CUtensorMapFloatOOBfill);
struct TensorMapEncoder {
  EncodeTiledFn fn = nullptr;
  TensorMapEncoder() {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiledFn>(f);
    else if (e != cudaSuccess)
      (void)cudaGetLastError();  // this lookup's own error, not a kernel's: the launch reports NotSupported
  }
};

// A 2-D map of `rows` rows of `row_bytes` bytes at `base` (16-byte aligned, row_bytes % 16 == 0), read in
// boxes of 128 bytes x box_rows rows with the 128-byte swizzle; rows past the end read as zero.
cudaError_t encode_u8_tiles(CUtensorMap* map, const void* base, int64_t row_bytes, int64_t rows,
                            int box_rows) {
  const EncodeTiledFn f = per_device_state<TensorMapEncoder>().fn;
  if (f == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {128, cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = f(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                       elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int kSt>
cudaError_t launch_nt_tmap(const Fp8SmallGemmParams& p, dim3 grid, cudaStream_t stream) {
  Fp8SmallTmapArgs a{};
  a.p = p;
  cudaError_t e = encode_u8_tiles(&a.w_map, p.w, p.K, p.N, kRows);
  if (e == cudaSuccess) e = encode_u8_tiles(&a.x_map, p.xq, p.K, 8, 8);
  if (e != cudaSuccess) return e;
  auto* kernel = sm90_fp8_small_gemm_tmap_kernel<kSt>;
  const int smem = kSt * kTmapStage + 1024;
  const cudaError_t attr = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  if (attr != cudaSuccess) return attr;
  return launch_pdl(p.pdl, kernel, grid, dim3(kThreads + 32), size_t(smem), stream, a);
}
template <int NT>
cudaError_t launch_nt(const Fp8SmallGemmParams& p, dim3 grid, cudaStream_t stream) {
  if constexpr (NT == 1) {
    if (p.tma) {
      return p.stages == kFp8SmallDeepStages ? launch_nt_tmap<kFp8SmallDeepStages>(p, grid, stream)
                                             : launch_nt_tmap<kStages>(p, grid, stream);
    }
    if (p.stages == kFp8SmallDeepStages) return launch_nt_occ<1, 2, kFp8SmallDeepStages>(p, grid, stream);
    if (fp8_small_ctas_per_sm(fp8_small_slices(p) * kRows, p.Tp, p.ctas_per_sm) == 3)
      return launch_nt_occ<1, 3>(p, grid, stream);
  }
  return launch_nt_occ<NT, 2>(p, grid, stream);
}

// ---- bf16 weights x f32 activations (two-term split), few tokens ----
//
// Same CTA shape as the FP8 kernel: 8 warps x 16 weight rows, K in blocks of 64 bf16 (128 bytes a row),
// kStages blocks in flight. The f32 activation rows of a K block ([Tp, 64] f32) are staged as they are
// and split when a warp reads its B fragment: lane (g, t) of a 32-wide half takes physical k [8t, 8t + 8)
// of token g (two float4), makes hi = bf16(x) and lo = bf16(x - hi), and feeds hi and lo against the
// same A fragment (two mma pairs). The A fragment's physical k slots match (see the FP8 kernel's note).
constexpr int kBf16XLd = 64 * 4 + 16;  // bytes per staged f32 token row (+16: spread the banks)

template <int NT>
struct Bf16Stage {
  static constexpr int kTp = NT * 8;
  static constexpr int kW = kRows * 128;
  static constexpr int kBytes = kW + kTp * kBf16XLd;
  static constexpr size_t kSmem = size_t(kStages) * kBytes;
};

// The weight a CTA of a bf16 small-T launch works on (fp8_small_cta's rule) and what the epilogue needs.
template <bool kFused>
__device__ __forceinline__ SmallCta<uint16_t> bf16_small_cta(const Bf16SmallGemmParams& p) {
  const Bf16SmallSegment own{p.w, p.out, p.out_stride, p.N};
  int64_t before = 0;
  const Bf16SmallSegment s = small_part<kFused>(p, own, before);
  return small_cta<uint16_t>(p, s, before);
}

template <int NT, bool kFused>
__global__ void __launch_bounds__(kThreads, 2) sm90_bf16_small_gemm_kernel(const Bf16SmallGemmParams p) {
  using S = Bf16Stage<NT>;
  constexpr int Tp = S::kTp;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ bool s_last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const KRange kr = split_k_range(p.K / 64, p.splits);
  const int64_t kb0 = kr.kb0, nkb = kr.n;
  const SmallCta<uint16_t> cta = bf16_small_cta<kFused>(p);  // this CTA's weight, rows and output
  const int64_t row_base = cta.row_base;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(cta.w);
  if (p.pdl) prefetch_weight_tiles(w, p.K * 2, row_base, cta.N, kb0, nkb < kStages - 1 ? nkb : kStages - 1);
  pdl_enter();

  auto load = [&](int64_t kb, int stage) {
    uint8_t* st = smem + size_t(stage) * S::kBytes;
    stage_weight_tile(st, w, p.K * 2, row_base, cta.N, kb);
    // Token rows: 16 chunks of 4 floats; rows >= T are zero-filled.
    for (int i = threadIdx.x; i < Tp * 16; i += kThreads) {
      const int r = i >> 4, c = i & 15;
      const bool ok = r < p.T;
      const float* src = p.x + (ok ? r : 0) * p.x_stride + kb * 64 + c * 4;
      mma::cp_async16(st + S::kW + r * kBf16XLd + c * 16, src, ok ? 16 : 0);
    }
  };

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load(kb0 + s, s);
    mma::cp_async_commit();
  }
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  for (int64_t i = 0; i < nkb; ++i) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (i + kStages - 1 < nkb) load(kb0 + i + kStages - 1, int((i + kStages - 1) % kStages));
    mma::cp_async_commit();
    const uint8_t* st = smem + size_t(i % kStages) * S::kBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = h * 4 + t;  // this lane's 16-byte chunk: bf16 k [8c, 8c + 8) of the block
      const uint4 alo = *reinterpret_cast<const uint4*>(st + r_lo * 128 + ((c ^ ((r_lo & 1) << 2)) * 16));
      const uint4 ahi = *reinterpret_cast<const uint4*>(st + r_hi * 128 + ((c ^ ((r_hi & 1) << 2)) * 16));
      const uint32_t a0[4] = {alo.x, ahi.x, alo.y, ahi.y}, a1[4] = {alo.z, ahi.z, alo.w, ahi.w};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float* xr = reinterpret_cast<const float*>(st + S::kW + (nt * 8 + g) * kBf16XLd) + 8 * c;
        const float4 v0 = *reinterpret_cast<const float4*>(xr), v1 = *reinterpret_cast<const float4*>(xr + 4);
        uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
        split_pair(v0.x, v0.y, h0, l0);
        split_pair(v0.z, v0.w, h1, l1);
        split_pair(v1.x, v1.y, h2, l2);
        split_pair(v1.z, v1.w, h3, l3);
        mma::mma_bf16(acc[nt], a0, h0, h1);
        mma::mma_bf16(acc[nt], a0, l0, l1);
        mma::mma_bf16(acc[nt], a1, h2, h3);
        mma::mma_bf16(acc[nt], a1, l2, l3);
      }
    }
  }
  mma::cp_async_wait<0>();

  small_gemm_epilogue<NT>(cta, acc, row_base, r_lo, 2 * t, 1, s_last);
}

template <int NT>
cudaError_t launch_bf16_nt(const Bf16SmallGemmParams& p, dim3 grid, cudaStream_t stream) {
  auto* kernel =
      p.n_more > 0 ? sm90_bf16_small_gemm_kernel<NT, true> : sm90_bf16_small_gemm_kernel<NT, false>;
  const cudaError_t attr =
      set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(Bf16Stage<NT>::kSmem));
  if (attr != cudaSuccess) return attr;
  return launch_pdl(p.pdl, kernel, grid, dim3(kThreads), Bf16Stage<NT>::kSmem, stream, p);
}

// CTAs along K for `ctas` row slices over `kb` K blocks: whole waves of per_sm x kSms CTAs, every split at
// least one block.
int splits_for(int64_t ctas, int64_t kb, int per_sm = 2) {
  const int64_t target = int64_t(per_sm) * kSms;
  if (kb <= 1 || ctas >= target || ctas > kMaxCounters) return 1;
  int64_t s = target / ctas;  // whole waves: one CTA more than the slots would double the time
  if (s > kb) s = kb;
  const int64_t per = (kb + s - 1) / s;
  return int((kb + per - 1) / per);  // every split gets at least one K block
}

}  // namespace

// At least 4 K blocks (256 inputs, 64 KB of a slice's weights) per split: one-block splits left the
// last CTA of a slice adding ~100 partial rows (router_gate [256 x 6144]: 96 splits, 14.6 us at T = 7).
int bf16_small_gemm_splits(int64_t N, int64_t K) {
  return bf16_small_fused_splits((N + kRows - 1) / kRows, K);
}

int bf16_small_fused_splits(int64_t slices, int64_t K) {
  const int64_t kb = K / 64;
  return splits_for(slices, kb < 8 ? kb : kb / 4);
}

int64_t bf16_small_slices(const Bf16SmallGemmParams& p) {
  int64_t n = (p.N + kRows - 1) / kRows;
  for (int i = 0; i < p.n_more && i < kBf16SmallMaxMore; ++i) n += (p.more[i].N + kRows - 1) / kRows;
  return n;
}

int64_t bf16_small_fused_scratch(const Bf16SmallGemmParams& p) {
  return p.splits > 1 ? int64_t(p.splits) * p.T * kRows * bf16_small_slices(p) : 0;
}

cudaError_t launch_bf16_small_gemm(const Bf16SmallGemmParams& p, cudaStream_t stream) {
  if (p.n_more < 0 || p.n_more > kBf16SmallMaxMore) return cudaErrorInvalidValue;
  for (int i = 0; i < p.n_more; ++i) {  // every weight of a fused launch is a real one
    const Bf16SmallSegment& m = p.more[i];
    if (m.N <= 0 || m.w == nullptr || m.out == nullptr || (reinterpret_cast<uintptr_t>(m.w) & 15) != 0)
      return cudaErrorInvalidValue;
  }
  if (p.T == 0 || (p.N == 0 && p.n_more == 0)) return cudaSuccess;
  if (p.N <= 0 || p.K <= 0 || p.K % 64 != 0 || p.T > kBf16SmallMaxTokens || p.x_stride % 4 != 0 ||
      (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 || (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
      p.splits < 1 || (p.splits > 1 && (p.partial == nullptr || p.counters == nullptr)))
    return cudaErrorInvalidValue;
  const int64_t ctas = bf16_small_slices(p);
  if (p.splits > 1 && ctas > kMaxCounters) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(ctas), unsigned(p.splits));
  if (p.T <= 8) return launch_bf16_nt<1>(p, grid, stream);
  if (p.T <= 16) return launch_bf16_nt<2>(p, grid, stream);
  return launch_bf16_nt<4>(p, grid, stream);
}

// Measured on the H200 (ops_gpu_bench splits, CUDA-graph replays, T = 1 / 8): 3 CTAs an SM win where the
// row slices are many (q_b [16384 x 2048] 10.9 -> 10.4 us, the dense MLP's gate [12288 x 6144] 27.9 ->
// 24.7), tie at 48 slices (o_proj, mlp_down) and lose at 16 (q_a [2048 x 6144] 6.1 -> 6.4, 7.7 -> 8.9 at T =
// 8: the split doubles its partial sums).
int fp8_small_ctas_per_sm(int64_t N, int64_t Tp, int requested) {
  if (Tp != 8) return 2;
  if (requested == 2 || requested == 3) return requested;
  return (N + kRows - 1) / kRows >= 64 ? 3 : 2;
}

int fp8_small_gemm_splits(int64_t N, int64_t K, int64_t Tp, int ctas_per_sm) {
  return fp8_small_fused_splits((N + kRows - 1) / kRows, K, Tp, ctas_per_sm);
}

int fp8_small_fused_splits(int64_t slices, int64_t K, int64_t Tp, int ctas_per_sm) {
  return splits_for(slices, K / 128, fp8_small_ctas_per_sm(slices * kRows, Tp, ctas_per_sm));
}

int64_t fp8_small_slices(const Fp8SmallGemmParams& p) {
  int64_t n = (p.N + kRows - 1) / kRows;
  for (int i = 0; i < p.n_more && i < kFp8SmallMaxMore; ++i) n += (p.more[i].N + kRows - 1) / kRows;
  return n;
}

int64_t fp8_small_fused_scratch(const Fp8SmallGemmParams& p) {
  return p.splits > 1 ? int64_t(p.splits) * p.T * kRows * fp8_small_slices(p) : 0;
}

cudaError_t launch_fp8_small_gemm(const Fp8SmallGemmParams& p, cudaStream_t stream) {
  if (p.n_more < 0 || p.n_more > kFp8SmallMaxMore) return cudaErrorInvalidValue;
  const bool two_ctas =
      p.Tp == 8 && fp8_small_ctas_per_sm(fp8_small_slices(p) * kRows, p.Tp, p.ctas_per_sm) == 2;
  if (p.stages != 0 && p.stages != kStages && (p.stages != kFp8SmallDeepStages || !two_ctas))
    return cudaErrorInvalidValue;  // the deep pipeline: 8 token rows, 2 CTAs an SM
  if (p.tma && (!two_ctas || p.n_more != 0))
    return cudaErrorInvalidValue;       // the tensor-map kernel: the same, one weight
  for (int i = 0; i < p.n_more; ++i) {  // every weight of a fused launch is a real one
    const Fp8SmallSegment& m = p.more[i];
    if (m.N <= 0 || m.row0 % 128 != 0 || m.w == nullptr || m.w_scale == nullptr || m.out == nullptr ||
        (reinterpret_cast<uintptr_t>(m.w) & 15) != 0)  // cp.async's 16-byte copies
      return cudaErrorInvalidValue;
  }
  if (p.T == 0 || (p.N == 0 && p.n_more == 0)) return cudaSuccess;
  if (p.N <= 0 || p.K <= 0 || p.K % 128 != 0 || p.row0 % 128 != 0 || p.T > p.Tp || p.w == nullptr ||
      p.xq == nullptr || (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.xq) & 15) != 0 || (p.Tp != 8 && p.Tp != 16 && p.Tp != 32) ||
      p.splits < 1 || (p.splits > 1 && (p.partial == nullptr || p.counters == nullptr)))
    return cudaErrorInvalidValue;
  const int64_t ctas = fp8_small_slices(p);
  if (p.splits > 1 && ctas > kMaxCounters) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(ctas), unsigned(p.splits));
  switch (p.Tp) {
    case 8: return launch_nt<1>(p, grid, stream);
    case 16: return launch_nt<2>(p, grid, stream);
    default: return launch_nt<4>(p, grid, stream);
  }
}

}  // namespace dsaserve::kernels::cuda
