// Sparse MLA decode, kernel v5 over an FP8 latent cache (656-byte rows: 512 e4m3 codes, 4 f32 block scales,
// 64 bf16 rope values). The two consumer warpgroups run v5's ping-pong unchanged (sm90_mla_decode_v5.cuh:
// whole key tiles taken in turns, P and the row maxima handed over, Q K^T and P V on wgmma from 128-byte-
// swizzled bf16 tiles, four stages); a third, producer warpgroup feeds them: it gathers each tile's raw rows
// by cp.async into the tail of the tile's own stage, two tiles ahead, and once they landed reads them into
// registers and writes the dequantised bf16 tile (code x scale rounded to bf16, rope copied) over them, then
// counts the tile on the stage's `full` mbarrier. A stage is refilled once both consumers multiplied its
// tile (`ofree`, 256 arrivals). The values equal the bf16 copy's (launch_mla_cache_bf16_copy).
//
// Shared memory: Q 72 KB, four 36 KB stages (221 KB with the flags and the index rings). Registers: the
// producer gives back to 88 a thread, the consumers take 208 (v5's accumulators: 128), within the 168 x 384
// the launch holds. Measured on the H200 (attention_gpu_bench, top-2048, 64 heads): batch 128 151 us (the
// removed v4, which dequantised in the threads that multiply: 266; FlashMLA 122), batch 32 60 us (v4 87;
// FlashMLA 52); on an H100 with the index rings (2026-12-07): batch 128 144.5 us (without: 161.0; FlashMLA
// 125.8), batch 32 57.5 (FlashMLA 56.7).
#include "kernels/cuda/attention/sm90_mla_decode_v5.cuh"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

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
// The producer's index rings: list entries are copied kSelAhead tiles ahead and page ids kPageAhead ahead.
// The copies of iteration t have landed by iteration t + 2, so the rows of tile t + 2 (issued in iteration
// t) need its page from iteration t - 2 or earlier, and that page its entry from two iterations before.
// The prologue fills kSelAhead entries at once; a slot is rewritten kRing tiles later.
constexpr int kSelAhead = 6, kPageAhead = 4, kRing = 8;
static_assert(kPageAhead >= 2 + 2 && kSelAhead >= kPageAhead + 2 && kRing >= kSelAhead, "index rings");
constexpr size_t kIdxOffF = kBarOffF + 2 * kStagesF * 8;              // [kRing][32] i32 stored positions
constexpr size_t kPgOffF = kIdxOffF + size_t(kRing) * kBnF * 4;       // [kRing][32] i32 pages (-1: none)
constexpr size_t kOfOffF = kPgOffF + size_t(kRing) * kBnF * 4;        // [kRing][32] i32 offsets in page
constexpr size_t kSmemF = kOfOffF + size_t(kRing) * kBnF * 4 + 1024;  // + base alignment
static_assert(kSmemF <= 227 * 1024, "shared memory");
static_assert(kStageOffF % 1024 == 0 && kTileF % 1024 == 0, "swizzled tiles 1024-aligned");
static_assert(kMlaFp8RowBytes % 16 == 0 && kRawOff5 % 16 == 0, "raw rows 16-aligned");
static_assert(kConsumers == kThreads, "the consumers are v5's 256 threads (load_q_rows)");

// Named barriers (0 is __syncthreads): v5's (1 - 4: ready(t) for t even / odd, one per consumer warpgroup;
// sm90_mla_decode_v5.cuh), then the producer's.
constexpr int kProducerBar = 5;

// kEarly: as v5 (P_{u-1} V_{u-1} before the own softmax, releasing that stage sooner) or after the hand-over.
template <bool kEarly>
__global__ void __launch_bounds__(kThreadsF, 1) sm90_mla_decode_v5_fp8_kernel(const MlaDecodeParams p) {
  pdl_wait();  // programmatic launch (p.pdl): everything below reads or writes what other kernels touch
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sQ = smem + kQOffF;
  unsigned char* sStage = smem + kStageOffF;
  int* sValid = reinterpret_cast<int*>(smem + kValidOffF);
  float* sM = reinterpret_cast<float*>(smem + kMOffF);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOffF);
  uint64_t* ofree = full + kStagesF;
  int* sIdx = reinterpret_cast<int*>(smem + kIdxOffF);
  int* sPg = reinterpret_cast<int*>(smem + kPgOffF);
  int* sOf = reinterpret_cast<int*>(smem + kOfOffF);

  const V5Block blk = v5_block<kRowsF>(p);
  const int row = blk.row, split = blockIdx.z;
  const int64_t h0 = blk.h0;
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
    // consumers hold the other two stages. Issue: 4 threads a raw row (chunks isub + 4j of 41).
    // The row's list entries and page ids reach shared memory the same way, by 4-byte cp.async in the tile
    // groups (rings sIdx / sPg of kRing tiles): tile t + kSelAhead's entry and tile t + kPageAhead's page
    // (from its entry, copied two groups earlier) go with tile t + 2's rows, so the wait for the rows
    // covers them and no index or page-table load is ever waited for in the loop (a plain load of the
    // entry, consumed a step later, stalled the producer on every tile: 7% of all the kernel's samples).
    // Dequantisation: 8 threads a row, rows lr and lr + 16: bf16 chunks lsub + 8m (m < 8: 8 codes at byte
    // 8 (lsub + 8m), scale m / 2) and rope chunk lsub; a warp's stores of one m fill one 128-byte row
    // of a column block (no bank conflicts).
    const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
    const int ir = wt >> 2, isub = wt & 3;
    const int lr = wt >> 3, lsub = wt & 7;
    const int32_t* sel_mine = p.sel ? p.sel + int64_t(row) * p.sel_stride + keys.k_begin + ir : nullptr;
    const int n_mine = int(keys.k_end - keys.k_begin) - ir;  // row ir's entries: 32 t < n_mine
    auto has = [&](int t) { return t < n_tiles && t * kBnF < n_mine; };
    auto stored_pos = [&](int t) -> int32_t {  // after tile t's sel copy landed
      if (!has(t)) return -1;
      return sel_mine ? sIdx[(t % kRing) * kBnF + ir] : int32_t(keys.k_begin) + ir + t * kBnF;
    };
    auto copy_sel = [&](int t) {  // sel entry of tile t, row ir -> sIdx (lane isub 0, sparse rows)
      if (!sel_mine || isub != 0) return;
      int* d = sIdx + (t % kRing) * kBnF + ir;
      if (has(t))
        mma::cp_async4(d, sel_mine + t * kBnF, 4);
      else
        *d = -1;
    };
    auto copy_page = [&](int t) {  // page id of tile t, row ir -> sPg, offset -> sOf (lane isub 0)
      if (isub != 0) return;
      int32_t off = 0;
      const int32_t* e = keys.page_entry(stored_pos(t), off);
      const int i = (t % kRing) * kBnF + ir;
      if (e)
        mma::cp_async4(sPg + i, e, 4);
      else
        sPg[i] = -1;
      sOf[i] = off;
    };
    auto issue = [&](int t) {
      const int s = t % kStagesF;
      const int i = (t % kRing) * kBnF + ir;
      const KeySlot ks{sPg[i], sOf[i]};
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
    {  // prologue: positions of tiles 0 .. kSelAhead - 1 and pages of 0 .. kPageAhead - 1, synchronously
      if (isub == 0)
        for (int t = 0; t < kSelAhead; ++t)
          sIdx[(t % kRing) * kBnF + ir] = has(t) && sel_mine ? sel_mine[t * kBnF] : -1;
      __syncwarp();
      for (int t = 0; t < kPageAhead; ++t)
        if (isub == 0) {
          int32_t off = 0;
          const int32_t* e = keys.page_entry(stored_pos(t), off);
          sPg[(t % kRing) * kBnF + ir] = e ? *e : -1;
          sOf[(t % kRing) * kBnF + ir] = off;
        }
      __syncwarp();
      if (n_tiles > 0) issue(0);
      mma::cp_async_commit();
      if (n_tiles > 1) issue(1);
      mma::cp_async_commit();
    }
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
      copy_page(t + kPageAhead);  // its sel copy: group t - 2, landed
      copy_sel(t + kSelAhead);
      // Tile t + 2 into the stage of tile t - 2 once both consumers multiplied it.
      if (t + 2 < n_tiles) {
        if (t >= 2) mma::mbar_wait(ofree + (t + 2) % kStagesF, uint32_t((t - 2) / kStagesF) & 1u);
        issue(t + 2);
      }
      mma::cp_async_commit();
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

  auto no_reload = [](int) {};  // the producer refills the stages
  v5_consumers<kStagesF, kTileF, kRopeOffF, kEarly>(p, row, split, h0, n_tiles, wg, wt, sQ, sStage, sValid,
                                                    sM, full, ofree, r0, r1, c4, no_reload);
}

template <bool kEarly>
cudaError_t launch_v5_fp8(const MlaDecodeParams& p, cudaStream_t stream) {
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v5_fp8_kernel<kEarly>), int(kSmemF));
  if (e != cudaSuccess) return e;
  const dim3 grid = v5_grid<kRowsF>(p);
  return launch_pdl(p.pdl, sm90_mla_decode_v5_fp8_kernel<kEarly>, grid, dim3(kThreadsF), kSmemF, stream, p);
}

}  // namespace

cudaError_t launch_decode_v5_fp8(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.format != MlaKvFormat::fp8_e4m3) return cudaErrorInvalidValue;
  const bool early = select_mla_v5_early(p.v5_order, p.sel != nullptr);
  return early ? launch_v5_fp8<true>(p, stream) : launch_v5_fp8<false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
