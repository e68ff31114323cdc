// Lightning indexer scores (tensor cores, fused first radix histogram) over bf16 or FP8 index keys, and the
// fused launch (workspace zeroing, scores, the select passes of sm90_indexer_select.cu). Two score kernels
// (IndexerScoreKernel, kernels/kernel_options.h; select_indexer_score_kernel picks): v2
// (sm90_indexer_score_v2_kernel: 3-8 swizzled stages, per-tile slots in shared memory, FP8 keys through f16
// mma.sync) and v3 (the same kernel with FP8 keys through wgmma).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/sm90_mma.cuh"
#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/cuda/indexer/sm90_indexer_fp8.cuh"
#include "kernels/cuda/indexer/sm90_indexer_select.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kScoreThreads = 256;
constexpr int kTileKeys = 128;  // 8 warps x 16 keys
// Fewest 128-key tiles per score CTA. Key chunks per CTA = ceil(rows x tiles / (2 x SMs)) tiles, at
// least this: 1 lets a short batch-1 row spread over more CTAs (4K keys: 32 CTAs, was 16 with 2).
constexpr int64_t kScoreMinTilesPerCta = 1;

// Order-preserving map of a float to u32 (larger float -> larger key; -0 was normalised to +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// FP8 keys enter the MMA in a permuted dimension order so that each thread's A fragments are 32
// contiguous bytes of a key row: logical column L = 16 kk + 8 hi + 2 c + e holds dimension
// 32 c + 4 kk + 2 hi + e. q is stored in the same order, so the dot products are unchanged.
__host__ __device__ constexpr int fp8_dim_of(int L) {
  return ((L % 8) / 2) * 32 + (L / 16) * 4 + ((L % 16) / 8) * 2 + (L % 2);
}

// The end of a score CTA: lets a programmatically dependent select launch, adds the CTA's digit-1
// histogram to the row's, and with `fuse` runs the row's select in the row's last CTA to finish.
__device__ __forceinline__ void finish_row(const IndexerTopkParams& p, int row, int64_t n, int chunk,
                                           bool fuse, float* srow, uint32_t* sHist) {
  const int tid = threadIdx.x;
  // A programmatically dependent row select may launch once every CTA got here; it still waits for this
  // grid to finish (griddepcontrol.wait) before reading the scores and the histogram.
  mma::grid_launch_dependents();
  __syncthreads();
  uint32_t* ghist = p.hist + int64_t(row) * indexer_hist_stride(p.splits);
  for (int i = tid; i < kIndexerHistBins; i += kScoreThreads) {
    if (sHist[i]) atomicAdd(&ghist[i], sHist[i]);
  }
  if (!fuse) return;
  // Last CTA of the row (threadfence-reduction pattern): every thread's score stores and histogram atomics
  // are ordered before its CTA's count; the CTA that brings the count to the row's CTA total selects,
  // reading through L2 (load_keys16 / load_select use ld.global.cg).
  __shared__ uint32_t s_scratch[32];
  __shared__ uint32_t s_res[2];
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const uint32_t ctas = uint32_t((n + chunk - 1) / chunk);  // CTAs of this row that did not return early
    s_last = atomicAdd(&p.row_done[row], 1u) == ctas - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  indexer_select::select_row<kScoreThreads>(p, ghist, srow, n, p.out + int64_t(row) * p.out_stride, sHist,
                                            s_scratch, s_res);
}

// ---- Score kernel v2 (IndexerScoreKernel::v2) ----
// Shared key rows are unpadded; 16-byte chunk c of tile row r sits at chunk c ^ (r % 8), so that an
// ldmatrix phase (8 rows, one chunk each) and an FP8 fragment load phase (8 lanes: 2 rows x 4 chunks) touch
// 8 distinct 16-byte bank groups without padding the rows.
template <bool FP8>
__host__ __device__ constexpr int v2_row_bytes() {
  return FP8 ? kIndexerDim : kIndexerDim * 2;
}
// One stage: the tile's key rows, FP8: then its 128 f32 key scales.
template <bool FP8>
__host__ __device__ constexpr int v2_stage_bytes() {
  return kTileKeys * v2_row_bytes<FP8>() + (FP8 ? kTileKeys * 4 : 0);
}
// Pipeline stages: as many as fit two CTAs per SM (H = 32, or WG: at most 128 registers a thread) or one
// (H = 64) with the slots, weights and histogram (WG: and q). Bytes in flight per SM (stages - 1 tiles per
// CTA): bf16 128 KB (H = 32) or 160 KB (H = 64), FP8 169 KB or 118 KB (WG: 135 KB); the removed 2-stage v1
// had at most 64 / 32 KB (bf16) and 32 / 17 KB (FP8).
template <int H, bool FP8, bool WG>
__host__ __device__ constexpr int v2_stages() {
  return WG ? 5 : H == 32 ? (FP8 ? 6 : 3) : (FP8 ? 8 : 6);
}
// Dynamic shared bytes: WG: 1024 (alignment) and q [H][128] f16; then the stages, the slots [stages][128]
// i32, the weights [H] f32, the histogram.
template <int H, bool FP8, bool WG>
__host__ __device__ constexpr int v2_smem_bytes() {
  return (WG ? 1024 + H * kIndexerDim * 2 : 0) +
         v2_stages<H, FP8, WG>() * (v2_stage_bytes<FP8>() + kTileKeys * 4) + H * 4 + kIndexerHistBins * 4;
}
// Per SM 228 KB, less 1 KB reserved per CTA and the static shared bytes of finish_row (under 256).
static_assert(2 * (v2_smem_bytes<32, false, false>() + 1024 + 256) <= 228 * 1024, "two CTAs per SM");
static_assert(2 * (v2_smem_bytes<32, true, false>() + 1024 + 256) <= 228 * 1024, "two CTAs per SM");
static_assert(2 * (v2_smem_bytes<32, true, true>() + 1024 + 256) <= 228 * 1024, "two CTAs per SM");
static_assert(2 * (v2_smem_bytes<64, true, true>() + 1024 + 256) <= 228 * 1024, "two CTAs per SM");
static_assert(v2_smem_bytes<64, false, false>() + 256 <= 227 * 1024 &&
                  v2_smem_bytes<64, true, false>() + 256 <= 227 * 1024 &&
                  v2_smem_bytes<64, true, true>() + 256 <= 227 * 1024,
              "one CTA per SM");
// q is staged (bf16 or f16 rows of 256 bytes) in the last stage before that stage's first tile.
static_assert(64 * kIndexerDim * 2 <= v2_stage_bytes<true>(), "q fits in one stage");

// d[64 x N] (+)= A[64 x 16] B[16 x N] for the warpgroup, N = 8 x (rows of d): 32 or 64 heads. A from
// registers (warp w of the warpgroup holds rows 16w .. 16w + 15 in the mma.sync m16n8k16 A-fragment order),
// B K-major in shared memory (128-byte-swizzle descriptor), f16 in, f32 accumulate; accumulate = 0
// overwrites d. d[i][e] is row 16w + g + 8 (e / 2), column 8i + 2c + e % 2: the mma.sync C fragment of
// n-tile i.
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[4][4], const uint32_t (&a)[4], uint64_t desc_b,
                                             int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, "
      "1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_f16_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b,
                                             int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// Byte offset of b16 element `col` of row r in 256-byte swizzled rows.
__device__ __forceinline__ int swz_b16(int r, int col) {
  return r * 256 + (((col >> 3) ^ (r & 7)) << 4) + (col & 7) * 2;
}

// The logical (MMA) column of FP8 dimension d: the inverse of fp8_dim_of.
__host__ __device__ constexpr int fp8_col_of(int d) {
  return 16 * ((d % 32) / 4) + 8 * ((d % 4) / 2) + 2 * (d / 32) + d % 2;
}
constexpr bool fp8_perm_inverse() {
  for (int L = 0; L < kIndexerDim; ++L)
    if (fp8_col_of(fp8_dim_of(L)) != L) return false;
  return true;
}
static_assert(fp8_perm_inverse(), "fp8_col_of inverts fp8_dim_of");

// 2^k as a float, k in [-126, 127].
__device__ __forceinline__ float pow2f(int k) { return __uint_as_float(uint32_t(k + 127) << 23); }

// Two e4m3 codes (low byte first) -> f16x2 (low half first); exact (every e4m3 value is an f16 value).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(codes & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// c[16x8] += a[16x16] (row) * b[16x8] (col), f16 in, f32 accumulate.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fuse (IndexerSelectPath::row_fused, splits == 1): the last CTA of each row to finish runs the row's
// select; CTA 0 of a row with at most topk keys writes its positions.
// 128-key tiles (8 warps x 16 keys) on a deep pipeline (v1, 2 stages with per-thread page lookups, was
// removed: 941 us against 527 at batch 64 x 128K bf16):
// stage u % S holds tile u; iteration t waits for tile t, issues tile t + S - 1 and computes tile t. The
// slot of each tile row is computed once (thread r < 128 for row r, walking its page index) into
// sSlot[u % S] and read by the copying threads. WG (IndexerScoreKernel::v3, FP8 only): each warpgroup
// (64 keys) runs 8 wgmma m64nHk16 per tile, A = the f16 codes from registers, B = q from shared memory
// (K-major, 128-byte swizzle: [2][H][64] f16, 16-byte chunk j of row h at j ^ (h % 8)), instead of the
// 32 mma.sync per warp (a quarter of the tensor instructions, twice the tensor throughput).
template <int H, bool FP8, bool WG>
__global__ void __launch_bounds__(kScoreThreads, H == 32 || WG ? 2 : 1)
    sm90_indexer_score_v2_kernel(const IndexerTopkParams p, int chunk, bool fuse) {
  constexpr int NT = H / 8;
  constexpr int S = v2_stages<H, FP8, WG>();
  constexpr int RB = v2_row_bytes<FP8>();
  constexpr int SB = v2_stage_bytes<FP8>();
  static_assert(S >= 2 && kTileKeys * 2 == kScoreThreads, "one slot thread per tile row");
  static_assert(FP8 || !WG, "wgmma only for FP8 keys");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // WG: q's swizzle atoms must be 1024-byte aligned (the hardware swizzles address bits 4-6 by 7-9).
  unsigned char* smem = WG ? smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;
  unsigned char* sStage = smem + (WG ? H * kIndexerDim * 2 : 0);
  int32_t* sSlot = reinterpret_cast<int32_t*>(sStage + S * SB);  // [S][128]: slot of each tile row, -1: none
  float* sW = reinterpret_cast<float*>(sSlot + S * kTileKeys);
  uint32_t* sHist = reinterpret_cast<uint32_t*>(sW + H);
  // q: [H][128] b16 in 256-byte swizzled rows, staged in stage S - 1 until its first tile (ldmatrix into
  // registers); WG: in the wgmma layout at the front, for the whole kernel.
  unsigned char* sQ = WG ? smem : sStage + (S - 1) * SB;
  // Byte offset of q element (h, logical column L) in sQ.
  auto q_off = [](int h, int L) {
    return WG ? (L >> 6) * (H * 128) + h * 128 + ((((L >> 3) & 7) ^ (h & 7)) << 4) + (L & 7) * 2
              : swz_b16(h, L);
  };

  const int row = blockIdx.x;
  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  const int64_t n = seq >= 0 && seq < p.num_seqs ? p.row_len[row] : 0;
  // Every path waits for the grid before (pdl.cuh), the early returns too: this grid's completion then
  // implies that grid's, which a programmatically launched next kernel relies on.
  if (n <= p.topk) {  // the select lists every position
    pdl_wait();
    if (fuse && blockIdx.y == 0)
      indexer_select::write_all<kScoreThreads>(p, n, p.out + int64_t(row) * p.out_stride);
    return;
  }
  const int64_t k0 = int64_t(blockIdx.y) * chunk;
  if (k0 >= n) {
    pdl_wait();
    return;
  }
  const int64_t k1 = k0 + chunk < n ? k0 + chunk : n;
  const int n_tiles = int((k1 - k0 + kTileKeys - 1) / kTileKeys);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
  const int32_t* pt_row = p.page_table + seq * p.pt_stride;
  const uint32_t ps = uint32_t(p.page_size);  // positions are below 2^31 (row_len is i32)

  // Thread tid < 128 walks row tid of tiles 0, 1, 2, ... in order: its page index pi and in-page offset
  // off (one division for tile 0, then + 128 = q128 pages + r128 per tile). page_of(u): the page-table
  // entry of row tid of tile u (-1: none) and the offset; called for u = 0, 1, 2, ... once each.
  const uint32_t q128 = uint32_t(kTileKeys) / ps, r128 = uint32_t(kTileKeys) % ps;
  uint32_t pi = uint32_t(k0 + tid) / ps;  // k0 + tid < 2^31
  uint32_t off_next = uint32_t(k0 + tid) - pi * ps;
  auto page_of = [&](int u, int32_t& off) -> int32_t {
    const int64_t pos = k0 + int64_t(u) * kTileKeys + tid;
    const uint32_t page = pi;
    off = int32_t(off_next);
    pi += q128;  // advance to tile u + 1
    off_next += r128;
    if (off_next >= ps) {
      off_next -= ps;
      ++pi;
    }
    if (tid >= kTileKeys || u >= n_tiles || pos >= k1) return -1;
    return int64_t(page) < p.pt_cols ? pt_row[page] : -1;
  };
  // Slots fit in i32: a cache of 2^31 slots would take 256 GB (bf16) or 264 GB (FP8).
  auto slot_of = [&](int32_t pg, int32_t off) -> int32_t {
    if (pg < 0) return -1;
    const int64_t slot = int64_t(pg) * p.page_size + off;
    return slot < p.num_slots ? int32_t(slot) : -1;
  };
  // Copies tile u into stage u % S: 16-byte pieces, a warp covering 2 (bf16) or 4 (FP8) whole rows of the
  // row-major cache; rows without a slot are zero-filled. FP8: threads < 32 copy the scales of rows 4 tid
  // .. 4 tid + 3, in one 16-byte piece when their slots are consecutive and 16-byte aligned.
  const unsigned char* src_c = cache + (FP8 ? tid & 7 : tid & 15) * 16;  // this thread's 16-byte piece
  auto issue = [&](int u) {
    unsigned char* stage = sStage + (u % S) * SB;
    const int32_t* sl = sSlot + (u % S) * kTileKeys;
    if constexpr (!FP8) {
      const int c = tid & 15, r0 = tid >> 4;  // rows r0 + 16 it, r % 8 == r0 % 8
      unsigned char* dst = stage + r0 * RB + ((c ^ (r0 & 7)) << 4);
#pragma unroll
      for (int it = 0; it < kTileKeys / 16; ++it) {
        const int32_t slot = sl[r0 + 16 * it];  // -1: zero-fill, no read (src is then slot 0's)
        mma::cp_async16(dst + it * 16 * RB, src_c + uint64_t(uint32_t(slot >= 0 ? slot : 0)) * RB,
                        slot >= 0 ? 16 : 0);
      }
    } else {
      const int c = tid & 7, r0 = tid >> 3;  // rows r0 + 32 it
      unsigned char* dst = stage + r0 * RB + ((c ^ (r0 & 7)) << 4);
#pragma unroll
      for (int it = 0; it < kTileKeys / 32; ++it) {
        const int32_t slot = sl[r0 + 32 * it];
        mma::cp_async16(dst + it * 32 * RB, src_c + uint64_t(uint32_t(slot >= 0 ? slot : 0)) * RB,
                        slot >= 0 ? 16 : 0);
      }
      if (tid < kTileKeys / 4) {
        const int4 s4 = *reinterpret_cast<const int4*>(sl + 4 * tid);
        unsigned char* dsts = stage + kTileKeys * RB + 16 * tid;
        const unsigned char* scales = cache + p.num_slots * kIndexerDim;
        if (s4.x >= 0 && (s4.x & 3) == 0 && s4.y == s4.x + 1 && s4.z == s4.x + 2 && s4.w == s4.x + 3) {
          mma::cp_async16(dsts, scales + int64_t(s4.x) * 4, 16);
        } else {
          const int32_t sv[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
          for (int j = 0; j < 4; ++j)
            mma::cp_async4(dsts + 4 * j, sv[j] >= 0 ? scales + int64_t(sv[j]) * 4 : cache,
                           sv[j] >= 0 ? 4 : 0);
        }
      }
    }
  };

  // Prologue: the page-table entries of tiles 0..S (their loads overlap q's), the slots of tiles
  // 0..S-1, then tiles 0..S-2 in flight while the B fragments of q are loaded from stage S - 1.
  int32_t pre_pg[S + 1], pre_off[S + 1];
#pragma unroll
  for (int u = 0; u <= S; ++u) pre_pg[u] = page_of(u, pre_off[u]);
  for (int i = tid; i < kIndexerHistBins; i += kScoreThreads) sHist[i] = 0;
  const float* qrow = p.q + row * p.q_s0;
  if constexpr (!FP8) {
    for (int i = tid; i < H * kIndexerDim / 2; i += kScoreThreads) {
      const int h = i / (kIndexerDim / 2), col = 2 * (i % (kIndexerDim / 2));
      const float* qh = qrow + h * p.q_s1 + col;
      *reinterpret_cast<__nv_bfloat162*>(sQ + swz_b16(h, col)) = __floats2bfloat162_rn(qh[0], qh[1]);
    }
    if (tid < H) sW[tid] = p.w[row * p.w_s0 + tid] * p.weight_scale;
  } else {
    // One warp per head, lane l holding dimensions 4 l .. 4 l + 3: q_h / 2^e in f16 with 2^e a power of
    // two putting the head's amax in [2^14, 2^15) (f16 keeps 11 bits of every value above amax / 2^29),
    // and 2^e moved into the head's weight: w relu(s x) = w 2^e relu(s x / 2^e).
    for (int h = warp; h < H; h += kScoreThreads / 32) {
      const float* qh = qrow + h * p.q_s1 + 4 * lane;
      const float v[4] = {qh[0], qh[1], qh[2], qh[3]};
      float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      int e = 0;  // zero, inf or NaN: unscaled (f16 keeps inf and NaN)
      if (amax > 0.f && amax <= 3.402823466e38f) {
        e = int((__float_as_uint(amax) >> 23) & 0xffu) - 127 - 14;
        e = e < -100 ? -100 : (e > 100 ? 100 : e);
      }
      const float down = pow2f(-e);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        *reinterpret_cast<__half*>(sQ + q_off(h, fp8_col_of(4 * lane + j))) = __float2half_rn(v[j] * down);
      if (lane == 0) sW[h] = p.w[row * p.w_s0 + h] * p.weight_scale * pow2f(e);
    }
  }
  if (tid < kTileKeys) {
#pragma unroll
    for (int u = 0; u < S; ++u) sSlot[u * kTileKeys + tid] = slot_of(pre_pg[u], pre_off[u]);
  }
  int32_t pf_pg = pre_pg[S], pf_off = pre_off[S];   // tile u + S + 1's entry during iteration u
  if constexpr (WG) mma::fence_proxy_async_smem();  // q's stores -> visible to wgmma after the barrier
  __syncthreads();
#pragma unroll
  for (int u = 0; u < S - 1; ++u) {
    if (u < n_tiles) issue(u);
    mma::cp_async_commit();
  }

  // B fragments of Q^T (k = dims, n = heads) for every k-step, kept in registers (not with WG).
  uint32_t bq[NT][kIndexerDim / 16][2];
#pragma unroll
  for (int np = 0; np < (WG ? 0 : NT / 2); ++np) {
#pragma unroll
    for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
      uint32_t b[4];
      mma::ldsm_x4(b,
                   sQ + swz_b16(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 16 + ((lane >> 3) & 1) * 8));
      bq[2 * np][kk][0] = b[0];
      bq[2 * np][kk][1] = b[1];
      bq[2 * np + 1][kk][0] = b[2];
      bq[2 * np + 1][kk][1] = b[3];
    }
  }
  const int g = lane >> 2, c4 = lane & 3;
  float wl[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    wl[nt][0] = sW[nt * 8 + 2 * c4];
    wl[nt][1] = sW[nt * 8 + 2 * c4 + 1];
  }
  const float scale = p.scale;
  // Launched as a programmatic dependent of the offsets kernel (packed scores), itself an ordinary launch
  // after the workspace memset: everything above reads only what was written before that kernel started
  // (and writes only shared memory); the offsets and everything below come after this.
  pdl_wait();
  float* srow = indexer_row_scores(p, row);

  for (int t = 0; t < n_tiles; ++t) {
    mma::cp_async_wait<S - 2>();  // this thread's pieces of tile t
    __syncthreads();              // everyone's; and tile t - 1 (stage (t + S - 1) % S) is consumed
    if (t + S - 1 < n_tiles) issue(t + S - 1);
    mma::cp_async_commit();
    const unsigned char* stage = sStage + (t % S) * SB;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    float sc0 = scale, sc1 = scale;  // per key row g and g + 8 of this warp
    if constexpr (FP8) {
      // Rows warp * 16 + g and + 8 (both % 8 == g): logical bytes [32 c4, 32 c4 + 32), word kk = the A
      // fragment of k-step kk (fp8_dim_of order).
      const unsigned char* r0 = stage + (warp * 16 + g) * RB;
      const unsigned char* r1 = r0 + 8 * RB;
      const int o0 = ((2 * c4) ^ g) << 4, o1 = ((2 * c4 + 1) ^ g) << 4;
      const uint4 x0 = *reinterpret_cast<const uint4*>(r0 + o0),
                  x1 = *reinterpret_cast<const uint4*>(r0 + o1);
      const uint4 y0 = *reinterpret_cast<const uint4*>(r1 + o0),
                  y1 = *reinterpret_cast<const uint4*>(r1 + o1);
      const uint32_t w0[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const uint32_t w1[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
      const float* ks = reinterpret_cast<const float*>(stage + kTileKeys * RB);
      sc0 = scale * ks[warp * 16 + g];
      sc1 = scale * ks[warp * 16 + g + 8];
      if constexpr (WG) {
        uint32_t a[kIndexerDim / 16][4];
#pragma unroll
        for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
          a[kk][0] = e4m3x2_to_f16x2(w0[kk]);
          a[kk][1] = e4m3x2_to_f16x2(w1[kk]);
          a[kk][2] = e4m3x2_to_f16x2(w0[kk] >> 16);
          a[kk][3] = e4m3x2_to_f16x2(w1[kk] >> 16);
        }
        const uint32_t q_addr = mma::smem_addr(sQ);
        mma::wgmma_fence_operands(acc);
        mma::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kIndexerDim / 16; ++kk)
          wgmma_f16_rs(acc, a[kk],
                       mma::wgmma_desc_sw128(q_addr + uint32_t(kk >> 2) * (H * 128) + (kk & 3) * 32), kk);
        mma::wgmma_commit();
        mma::wgmma_wait<0>();
        mma::wgmma_fence_operands(acc);
      } else {
#pragma unroll
        for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
          const uint32_t a[4] = {e4m3x2_to_f16x2(w0[kk]), e4m3x2_to_f16x2(w1[kk]),
                                 e4m3x2_to_f16x2(w0[kk] >> 16), e4m3x2_to_f16x2(w1[kk] >> 16)};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) mma_f16(acc[nt], a, bq[nt][kk][0], bq[nt][kk][1]);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_x4(a, stage + swz_b16(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma::mma_bf16(acc[nt], a, bq[nt][kk][0], bq[nt][kk][1]);
      }
    }
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s0 += fmaxf(acc[nt][0] * sc0, 0.f) * wl[nt][0] + fmaxf(acc[nt][1] * sc0, 0.f) * wl[nt][1];
      s1 += fmaxf(acc[nt][2] * sc1, 0.f) * wl[nt][0] + fmaxf(acc[nt][3] * sc1, 0.f) * wl[nt][1];
    }
    s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
    s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
    s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
    if (c4 < 2) {
      const float s = (c4 == 0 ? s0 : s1) + 0.0f;  // + 0 turns -0 into +0
      const int64_t pos = k0 + int64_t(t) * kTileKeys + warp * 16 + g + c4 * 8;
      if (pos < k1) {
        srow[pos] = s;
        atomicAdd(&sHist[order_key(s) >> 21], 1u);
      }
    }
    // Slots of tile t + S into sSlot[t % S] (last read by the issue of tile t, S - 1 iterations ago; next
    // by the issue of tile t + S, after the next barrier), then tile t + S + 1's page-table entry.
    if (tid < kTileKeys && t + S < n_tiles) {
      sSlot[(t % S) * kTileKeys + tid] = slot_of(pf_pg, pf_off);
      pf_pg = page_of(t + S + 1, pf_off);
    }
  }
  finish_row(p, row, n, chunk, fuse, srow, sHist);
}

int num_sms() { return device_sm_count(132); }

// kind: v2 or v3 (select_indexer_score_kernel; v3 only with FP8 keys).
template <int H, bool FP8>
cudaError_t launch_scores(const IndexerTopkParams& p, bool fuse, IndexerScoreKernel kind,
                          cudaStream_t stream) {
  constexpr int kSmemV2 = v2_smem_bytes<H, FP8, false>(), kSmemV3 = v2_smem_bytes<H, FP8, FP8>();
  const bool v3 = kind == IndexerScoreKernel::v3;
  const auto kernel =
      v3 ? sm90_indexer_score_v2_kernel<H, FP8, FP8> : sm90_indexer_score_v2_kernel<H, FP8, false>;
  const size_t smem = size_t(v3 ? kSmemV3 : kSmemV2);
  const cudaError_t e = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(smem));
  if (e != cudaSuccess) return e;
  const int64_t tiles = (p.max_len + kTileKeys - 1) / kTileKeys;
  int64_t per = (p.rows * tiles + 2 * num_sms() - 1) / (2 * num_sms());
  if (per < kScoreMinTilesPerCta) per = kScoreMinTilesPerCta;
  if (per > tiles) per = tiles;
  const int chunk = int(per * kTileKeys);
  const int64_t chunks = (p.max_len + chunk - 1) / chunk;
  if (chunks > 65535 || p.rows > 2147483647) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(p.rows), unsigned(chunks));
  // Programmatic after the offsets kernel (score_offsets set): overlap its launch and run.
  const bool programmatic = kIndexerScorePdl && p.score_offsets != nullptr;
  return launch_pdl(programmatic, kernel, grid, dim3(kScoreThreads), smem, stream, p, chunk, fuse);
}

}  // namespace

int indexer_num_sms() { return num_sms(); }

IndexerScoreKernel indexer_score_kernel(const IndexerTopkParams& p) {
  return select_indexer_score_kernel(p.score_kernel, p.key_format == IndexerKeyFormat::fp8_e4m3);
}

cudaError_t launch_indexer_topk_fused(const IndexerTopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if ((p.heads != 32 && p.heads != 64) || p.topk < 1 || p.out_k > p.topk ||
      (!p.score_offsets && p.score_stride % 4 != 0) || p.splits < 1 || p.splits * p.split_len < p.max_len)
    return cudaErrorInvalidValue;
  // The score kernels (they run when a row has more than topk keys) walk pages in 32 bits.
  if (p.max_len > p.topk && (p.page_size <= 0 || p.page_size > 0x7fffffff)) return cudaErrorInvalidValue;
  const bool fuse = indexer_select_path(p) == IndexerSelectPath::row_fused;  // implies max_len > topk
  if (p.max_len > p.topk) {
    // The histograms and (splits == 1) the row_done counters, contiguous.
    cudaError_t e = cudaMemsetAsync(p.hist, 0, size_t(indexer_zeroed_words(p.rows, p.splits)) * 4, stream);
    if (e != cudaSuccess) return e;
    e = launch_indexer_score_offsets(p, stream);
    if (e != cudaSuccess) return e;
    const bool fp8 = p.key_format == IndexerKeyFormat::fp8_e4m3;
    const IndexerScoreKernel k = indexer_score_kernel(p);
    if (p.heads == 32) {
      e = fp8 ? launch_scores<32, true>(p, fuse, k, stream) : launch_scores<32, false>(p, fuse, k, stream);
    } else {
      e = fp8 ? launch_scores<64, true>(p, fuse, k, stream) : launch_scores<64, false>(p, fuse, k, stream);
    }
    if (e != cudaSuccess) return e;
  }
  if (p.scores_only || fuse) return cudaSuccess;  // fused: the score kernel selected
  return launch_indexer_select(p, stream);
}

}  // namespace dsaserve::kernels::cuda
