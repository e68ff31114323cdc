// The exact top-k select of the lightning indexer: four radix passes over the f32 scores, each a grid of
// rows x splits CTAs that merge histograms and counts through global memory (indexer_topk_params.h), so
// that a few rows with long contexts spread over many SMs.
#include <cooperative_groups.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/cuda/indexer/sm90_indexer_select.cuh"

namespace dsaserve::kernels::cuda {

namespace {

using namespace indexer_select;

constexpr int kThreads = 1024;
constexpr int64_t kSweep = int64_t(kThreads) * kPerThread;  // 16384 keys: also the split unit
constexpr int kHist2 = kIndexerHistBins;                    // offsets of digits 2 and 3 in a row's hist
constexpr int kHist3 = 2 * kIndexerHistBins;

// splits == 1: one CTA per row runs all four passes in shared memory (hist: digit 1 only, row stride 2048).
// Launched as a programmatic dependent of the score kernel (which triggers after its last tile): it may
// start while the score grid drains, and waits (griddepcontrol.wait: that grid finished, its writes
// visible) before reading anything. Without the launch attribute the wait is a no-op.
__global__ void __launch_bounds__(kThreads) sm90_indexer_select_row_kernel(const IndexerTopkParams p) {
  __shared__ uint32_t sHist[kIndexerHistBins];
  __shared__ uint32_t scratch[32];
  __shared__ uint32_t res[2];
  pdl_enter();
  const int row = blockIdx.x;
  const int64_t n = row_keys(p, row);
  int32_t* out = p.out + int64_t(row) * p.out_stride;
  if (n <= p.topk) return write_all<kThreads>(p, n, out);
  select_row<kThreads>(p, p.hist + int64_t(row) * kIndexerHistBins, indexer_row_scores(p, row), n, out, sHist,
                       scratch, res);
}

// splits > 1: pass PASS (0..3 = passes 1..4 of indexer_topk_params.h) for CTA (row, split); hist row
// stride kIndexerHistWords. Reads what earlier passes wrote (state, histograms, counts) through L2, so
// that it also holds after a grid barrier inside one launch. Starts with a barrier (sHist may be in use).
template <int PASS>
__device__ void select_pass(const IndexerTopkParams& p, int row, int split, uint32_t* sHist,
                            uint32_t* scratch, uint32_t* res) {
  __syncthreads();
  const int tid = threadIdx.x;
  const int64_t n = row_keys(p, row);
  int32_t* out = p.out + int64_t(row) * p.out_stride;
  if (n <= p.topk) {  // written once, by the last pass's first CTA
    if (PASS == 3 && split == 0) write_all<kThreads>(p, n, out);
    return;
  }
  const int64_t c0 = int64_t(split) * p.split_len;
  if (c0 >= n) return;
  const int64_t c1 = c0 + p.split_len < n ? c0 + p.split_len : n;
  const uint32_t K = uint32_t(p.topk);
  const float* srow = indexer_row_scores(p, row);
  uint32_t* hist = p.hist + int64_t(row) * kIndexerHistWords;
  IndexerSelectState* st = p.state + row;
  const bool writer = split == 0 && tid == 0;

  if constexpr (PASS == 0) {
    // Digit 1 from the score kernel's histogram; histogram digit 2 of the keys in its bin.
    load_select<kThreads>(hist, kIndexerHistBins, K, sHist, scratch, res);
    const uint32_t b1 = res[0];
    if (writer) {
      st->b1 = b1;
      st->above1 = res[1];
    }
    hist_digit<kThreads>(srow, c0, c1, 21, b1, 10, kIndexerHistBins, sHist);
    flush_hist<kThreads>(sHist, hist + kHist2, kIndexerHistBins);
  } else if constexpr (PASS == 1) {
    // Digit 2; histogram digit 3 of the keys with the 22-bit prefix.
    const uint32_t b1 = __ldcg(&st->b1), above1 = __ldcg(&st->above1);
    load_select<kThreads>(hist + kHist2, kIndexerHistBins, K - above1, sHist, scratch, res);
    const uint32_t prefix = (b1 << 11) | res[0];
    if (writer) {
      st->prefix2 = prefix;
      st->above2 = above1 + res[1];
    }
    hist_digit<kThreads>(srow, c0, c1, 10, prefix, 0, 1024, sHist);
    flush_hist<kThreads>(sHist, hist + kHist3, 1024);
  } else if constexpr (PASS == 2) {
    // Digit 3: tau and take_eq; this CTA's keys above and equal to tau.
    const uint32_t prefix = __ldcg(&st->prefix2), above = __ldcg(&st->above2);
    load_select<kThreads>(hist + kHist3, 1024, K - above, sHist, scratch, res);
    const uint32_t tau = (prefix << 10) | res[0];
    if (writer) {
      st->tau = tau;
      st->take_eq = K - above - res[1];  // >= 1
    }
    uint32_t gt = 0, eq = 0;
    sweep<kThreads>(srow, c0, c1, [&](uint32_t key) {
      gt += key > tau ? 1u : 0u;
      eq += key == tau ? 1u : 0u;
    });
    uint32_t gt_total, eq_total;
    block_scan<kThreads>(gt, scratch, gt_total);
    block_scan<kThreads>(eq, scratch, eq_total);
    if (tid == 0) {
      uint32_t* c = p.counts + (int64_t(row) * p.splits + split) * 2;
      c[0] = gt_total;
      c[1] = eq_total;
    }
  } else {
    // Ordered write, after the keys of the CTAs before this one.
    const uint32_t tau = __ldcg(&st->tau), take_eq = __ldcg(&st->take_eq);
    if (tid < 32) {
      uint32_t g = 0, e = 0;
      for (int i = tid; i < split; i += 32) {
        const uint32_t* c = p.counts + (int64_t(row) * p.splits + i) * 2;
        g += __ldcg(c);
        e += __ldcg(c + 1);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, o);
        e += __shfl_xor_sync(0xffffffffu, e, o);
      }
      if (tid == 0) {
        res[0] = g;
        res[1] = e;
      }
    }
    __syncthreads();
    write_selected<kThreads>(srow, c0, c1, tau, take_eq, res[0], res[1], out, scratch);
  }
}

// The four passes as four launches (grid rows x splits), each a programmatic dependent of the one before
// (and the first of the score kernel) with KernelOptions::pdl (p.pdl).
template <int PASS>
__global__ void __launch_bounds__(kThreads) sm90_indexer_select_pass_kernel(const IndexerTopkParams p) {
  __shared__ uint32_t sHist[kIndexerHistBins];
  __shared__ uint32_t scratch[32];
  __shared__ uint32_t res[2];
  pdl_enter();
  select_pass<PASS>(p, blockIdx.x, blockIdx.y, sHist, scratch, res);
}

// The four passes in one cooperative launch: a 1-D grid of G <= rows x splits co-resident CTAs (the
// cooperative launch guarantees co-residency or fails); CTA b runs the virtual CTAs (row, split) = (v /
// splits, v % splits) for v = b, b + G, ... of each pass, and a grid barrier (which orders memory: the
// histogram atomics, state and counts of a pass are visible to every CTA after it) separates the passes.
// Same per-CTA work, same order of writes within a row: the output is identical to the four launches'.
__global__ void __launch_bounds__(kThreads) sm90_indexer_select_coop_kernel(const IndexerTopkParams p) {
  __shared__ uint32_t sHist[kIndexerHistBins];
  __shared__ uint32_t scratch[32];
  __shared__ uint32_t res[2];
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int64_t virt = p.rows * p.splits;
  auto each = [&](auto&& f) {
    for (int64_t v = blockIdx.x; v < virt; v += gridDim.x) f(int(v / p.splits), int(v % p.splits));
  };
  each([&](int row, int split) { select_pass<0>(p, row, split, sHist, scratch, res); });
  grid.sync();
  each([&](int row, int split) { select_pass<1>(p, row, split, sHist, scratch, res); });
  grid.sync();
  each([&](int row, int split) { select_pass<2>(p, row, split, sHist, scratch, res); });
  grid.sync();
  each([&](int row, int split) { select_pass<3>(p, row, split, sHist, scratch, res); });
}

// One CTA: exclusive prefix sum over the rows of each row's packed size (n > topk: n rounded up to 4).
// Lets the score kernel (a programmatic dependent) launch at once: it waits for this grid before it reads
// the offsets. Always an ordinary launch (it follows the workspace memset, which programmatic launches
// would not overlap): the score kernel's reads before its wait rely on it.
__global__ void __launch_bounds__(kThreads) sm90_indexer_offsets_kernel(const IndexerTopkParams p) {
  __shared__ int64_t warp_sums[32];
  __shared__ int64_t carry;
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < p.rows; base += kThreads) {
    const int64_t r = base + threadIdx.x;
    const int64_t n = r < p.rows ? row_keys(p, int(r)) : 0;
    const int64_t v = n > p.topk ? (n + 3) / 4 * 4 : 0;
    int64_t incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      int64_t s = warp_sums[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += y;
      }
      warp_sums[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    const int64_t before = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + incl - v;
    if (r < p.rows) p.score_offsets[r] = before;
    __syncthreads();  // everyone has read carry and warp_sums
    if (threadIdx.x == 0) carry += warp_sums[31];
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_indexer_score_offsets(const IndexerTopkParams& p, cudaStream_t stream) {
  if (p.rows == 0 || !p.score_offsets) return cudaSuccess;
  sm90_indexer_offsets_kernel<<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

int64_t indexer_select_splits(int64_t rows, int64_t max_len, int num_sms, int64_t* split_len) {
  const int64_t units = max_len > kSweep ? (max_len + kSweep - 1) / kSweep : 1;
  const int64_t target = 2 * int64_t(num_sms > 0 ? num_sms : 132);  // CTAs that fill the GPU twice
  int64_t want = rows >= target ? 1 : (target + rows - 1) / (rows > 0 ? rows : 1);
  if (want > units) want = units;
  const int64_t per = (units + want - 1) / want;
  *split_len = per * kSweep;
  return (units + per - 1) / per;
}

int64_t indexer_zeroed_words(int64_t rows, int64_t splits) {
  return splits <= 1 ? rows * (kIndexerHistBins + 1) : rows * kIndexerHistWords;
}

int64_t indexer_workspace_words(int64_t rows, int64_t splits) {
  if (splits <= 1) return rows * (kIndexerHistBins + 1);
  return rows * (kIndexerHistWords + int64_t(sizeof(IndexerSelectState) / 4)) + rows * splits * 2;
}

void indexer_workspace_pointers(IndexerTopkParams& p, uint32_t* words) {
  p.hist = words;
  p.state = nullptr;
  p.counts = nullptr;
  p.row_done = nullptr;
  if (p.splits <= 1) {
    p.row_done = words + p.rows * kIndexerHistBins;
    return;
  }
  p.state = reinterpret_cast<IndexerSelectState*>(words + p.rows * kIndexerHistWords);
  p.counts = words + p.rows * (kIndexerHistWords + int64_t(sizeof(IndexerSelectState) / 4));
}

int indexer_select_coop_capacity() {
  // Per device (device_cache.h): a value found on one GPU is not reused on another.
  return per_device_value(
      reinterpret_cast<const void*>(sm90_indexer_select_coop_kernel), +[]() -> int {
        int dev = 0, coop = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sm90_indexer_select_coop_kernel, kThreads,
                                                          0) != cudaSuccess) {
          cudaGetLastError();
          return 0;
        }
        return coop ? sms * per_sm : 0;
      });
}

IndexerSelectPath indexer_select_path(const IndexerTopkParams& p) {
  IndexerSelectPath want = p.select_path;
  if (p.splits <= 1) {
    if (want != IndexerSelectPath::row && want != IndexerSelectPath::row_fused)
      want = kIndexerRowSelectDefault;
    return want == IndexerSelectPath::row_fused && p.max_len > p.topk && !p.scores_only && p.row_done
               ? IndexerSelectPath::row_fused
               : IndexerSelectPath::row;
  }
  if (want != IndexerSelectPath::passes && want != IndexerSelectPath::cooperative)
    want = kIndexerSelectPathDefault;
  if (want == IndexerSelectPath::cooperative && p.max_len > p.topk && indexer_select_coop_capacity() > 0)
    return IndexerSelectPath::cooperative;
  return IndexerSelectPath::passes;
}

int64_t indexer_select_coop_grid(const IndexerTopkParams& p) {
  const int64_t virt = p.rows * p.splits, cap = indexer_select_coop_capacity();
  return virt < cap ? virt : cap;
}

const char* indexer_select_path_name(IndexerSelectPath path) { return name(path).data(); }

cudaError_t launch_indexer_select(const IndexerTopkParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.splits < 1 || p.splits > 65535 || p.split_len % kSweep != 0 || p.splits * p.split_len < p.max_len ||
      p.rows > 2147483647)
    return cudaErrorInvalidValue;
  const IndexerSelectPath path = indexer_select_path(p);
  // row_fused here: launch_indexer_topk_fused did not fuse (this launch runs alone), so the row kernel.
  if (path == IndexerSelectPath::row || path == IndexerSelectPath::row_fused) {
    return launch_pdl(kIndexerSelectRowPdl, sm90_indexer_select_row_kernel, dim3(unsigned(p.rows)),
                      dim3(kThreads), 0, stream, p);
  }
  if (path == IndexerSelectPath::cooperative) {
    // One launch, grid sized by the occupancy API (clamped to rows x splits): a pure function of (rows,
    // max_len) and the device. Capturable in CUDA graphs; the grid barrier's state is the driver's.
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    const cudaError_t e =
        launch_with_attribute(attr, sm90_indexer_select_coop_kernel,
                              dim3(unsigned(indexer_select_coop_grid(p))), dim3(kThreads), 0, stream, p);
    if (e != cudaErrorCooperativeLaunchTooLarge) return e;
    (void)cudaGetLastError();  // fewer co-resident CTAs than the occupancy API said (MPS, ...): four launches
  }
  const dim3 grid(unsigned(p.rows), unsigned(p.splits));
  if (p.max_len > p.topk) {
    void (*const passes[3])(IndexerTopkParams) = {sm90_indexer_select_pass_kernel<0>,
                                                  sm90_indexer_select_pass_kernel<1>,
                                                  sm90_indexer_select_pass_kernel<2>};
    for (auto* pass : passes) {
      const cudaError_t e = launch_pdl(p.pdl, pass, grid, dim3(kThreads), 0, stream, p);
      if (e != cudaSuccess) return e;
    }
  }
  return launch_pdl(p.pdl, sm90_indexer_select_pass_kernel<3>, grid, dim3(kThreads), 0, stream, p);
}

}  // namespace dsaserve::kernels::cuda
