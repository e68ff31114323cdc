// Dense causal MHA-form prefill attention on tensor cores (FlashAttention-2 style, mma.sync m16n8k16 bf16
// with f32 accumulation and an online softmax).
//
// Block = (head, tile of kBM query rows); kBM / 16 warps, warp w owns rows 16w .. 16w + 15 of the tile:
// 128-row tiles of 8 warps with 64-key tiles (one block an SM), or, when those would not fill the SMs
// (few heads, short chunks), 64-row tiles of 4 warps with 32-key tiles (two blocks an SM). The
// query tile (f32, converted to bf16 while staged) stays in shared memory; key / value tiles of BN keys
// stream through two cp.async buffers each (tile j + 1 loads while tile j is multiplied). For each key
// tile a warp computes S[16, BN] = Q K^T (ldmatrix from XOR-swizzled rows: 16-byte chunk c of row r at
// chunk c ^ (r % 8)), masks the keys past each row's position (only tiles that reach past the tile's first
// row), updates the running row maxima and sums, rescales O and adds P V (P as bf16 A fragments straight
// from the S accumulators, V through ldmatrix.trans). Tiles run in ascending key order, so every row sees
// key 0 in its first tile and its maximum is finite from then on. Heavy query tiles (the last rows: the
// most keys) are launched first. Keys at or past S are zero-filled (they are masked anyway).

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/attention/mha_prefill_params.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/sm90_mma.cuh"

namespace dsaserve::kernels::cuda {

namespace {

using bf16 = __nv_bfloat16;

// Element offset of (row, col) in a swizzled tile of rows of D bf16 values; col a multiple of 8.
template <int D>
__device__ __forceinline__ int off(int row, int col) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3);
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int DQK, int DV, int BN, int WARPS>
struct Config {
  static_assert(DQK % 64 == 0 && DV % 64 == 0, "rows of whole 8-chunk swizzle groups");
  static_assert(BN % 16 == 0, "key tiles of whole mma k-steps");
  static constexpr int kThreads = 32 * WARPS, kBM = 16 * WARPS;  // kBM: query rows of a block
  static constexpr int kKCh = DQK / 8, kVCh = DV / 8;            // 16-byte chunks of a key / value row
  static_assert((kBM * kKCh) % kThreads == 0, "whole rounds of query chunks per thread");
  static constexpr size_t kSmem = size_t(kBM * DQK + 2 * BN * DQK + 2 * BN * DV) * sizeof(bf16);
  static_assert(kSmem <= 227 * 1024, "shared memory");
};

// 8 warps (128-row query tiles, one block an SM) or 4 (64-row tiles, two blocks an SM).
template <int DQK, int DV, int BN, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, WARPS == 8 ? 1 : 2)
    sm90_mha_prefill_kernel(const MhaPrefillParams p) {
  using C = Config<DQK, DV, BN, WARPS>;
  constexpr int kThreads = C::kThreads, kBM = C::kBM;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBM][DQK]
  bf16* sK = sQ + kBM * DQK;                     // [2][BN][DQK]
  bf16* sV = sK + 2 * BN * DQK;                  // [2][BN][DV]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t h = blockIdx.x;
  const int64_t m0 = int64_t(gridDim.y - 1 - blockIdx.y) * kBM;  // heavy tiles first
  const int64_t rows_here = min(int64_t(kBM), p.tokens - m0);
  const int64_t key_end = p.start_pos + m0 + rows_here;  // keys 0 .. key_end - 1 are seen by some row
  const int n_tiles = int((key_end + BN - 1) / BN);
  const int64_t diag = p.start_pos + m0;  // a tile whose keys are all <= diag needs no mask

  const bf16* kn = static_cast<const bf16*>(p.k_nope) + h * p.kn_s1;
  const bf16* kr = static_cast<const bf16*>(p.k_rope);
  const bf16* vp = static_cast<const bf16*>(p.v) + h * p.v_s1;
  const int nope_ch = int(p.nope / 8);

  // Loads: thread tid copies 16-byte chunk column tid % kCh of rows tid / kCh, + kThreads / kCh, ... (the
  // threads past a whole number of columns idle), so its source column and stride are fixed.
  constexpr int kKRows = kThreads / C::kKCh, kVRows = kThreads / C::kVCh;
  const int kc = tid % C::kKCh, vc = tid % C::kVCh;
  const bool k_copier = tid < kKRows * C::kKCh, v_copier = tid < kVRows * C::kVCh;
  const bf16* k_col = kc < nope_ch ? kn + kc * 8 : kr + (kc - nope_ch) * 8;
  const int64_t k_stride = kc < nope_ch ? p.kn_s0 : p.kr_s0;
  const bf16* v_col = vp + vc * 8;
  auto load_k = [&](int j, int buf) {
    if (!k_copier) return;
    bf16* dst = sK + buf * BN * DQK;
    for (int r = tid / C::kKCh; r < BN; r += kKRows) {
      const int64_t s = int64_t(j) * BN + r;
      const bool ok = s < p.S;
      mma::cp_async16(dst + off<DQK>(r, kc * 8), k_col + (ok ? s : 0) * k_stride, ok ? 16 : 0);
    }
  };
  auto load_v = [&](int j, int buf) {
    if (!v_copier) return;
    bf16* dst = sV + buf * BN * DV;
    for (int r = tid / C::kVCh; r < BN; r += kVRows) {
      const int64_t s = int64_t(j) * BN + r;
      const bool ok = s < p.S;
      mma::cp_async16(dst + off<DV>(r, vc * 8), v_col + (ok ? s : 0) * p.v_s0, ok ? 16 : 0);
    }
  };

  load_k(0, 0);
  mma::cp_async_commit();
  load_v(0, 0);
  mma::cp_async_commit();

  // The query tile: f32 -> bf16 while staged; rows past the chunk are zeros (computed, never stored).
#pragma unroll 4
  for (int i = 0; i < kBM * C::kKCh / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx / C::kKCh, c = idx % C::kKCh;
    const int64_t t = m0 + r;
    float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (t < p.tokens) {
      const float* src = p.q + t * p.q_s0 + h * p.q_s1 + c * 8;
      if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
        const float4 a = *reinterpret_cast<const float4*>(src);
        const float4 b = *reinterpret_cast<const float4*>(src + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = src[e];
      }
    }
    uint4 packed;
    packed.x = mma::pack_bf16(x[0], x[1]);
    packed.y = mma::pack_bf16(x[2], x[3]);
    packed.z = mma::pack_bf16(x[4], x[5]);
    packed.w = mma::pack_bf16(x[6], x[7]);
    *reinterpret_cast<uint4*>(sQ + off<DQK>(r, c * 8)) = packed;
  }

  const float kNegInf = -__int_as_float(0x7f800000);
  float o[DV / 8][4];
#pragma unroll
  for (int i = 0; i < DV / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float row_m[2] = {kNegInf, kNegInf}, row_l[2] = {0.0f, 0.0f};  // rows g and g + 8 (l: this thread's part)
  const float sl2 = p.scale * 1.4426950408889634f;               // scores in log2 units
  const int g = lane >> 2, c2 = 2 * (lane & 3);
  const int64_t lim = p.start_pos + m0 + warp * 16 + g;  // row g's last visible key (row g + 8: lim + 8)
  // ldmatrix lane addressing. A (Q) and trans-B (V) fragments: lane l gives row (l & 7) + 8 ((l >> 3) & 1)
  // of the 16-row block at column half l >> 4; B (K) fragments: row (l & 7) + 8 (l >> 4) at column half
  // (l >> 3) & 1. Every such row is = l (mod 8), so within a group of 8 chunks (64 columns) the swizzled
  // chunk of k-step k (chunks 2 (k % 4) + half) is one of 4 per-lane offsets: sw_*[k % 4].
  const int x7 = lane & 7;
  int sw_a[4], sw_k[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sw_a[i] = ((2 * i + (lane >> 4)) ^ x7) * 8;
    sw_k[i] = ((2 * i + ((lane >> 3) & 1)) ^ x7) * 8;
  }
  const int a_row = warp * 16 + x7 + ((lane >> 3) & 1) * 8;  // Q rows; V rows: + 16 kk
  const int k_row = x7 + (lane >> 4) * 8;                    // K rows: + 16 nb
  const int v_row = x7 + ((lane >> 3) & 1) * 8;

  for (int j = 0; j < n_tiles; ++j) {
    const int buf = j & 1;
    mma::cp_async_wait<1>();  // K_j landed (V_j may still be in flight)
    __syncthreads();          // ... for every thread; tile j - 1's buffers are free
    if (j + 1 < n_tiles) load_k(j + 1, buf ^ 1);
    mma::cp_async_commit();  // (an empty group on the last tile keeps the counting uniform)

    // S = Q K_j^T: [16 rows, BN keys] per warp.
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    const bf16* kb = sK + buf * BN * DQK;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t a[4];
      mma::ldsm_x4(a, sQ + a_row * DQK + (kk >> 2) * 64 + sw_a[kk & 3]);
#pragma unroll
      for (int nb = 0; nb < BN / 16; ++nb) {
        uint32_t b[4];
        mma::ldsm_x4(b, kb + (nb * 16 + k_row) * DQK + (kk >> 2) * 64 + sw_k[kk & 3]);
        mma::mma_bf16(s[2 * nb], a, b[0], b[1]);
        mma::mma_bf16(s[2 * nb + 1], a, b[2], b[3]);
      }
    }
    // Row g sees tile keys 0 .. vis (row g + 8: vis + 8); clamped into int range.
    const int64_t vis64 = lim - int64_t(j) * BN;
    const int vis = int(vis64 > BN ? BN : vis64 < -2 * BN ? -2 * BN : vis64);
    const bool masked = int64_t(j) * BN + BN - 1 > diag;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool hide = masked && i * 8 + c2 + (e & 1) > vis + (e >> 1) * 8;
        s[i][e] = hide ? kNegInf : s[i][e] * sl2;
      }
    }
    // Online softmax for rows g (r = 0) and g + 8 (r = 1): the quad of lanes holding a row agrees on M. O
    // is rescaled only when some row of the warp moved its maximum (else every factor is 1).
    float corr[2];
    bool moved = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = kNegInf;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(s[i][2 * r], s[i][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_m[r], mx);
      const float m_use = m_new == kNegInf ? 0.0f : m_new;
      const bool row_moved = m_new != row_m[r];
      corr[r] = row_moved ? ex2(row_m[r] - m_use) : 1.0f;  // 0 on the first tile (row_m = -inf)
      moved = moved || row_moved;
      row_m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) {
        s[i][2 * r] = ex2(s[i][2 * r] - m_use);
        s[i][2 * r + 1] = ex2(s[i][2 * r + 1] - m_use);
        sum += s[i][2 * r] + s[i][2 * r + 1];
      }
      row_l[r] = row_l[r] * corr[r] + sum;
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int i = 0; i < DV / 8; ++i) {
        o[i][0] *= corr[0];
        o[i][1] *= corr[0];
        o[i][2] *= corr[1];
        o[i][3] *= corr[1];
      }
    }

    mma::cp_async_wait<1>();  // V_j landed (K_{j+1} may still be in flight)
    __syncthreads();
    if (j + 1 < n_tiles) load_v(j + 1, buf ^ 1);
    mma::cp_async_commit();

    // O += P V_j: P's accumulators of key blocks 2kk, 2kk + 1 are the A fragment of k-step kk.
    const bf16* vb = sV + buf * BN * DV;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = mma::pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = mma::pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = mma::pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = mma::pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int db = 0; db < DV / 16; ++db) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b, vb + (kk * 16 + v_row) * DV + (db >> 2) * 64 + sw_a[db & 3]);
        mma::mma_bf16(o[2 * db], a, b[0], b[1]);
        mma::mma_bf16(o[2 * db + 1], a, b[2], b[3]);
      }
    }
  }
  mma::cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_l[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int64_t t = m0 + warp * 16 + g + 8 * r;
    if (t >= p.tokens) continue;
    float* dst = p.out + (t * p.heads + h) * DV;
#pragma unroll
    for (int i = 0; i < DV / 8; ++i)
      *reinterpret_cast<float2*>(dst + i * 8 + c2) = make_float2(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
  }
}

template <int DQK, int DV, int BN, int WARPS>
cudaError_t launch_config(const MhaPrefillParams& p, cudaStream_t stream) {
  using C = Config<DQK, DV, BN, WARPS>;
  auto* kernel = sm90_mha_prefill_kernel<DQK, DV, BN, WARPS>;
  const cudaError_t e = set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), int(C::kSmem));
  if (e != cudaSuccess) return e;
  const int64_t m_tiles = (p.tokens + C::kBM - 1) / C::kBM;
  if (m_tiles > 65535) return cudaErrorInvalidValue;
  kernel<<<dim3(unsigned(p.heads), unsigned(m_tiles)), C::kThreads, C::kSmem, stream>>>(p);
  return cudaGetLastError();
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

// One warp per row [i, j] (a warp-stride loop over the n0 x n1 rows, fewer than 2^31: one 32-bit division
// a row), its lanes over the row's values, 4 at a time (float4 loads, n2 % 4 == 0) when kVec.
constexpr int kCopyThreads = 256;
template <bool kVec>
__global__ void __launch_bounds__(kCopyThreads) sm90_mha_to_bf16_kernel(const MhaToBf16Params p) {
  constexpr int kPer = kVec ? 4 : 1;
  const int per_row = int(p.n2 / kPer), lane = threadIdx.x & 31;
  const unsigned rows = unsigned(p.n0 * p.n1), n1 = unsigned(p.n1), warps = gridDim.x * (kCopyThreads / 32);
  bf16* dst = static_cast<bf16*>(p.dst);
  for (unsigned row = blockIdx.x * (kCopyThreads / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const unsigned a = row / n1, j = row - a * n1;
    const float* src = p.src + int64_t(a) * p.s0 + int64_t(j) * p.s1;
    bf16* d = dst + int64_t(row) * p.n2;
    for (int k = lane; k < per_row; k += 32) {
      if constexpr (kVec) {
        const float4 x = *reinterpret_cast<const float4*>(src + 4 * k);
        uint2 y;
        y.x = mma::pack_bf16(x.x, x.y);
        y.y = mma::pack_bf16(x.z, x.w);
        *reinterpret_cast<uint2*>(d + 4 * k) = y;
      } else {
        d[k] = __float2bfloat16_rn(src[k]);
      }
    }
  }
}

}  // namespace

bool mha_prefill_supported(int64_t nope, int64_t R, int64_t dv) {
  if (nope <= 0 || R <= 0 || nope % 8 != 0 || R % 8 != 0) return false;
  const int64_t dqk = nope + R;
  return (dqk == 256 && dv == 256) || (dqk == 192 && dv == 128);
}

int mha_prefill_tile_rows(int64_t heads, int64_t tokens, int num_sms) {
  return heads * ((tokens + 127) / 128) >= num_sms ? 128 : 64;
}

cudaError_t launch_mha_prefill(const MhaPrefillParams& p, cudaStream_t stream) {
  if (!mha_prefill_supported(p.nope, p.R, p.dv) || p.start_pos < 0 || p.start_pos + p.tokens > p.S)
    return cudaErrorInvalidValue;
  if (p.tokens == 0 || p.heads == 0) return cudaSuccess;
  if (!aligned16(p.k_nope) || !aligned16(p.k_rope) || !aligned16(p.v) || p.kn_s0 % 8 || p.kn_s1 % 8 ||
      p.kr_s0 % 8 || p.v_s0 % 8 || p.v_s1 % 8 || p.heads > 0x7fffffff)
    return cudaErrorInvalidValue;
  const int rows =
      p.tile_rows != 0 ? p.tile_rows : mha_prefill_tile_rows(p.heads, p.tokens, device_sm_count());
  if (rows != 64 && rows != 128) return cudaErrorInvalidValue;
  if (p.nope + p.R == 256)
    return rows == 128 ? launch_config<256, 256, 64, 8>(p, stream)
                       : launch_config<256, 256, 32, 4>(p, stream);
  return rows == 128 ? launch_config<192, 128, 64, 8>(p, stream) : launch_config<192, 128, 32, 4>(p, stream);
}

cudaError_t launch_mha_to_bf16(const MhaToBf16Params& p, cudaStream_t stream) {
  const int64_t rows = p.n0 * p.n1;
  if (rows == 0 || p.n2 == 0) return cudaSuccess;
  if (rows >= (int64_t(1) << 31) || p.n2 >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  const bool vec = p.n2 % 4 == 0 && p.s0 % 4 == 0 && p.s1 % 4 == 0 && aligned16(p.src) &&
                   (reinterpret_cast<uintptr_t>(p.dst) & 7) == 0;
  constexpr int kRowsPerBlock = kCopyThreads / 32;
  const unsigned blocks = unsigned(
      std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, int64_t(device_sm_count()) * 16));
  if (vec) {
    sm90_mha_to_bf16_kernel<true><<<blocks, kCopyThreads, 0, stream>>>(p);
  } else {
    sm90_mha_to_bf16_kernel<false><<<blocks, kCopyThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
