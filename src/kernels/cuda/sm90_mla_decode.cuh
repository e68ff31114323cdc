#pragma once
// The sparse MLA decode kernel template v1 (absorbed form), instantiated in sm90_mla_decode_{bf16,fp8}.cu,
// and the helpers shared with kernels v2 (sm90_mla_decode_v2.cu: 16 heads a block, keys split across
// warps; the default for <= 16 heads) and v3 / v4 (sm90_mla_decode_v3.cu: 64 heads a block on wgmma).
//
// Block = (query row, head group, key split); 256 threads = 8 warps. A head group is kRows = 16 * RG
// heads (RG = 1 for <= 16 heads, RG = 4 for 64). Warp w owns head rows rg*16.., output columns
// cs*256.. (cs = w % 2) and, when RG = 1, a quarter of each key tile (ks). Per tile of kBn keys:
//   1. the block gathers kBn latent rows through the page table into shared memory (cp.async, kStages
//      deep); FP8 rows are then dequantised once into a bf16 tile;
//   2. S = Q K^T on the tensor cores: the two warps of a pair each take half of the 576-long dot
//      products and swap partial sums through shared memory (so no head row is computed twice);
//   3. online softmax in fp32 (log2 domain), then O += P V with V = the tile's first 512 columns.
// The key sub-groups (RG = 1) are merged through shared memory at the end; the block writes either the
// final rows or, with several splits, a partial row and its log-sum-exp for the combine kernel.
// Budget of a 32-key tile at RG = 4, per warp: 54 ldmatrix.x4 + 72 MMAs (Q K^T over 288 dims), 16 f32
// stores + loads (partial-sum swap), 16 exp2, 128 FMULs (O rescale, skipped while no row max moves),
// 32 ldmatrix.x4.trans + 64 MMAs (P V); 2 barriers (3 with FP8). Per SM that is ~350 KB of ldmatrix
// traffic (Q 74, K 147, V 131) for 37 KB of HBM bytes: ~2750 cycles of shared-memory bandwidth against
// ~2070 cycles of the SM's HBM share, so at 64 heads v1 is bound by shared memory, not HBM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/mla_decode_params.h"
#include "kernels/cuda/sm90_mma.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

constexpr int kThreads = 256;
constexpr int kLd = kMlaDim + 8;  // bf16 elements per shared row: 1168 bytes, ldmatrix conflict-free

// Byte offset of 16-byte chunk cc (bf16 columns 8cc .. 8cc+7) of row r in a 128-byte-swizzled tile of
// `rows` rows (the K-major layout wgmma reads): column block cc / 8 (rows x 128 bytes each), chunk cc % 8
// stored at (cc % 8) ^ (r % 8).
__device__ __forceinline__ uint32_t swz(int rows, int r, int cc) {
  return uint32_t((cc >> 3) * rows * 128 + r * 128 + (((cc & 7) ^ (r & 7)) << 4));
}

constexpr size_t align1024(size_t x) { return (x + 1023) / 1024 * 1024; }

// Q rows h0 .. h0 + kRows - 1 of query row `row` as bf16 into shared memory (rows past the last head are
// zero): dst(r, c) is where the 4 values (r, c .. c+3) go (c % 4 == 0). Each thread has 9 float4 loads in
// flight at a time (kRows * 144 / 256 per thread in all), so the load latency is paid kRows / 16 times
// rather than once per element group.
template <int kRows, class Dst>
__device__ __forceinline__ void load_q_rows(Dst dst, const MlaDecodeParams& p, int row, int64_t h0, int tid) {
  constexpr int kVec = kMlaDim / 4;  // float4 per head row
  constexpr int kPer = kRows * kVec / kThreads;
  constexpr int kBatch = 9;
  static_assert(kRows * kVec % kThreads == 0 && kPer % kBatch == 0, "q load shape");
  const bool vec =
      ((reinterpret_cast<uintptr_t>(p.q_lat) | reinterpret_cast<uintptr_t>(p.q_rope)) & 15) == 0 &&
      ((p.ql_s0 | p.ql_s1 | p.qr_s0 | p.qr_s1) & 3) == 0;
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = tid + (b0 + j) * kThreads;
      const int r = i / kVec, c = (i % kVec) * 4;
      const int64_t h = h0 + r;
      v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (h < p.heads) {
        const float* src = c < kMlaLatent ? p.q_lat + row * p.ql_s0 + h * p.ql_s1 + c
                                          : p.q_rope + row * p.qr_s0 + h * p.qr_s1 + (c - kMlaLatent);
        if (vec)
          v[j] = __ldg(reinterpret_cast<const float4*>(src));
        else
          v[j] = make_float4(__ldg(src), __ldg(src + 1), __ldg(src + 2), __ldg(src + 3));
      }
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = tid + (b0 + j) * kThreads;
      const int r = i / kVec, c = (i % kVec) * 4;
      uint2 packed;
      packed.x = mma::pack_bf16(v[j].x, v[j].y);
      packed.y = mma::pack_bf16(v[j].z, v[j].w);
      *reinterpret_cast<uint2*>(dst(r, c)) = packed;
    }
  }
}

// FP8 rows of one tile (kBn rows of kMlaFp8RowBytes in shared memory) -> bf16 rows [kBn, kLd]: latent codes
// times their block scale, rope values copied.
template <int kBn>
__device__ __forceinline__ void dequant_fp8_tile(__nv_bfloat16* sKv, const unsigned char* raw, int tid) {
  for (int i = tid; i < kBn * 72; i += kThreads) {
    const int r = i / 72, c = i % 72;
    const unsigned char* rr = raw + r * kMlaFp8RowBytes;
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
      *reinterpret_cast<uint4*>(sKv + r * kLd + c * 8) = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
      *reinterpret_cast<uint4*>(sKv + r * kLd + kMlaLatent + (c - 64) * 8) =
          *reinterpret_cast<const uint4*>(rr + kMlaLatent + 16 + (c - 64) * 16);
    }
  }
}

template <int RG, bool kFp8>
struct Cfg {
  static constexpr int kRows = RG * 16;          // head rows of a block
  static constexpr int kKs = 4 / RG;             // key sub-groups per tile
  static constexpr int kKg = RG == 4 ? 32 : 16;  // keys per sub-group per tile
  static constexpr int kBn = kKs * kKg;          // keys per tile
  static constexpr int kStages = kBn == 32 ? 3 : 2;
  static constexpr int kNtS = kKg / 8;  // score n-tiles per warp
  static constexpr int kRawBytes = kFp8 ? kMlaFp8RowBytes : kLd * 2;
  static constexpr int kSrcBytes = kFp8 ? kMlaFp8RowBytes : kMlaBf16RowBytes;
  static constexpr size_t kQBytes = size_t(kRows) * kLd * 2;
  static constexpr size_t kRawOff = kQBytes;
  static constexpr size_t kKvOff = kRawOff + size_t(kStages) * kBn * kRawBytes;
  static constexpr size_t kMainEnd = kKvOff + (kFp8 ? size_t(kBn) * kLd * 2 : 0);
  static constexpr size_t kCombineBytes = size_t(kKs) * kRows * kMlaLatent * 4;
  static constexpr size_t kXOff = kMainEnd > kCombineBytes ? kMainEnd : kCombineBytes;
  static constexpr size_t kValidOff = kXOff + size_t(8) * kNtS * 4 * 32 * 4;
  static constexpr size_t kStatOff = kValidOff + size_t(kStages) * kBn * 4;
  static constexpr size_t kSmem = kStatOff + size_t(kKs) * kRows * 2 * 4;
};

template <int RG, bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) sm90_mla_decode_kernel(const MlaDecodeParams p) {
  using C = Cfg<RG, kFp8>;
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* sRaw = smem + C::kRawOff;
  __nv_bfloat16* sKv = reinterpret_cast<__nv_bfloat16*>(smem + C::kKvOff);
  float* sX = reinterpret_cast<float*>(smem + C::kXOff);
  int* sValid = reinterpret_cast<int*>(smem + C::kValidOff);
  float* sStat = reinterpret_cast<float*>(smem + C::kStatOff);

  const int row = blockIdx.x, split = blockIdx.z;
  const int64_t h0 = int64_t(blockIdx.y) * C::kRows;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ks = warp / (RG * 2), rg = (warp % (RG * 2)) / 2, cs = warp & 1;
  const int g = lane >> 2, c4 = lane & 3;

  const int64_t seq = p.row_seq ? p.row_seq[row] : row;
  const bool seq_ok = seq >= 0 && seq < p.num_seqs;
  const int64_t n_vis = seq_ok ? p.row_len[row] : 0;
  const int64_t n_list = p.sel ? p.sel_k : (n_vis > 0 ? n_vis : 0);
  const int64_t per_split = (n_list + p.splits - 1) / p.splits;
  const int64_t chunk = (per_split + C::kBn - 1) / C::kBn * C::kBn;
  const int64_t k_begin = int64_t(split) * chunk;
  const int64_t k_end = k_begin + chunk < n_list ? k_begin + chunk : n_list;
  const int n_tiles = k_end > k_begin ? int((k_end - k_begin + C::kBn - 1) / C::kBn) : 0;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  // Tiles of latent rows are gathered into the stages (invalid keys: zero rows, marked invalid); each
  // thread copies 16-byte pieces of one row of every tile. The key's position (from the selection)
  // and its page are loaded two and one tiles ahead, so the dependent index loads overlap the
  // tensor-core work instead of stalling each tile. Positions are < 2^31 (row_len is i32): one 32-bit
  // division per key splits a position into page and offset.
  constexpr int kTpr = kThreads / C::kBn;  // threads per row
  const int my_r = tid / kTpr, my_sub = tid % kTpr;
  const bool ps32 = p.page_size > 0 && p.page_size <= 0x7fffffff;
  const uint32_t ps = ps32 ? uint32_t(p.page_size) : 1u;
  auto fetch_pos = [&](int u) -> int64_t {  // -1: no key
    const int64_t li = k_begin + int64_t(u) * C::kBn + my_r;
    if (u >= n_tiles || li >= k_end) return -1;
    const int64_t pos = p.sel ? int64_t(p.sel[int64_t(row) * p.sel_stride + li]) : li;
    return pos >= 0 && pos < n_vis && ps32 ? pos : -1;
  };
  struct Slot {
    int32_t page;  // page id, or -1 (no key)
    int32_t off;   // position within the page
  };
  auto fetch_page = [&](int64_t pos) -> Slot {
    if (pos < 0) return {-1, 0};
    const uint32_t pi = uint32_t(pos) / ps;
    if (int64_t(pi) >= p.pt_cols) return {-1, 0};
    return {p.page_table[seq * p.pt_stride + pi], int32_t(uint32_t(pos) - pi * ps)};
  };
  auto issue = [&](int st, Slot s) {
    const int64_t slot = int64_t(s.page) * p.page_size + s.off;
    const bool ok = s.page >= 0 && slot < p.num_slots;
    const unsigned char* src = ok ? cache + slot * C::kSrcBytes : cache;
    unsigned char* dst = sRaw + (size_t(st) * C::kBn + my_r) * C::kRawBytes;
    constexpr int kPieces = C::kSrcBytes / 16;
#pragma unroll
    for (int j = 0; j < (kPieces + kTpr - 1) / kTpr; ++j) {
      const int c = my_sub + j * kTpr;
      if (kPieces % kTpr == 0 || c < kPieces) mma::cp_async16(dst + c * 16, src + c * 16, ok ? 16 : 0);
    }
    if (my_sub == 0) sValid[st * C::kBn + my_r] = ok ? 1 : 0;
  };

  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < n_tiles) issue(s, fetch_page(fetch_pos(s)));
    mma::cp_async_commit();
  }
  Slot slot_a = fetch_page(fetch_pos(C::kStages - 1));  // the tile issued next
  int64_t pos_b = fetch_pos(C::kStages);                // the one after

  load_q_rows<C::kRows>([&](int r, int c) { return sQ + r * kLd + c; }, p, row, h0, tid);

  float oacc[32][4];
#pragma unroll
  for (int i = 0; i < 32; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = p.scale * 1.4426950408889634f;

  for (int t = 0; t < n_tiles; ++t) {
    mma::cp_async_wait<C::kStages - 2>();
    __syncthreads();
    if (t + C::kStages - 1 < n_tiles) issue((t + C::kStages - 1) % C::kStages, slot_a);
    mma::cp_async_commit();
    slot_a = fetch_page(pos_b);
    pos_b = fetch_pos(t + C::kStages + 1);
    const int st = t % C::kStages;
    const __nv_bfloat16* kv;
    if constexpr (kFp8) {
      dequant_fp8_tile<C::kBn>(sKv, sRaw + size_t(st) * C::kBn * C::kRawBytes, tid);
      __syncthreads();
      kv = sKv;
    } else {
      kv = reinterpret_cast<const __nv_bfloat16*>(sRaw + size_t(st) * C::kBn * C::kRawBytes);
    }

    // Partial scores over this warp's half of the 576 dimensions.
    float sacc[C::kNtS][4];
#pragma unroll
    for (int i = 0; i < C::kNtS; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
    const __nv_bfloat16* qa = sQ + (rg * 16 + (lane & 15)) * kLd + (lane >> 4) * 8;
    const __nv_bfloat16* kb =
        kv + (ks * C::kKg + (lane & 7) + ((lane >> 4) << 3)) * kLd + ((lane >> 3) & 1) * 8;
#pragma unroll 6
    for (int kk = 0; kk < kMlaDim / 32; ++kk) {
      const int k0 = cs * (kMlaDim / 2) + kk * 16;
      uint32_t a[4];
      mma::ldsm_x4(a, qa + k0);
#pragma unroll
      for (int np = 0; np < C::kNtS / 2; ++np) {
        uint32_t b[4];
        mma::ldsm_x4(b, kb + np * 16 * kLd + k0);
        mma::mma_bf16(sacc[2 * np], a, b[0], b[1]);
        mma::mma_bf16(sacc[2 * np + 1], a, b[2], b[3]);
      }
    }
    float* xw = sX + warp * (C::kNtS * 4 * 32);
#pragma unroll
    for (int i = 0; i < C::kNtS; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) xw[(i * 4 + e) * 32 + lane] = sacc[i][e];
    __syncthreads();
    const float* xp = sX + (warp ^ 1) * (C::kNtS * 4 * 32);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < C::kNtS; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = ks * C::kKg + i * 8 + 2 * c4 + (e & 1);
        const float s = (sacc[i][e] + xp[(i * 4 + e) * 32 + lane]) * sl2;
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
    for (int i = 0; i < C::kNtS; ++i) {
      sacc[i][0] = exp2f(sacc[i][0] - mu0);
      sacc[i][1] = exp2f(sacc[i][1] - mu0);
      sacc[i][2] = exp2f(sacc[i][2] - mu1);
      sacc[i][3] = exp2f(sacc[i][3] - mu1);
      rs0 += sacc[i][0] + sacc[i][1];
      rs1 += sacc[i][2] + sacc[i][3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {  // the running max moved in some row
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        oacc[i][0] *= al0;
        oacc[i][1] *= al0;
        oacc[i][2] *= al1;
        oacc[i][3] *= al1;
      }
    }
    // O += P V over this warp's keys and its 256 output columns.
    const __nv_bfloat16* vb =
        kv + (ks * C::kKg + (lane & 7) + ((lane >> 3) & 1) * 8) * kLd + cs * 256 + (lane >> 4) * 8;
#pragma unroll
    for (int j = 0; j < C::kKg / 16; ++j) {
      uint32_t a[4];
      a[0] = mma::pack_bf16(sacc[2 * j][0], sacc[2 * j][1]);
      a[1] = mma::pack_bf16(sacc[2 * j][2], sacc[2 * j][3]);
      a[2] = mma::pack_bf16(sacc[2 * j + 1][0], sacc[2 * j + 1][1]);
      a[3] = mma::pack_bf16(sacc[2 * j + 1][2], sacc[2 * j + 1][3]);
#pragma unroll
      for (int np = 0; np < 16; ++np) {
        uint32_t b[4];
        mma::ldsm_x4_trans(b, vb + j * 16 * kLd + np * 16);
        mma::mma_bf16(oacc[2 * np], a, b[0], b[1]);
        mma::mma_bf16(oacc[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // Merge the key sub-groups and normalise.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)
  mma::cp_async_wait<0>();
  __syncthreads();
  const int r0 = rg * 16 + g, r1 = r0 + 8;
  if (cs == 0 && c4 == 0) {
    sStat[(ks * C::kRows + r0) * 2] = m0;
    sStat[(ks * C::kRows + r0) * 2 + 1] = l0;
    sStat[(ks * C::kRows + r1) * 2] = m1;
    sStat[(ks * C::kRows + r1) * 2 + 1] = l1;
  }
  __syncthreads();
  auto merged = [&](int r, float& M, float& L) {
    M = -INFINITY;
    L = 0.f;
#pragma unroll
    for (int k = 0; k < C::kKs; ++k) M = fmaxf(M, sStat[(k * C::kRows + r) * 2]);
    if (M == -INFINITY) return;
#pragma unroll
    for (int k = 0; k < C::kKs; ++k) {
      const float mk = sStat[(k * C::kRows + r) * 2];
      if (mk != -INFINITY) L += sStat[(k * C::kRows + r) * 2 + 1] * exp2f(mk - M);
    }
  };
  float M0, L0, M1, L1;
  merged(r0, M0, L0);
  merged(r1, M1, L1);
  const float f0 = m0 == -INFINITY ? 0.f : exp2f(m0 - M0) / L0;
  const float f1 = m1 == -INFINITY ? 0.f : exp2f(m1 - M1) / L1;
  float* sO = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int col = cs * 256 + i * 8 + 2 * c4;
    *reinterpret_cast<float2*>(sO + (size_t(ks) * C::kRows + r0) * kMlaLatent + col) =
        make_float2(oacc[i][0] * f0, oacc[i][1] * f0);
    *reinterpret_cast<float2*>(sO + (size_t(ks) * C::kRows + r1) * kMlaLatent + col) =
        make_float2(oacc[i][2] * f1, oacc[i][3] * f1);
  }
  __syncthreads();
  const bool direct = p.splits == 1;
  for (int i = tid; i < C::kRows * (kMlaLatent / 4); i += kThreads) {
    const int r = i / (kMlaLatent / 4), c = (i % (kMlaLatent / 4)) * 4;
    const int64_t h = h0 + r;
    if (h >= p.heads) continue;
    float4 acc = *reinterpret_cast<const float4*>(sO + size_t(r) * kMlaLatent + c);
#pragma unroll
    for (int k = 1; k < C::kKs; ++k) {
      const float4 v = *reinterpret_cast<const float4*>(sO + (size_t(k) * C::kRows + r) * kMlaLatent + c);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    float* dst = direct ? p.out + (int64_t(row) * p.heads + h) * kMlaLatent
                        : p.partial_out + ((int64_t(row) * p.splits + split) * p.heads + h) * kMlaLatent;
    *reinterpret_cast<float4*>(dst + c) = acc;
  }
  if (!direct && tid < C::kRows && h0 + tid < p.heads) {
    float M, L;
    merged(tid, M, L);
    p.partial_lse[(int64_t(row) * p.splits + split) * p.heads + h0 + tid] =
        L > 0.f ? M + log2f(L) : -INFINITY;
  }
}

// Launches one instantiation (defined in sm90_mla_decode_{bf16,fp8}.cu).
template <int RG, bool kFp8>
cudaError_t launch_decode_kernel(const MlaDecodeParams& p, cudaStream_t stream) {
  using C = Cfg<RG, kFp8>;
  static_assert(C::kSmem <= 227 * 1024, "shared memory");
  static const cudaError_t e = cudaFuncSetAttribute(
      sm90_mla_decode_kernel<RG, kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(C::kSmem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(p.rows), unsigned((p.heads + C::kRows - 1) / C::kRows), unsigned(p.splits));
  sm90_mla_decode_kernel<RG, kFp8><<<grid, kThreads, C::kSmem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_decode_bf16(const MlaDecodeParams& p, cudaStream_t stream);
cudaError_t launch_decode_fp8(const MlaDecodeParams& p, cudaStream_t stream);
// Kernel v2 (sm90_mla_decode_v2.cu): 16 heads a block, both cache formats.
cudaError_t launch_decode_v2(const MlaDecodeParams& p, cudaStream_t stream);
// Kernels v3 / v4 (sm90_mla_decode_v3.cu): 64 heads a block, Q K^T by wgmma; P V by mma.sync (v3) or by
// wgmma (v4, pv_wgmma); both cache formats.
cudaError_t launch_decode_v3(const MlaDecodeParams& p, bool pv_wgmma, cudaStream_t stream);
// Kernel v5 (sm90_mla_decode_v5.cu): 64 heads a block, the two warpgroups take turns on whole key tiles
// (ping-pong); bf16 caches (an FP8 cache runs v4).
cudaError_t launch_decode_v5(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda::mla_detail
