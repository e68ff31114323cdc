// Lightning indexer scores (tensor cores, fused first radix histogram) over bf16 or FP8 index keys, and the
// fused launch (workspace zeroing, scores, the select passes of sm90_indexer_select.cu).
#include <cuda_bf16.h>

#include "kernels/cuda/indexer_topk_params.h"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/sm90_indexer_fp8.cuh"
#include "kernels/cuda/sm90_indexer_select.cuh"
#include "kernels/cuda/sm90_mma.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kScoreThreads = 256;
constexpr int kTileKeys = 128;  // 8 warps x 16 keys
constexpr int kStages = 2;
// Fewest 128-key tiles per score CTA. Key chunks per CTA = ceil(rows x tiles / (2 x SMs)) tiles, at
// least this: 1 lets a short batch-1 row spread over more CTAs (4K keys: 32 CTAs, was 16 with 2).
constexpr int64_t kScoreMinTilesPerCta = 1;
constexpr int kLdK = kIndexerDim + 8;    // bf16 per shared row: 272 bytes, ldmatrix conflict-free
constexpr int kLdK8 = kIndexerDim + 16;  // FP8 bytes per shared row: 144, 16-byte loads conflict-free

// Shared bytes of one pipeline stage: bf16 rows, or FP8 rows followed by the tile's f32 key scales.
template <bool FP8>
__host__ __device__ constexpr int stage_bytes() {
  return FP8 ? kTileKeys * kLdK8 + kTileKeys * 4 : kTileKeys * kLdK * 2;
}

// Order-preserving map of a float to u32 (larger float -> larger key; -0 was normalised to +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// 4-byte async copy global -> shared; src_bytes 0 zero-fills.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mma::smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}

// FP8 keys enter the MMA in a permuted dimension order so that each thread's A fragments are 32
// contiguous bytes of a key row: logical column L = 16 kk + 8 hi + 2 c + e holds dimension
// 32 c + 4 kk + 2 hi + e. q is stored in the same order, so the dot products are unchanged.
__host__ __device__ constexpr int fp8_dim_of(int L) {
  return ((L % 8) / 2) * 32 + (L / 16) * 4 + ((L % 16) / 8) * 2 + (L % 2);
}

// Waits until the grid this one programmatically depends on has finished and its writes are visible
// (griddepcontrol.wait; a no-op without a programmatic launch).
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// fuse (IndexerSelectPath::row_fused, splits == 1): the last CTA of each row to finish runs the row's
// select; CTA 0 of a row with at most topk keys writes its positions.
template <int H, bool FP8>
__global__ void __launch_bounds__(kScoreThreads, H == 32 ? 2 : 1)
    sm90_indexer_score_kernel(const IndexerTopkParams p, int chunk, bool fuse) {
  constexpr int NT = H / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* sStage = smem;
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem + kStages * stage_bytes<FP8>());
  float* sW = reinterpret_cast<float*>(sQ + H * kLdK);
  uint32_t* sHist = reinterpret_cast<uint32_t*>(sW + H);

  // Rows on grid x (up to 2^31 - 1: a batched prefill can pass more than 65,535 rows), key chunks on y.
  const int row = blockIdx.x;
  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  const int64_t n = seq >= 0 && seq < p.num_seqs ? p.row_len[row] : 0;
  if (n <= p.topk) {  // the select lists every position
    if (fuse && blockIdx.y == 0) {
      grid_dependency_wait();
      indexer_select::write_all<kScoreThreads>(p, n, p.out + int64_t(row) * p.out_stride);
    }
    return;
  }
  const int64_t k0 = int64_t(blockIdx.y) * chunk;
  if (k0 >= n) return;
  const int64_t k1 = k0 + chunk < n ? k0 + chunk : n;
  const int n_tiles = int((k1 - k0 + kTileKeys - 1) / kTileKeys);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  // Thread tid copies 16-byte piece tid % kPieces of rows it * kRowStep + tid / kPieces of each tile;
  // their pages are loaded one tile ahead so the page-table reads overlap the tensor-core work. FP8: the
  // thread with piece 0 also copies the row's scale.
  static_assert(kStages == 2, "the page prefetch below looks one tile ahead");
  constexpr int kPieces = FP8 ? kIndexerDim / 16 : kIndexerDim * 2 / 16;
  constexpr int kRowStep = kScoreThreads / kPieces;
  constexpr int kRowsPerThread = kTileKeys / kRowStep;
  auto fetch_pages = [&](int u, int32_t(&pg)[kRowsPerThread]) {
#pragma unroll
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int64_t pos = k0 + int64_t(u) * kTileKeys + it * kRowStep + tid / kPieces;
      pg[it] = u < n_tiles && pos < k1 && pos / p.page_size < p.pt_cols
                   ? p.page_table[seq * p.pt_stride + pos / p.page_size]
                   : -1;
    }
  };
  auto issue = [&](int u, int st, const int32_t(&pg)[kRowsPerThread]) {
    const int c = tid % kPieces;
    unsigned char* stage = sStage + st * stage_bytes<FP8>();
#pragma unroll
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int r = it * kRowStep + tid / kPieces;
      const int64_t pos = k0 + int64_t(u) * kTileKeys + r;
      const int64_t slot = int64_t(pg[it]) * p.page_size + pos % p.page_size;
      const bool ok = pg[it] >= 0 && pos < k1 && slot < p.num_slots;
      if constexpr (FP8) {
        const unsigned char* src = ok ? cache + slot * kIndexerDim + c * 16 : cache;
        mma::cp_async16(stage + r * kLdK8 + c * 16, src, ok ? 16 : 0);
        if (c == 0) {
          const unsigned char* ssrc = ok ? cache + p.num_slots * kIndexerDim + slot * 4 : cache;
          cp_async4(stage + kTileKeys * kLdK8 + r * 4, ssrc, ok ? 4 : 0);
        }
      } else {
        const unsigned char* src = ok ? cache + slot * (kIndexerDim * 2) + c * 16 : cache;
        mma::cp_async16(stage + (r * kLdK + c * 8) * 2, src, ok ? 16 : 0);
      }
    }
  };
  int32_t pg_next[kRowsPerThread];
  fetch_pages(0, pg_next);
  issue(0, 0, pg_next);
  mma::cp_async_commit();
  fetch_pages(1, pg_next);

  for (int i = tid; i < kIndexerHistBins; i += kScoreThreads) sHist[i] = 0;
  for (int i = tid; i < H * kIndexerDim; i += kScoreThreads) {
    const int h = i / kIndexerDim, L = i % kIndexerDim;
    sQ[h * kLdK + L] = __float2bfloat16_rn(p.q[row * p.q_s0 + h * p.q_s1 + (FP8 ? fp8_dim_of(L) : L)]);
  }
  if (tid < H) sW[tid] = p.w[row * p.w_s0 + tid] * p.weight_scale;
  __syncthreads();

  // B fragments of Q^T (k = dims, n = heads) for every k-step, kept in registers.
  uint32_t bq[NT][kIndexerDim / 16][2];
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
#pragma unroll
    for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
      uint32_t b[4];
      mma::ldsm_x4(b,
                   sQ + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kLdK + kk * 16 + ((lane >> 3) & 1) * 8);
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
  // Launched as a programmatic dependent of the offsets kernel (packed scores): everything above reads
  // only what was written before that kernel started; the offsets and everything below come after this.
  grid_dependency_wait();
  float* srow = indexer_row_scores(p, row);

  for (int t = 0; t < n_tiles; ++t) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + 1 < n_tiles) issue(t + 1, (t + 1) % kStages, pg_next);
    mma::cp_async_commit();
    fetch_pages(t + 2, pg_next);
    const unsigned char* stage = sStage + (t % kStages) * stage_bytes<FP8>();
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    float sc0 = scale, sc1 = scale;  // per key row g and g + 8 of this warp
    if constexpr (FP8) {
      // Rows warp * 16 + g and + 8: bytes [32 c4, 32 c4 + 32), word kk = the A fragment of k-step kk.
      const unsigned char* r0 = stage + (warp * 16 + g) * kLdK8 + c4 * 32;
      const unsigned char* r1 = r0 + 8 * kLdK8;
      const uint4 x0 = *reinterpret_cast<const uint4*>(r0), x1 = *reinterpret_cast<const uint4*>(r0 + 16);
      const uint4 y0 = *reinterpret_cast<const uint4*>(r1), y1 = *reinterpret_cast<const uint4*>(r1 + 16);
      const uint32_t w0[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const uint32_t w1[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
      const float* ks = reinterpret_cast<const float*>(stage + kTileKeys * kLdK8);
      sc0 = scale * ks[warp * 16 + g];
      sc1 = scale * ks[warp * 16 + g + 8];
#pragma unroll
      for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
        const uint32_t a[4] = {e4m3x2_to_bf16x2(uint16_t(w0[kk])), e4m3x2_to_bf16x2(uint16_t(w1[kk])),
                               e4m3x2_to_bf16x2(uint16_t(w0[kk] >> 16)),
                               e4m3x2_to_bf16x2(uint16_t(w1[kk] >> 16))};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma::mma_bf16(acc[nt], a, bq[nt][kk][0], bq[nt][kk][1]);
      }
    } else {
      const __nv_bfloat16* kt = reinterpret_cast<const __nv_bfloat16*>(stage);
#pragma unroll
      for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
        uint32_t a[4];
        mma::ldsm_x4(a, kt + (warp * 16 + (lane & 15)) * kLdK + kk * 16 + (lane >> 4) * 8);
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
  }
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

int num_sms() {
  static int n = [] {
    int dev = 0, v = 132;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      v = 132;
    }
    return v;
  }();
  return n;
}

template <int H, bool FP8>
cudaError_t launch_scores(const IndexerTopkParams& p, bool fuse, cudaStream_t stream) {
  const size_t smem =
      size_t(kStages) * stage_bytes<FP8>() + size_t(H) * kLdK * 2 + H * 4 + kIndexerHistBins * 4;
  static const cudaError_t e = cudaFuncSetAttribute(sm90_indexer_score_kernel<H, FP8>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
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
  return launch_pdl(programmatic, sm90_indexer_score_kernel<H, FP8>, grid, dim3(kScoreThreads), smem, stream,
                    p, chunk, fuse);
}

}  // namespace

int indexer_num_sms() { return num_sms(); }

cudaError_t launch_indexer_topk_fused(const IndexerTopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if ((p.heads != 32 && p.heads != 64) || p.topk < 1 || p.out_k > p.topk ||
      (!p.score_offsets && p.score_stride % 4 != 0) || p.splits < 1 || p.splits * p.split_len < p.max_len)
    return cudaErrorInvalidValue;
  const bool fuse = indexer_select_path(p) == IndexerSelectPath::row_fused;  // implies max_len > topk
  if (p.max_len > p.topk) {
    // The histograms and (splits == 1) the row_done counters, contiguous.
    cudaError_t e = cudaMemsetAsync(p.hist, 0, size_t(indexer_zeroed_words(p.rows, p.splits)) * 4, stream);
    if (e != cudaSuccess) return e;
    e = launch_indexer_score_offsets(p, stream);
    if (e != cudaSuccess) return e;
    const bool fp8 = p.key_format == IndexerKeyFormat::fp8_e4m3;
    if (p.heads == 32) {
      e = fp8 ? launch_scores<32, true>(p, fuse, stream) : launch_scores<32, false>(p, fuse, stream);
    } else {
      e = fp8 ? launch_scores<64, true>(p, fuse, stream) : launch_scores<64, false>(p, fuse, stream);
    }
    if (e != cudaSuccess) return e;
  }
  if (p.scores_only || fuse) return cudaSuccess;  // fused: the score kernel selected
  return launch_indexer_select(p, stream);
}

}  // namespace dsaserve::kernels::cuda
