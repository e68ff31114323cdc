// Sparse MLA decode, kernel v5 over an FP8 latent cache (656-byte rows: 512 e4m3 codes, 4 f32 block scales,
// 64 bf16 rope values). The two consumer warpgroups run v5's ping-pong unchanged (sm90_mla_decode_v5.cu:
// whole key tiles taken in turns, P and the row maxima handed over, Q K^T and P V on wgmma from 128-byte-
// swizzled bf16 tiles, four stages); a third, producer warpgroup feeds them: it gathers each tile's raw rows
// by cp.async into the tail of the tile's own stage, two tiles ahead, and once they landed reads them into
// registers and writes the dequantised bf16 tile (code x scale rounded to bf16, rope copied) over them, then
// counts the tile on the stage's `full` mbarrier. A stage is refilled once both consumers multiplied its
// tile (`ofree`, 256 arrivals). The values equal the bf16 copy's (launch_mla_cache_bf16_copy).
//
// Shared memory: Q 72 KB, four 36 KB stages (218 KB with the flags). Registers: the producer gives back to 88
// a thread, the consumers take 208 (v5's accumulators: 128), within the 168 x 384 the launch holds.
// Measured on the H200 (attention_gpu_bench, top-2048, 64 heads): batch 128 151 us (the removed v4, which
// dequantised in the threads that multiply: 266; FlashMLA 122), batch 32 60 us (v4 87; FlashMLA 52).
#include "kernels/cuda/attention/sm90_mla_decode.cuh"
#include "kernels/cuda/common/device_cache.h"

namespace dsaserve::kernels::cuda::mla_detail {

namespace {

constexpr int kRowsF = 64;           // heads of a block
constexpr int kBnF = 32;             // keys per tile
constexpr int kStagesF = 4;          // bf16 tiles (two in use by the consumers, two filling)
constexpr int kWg = 128;             // threads of a warpgroup
constexpr int kThreadsF = 3 * kWg;   // consumers 0 and 1, producer 2
constexpr int kConsumers = 2 * kWg;  // the consumers' named barriers count these
constexpr int kProducerRegs = 88, kConsumerRegs = 208;  // 88 x 128 + 208 x 256 = 168 x 384
constexpr int kTileF = kBnF * kMlaDim * 2;              // 36864 bytes: 9 column blocks of 32 rows x 128 bytes
constexpr int kRopeOffF = 8 * kBnF * 128;               // column block 8 (the rope key): P's hand-over slot
constexpr int kChunks = kMlaFp8RowBytes / 16;           // 41 16-byte chunks a raw row
constexpr int kRawOff5 = kTileF - kBnF * kMlaFp8RowBytes;  // 15872: the raw rows at the end of a stage
constexpr size_t kQOffF = 0;
constexpr size_t kStageOffF = size_t(kRowsF) * kMlaDim * 2;  // 73728
constexpr size_t kValidOffF = kStageOffF + size_t(kStagesF) * kTileF;
constexpr size_t kMOffF = kValidOffF + size_t(kStagesF) * kBnF * 4;  // [2][64] f32 row maxima
constexpr size_t kBarOffF = kMOffF + 2 * kRowsF * 4;                 // full[4], ofree[4]
constexpr size_t kSmemF = kBarOffF + 2 * kStagesF * 8 + 1024;        // + base alignment
static_assert(kSmemF <= 227 * 1024, "shared memory");
static_assert(kStageOffF % 1024 == 0 && kTileF % 1024 == 0, "swizzled tiles 1024-aligned");
static_assert(kMlaFp8RowBytes % 16 == 0 && kRawOff5 % 16 == 0, "raw rows 16-aligned");
static_assert(kConsumers == kThreads, "the consumers are v5's 256 threads (load_q_rows)");

// Named barriers (0 is __syncthreads): ready(t) for t even / odd, one per consumer warpgroup, the producer's.
__device__ __forceinline__ int ready_bar(int t) { return 1 + (t & 1); }
__device__ __forceinline__ int wg_bar(int wg) { return 3 + wg; }
constexpr int kProducerBar = 5;

// kEarly: as v5 (P_{u-1} V_{u-1} before the own softmax, releasing that stage sooner) or after the hand-over.
template <bool kEarly>
__global__ void __launch_bounds__(kThreadsF, 1) sm90_mla_decode_v5_fp8_kernel(const MlaDecodeParams p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sQ = smem + kQOffF;
  unsigned char* sStage = smem + kStageOffF;
  int* sValid = reinterpret_cast<int*>(smem + kValidOffF);
  float* sM = reinterpret_cast<float*>(smem + kMOffF);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffF);
  uint64_t* ofree = full + kStagesF;

  const int row = blockIdx.x, split = blockIdx.z;
  const int64_t h0 = int64_t(blockIdx.y) * kRowsF;
  const int tid = threadIdx.x, wt = tid & 127;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform to the compiler: wgmma stays async

  const RowKeys keys(p, row, split, kBnF);
  const int n_tiles = keys.n_tiles;

  if (tid == 0) {
    for (int s = 0; s < kStagesF; ++s) {
      mma::mbar_init(full + s, kWg);          // the producer's threads
      mma::mbar_init(ofree + s, kConsumers);  // both consumers' P V
    }
  }

  if (wg == 2) {
    // ---- producer ----
    // Tile t's raw rows are gathered by cp.async into the tail of its own stage (kRawOff5: the bf16 tile
    // is written over them once every raw byte is in registers), issued two tiles ahead: once tile t - 2's
    // stage is released (`ofree`) tile t + 2 goes there, so two tiles (42 KB) are in flight while the
    // consumers hold the other two stages. Issue: 4 threads a raw row (chunks isub + 4j of 41); the
    // position of the tile after next and the page of the next are fetched a step early.
    // Dequantisation: 8 threads a row, rows lr and lr + 16: bf16 chunks lsub + 8m (m < 8: 8 codes at byte
    // 8 (lsub + 8m), scale m / 2) and rope chunk lsub; a warp's stores of one m fill one 128-byte row
    // of a column block (no bank conflicts).
    const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
    const int ir = wt >> 2, isub = wt & 3;
    const int lr = wt >> 3, lsub = wt & 7;
    auto fetch_pos = [&](int t) -> int64_t {
      return t < n_tiles ? keys.position(keys.k_begin + int64_t(t) * kBnF + ir) : -1;
    };
    auto issue = [&](int t, KeySlot ks) {
      const int s = t % kStagesF;
      const int64_t slot = int64_t(ks.page) * p.page_size + ks.off;
      const bool ok = ks.page >= 0 && slot < p.num_slots;
      const unsigned char* src = ok ? cache + slot * kMlaFp8RowBytes : cache;
      unsigned char* dst = sStage + size_t(s) * kTileF + kRawOff5 + size_t(ir) * kMlaFp8RowBytes;
#pragma unroll
      for (int j = 0; j < (kChunks + 3) / 4; ++j) {
        const int c = isub + 4 * j;
        if (c < kChunks) mma::cp_async16(dst + c * 16, src + c * 16, ok ? 16 : 0);
      }
      if (isub == 0) sValid[s * kBnF + ir] = ok ? 1 : 0;
    };
    {
      const KeySlot k0 = keys.slot(fetch_pos(0)), k1 = keys.slot(fetch_pos(1));
      if (n_tiles > 0) issue(0, k0);
      mma::cp_async_commit();
      if (n_tiles > 1) issue(1, k1);
      mma::cp_async_commit();
    }
    KeySlot ks_next = keys.slot(fetch_pos(2));
    int64_t pos_after = fetch_pos(3);
    __syncthreads();  // the barriers are initialised
    mma::setmaxnreg_dec<kProducerRegs>();
    for (int t = 0; t < n_tiles; ++t) {
      const int s = t % kStagesF;
      mma::cp_async_wait<1>();             // tile t has landed (this thread's copies; t + 1 may not)
      mma::named_sync(kProducerBar, kWg);  // ... everyone's
      unsigned char* stage = sStage + size_t(s) * kTileF;
      uint2 codes[2][8];
      uint4 scales[2], rope[2];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const unsigned char* rr = stage + kRawOff5 + size_t(lr + 16 * q) * kMlaFp8RowBytes;
#pragma unroll
        for (int m = 0; m < 8; ++m) codes[q][m] = *reinterpret_cast<const uint2*>(rr + 8 * (lsub + 8 * m));
        scales[q] = *reinterpret_cast<const uint4*>(rr + kMlaLatent);
        rope[q] = *reinterpret_cast<const uint4*>(rr + kMlaLatent + 16 + 16 * lsub);
      }
      mma::named_sync(kProducerBar, kWg);  // every raw byte is read before the bf16 tile covers them
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int row_t = lr + 16 * q;
        const float sc[4] = {__uint_as_float(scales[q].x), __uint_as_float(scales[q].y),
                             __uint_as_float(scales[q].z), __uint_as_float(scales[q].w)};
#pragma unroll
        for (int m = 0; m < 8; ++m)
          *reinterpret_cast<uint4*>(stage + swz(kBnF, row_t, lsub + 8 * m)) =
              dequant_fp8x8(codes[q][m], sc[m / 2]);
        *reinterpret_cast<uint4*>(stage + swz(kBnF, row_t, 64 + lsub)) = rope[q];
      }
      mma::fence_proxy_async_smem();  // the stores -> visible to the consumers' wgmma
      mma::mbar_arrive(full + s);
      // Tile t + 2 into the stage of tile t - 2 once both consumers multiplied it.
      if (t + 2 < n_tiles) {
        if (t >= 2) mma::mbar_wait(ofree + (t + 2) % kStagesF, uint32_t((t - 2) / kStagesF) & 1u);
        issue(t + 2, ks_next);
      }
      mma::cp_async_commit();
      ks_next = keys.slot(pos_after);
      pos_after = fetch_pos(t + 4);
    }
    mma::cp_async_wait<0>();
    return;
  }

  // ---- consumers: v5's ping-pong ----
  const int wi = wt >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
  const int r0 = wi * 16 + g, r1 = r0 + 8;  // this thread's two head rows (of 64)
  load_q_rows<kRowsF>([&](int r, int c) { return sQ + swz(kRowsF, r, c >> 3) + (c & 7) * 2; }, p, row, h0,
                      tid);
  mma::fence_proxy_async_smem();
  __syncthreads();
  mma::setmaxnreg_inc<kConsumerRegs>();

  float oacc[32][4];  // O[r0 / r1][256 wg + 8 i + 2 c4 ..]
#pragma unroll
  for (int i = 0; i < 32; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m_run0 = -INFINITY, m_run1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_addr = mma::smem_addr(sQ);

  // O (and the row sums) += P_t V_t over this warpgroup's 256 columns (see v5).
  auto accumulate = [&](int t, const uint32_t(&a)[2][4], float mt0, float mt1) {
    const float mu0 = mt0 == -INFINITY ? 0.f : mt0, mu1 = mt1 == -INFINITY ? 0.f : mt1;
    const float al0 = exp2f(m_run0 - mu0), al1 = exp2f(m_run1 - mu1);
    m_run0 = mt0;
    m_run1 = mt1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[j][q]));
        if (q % 2 == 0)
          rs0 += f.x + f.y;
        else
          rs1 += f.x + f.y;
      }
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    rescale_rows(oacc, al0, al1);
    const uint32_t t_addr = mma::smem_addr(sStage + size_t(t % kStagesF) * kTileF);
    mma::wgmma_fence_operands(oacc);
    mma::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 2; ++j)
      mma::wgmma_m64n256k16_bf16_rs(
          oacc, a[j],
          mma::wgmma_desc_sw128_mn(t_addr + uint32_t(wg * 4 * kBnF * 128 + j * 16 * 128), kBnF * 128), 1);
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(oacc);
  };

  for (int u = wg; u <= n_tiles; u += 2) {  // u == n_tiles: only the other warpgroup's last tile
    const bool own = u < n_tiles;
    const int st = u % kStagesF;
    // a. S_u = Q K_u^T (left running while b. waits and multiplies).
    float d[16] = {};
    if (own) {
      mma::mbar_wait(full + st, uint32_t(u / kStagesF) & 1u);
      mma::fence_proxy_async_smem();
      const uint32_t t_addr = mma::smem_addr(sStage + size_t(st) * kTileF);
      mma::wgmma_fence_operands(d);
      mma::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kMlaDim / 16; ++k) {  // column block k / 4, 32-byte step k % 4 inside it
        const uint32_t koff = uint32_t(k & 3) * 32;
        mma::wgmma_m64n32k16_bf16(d, mma::wgmma_desc_sw128(q_addr + uint32_t(k >> 2) * (kRowsF * 128) + koff),
                                  mma::wgmma_desc_sw128(t_addr + uint32_t(k >> 2) * (kBnF * 128) + koff),
                                  k > 0 ? 1 : 0);
      }
      mma::wgmma_commit();
    }
    // b. The other warpgroup's tile u - 1: its P and row maxima (and with kEarly its P V at once).
    float mp0 = -INFINITY, mp1 = -INFINITY;
    uint32_t ao[2][4];
    auto other_pv = [&]() {
      const int sp = (u - 1) % kStagesF;
      mma::mbar_wait(full + sp, uint32_t((u - 1) / kStagesF) & 1u);  // complete (its refill waits for us)
      mma::fence_proxy_async_smem();
      accumulate(u - 1, ao, mp0, mp1);
      mma::mbar_arrive(ofree + sp);
    };
    if (u >= 1) {
      const int sp = (u - 1) % kStagesF;
      mma::named_sync(ready_bar(u - 1), kConsumers);
      const uint32_t* src = reinterpret_cast<const uint32_t*>(sStage + size_t(sp) * kTileF + kRopeOffF);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) ao[j][q] = src[(j * 4 + q) * kWg + wt];
      mp0 = sM[((u - 1) & 1) * kRowsF + r0];
      mp1 = sM[((u - 1) & 1) * kRowsF + r1];
      if (kEarly || !own) other_pv();  // (also waits for S_u)
    }
    if (!own) continue;
    // c. Softmax of tile u; hand P_u and M_u over.
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(d);
    // Every warp's part of S_u has read the rope columns before any warp writes P_u over them.
    mma::named_sync(wg_bar(wg), kWg);
    uint32_t a[2][4];
    float s[16];
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = i * 8 + 2 * c4 + (e & 1);
        s[i * 4 + e] = sValid[st * kBnF + key] ? d[i * 4 + e] * sl2 : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[i * 4], s[i * 4 + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[i * 4 + 2], s[i * 4 + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(mp0, mx0), mn1 = fmaxf(mp1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[i * 4] = exp2f(s[i * 4] - mu0);
      s[i * 4 + 1] = exp2f(s[i * 4 + 1] - mu0);
      s[i * 4 + 2] = exp2f(s[i * 4 + 2] - mu1);
      s[i * 4 + 3] = exp2f(s[i * 4 + 3] - mu1);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // A fragments of the two 16-key steps
      a[j][0] = mma::pack_bf16(s[8 * j], s[8 * j + 1]);
      a[j][1] = mma::pack_bf16(s[8 * j + 2], s[8 * j + 3]);
      a[j][2] = mma::pack_bf16(s[8 * j + 4], s[8 * j + 5]);
      a[j][3] = mma::pack_bf16(s[8 * j + 6], s[8 * j + 7]);
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(sStage + size_t(st) * kTileF + kRopeOffF);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[(j * 4 + q) * kWg + wt] = a[j][q];
    if (c4 == 0) {
      sM[(u & 1) * kRowsF + r0] = mn0;
      sM[(u & 1) * kRowsF + r1] = mn1;
    }
    mma::named_arrive(ready_bar(u), kConsumers);
    if (!kEarly && u >= 1) other_pv();
    // d. O += P_u V_u.
    accumulate(u, a, mn0, mn1);
    mma::mbar_arrive(ofree + st);
  }
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)

  store_decode_rows(p, row, split, h0 + r0, h0 + r1, wg * 256, oacc, m_run0, m_run1, l0, l1, wg == 0);
}

template <bool kEarly>
cudaError_t launch_v5_fp8(const MlaDecodeParams& p, cudaStream_t stream) {
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v5_fp8_kernel<kEarly>), int(kSmemF));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(p.rows), unsigned((p.heads + kRowsF - 1) / kRowsF), unsigned(p.splits));
  sm90_mla_decode_v5_fp8_kernel<kEarly><<<grid, kThreadsF, kSmemF, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_decode_v5_fp8(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.format != MlaKvFormat::fp8_e4m3) return cudaErrorInvalidValue;
  const bool early = select_mla_v5_early(p.v5_order, p.sel != nullptr);
  return early ? launch_v5_fp8<true>(p, stream) : launch_v5_fp8<false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
