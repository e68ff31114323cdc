#pragma once
// Kernel v5's two consumer warpgroups (the ping-pong described in sm90_mla_decode_v5.cu), shared by the
// bf16-cache kernel (sm90_mla_decode_v5.cu, where the consumers also load each other's tiles) and the
// FP8-cache one (sm90_mla_decode_v5_fp8.cu, where a producer warpgroup fills the stages): per own key tile
// u, S_u = Q K_u^T by wgmma; the other warpgroup's P_{u-1} and row maxima taken over through the stage's
// rope columns and sM; the online softmax of tile u and the hand-over of P_u; O += P V by wgmma; then the
// end of the block (store_decode_rows).
#include "kernels/cuda/attention/sm90_mla_decode.cuh"

namespace dsaserve::kernels::cuda::mla_detail {

// v5's named barriers (0 is __syncthreads): ready(t) for t even / odd (both consumer warpgroups, 256
// threads), then one per consumer warpgroup.
__device__ __forceinline__ int v5_ready_bar(int t) { return 1 + (t & 1); }
__device__ __forceinline__ int v5_wg_bar(int wg) { return 3 + wg; }

// The consumers' loop over this split's n_tiles key tiles and the block's output, run by the 256 threads of
// warpgroups wg = 0 and 1 (tid < 256) once Q is in sQ (64 head rows, 128-byte-swizzled K-major). Tile t lives
// in stage t % kStages (kStageBytes apart from sStage, the bf16 tile at the stage's start in the layout
// wgmma reads; P is handed over at byte kHandOff of the stage, the rope key's column block) and is owned by
// warpgroup t % 2; sValid [kStages][32] flags its keys, sM [2][64] holds the handed-over row maxima.
// full[s]: tile complete in stage s; ofree[s]: 256 arrivals once both warpgroups multiplied its tile.
// reload(u) is called where v5's consumers refill the stage of tile u - 1 (after its P V with kEarly, else
// after the own P_u V_u): a no-op when a producer warpgroup refills. wt = tid % 128; r0 / r1: this thread's
// two head rows (of 64), c4 = lane % 4: computed by each kernel where it did before this code was shared
// (computing them here moves the bf16 kernel's register allocation: 250 registers instead of 220).
template <int kStages, int kStageBytes, int kHandOff, bool kEarly, class Reload>
__device__ __forceinline__ void v5_consumers(const MlaDecodeParams& p, int row, int split, int64_t h0,
                                             int n_tiles, int wg, int wt, unsigned char* sQ,
                                             unsigned char* sStage, int* sValid, float* sM, uint64_t* full,
                                             uint64_t* ofree, int r0, int r1, int c4, Reload& reload) {
  constexpr int kRows = 64;  // heads of a block
  constexpr int kBn = 32;    // keys per tile
  constexpr int kWg = 128;   // threads of a warpgroup
  static_assert(kStageBytes >= kBn * kMlaDim * 2 && kStageBytes % 1024 == 0, "a stage holds a swizzled tile");
  static_assert(kHandOff + 2 * 4 * kWg * 4 <= kStageBytes, "P's hand-over slot inside the stage");

  float oacc[32][4];  // O[r0 / r1][256 wg + 8 i + 2 c4 ..]
#pragma unroll
  for (int i = 0; i < 32; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
  float m_run0 = -INFINITY, m_run1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const float sl2 = p.scale * 1.4426950408889634f;
  const uint32_t q_addr = mma::smem_addr(sQ);

  // O (and the row sums) += P_t V_t over this warpgroup's 256 columns; P_t as A fragments, relative to
  // the row maxima mt0 / mt1 (>= every earlier tile's).
  auto accumulate = [&](int t, const uint32_t(&a)[2][4], float mt0, float mt1) {
    const float mu0 = mt0 == -INFINITY ? 0.f : mt0, mu1 = mt1 == -INFINITY ? 0.f : mt1;
    const float al0 = exp2f(m_run0 - mu0), al1 = exp2f(m_run1 - mu1);
    m_run0 = mt0;
    m_run1 = mt1;
    float rs0, rs1;
    bf16_row_sums(a, rs0, rs1);
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
    rescale_rows(oacc, al0, al1);
    const uint32_t t_addr = mma::smem_addr(sStage + size_t(t % kStages) * kStageBytes);
    mma::wgmma_fence_operands(oacc);
    mma::wgmma_fence();
#pragma unroll
    for (int j = 0; j < 2; ++j)
      mma::wgmma_m64n256k16_bf16_rs(
          oacc, a[j],
          mma::wgmma_desc_sw128_mn(t_addr + uint32_t(wg * 4 * kBn * 128 + j * 16 * 128), kBn * 128), 1);
    mma::wgmma_commit();
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(oacc);
  };

  for (int u = wg; u <= n_tiles; u += 2) {  // u == n_tiles: only the other warpgroup's last tile
    const bool own = u < n_tiles;
    const int st = u % kStages;
    // a. S_u = Q K_u^T (left running while b. waits and multiplies).
    float d[16] = {};
    if (own) {
      mma::mbar_wait(full + st, uint32_t(u / kStages) & 1u);
      mma::fence_proxy_async_smem();
      const uint32_t t_addr = mma::smem_addr(sStage + size_t(st) * kStageBytes);
      mma::wgmma_fence_operands(d);
      mma::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kMlaDim / 16; ++k) {  // column block k / 4, 32-byte step k % 4 inside it
        const uint32_t koff = uint32_t(k & 3) * 32;
        mma::wgmma_m64n32k16_bf16(d, mma::wgmma_desc_sw128(q_addr + uint32_t(k >> 2) * (kRows * 128) + koff),
                                  mma::wgmma_desc_sw128(t_addr + uint32_t(k >> 2) * (kBn * 128) + koff),
                                  k > 0 ? 1 : 0);
      }
      mma::wgmma_commit();
    }
    // b. The other warpgroup's tile u - 1: its P and row maxima; with kEarly, O += P_{u-1} V_{u-1} at
    //    once, so that its stage is released early.
    float mp0 = -INFINITY, mp1 = -INFINITY;
    uint32_t ao[2][4];
    auto other_pv = [&]() {  // O += P_{u-1} V_{u-1}; then, with kEarly, reload(u)
      const int sp = (u - 1) % kStages;
      mma::mbar_wait(full + sp, uint32_t((u - 1) / kStages) & 1u);  // complete; orders its writes
      mma::fence_proxy_async_smem();
      accumulate(u - 1, ao, mp0, mp1);
      mma::mbar_arrive(ofree + sp);
      if (kEarly) reload(u);
    };
    if (u >= 1) {
      const int sp = (u - 1) % kStages;
      mma::named_sync(v5_ready_bar(u - 1), kThreads);
      const uint32_t* src = reinterpret_cast<const uint32_t*>(sStage + size_t(sp) * kStageBytes + kHandOff);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) ao[j][q] = src[(j * 4 + q) * kWg + wt];
      mp0 = sM[((u - 1) & 1) * kRows + r0];
      mp1 = sM[((u - 1) & 1) * kRows + r1];
      if (kEarly || !own) other_pv();  // (also waits for S_u)
    }
    if (!own) continue;
    // c. Softmax of tile u; hand P_u and M_u over.
    mma::wgmma_wait<0>();
    mma::wgmma_fence_operands(d);
    // Every warp's part of S_u has read the rope columns before any warp writes P_u over them.
    mma::named_sync(v5_wg_bar(wg), kWg);
    uint32_t a[2][4];
    float s[16];
    float mx0, mx1;
    masked_row_max(d, s, sValid + st * kBn, c4, sl2, mx0, mx1);
    const float mn0 = fmaxf(mp0, mx0), mn1 = fmaxf(mp1, mx1);
    const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
    exp2_pack_p(s, mu0, mu1, a);
    uint32_t* dst = reinterpret_cast<uint32_t*>(sStage + size_t(st) * kStageBytes + kHandOff);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) dst[(j * 4 + q) * kWg + wt] = a[j][q];
    if (c4 == 0) {
      sM[(u & 1) * kRows + r0] = mn0;
      sM[(u & 1) * kRows + r1] = mn1;
    }
    mma::named_arrive(v5_ready_bar(u), kThreads);
    if (!kEarly && u >= 1) other_pv();
    // d. O += P_u V_u.
    accumulate(u, a, mn0, mn1);
    mma::mbar_arrive(ofree + st);
    if (!kEarly && u >= 1) reload(u);
  }
  mma::grid_launch_dependents();  // the combine kernel may start launching (it waits for this grid)

  store_decode_rows(p, row, split, h0 + r0, h0 + r1, wg * 256, oacc, m_run0, m_run1, l0, l1, wg == 0);
}

}  // namespace dsaserve::kernels::cuda::mla_detail
