#pragma once
// Linear layers on the GPU through cuBLASLt, fp32 accumulation, f32 outputs.
//
// - bf16 weights: the f32 activations are rounded to bf16 and multiplied in one bf16 GEMM. Narrow outputs
//   (<= kSplitMaxRows features: routers, indexer heads, whose results feed top-k choices) use a two-term
//   bf16 split of the activations (x ~ hi + lo, two GEMMs accumulating in f32), ~16 mantissa bits; up to
//   kBf16SmallMaxTokens tokens both terms run in one weight-streaming tensor-core launch instead
//   (gemm_small_params.h; router_gate [256 x 6144] at T = 1: 35.7 -> 8.2 us, eager, op_table_gpu_bench).
//   From KernelOptions::gemm_split_fused_min_tokens tokens (default 4,096) linear_multi's pair of such
//   weights (the indexer's wk + weights_proj) has its two terms made in registers as the f32 rows are
//   staged and multiplied in one launch (gemm_f32act_params.h) instead of a split pass and two GEMMs per
//   weight (which read and write the activations three times over); one such weight alone (router_gate)
//   keeps the split pass + cuBLASLt, measured faster (kernel_options.h).
// - FP8 weights with 128x128 block scales: the activations are quantised per token per 128-group
//   (e4m3, scale = amax / 448) and multiplied with cuBLASLt's block-scaled FP8 GEMM (docs/GPU.md recipe:
//   A = W with BLK128x128 scales padded to rows of a multiple of 4, B = X with VEC128 scales [K/128][T],
//   D f32 where cuBLASLt has an algorithm for it, else bf16 widened to f32). Up to
//   KernelOptions::gemm_fp8_small_max_tokens tokens (default 8: small decode batches) the same arithmetic
//   runs in a weight-streaming tensor-core kernel instead (gemm_small_params.h; f32 output). Shapes outside
//   the recipe (K % 128, row slices not on a 128 boundary, other block sizes) and linear_t use the weight
//   dequantised to bf16 (its derived copy: derive_gemm_weight below).
// - f32 weights: an f32 GEMM (no TF32).
// Heuristics are looked up once per (kind, shape, leading dimensions, alignment) and cached; products
// of >= 2e10 FLOPs time the heuristic's best 8 algorithms on their first call and keep the fastest.
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "kernels/kernel_options.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

inline constexpr int64_t kSplitMaxRows = 512;

// `o` (the backend's KernelOptions) carries the two GEMM choices: o.gemm, fast (the recipes above) or fp32
// (every weight is multiplied as f32, its derived f32 copy, with f32 activations:
// a reference-precision mode for accuracy checks, the GPU forward then following the CPU reference
// closely, at several times the memory and time); o.gemm_fp8_small_max_tokens, the small-T FP8 limit.

// out [T, r1 - r0] = x [T, K] @ W[r0:r1]^T. `out` is an f32 CUDA row view.
void gemm_linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                 const KernelOptions& o = {});
// gemm_linear(x, W_i) for each weight into new tensors [T, W_i rows], with one activation quantisation
// shared by the FP8 ones (same results as separate calls).
// `q`: x's FP8 copy (rows and Tp as fp8_act_rows) from its producer, used instead of quantising x.
std::vector<Tensor> gemm_linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                      const Fp8Act* q = nullptr, const KernelOptions& o = {});
// out [T, C] = x [T, r1 - r0] @ W[r0:r1] (W [rows, C]).
void gemm_linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                   const KernelOptions& o = {});

// The FP8 recipe split in its two steps (benchmarks time them apart; producers can share one
// quantisation between several linears): the activations quantised per token per 128-group, and the
// block-scaled GEMM on them (the same result as gemm_linear on the f32 rows).
// (Fp8Act, kernels/ops.h: codes u8 [Tp, K] e4m3, rows >= `rows` zero; scales f32 [K / 128, Tp].)
// The padded row count Tp the recipe uses for T tokens (8/16/32 on the small-T path, i.e. T <=
// small_max_tokens: KernelOptions::gemm_fp8_small_max_tokens; else T rounded up to 4).
int64_t fp8_act_rows(int64_t T, int64_t small_max_tokens);
// Uninitialised CUDA buffers of an Fp8Act for T tokens of K columns (K % 128 == 0) padded to Tp rows
// (fp8_act_rows): what a producer writing the copy fills.
Fp8Act empty_fp8_act(int64_t T, int64_t Tp, int64_t K);
Fp8Act quantize_fp8_activations(const Tensor& x, const KernelOptions& o = {});
void gemm_linear_fp8(const Fp8Act& a, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                     const KernelOptions& o = {});

struct GemmStats {
  int64_t plans = 0;            // cached cuBLASLt heuristics
  int64_t tuned_plans = 0;      // plans whose algorithm was picked by timing the heuristic's candidates
  int64_t fp8_calls = 0;        // block-scaled FP8 GEMMs through cuBLASLt
  int64_t fp8_small_calls = 0;  // block-scaled FP8 GEMMs through the small-T kernel (a fused launch once)
  int64_t fp8_small_fused_calls = 0;  // of them, launches for several of linear_multi's parts
  int64_t bf16_calls = 0;             // bf16 GEMMs through cuBLASLt (split ones count once)
  int64_t bf16_small_calls = 0;  // narrow (split) bf16 GEMMs through the small-T kernel (a fused launch once)
  int64_t bf16_small_fused_calls = 0;  // of them, launches for several of linear_multi's parts
  int64_t bf16_fused_calls = 0;        // narrow (split) bf16 launches of the fused large-T kernel (one per
                                       // linear_multi pair)
  int64_t f32_calls = 0;               // f32 GEMMs
  int64_t dequantised = 0;             // FP8 weights dequantised to bf16 (derived at load, or per call)
  int64_t failed_plans = 0;            // shapes cuBLASLt had no algorithm for (fallback path)
  std::string last_failure;            // the last of them, described
};
GemmStats gemm_stats();

// The forms of `w` that the linears above and the absorbed projections (cuda_ops.h absorb_q_batched) read
// with options `o` (kernels/ops.h DerivedWeight), made now on the compute stream: what
// CudaBackend::derive_weight returns, called for each weight at model load. Numbers as without them:
// - GemmPrecision::fp32: the f32 copy of a bf16 or FP8 weight (every product of it multiplies that);
// - fast, FP8: the padded block scales where the FP8 recipe takes the whole weight, the bf16 copy where it
//   does not and for kv_b (WeightUse::absorb: the absorbed projections, linear_t); a routed expert that
//   the grouped FP8 kernels take (moe_experts) needs neither.
// Null where nothing applies (bf16 / f32 weights in fast mode) or `w` is not a contiguous 2-D CUDA weight.
// A weight without its derived forms still works: each call then makes what it needs (slower).
std::shared_ptr<const DerivedWeight> derive_gemm_weight(const WeightRef& w, WeightUse use,
                                                        const KernelOptions& o);
// The weight as f32: an f32 weight itself, else its derived f32 copy (w.derived), else a new copy made
// for the caller: the one GemmPrecision::fp32 multiplies, shared with the batched absorb projections.
Tensor gemm_weight_f32(const WeightRef& w);

}  // namespace dsaserve::kernels::cuda
