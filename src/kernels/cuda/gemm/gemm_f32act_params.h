#pragma once
// bf16 weights times f32 activations for many tokens, the activations converted as they are staged (no
// conversion pass, no bf16 copy of them in memory): out[b][t][n] = sum_k x[b][t][k] W_b(n, k), f32 output,
// fp32 accumulation on tensor cores (mma.sync m16n8k16). Two uses by default:
// - the narrow bf16 linears' two-term recipe (gemm.h; `split`) for linear_multi's pair (the indexer's wk +
//   weights_proj): x = hi + lo with hi = bf16(x), lo = bf16(x - hi), both multiplied with the same weight
//   fragment: the arithmetic of the split pass + two cuBLASLt GEMMs it replaces, reading x once (f32)
//   instead of 3 times;
// - MLA's absorb_v (attention/ops_absorb.cpp): x rounded to bf16 (one term), a strided batch over the
//   heads reading W_UV[h] as [N][K]. The [K][N] layout (`trans_w`: absorb_q's W_UK[h]) and one narrow weight
//   alone are supported and tested but measured slower than cuBLASLt (kernel_options.h), so not taken.
// CTA tiles (tokens x outputs): 32 or 64 x 128 (8 warps; the split, or forced) and 128 x 256 (16 warps; the
// one-term product by default), K in blocks of 32 through a 4-stage cp.async pipeline. Up to
// kF32ActMaxSegments weights may share one launch (linear_multi's parts on the same input: their CTAs of a
// token tile run side by side, so x is read from memory once).
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

inline constexpr int kF32ActMaxSegments = 2;

struct F32ActSegment {
  const uint16_t* w;  // bf16 weight of batch b at w + b * w_bs: [N][K] with rows w_ld apart, or (trans_w)
                      // [K][N] with rows w_ld apart; 16-byte aligned, w_ld % 8 == 0
  int64_t w_ld;
  float* out;  // [T][N] f32 of batch b at out + b * out_bs, rows out_ld apart; 8-byte aligned, out_ld even
  int64_t out_ld;
  int64_t N;  // outputs (trans_w: N % 8 == 0)
};

struct F32ActGemmParams {
  const float* x;  // [batch][T][K] f32 at x + b * x_bs + t * x_ld + k; 16-byte aligned, x_ld % 4 == 0,
                   // x_bs % 4 == 0
  int64_t x_ld, x_bs;
  F32ActSegment seg[kF32ActMaxSegments];  // seg[0 .. segments)
  int segments;                           // 1 .. kF32ActMaxSegments; with batch > 1 only 1
  int64_t w_bs, out_bs;                   // batch strides (elements; w_bs % 8 == 0, out_bs even)
  int64_t T, K;                           // K % 32 == 0
  int batch;                              // >= 1 (heads)
  bool split;                             // two-term split of x (else x rounded to bf16)
  bool trans_w;                           // weights stored [K][N]
  int tile_tokens;                        // 32, 64 or 128 (one term only); 0: f32act_tile_tokens
  // Optional (absorb_v, for the FP8 o_proj that reads its output as [T, heads x N]): the output's FP8 copy
  // in the linears' recipe (gemm.h; bit for bit launch_quant_fp8 on the f32 output): codes u8 [q_rows, q_ld]
  // (output n of batch b in column b * q_bs + n), scales f32 [q_ld / 128, q_rows] (one per token and
  // 128-group); rows T .. q_rows - 1 get codes 0 and scale 1. Null: none. Needs one segment, no split, W
  // [N][K], the 128-token tile, N % 128 == 0, q_bs % 128 == 0, q_ld % 128 == 0 and T <= q_rows <= T rounded
  // up to 32.
  uint8_t* q_codes;
  float* q_scales;
  int64_t q_ld, q_bs, q_rows;
  bool pdl;  // a programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};

// The token tile a launch uses: tile_tokens when set; else the one-term product 128 (x 256 outputs), the
// split 64 (x 128) while that still fills 7/8 of a wave of CTAs, else 32.
int f32act_tile_tokens(const F32ActGemmParams& p);
// Whether the launcher takes these parameters (alignments, shapes above); launch_f32act_gemm returns
// cudaErrorInvalidValue and launches nothing when not.
bool f32act_gemm_supported(const F32ActGemmParams& p);
cudaError_t launch_f32act_gemm(const F32ActGemmParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
