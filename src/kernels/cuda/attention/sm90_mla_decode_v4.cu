// Sparse MLA decode, kernel v4 (bf16 and FP8 latent caches): 64 heads a block, Q K^T and P V on warpgroup
// MMAs (wgmma) reading Q and the latent tile from shared memory. Selectable (--mla-decode-kernel v4); v5 is
// faster for both cache formats (the FP8 cache: sm90_mla_decode_v5_fp8.cu).
//
// Block = (query row, group of 64 heads, key split); 256 threads = 2 warpgroups. Per tile of 32 keys:
//   1. the tile's latent rows arrive by cp.async (3 stages) in the 128-byte-swizzle K-major layout that
//      wgmma reads (rows of 1152 bytes split into 9 column blocks of 128 bytes; FP8 rows are first
//      gathered raw and dequantised into one such bf16 tile);
//   2. warpgroup w computes the partial scores S_w[64 heads, 32 keys] over dimensions 288w .. 288w+287
//      (18 wgmma m64n32k16); warp r of a warpgroup holds heads 16r .. 16r+15, the same rows as warp r of
//      the other warpgroup, and the two swap their partial sums through shared memory;
//   3. online softmax in f32 (log2 domain), then O[64 heads, 256w ..] += P V as two wgmma m64n256k16 per
//      warpgroup with P from registers and V read N-major from the same tile.
// Shared-memory reads per tile: Q 74 KB + K 37 KB by the tensor cores, 16 KB of partial sums, V 32 KB.
#include "kernels/cuda/attention/sm90_mla_decode.cuh"
#include "kernels/cuda/common/device_cache.h"

namespace dsaserve::kernels::cuda::mla_detail {

namespace {

template <bool kFp8>
struct Cfg4 {
  static constexpr int kRows = 64;   // heads of a block
  static constexpr int kBn = 32;     // keys per tile
  static constexpr int kStages = 3;  // tiles in flight: 2 while one runs
  static constexpr int kTileBytes = kBn * kMlaDim * 2;
  static constexpr int kSrcBytes = kFp8 ? kMlaFp8RowBytes : kMlaBf16RowBytes;
  static constexpr size_t kStageBytes = kFp8 ? size_t(kBn) * kMlaFp8RowBytes : size_t(kTileBytes);
  static constexpr size_t kQOff = 0;
  static constexpr size_t kStageOff = size_t(kRows) * kMlaDim * 2;
  static constexpr size_t kKvOff = align1024(kStageOff + kStages * kStageBytes);  // FP8: dequantised tile
  static constexpr size_t kXOff = kFp8 ? kKvOff + kTileBytes : kStageOff + kStages * kStageBytes;
  static constexpr size_t kValidOff = kXOff + size_t(8) * 16 * 32 * 4;
  static constexpr size_t kSmem = kValidOff + size_t(kStages) * kBn * 4 + 1024;  // + base alignment
  static_assert(kSmem <= 227 * 1024, "shared memory");
  static_assert(kStageOff % 1024 == 0 && (kFp8 || kStageBytes % 1024 == 0), "swizzled tiles 1024-aligned");
};

// FP8 rows [32, 656 bytes] -> the swizzled bf16 tile (latent codes times their block scale, rope copied).
__device__ __forceinline__ void dequant_fp8_swizzled(unsigned char* tile, const unsigned char* raw, int tid) {
  for (int i = tid; i < 32 * 72; i += kThreads) {
    const int r = i / 72, c = i % 72;
    const unsigned char* rr = raw + r * kMlaFp8RowBytes;
    uint4 v;
    if (c < 64) {
      const uint2 codes = *reinterpret_cast<const uint2*>(rr + c * 8);
      const float sc = *reinterpret_cast<const float*>(rr + kMlaLatent + (c / 16) * 4);
      const uint32_t w[2] = {codes.x, codes.y};
      uint32_t o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((w[j / 2] >> ((j % 2) * 16)) & 0xffff);
        const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
        o[j] = mma::pack_bf16(f.x * sc, f.y * sc);
      }
      v = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
      v = *reinterpret_cast<const uint4*>(rr + kMlaLatent + 16 + (c - 64) * 16);
    }
    *reinterpret_cast<uint4*>(tile + swz(32, r, c)) = v;
  }
}

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) sm90_mla_decode_v4_kernel(const MlaDecodeParams p) {
  using C = Cfg4<kFp8>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sQ = smem + C::kQOff;
  unsigned char* sStage = smem + C::kStageOff;
  unsigned char* sKv = smem + C::kKvOff;
  float* sX = reinterpret_cast<float*>(smem + C::kXOff);
  int* sValid = reinterpret_cast<int*>(smem + C::kValidOff);

  const int row = blockIdx.x, split = blockIdx.z;
  const int64_t h0 = int64_t(blockIdx.y) * C::kRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, rg = warp & 3;  // wg: dimension half of Q K^T, column half of P V
  const int g = lane >> 2, c4 = lane & 3;

  const RowKeys keys(p, row, split, C::kBn);
  const int n_tiles = keys.n_tiles;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  // Tiles of latent rows are gathered into the stages (invalid keys: zero rows, marked invalid), 8 threads
  // per key row. The key's position (from the selection) and its page are loaded two and one tiles ahead,
  // so the dependent index loads overlap the tensor-core work. Positions are < 2^31 (row_len is i32): one
  // 32-bit division per key splits a position into page and offset.
  constexpr int kTpr = kThreads / C::kBn;
  const int my_r = tid / kTpr, my_sub = tid % kTpr;
  auto fetch_pos = [&](int u) -> int64_t {  // -1: no key
    return u < n_tiles ? keys.position(keys.k_begin + int64_t(u) * C::kBn + my_r) : -1;
  };
  auto fetch_page = [&](int64_t pos) { return keys.slot(pos); };
  auto issue = [&](int st, KeySlot s) {
    const int64_t slot = int64_t(s.page) * p.page_size + s.off;
    const bool ok = s.page >= 0 && slot < p.num_slots;
    const unsigned char* src = ok ? cache + slot * C::kSrcBytes : cache;
    unsigned char* stage = sStage + size_t(st) * C::kStageBytes;
    if constexpr (kFp8) {
      unsigned char* dst = stage + my_r * kMlaFp8RowBytes;
      constexpr int kPieces = kMlaFp8RowBytes / 16;  // 41
#pragma unroll
      for (int j = 0; j < (kPieces + kTpr - 1) / kTpr; ++j) {
        const int c = my_sub + j * kTpr;
        if (c < kPieces) mma::cp_async16(dst + c * 16, src + c * 16, ok ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kMlaDim / 8 / kTpr; ++j) {  // chunk my_sub + 8j: column block j
        const int c = my_sub + j * kTpr;
        mma::cp_async16(stage + swz(C::kBn, my_r, c), src + c * 16, ok ? 16 : 0);
      }
    }
    if (my_sub == 0) sValid[st * C::kBn + my_r] = ok ? 1 : 0;
  };

  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < n_tiles) issue(s, fetch_page(fetch_pos(s)));
    mma::cp_async_commit();
  }
  KeySlot slot_a = fetch_page(fetch_pos(C::kStages - 1));  // the tile issued next
  int64_t pos_b = fetch_pos(C::kStages);                   // the one after

  load_q_rows<C::kRows>([&](int r, int c) { return sQ + swz(C::kRows, r, c >> 3) + (c & 7) * 2; }, p, row, h0,
                        tid);

  float oacc[32][4];  // O[16 rg + g / + 8][256 wg + 8 i + 2 c4 ..]
#pragma unroll
  for (int i = 0; i < 32; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_addr = mma::smem_addr(sQ);

  for (int t = 0; t < n_tiles; ++t) {
    mma::cp_async_wait<C::kStages - 2>();
    mma::fence_proxy_async_smem();  // this thread's copies (and Q stores) -> visible to wgmma
    __syncthreads();  // tile t complete; every warp is done with tile t - 1 (wgmma reads waited for)
    if (t + C::kStages - 1 < n_tiles) issue((t + C::kStages - 1) % C::kStages, slot_a);
    mma::cp_async_commit();
    slot_a = fetch_page(pos_b);
    pos_b = fetch_pos(t + C::kStages + 1);
    const int st = t % C::kStages;
    const unsigned char* tile;
    if constexpr (kFp8) {
      dequant_fp8_swizzled(sKv, sStage + size_t(st) * C::kStageBytes, tid);
      mma::fence_proxy_async_smem();
      __syncthreads();
      tile = sKv;
    } else {
      tile = sStage + size_t(st) * C::kStageBytes;
    }

    // Partial scores over this warpgroup's 288 dimensions: 18 steps of 16 (step k: column block k / 4,
    // 32-byte offset (k % 4) inside it).
    float d[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) d[i] = 0.f;
    const uint32_t t_addr = mma::smem_addr(tile);
    mma::wgmma_fence_operands(d);
    mma::wgmma_fence();
#pragma unroll
    for (int i = 0; i < kMlaDim / 32; ++i) {
      const int k = wg * (kMlaDim / 32) + i;
      const uint32_t koff = uint32_t(k & 3) * 32;
      mma::wgmma_m64n32k16_bf16(d, mma::wgmma_desc_sw128(q_addr + uint32_t(k >> 2) * (C::kRows * 128) + koff),
                                mma::wgmma_desc_sw128(t_addr + uint32_t(k >> 2) * (C::kBn * 128) + koff),
                                i > 0 ? 1 : 0);
    }
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(d);

    float* xw = sX + warp * (16 * 32);
#pragma unroll
    for (int e = 0; e < 16; ++e) xw[e * 32 + lane] = d[e];
    __syncthreads();
    const float* xp = sX + (warp ^ 4) * (16 * 32);
    float sacc[4][4];
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = i * 8 + 2 * c4 + (e & 1);
        // Both warps of the pair get the same sum (f32 addition commutes): identical softmax rows.
        const float s = (d[i * 4 + e] + xp[(i * 4 + e) * 32 + lane]) * sl2;
        sacc[i][e] = sValid[st * C::kBn + key] ? s : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(sacc[i][0], sacc[i][1]));
      mx1 = fmaxf(mx1, fmaxf(sacc[i][2], sacc[i][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sacc[i][0] = exp2f(sacc[i][0] - mu0);
      sacc[i][1] = exp2f(sacc[i][1] - mu0);
      sacc[i][2] = exp2f(sacc[i][2] - mu1);
      sacc[i][3] = exp2f(sacc[i][3] - mu1);
      rs0 += sacc[i][0] + sacc[i][1];
      rs1 += sacc[i][2] + sacc[i][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    rescale_rows(oacc, al0, al1);
    // O += P V over the tile's 32 keys and this warpgroup's 256 output columns (column blocks 4 wg ..).
    uint32_t a[2][4];  // P as A fragments of the two 16-key steps
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      a[j][0] = mma::pack_bf16(sacc[2 * j][0], sacc[2 * j][1]);
      a[j][1] = mma::pack_bf16(sacc[2 * j][2], sacc[2 * j][3]);
      a[j][2] = mma::pack_bf16(sacc[2 * j + 1][0], sacc[2 * j + 1][1]);
      a[j][3] = mma::pack_bf16(sacc[2 * j + 1][2], sacc[2 * j + 1][3]);
    }
    // Two wgmma m64n256k16 with P from registers and V N-major from the swizzled tile: 64-column stripes
    // 32 x 128 bytes apart, the 16 keys of step j at row 16j.
    mma::wgmma_fence_operands(oacc);
    mma::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 2; ++j)
      mma::wgmma_m64n256k16_bf16_rs(
          oacc, a[j],
          mma::wgmma_desc_sw128_mn(t_addr + uint32_t(wg * 4 * C::kBn * 128 + j * 16 * 128), C::kBn * 128), 1);
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(oacc);
  }
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)
  mma::cp_async_wait<0>();

  store_decode_rows(p, row, split, h0 + rg * 16 + g, h0 + rg * 16 + g + 8, wg * 256, oacc, m0, m1, l0, l1,
                    wg == 0);
}

template <bool kFp8>
cudaError_t launch_v4(const MlaDecodeParams& p, cudaStream_t stream) {
  using C = Cfg4<kFp8>;
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v4_kernel<kFp8>), int(C::kSmem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(p.rows), unsigned((p.heads + C::kRows - 1) / C::kRows), unsigned(p.splits));
  sm90_mla_decode_v4_kernel<kFp8><<<grid, kThreads, C::kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_decode_v4(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.format == MlaKvFormat::bf16 ? launch_v4<false>(p, stream) : launch_v4<true>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
