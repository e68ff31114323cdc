// Sparse MLA decode, kernel v5 (bf16 latent cache): 64 heads a block, and the two warpgroups take turns on
// whole key tiles (rather than splitting every tile's dot products between them, as the removed v4 did), so
// one warpgroup's softmax and waits overlap the other's matrix products.
//
// Block = (query row, group of 64 heads, key split); 256 threads = warpgroups 0 and 1. Key tiles of 32
// (tile t lives in stage t % 4 of a 4-stage ring, 128-byte-swizzle K-major, the layout wgmma reads). Tile t
// is OWNED by warpgroup t % 2 and LOADED by the other one (cp.async through the page table, completion
// counted on the stage's `full` mbarrier). For its own tile u a warpgroup
//   a. computes S_u[64 heads, 32 keys] = Q K_u^T over all 576 dimensions (36 wgmma m64n32k16, Q and K
//      from shared memory), left running while
//   b. it takes over the other warpgroup's tile u - 1: its P (bf16 A fragments, handed over through the
//      dead rope columns of that tile's stage) and its running row maximum M_{u-1} (named barrier
//      `ready`, one per parity);
//   c. softmax: M_u = max(M_{u-1}, row max of S_u), P_u = exp2(S_u - M_u); hands P_u and M_u over;
//   d. O[64 heads, its 256 columns] += P_{u-1} V_{u-1}, then += P_u V_u (wgmma m64n256k16, P from
//      registers, V N-major from the stage); once both warpgroups are done with tile u - 1's stage
//      (`ofree` mbarrier, 256 arrivals) it loads tile u + 3 into it. kEarly moves the P_{u-1} V_{u-1}
//      product before c. and / or the reload right after that product (measured per key layout).
// O and the row sums are rescaled whenever M moves; both warpgroups see the same M sequence, so their
// column halves stay consistent. Row sums are taken from the bf16-rounded P both warpgroups multiply.
// While one warpgroup runs its softmax the other's products keep the tensor cores busy. A stage holds a
// tile from its load until both warpgroups multiplied it: with three tiles in use, one is in flight, and
// that bounds the kernel (an L2-resident cache runs no faster: 126-132 us at 64 heads x 128 rows x 2048
// keys, 0.6 of the HBM floor). Q (73.7 KB) and four 36.9 KB stages fill the shared memory.

#include "kernels/cuda/attention/sm90_mla_decode_v5.cuh"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

namespace {

constexpr int kRows5 = 64;                  // heads of a block
constexpr int kBn5 = 32;                    // keys per tile
constexpr int kStages5 = 4;                 // ring of tiles (three in use at a time: see above)
constexpr int kWgThreads = 128;             // threads of a warpgroup
constexpr int kTile5 = kBn5 * kMlaDim * 2;  // 36864 bytes: 9 column blocks of 32 rows x 128 bytes
constexpr int kRopeOff5 = 8 * kBn5 * 128;   // column block 8 (the rope key): 4 KB, P's hand-over slot
constexpr size_t kQOff5 = 0;
constexpr size_t kStageOff5 = size_t(kRows5) * kMlaDim * 2;  // 73728
constexpr size_t kValidOff5 = kStageOff5 + size_t(kStages5) * kTile5;
constexpr size_t kMOff5 = kValidOff5 + size_t(kStages5) * kBn5 * 4;  // [2][64] f32 row maxima
constexpr size_t kBarOff5 = kMOff5 + 2 * kRows5 * 4;                 // full[4], ofree[4]
constexpr size_t kSmem5 = kBarOff5 + 2 * kStages5 * 8 + 1024;        // + base alignment
static_assert(kSmem5 <= 227 * 1024, "shared memory");
static_assert(kStageOff5 % 1024 == 0 && kTile5 % 1024 == 0, "swizzled tiles 1024-aligned");

// kEarly (chosen by measurement, see launch_decode_v5): P_{u-1} V_{u-1} before the own softmax and the
// stage reloaded right after it; otherwise after the own hand-over, the stage reloaded after P_u V_u.
template <bool kEarly>
__global__ void __launch_bounds__(kThreads, 1) sm90_mla_decode_v5_kernel(const MlaDecodeParams p) {
  pdl_wait();  // programmatic launch (p.pdl): everything below reads or writes what other kernels touch
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sQ = smem + kQOff5;
  unsigned char* sStage = smem + kStageOff5;
  int* sValid = reinterpret_cast<int*>(smem + kValidOff5);
  float* sM = reinterpret_cast<float*>(smem + kMOff5);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff5);
  uint64_t* ofree = full + kStages5;

  const V5Block blk = v5_block<kRows5>(p);
  const int row = blk.row, split = blockIdx.z;
  const int64_t h0 = blk.h0;
  const int tid = threadIdx.x, wt = tid & 127;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform to the compiler: wgmma stays async
  const int wi = wt >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
  const int r0 = wi * 16 + g, r1 = r0 + 8;  // this thread's two head rows (of 64)

  const RowKeys keys(p, row, split, kBn5);
  const int n_tiles = keys.n_tiles;
  const unsigned char* cache = static_cast<const unsigned char*>(p.cache);

  if (tid == 0) {
    for (int s = 0; s < kStages5; ++s) {
      mma::mbar_init(full + s, kWgThreads);
      mma::mbar_init(ofree + s, kThreads);  // both warpgroups' P V
    }
  }
  __syncthreads();

  // Loading: this warpgroup loads the other's tiles, 1 - wg + 2k for k = 0, 1, ...; 4 threads per key row
  // (18 chunks of 16 bytes each). The position of load k + 2 and the page of load k + 1 are fetched one
  // step early so the dependent index loads do not stall the copies.
  const int lr = wt >> 2, lsub = wt & 3;
  auto load_tile = [&](int k) { return 1 - wg + 2 * k; };
  auto fetch_pos = [&](int k) -> int32_t {  // -1: no key
    const int t = load_tile(k);
    return t < n_tiles ? keys.position(keys.k_begin + int64_t(t) * kBn5 + lr) : -1;
  };
  auto fetch_page = [&](int32_t pos) { return keys.slot(pos); };
  KeySlot slot_a = fetch_page(fetch_pos(0));
  int32_t pos_b = fetch_pos(1);
  int next_load = 0;
  // Issues load `next_load` (its tile must exist) into its stage and counts it on the stage's barrier.
  auto issue_next = [&]() {
    const int t = load_tile(next_load);
    const int st = t % kStages5;
    const int64_t slot = int64_t(slot_a.page) * p.page_size + slot_a.off;
    const bool ok = slot_a.page >= 0 && slot < p.num_slots;
    const unsigned char* src = ok ? cache + slot * kMlaBf16RowBytes : cache;
    unsigned char* stage = sStage + size_t(st) * kTile5;
#pragma unroll
    for (int j = 0; j < kMlaDim / 8 / 4; ++j) {  // 18 chunks: lsub + 4j
      const int c = lsub + 4 * j;
      mma::cp_async16(stage + swz(kBn5, lr, c), src + c * 16, ok ? 16 : 0);
    }
    if (lsub == 0) mma::cp_async4(sValid + st * kBn5 + lr, kValidFlagOnes, ok ? 4 : 0);
    mma::cp_async_mbar_arrive_noinc(full + st);
    ++next_load;
    slot_a = fetch_page(pos_b);
    pos_b = fetch_pos(next_load + 1);
  };
  if (load_tile(0) < n_tiles) issue_next();
  if (load_tile(1) < n_tiles) issue_next();
  // In iteration u: the stage of tile u - 1 takes tile u + 3 once both warpgroups are done with it.
  auto reload = [&](int u) {
    if (load_tile(next_load) < n_tiles) {
      mma::mbar_wait(ofree + (u - 1) % kStages5, uint32_t((u - 1) / kStages5) & 1u);
      issue_next();
    }
  };

  load_q_rows<kRows5>([&](int r, int c) { return sQ + swz(kRows5, r, c >> 3) + (c & 7) * 2; }, p, row, h0,
                      tid);
  mma::fence_proxy_async_smem();
  __syncthreads();

  v5_consumers<kStages5, kTile5, kRopeOff5, kEarly>(p, row, split, h0, n_tiles, wg, wt, sQ, sStage, sValid,
                                                    sM, full, ofree, r0, r1, c4, reload);
}

template <bool kEarly>
cudaError_t launch_v5(const MlaDecodeParams& p, cudaStream_t stream) {
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v5_kernel<kEarly>), int(kSmem5));
  if (e != cudaSuccess) return e;
  const dim3 grid = v5_grid<kRows5>(p);
  return launch_pdl(p.pdl, sm90_mla_decode_v5_kernel<kEarly>, grid, dim3(kThreads), kSmem5, stream, p);
}

}  // namespace

cudaError_t launch_decode_v5(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.format != MlaKvFormat::bf16) return launch_decode_v5_fp8(p, stream);
  // The order: select_mla_v5_early (kernels/kernel_options.h; the measurements are there).
  const bool early = select_mla_v5_early(p.v5_order, p.sel != nullptr);
  return early ? launch_v5<true>(p, stream) : launch_v5<false>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
