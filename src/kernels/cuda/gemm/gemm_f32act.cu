// bf16 weights x f32 activations, many tokens (see gemm_f32act_params.h).
//
// CTA: 8 warps, 2 along the tokens (MT m16 tiles each) x 4 along the outputs (4 n8 tiles each): BM = 32 MT
// tokens x 128 outputs. Each K block of 32 is staged with cp.async, kStages blocks ahead:
// - x: BM rows of 32 f32 (128 bytes, eight 16-byte chunks; chunk c of row r at c ^ (r & 1));
// - W [N][K]: 128 rows of 32 bf16 (64 bytes, four chunks, unswizzled);
// - W [K][N] (trans_w): 32 rows of 128 bf16 (256 bytes, 16 chunks; chunk c of row k at c ^ s(k),
//   s(k) = 2 ((k >> 3) & 3) + (k & 1)).
// mma.sync m16n8k16 wants lane (g, t) to hold k slots {2t, 2t+1, 2t+8, 2t+9}; any assignment of physical k
// to slots works when A and B agree, so lane t takes physical k [8t, 8t + 8) of the block: its first four
// for the first mma of the block, the last four for the second. Then A is two 16-byte reads of f32 per row
// (chunks 2t and 2t+1: with the parity swizzle the two rows a quarter-warp reads fall in different bank
// halves), B [N][K] one 16-byte read per n8 tile (row g, chunk t), and B [K][N] one ldmatrix.x4.trans per n8
// tile whose eight row addresses per matrix are the physical k rows the slots want (matrix j, row r:
// k = 8 (r >> 1) + (r & 1) + 2 (j & 1) + 4 (j >> 1); s(k) makes them eight different bank groups).
// The conversion happens in registers as A is read: hi = bf16(x) (round to nearest even, as the split pass
// and the cast kernel do), lo = bf16(x - hi) for the split.
#include <cuda_bf16.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/sm90_mma.cuh"
#include "kernels/cuda/gemm/gemm_f32act_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarpsM = 2, kWarpsN = 4;
constexpr int kThreads = kWarpsM * kWarpsN * 32;
constexpr int kNT = 4;                  // n8 tiles per warp
constexpr int kBN = kWarpsN * kNT * 8;  // 128 outputs per CTA
constexpr int kBK = 32;                 // K per stage
constexpr int kStages = 4;
static_assert(kBN == kF32ActTileN, "tile width");

template <int MT>
struct Tile {
  static constexpr int kBM = kWarpsM * MT * 16;  // tokens per CTA
  static constexpr int kX = kBM * kBK * 4;       // x bytes per stage
  static constexpr int kW = kBN * kBK * 2;       // W bytes per stage (either layout)
  static constexpr int kBytes = kX + kW;
  static constexpr size_t kSmem = size_t(kStages) * kBytes;
};

__device__ __forceinline__ int trans_swizzle(int k) { return (((k >> 3) & 3) << 1) | (k & 1); }

// hi = bf16 pair of (a, b) (a in the low half); lo = the pair of what hi leaves.
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// The FP8 copy of a CTA's output tile (F32ActGemmParams::q_codes): its 128 columns are one 128-group of each
// token row (n0 and the batch's column offset are multiples of 128). The amax of a row: each thread's 8
// values, the 4 lanes of the row (shuffles), the 4 warps along the outputs (shared memory); then
// launch_quant_fp8's rule (fp8_act_scale, fp8_act_code) on the same f32 values the output holds. Rows past T
// have zero activations, so zero sums: amax 0, scale 1, codes 0, the padding rows' rule.
template <int MT>
__device__ __forceinline__ void quantise_tile(const F32ActGemmParams& p, const float (&acc)[MT][kNT][4],
                                              int64_t t0, int64_t n0, int64_t b, int wm, int wn, int g,
                                              int t) {
  __shared__ float s_amax[kWarpsN][kWarpsM * MT * 16];
  float m[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      m[mt][0] = fmaxf(m[mt][0], fmaxf(fabsf(acc[mt][nt][0]), fabsf(acc[mt][nt][1])));
      m[mt][1] = fmaxf(m[mt][1], fmaxf(fabsf(acc[mt][nt][2]), fabsf(acc[mt][nt][3])));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[mt][h] = fmaxf(m[mt][h], __shfl_xor_sync(0xffffffffu, m[mt][h], 1));
      m[mt][h] = fmaxf(m[mt][h], __shfl_xor_sync(0xffffffffu, m[mt][h], 2));
    }
    if (t == 0) {
      const int r = wm * MT * 16 + mt * 16 + g;
      s_amax[wn][r] = m[mt][0];
      s_amax[wn][r + 8] = m[mt][1];
    }
  }
  __syncthreads();
  const int64_t col0 = b * p.q_bs + n0;  // the group's first column
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * MT * 16 + mt * 16 + g + 8 * h;
      const int64_t tok = t0 + r;
      if (tok >= p.q_rows) continue;
      float amax = s_amax[0][r];
#pragma unroll
      for (int w = 1; w < kWarpsN; ++w) amax = fmaxf(amax, s_amax[w][r]);
      const float sc = fp8_act_scale(amax);
      uint8_t* row = p.q_codes + tok * p.q_ld + col0 + wn * kNT * 8 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint32_t lo = fp8_act_code(acc[mt][nt][2 * h], sc),
                       hi = fp8_act_code(acc[mt][nt][2 * h + 1], sc);
        *reinterpret_cast<uint16_t*>(row + nt * 8) = uint16_t(lo | (hi << 8));
      }
      if (wn == 0 && t == 0) p.q_scales[(col0 / 128) * p.q_rows + tok] = sc;
    }
  }
}

template <int MT, bool kSplit, bool kTrans, bool kQuant>
__global__ void __launch_bounds__(kThreads, 2) sm90_f32act_gemm_kernel(const F32ActGemmParams p) {
  using S = Tile<MT>;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp / kWarpsN, wn = warp % kWarpsN;

  // This CTA's segment and output tile, token tile and batch.
  int seg = 0;
  int64_t tile = blockIdx.x;
  const int64_t tiles0 = (p.seg[0].N + kBN - 1) / kBN;
  if (p.segments > 1 && tile >= tiles0) {
    seg = 1;
    tile -= tiles0;
  }
  const F32ActSegment sg = seg == 0 ? p.seg[0] : p.seg[1];  // no dynamic index into the params
  const int64_t N = sg.N, n0 = tile * kBN;
  if (n0 >= N) return;
  const int64_t t0 = int64_t(blockIdx.y) * S::kBM, b = blockIdx.z;
  const float* x = p.x + b * p.x_bs;
  const uint16_t* w = sg.w + b * p.w_bs;
  float* out = sg.out + b * p.out_bs;
  const int64_t nkb = p.K / kBK;

  auto load = [&](int64_t kb, int stage) {
    uint8_t* sx = smem + size_t(stage) * S::kBytes;
    uint8_t* sw = sx + S::kX;
    for (int i = threadIdx.x; i < S::kBM * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      const bool ok = t0 + r < p.T;
      const float* src = x + (ok ? t0 + r : 0) * p.x_ld + kb * kBK + c * 4;
      mma::cp_async16(sx + r * 128 + ((c ^ (r & 1)) * 16), src, ok ? 16 : 0);
    }
    if constexpr (kTrans) {
      for (int i = threadIdx.x; i < kBK * 16; i += kThreads) {
        const int k = i >> 4, c = i & 15;
        const bool ok = n0 + c * 8 < N;  // N % 8 == 0: whole chunks
        const uint16_t* src = w + (kb * kBK + k) * sg.w_ld + (ok ? n0 + c * 8 : 0);
        mma::cp_async16(sw + k * 256 + ((c ^ trans_swizzle(k)) * 16), src, ok ? 16 : 0);
      }
    } else {
      for (int i = threadIdx.x; i < kBN * 4; i += kThreads) {
        const int r = i >> 2, c = i & 3;
        const bool ok = n0 + r < N;
        const uint16_t* src = w + (ok ? n0 + r : 0) * sg.w_ld + kb * kBK + c * 8;
        mma::cp_async16(sw + r * 64 + c * 16, src, ok ? 16 : 0);
      }
    }
  };

  float acc[MT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load(s, s);
    mma::cp_async_commit();
  }
  // ldmatrix row address of this lane (trans_w): matrix j = lane / 8, row r = lane % 8.
  const int lj = lane >> 3, lr = lane & 7;
  const int lk = 8 * (lr >> 1) + (lr & 1) + 2 * (lj & 1) + 4 * (lj >> 1);
  // Warps whose 32 outputs all lie past N (a narrow segment: weights_proj's 32 rows in a 128-wide tile)
  // only copy: their tensor-core time goes to the other CTAs of the SM.
  const bool active = n0 + wn * kNT * 8 < N;
  for (int64_t i = 0; i < nkb; ++i) {
    mma::cp_async_wait<kStages - 2>();  // this block has landed (own copies) ...
    __syncthreads();                    // ... everyone's, and the stage refilled below is no longer read
    if (i + kStages - 1 < nkb) load(i + kStages - 1, int((i + kStages - 1) % kStages));
    mma::cp_async_commit();
    if (!active) continue;
    const uint8_t* sx = smem + size_t(i % kStages) * S::kBytes;
    const uint8_t* sw = sx + S::kX;
    // B fragments of the block: bw[nt][0..1] for the first mma, [2..3] for the second.
    uint32_t bw[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if constexpr (kTrans) {
        const int c = wn * kNT + nt;  // the n8 tile's chunk in a row
        mma::ldsm_x4_trans(bw[nt], sw + lk * 256 + ((c ^ trans_swizzle(lk)) * 16));
      } else {
        const int n = wn * kNT * 8 + nt * 8 + g;
        const uint4 v = *reinterpret_cast<const uint4*>(sw + n * 64 + t * 16);
        bw[nt][0] = v.x;
        bw[nt][1] = v.y;
        bw[nt][2] = v.z;
        bw[nt][3] = v.w;
      }
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int c = 2 * t + ks;  // this lane's f32 chunk: physical k [8t + 4 ks, 8t + 4 ks + 4)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int ra = wm * MT * 16 + mt * 16 + g, rb = ra + 8;
        const float4 fa = *reinterpret_cast<const float4*>(sx + ra * 128 + ((c ^ (ra & 1)) * 16));
        const float4 fb = *reinterpret_cast<const float4*>(sx + rb * 128 + ((c ^ (rb & 1)) * 16));
        uint32_t hi[4], lo[4];
        if constexpr (kSplit) {
          split2(fa.x, fa.y, hi[0], lo[0]);
          split2(fb.x, fb.y, hi[1], lo[1]);
          split2(fa.z, fa.w, hi[2], lo[2]);
          split2(fb.z, fb.w, hi[3], lo[3]);
        } else {
          hi[0] = mma::pack_bf16(fa.x, fa.y);
          hi[1] = mma::pack_bf16(fb.x, fb.y);
          hi[2] = mma::pack_bf16(fa.z, fa.w);
          hi[3] = mma::pack_bf16(fb.z, fb.w);
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          mma::mma_bf16(acc[mt][nt], hi, bw[nt][2 * ks], bw[nt][2 * ks + 1]);
          if constexpr (kSplit) mma::mma_bf16(acc[mt][nt], lo, bw[nt][2 * ks], bw[nt][2 * ks + 1]);
        }
      }
    }
  }
  mma::cp_async_wait<0>();

  if constexpr (kQuant) quantise_tile<MT>(p, acc, t0, n0, b, wm, wn, g, t);

    // acc[mt][nt]: rows (tokens) g and g + 8 of the m16 tile, columns (outputs) 2t and 2t + 1 of the n8 tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t ta = t0 + wm * MT * 16 + mt * 16 + g, tb = ta + 8;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int64_t n = n0 + wn * kNT * 8 + nt * 8 + 2 * t;
      if (n >= N) continue;
      const bool pair = n + 1 < N;
      if (ta < p.T) {
        float* d = out + ta * sg.out_ld + n;
        if (pair) {
          *reinterpret_cast<float2*>(d) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
        } else {
          d[0] = acc[mt][nt][0];
        }
      }
      if (tb < p.T) {
        float* d = out + tb * sg.out_ld + n;
        if (pair) {
          *reinterpret_cast<float2*>(d) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        } else {
          d[0] = acc[mt][nt][2];
        }
      }
    }
  }
}

template <int MT, bool kSplit, bool kTrans, bool kQuant = false>
cudaError_t launch_cfg(const F32ActGemmParams& p, dim3 grid, cudaStream_t stream) {
  auto* kernel = sm90_f32act_gemm_kernel<MT, kSplit, kTrans, kQuant>;
  const cudaError_t attr = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(Tile<MT>::kSmem));
  if (attr != cudaSuccess) return attr;
  kernel<<<grid, kThreads, Tile<MT>::kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int MT>
cudaError_t launch_mt(const F32ActGemmParams& p, dim3 grid, cudaStream_t stream) {
  if (p.q_codes != nullptr) return launch_cfg<MT, false, false, true>(p, grid, stream);
  if (p.split) {
    if (p.trans_w) return launch_cfg<MT, true, true>(p, grid, stream);
    return launch_cfg<MT, true, false>(p, grid, stream);
  }
  if (p.trans_w) return launch_cfg<MT, false, true>(p, grid, stream);
  return launch_cfg<MT, false, false>(p, grid, stream);
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

int64_t output_tiles(const F32ActGemmParams& p) {
  int64_t tiles = 0;
  for (int s = 0; s < p.segments; ++s) tiles += (p.seg[s].N + kBN - 1) / kBN;
  return tiles;
}

}  // namespace

int f32act_tile_tokens(const F32ActGemmParams& p) {
  if (p.tile_tokens == 32 || p.tile_tokens == 64) return p.tile_tokens;
  const int64_t ctas64 = output_tiles(p) * ((p.T + 63) / 64) * int64_t(p.batch > 0 ? p.batch : 1);
  return ctas64 >= 2 * int64_t(device_sm_count()) ? 64 : 32;
}

bool f32act_gemm_supported(const F32ActGemmParams& p) {
  if (p.segments < 1 || p.segments > kF32ActMaxSegments || p.batch < 1 || (p.batch > 1 && p.segments != 1))
    return false;
  if (p.T < 0 || p.K <= 0 || p.K % kBK != 0 || p.x == nullptr || !aligned(p.x, 16) || p.x_ld % 4 != 0 ||
      p.x_bs % 4 != 0 || p.w_bs % 8 != 0 || p.out_bs % 2 != 0)
    return false;
  if (p.tile_tokens != 0 && p.tile_tokens != 32 && p.tile_tokens != 64) return false;
  if (p.batch > 65535 || (p.T + 31) / 32 > 65535) return false;
  if (p.q_codes != nullptr &&
      (p.q_scales == nullptr || p.segments != 1 || p.split || p.trans_w || p.seg[0].N % kBN != 0 ||
       p.q_bs % kBN != 0 || p.q_ld % kBN != 0 || p.q_rows < p.T || p.q_rows > (p.T + 31) / 32 * 32 ||
       (p.batch - 1) * p.q_bs + p.seg[0].N > p.q_ld))
    return false;
  for (int s = 0; s < p.segments; ++s) {
    const F32ActSegment& g = p.seg[s];
    if (g.w == nullptr || g.out == nullptr || g.N <= 0 || !aligned(g.w, 16) || g.w_ld % 8 != 0 ||
        !aligned(g.out, 8) || g.out_ld % 2 != 0 || (p.trans_w && g.N % 8 != 0))
      return false;
  }
  return true;
}

cudaError_t launch_f32act_gemm(const F32ActGemmParams& p, cudaStream_t stream) {
  if (!f32act_gemm_supported(p)) return cudaErrorInvalidValue;
  if (p.T == 0) return cudaSuccess;
  const int bm = f32act_tile_tokens(p);
  const dim3 grid(unsigned(output_tiles(p)), unsigned((p.T + bm - 1) / bm), unsigned(p.batch));
  if (bm == 64) return launch_mt<2>(p, grid, stream);
  return launch_mt<1>(p, grid, stream);
}

}  // namespace dsaserve::kernels::cuda
