#pragma once
// Plain parameters of the MoE kernels (moe.cu).
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

// Router: s = sigmoid(logits); choice = s + bias; the topk_group groups with the best sum of their two
// best choices survive; top_k of the survivors by choice (ties: lower index); weights = s of the chosen,
// normalised (+1e-20) when asked, times scaling. One warp per token (four a block); experts <= 1024.
struct MoeRouteKernelParams {
  const float* logits;  // [tokens, experts] stride logits_stride
  const float* bias;    // [experts]
  int32_t* ids;         // [tokens, top_k]
  float* weights;       // [tokens, top_k]
  int64_t tokens, experts, logits_stride;
  int n_group, topk_group, top_k;
  bool norm_topk_prob;
  double scaling;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_moe_route(const MoeRouteKernelParams& p, cudaStream_t stream);

// out[t] = sum_k weights[t, k] * y[pos[t, k]] (the expert outputs packed by expert); pairs with pos < 0
// (dropped by the grouping) add nothing.
struct MoeCombineParams {
  const float* y;        // [tokens * top_k, cols] contiguous
  const int32_t* pos;    // [tokens, top_k] row of y holding expert k's output of token t, or -1
  const float* weights;  // [tokens, top_k]
  float* out;            // [tokens, cols] contiguous
  int64_t tokens, top_k, cols;
  const float* add = nullptr;  // [tokens, cols] contiguous or null: out = the weighted sum + add
  bool pdl = false;            // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

// Device-side grouping of the routing (moe_grouped.cu): the (token, expert) pairs packed by expert, pairs
// of one expert in pair order (token order), so packed row m of expert e lies in [offsets[e], offsets[e+1]).
// One block; its size depends on the number of experts only (experts <= 1024). A pair whose id lies
// outside [0, experts) is dropped (pos = -1: it adds nothing to its token), counted in header[1] and in a
// process-wide counter (moe_take_dropped_pairs): out-of-range ids never index memory.
struct MoeGroupParams {
  const int32_t* ids;  // [pairs] = [tokens, top_k] expert of pair i = (token i / top_k, slot i % top_k)
  int32_t* header;     // [4]: active experts, dropped pairs, one dropped id, 0
  int32_t* offsets;    // [experts + 1] exclusive prefix sum of counts
  int32_t* counts;     // [experts] pairs per expert
  int32_t* active;     // [experts] experts with pairs, ascending; the first header[0] are set
  int32_t* rows;       // [pairs] token of packed row m (the first offsets[experts] are set)
  int32_t* pos;        // [pairs] packed row of pair i, -1 when dropped
  int64_t pairs, top_k;
  int experts;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_moe_group(const MoeGroupParams& p, cudaStream_t stream);

// Pairs dropped by launch_moe_group since the last call (ids outside [0, experts)); resets the count.
// Synchronises the device: call it at a sync point (tests, end of a step), never while capturing.
cudaError_t moe_take_dropped_pairs(int64_t* count);

// One expert's weights as stored (device pointers): gate / up [inter, hidden], down [hidden, inter].
// FP8 weights carry f32 block scales [ceil(rows / block_n), ceil(cols / block_k)]; null otherwise.
struct MoeExpertWeights {
  const void* gate;
  const void* up;
  const void* down;
  const float* gate_scale;  // may be null (not fp8)
  const float* up_scale;    // may be null (not fp8)
  const float* down_scale;  // may be null (not fp8)
};

enum class MoeWeightType : int32_t { f32 = 0, bf16 = 1, fp8 = 2 };

// The grouped expert GEMMs for few rows per expert (decode). A persistent grid walks the work items
// (active expert slot, tile of output columns); slots >= header[0] are never visited, so experts without
// rows are never read. A warp owns a few output columns and streams their weight rows once per group of
// `group_rows` packed rows (16-byte loads along k, f32 accumulation, warp-shuffle reduction).
//   gate_up: act[m, n] = silu(x[rows[m]] . gate[e][n]) * (x[rows[m]] . up[e][n]),  n < inter
//   down:    y[m, n] = act[m] . down[e][n],                                          n < hidden
// Requires: the reduction width (hidden for gate_up, inter for down) a multiple of 16 / weight bytes,
// block_k a multiple of 16 (fp8), 16-byte aligned rows of `in` (in_stride % 4 == 0).
struct MoeExpertGemmParams {
  const MoeExpertWeights* table;  // [experts] device table
  const int32_t* header;          // [4] of the grouping (header[0] = active experts)
  const int32_t* offsets;         // [experts + 1]
  const int32_t* active;          // [experts]
  const int32_t* in_rows;         // [pairs] input row of packed row m (gate_up: tokens), or null (row m)
  const float* in;                // [*, n_in] row stride in_stride
  float* out;                     // [pairs, n_out] contiguous, packed by expert
  int64_t in_stride, n_in, n_out;
  int experts;
  int block_n, block_k;  // fp8 scale blocks
  MoeWeightType wtype;
  bool gate_up;      // true: gate and up with SiLU-mul (n_in = hidden, n_out = inter); false: down
  int group_rows;    // rows held in registers at once: 2, 4 or 8 (any count is correct; tunes speed)
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_moe_expert_gemm(const MoeExpertGemmParams& p, cudaStream_t stream);

// The grouped expert GEMMs on tensor cores for FP8 experts (sm90_moe_fp8.cu): the FP8 recipe of the dense
// linears (gemm.h: activations quantised per row per 128-group by launch_quant_fp8, e4m3 x e4m3 products
// summed in f32 per 128-wide K block, times the weight's 128x128 block scale and the row's group scale)
// over the device grouping's layout, one launch per matrix for every active expert.
//   gate_up: out[m, n] = silu(xq[in_rows[m]] . gate[e][n]) * (xq[in_rows[m]] . up[e][n]),  n < inter
//   down:    out[m, n] = xq[m] . down[e][n],                                                n < hidden
// A persistent grid walks the work items (active slot, feature tile: gate_up 64 features of gate and the
// same 64 of up, down 128 features); a CTA streams the item's 128 weight rows once per pass of
// `tile_rows` packed rows of its expert (the "swap AB" form: weights are the M operand of mma.sync
// m16n8k32, rows the N operand) through a cp.async pipeline; prefill-sized groups (tile_rows 128) take
// the wgmma form: a copying warpgroup and two multiplying ones, passes of up to 128 rows as m64nNk32 wgmmas
// (N 16..128 by the pass's rows), each 128-wide K block promoted into f32 with its scales. Slots >= header[0]
// are never visited: experts without rows are never read; the grid depends on the shapes only. Requires
// 128x128 weight blocks, K % 128 == 0, K <= kMoeFp8MaxK, 16-byte aligned weights and xq.
inline constexpr int64_t kMoeFp8MaxK = 16384;
inline constexpr int64_t kMoeFp8MaxTailRows = 32;
struct MoeFp8GemmParams {
  const MoeExpertWeights* table;  // [experts] device table (fp8 weights, f32 block scales)
  const int32_t* header;          // [4] of the grouping (header[0] = active experts)
  const int32_t* offsets;         // [experts + 1]
  const int32_t* active;          // [experts]
  const int32_t* in_rows;         // [pairs] row of xq holding packed row m's input (gate_up: its token),
                                  // or null (row m)
  const uint8_t* xq;              // [*, K] e4m3 codes, rows K bytes apart
  const float* x_scale;           // row r's scale of K block kb at x_scale[kb * x_scale_ld + r]
  int64_t x_scale_ld;
  float* out;  // [pairs, N] f32 contiguous, packed by expert
  int64_t N, K;
  int experts;
  bool gate_up;
  int tile_rows;  // packed rows per pass: 8 (mma.sync) or 128 (the wgmma form); either is correct at any
                  // size, it tunes speed
  // The wgmma form: a group's last pass takes up to this many rows past 128 (0 .. kMoeFp8MaxTailRows), as
  // a second wgmma on the same weight tile, so that a remainder of that many rows does not stream the
  // weights again (KernelOptions::moe_fp8_tail_rows); the same sums bit for bit, another speed.
  int tail_rows = int(kMoeFp8MaxTailRows);
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
// Mean rows per expert from which the launch takes the wgmma form (tile_rows 128). Measured on the H200
// (ops_gpu_bench moe, one GLM-5.3 layer, random top-8): T = 128 (4 rows per expert) mma.sync 2.55 ms
// against wgmma 2.65; T = 256 (8) 3.61 against 2.72; 16, 32 and 64 rows per mma.sync pass lost at every T.
inline constexpr int64_t kMoeFp8WgmmaMinMeanRows = 8;
// The tile_rows the launch takes for `pairs` rows over `experts` experts (shapes only): 128 (the wgmma form)
// from kMoeFp8WgmmaMinMeanRows mean rows per expert, else 8.
int moe_fp8_tile_rows(int64_t pairs, int64_t experts);
cudaError_t launch_moe_fp8_gemm(const MoeFp8GemmParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
