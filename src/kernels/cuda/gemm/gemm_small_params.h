#pragma once
// Block-scaled FP8 GEMM for few tokens (decode batches, T <= kFp8SmallMaxTokens): out[t][n] =
// sum over 128-blocks kb of (sum_k xq[t][k] w[n][k]) * w_scale[n / 128][kb] * x_scale[kb][t], the same
// arithmetic as the cuBLASLt recipe (activations quantised per token per 128-group by launch_quant_fp8),
// with f32 outputs (no bf16 D). Weight-read bound: each CTA streams a 128-row slice of W once over its
// K range through tensor cores (mma.sync m16n8k32 e4m3); the activations sit in shared memory. K is
// split over CTAs when the row slices alone would not fill the GPU; the partial sums are added in a fixed
// order by the last CTA of each slice (deterministic, one launch).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_options.h"

namespace dsaserve::kernels::cuda {

inline constexpr int64_t kFp8SmallMaxTokens = kGemmFp8SmallMaxTokens;
// The default token limit of the linear layers' small-T path (KernelOptions::gemm_fp8_small_max_tokens).
// Measured on the H200 (CUDA-graph replays, GLM-5.3 shapes): at 1-8 tokens this kernel beats cuBLASLt's
// block-scaled GEMM for narrow outputs (q_a 7.5 vs 15.2 us at T = 1, kv_a 6.2 vs 15.0, LM head 254 vs 344)
// and ties or loses for long K (o_proj); at 32 tokens mma.sync's FP8 rate makes it compute bound (q_b 31 vs
// 16 us).
inline constexpr int64_t kFp8SmallDefaultTokens = kGemmFp8SmallDefaultTokens;
// Row slices (of 128 rows) a split launch can count: the size of the counters buffer.
inline constexpr int64_t kFp8SmallCounters = int64_t(1) << 16;

// One more weight of a fused small-T launch (Fp8SmallGemmParams::more): the same fields as the call's own.
struct Fp8SmallSegment {
  const uint8_t* w;          // [N, K] e4m3 codes, contiguous
  const float* w_scale;      // row n's scales at w_scale[((row0 + n) / 128) * w_scale_ld + kb]
  int64_t row0, w_scale_ld;  // row0 % 128 == 0
  float* out;                // [T, N] f32, row stride out_stride
  int64_t out_stride;
  int64_t N;
};
// Weights beside the call's own that one launch can take (linear_multi's FP8 parts: q_a + kv_a, gate + up).
inline constexpr int kFp8SmallMaxMore = 3;
// The deeper pipeline Fp8SmallGemmParams::stages may ask for (6 K blocks of 18 KB in flight per CTA).
inline constexpr int kFp8SmallDeepStages = 6;

struct Fp8SmallGemmParams {
  const uint8_t* w;          // [N, K] e4m3 codes (row 0 = output feature 0 of this call), contiguous
  const float* w_scale;      // row n's scales at w_scale[((row0 + n) / 128) * w_scale_ld + kb]
  int64_t row0, w_scale_ld;  // row0 % 128 == 0 (each CTA's 128 rows share one scale row)
  const uint8_t* xq;         // [Tp, K] e4m3 codes (rows >= T are zero)
  const float* x_scale;      // [K / 128, Tp]
  float* out;                // [T, N] f32, row stride out_stride
  int64_t out_stride;
  int64_t T, Tp, N, K;  // Tp in {8, 16, 32}, Tp >= T; K % 128 == 0
  float* partial;       // [splits, T, N] f32 scratch (splits > 1)
  uint32_t* counters;   // [kFp8SmallCounters] zero on entry, left zero on exit (splits > 1)
  int splits;           // CTAs along K (1 = no split)
  int ctas_per_sm = 0;  // CTAs an SM holds (fp8_small_ctas_per_sm; 0: its default)
  bool pdl = false;     // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
  // K blocks in flight: 0 or 4 (the default), or kFp8SmallDeepStages (Tp 8 at 2 CTAs an SM only: an
  // experiment, ops_gpu_bench stages; nothing else sets it).
  int stages = 0;
  // Stage each K block with two tensor-map (TMA) copies from a producer warp into 128-byte-swizzled tiles,
  // the 8 consumer warps released per stage by mbarriers instead of a block barrier (gemm_small.cu's
  // tensor-map kernel; an experiment, ops_gpu_bench stages; Tp 8 at 2 CTAs an SM, one weight). Replaced the
  // first experiment, one warp's bulk copy a weight row, measured 3.6-4.4x slower than cp.async (2026-12-08).
  bool tma = false;
  // More weights on the same activations in this launch: more[0, n_more), each with its own rows, scales
  // and output. Their 128-row slices follow this call's along the grid and share its K split; `partial`
  // then holds each weight's [splits, T, N] at splits * T * 128 * (the row slices before it), and
  // fp8_small_fused_scratch() floats in all. The slices' count decides ctas_per_sm and the split
  // (fp8_small_fused_splits): one wave for all of them, not one each.
  Fp8SmallSegment more[kFp8SmallMaxMore] = {};
  int n_more = 0;
};

// The 128-row slices of a launch (its own N and its more[] weights').
int64_t fp8_small_slices(const Fp8SmallGemmParams& p);
// The f32 scratch a split launch of p needs (splits x T x 128 x slices; 0 without a split).
int64_t fp8_small_fused_scratch(const Fp8SmallGemmParams& p);

// The CTAs per SM a launch of N outputs and Tp token rows runs at: `requested` 2 or 3, or 0 for the
// default (3 at Tp 8 with at least 64 row slices of 128, else 2); 3 is only built for Tp 8.
int fp8_small_ctas_per_sm(int64_t N, int64_t Tp, int requested = 0);
// The K split launch_fp8_small_gemm would use for N output features and K inputs (whole waves of the
// CTAs per SM that Tp and ctas_per_sm give).
int fp8_small_gemm_splits(int64_t N, int64_t K, int64_t Tp, int ctas_per_sm = 0);
// The same for a fused launch of `slices` 128-row slices in all; ctas_per_sm from fp8_small_ctas_per_sm(128 *
// slices, Tp).
int fp8_small_fused_splits(int64_t slices, int64_t K, int64_t Tp, int ctas_per_sm = 0);
cudaError_t launch_fp8_small_gemm(const Fp8SmallGemmParams& p, cudaStream_t stream);

// bf16 weights times f32 activations for few tokens, the narrow linears' two-term recipe (gemm.h: routers,
// indexer heads): out[t][n] = sum_k (hi[t][k] + lo[t][k]) w[n][k] with hi = bf16(x), lo = bf16(x - hi),
// fp32 accumulation, in one launch (the split is made from the f32 rows as they are staged). Weight-read
// bound like the FP8 kernel above: 128-row slices of W streamed once through mma.sync m16n8k16, K split
// over CTAs when the slices alone would not fill the GPU (partial sums added in a fixed order).
inline constexpr int64_t kBf16SmallMaxTokens = 32;
// One more weight of a fused bf16 small-T launch (Bf16SmallGemmParams::more).
struct Bf16SmallSegment {
  const uint16_t* w;  // [N, K] bf16, contiguous rows, 16-byte aligned
  float* out;         // [T, N] f32, row stride out_stride
  int64_t out_stride;
  int64_t N;
};
inline constexpr int kBf16SmallMaxMore = 3;
struct Bf16SmallGemmParams {
  const uint16_t* w;  // [N, K] bf16, contiguous rows (row 0 = output feature 0 of this call)
  const float* x;     // [T, K] f32, row stride x_stride (x 16-byte aligned, x_stride % 4 == 0)
  int64_t x_stride;
  float* out;  // [T, N] f32, row stride out_stride
  int64_t out_stride;
  int64_t T, N, K;     // T <= kBf16SmallMaxTokens, K % 64 == 0
  float* partial;      // [splits, T, N] f32 scratch (splits > 1)
  uint32_t* counters;  // [kFp8SmallCounters] zero on entry, left zero on exit (splits > 1)
  int splits;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
  // More weights on the same activations in this launch (linear_multi's narrow pair: the indexer's wk +
  // weights_proj), laid out as Fp8SmallGemmParams::more: their 128-row slices after this call's, one K split,
  // each weight's partial sums at splits * T * 128 * (the slices before it) (bf16_small_fused_scratch).
  Bf16SmallSegment more[kBf16SmallMaxMore] = {};
  int n_more = 0;
};
int bf16_small_gemm_splits(int64_t N, int64_t K);
// The K split of a fused launch of `slices` 128-row slices in all; its slices and scratch floats.
int bf16_small_fused_splits(int64_t slices, int64_t K);
int64_t bf16_small_slices(const Bf16SmallGemmParams& p);
int64_t bf16_small_fused_scratch(const Bf16SmallGemmParams& p);
cudaError_t launch_bf16_small_gemm(const Bf16SmallGemmParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
