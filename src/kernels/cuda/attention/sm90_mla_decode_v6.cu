// Sparse MLA decode, kernel v6 (bf16 or FP8 latent cache): 64 heads a block, key blocks of 64, and a producer
// warpgroup. v5 (sm90_mla_decode_v5.cu) takes 32-key tiles in turns and hands every tile's P and row maximum
// over to the other warpgroup: its Q K^T at N = 32 re-reads all of Q for every 32 keys (shared-memory bound,
// 864 cycles of 576 of arithmetic), and its softmax chain crosses warpgroups on every tile. v6 works in
// pairs of 64-key blocks (FlashMLA's SM90 sparse prefill has this shape; this is our own code):
//
// Block = (query row, group of 64 heads, key split); 384 threads: consumer warpgroups 0 and 1, producer 2.
// Shared memory: Q (64 x 576 bf16, 72 KB), two key buffers of 64 x 576 bf16 (72 KB each; block 2i of the
// split in buffer 0, block 2i + 1 in buffer 1), each in 9 column blocks of 64 rows x 128 bytes (128-byte
// swizzle, K-major: what wgmma reads), and P1 (64 x 64 bf16, 8 KB); P0 is written over buffer 0's rope
// column block, dead once Q K^T has read it.
// Each buffer comes in two halves with their own `ready` / `free` mbarriers: L = column blocks 0-3 (latent
// columns 0-255), R = column blocks 4-8 (latent 256-511 and the rope key). For pair i:
//   WG0: S0 = Q K0^T (m64n64k16 x 36; L's column blocks first, so they start while R lands); masked
//        online softmax against its running maximum: m0 = max(M, rowmax S0), O0 and its row sums scaled,
//        P0 = exp2(S0 - m0); hands m0 over (named barrier A); O0[:, 0:256] += P0 V0 (registers as A);
//        frees K0.L; takes the pair's maximum M' from WG1 (barrier B), scales P0 by exp2(m0 - M') into
//        shared memory (barrier S0); takes P1 (barrier S1) and O0[:, 0:256] += P1 V1 (both operands in
//        shared memory); frees K1.L.
//   WG1: S1 = Q K1^T (R's column blocks first); softmax against M' = max(m0, rowmax S1) (after barrier A):
//        O1 and its row sums scaled, P1 = exp2(S1 - M'); hands M' over (barrier B); O1[:, 256:512] +=
//        P1 V1; writes P1 to shared memory (barrier S1); takes P0 (barrier S0) and O1 += P0 V0; frees
//        K1.R and K0.R (P0 lives there).
//   Producer: per pair, K0.L, K1.R, K0.R, K1.L as each is freed: 8 threads a row of 128 bytes per column
//        block (16-byte cp.async, 4 rows a thread), the keys' valid flags in the first half of each buffer,
//        completion counted on the half's `ready` barrier; the next pair's list entries and page ids are
//        fetched a pair ahead so that no index load is waited for before a copy. FP8 rows instead go
//        through registers, one half job ahead, and are dequantised on the way (no raw rows in shared
//        memory).
// Both warpgroups end every pair at the same maximum M', so their column halves and row sums (each
// warpgroup sums its own P) add up at the end. A split's last block of an odd count is an empty one (no
// valid key: P = 0). The block's keys are those of RowKeys with 64-key tiles (splits in whole blocks).
// Measured on an H100 (2026-12-07, top-2048, batch 128): bf16 64 heads 137.1 us (v5 144.4, FlashMLA 128.7),
// 128 heads 193.1 (v5 239.9, FlashMLA 157.2); FP8 64 heads 160.0 (v5 142.8: the automatic choice keeps v5
// over FP8, kernel_options.h).
#include "kernels/cuda/attention/sm90_mla_decode.cuh"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

namespace {

constexpr int kRows6 = 64;             // heads of a block
constexpr int kBn6 = 64;               // keys per block
constexpr int kWg = 128;               // threads of a warpgroup
constexpr int kThreads6 = 3 * kWg;     // consumers 0 and 1, producer 2
constexpr int kConsumers = 2 * kWg;    // the consumers' named barriers count these
constexpr int kColBlock = kBn6 * 128;  // 8 KB: 64 rows x 128 bytes (64 bf16 columns)
constexpr int kBuf6 = 9 * kColBlock;   // 72 KB: a key block of 576 columns
constexpr int kHalfCb = 4;             // column blocks of the L half (latent 0-255)
// Register budgets a thread after setmaxnreg: the three warpgroups share the launch's 168 x 384 (a larger sum
// leaves setmaxnreg.inc waiting forever). The consumers need about 192 (ptxas spills 1.2 KB at 184); the FP8
// producer holds two jobs' raw rows (2 x 50 registers: 104 bytes of spill at 120), the bf16 one page slots.
template <bool kFp8>
constexpr int kProducerRegs = kFp8 ? 120 : 72;
template <bool kFp8>
constexpr int kConsumerRegs = kFp8 ? 192 : 216;
static_assert(kProducerRegs<true> + 2 * kConsumerRegs<true> <= 3 * 168 &&
                  kProducerRegs<false> + 2 * kConsumerRegs<false> <= 3 * 168,
              "register budgets");
constexpr size_t kQOff6 = 0;
constexpr size_t kBufOff6 = size_t(kRows6) * kMlaDim * 2;  // 73728
constexpr size_t kS1Off6 = kBufOff6 + 2 * size_t(kBuf6);   // P1: one column block
constexpr size_t kValidOff6 = kS1Off6 + kColBlock;         // [2][64] i32
constexpr size_t kMOff6 = kValidOff6 + 2 * kBn6 * 4;       // [64] f32: m0, then M'
constexpr size_t kBarOff6 = kMOff6 + kRows6 * 4;           // ready[2][2], free[2][2]
constexpr size_t kSmem6 = kBarOff6 + 8 * 8 + 1024;         // + base alignment
static_assert(kSmem6 <= 227 * 1024, "shared memory");
static_assert(kBufOff6 % 1024 == 0 && kBuf6 % 1024 == 0 && kS1Off6 % 1024 == 0,
              "swizzled tiles 1024-aligned");
static_assert(kConsumers == kThreads, "the consumers are 256 threads (load_q_rows)");

// Named barriers (0 is __syncthreads): each is arrived at by one consumer warpgroup and waited at by the
// other, once a pair.
constexpr int kBarM0 = 1;   // m0 in sM (WG0 -> WG1)
constexpr int kBarM1 = 2;   // M' in sM (WG1 -> WG0)
constexpr int kBarS0 = 3;   // P0 in buffer 0's rope block (WG0 -> WG1)
constexpr int kBarS1 = 4;   // P1 in sS1 (WG1 -> WG0)
constexpr int kBarEnd = 5;  // both consumers past their last product (the row sums' exchange)

// Byte offset of (row r, 16-byte chunk c) inside one 128-byte-swizzled column block of 64 rows.
__device__ __forceinline__ uint32_t cb_off(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

// kFp8: the cache holds FP8 rows (656 bytes), dequantised by the producer on their way to the key buffers.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads6, 1) sm90_mla_decode_v6_kernel(const MlaDecodeParams p) {
  pdl_wait();  // programmatic launch (p.pdl): everything below reads or writes what other kernels touch
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (mma::smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sQ = smem + kQOff6;
  unsigned char* sK = smem + kBufOff6;  // buffer b at sK + b * kBuf6
  unsigned char* sS1 = smem + kS1Off6;
  unsigned char* sS0 = sK + 8 * kColBlock;  // buffer 0's rope column block
  int* sValid = reinterpret_cast<int*>(smem + kValidOff6);
  float* sM = reinterpret_cast<float*>(smem + kMOff6);
  uint64_t* ready = reinterpret_cast<uint64_t*>(smem + kBarOff6);  // [buffer * 2 + half], half 0 = L
  uint64_t* freed = ready + 4;

  const V5Block blk = v5_block<kRows6>(p);
  const int row = blk.row, split = blockIdx.z;
  const int64_t h0 = blk.h0;
  const int tid = threadIdx.x, wt = tid & 127;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform to the compiler: wgmma stays async

  const RowKeys keys(p, row, split, kBn6);
  const int n_pairs = (keys.n_tiles + 1) / 2;

  if (tid == 0) {
    for (int i = 0; i < 4; ++i) {
      mma::mbar_init(ready + i, kWg);  // the producer's threads
      mma::mbar_init(freed + i, kWg);  // one consumer warpgroup
    }
  }

  if (wg == 2 && kFp8) {
    // ---- producer, FP8 rows ----
    // The four half jobs of a pair (K0.L, K1.R, K0.R, K1.L) in turn; thread: row r = wt / 2 of both
    // blocks, part q = wt % 2. A job's raw bytes are loaded into registers one job ahead (before its
    // buffer half is free), then dequantised (dequant_fp8x8: the values of every other FP8 reader) and
    // stored as bf16 once it is: 16-byte code chunks q + 2k (k < 8) of the half's 256 codes (neighbouring
    // threads read one 32-byte sector), the half's two scales, and in R the rope's chunks q + 2k (k < 4).
    const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
    const int r = wt >> 1, q = wt & 1;
    struct Raw {
      uint4 code[8], rope[4];
      uint2 scale;
      bool ok;
    };
    int32_t pos[2];   // the next pair's list entries (blocks 2i + 2, 2i + 3)
    int64_t slot[2];  // this pair's slots (-1: no key)
    auto fetch_pos = [&](int pair) {
#pragma unroll
      for (int b = 0; b < 2; ++b) pos[b] = keys.position(keys.k_begin + int64_t(2 * pair + b) * kBn6 + r);
    };
    auto fetch_slots = [&]() {
#pragma unroll
      for (int b = 0; b < 2; ++b) slot[b] = keys.cache_row(pos[b]);
    };
    // Job (buffer b, half h) of this pair's rows into registers (zeros for no key).
    auto load = [&](Raw& x, int b, int h) {
      x.ok = slot[b] >= 0;
      if (x.ok) {
        const uint4* src = reinterpret_cast<const uint4*>(cache + slot[b] * kMlaFp8RowBytes);
#pragma unroll
        for (int k = 0; k < 8; ++k) x.code[k] = __ldg(src + h * 16 + q + 2 * k);
        x.scale = __ldg(reinterpret_cast<const uint2*>(src + kMlaLatent / 16) + h);
        if (h == 1) {
#pragma unroll
          for (int k = 0; k < 4; ++k) x.rope[k] = __ldg(src + (kMlaLatent + 16) / 16 + q + 2 * k);
        }
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) x.code[k] = make_uint4(0, 0, 0, 0);
        x.scale = make_uint2(0, 0);
#pragma unroll
        for (int k = 0; k < 4; ++k) x.rope[k] = make_uint4(0, 0, 0, 0);
      }
    };
    // Its bf16 values into the buffer half, the valid flag with `flags`, then counted on its `ready`.
    auto store = [&](const Raw& x, int b, int h, bool flags) {
      unsigned char* buf = sK + size_t(b) * kBuf6;
      const float sc[2] = {__uint_as_float(x.scale.x), __uint_as_float(x.scale.y)};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int chunk = q + 2 * k;           // of the half's 16 code chunks (16 codes each)
        const int col = h * 256 + chunk * 16;  // its first latent column
        const float s = sc[chunk >> 3];        // scale block h * 2 + chunk / 8
        const int cb = col >> 6, cc = (col & 63) >> 3;
        *reinterpret_cast<uint4*>(buf + cb * kColBlock + cb_off(r, cc)) =
            dequant_fp8x8(make_uint2(x.code[k].x, x.code[k].y), s);
        *reinterpret_cast<uint4*>(buf + cb * kColBlock + cb_off(r, cc + 1)) =
            dequant_fp8x8(make_uint2(x.code[k].z, x.code[k].w), s);
      }
      if (h == 1) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          *reinterpret_cast<uint4*>(buf + 8 * kColBlock + cb_off(r, q + 2 * k)) = x.rope[k];
      }
      if (flags && q == 0) sValid[b * kBn6 + r] = x.ok ? 1 : 0;
      // No proxy fence here: it would wait for the next job's loads in flight; the consumers fence after
      // their `ready` wait (as they must for the bf16 producer's cp.async rows).
      mma::mbar_arrive(ready + b * 2 + h);
    };
    fetch_pos(0);
    fetch_slots();
    fetch_pos(1);
    __syncthreads();  // the barriers are initialised
    mma::setmaxnreg_dec<kProducerRegs<kFp8>>();
    Raw a, c;
    if (n_pairs > 0) load(a, 0, 0);
    for (int i = 0; i < n_pairs; ++i) {
      const uint32_t par = uint32_t(i - 1) & 1u;  // the consumers' release of pair i - 1
      load(c, 1, 1);
      if (i > 0) mma::mbar_wait(freed + 0, par);
      store(a, 0, 0, true);
      load(a, 0, 1);
      if (i > 0) mma::mbar_wait(freed + 3, par);
      store(c, 1, 1, true);
      load(c, 1, 0);
      if (i > 0) mma::mbar_wait(freed + 1, par);
      store(a, 0, 1, false);
      fetch_slots();  // pair i + 1's (entries fetched a pair ago); job K1.L below still uses this pair's
      if (i + 1 < n_pairs) load(a, 0, 0);
      if (i > 0) mma::mbar_wait(freed + 2, par);
      store(c, 1, 0, false);
      fetch_pos(i + 2);  // -1 past the split: an empty block
    }
    return;
  }
  if (wg == 2) {
    // ---- producer, bf16 rows ----
    // Thread: row group rg = wt / 8 (rows rg + 16 j, j < 4, of each block), chunk c8 = wt % 8 of a row's
    // 128 bytes in every column block (8 threads copy one row's 128 bytes: one coalesced segment).
    const unsigned char* cache = static_cast<const unsigned char*>(p.cache);
    const int rg = wt >> 3, c8 = wt & 7;
    int32_t pos[2][4];   // the next pair's list entries (blocks 2i + 2, 2i + 3)
    int64_t slot[2][4];  // this pair's slots (-1: no key)
    auto fetch_pos = [&](int pair) {
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          pos[b][j] = keys.position(keys.k_begin + int64_t(2 * pair + b) * kBn6 + rg + 16 * j);
    };
    auto fetch_slots = [&]() {  // from pos
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j) slot[b][j] = keys.cache_row(pos[b][j]);
    };
    // Column blocks [c0, c1) of buffer b from this pair's rows; with the valid flags when `flags`.
    auto copy = [&](int b, int c0, int c1, bool flags) {
      unsigned char* buf = sK + size_t(b) * kBuf6;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = rg + 16 * j;
        const bool ok = slot[b][j] >= 0;
        const unsigned char* src = ok ? cache + slot[b][j] * kMlaBf16RowBytes + c8 * 16 : cache;
#pragma unroll
        for (int c = c0; c < c1; ++c)
          mma::cp_async16(buf + c * kColBlock + cb_off(r, c8), src + c * 128, ok ? 16 : 0);
        if (flags && c8 == 0) mma::cp_async4(sValid + b * kBn6 + r, kValidFlagOnes, ok ? 4 : 0);
      }
      mma::cp_async_mbar_arrive_noinc(ready + b * 2 + (c0 == 0 ? 0 : 1));
    };
    fetch_pos(0);
    fetch_slots();
    fetch_pos(1);
    __syncthreads();  // the barriers are initialised
    mma::setmaxnreg_dec<kProducerRegs<kFp8>>();
    for (int i = 0; i < n_pairs; ++i) {
      const uint32_t par = uint32_t(i - 1) & 1u;  // the consumers' release of pair i - 1
      if (i > 0) mma::mbar_wait(freed + 0, par);
      copy(0, 0, kHalfCb, true);
      if (i > 0) mma::mbar_wait(freed + 3, par);
      copy(1, kHalfCb, 9, true);
      if (i > 0) mma::mbar_wait(freed + 1, par);
      copy(0, kHalfCb, 9, false);
      if (i > 0) mma::mbar_wait(freed + 2, par);
      copy(1, 0, kHalfCb, false);
      fetch_slots();     // pair i + 1's (entries fetched a pair ago)
      fetch_pos(i + 2);  // -1 past the split: an empty block
    }
    mma::cp_async_wait<0>();
    return;
  }

  // ---- consumers ----
  const int wi = wt >> 5, lane = tid & 31, g = lane >> 2, c4 = lane & 3;
  const int r0 = wi * 16 + g, r1 = r0 + 8;  // this thread's two head rows (of 64)
  load_q_rows<kRows6>([&](int r, int c) { return sQ + swz(kRows6, r, c >> 3) + (c & 7) * 2; }, p, row, h0,
                      tid);
  mma::fence_proxy_async_smem();
  __syncthreads();
  mma::setmaxnreg_inc<kConsumerRegs<kFp8>>();

  float oacc[32][4];  // O[r0 / r1][256 wg + 8 i + 2 c4 ..]
#pragma unroll
  for (int i = 0; i < 32; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m_run0 = -INFINITY, m_run1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // the pair maximum M, own row sums
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_addr = mma::smem_addr(sQ);
  const uint32_t k_addr = mma::smem_addr(sK);
  const uint32_t my_addr = k_addr + uint32_t(wg) * kBuf6;

  // S (+)= Q K^T over column blocks [c0, c1) of this warpgroup's buffer (`first`: S = the product).
  float d[32] = {};
  auto qk = [&](int c0, int c1, bool first) {
#pragma unroll
    for (int c = c0; c < c1; ++c)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = uint32_t(kk) * 32;
        mma::wgmma_m64n64k16_bf16(d, mma::wgmma_desc_sw128(q_addr + uint32_t(c) * kColBlock + off),
                                  mma::wgmma_desc_sw128(my_addr + uint32_t(c) * kColBlock + off),
                                  first && c == c0 && kk == 0 ? 0 : 1);
      }
  };
  // O (this warpgroup's 256 columns) += P V over buffer vb: P from registers (a) or from shared memory.
  const uint32_t v_col = uint32_t(wg) * kHalfCb * kColBlock;
  auto pv_rs = [&](int vb, const uint32_t(&a)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      mma::wgmma_m64n256k16_bf16_rs(
          oacc, a[j],
          mma::wgmma_desc_sw128_mn(k_addr + uint32_t(vb) * kBuf6 + v_col + j * 16 * 128, kColBlock), 1);
  };
  auto pv_ss = [&](int vb, uint32_t p_addr) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      mma::wgmma_m64n256k16_bf16_ss(
          oacc, mma::wgmma_desc_sw128(p_addr + uint32_t(j) * 32),
          mma::wgmma_desc_sw128_mn(k_addr + uint32_t(vb) * kBuf6 + v_col + j * 16 * 128, kColBlock), 1);
  };
  // This thread's P values (rows r0 / r1) as bf16 into a 64 x 64 K-major swizzled tile.
  auto store_p = [&](unsigned char* dst, const uint32_t(&a)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // keys 16 j + 8 h + 2 c4: chunk 2 j + h
        *reinterpret_cast<uint32_t*>(dst + cb_off(r0, 2 * j + h) + 4 * c4) = a[j][2 * h];
        *reinterpret_cast<uint32_t*>(dst + cb_off(r1, 2 * j + h) + 4 * c4) = a[j][2 * h + 1];
      }
  };
  // Masked online softmax of d against `prev` maxima (rows r0, r1): returns P's A fragments, the new
  // maxima in mn0 / mn1; scales O and the row sums by exp2(M - new) and adds P's row sums.
  auto softmax = [&](float prev0, float prev1, float& mn0, float& mn1, uint32_t(&a)[4][4]) {
    float mx0, mx1;
    masked_row_max(d, d, sValid + wg * kBn6, c4, sl2, mx0, mx1);
    mn0 = fmaxf(prev0, mx0);
    mn1 = fmaxf(prev1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    const float al0 = exp2f(m_run0 - mu0), al1 = exp2f(m_run1 - mu1);
    rescale_rows(oacc, al0, al1);
    exp2_pack_p(d, mu0, mu1, a);
    float rs0, rs1;
    bf16_row_sums(a, rs0, rs1);
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    m_run0 = mn0;
    m_run1 = mn1;
  };
  auto wait_ready = [&](int half, uint32_t par) {
    mma::mbar_wait(ready + wg * 2 + half, par);
    mma::fence_proxy_async_smem();
  };

  for (int i = 0; i < n_pairs; ++i) {
    const uint32_t par = uint32_t(i) & 1u;
    uint32_t a[4][4];
    float mn0, mn1;
    mma::wgmma_fence_operands(d);
    mma::wgmma_fence();
    if (wg == 0) {
      wait_ready(0, par);
      qk(0, kHalfCb, true);
      wait_ready(1, par);
      qk(kHalfCb, 9, false);
    } else {
      wait_ready(1, par);
      qk(kHalfCb, 9, true);
      wait_ready(0, par);
      qk(0, kHalfCb, false);
    }
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(d);
    if (wg == 0) {
      softmax(m_run0, m_run1, mn0, mn1, a);
      if (c4 == 0) {
        sM[r0] = mn0;
        sM[r1] = mn1;
      }
      mma::named_arrive(kBarM0, kConsumers);
      mma::wgmma_fence_operands(oacc);
      mma::wgmma_fence();
      pv_rs(0, a);  // O0 += P0 V0 (at m0)
      mma::wgmma_commit();
      mma::wgmma_wait<0>();
      mma::wgmma_fence_operands(oacc);
      mma::mbar_arrive(freed + 0);  // K0.L
      mma::named_sync(kBarM1, kConsumers);
      const float M0 = sM[r0], M1 = sM[r1];  // the pair's maximum (>= m0)
      const float sf0 = M0 == -INFINITY ? 1.f : exp2f(mn0 - M0),
                  sf1 = M1 == -INFINITY ? 1.f : exp2f(mn1 - M1);
      if (__any_sync(0xffffffffu, sf0 != 1.f || sf1 != 1.f)) {  // P0 at M' (and O0, its row sums, below)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[j][q]));
            const float s = q % 2 == 0 ? sf0 : sf1;
            a[j][q] = mma::pack_bf16(f.x * s, f.y * s);
          }
      }
      store_p(sS0, a);
      mma::fence_proxy_async_smem();
      mma::named_arrive(kBarS0, kConsumers);
      rescale_rows(oacc, sf0, sf1);
      l0 *= sf0;
      l1 *= sf1;
      m_run0 = M0;
      m_run1 = M1;
      mma::named_sync(kBarS1, kConsumers);
      mma::wgmma_fence_operands(oacc);
      mma::wgmma_fence();
      pv_ss(1, mma::smem_addr(sS1));  // O0 += P1 V1
      mma::wgmma_commit();
      mma::wgmma_wait<0>();
      mma::wgmma_fence_operands(oacc);
      mma::mbar_arrive(freed + 2);  // K1.L
    } else {
      mma::named_sync(kBarM0, kConsumers);
      softmax(sM[r0], sM[r1], mn0, mn1, a);  // M' = max(m0, rowmax S1)
      if (c4 == 0) {
        sM[r0] = mn0;
        sM[r1] = mn1;
      }
      mma::named_arrive(kBarM1, kConsumers);
      mma::wgmma_fence_operands(oacc);
      mma::wgmma_fence();
      pv_rs(1, a);  // O1 += P1 V1
      mma::wgmma_commit();
      store_p(sS1, a);
      mma::fence_proxy_async_smem();
      mma::named_arrive(kBarS1, kConsumers);
      mma::named_sync(kBarS0, kConsumers);
      pv_ss(0, mma::smem_addr(sS0));  // O1 += P0 V0
      mma::wgmma_commit();
      mma::wgmma_wait<1>();
      mma::mbar_arrive(freed + 3);  // K1.R
      mma::wgmma_wait<0>();
      mma::wgmma_fence_operands(oacc);
      mma::mbar_arrive(freed + 1);  // K0.R (and P0)
    }
  }
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)

  // Row sums: each warpgroup summed its own P; thread wt of the other warpgroup holds the same rows and
  // columns, so the exchange goes through Q's (dead) shared memory thread by thread.
  mma::named_sync(kBarEnd, kConsumers);
  float2* sL = reinterpret_cast<float2*>(sQ);
  sL[wg * kWg + wt] = make_float2(l0, l1);
  mma::named_sync(kBarEnd, kConsumers);
  const float2 other = sL[(1 - wg) * kWg + wt];
  store_decode_rows(p, row, split, h0 + r0, h0 + r1, wg * 256, oacc, m_run0, m_run1, l0 + other.x,
                    l1 + other.y, wg == 0);
}

template <bool kFp8>
cudaError_t launch_v6(const MlaDecodeParams& p, cudaStream_t stream) {
  const cudaError_t e =
      set_max_dynamic_smem(reinterpret_cast<const void*>(sm90_mla_decode_v6_kernel<kFp8>), int(kSmem6));
  if (e != cudaSuccess) return e;
  return launch_pdl(p.pdl, sm90_mla_decode_v6_kernel<kFp8>, v5_grid<kRows6>(p), dim3(kThreads6), kSmem6,
                    stream, p);
}

}  // namespace

cudaError_t launch_decode_v6(const MlaDecodeParams& p, cudaStream_t stream) {
  return p.format == MlaKvFormat::bf16 ? launch_v6<false>(p, stream) : launch_v6<true>(p, stream);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
