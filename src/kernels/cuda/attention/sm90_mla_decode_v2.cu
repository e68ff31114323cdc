// Sparse MLA decode, kernel v2 (bf16 and FP8 latent caches): 16 heads a block, 64-key tiles split by key
// across the warps for Q K^T and by output column for P V, so no warp-to-warp partial sums and no final
// merge of key sub-groups.
//
// Block = (query row, group of 16 heads, key split); 256 threads = 8 warps. Per tile of 64 keys:
//   1. the tile's latent rows arrive by cp.async through a ring of half tiles (32 keys) that runs 1.5
//      (bf16) or 2 (FP8) tiles ahead; FP8 rows are then dequantised once into a bf16 tile;
//   2. warp w computes the scores of keys 8w .. 8w+7 for the 16 heads over all 576 dimensions (36
//      m16n8k16 MMAs in 4 independent accumulator chains, Q and K fed by ldmatrix) and stores them, scaled
//      to the log2 domain and masked, as f32 into a [16, 64] score tile;
//   3. after one barrier every warp reads the whole score tile in the MMA A-fragment order, does the
//      (identical) online-softmax update of the 16 rows, and accumulates O[:, 64w .. 64w+63] += P V.
// Per tile and warp: 54 ldmatrix.x4 + 36 MMAs (Q K^T), 16 ldmatrix.x4.trans + 32 MMAs (P V), 2 barriers
// (3 with FP8). Shared-memory reads per tile ~316 KB (Q 147, K 74, scores 37, V 74) against 74 KB of
// HBM bytes, well inside the SM's shared-memory bandwidth. Heads past 16 take more blocks (grid.y), each
// reading the rows again (through L2).
#include "kernels/cuda/attention/sm90_mla_decode.cuh"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

namespace {

template <bool kFp8>
struct Cfg2 {
  static constexpr int kRows = 16;             // heads of a block (one MMA row tile)
  static constexpr int kBn = 64;               // keys per tile (8 per warp)
  static constexpr int kHalf = 32;             // keys per ring slot (half a tile)
  static constexpr int kSlots = kFp8 ? 6 : 5;  // ring slots: kSlots - 2 halves in flight while a tile runs
  static constexpr int kLdS = kBn + 8;         // f32 per score row: conflict-free float2 stores and loads
  static constexpr int kRawBytes = kFp8 ? kMlaFp8RowBytes : kLd * 2;
  static constexpr int kSrcBytes = kFp8 ? kMlaFp8RowBytes : kMlaBf16RowBytes;
  static constexpr size_t kQBytes = size_t(kRows) * kLd * 2;
  static constexpr size_t kRawOff = kQBytes;
  static constexpr size_t kKvOff = kRawOff + size_t(kSlots) * kHalf * kRawBytes;
  static constexpr size_t kSOff = kKvOff + (kFp8 ? size_t(kBn) * kLd * 2 : 0);
  static constexpr size_t kValidOff = kSOff + size_t(kRows) * kLdS * 4;
  static constexpr size_t kSmem = kValidOff + size_t(kSlots) * kHalf * 4;
  static_assert(kSmem <= 227 * 1024, "shared memory");
  static_assert(kRawOff % 16 == 0 && kKvOff % 16 == 0 && kSOff % 16 == 0 && kRawBytes % 16 == 0, "alignment");
};

template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) sm90_mla_decode_v2_kernel(const MlaDecodeParams p) {
  pdl_wait();  // programmatic launch (p.pdl): everything below reads or writes what other kernels touch
  using C = Cfg2<kFp8>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* sRaw = smem + C::kRawOff;
  __nv_bfloat16* sKv = reinterpret_cast<__nv_bfloat16*>(smem + C::kKvOff);
  float* sS = reinterpret_cast<float*>(smem + C::kSOff);
  int* sValid = reinterpret_cast<int*>(smem + C::kValidOff);

  const int row = blockIdx.x, split = blockIdx.z;
  const int64_t h0 = int64_t(blockIdx.y) * C::kRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, c4 = lane & 3;

  const RowKeys keys(p, row, split, C::kBn);
  const int n_tiles = keys.n_tiles;
  const int n_halves = 2 * n_tiles;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  // Gather into a ring of kSlots half tiles (half u -> slot u % kSlots): 8 threads per key row, 16-byte
  // pieces. Tile t reads halves 2t, 2t+1; at its start halves up to 2t + kSlots - 1 are issued, so
  // kSlots - 2 halves are in flight while it runs. A key's position (from the selection) is loaded one
  // tile before its page and its page one tile before its copy, so the dependent index loads overlap the
  // tensor-core work. Positions are < 2^31 (row_len is i32): one 32-bit division per key.
  constexpr int kTpr = kThreads / C::kHalf;
  const int my_r = tid / kTpr, my_sub = tid % kTpr;
  auto fetch_pos = [&](int u) -> int32_t {  // -1: no key
    return u < n_halves ? keys.position(keys.k_begin + int64_t(u) * C::kHalf + my_r) : -1;
  };
  auto fetch_page = [&](int32_t pos) { return keys.slot(pos); };
  auto issue = [&](int u, KeySlot s) {  // half u, when it exists; always one commit group
    if (u < n_halves) {
      const int sl = u % C::kSlots;
      const int64_t slot = int64_t(s.page) * p.page_size + s.off;
      const bool ok = s.page >= 0 && slot < p.num_slots;
      const unsigned char* src = ok ? cache + slot * C::kSrcBytes : cache;
      unsigned char* dst = sRaw + (size_t(sl) * C::kHalf + my_r) * C::kRawBytes;
      constexpr int kPieces = C::kSrcBytes / 16;
#pragma unroll
      for (int j = 0; j < (kPieces + kTpr - 1) / kTpr; ++j) {
        const int c = my_sub + j * kTpr;
        if (kPieces % kTpr == 0 || c < kPieces) mma::cp_async16(dst + c * 16, src + c * 16, ok ? 16 : 0);
      }
      if (my_sub == 0) sValid[sl * C::kHalf + my_r] = ok ? 1 : 0;
    }
    mma::cp_async_commit();
  };

  for (int u = 0; u < C::kSlots - 2; ++u) issue(u, fetch_page(fetch_pos(u)));
  KeySlot slot_a0 = fetch_page(fetch_pos(C::kSlots - 2)), slot_a1 = fetch_page(fetch_pos(C::kSlots - 1));
  int32_t pos_b0 = fetch_pos(C::kSlots), pos_b1 = fetch_pos(C::kSlots + 1);

  load_q_rows<C::kRows>([&](int r, int c) { return sQ + r * kLd + c; }, p, row, h0, tid);

  float oacc[8][4];  // O[g / g+8][64 warp + 8 i + 2 c4 ..]
#pragma unroll
  for (int i = 0; i < 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g, g+8 (l: this lane's columns)
  const float sl2 = p.scale * 1.4426950408889634f;

  // ldmatrix row addresses. Q: rows lane & 15, 8 columns at (lane >> 4) * 8 (A fragment of 16 dims).
  // K: key 8 (warp & 3) + (lane & 7) of half warp / 4, 8 dims at (lane >> 3) * 8 (B fragments of two
  // 16-dim steps). V: key (lane & 7) + ((lane >> 3) & 1) * 8 of a 16-key step, columns 64 warp +
  // (lane >> 4) * 8 (transposed B fragments).
  const __nv_bfloat16* qa = sQ + (lane & 15) * kLd + (lane >> 4) * 8;
  const int k_off = ((warp & 3) * 8 + (lane & 7)) * kLd + (lane >> 3) * 8;
  const int v_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * kLd + warp * 64 + (lane >> 4) * 8;

  for (int t = 0; t < n_tiles; ++t) {
    // Committed so far: halves 0 .. 2t + kSlots - 3; this tile needs 0 .. 2t + 1.
    mma::cp_async_wait<C::kSlots - 4>();
    __syncthreads();  // halves 2t, 2t+1 visible; every warp is done with tile t - 1 (its slots, sKv, sS)
    issue(2 * t + C::kSlots - 2, slot_a0);  // into the slots of halves 2t - 2, 2t - 1
    issue(2 * t + C::kSlots - 1, slot_a1);
    slot_a0 = fetch_page(pos_b0);
    slot_a1 = fetch_page(pos_b1);
    pos_b0 = fetch_pos(2 * t + C::kSlots + 2);
    pos_b1 = fetch_pos(2 * t + C::kSlots + 3);
    const int sl0 = (2 * t) % C::kSlots, sl1 = (2 * t + 1) % C::kSlots;
    const __nv_bfloat16 *kv0, *kv1;  // keys 0..31 and 32..63 of the tile, rows of kLd
    if constexpr (kFp8) {
      dequant_fp8_tile<C::kHalf>(sKv, sRaw + size_t(sl0) * C::kHalf * C::kRawBytes, tid);
      dequant_fp8_tile<C::kHalf>(sKv + C::kHalf * kLd, sRaw + size_t(sl1) * C::kHalf * C::kRawBytes, tid);
      __syncthreads();
      kv0 = sKv;
      kv1 = sKv + C::kHalf * kLd;
    } else {
      kv0 = reinterpret_cast<const __nv_bfloat16*>(sRaw + size_t(sl0) * C::kHalf * C::kRawBytes);
      kv1 = reinterpret_cast<const __nv_bfloat16*>(sRaw + size_t(sl1) * C::kHalf * C::kRawBytes);
    }

    // S[16, 8 keys of this warp] over 576 dims: two 16-dim steps per B load, 4 accumulator chains.
    float sacc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
    const __nv_bfloat16* kb = (warp < 4 ? kv0 : kv1) + k_off;
#pragma unroll
    for (int kp = 0; kp < kMlaDim / 32; ++kp) {
      uint32_t b[4], a0[4], a1[4];
      mma::ldsm_x4(b, kb + kp * 32);
      mma::ldsm_x4(a0, qa + kp * 32);
      mma::ldsm_x4(a1, qa + kp * 32 + 16);
      mma::mma_bf16(sacc[(kp & 1) * 2], a0, b[0], b[1]);
      mma::mma_bf16(sacc[(kp & 1) * 2 + 1], a1, b[2], b[3]);
    }
    {
      const int key = warp * 8 + 2 * c4;
      const int* valid = sValid + (warp < 4 ? sl0 : sl1) * C::kHalf + (warp & 3) * 8 + 2 * c4;
      const bool v0 = valid[0] != 0, v1 = valid[1] != 0;
      float s[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = (sacc[0][e] + sacc[1][e] + sacc[2][e] + sacc[3][e]) * sl2;
      *reinterpret_cast<float2*>(sS + g * C::kLdS + key) =
          make_float2(v0 ? s[0] : -INFINITY, v1 ? s[1] : -INFINITY);
      *reinterpret_cast<float2*>(sS + (g + 8) * C::kLdS + key) =
          make_float2(v0 ? s[2] : -INFINITY, v1 ? s[3] : -INFINITY);
    }
    __syncthreads();  // the score tile is complete

    // Online softmax of rows g, g+8 over this lane's 16 keys (16j + 2c4 + {0,1}, 16j + 8 + 2c4 + {0,1}),
    // read straight in the A-fragment order of P; the 4 lanes of a row together hold all 64 keys.
    float x[4][8];  // [16-key step j][row g: 0..3, row g+8: 4..7]
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 u0 = *reinterpret_cast<const float2*>(sS + g * C::kLdS + 16 * j + 2 * c4);
      const float2 u1 = *reinterpret_cast<const float2*>(sS + g * C::kLdS + 16 * j + 8 + 2 * c4);
      const float2 w0 = *reinterpret_cast<const float2*>(sS + (g + 8) * C::kLdS + 16 * j + 2 * c4);
      const float2 w1 = *reinterpret_cast<const float2*>(sS + (g + 8) * C::kLdS + 16 * j + 8 + 2 * c4);
      x[j][0] = u0.x;
      x[j][1] = u0.y;
      x[j][2] = u1.x;
      x[j][3] = u1.y;
      x[j][4] = w0.x;
      x[j][5] = w0.y;
      x[j][6] = w1.x;
      x[j][7] = w1.y;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mx0 = fmaxf(mx0, fmaxf(fmaxf(x[j][0], x[j][1]), fmaxf(x[j][2], x[j][3])));
      mx1 = fmaxf(mx1, fmaxf(fmaxf(x[j][4], x[j][5]), fmaxf(x[j][6], x[j][7])));
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
    uint32_t pa[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[j][e] = exp2f(x[j][e] - mu0);
        x[j][4 + e] = exp2f(x[j][4 + e] - mu1);
        rs0 += x[j][e];
        rs1 += x[j][4 + e];
      }
      pa[j][0] = mma::pack_bf16(x[j][0], x[j][1]);  // row g, keys 16j + 2c4
      pa[j][1] = mma::pack_bf16(x[j][4], x[j][5]);  // row g+8
      pa[j][2] = mma::pack_bf16(x[j][2], x[j][3]);  // row g, keys 16j + 8 + 2c4
      pa[j][3] = mma::pack_bf16(x[j][6], x[j][7]);  // row g+8
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      oacc[i][0] *= al0;
      oacc[i][1] *= al0;
      oacc[i][2] *= al1;
      oacc[i][3] *= al1;
    }
    // O[:, 64 warp ..] += P V over the tile's 64 keys.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat16* vb = (j < 2 ? kv0 : kv1) + (j & 1) * 16 * kLd + v_off;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b, vb + np * 16);
        mma::mma_bf16(oacc[2 * np], pa[j], b[0], b[1]);
        mma::mma_bf16(oacc[2 * np + 1], pa[j], b[2], b[3]);
      }
    }
  }
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)
  mma::cp_async_wait<0>();        // nothing may be left in flight into shared memory at exit

  // Every warp holds the same row statistics; the row sums are spread over the 4 lanes of a row.
  store_decode_rows(p, row, split, h0 + g, h0 + g + 8, warp * 64, oacc, m0, m1, l0, l1, warp == 0);
}

template <bool kFp8>
cudaError_t launch_v2(const MlaDecodeParams& p, cudaStream_t stream) {
  using C = Cfg2<kFp8>;
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v2_kernel<kFp8>), int(C::kSmem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(p.rows), unsigned((p.heads + C::kRows - 1) / C::kRows), unsigned(p.splits));
  return launch_pdl(p.pdl, sm90_mla_decode_v2_kernel<kFp8>, grid, dim3(kThreads), C::kSmem, stream, p);
}

}  // namespace

cudaError_t launch_decode_v2(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.format == MlaKvFormat::bf16 ? launch_v2<false>(p, stream) : launch_v2<true>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
