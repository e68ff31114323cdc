#pragma once
// Plain parameters of the absorbed projections' activation conversion (absorb.cu): f32 rows rounded to
// bf16 (round to nearest even, as __float2bfloat16_rn) into a packed buffer the batched GEMM reads.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

struct CastBf16Params {
  const float* x;  // [rows, cols] f32, row stride x_stride (elements); 16-byte aligned, x_stride % 4 == 0
  uint16_t* out;   // [rows, cols] bf16 bits, contiguous, 8-byte aligned
  int64_t rows, cols, x_stride;  // cols % 4 == 0
  bool pdl = false;              // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
// Returns cudaErrorInvalidValue (launching nothing) when the alignment rules above do not hold.
cudaError_t launch_cast_bf16_x4(const CastBf16Params& p, cudaStream_t stream);

// The absorbed projections for few tokens (decode batches: T <= kAbsorbSmallMaxTokens), every head in one
// launch of a weight-streaming CUDA-core kernel (absorb_small.cu): bf16 weights times the f32 activations as
// they are (no conversion pass, no packed copy), f32 accumulation in a fixed order (deterministic).
//   rows form (absorb_q):  out[t][h][n] = sum_{k < K} x[t][h][k] W_h[k][n]   (W_h: [K, N], row stride w_ld)
//   cols form (absorb_v):  out[t][h][n] = sum_{k < K} x[t][h][k] W_h[n][k]   (W_h: [N, K], row stride w_ld)
// with W_h at w + h w_bs. Each CTA streams one head's slice of W once: 64 outputs (rows form) or 32
// (cols form) of one head.
inline constexpr int64_t kAbsorbSmallMaxTokens = 8;
inline constexpr int64_t kAbsorbSmallMaxK = 1024;     // rows form: the reduction length staged
inline constexpr int64_t kAbsorbSmallColsMaxK = 512;  // cols form: the row length a lane's registers hold
struct AbsorbSmallParams {
  const uint16_t* w;       // bf16 bits; 16-byte aligned, w_ld % 8 == 0, w_bs % 8 == 0
  int64_t w_ld, w_bs;      // elements
  const float* x;          // x[t][h][k] at x + t x_ts + h x_hs + k (any alignment)
  int64_t x_ts, x_hs;      // elements
  float* out;              // out[t][h][n] at out + t out_ts + h out_hs + n
  int64_t out_ts, out_hs;  // elements
  int64_t T, heads, K, N;  // 1 <= T <= kAbsorbSmallMaxTokens; rows form: K <= kAbsorbSmallMaxK, N % 8 == 0;
                           // cols form: K <= kAbsorbSmallColsMaxK, K % 8 == 0
  bool rows_form;          // true: absorb_q's form; false: absorb_v's
  bool pdl = false;        // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
// Whether p keeps the rules above (what launch_absorb_small checks before launching).
bool absorb_small_supported(const AbsorbSmallParams& p);
// Returns cudaErrorInvalidValue (launching nothing) when the rules above do not hold.
cudaError_t launch_absorb_small(const AbsorbSmallParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
