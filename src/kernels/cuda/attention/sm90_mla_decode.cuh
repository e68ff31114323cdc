#pragma once
// Helpers shared by the sparse MLA decode kernels (absorbed form): v2 (sm90_mla_decode_v2.cu: 16 heads a
// block, keys split across warps; the default for <= 16 heads) and v5 (sm90_mla_decode_v5.cu: 64 heads a
// block, Q K^T and P V by wgmma, the two warpgroups taking turns on key tiles, the default above 16 heads for
// three or more query rows over FP8 caches -- one or two rows run v2; over an FP8 cache
// sm90_mla_decode_v5_fp8.cu adds a producer warpgroup that dequantises) and v6 (sm90_mla_decode_v6.cu: 64-key
// blocks in pairs and a producer warpgroup; the default over bf16 caches), and their launch entry points
// (dispatched by launch_mla_decode in sm90_mla_decode.cu). The kernels run 256 threads a block (v5 over FP8
// and v6: 384) and gather latent rows through the page table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/attention/mla_decode_params.h"
#include "kernels/cuda/common/sm90_mma.cuh"

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

// v5's blocks (kRows heads each): a row's head groups on grid.y, or with p.head_groups_adjacent on
// neighbouring blocks of grid.x (block x = row * groups + group), so that they run in the same wave and the
// later groups gather the row's keys from L2; the key splits on grid.z either way. v5_block: this block's
// query row and first head.
template <int kRows>
inline dim3 v5_grid(const MlaDecodeParams& p) {
  const unsigned groups = unsigned((p.heads + kRows - 1) / kRows);
  return p.head_groups_adjacent ? dim3(unsigned(p.rows) * groups, 1, unsigned(p.splits))
                                : dim3(unsigned(p.rows), groups, unsigned(p.splits));
}
struct V5Block {
  int row;
  int64_t h0;
};
template <int kRows>
__device__ __forceinline__ V5Block v5_block(const MlaDecodeParams& p) {
  if (!p.head_groups_adjacent) return {int(blockIdx.x), int64_t(blockIdx.y) * kRows};
  const unsigned groups = unsigned((p.heads + kRows - 1) / kRows);
  return {int(blockIdx.x / groups), int64_t(blockIdx.x % groups) * kRows};
}

// The source of a valid key's flag for the kernels that copy flags by cp.async next to their rows (4 bytes
// copied: 1; 0 bytes: the zero fill says "no key"). A const at namespace scope: each kernel file its own.
__device__ const int kValidFlagOnes[4] = {1, 1, 1, 1};

// A key's cache slot: page id (-1: no key) and position within the page.
struct KeySlot {
  int32_t page;
  int32_t off;
};

// The keys one decode block visits: query row `row`'s list (its selection, or positions 0 .. len - 1 when
// dense) cut into p.splits chunks of whole tiles of kBn keys, this split's chunk [k_begin, k_end) in
// n_tiles tiles; list entry li's position (-1: no key) and that position's slot through the row's page
// table. Positions are < 2^31 (row_len is i32): one 32-bit division per key splits a position into page
// and offset.
struct RowKeys {
  const MlaDecodeParams& p;
  int row;
  int64_t seq, n_vis, k_begin, k_end;
  int n_tiles;
  bool ps32;
  uint32_t ps;
  __device__ __forceinline__ RowKeys(const MlaDecodeParams& params, int r, int split, int kBn)
      : p(params), row(r) {
    seq = p.row_seq ? p.row_seq[row] : row;
    const bool seq_ok = seq >= 0 && seq < p.num_seqs;
    n_vis = seq_ok ? p.row_len[row] : 0;
    const int64_t n_list = p.sel ? p.sel_k : (n_vis > 0 ? n_vis : 0);
    const int64_t per_split = (n_list + p.splits - 1) / p.splits;
    const int64_t chunk = (per_split + kBn - 1) / kBn * kBn;
    k_begin = int64_t(split) * chunk;
    k_end = k_begin + chunk < n_list ? k_begin + chunk : n_list;
    n_tiles = k_end > k_begin ? int((k_end - k_begin + kBn - 1) / kBn) : 0;
    ps32 = p.page_size > 0 && p.page_size <= 0x7fffffff;
    ps = ps32 ? uint32_t(p.page_size) : 1u;
  }
  // List entry li (>= k_begin) as stored, or -1 past the chunk: a position not yet checked against the
  // row (slot() checks it). Unchecked and 32-bit, so nothing consumes the load until slot(): callers fetch
  // it a step before they need its page, and the index load's latency stays off their critical path
  // (measured: validating here stalled v5's FP8 producer on every tile).
  __device__ __forceinline__ int32_t position(int64_t li) const {
    if (li >= k_end) return -1;
    return p.sel ? p.sel[int64_t(row) * p.sel_stride + li] : int32_t(li);
  }
  // Position `pos` (from position()) as its page-table column pi and offset in the page; false for an
  // entry outside the row (negative, at or past its length) or past the page table.
  __device__ __forceinline__ bool locate(int32_t pos, uint32_t& pi, int32_t& off) const {
    if (pos < 0 || pos >= n_vis || !ps32) return false;
    pi = uint32_t(pos) / ps;
    if (int64_t(pi) >= p.pt_cols) return false;
    off = int32_t(uint32_t(pos) - pi * ps);
    return true;
  }
  // Where position `pos`'s page id is stored (null: outside the row) and its offset in the page.
  __device__ __forceinline__ const int32_t* page_entry(int32_t pos, int32_t& off) const {
    uint32_t pi;
    return locate(pos, pi, off) ? p.page_table + seq * p.pt_stride + pi : nullptr;
  }
  // The slot of position `pos` (from position()); page -1 for an entry outside the row.
  __device__ __forceinline__ KeySlot slot(int32_t pos) const {
    uint32_t pi;
    int32_t off;
    if (!locate(pos, pi, off)) return {-1, 0};
    return {p.page_table[seq * p.pt_stride + pi], off};
  }
  // The cache row of position `pos` (from position()): -1 for an entry outside the row or a page outside
  // the cache.
  __device__ __forceinline__ int64_t cache_row(int32_t pos) const {
    const KeySlot ks = slot(pos);
    const int64_t s = int64_t(ks.page) * p.page_size + ks.off;
    return ks.page >= 0 && s < p.num_slots ? s : -1;
  }
};

// The softmax steps of v5's and v6's consumers over one wgmma accumulator fragment of N = 4 I values: d[4i +
// e] is head row r0 (e < 2) or r1 (e >= 2) of the thread, key 8i + 2 c4 + e % 2 (c4 = lane % 4). s = d in the
// log2 domain (times sl2), -inf where valid[key] is 0 (s may be d); mx0 / mx1: the two rows' maxima over the
// 4 lanes that share them.
template <int N>
__device__ __forceinline__ void masked_row_max(const float (&d)[N], float (&s)[N], const int* valid, int c4,
                                               float sl2, float& mx0, float& mx1) {
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = i * 8 + 2 * c4 + (e & 1);
      s[i * 4 + e] = valid[key] ? d[i * 4 + e] * sl2 : -INFINITY;
    }
    mx0 = fmaxf(mx0, fmaxf(s[i * 4], s[i * 4 + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[i * 4 + 2], s[i * 4 + 3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}
// s = exp2(s - mu) in rows r0 (mu0) and r1 (mu1), then P's bf16 A fragments of the N / 8 16-key steps.
template <int N>
__device__ __forceinline__ void exp2_pack_p(float (&s)[N], float mu0, float mu1, uint32_t (&a)[N / 8][4]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    s[i * 4] = exp2f(s[i * 4] - mu0);
    s[i * 4 + 1] = exp2f(s[i * 4 + 1] - mu0);
    s[i * 4 + 2] = exp2f(s[i * 4 + 2] - mu1);
    s[i * 4 + 3] = exp2f(s[i * 4 + 3] - mu1);
  }
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    a[j][0] = mma::pack_bf16(s[8 * j], s[8 * j + 1]);
    a[j][1] = mma::pack_bf16(s[8 * j + 2], s[8 * j + 3]);
    a[j][2] = mma::pack_bf16(s[8 * j + 4], s[8 * j + 5]);
    a[j][3] = mma::pack_bf16(s[8 * j + 6], s[8 * j + 7]);
  }
}
// Rows r0 / r1's sums of the bf16 P values in A fragments a (what the P V products multiply).
template <int J>
__device__ __forceinline__ void bf16_row_sums(const uint32_t (&a)[J][4], float& rs0, float& rs1) {
  rs0 = 0.f;
  rs1 = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[j][q]));
      if (q % 2 == 0)
        rs0 += f.x + f.y;
      else
        rs1 += f.x + f.y;
    }
  }
}

// O rows r0 / r1 of this thread (oacc[i][0..1] / [2..3]) times al0 / al1 after the running row maximum
// moved; skipped when it moved in no row of the warp (the common case once the maxima settle).
template <int N>
__device__ __forceinline__ void rescale_rows(float (&oacc)[N][4], float al0, float al1) {
  if (__any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      oacc[i][0] *= al0;
      oacc[i][1] *= al0;
      oacc[i][2] *= al1;
      oacc[i][3] *= al1;
    }
  }
}

// The end of a decode block: sums each head row's softmax denominator over the 4 lanes that share the row,
// then writes this thread's O values (head rows hr0 / hr1; columns col + 8 i + 2 (lane % 4) and the next,
// i < N) divided by it -- into `out` when the row has one split, else into this split's partial row -- and,
// when lse_writer, the rows' log-sum-exp (log2 domain) for the combine kernel. Rows at or past p.heads are
// skipped; rows without keys (m = -inf or l = 0) give zeros and a log-sum-exp of -inf.
template <int N>
__device__ __forceinline__ void store_decode_rows(const MlaDecodeParams& p, int row, int split, int64_t hr0,
                                                  int64_t hr1, int col, const float (&oacc)[N][4], float m0,
                                                  float m1, float l0, float l1, bool lse_writer) {
  const int c4 = threadIdx.x & 3;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float f0 = m0 == -INFINITY || !(l0 > 0.f) ? 0.f : 1.f / l0;
  const float f1 = m1 == -INFINITY || !(l1 > 0.f) ? 0.f : 1.f / l1;
  const bool direct = p.splits == 1;
  auto dst_row = [&](int64_t h) -> float* {
    return direct ? p.out + (int64_t(row) * p.heads + h) * kMlaLatent
                  : p.partial_out + ((int64_t(row) * p.splits + split) * p.heads + h) * kMlaLatent;
  };
  if (hr0 < p.heads) {
    float* dst = dst_row(hr0) + col + 2 * c4;
#pragma unroll
    for (int i = 0; i < N; ++i)
      *reinterpret_cast<float2*>(dst + i * 8) = make_float2(oacc[i][0] * f0, oacc[i][1] * f0);
  }
  if (hr1 < p.heads) {
    float* dst = dst_row(hr1) + col + 2 * c4;
#pragma unroll
    for (int i = 0; i < N; ++i)
      *reinterpret_cast<float2*>(dst + i * 8) = make_float2(oacc[i][2] * f1, oacc[i][3] * f1);
  }
  if (!direct && lse_writer && c4 == 0) {
    float* lse = p.partial_lse + (int64_t(row) * p.splits + split) * p.heads;
    if (hr0 < p.heads) lse[hr0] = f0 > 0.f ? m0 + log2f(l0) : -INFINITY;
    if (hr1 < p.heads) lse[hr1] = f1 > 0.f ? m1 + log2f(l1) : -INFINITY;
  }
}

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

// Eight e4m3 latent codes times their block scale `sc`, each rounded to bf16: 16 bytes of a bf16 row (every
// FP8 reader dequantises through this: v2, v5's producer, the bf16 copy).
__device__ __forceinline__ uint4 dequant_fp8x8(uint2 codes, float sc) {
  const uint32_t w[2] = {codes.x, codes.y};
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_fp8x2_storage_t pair = __nv_fp8x2_storage_t((w[j / 2] >> ((j % 2) * 16)) & 0xffff);
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
    o[j] = mma::pack_bf16(f.x * sc, f.y * sc);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// FP8 rows of one tile (kBn rows of kMlaFp8RowBytes in shared memory) -> bf16 rows [kBn, kLd]: latent codes
// times their block scale, rope values copied.
template <int kBn>
__device__ __forceinline__ void dequant_fp8_tile(__nv_bfloat16* sKv, const unsigned char* raw, int tid) {
  for (int i = tid; i < kBn * 72; i += kThreads) {
    const int r = i / 72, c = i % 72;
    const unsigned char* rr = raw + r * kMlaFp8RowBytes;
    if (c < 64) {
      *reinterpret_cast<uint4*>(sKv + r * kLd + c * 8) =
          dequant_fp8x8(*reinterpret_cast<const uint2*>(rr + c * 8),
                        *reinterpret_cast<const float*>(rr + kMlaLatent + (c / 16) * 4));
    } else {
      *reinterpret_cast<uint4*>(sKv + r * kLd + kMlaLatent + (c - 64) * 8) =
          *reinterpret_cast<const uint4*>(rr + kMlaLatent + 16 + (c - 64) * 16);
    }
  }
}

// Kernel v2 (sm90_mla_decode_v2.cu): 16 heads a block, both cache formats.
cudaError_t launch_decode_v2(const MlaDecodeParams& p, cudaStream_t stream);
// Kernel v5 (sm90_mla_decode_v5.cu): 64 heads a block, the two warpgroups take turns on whole key tiles
// (ping-pong); a bf16 cache here, an FP8 one through launch_decode_v5_fp8.
cudaError_t launch_decode_v5(const MlaDecodeParams& p, cudaStream_t stream);
// Kernel v5 over an FP8 cache (sm90_mla_decode_v5_fp8.cu): v5's two consumer warpgroups fed by a producer
// warpgroup that gathers the raw rows and dequantises them into the bf16 tiles (a bf16 launch here fails).
cudaError_t launch_decode_v5_fp8(const MlaDecodeParams& p, cudaStream_t stream);
// Kernel v6 (sm90_mla_decode_v6.cu): 64 heads a block, 64-key blocks in pairs, a producer warpgroup that
// copies bf16 rows or dequantises FP8 ones.
cudaError_t launch_decode_v6(const MlaDecodeParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda::mla_detail
