#pragma once
// Device helpers of the exact indexer top-k select (indexer_topk_params.h), templated on the CTA size T
// (a multiple of 32 dividing 1024): the select kernels run them with 1024 threads, the score kernel's
// fused row select (IndexerSelectPath::row_fused) with its 256. Every helper is called by all T threads.
#include "kernels/cuda/indexer/indexer_topk_params.h"

namespace dsaserve::kernels::cuda::indexer_select {

inline constexpr int kPerThread = 16;  // keys per thread per sweep step

// Order-preserving map of a float to u32 (the score kernel normalised -0 to +0).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Inclusive block scan of one u32 per thread (T threads); also returns the total. scratch: 32 words.
template <int T>
__device__ __forceinline__ uint32_t block_scan(uint32_t v, uint32_t* scratch, uint32_t& total) {
  static_assert(T % 32 == 0 && T <= 1024, "whole warps, at most 32");
  constexpr int W = T / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint32_t s = lane < W ? scratch[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    scratch[lane] = s;
  }
  __syncthreads();
  total = scratch[W - 1];
  const uint32_t r = v + (warp > 0 ? scratch[warp - 1] : 0u);
  __syncthreads();
  return r;
}

// Finds bin b of hist[nb] (nb a multiple of T) with above(b) < need <= above(b) + hist[b], above(b) = sum
// of the bins above b. Result in res[0] (bin), res[1] (above); ends with a barrier.
template <int T>
__device__ __forceinline__ void select_bin(const uint32_t* hist, int nb, uint32_t need, uint32_t* scratch,
                                           uint32_t* res) {
  const int per = nb / T;
  const int top = nb - 1 - int(threadIdx.x) * per;  // this thread's bins: top, top-1, ...
  uint32_t local = 0;
  for (int j = 0; j < per; ++j) local += hist[top - j];
  uint32_t total;
  uint32_t above = block_scan<T>(local, scratch, total) - local;
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

// keys[j] = order_key(srow[i0 + j]) for the 16 scores from i0 (16-byte L2 loads: other CTAs of the same
// launch may have written them; from `end` on: 0).
__device__ __forceinline__ void load_keys16(const float* srow, int64_t i0, int64_t end,
                                            uint32_t (&keys)[16]) {
  if (i0 + 16 <= end) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = __ldcg(reinterpret_cast<const float4*>(srow + i0 + 4 * v));
      keys[4 * v] = order_key(f.x);
      keys[4 * v + 1] = order_key(f.y);
      keys[4 * v + 2] = order_key(f.z);
      keys[4 * v + 3] = order_key(f.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) keys[j] = i0 + j < end ? order_key(__ldcg(srow + i0 + j)) : 0u;
  }
}

// f(key) for every key of positions [c0, c1) (c0 a multiple of 4), 16 per thread per step.
template <int T, class F>
__device__ __forceinline__ void sweep(const float* srow, int64_t c0, int64_t c1, F&& f) {
  for (int64_t i0 = c0 + int64_t(threadIdx.x) * kPerThread; i0 < c1; i0 += int64_t(T) * kPerThread) {
    uint32_t keys[16];
    load_keys16(srow, i0, c1, keys);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (i0 + j < c1) f(keys[j]);
    }
  }
}

// Adds the nb bins of sHist to the global histogram g (nonzero bins only).
template <int T>
__device__ __forceinline__ void flush_hist(const uint32_t* sHist, uint32_t* g, int nb) {
  for (int i = threadIdx.x; i < nb; i += T) {
    if (sHist[i]) atomicAdd(&g[i], sHist[i]);
  }
}

// Copies nb bins of the global histogram g into sHist (L2 loads: other CTAs of the same launch may have
// added to g), then select_bin(need).
template <int T>
__device__ __forceinline__ void load_select(const uint32_t* g, int nb, uint32_t need, uint32_t* sHist,
                                            uint32_t* scratch, uint32_t* res) {
  for (int i = threadIdx.x; i < nb; i += T) sHist[i] = __ldcg(g + i);
  __syncthreads();
  select_bin<T>(sHist, nb, need, scratch, res);
}

// sHist[0..nb) = histogram of (key >> shift) & (nb - 1) over the keys of [c0, c1) with key >> match_shift
// == match. Starts and ends with a barrier.
template <int T>
__device__ __forceinline__ void hist_digit(const float* srow, int64_t c0, int64_t c1, int match_shift,
                                           uint32_t match, int shift, int nb, uint32_t* sHist) {
  __syncthreads();
  for (int i = threadIdx.x; i < nb; i += T) sHist[i] = 0;
  __syncthreads();
  const uint32_t mask = uint32_t(nb - 1);
  sweep<T>(srow, c0, c1, [&](uint32_t key) {
    if ((key >> match_shift) == match) atomicAdd(&sHist[(key >> shift) & mask], 1u);
  });
  __syncthreads();
}

// Writes the selected positions of [c0, c1) in order: keys > tau, and keys == tau while fewer than
// take_eq of them come before (over the row). gt_run / eq_run: such keys of the row before c0.
template <int T>
__device__ __forceinline__ void write_selected(const float* srow, int64_t c0, int64_t c1, uint32_t tau,
                                               uint32_t take_eq, uint32_t gt_run, uint32_t eq_run,
                                               int32_t* out, uint32_t* scratch) {
  constexpr int64_t kStep = int64_t(T) * kPerThread;
  for (int64_t base = c0; base < c1; base += kStep) {
    const int64_t i0 = base + int64_t(threadIdx.x) * kPerThread;
    uint32_t keys[16];
    load_keys16(srow, i0, c1, keys);
    uint32_t gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      gt += (i0 + j < c1 && keys[j] > tau) ? 1u : 0u;
      eq += (i0 + j < c1 && keys[j] == tau) ? 1u : 0u;
    }
    const uint32_t packed = gt | (eq << 16);  // block totals <= 16384 per field
    uint32_t total;
    const uint32_t excl = block_scan<T>(packed, scratch, total) - packed;
    uint32_t gt_before = gt_run + (excl & 0xffffu), eq_before = eq_run + (excl >> 16);
    if (gt + eq > 0) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (i0 + j >= c1) break;
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

// The visible keys of `row` (0 for a row naming no valid sequence).
__device__ __forceinline__ int64_t row_keys(const IndexerTopkParams& p, int row) {
  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  return seq >= 0 && seq < p.num_seqs ? p.row_len[row] : 0;
}

// Rows of at most topk keys: every position, then -1.
template <int T>
__device__ __forceinline__ void write_all(const IndexerTopkParams& p, int64_t n, int32_t* out) {
  for (int64_t j = threadIdx.x; j < p.out_k; j += T) out[j] = j < n ? int32_t(j) : -1;
}

// The whole select of one row of n > topk keys by one CTA in shared memory: digit 1 from the row's
// histogram ghist (2048 bins, complete), digits 2 and 3 by two sweeps, then the ordered write.
// sHist: 2048 words, scratch: 32, res: 2 (shared). Starts with a barrier (sHist may be in use).
template <int T>
__device__ __forceinline__ void select_row(const IndexerTopkParams& p, const uint32_t* ghist,
                                           const float* srow, int64_t n, int32_t* out, uint32_t* sHist,
                                           uint32_t* scratch, uint32_t* res) {
  __syncthreads();
  const uint32_t K = uint32_t(p.topk);
  load_select<T>(ghist, kIndexerHistBins, K, sHist, scratch, res);
  const uint32_t b1 = res[0], above1 = res[1];
  hist_digit<T>(srow, 0, n, 21, b1, 10, kIndexerHistBins, sHist);
  select_bin<T>(sHist, kIndexerHistBins, K - above1, scratch, res);
  const uint32_t prefix = (b1 << 11) | res[0], above2 = above1 + res[1];
  hist_digit<T>(srow, 0, n, 10, prefix, 0, 1024, sHist);
  select_bin<T>(sHist, 1024, K - above2, scratch, res);
  const uint32_t tau = (prefix << 10) | res[0], take_eq = K - above2 - res[1];
  write_selected<T>(srow, 0, n, tau, take_eq, 0, 0, out, scratch);
}

}  // namespace dsaserve::kernels::cuda::indexer_select
