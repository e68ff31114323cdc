// The DSA indexer, plainly: a score kernel (query row in shared memory, one warp per key) and a per-row
// top-k by radix select on the scores' sortable bit patterns (ties toward the lower position), written
// out in ascending position order with a block scan.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/attention/attention_params.h"
#include "kernels/cuda/common/device_util.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kScoreWarps = 8;
constexpr int kKeysPerBlock = 64;
constexpr int kMaxIdPerLane = 8;  // index_head_dim <= 256
constexpr int kTopkThreads = 1024;

// grid (tokens, ceil(S / kKeysPerBlock)); dynamic shared memory: q row [ih * id] + w row [ih].
__global__ void __launch_bounds__(kScoreWarps * 32) sm90_indexer_score_kernel(IndexerScoreParams p) {
  extern __shared__ float smem[];
  float* qs = smem;
  float* ws = smem + p.ih * p.id;
  const int64_t t = blockIdx.x;
  const int64_t last = p.start_pos + t;  // visible keys 0..last
  const int64_t s0 = int64_t(blockIdx.y) * kKeysPerBlock;
  if (s0 > last) return;
  for (int64_t i = threadIdx.x; i < p.ih * p.id; i += blockDim.x) {
    qs[i] = p.q[t * p.q_s0 + (i / p.id) * p.q_s1 + i % p.id];
  }
  for (int64_t i = threadIdx.x; i < p.ih; i += blockDim.x) ws[i] = p.w[t * p.w_s0 + i] * p.weight_scale;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t S = p.start_pos + p.tokens;
  for (int64_t s = s0 + warp; s < s0 + kKeysPerBlock && s <= last; s += kScoreWarps) {
    const int64_t slot = int64_t(p.page_table[s / p.page_size]) * p.page_size + s % p.page_size;
    float k[kMaxIdPerLane];
    const bool ok = slot >= 0 && slot < p.num_slots;
#pragma unroll
    for (int j = 0; j < kMaxIdPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      k[j] = ok && d < p.id ? p.cache[slot * p.cache_stride + d] : 0.0f;
    }
    float acc = 0.0f;
    for (int64_t h = 0; h < p.ih; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxIdPerLane; ++j) {
        const int64_t d = lane + 32 * j;
        if (d < p.id) part += qs[h * p.id + d] * k[j];
      }
      const float dd = warp_sum(part) * p.scale;
      if (dd > 0.0f) acc += dd * ws[h];
    }
    if (lane == 0) p.score[t * S + s] = acc;
  }
}

// Ascending order of floats as unsigned keys.
__device__ __forceinline__ uint32_t sortable(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One block per row.
__global__ void __launch_bounds__(kTopkThreads) sm90_indexer_topk_kernel(TopkParams p) {
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_remaining;
  __shared__ int sh_base;
  const int64_t t = blockIdx.x;
  const int64_t n = p.start_pos + t + 1;
  int32_t* out = p.out + t * p.out_k;
  if (n <= p.k) {
    for (int64_t j = threadIdx.x; j < p.out_k; j += blockDim.x) out[j] = j < n ? int32_t(j) : -1;
    return;
  }
  const float* sc = p.score + t * p.S;
  // Radix select of the k-th largest key, 8 bits at a time from the top.
  uint32_t prefix = 0, mask = 0;
  int remaining = int(p.k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = sortable(sc[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= remaining) break;
        above += hist[b];
      }
      sh_remaining = remaining - above;
      sh_prefix = prefix | (uint32_t(b) << shift);
    }
    __syncthreads();
    remaining = sh_remaining;
    prefix = sh_prefix;
    mask |= 0xffu << shift;
    __syncthreads();
  }
  // prefix is the k-th largest key; take every larger key and the first `remaining` equal ones.
  if (threadIdx.x == 0) sh_base = 0;
  int eq_seen = 0;  // equal keys before this chunk (kept identical in every thread)
  __syncthreads();
  for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const uint32_t key = i < n ? sortable(sc[i]) : 0u;
    const int is_eq = (i < n && key == prefix) ? 1 : 0;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(is_eq, eq_before, eq_total);
    __syncthreads();
    const int take = (i < n && (key > prefix || (is_eq && eq_seen + eq_before < remaining))) ? 1 : 0;
    int pos, total;
    Scan(scan_tmp).ExclusiveSum(take, pos, total);
    if (take) out[sh_base + pos] = int32_t(i);
    __syncthreads();
    if (threadIdx.x == 0) sh_base += total;
    eq_seen += eq_total;
    __syncthreads();
  }
  for (int64_t j = sh_base + threadIdx.x; j < p.out_k; j += blockDim.x) out[j] = -1;
}

}  // namespace

cudaError_t launch_indexer_scores(const IndexerScoreParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.id > 32 * kMaxIdPerLane || p.tokens > 0x7fffffff) return cudaErrorInvalidValue;
  const int64_t S = p.start_pos + p.tokens;
  const int64_t by = (S + kKeysPerBlock - 1) / kKeysPerBlock;
  if (by > 65535) return cudaErrorInvalidValue;
  const size_t smem = size_t(p.ih * p.id + p.ih) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(sm90_indexer_score_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  sm90_indexer_score_kernel<<<dim3(unsigned(p.tokens), unsigned(by)), kScoreWarps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_indexer_topk(const TopkParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  sm90_indexer_topk_kernel<<<unsigned(p.tokens), kTopkThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
