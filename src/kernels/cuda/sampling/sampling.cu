// GPU sampler: the CPU sampler's step (runtime/sampler/sampler.cpp) for a batch of rows, one block per
// row. Penalties and logit_bias run on a copy of the row with the CPU's float operations in its order
// (no contraction). Then: greedy = first maximum; otherwise the probabilities e_i = exp((x_i - max) / T)
// (fp64, like the CPU) as 2^-44 fixed-point integers, so that every sum is exact and order-free. Every
// selection is "the element at which the running weight, in a given order, reaches a target", the
// order being a 64-bit key (value, lower id first) or, for an unfiltered draw, the id (the CPU draws in
// id order then). Unfiltered draw: per-warp sums over contiguous id chunks, then one warp rescans the
// chunk of the crossing. top_k <= 1024, top_p (crossing among the 1024 largest) and top_logprobs: the
// largest keys are gathered by histograms of ord()'s high bits into shared memory and sorted there, and
// the selections are exact running sums over that sorted prefix. Otherwise (larger top_k, min_p alone,
// a crossing further down, or more ties at the threshold than the buffer holds) a radix select over the
// row, 8 bits a pass. Both give the same element.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/sampling/sampling_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kThreads = 512;
constexpr double kFix = 17592186044416.0;  // 2^44: a probability weight (<= 1) as an integer
constexpr unsigned kFull = 0xffffffffu;

// Monotone map of a float to uint32 (larger float -> larger code); -0 is 0, as the CPU's == says.
__device__ __forceinline__ uint32_t ord(float f) {
  const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// Decreasing key = the CPU's sort order: larger value first, ties to the lower id.
__device__ __forceinline__ uint64_t sorted_key(float v, int64_t i) {
  return (uint64_t(ord(v)) << 32) | uint64_t(0xffffffffu - uint32_t(i));
}
__device__ __forceinline__ int32_t key_id(uint64_t k) { return int32_t(0xffffffffu - uint32_t(k)); }

// A token's probability weight relative to the row maximum mx (inv_t = 1 / temperature): exp in fp64
// (the CPU's), and that as a 2^-44 fixed-point integer. One definition for every kernel.
__device__ __forceinline__ double row_e(float v, double mx, double inv_t) {
  return exp(__dmul_rn(__dsub_rn(double(v), mx), inv_t));
}
__device__ __forceinline__ uint64_t row_w(float v, double mx, double inv_t) {
  return uint64_t(__double2ull_rn(row_e(v, mx, inv_t) * kFix));
}

struct SelectShared {
  unsigned long long mass[256];
  int cnt[256];
  unsigned long long above, found;
  int bin, bin_cnt;
};

// Warp 0: the bin (highest first) in which `above` + the running mass first reaches `target` (strict:
// exceeds it); when none does, the lowest non-empty bin (the last element of the order).
__device__ void choose_bin(SelectShared& s, unsigned long long above, double target, bool strict) {
  const int lane = int(threadIdx.x);
  unsigned long long lsum = 0;
  for (int q = 0; q < 8; ++q) lsum += s.mass[255 - 8 * lane - q];
  unsigned long long incl = lsum;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  unsigned long long run = above + (incl - lsum);
  int found_q = -1, last_q = -1;
  unsigned long long found_run = 0, last_run = 0;
  for (int q = 0; q < 8; ++q) {
    const int b = 255 - 8 * lane - q;
    const unsigned long long m = s.mass[b];
    if (s.cnt[b] > 0) {
      const double next = double(run + m);
      const bool cross = strict ? next > target : next >= target;
      if (cross && found_q < 0) {
        found_q = q;
        found_run = run;
      }
      last_q = q;
      last_run = run;
    }
    run += m;
  }
  const unsigned f = __ballot_sync(kFull, found_q >= 0);
  const unsigned l = __ballot_sync(kFull, last_q >= 0);
  const int src = f ? __ffs(int(f)) - 1 : (l ? 31 - __clz(int(l)) : 0);
  const int q = __shfl_sync(kFull, f ? found_q : last_q, src);
  const unsigned long long r = __shfl_sync(kFull, f ? found_run : last_run, src);
  if (lane == 0) {
    if (l == 0) {  // empty set
      s.bin = 0;
      s.bin_cnt = 0;
      s.above = above;
    } else {
      const int b = 255 - 8 * src - q;
      s.bin = b;
      s.bin_cnt = s.cnt[b];
      s.above = r;
    }
  }
}

// Among the elements i < n with in(i), taken in decreasing key(i) order, the first at which the running
// sum of weight(i) reaches `target` (cum >= target; strict: cum > target), or the last one when none
// does (as the CPU falls back to its last candidate). Returns its key. Radix select, 8 bits a pass from
// bits [first_shift, first_shift + 8) down; the bits above are `prefix0` in every key; keys must be
// distinct. Every thread of the block calls it.
template <class Key, class In, class Weight>
__device__ uint64_t select_key(int64_t n, int first_shift, uint64_t prefix0, double target, bool strict,
                               Key key, In in, Weight weight, SelectShared& s) {
  const int lane = int(threadIdx.x & 31);
  uint64_t prefix = prefix0, mask = first_shift >= 56 ? 0 : (~0ull << (first_shift + 8));
  unsigned long long above = 0;
  for (int shift = first_shift; shift >= 0; shift -= 8) {
    for (int b = int(threadIdx.x); b < 256; b += int(blockDim.x)) {
      s.mass[b] = 0;
      s.cnt[b] = 0;
    }
    __syncthreads();
    for (int64_t base = 0; base < n; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      uint32_t bin = 256;
      uint64_t w = 0;
      if (i < n) {
        const uint64_t k = key(i);
        if ((k & mask) == prefix && in(i)) {
          bin = uint32_t(k >> shift) & 0xffu;
          w = weight(i);
        }
      }
      const unsigned valid = __ballot_sync(kFull, bin < 256);
      if (valid == 0) continue;  // (uniform over the warp)
      // Lanes sharing a bin add their weights with a full-warp sum first (two bins a round at most: the
      // common case of a pass's leading digit); the lanes left over add theirs one by one.
      unsigned pending = valid;
      for (int round = 0; round < 2 && pending != 0; ++round) {
        const int leader = __ffs(int(pending)) - 1;
        const uint32_t b = __shfl_sync(kFull, bin, leader);
        const bool mine = bin == b;
        const unsigned group = __ballot_sync(kFull, mine);
        const unsigned long long sum = warp_sum<unsigned long long>(mine ? w : 0);
        if (lane == leader) {
          atomicAdd(&s.mass[b], sum);
          atomicAdd(&s.cnt[b], __popc(int(group)));
        }
        pending &= ~group;
      }
      if ((pending >> lane) & 1u) {
        atomicAdd(&s.mass[bin], static_cast<unsigned long long>(w));
        atomicAdd(&s.cnt[bin], 1);
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) choose_bin(s, above, target, strict);
    __syncthreads();
    const uint64_t bin = uint64_t(s.bin);
    const int count = s.bin_cnt;
    above = s.above;
    prefix |= bin << shift;
    mask |= 0xffull << shift;
    if (count == 0) return prefix;  // empty set (callers never pass one)
    if (count == 1 && shift > 0) {  // one element left: find it
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint64_t k = key(i);
        if ((k & mask) == prefix && in(i)) s.found = k;
      }
      __syncthreads();
      const uint64_t k = s.found;
      __syncthreads();
      return k;
    }
  }
  return prefix;
}

// Candidate path: the `t` largest sorted keys of a row (top_k <= kFastK, the top_p prefix, top_logprobs)
// gathered into shared memory by two histogram passes over the high bits of ord() and one compaction,
// then sorted there; the selections then run on that sorted prefix of the CPU's order. Falls back to
// the radix select when more than kCap elements share the threshold bin.
constexpr int kFastK = 1024;
constexpr int kCap = 2048;
constexpr int kHistBins = 2048;  // 11 bits of ord() a level: bits 21..31, then 10..20
static_assert(kCap % kThreads == 0, "scan_cum gives each thread kCap / kThreads entries");

struct TopShared {
  unsigned long long keys[kCap];  // the candidates' sorted keys, decreasing
  union {
    int hist[kHistBins];
    unsigned long long cum[kCap];  // per candidate: a weight, then the inclusive running sum
  };
  unsigned char fin[kCap];  // per candidate: in the final set
  int n, bin, above, bin_cnt, pos;
};

// Warp 0: the highest bin b of ts.hist at which the count of the elements in bins >= b reaches `need`
// (>= 1): ts.bin = b, ts.above = the count in the bins above b, ts.bin_cnt = b's count; ts.bin = -1 when
// the histogram holds fewer than `need`.
__device__ void find_count_bin(TopShared& ts, int need) {
  const int lane = int(threadIdx.x);
  int run = 0;  // elements in the bins above the current group of 32
  for (int c = 0; c < kHistBins / 32; ++c) {
    const int b = kHistBins - 1 - 32 * c - lane;
    const int cnt = ts.hist[b];
    int incl = cnt;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += y;
    }
    const unsigned f = __ballot_sync(kFull, run + incl >= need);
    if (f != 0) {
      if (lane == __ffs(int(f)) - 1) {
        ts.bin = b;
        ts.above = run + incl - cnt;
        ts.bin_cnt = cnt;
      }
      return;
    }
    run += __shfl_sync(kFull, incl, 31);
  }
  if (lane == 0) ts.bin = -1;
}

// The C >= t largest sorted keys of the row v[0, n) (1 <= t <= n) in decreasing order in ts.keys[0, C):
// every element whose ord() reaches the threshold bin of the t-th (11 bits, then 11 more within that
// bin when it holds too many). Returns C, or -1 when C would exceed kCap. Every thread calls it.
__device__ int top_prefix(const float* v, int64_t n, int t, TopShared& ts) {
  for (int b = int(threadIdx.x); b < kHistBins; b += int(blockDim.x)) ts.hist[b] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&ts.hist[ord(v[i]) >> 21], 1);
  __syncthreads();
  if (threadIdx.x < 32) find_count_bin(ts, t);
  __syncthreads();
  const int b1 = ts.bin, above1 = ts.above, cnt1 = ts.bin_cnt;
  if (b1 < 0) return -1;
  uint32_t thr = uint32_t(b1) << 21;
  if (above1 + cnt1 > kCap) {
    for (int b = int(threadIdx.x); b < kHistBins; b += int(blockDim.x)) ts.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t u = ord(v[i]);
      if ((u >> 21) == uint32_t(b1)) atomicAdd(&ts.hist[(u >> 10) & 0x7ffu], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) find_count_bin(ts, t - above1);
    __syncthreads();
    const int b2 = ts.bin;
    if (b2 < 0 || above1 + ts.above + ts.bin_cnt > kCap) return -1;
    thr |= uint32_t(b2) << 10;
  }
  if (threadIdx.x == 0) ts.n = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float f = v[i];
    if (ord(f) >= thr) {
      const int slot = atomicAdd(&ts.n, 1);
      if (slot < kCap) ts.keys[slot] = sorted_key(f, i);
    }
  }
  __syncthreads();
  const int c = ts.n;
  if (c > kCap) return -1;
  int n2 = 1;
  while (n2 < c) n2 <<= 1;
  for (int j = c + int(threadIdx.x); j < n2; j += int(blockDim.x)) ts.keys[j] = 0;  // below every key
  __syncthreads();
  for (int k = 2; k <= n2; k <<= 1) {  // bitonic sort, decreasing
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = int(threadIdx.x); i < n2; i += int(blockDim.x)) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long a = ts.keys[i], b = ts.keys[ixj];
          if ((i & k) == 0 ? a < b : a > b) {
            ts.keys[i] = b;
            ts.keys[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  return c;
}

// ts.cum[0, m) (m <= kCap) becomes its inclusive running sum. blockDim.x == kThreads; every thread calls it.
__device__ void scan_cum(TopShared& ts, int m) {
  __shared__ unsigned long long wtot[kThreads / 32];
  constexpr int kPer = kCap / kThreads;
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), j0 = int(threadIdx.x) * kPer;
  unsigned long long loc[kPer];
  unsigned long long run = 0;
  for (int q = 0; q < kPer; ++q) {
    run += j0 + q < m ? ts.cum[j0 + q] : 0ull;
    loc[q] = run;
  }
  unsigned long long incl = run;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) wtot[warp] = incl;
  __syncthreads();
  unsigned long long before = incl - run;
  for (int w = 0; w < warp; ++w) before += wtot[w];
  for (int q = 0; q < kPer; ++q) {
    if (j0 + q < m) ts.cum[j0 + q] = before + loc[q];
  }
  __syncthreads();
}

// The first j in [0, m) with cond(j) (last: the last one); m / -1 when none. Every thread calls it.
template <class Cond>
__device__ int block_pos(int m, bool last, Cond cond, TopShared& ts) {
  if (threadIdx.x == 0) ts.pos = last ? -1 : m;
  __syncthreads();
  for (int j = int(threadIdx.x); j < m; j += int(blockDim.x)) {
    if (cond(j)) {
      if (last) {
        atomicMax(&ts.pos, j);
      } else {
        atomicMin(&ts.pos, j);
      }
    }
  }
  __syncthreads();
  const int r = ts.pos;
  __syncthreads();
  return r;
}

// Penalties and bias on a copy of the row, each with the CPU's float operation, in its order: the biases
// one after another (a token may repeat), then the repetition penalty, then presence / frequency.
__global__ void sm90_sample_penalty_kernel(SampleKernelParams p) {
  const SampleRowDesc d = p.desc[blockIdx.x];
  if (d.ws_row < 0) return;
  const float* src = p.logits + int64_t(blockIdx.x) * p.stride;
  float* x = p.ws + int64_t(d.ws_row) * p.vocab;
  for (int64_t i = threadIdx.x; i < p.vocab; i += blockDim.x) x[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 0; j < d.bias_n; ++j) {
      const int32_t t = p.bias_tok[d.bias_off + j];
      x[t] = __fadd_rn(x[t], p.bias_val[d.bias_off + j]);
    }
  }
  __syncthreads();
  if (d.repetition != 1.0f) {
    for (int j = int(threadIdx.x); j < d.seen_n; j += int(blockDim.x)) {
      const int32_t t = p.seen_tok[d.seen_off + j];
      const float l = x[t];
      x[t] = l > 0.0f ? __fdiv_rn(l, d.repetition) : __fmul_rn(l, d.repetition);
    }
  }
  __syncthreads();
  if (d.presence != 0.0f || d.frequency != 0.0f) {
    for (int j = int(threadIdx.x); j < d.count_n; j += int(blockDim.x)) {
      const int32_t t = p.count_tok[d.count_off + j];
      const float pen = __fadd_rn(d.presence, __fmul_rn(d.frequency, float(p.count_n[d.count_off + j])));
      x[t] = __fsub_rn(x[t], pen);
    }
  }
}

// Id-order draw over [lo, hi), in two steps. chunk_sums: warp w's weight sum over its sub-chunk (16
// sub-chunks in id order) into warp_mass[w]. chunk_draw (after it): the first id at which `before` + the
// running weight exceeds `target` (the warp of the crossing sub-chunk rescans it 32 ids a step with a
// warp prefix sum); -1 when none. blockDim.x == kThreads; every thread calls both.
constexpr int kWarps = kThreads / 32;
__device__ __forceinline__ int64_t sub_lo(int64_t lo, int64_t hi, int w) {
  const int64_t cs = (hi - lo + kWarps - 1) / kWarps, a = lo + w * cs;
  return a < hi ? a : hi;
}
template <class W>
__device__ void chunk_sums(int64_t lo, int64_t hi, W w_of, unsigned long long* warp_mass) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int64_t a = sub_lo(lo, hi, warp), b = sub_lo(lo, hi, warp + 1);
  unsigned long long local = 0;
  for (int64_t i = a + lane; i < b; i += 32) local += w_of(i);
  local = warp_sum(local);
  __syncthreads();  // warp_mass may still be read by an earlier call
  if (lane == 0) warp_mass[warp] = local;
  __syncthreads();
}
template <class W>
__device__ int32_t chunk_draw(int64_t lo, int64_t hi, unsigned long long before, double target, W w_of,
                              const unsigned long long* warp_mass, int* drawn) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  int wf = kWarps;  // the sub-chunk of the crossing
  for (int w = 0; w < kWarps && wf == kWarps; ++w) {
    if (double(before + warp_mass[w]) > target) {
      wf = w;
    } else {
      before += warp_mass[w];
    }
  }
  if (wf == kWarps) return -1;
  if (threadIdx.x == 0) *drawn = -1;
  __syncthreads();
  if (warp == wf) {
    const int64_t a = sub_lo(lo, hi, wf), b = sub_lo(lo, hi, wf + 1);
    unsigned long long run = before;
    for (int64_t base = a; base < b; base += 32) {
      const int64_t i = base + lane;
      unsigned long long incl = i < b ? w_of(i) : 0ull;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += y;
      }
      const bool cross = (i < b) && (double(run + incl) > target);
      const unsigned f = __ballot_sync(kFull, cross);
      if (f != 0) {
        if (lane == __ffs(int(f)) - 1) *drawn = int(i);
        break;
      }
      run += __shfl_sync(kFull, incl, 31);
    }
  }
  __syncthreads();
  const int32_t t = *drawn;
  __syncthreads();
  return t;
}

constexpr int kPartThreads = 256;

__device__ __forceinline__ const float* processed_row(const SampleKernelParams& p, const SampleRowDesc& d,
                                                      int64_t r) {
  return d.ws_row >= 0 ? p.ws + int64_t(d.ws_row) * p.vocab : p.logits + r * p.stride;
}
__device__ __forceinline__ void part_range(const SampleKernelParams& p, int b, int64_t& lo, int64_t& hi) {
  const int64_t cs = (p.vocab + p.parts - 1) / p.parts;
  lo = int64_t(b) * cs < p.vocab ? int64_t(b) * cs : p.vocab;
  hi = lo + cs < p.vocab ? lo + cs : p.vocab;
}
// The row's (value, lower id) maximum from its chunk partials (the same pair as a whole-row argmax).
__device__ __forceinline__ ValIdx parts_best(const SampleKernelParams& p, int64_t r) {
  ValIdx best{-__int_as_float(0x7f800000), 0x7fffffff};
  for (int b = 0; b < p.parts; ++b) {
    const ValIdx c{p.part_v[r * p.parts + b], p.part_i[r * p.parts + b]};
    if (better(c, best)) best = c;
  }
  return best;
}

// Block (chunk b, row r): the chunk's maximum.
__global__ void __launch_bounds__(kPartThreads) sm90_sample_part_max_kernel(SampleKernelParams p) {
  const int64_t r = blockIdx.y;
  const int b = int(blockIdx.x);
  const SampleRowDesc d = p.desc[r];
  const float* x = processed_row(p, d, r);
  int64_t lo, hi;
  part_range(p, b, lo, hi);
  ValIdx best{-__int_as_float(0x7f800000), 0x7fffffff};
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const ValIdx c{x[i], int32_t(i)};
    if (better(c, best)) best = c;
  }
  best = block_argmax(best);
  if (threadIdx.x == 0) {
    p.part_v[r * p.parts + b] = best.v;
    p.part_i[r * p.parts + b] = best.i;
  }
}

// Block (chunk b, row r), rows with temperature > 0 and no top_k: the chunk's weight sum (and the
// weights into the row's cache when it has one).
__global__ void __launch_bounds__(kPartThreads) sm90_sample_part_mass_kernel(SampleKernelParams p) {
  const int64_t r = blockIdx.y, V = p.vocab;
  const int b = int(blockIdx.x);
  const SampleRowDesc d = p.desc[r];
  if (d.temperature <= 0.0f || (d.top_k > 0 && d.top_k < V)) return;
  const float* x = processed_row(p, d, r);
  const double mx = double(parts_best(p, r).v), inv_t = 1.0 / double(d.temperature);
  unsigned long long* wc =
      (d.wc_row >= 0 && p.wcache != nullptr) ? p.wcache + int64_t(d.wc_row) * V : nullptr;
  int64_t lo, hi;
  part_range(p, b, lo, hi);
  unsigned long long local = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const uint64_t w = row_w(x[i], mx, inv_t);
    if (wc != nullptr) wc[i] = w;
    local += w;
  }
  local = block_sum(local);
  if (threadIdx.x == 0) p.part_w[r * p.parts + b] = local;
}

__global__ void __launch_bounds__(kThreads) sm90_sample_kernel(SampleKernelParams p) {
  __shared__ SelectShared s;
  __shared__ TopShared ts;
  __shared__ unsigned long long top_keys[kSampleMaxTopLogprobs];
  __shared__ unsigned long long warp_mass[kThreads / 32];
  __shared__ int top_n, drawn;
  const int64_t r = blockIdx.x, V = p.vocab;
  const SampleRowDesc d = p.desc[r];
  const float* raw = p.logits + r * p.stride;
  const float* x = d.ws_row >= 0 ? p.ws + int64_t(d.ws_row) * V : raw;
  const float neg_inf = -__int_as_float(0x7f800000);
  auto all = [](int64_t) { return true; };
  auto one = [](int64_t) { return uint64_t(1); };

  ValIdx best{neg_inf, 0x7fffffff};
  if (p.parts > 0) {
    best = parts_best(p, r);
  } else {
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const ValIdx c{x[i], int32_t(i)};
      if (better(c, best)) best = c;
    }
    best = block_argmax(best);
  }
  int32_t token = best.i == 0x7fffffff ? 0 : best.i;
  if (d.temperature > 0.0f) {
    const double mx = double(best.v), inv_t = 1.0 / double(d.temperature);
    auto e_of = [=](int64_t i) { return row_e(x[i], mx, inv_t); };
    auto w_of = [=](int64_t i) { return row_w(x[i], mx, inv_t); };
    const bool filtered = (d.top_k > 0 && d.top_k < V) || d.top_p < 1.0f || d.min_p > 0.0f;
    if (!filtered) {
      // In id order: the first id at which the running weight exceeds u * total (none: the last id,
      // the CPU's fallback). With the pre-pass, its chunk sums locate the chunk of the crossing.
      token = int32_t(V - 1);
      if (p.parts > 0) {
        unsigned long long total = 0;
        for (int b = 0; b < p.parts; ++b) total += p.part_w[r * p.parts + b];
        const double target = d.uniform * double(total);
        int cf = -1;
        unsigned long long before = 0;
        for (int b = 0; b < p.parts && cf < 0; ++b) {
          const unsigned long long end = before + p.part_w[r * p.parts + b];
          if (double(end) > target) {
            cf = b;
          } else {
            before = end;
          }
        }
        if (cf >= 0) {
          int64_t lo, hi;
          part_range(p, cf, lo, hi);
          chunk_sums(lo, hi, w_of, warp_mass);
          const int32_t t = chunk_draw(lo, hi, before, target, w_of, warp_mass, &drawn);
          if (t >= 0) token = t;
        }
      } else {
        chunk_sums(0, V, w_of, warp_mass);
        unsigned long long total = 0;
        for (int w = 0; w < kWarps; ++w) total += warp_mass[w];
        const int32_t t = chunk_draw(0, V, 0ull, d.uniform * double(total), w_of, warp_mass, &drawn);
        if (t >= 0) token = t;
      }
    } else {
      auto key = [=](int64_t i) { return sorted_key(x[i], i); };
      const bool has_k = d.top_k > 0 && d.top_k < V;
      // Without top_k: the row's mass (the base of the top_p target), the weights kept in `wc` when the
      // row has a cache row (the radix select's passes then read them instead of recomputing exp).
      unsigned long long* wc =
          (!has_k && d.wc_row >= 0 && p.wcache != nullptr) ? p.wcache + int64_t(d.wc_row) * V : nullptr;
      auto wgt = [=](int64_t i) { return wc != nullptr ? uint64_t(wc[i]) : w_of(i); };
      bool done = false;
      const bool have_total = !has_k;
      unsigned long long total = 0;
      if (have_total && p.parts > 0) {  // (the pre-pass filled wc too)
        for (int b = 0; b < p.parts; ++b) total += p.part_w[r * p.parts + b];
      } else if (have_total) {
        unsigned long long local = 0;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
          const uint64_t w = w_of(i);
          if (wc != nullptr) wc[i] = w;
          local += w;
        }
        total = block_sum(local);  // (its barriers also publish wc to the block)
      }
      if (has_k ? d.top_k <= kFastK : d.top_p < 1.0f) {
        // The sorted prefix of the CPU's order: the k candidates, or (top_p alone) the largest kFastK
        // when the top_p crossing lies among them (never when the target exceeds the mass kCap
        // candidates can hold, each weight being <= kFix).
        const bool reachable = has_k || double(d.top_p) * double(total) <= double(kCap) * kFix;
        const int c = reachable ? top_prefix(x, V, has_k ? d.top_k : int(V < kFastK ? V : kFastK), ts) : -1;
        if (c >= 0) {
          const int m = has_k ? d.top_k : c;
          for (int j = int(threadIdx.x); j < m; j += int(blockDim.x)) ts.cum[j] = w_of(key_id(ts.keys[j]));
          __syncthreads();
          scan_cum(ts, m);
          const unsigned long long zk = has_k ? ts.cum[m - 1] : total;
          int jp = m - 1;  // the last candidate kept by top_p
          if (d.top_p < 1.0f) {
            const double target = double(d.top_p) * double(zk);
            jp = block_pos(
                m, false, [&](int j) { return double(ts.cum[j]) >= target; }, ts);
            if (jp == m) jp = has_k ? m - 1 : -1;  // top_p alone: the crossing lies past the prefix
          }
          if (jp >= 0) {
            const double z = double(zk) / kFix, floor = double(d.min_p) * (1.0 / z);
            const bool min_p = d.min_p > 0.0f;
            for (int j = int(threadIdx.x); j < m; j += int(blockDim.x)) {
              const int32_t id = key_id(ts.keys[j]);
              const bool in = j <= jp && (!min_p || e_of(id) / z >= floor);
              ts.fin[j] = in ? 1 : 0;
              ts.cum[j] = in ? w_of(id) : 0ull;
            }
            __syncthreads();
            scan_cum(ts, m);
            const double target = d.uniform * double(ts.cum[m - 1]);
            int j = block_pos(
                m, false, [&](int q) { return ts.fin[q] != 0 && double(ts.cum[q]) > target; }, ts);
            if (j == m)
              j = block_pos(
                  m, true, [&](int q) { return ts.fin[q] != 0; }, ts);
            token = key_id(ts.keys[j]);
            done = true;
          }
        }
      }
      if (!done) {
        uint64_t kk = 0;  // top_k: the k-th key
        if (d.top_k > 0 && d.top_k < V) kk = select_key(V, 56, 0, double(d.top_k), false, key, all, one, s);
        auto in_k = [=](int64_t i) { return key(i) >= kk; };
        unsigned long long zk = total;  // (without top_k, in_k holds every id)
        if (!have_total) {
          unsigned long long local = 0;
          for (int64_t i = threadIdx.x; i < V; i += blockDim.x) local += in_k(i) ? w_of(i) : 0;
          zk = block_sum(local);
        }
        uint64_t kp = kk;  // top_p: the first key at which the mass reaches top_p
        if (d.top_p < 1.0f) kp = select_key(V, 56, 0, double(d.top_p) * double(zk), false, key, in_k, wgt, s);
        const double z = double(zk) / kFix, floor = double(d.min_p) * (1.0 / z);
        const bool min_p = d.min_p > 0.0f;
        auto in_final = [=](int64_t i) { return key(i) >= kp && (!min_p || e_of(i) / z >= floor); };
        unsigned long long local = 0;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x) local += in_final(i) ? wgt(i) : 0;
        const unsigned long long kept = block_sum(local);
        token = key_id(select_key(V, 56, 0, d.uniform * double(kept), true, key, in_final, wgt, s));
      }
    }
  }
  if (threadIdx.x == 0) p.out_token[r] = token;
  if (!d.logprob && d.top_logprobs <= 0) return;

  // Log-probabilities of the raw row (log_softmax of the unprocessed logits). Its maximum is the
  // processed row's when the row has no penalty or bias.
  ValIdx rbest = best;
  if (x != raw) {
    rbest = ValIdx{neg_inf, 0x7fffffff};
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
      const ValIdx c{raw[i], int32_t(i)};
      if (better(c, rbest)) rbest = c;
    }
    rbest = block_argmax(rbest);
  }
  const double rmx = double(rbest.v);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += exp(__dsub_rn(double(raw[i]), rmx));
  sum = block_sum(sum);
  const double lse = rmx + log(sum);
  if (threadIdx.x == 0) p.out_logprob[r] = float(double(raw[token]) - lse);
  const int n = int(d.top_logprobs < V ? d.top_logprobs : V);
  if (n <= 0) return;
  const int c = top_prefix(raw, V, n, ts);
  if (c >= 0) {  // the n largest, in order
    if (int(threadIdx.x) < n) {
      const int32_t id = key_id(ts.keys[threadIdx.x]);
      p.out_top_tok[r * kSampleMaxTopLogprobs + threadIdx.x] = id;
      p.out_top_lp[r * kSampleMaxTopLogprobs + threadIdx.x] = float(double(raw[id]) - lse);
    }
    return;
  }
  auto rkey = [=](int64_t i) { return sorted_key(raw[i], i); };
  const uint64_t kn = select_key(V, 56, 0, double(n), false, rkey, all, one, s);
  if (threadIdx.x == 0) top_n = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const uint64_t k = rkey(i);
    if (k >= kn) {
      const int slot = atomicAdd(&top_n, 1);
      if (slot < kSampleMaxTopLogprobs) top_keys[slot] = k;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int m = top_n < n ? top_n : n;
    for (int a = 1; a < m; ++a) {  // insertion sort, largest key first
      const unsigned long long k = top_keys[a];
      int b = a - 1;
      while (b >= 0 && top_keys[b] < k) {
        top_keys[b + 1] = top_keys[b];
        --b;
      }
      top_keys[b + 1] = k;
    }
    for (int j = 0; j < m; ++j) {
      const int32_t id = key_id(top_keys[j]);
      p.out_top_tok[r * kSampleMaxTopLogprobs + j] = id;
      p.out_top_lp[r * kSampleMaxTopLogprobs + j] = float(double(raw[id]) - lse);
    }
  }
}

}  // namespace

cudaError_t launch_sample_rows(const SampleKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.vocab <= 0 || p.vocab >= kSampleMaxVocab || p.rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (p.ws != nullptr) sm90_sample_penalty_kernel<<<unsigned(p.rows), 256, 0, stream>>>(p);
  if (p.parts > 0) {
    if (p.rows > 65535 || p.parts > 65535) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(p.parts), unsigned(p.rows));
    sm90_sample_part_max_kernel<<<grid, kPartThreads, 0, stream>>>(p);
    sm90_sample_part_mass_kernel<<<grid, kPartThreads, 0, stream>>>(p);
  }
  sm90_sample_kernel<<<unsigned(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
