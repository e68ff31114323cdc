// Lightning indexer scores (tensor cores, fused first radix histogram) and the exact top-k select.
#include <cuda_bf16.h>

#include "kernels/cuda/indexer_topk_params.h"
#include "kernels/cuda/sm90_mma.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kScoreThreads = 256;
constexpr int kTileKeys = 128;  // 8 warps x 16 keys
constexpr int kStages = 2;
constexpr int kLdK = kIndexerDim + 8;  // bf16 per shared row: 272 bytes, ldmatrix conflict-free
constexpr int kSelectThreads = 1024;
constexpr int kCandCap = 49152;  // candidates of the threshold bin kept in shared memory (192 KB)

// Order-preserving map of a float to u32 (larger float -> larger key; -0 was normalised to +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int H>
__global__ void __launch_bounds__(kScoreThreads, H == 32 ? 2 : 1)
    sm90_indexer_score_kernel(const IndexerTopkParams p, int chunk) {
  constexpr int NT = H / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* sQ = sK + kStages * kTileKeys * kLdK;
  float* sW = reinterpret_cast<float*>(sQ + H * kLdK);
  uint32_t* sHist = reinterpret_cast<uint32_t*>(sW + H);

  // Rows on grid x (up to 2^31 - 1: a batched prefill can pass more than 65,535 rows), key chunks on y.
  const int row = blockIdx.x;
  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  const int64_t n = seq >= 0 && seq < p.num_seqs ? p.row_len[row] : 0;
  if (n <= p.topk) return;  // the select kernel lists every position
  const int64_t k0 = int64_t(blockIdx.y) * chunk;
  if (k0 >= n) return;
  const int64_t k1 = k0 + chunk < n ? k0 + chunk : n;
  const int n_tiles = int((k1 - k0 + kTileKeys - 1) / kTileKeys);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  // Thread tid copies 16 bytes of rows it * 16 + tid / 16 of each tile; their pages are loaded one
  // tile ahead so the page-table reads overlap the tensor-core work.
  static_assert(kStages == 2, "the page prefetch below looks one tile ahead");
  constexpr int kRowsPerThread = kTileKeys / 16;
  auto fetch_pages = [&](int u, int32_t(&pg)[kRowsPerThread]) {
#pragma unroll
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int64_t pos = k0 + int64_t(u) * kTileKeys + it * 16 + (tid >> 4);
      pg[it] = u < n_tiles && pos < k1 && pos / p.page_size < p.pt_cols
                   ? p.page_table[seq * p.pt_stride + pos / p.page_size]
                   : -1;
    }
  };
  auto issue = [&](int u, int st, const int32_t(&pg)[kRowsPerThread]) {
    const int c = tid & 15;
#pragma unroll
    for (int it = 0; it < kRowsPerThread; ++it) {
      const int r = it * 16 + (tid >> 4);
      const int64_t pos = k0 + int64_t(u) * kTileKeys + r;
      const int64_t slot = int64_t(pg[it]) * p.page_size + pos % p.page_size;
      const bool ok = pg[it] >= 0 && pos < k1 && slot < p.num_slots;
      const unsigned char* src = ok ? cache + slot * (kIndexerDim * 2) + c * 16 : cache;
      mma::cp_async16(sK + (st * kTileKeys + r) * kLdK + c * 8, src, ok ? 16 : 0);
    }
  };
  int32_t pg_next[kRowsPerThread];
  fetch_pages(0, pg_next);
  issue(0, 0, pg_next);
  mma::cp_async_commit();
  fetch_pages(1, pg_next);

  for (int i = tid; i < kIndexerHistBins; i += kScoreThreads) sHist[i] = 0;
  for (int i = tid; i < H * (kIndexerDim / 4); i += kScoreThreads) {
    const int h = i / (kIndexerDim / 4), c = (i % (kIndexerDim / 4)) * 4;
    const float* src = p.q + row * p.q_s0 + h * p.q_s1 + c;
    uint2 v;
    v.x = mma::pack_bf16(src[0], src[1]);
    v.y = mma::pack_bf16(src[2], src[3]);
    *reinterpret_cast<uint2*>(sQ + h * kLdK + c) = v;
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
  float* srow = p.scores + int64_t(row) * p.score_stride;

  for (int t = 0; t < n_tiles; ++t) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + 1 < n_tiles) issue(t + 1, (t + 1) % kStages, pg_next);
    mma::cp_async_commit();
    fetch_pages(t + 2, pg_next);
    const __nv_bfloat16* kt = sK + (t % kStages) * kTileKeys * kLdK;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kIndexerDim / 16; ++kk) {
      uint32_t a[4];
      mma::ldsm_x4(a, kt + (warp * 16 + (lane & 15)) * kLdK + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma::mma_bf16(acc[nt], a, bq[nt][kk][0], bq[nt][kk][1]);
    }
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s0 += fmaxf(acc[nt][0] * scale, 0.f) * wl[nt][0] + fmaxf(acc[nt][1] * scale, 0.f) * wl[nt][1];
      s1 += fmaxf(acc[nt][2] * scale, 0.f) * wl[nt][0] + fmaxf(acc[nt][3] * scale, 0.f) * wl[nt][1];
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
  __syncthreads();
  uint32_t* ghist = p.hist + int64_t(row) * kIndexerHistBins;
  for (int i = tid; i < kIndexerHistBins; i += kScoreThreads) {
    if (sHist[i]) atomicAdd(&ghist[i], sHist[i]);
  }
}

// Inclusive block scan of one u32 per thread (kSelectThreads threads); also returns the total.
__device__ uint32_t block_scan(uint32_t v, uint32_t* scratch, uint32_t& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint32_t s = scratch[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    scratch[lane] = s;
  }
  __syncthreads();
  total = scratch[31];
  const uint32_t r = v + (warp > 0 ? scratch[warp - 1] : 0u);
  __syncthreads();
  return r;
}

// Finds bin b of hist[nb] (nb a multiple of kSelectThreads) with above(b) < need <= above(b) + hist[b],
// above(b) = sum of the bins above b. Result in res[0] (bin), res[1] (above).
__device__ void select_bin(const uint32_t* hist, int nb, uint32_t need, uint32_t* scratch, uint32_t* res) {
  const int per = nb / kSelectThreads;
  const int top = nb - 1 - int(threadIdx.x) * per;  // this thread's bins: top, top-1, ...
  uint32_t local = 0;
  for (int j = 0; j < per; ++j) local += hist[top - j];
  uint32_t total;
  uint32_t above = block_scan(local, scratch, total) - local;
  for (int j = 0; j < per; ++j) {
    const uint32_t h = hist[top - j];
    if (above < need && above + h >= need) {
      res[0] = uint32_t(top - j);
      res[1] = above;
    }
    above += h;
  }
  __syncthreads();
}

// keys[j] = order_key(srow[i0 + j]) for the 16 scores from i0 (16-byte loads; past n: 0).
__device__ __forceinline__ void load_keys16(const float* srow, int64_t i0, int64_t n, uint32_t (&keys)[16]) {
  if (i0 + 16 <= n) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = *reinterpret_cast<const float4*>(srow + i0 + 4 * v);
      keys[4 * v] = order_key(f.x);
      keys[4 * v + 1] = order_key(f.y);
      keys[4 * v + 2] = order_key(f.z);
      keys[4 * v + 3] = order_key(f.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) keys[j] = i0 + j < n ? order_key(srow[i0 + j]) : 0u;
  }
}

__global__ void __launch_bounds__(kSelectThreads) sm90_indexer_select_kernel(const IndexerTopkParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint32_t* sHist = reinterpret_cast<uint32_t*>(smem);
  uint32_t* sCand = sHist + kIndexerHistBins;
  __shared__ uint32_t scratch[32];
  __shared__ uint32_t res[2];
  __shared__ uint32_t cand_count;

  const int row = blockIdx.x, tid = threadIdx.x;
  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  const int64_t n = seq >= 0 && seq < p.num_seqs ? p.row_len[row] : 0;
  int32_t* out = p.out + int64_t(row) * p.out_stride;
  const uint32_t K = uint32_t(p.topk);
  if (n <= p.topk) {
    for (int64_t j = tid; j < p.out_k; j += kSelectThreads) out[j] = j < n ? int32_t(j) : -1;
    return;
  }
  const float* srow = p.scores + int64_t(row) * p.score_stride;
  const uint32_t* ghist = p.hist + int64_t(row) * kIndexerHistBins;

  // Digit 1 (bits 31..21) from the score kernel's histogram.
  for (int i = tid; i < kIndexerHistBins; i += kSelectThreads) sHist[i] = ghist[i];
  if (tid == 0) cand_count = 0;
  __syncthreads();
  select_bin(sHist, kIndexerHistBins, K, scratch, res);
  const uint32_t b1 = res[0], above1 = res[1];
  const uint32_t n_cand = sHist[b1];
  const bool in_smem = n_cand <= uint32_t(kCandCap);
  __syncthreads();

  // Candidates: the keys of bin b1 (kept in shared memory when they fit).
  if (in_smem) {
    for (int64_t i0 = int64_t(tid) * 16; i0 < n; i0 += 16 * kSelectThreads) {
      uint32_t keys[16];
      load_keys16(srow, i0, n, keys);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (i0 + j < n && (keys[j] >> 21) == b1) sCand[atomicAdd(&cand_count, 1u)] = keys[j];
      }
    }
  }
  // Digits 2 (bits 20..10) and 3 (bits 9..0) among the candidates.
  auto histogram = [&](int shift, uint32_t mask, uint32_t prefix, int prefix_shift, int nb) {
    for (int i = tid; i < nb; i += kSelectThreads) sHist[i] = 0;
    __syncthreads();
    if (in_smem) {
      for (uint32_t i = tid; i < n_cand; i += kSelectThreads) {
        const uint32_t key = sCand[i];
        if ((key >> prefix_shift) == prefix) atomicAdd(&sHist[(key >> shift) & mask], 1u);
      }
    } else {
      for (int64_t i0 = int64_t(tid) * 16; i0 < n; i0 += 16 * kSelectThreads) {
        uint32_t keys[16];
        load_keys16(srow, i0, n, keys);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (i0 + j < n && (keys[j] >> prefix_shift) == prefix)
            atomicAdd(&sHist[(keys[j] >> shift) & mask], 1u);
        }
      }
    }
    __syncthreads();
  };
  histogram(10, 0x7ffu, b1, 21, 2048);
  select_bin(sHist, 2048, K - above1, scratch, res);
  const uint32_t b2 = res[0], above2 = res[1];
  const uint32_t prefix2 = (b1 << 11) | b2;
  histogram(0, 0x3ffu, prefix2, 10, 1024);
  select_bin(sHist, 1024, K - above1 - above2, scratch, res);
  const uint32_t b3 = res[0], above3 = res[1];
  const uint32_t tau = (prefix2 << 10) | b3;
  const uint32_t take_eq = K - above1 - above2 - above3;  // >= 1 keys equal to tau, lowest positions first

  // Ordered pass: positions with key > tau, and the first take_eq with key == tau.
  uint32_t gt_run = 0, eq_run = 0;
  for (int64_t base = 0; base < n; base += 16 * kSelectThreads) {
    const int64_t i0 = base + 16 * tid;
    uint32_t keys[16];
    load_keys16(srow, i0, n, keys);
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      gt += (i0 + j < n && keys[j] > tau) ? 1u : 0u;
      eq += (i0 + j < n && keys[j] == tau) ? 1u : 0u;
    }
    const uint32_t packed = gt | (eq << 16);  // block totals <= 16384 per field
    uint32_t total;
    const uint32_t excl = block_scan(packed, scratch, total) - packed;
    uint32_t gt_before = gt_run + (excl & 0xffffu), eq_before = eq_run + (excl >> 16);
    if (gt + eq > 0) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (i0 + j >= n) break;
        if (keys[j] > tau) {
          out[gt_before + (eq_before < take_eq ? eq_before : take_eq)] = int32_t(i0 + j);
          ++gt_before;
        } else if (keys[j] == tau) {
          if (eq_before < take_eq) out[gt_before + eq_before] = int32_t(i0 + j);
          ++eq_before;
        }
      }
    }
    gt_run += total & 0xffffu;
    eq_run += total >> 16;
  }
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

template <int H>
cudaError_t launch_scores(const IndexerTopkParams& p, cudaStream_t stream) {
  const size_t smem =
      size_t(kStages) * kTileKeys * kLdK * 2 + size_t(H) * kLdK * 2 + H * 4 + kIndexerHistBins * 4;
  static const cudaError_t e = cudaFuncSetAttribute(sm90_indexer_score_kernel<H>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const int64_t tiles = (p.max_len + kTileKeys - 1) / kTileKeys;
  int64_t per = (p.rows * tiles + 2 * num_sms() - 1) / (2 * num_sms());
  if (per < 2) per = 2;
  if (per > tiles) per = tiles;
  const int chunk = int(per * kTileKeys);
  const int64_t chunks = (p.max_len + chunk - 1) / chunk;
  if (chunks > 65535 || p.rows > 2147483647) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(p.rows), unsigned(chunks));
  sm90_indexer_score_kernel<H><<<grid, kScoreThreads, smem, stream>>>(p, chunk);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_indexer_topk_fused(const IndexerTopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if ((p.heads != 32 && p.heads != 64) || p.topk < 1 || p.out_k > p.topk || p.score_stride % 4 != 0)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(p.hist, 0, size_t(p.rows) * kIndexerHistBins * 4, stream);
  if (e != cudaSuccess) return e;
  if (p.max_len > p.topk) {
    e = p.heads == 32 ? launch_scores<32>(p, stream) : launch_scores<64>(p, stream);
    if (e != cudaSuccess) return e;
  }
  if (p.scores_only) return cudaSuccess;
  const size_t smem = size_t(kIndexerHistBins + kCandCap) * 4;
  static const cudaError_t attr = cudaFuncSetAttribute(
      sm90_indexer_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attr != cudaSuccess) return attr;
  sm90_indexer_select_kernel<<<unsigned(p.rows), kSelectThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
