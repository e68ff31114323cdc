// MoE experts without host synchronisation: the routing grouped by expert on the device, then grouped
// expert GEMMs for few rows per expert (decode) that stream each active expert's weights once per group of
// rows. Launch configurations depend only on shapes (and the device), never on the routing, so every
// launch here can be captured into a CUDA graph and replayed with other routings.
#include <cuda_fp8.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/moe/moe_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kMaxGroupExperts = 1024;
constexpr unsigned kFull = 0xffffffffu;

// Pairs dropped for ids outside [0, experts), over all launches since the last moe_take_dropped_pairs.
__device__ unsigned long long g_moe_dropped = 0;

// Warps of the grouping block: each keeps a cursor per expert in shared memory ([warps][experts] i32,
// at most 32 KiB).
int group_warps(int experts) {
  const int w = 8192 / experts;
  return w < 1 ? 1 : w > 32 ? 32 : w;
}

// One block. The pairs are cut into one contiguous segment per warp; a warp walks its segment 32 pairs at
// a time, and lanes holding the same expert find each other with __match_any_sync. Pass 1 counts each
// expert's pairs per segment; the counts become, per expert, an exclusive prefix over segments plus the
// expert's offset; pass 2 walks the segments again and hands out packed rows in pair order.
__global__ void sm90_moe_group_kernel(MoeGroupParams p) {
  extern __shared__ int32_t smem[];
  __shared__ int32_t s_dropped, s_bad_id, s_total;
  pdl_enter();
  const int E = p.experts, W = int(blockDim.x >> 5);
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  int32_t* cursor = smem;        // [W][E]
  int32_t* base = smem + W * E;  // [E] totals, then offsets
  for (int i = tid; i < W * E; i += int(blockDim.x)) cursor[i] = 0;
  if (tid == 0) {
    s_dropped = 0;
    s_bad_id = 0;
  }
  __syncthreads();
  const int64_t seg = (p.pairs + W - 1) / W;
  const int64_t b = min(p.pairs, int64_t(warp) * seg), end = min(p.pairs, b + seg);
  int32_t* mine = cursor + warp * E;
  const unsigned below = (1u << lane) - 1u;
  // Pass 1: pairs per (segment, expert).
  for (int64_t i0 = b; i0 < end; i0 += 32) {
    const int64_t i = i0 + lane;
    int e = -1;
    if (i < end) {
      e = p.ids[i];
      if (e < 0 || e >= E) {
        atomicAdd(&s_dropped, 1);
        atomicExch(&s_bad_id, e);
        e = -1;
      }
    }
    const unsigned peers = __match_any_sync(kFull, e);
    if (e >= 0 && (peers & below) == 0) mine[e] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // Per expert: exclusive prefix over segments (in place) and the total.
  for (int e = tid; e < E; e += int(blockDim.x)) {
    int32_t run = 0;
    for (int w = 0; w < W; ++w) {
      const int32_t c = cursor[w * E + e];
      cursor[w * E + e] = run;
      run += c;
    }
    base[e] = run;
    p.counts[e] = run;
  }
  __syncthreads();
  // Offsets (exclusive prefix over experts) and the list of active experts, by warp 0.
  if (warp == 0) {
    int32_t carry = 0, n_active = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int32_t v = e < E ? base[e] : 0;
      int32_t inc = v;
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t t = __shfl_up_sync(kFull, inc, o);
        if (lane >= o) inc += t;
      }
      const unsigned has = __ballot_sync(kFull, v > 0);
      if (e < E) {
        base[e] = carry + inc - v;
        p.offsets[e] = carry + inc - v;
      }
      if (v > 0) p.active[n_active + __popc(has & below)] = e;
      carry += __shfl_sync(kFull, inc, 31);
      n_active += __popc(has);
    }
    if (lane == 0) {
      p.offsets[E] = carry;
      p.header[0] = n_active;
      p.header[1] = s_dropped;
      p.header[2] = s_bad_id;
      p.header[3] = 0;
      s_total = carry;
      if (s_dropped > 0) atomicAdd(&g_moe_dropped, (unsigned long long)s_dropped);
    }
  }
  __syncthreads();
  for (int i = tid; i < W * E; i += int(blockDim.x)) cursor[i] += base[i % E];
  __syncthreads();
  // Pass 2: packed rows in pair order within each expert.
  for (int64_t i0 = b; i0 < end; i0 += 32) {
    const int64_t i = i0 + lane;
    int e = -1;
    if (i < end) {
      e = p.ids[i];
      if (e < 0 || e >= E) e = -1;
    }
    const unsigned peers = __match_any_sync(kFull, e);
    if (i < end) {
      if (e >= 0) {
        const int32_t m = mine[e] + __popc(peers & below);
        p.rows[m] = int32_t(i / p.top_k);
        p.pos[i] = m;
      } else {
        p.pos[i] = -1;
      }
    }
    __syncwarp();
    if (e >= 0 && (peers & below) == 0) mine[e] += __popc(peers);
    __syncwarp();
  }
  // Rows left by dropped pairs point at token 0, so that a gather over all rows stays in bounds.
  for (int64_t m = s_total + tid; m < p.pairs; m += blockDim.x) p.rows[m] = 0;
}

// 16 bytes of weights as stored hold V values; part(raw, s, scale) returns values [4s, 4s + 4) times
// scale (fp8 only; the others ignore it) as f32, exactly as the CPU dequantises them.
template <MoeWeightType WT>
struct WeightVec;

template <>
struct WeightVec<MoeWeightType::fp8> {
  static constexpr int V = 16;
  static constexpr int bytes = 1;
  __device__ static float2 pair(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
    return __half22float2(__half2(h));
  }
  __device__ static float4 part(const uint4& r, int s, float scale) {
    const uint32_t w = s == 0 ? r.x : s == 1 ? r.y : s == 2 ? r.z : r.w;
    const float2 a = pair(w & 0xffffu), b = pair(w >> 16);
    return make_float4(a.x * scale, a.y * scale, b.x * scale, b.y * scale);
  }
};

template <>
struct WeightVec<MoeWeightType::bf16> {
  static constexpr int V = 8;
  static constexpr int bytes = 2;
  __device__ static float4 part(const uint4& r, int s, float) {
    const uint32_t a = s == 0 ? r.x : r.z, b = s == 0 ? r.y : r.w;
    return make_float4(bf16_lo(a), bf16_hi(a), bf16_lo(b), bf16_hi(b));
  }
};

template <>
struct WeightVec<MoeWeightType::f32> {
  static constexpr int V = 4;
  static constexpr int bytes = 4;
  __device__ static float4 part(const uint4& r, int, float) {
    return make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z),
                       __uint_as_float(r.w));
  }
};

// Weights are read once: bypass L1 (which keeps the activations the warps share).
__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

constexpr int kWarps = 8, kThreads = kWarps * 32;

// Work item = (active slot, tile of kWarps * COLS output columns); warp w owns COLS columns of the tile
// (gate_up: those columns of gate and of up). Lanes split the reduction dimension in V-wide chunks; each
// lane streams its chunk of every owned weight row (prefetching the next chunk), dequantises it once and
// applies it to the R rows of the group.
template <MoeWeightType WT, bool GATE_UP, int R>
__global__ void __launch_bounds__(kThreads) sm90_moe_expert_gemm_kernel(MoeExpertGemmParams p) {
  pdl_enter();
  using WV = WeightVec<WT>;
  constexpr int V = WV::V, PARTS = V / 4;
  constexpr int NW = GATE_UP ? 2 : 1;    // weight matrices
  constexpr int COLS = GATE_UP ? 2 : 4;  // output columns per warp
  constexpr int NC = NW * COLS;          // weight rows per warp
  constexpr int TILE = kWarps * COLS;
  constexpr bool kFp8 = WT == MoeWeightType::fp8;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t N = p.n_out, K = p.n_in;
  const int64_t tiles = (N + TILE - 1) / TILE;
  const int64_t sk = kFp8 ? (K + p.block_k - 1) / p.block_k : 0;
  const int64_t items = int64_t(p.header[0]) * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int slot = int(item / tiles);
    const int64_t n0 = (item % tiles) * TILE + int64_t(warp) * COLS;
    const int e = p.active[slot];
    const int32_t m0 = p.offsets[e], m1 = p.offsets[e + 1];
    const MoeExpertWeights ew = p.table[e];
    const uint8_t* wrow[NC];
    const float* srow[NC];
#pragma unroll
    for (int j = 0; j < NW; ++j) {
      const void* wbase = GATE_UP ? (j == 0 ? ew.gate : ew.up) : ew.down;
      const float* sbase = GATE_UP ? (j == 0 ? ew.gate_scale : ew.up_scale) : ew.down_scale;
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const int64_t n = n0 + c < N ? n0 + c : 0;  // columns past N read row 0; their sums are dropped
        wrow[j * COLS + c] = static_cast<const uint8_t*>(wbase) + n * K * WV::bytes;
        srow[j * COLS + c] = kFp8 ? sbase + (n / p.block_n) * sk : nullptr;
      }
    }
    for (int32_t g = m0; g < m1; g += R) {
      const int nr = m1 - g < R ? m1 - g : R;
      const float* xrow[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int32_t m = g + (r < nr ? r : 0);
        xrow[r] = p.in + int64_t(p.in_rows ? p.in_rows[m] : m) * p.in_stride;
      }
      float acc[R][NC];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
      uint4 w[NC];
      float sc[NC];
      int64_t k = int64_t(lane) * V;
      if (k < K) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          w[c] = load_stream(wrow[c] + k * WV::bytes);
          sc[c] = kFp8 ? __ldg(srow[c] + k / p.block_k) : 1.0f;
        }
      }
      for (; k < K; k += 32 * V) {
        uint4 wn[NC];
        float scn[NC];
        const int64_t kn = k + 32 * V;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          wn[c] = make_uint4(0u, 0u, 0u, 0u);
          scn[c] = 1.0f;
        }
        if (kn < K) {
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            wn[c] = load_stream(wrow[c] + kn * WV::bytes);
            scn[c] = kFp8 ? __ldg(srow[c] + kn / p.block_k) : 1.0f;
          }
        }
#pragma unroll
        for (int s = 0; s < PARTS; ++s) {
          float4 wf[NC];
#pragma unroll
          for (int c = 0; c < NC; ++c) wf[c] = WV::part(w[c], s, sc[c]);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r < nr) {
              const float4 xv = __ldg(reinterpret_cast<const float4*>(xrow[r] + k) + s);
#pragma unroll
              for (int c = 0; c < NC; ++c) {
                float a = acc[r][c];
                a = fmaf(wf[c].x, xv.x, a);
                a = fmaf(wf[c].y, xv.y, a);
                a = fmaf(wf[c].z, xv.z, a);
                a = fmaf(wf[c].w, xv.w, a);
                acc[r][c] = a;
              }
            }
          }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          w[c] = wn[c];
          sc[c] = scn[c];
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < NC; ++c) acc[r][c] = warp_sum(acc[r][c]);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= nr) break;
          float* o = p.out + int64_t(g + r) * N;
#pragma unroll
          for (int c = 0; c < COLS; ++c) {
            if (n0 + c >= N) break;
            if (GATE_UP) {
              const float gv = acc[r][c];
              o[n0 + c] = gv / (1.0f + expf(-gv)) * acc[r][COLS + c];
            } else {
              o[n0 + c] = acc[r][c];
            }
          }
        }
      }
    }
  }
}

template <MoeWeightType WT, bool GATE_UP, int R>
cudaError_t launch_gemm(const MoeExpertGemmParams& p, cudaStream_t stream) {
  constexpr int COLS = GATE_UP ? 2 : 4, TILE = kWarps * COLS;
  if (p.n_in % WeightVec<WT>::V != 0) return cudaErrorInvalidValue;
  // Persistent grid: as many blocks as fit on the device at once (computed once per instantiation and
  // device).
  const int resident = per_device_value(
      reinterpret_cast<const void*>(sm90_moe_expert_gemm_kernel<WT, GATE_UP, R>), +[]() -> int {
        int dev = 0, sms = 0, per = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, sm90_moe_expert_gemm_kernel<WT, GATE_UP, R>,
                                                      kThreads, 0);
        return (sms > 0 ? sms : 1) * (per > 0 ? per : 1);
      });
  const int64_t most = int64_t(p.experts) * ((p.n_out + TILE - 1) / TILE);  // every expert active
  const int grid = int(most < resident ? most : resident);
  return launch_pdl(p.pdl, sm90_moe_expert_gemm_kernel<WT, GATE_UP, R>, dim3(unsigned(grid)), dim3(kThreads),
                    0, stream, p);
}

template <MoeWeightType WT, bool GATE_UP>
cudaError_t launch_rows_variant(const MoeExpertGemmParams& p, cudaStream_t stream) {
  switch (p.group_rows) {
    case 2: return launch_gemm<WT, GATE_UP, 2>(p, stream);
    case 4: return launch_gemm<WT, GATE_UP, 4>(p, stream);
    case 8: return launch_gemm<WT, GATE_UP, 8>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <MoeWeightType WT>
cudaError_t launch_weight_variant(const MoeExpertGemmParams& p, cudaStream_t stream) {
  return p.gate_up ? launch_rows_variant<WT, true>(p, stream) : launch_rows_variant<WT, false>(p, stream);
}

}  // namespace

cudaError_t launch_moe_group(const MoeGroupParams& p, cudaStream_t stream) {
  if (p.pairs == 0) return cudaSuccess;
  if (p.experts < 1 || p.experts > kMaxGroupExperts || p.pairs > 0x7fffffff || p.top_k < 1)
    return cudaErrorInvalidValue;
  const int W = group_warps(p.experts);
  const size_t smem = size_t(W + 1) * size_t(p.experts) * sizeof(int32_t);
  return launch_pdl(p.pdl, sm90_moe_group_kernel, dim3(1), dim3(W * 32), smem, stream, p);
}

cudaError_t moe_take_dropped_pairs(int64_t* count) {
  unsigned long long v = 0;
  const unsigned long long zero = 0;
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpyFromSymbol(&v, g_moe_dropped, sizeof v);
  if (e == cudaSuccess) e = cudaMemcpyToSymbol(g_moe_dropped, &zero, sizeof zero);
  *count = int64_t(v);
  return e;
}

cudaError_t launch_moe_expert_gemm(const MoeExpertGemmParams& p, cudaStream_t stream) {
  if (p.n_out == 0 || p.experts == 0) return cudaSuccess;
  if (p.n_in <= 0 || p.in_stride % 4 != 0 || !is_aligned(p.in, 16)) return cudaErrorInvalidValue;
  switch (p.wtype) {
    case MoeWeightType::fp8:
      if (p.block_n <= 0 || p.block_k <= 0 || p.block_k % 16 != 0) return cudaErrorInvalidValue;
      return launch_weight_variant<MoeWeightType::fp8>(p, stream);
    case MoeWeightType::bf16: return launch_weight_variant<MoeWeightType::bf16>(p, stream);
    case MoeWeightType::f32: return launch_weight_variant<MoeWeightType::f32>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dsaserve::kernels::cuda
