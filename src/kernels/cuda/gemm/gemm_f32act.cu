// bf16 weights x f32 activations, many tokens (see gemm_f32act_params.h).
//
// CTA: WM x WN warps, each MT m16 tiles (tokens) x NT n8 tiles (outputs): BM = 16 WM MT tokens x BN = 8 WN NT
// outputs. Two shapes: 2 x 4 warps of 1 or 2 x 4 tiles (32 or 64 tokens x 128 outputs, two CTAs an SM: the
// narrow two-term linears, where the split doubles the MMAs) and 4 x 4 warps of 2 x 8 tiles (128 tokens x
// 256 outputs, one CTA an SM: the absorbed projections, whose f32 activations and per-head weights are
// re-read from L2 once per output tile and token tile: the larger tile halves that traffic and gives each
// warp 2 MMAs per 16-byte shared-memory read instead of 1.3). Each K block of 32 is staged with cp.async,
// kStages blocks ahead:
// - x: BM rows of 32 f32 (128 bytes, eight 16-byte chunks; chunk c of row r at c ^ (r & 1));
// - W [N][K]: BN rows of 32 bf16 (64 bytes, four chunks, unswizzled);
// - W [K][N] (trans_w): 32 rows of BN bf16 (BN / 8 chunks; chunk c of row k at c ^ s(k),
//   s(k) = 2 ((k >> 3) & 3) + (k & 1)).
// mma.sync m16n8k16 wants lane (g, t) to hold k slots {2t, 2t+1, 2t+8, 2t+9}; any assignment of physical k
// to slots works when A and B agree, so lane t takes physical k [8t, 8t + 8) of the block: its first four
// for the first mma of the block, the last four for the second. Then A is two 16-byte reads of f32 per row
// (chunks 2t and 2t+1: with the parity swizzle the two rows a quarter-warp reads fall in different bank
// halves), B [N][K] one 16-byte read per n8 tile (row g, chunk t), and B [K][N] one ldmatrix.x4.trans per n8
// tile whose eight row addresses per matrix are the physical k rows the slots want (matrix j, row r:
// k = 8 (r >> 1) + (r & 1) + 2 (j & 1) + 4 (j >> 1); s(k) makes them eight different bank groups).
// The conversion happens in registers as A is read (all of a block's A fragments first, then one n8 tile's
// B at a time): hi = bf16(x) (round to nearest even, as the split pass and the cast kernel do), lo =
// bf16(x - hi) for the split.
#include <cuda_bf16.h>

#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/common/sm90_mma.cuh"
#include "kernels/cuda/gemm/gemm_f32act_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kBK = 32;  // K per stage
constexpr int kStages = 4;

template <int WM_, int WN_, int MT_, int NT_, int kMinBlocks_>
struct Cfg {
  static constexpr int WM = WM_, WN = WN_, MT = MT_, NT = NT_, kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kBM = WM * MT * 16;  // tokens per CTA
  static constexpr int kBN = WN * NT * 8;   // outputs per CTA
  static constexpr int kX = kBM * kBK * 4;  // x bytes per stage
  static constexpr int kW = kBN * kBK * 2;  // W bytes per stage (either layout)
  static constexpr int kBytes = kX + kW;
  static constexpr size_t kSmem = size_t(kStages) * kBytes;
};
using Narrow32 = Cfg<2, 4, 1, 4, 2>;  // 32 tokens x 128 outputs, 256 threads
using Narrow64 = Cfg<2, 4, 2, 4, 2>;  // 64 x 128
using Wide = Cfg<4, 4, 2, 8, 1>;      // 128 x 256, 512 threads
constexpr int kNarrowBN = Narrow32::kBN, kWideBN = Wide::kBN, kWideBM = Wide::kBM;

__device__ __forceinline__ int trans_swizzle(int k) { return (((k >> 3) & 3) << 1) | (k & 1); }

// The FP8 copy of a CTA's output tile (F32ActGemmParams::q_codes): each 128 columns of the tile are one
// 128-group of every token row (n0 and the batch's column offset are multiples of 128), held by kWpg warps
// along the outputs. The amax of a row in a group: each thread's 2 NT values, the 4 lanes of the row
// (shuffles), the group's warps (shared memory); then launch_quant_fp8's rule (fp8_act_scale, fp8_act_code)
// on the same f32 values the output holds. Rows past T have zero activations, so zero sums: amax 0, scale 1,
// codes 0, the padding rows' rule. Groups past N (N % 128 == 0: whole groups) are skipped.
template <class C>
__device__ __forceinline__ void quantise_tile(const F32ActGemmParams& p, const float (&acc)[C::MT][C::NT][4],
                                              int64_t N, int64_t t0, int64_t n0, int64_t b, int wm, int wn,
                                              int g, int t) {
  constexpr int kWpg = 128 / (C::NT * 8);  // warps along the outputs per 128-group
  static_assert(kWpg >= 1 && kWpg * C::NT * 8 == 128 && C::WN % kWpg == 0, "groups of whole warps");
  __shared__ float s_amax[C::WN][C::kBM];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
    float m0 = 0.0f, m1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < C::NT; ++nt) {
      m0 = fmaxf(m0, fmaxf(fabsf(acc[mt][nt][0]), fabsf(acc[mt][nt][1])));
      m1 = fmaxf(m1, fmaxf(fabsf(acc[mt][nt][2]), fabsf(acc[mt][nt][3])));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    if (t == 0) {
      const int r = wm * C::MT * 16 + mt * 16 + g;
      s_amax[wn][r] = m0;
      s_amax[wn][r + 8] = m1;
    }
  }
  __syncthreads();
  const int gi = wn / kWpg;                // this warp's group in the tile
  const int64_t gcol = n0 + gi * 128;      // the group's first output
  if (gcol >= N) return;                   // (no barrier follows)
  const int64_t col0 = b * p.q_bs + gcol;  // its first column in the codes
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * C::MT * 16 + mt * 16 + g + 8 * h;
      const int64_t tok = t0 + r;
      if (tok >= p.q_rows) continue;
      float amax = s_amax[gi * kWpg][r];
#pragma unroll
      for (int w = 1; w < kWpg; ++w) amax = fmaxf(amax, s_amax[gi * kWpg + w][r]);
      const float sc = fp8_act_scale(amax);
      uint8_t* row = p.q_codes + tok * p.q_ld + col0 + (wn % kWpg) * C::NT * 8 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < C::NT; ++nt) {
        const uint32_t lo = fp8_act_code(acc[mt][nt][2 * h], sc),
                       hi = fp8_act_code(acc[mt][nt][2 * h + 1], sc);
        *reinterpret_cast<uint16_t*>(row + nt * 8) = uint16_t(lo | (hi << 8));
      }
      if (wn % kWpg == 0 && t == 0) p.q_scales[(col0 / 128) * p.q_rows + tok] = sc;
    }
  }
}

template <class C, bool kSplit, bool kTrans, bool kQuant>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    sm90_f32act_gemm_kernel(const F32ActGemmParams p) {
  pdl_enter();
  constexpr int MT = C::MT, NT = C::NT, kBM = C::kBM, kBN = C::kBN, kThreads = C::kThreads;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp / C::WN, wn = warp % C::WN;

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
  const int64_t t0 = int64_t(blockIdx.y) * kBM, b = blockIdx.z;
  const float* x = p.x + b * p.x_bs;
  const uint16_t* w = sg.w + b * p.w_bs;
  float* out = sg.out + b * p.out_bs;
  const int64_t nkb = p.K / kBK;

  auto load = [&](int64_t kb, int stage) {
    uint8_t* sx = smem + size_t(stage) * C::kBytes;
    uint8_t* sw = sx + C::kX;
    for (int i = threadIdx.x; i < kBM * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      const bool ok = t0 + r < p.T;
      const float* src = x + (ok ? t0 + r : 0) * p.x_ld + kb * kBK + c * 4;
      mma::cp_async16(sx + r * 128 + ((c ^ (r & 1)) * 16), src, ok ? 16 : 0);
    }
    if constexpr (kTrans) {
      constexpr int kChunks = kBN / 8;  // 16-byte chunks of a row of kBN bf16
      for (int i = threadIdx.x; i < kBK * kChunks; i += kThreads) {
        const int k = i / kChunks, c = i % kChunks;
        const bool ok = n0 + c * 8 < N;  // N % 8 == 0: whole chunks
        const uint16_t* src = w + (kb * kBK + k) * sg.w_ld + (ok ? n0 + c * 8 : 0);
        mma::cp_async16(sw + k * (kBN * 2) + ((c ^ trans_swizzle(k)) * 16), src, ok ? 16 : 0);
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

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nkb) load(s, s);
    mma::cp_async_commit();
  }
  // ldmatrix row address of this lane (trans_w): matrix j = lane / 8, row r = lane % 8.
  const int lj = lane >> 3, lr = lane & 7;
  const int lk = 8 * (lr >> 1) + (lr & 1) + 2 * (lj & 1) + 4 * (lj >> 1);
  // Warps whose outputs all lie past N (a narrow segment: weights_proj's 32 rows in a 128-wide tile) only
  // copy: their tensor-core time goes to the other CTAs of the SM.
  const bool active = n0 + wn * NT * 8 < N;
  for (int64_t i = 0; i < nkb; ++i) {
    mma::cp_async_wait<kStages - 2>();  // this block has landed (own copies) ...
    __syncthreads();                    // ... everyone's, and the stage refilled below is no longer read
    if (i + kStages - 1 < nkb) load(i + kStages - 1, int((i + kStages - 1) % kStages));
    mma::cp_async_commit();
    if (!active) continue;
    const uint8_t* sx = smem + size_t(i % kStages) * C::kBytes;
    const uint8_t* sw = sx + C::kX;
    // A fragments of the block's two k16 steps: ah[ks][mt] (and al, the split's second term).
    uint32_t ah[2][MT][4], al[2][MT][4];
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const int c = 2 * t + ks;  // this lane's f32 chunk: physical k [8t + 4 ks, 8t + 4 ks + 4)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int ra = wm * MT * 16 + mt * 16 + g, rb = ra + 8;
        const float4 fa = *reinterpret_cast<const float4*>(sx + ra * 128 + ((c ^ (ra & 1)) * 16));
        const float4 fb = *reinterpret_cast<const float4*>(sx + rb * 128 + ((c ^ (rb & 1)) * 16));
        if constexpr (kSplit) {
          split_pair(fa.x, fa.y, ah[ks][mt][0], al[ks][mt][0]);
          split_pair(fb.x, fb.y, ah[ks][mt][1], al[ks][mt][1]);
          split_pair(fa.z, fa.w, ah[ks][mt][2], al[ks][mt][2]);
          split_pair(fb.z, fb.w, ah[ks][mt][3], al[ks][mt][3]);
        } else {
          ah[ks][mt][0] = mma::pack_bf16(fa.x, fa.y);
          ah[ks][mt][1] = mma::pack_bf16(fb.x, fb.y);
          ah[ks][mt][2] = mma::pack_bf16(fa.z, fa.w);
          ah[ks][mt][3] = mma::pack_bf16(fb.z, fb.w);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      // B fragments of the n8 tile: bw[0..1] for the first k16 step, [2..3] for the second.
      uint32_t bw[4];
      if constexpr (kTrans) {
        const int c = wn * NT + nt;  // the n8 tile's chunk in a row
        mma::ldsm_x4_trans(bw, sw + lk * (kBN * 2) + ((c ^ trans_swizzle(lk)) * 16));
      } else {
        const int n = wn * NT * 8 + nt * 8 + g;
        const uint4 v = *reinterpret_cast<const uint4*>(sw + n * 64 + t * 16);
        bw[0] = v.x;
        bw[1] = v.y;
        bw[2] = v.z;
        bw[3] = v.w;
      }
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma::mma_bf16(acc[mt][nt], ah[ks][mt], bw[2 * ks], bw[2 * ks + 1]);
          if constexpr (kSplit) mma::mma_bf16(acc[mt][nt], al[ks][mt], bw[2 * ks], bw[2 * ks + 1]);
        }
      }
    }
  }
  mma::cp_async_wait<0>();

  if constexpr (kQuant) quantise_tile<C>(p, acc, N, t0, n0, b, wm, wn, g, t);

    // acc[mt][nt]: rows (tokens) g and g + 8 of the m16 tile, columns (outputs) 2t and 2t + 1 of the n8 tile.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t ta = t0 + wm * MT * 16 + mt * 16 + g, tb = ta + 8;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t n = n0 + wn * NT * 8 + nt * 8 + 2 * t;
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

template <class C, bool kSplit, bool kTrans, bool kQuant = false>
cudaError_t launch_cfg(const F32ActGemmParams& p, dim3 grid, cudaStream_t stream) {
  auto* kernel = sm90_f32act_gemm_kernel<C, kSplit, kTrans, kQuant>;
  const cudaError_t attr = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(C::kSmem));
  if (attr != cudaSuccess) return attr;
  return launch_pdl(p.pdl, kernel, grid, dim3(C::kThreads), C::kSmem, stream, p);
}

// The narrow shapes run either product; the wide one the one-term product (and its FP8 copy).
template <class C>
cudaError_t launch_narrow(const F32ActGemmParams& p, dim3 grid, cudaStream_t stream) {
  if (p.split) {
    if (p.trans_w) return launch_cfg<C, true, true>(p, grid, stream);
    return launch_cfg<C, true, false>(p, grid, stream);
  }
  if (p.trans_w) return launch_cfg<C, false, true>(p, grid, stream);
  return launch_cfg<C, false, false>(p, grid, stream);
}
cudaError_t launch_wide(const F32ActGemmParams& p, dim3 grid, cudaStream_t stream) {
  if (p.q_codes != nullptr) return launch_cfg<Wide, false, false, true>(p, grid, stream);
  if (p.trans_w) return launch_cfg<Wide, false, true>(p, grid, stream);
  return launch_cfg<Wide, false, false>(p, grid, stream);
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

int64_t output_tiles(const F32ActGemmParams& p, int64_t bn) {
  int64_t tiles = 0;
  for (int s = 0; s < p.segments; ++s) tiles += (p.seg[s].N + bn - 1) / bn;
  return tiles;
}

}  // namespace

int f32act_tile_tokens(const F32ActGemmParams& p) {
  if (p.tile_tokens == 32 || p.tile_tokens == 64 || p.tile_tokens == kWideBM) return p.tile_tokens;
  if (!p.split) return kWideBM;
  // 64 tokens while that still fills 7/8 of a wave: each CTA re-reads its 128 weight rows from L2, so the
  // taller tile halves that traffic (a [256 x 6144] weight at 4,096 tokens: 128 CTAs, 400 -> 200 MB).
  const int64_t ctas64 = output_tiles(p, kNarrowBN) * ((p.T + 63) / 64) * int64_t(p.batch > 0 ? p.batch : 1);
  return 8 * ctas64 >= 7 * int64_t(device_sm_count()) ? 64 : 32;
}

bool f32act_gemm_supported(const F32ActGemmParams& p) {
  if (p.segments < 1 || p.segments > kF32ActMaxSegments || p.batch < 1 || (p.batch > 1 && p.segments != 1))
    return false;
  if (p.T < 0 || p.K <= 0 || p.K % kBK != 0 || p.x == nullptr || !aligned(p.x, 16) || p.x_ld % 4 != 0 ||
      p.x_bs % 4 != 0 || p.w_bs % 8 != 0 || p.out_bs % 2 != 0)
    return false;
  if (p.tile_tokens != 0 && p.tile_tokens != 32 && p.tile_tokens != 64 && p.tile_tokens != kWideBM)
    return false;
  const bool wide = f32act_tile_tokens(p) == kWideBM;
  if (wide && p.split) return false;  // the wide shape is built for the one-term product only
  if (p.batch > 65535 || (p.T + 31) / 32 > 65535) return false;
  if (p.q_codes != nullptr &&
      (!wide || p.q_scales == nullptr || p.segments != 1 || p.trans_w || p.seg[0].N % 128 != 0 ||
       p.q_bs % 128 != 0 || p.q_ld % 128 != 0 || p.q_rows < p.T || p.q_rows > (p.T + 31) / 32 * 32 ||
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
  const int64_t bn = bm == kWideBM ? kWideBN : kNarrowBN;
  const dim3 grid(unsigned(output_tiles(p, bn)), unsigned((p.T + bm - 1) / bm), unsigned(p.batch));
  if (bm == kWideBM) return launch_wide(p, grid, stream);
  if (bm == 64) return launch_narrow<Narrow64>(p, grid, stream);
  return launch_narrow<Narrow32>(p, grid, stream);
}

}  // namespace dsaserve::kernels::cuda
