#pragma once
// Plain parameters of the row-wise kernels (norm.cu, elementwise.cu, rope.cu, quant.cu). Every launcher
// queues its kernel on `stream` and returns the launch status; the host wrappers (ops_*.cpp) validate
// shapes first. "Row views" are [rows, cols] with a contiguous last dimension and a row stride in elements.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

// out = rms_norm(residual += x) or rms_norm(x): statistics in fp64 like the CPU reference.
struct RmsNormParams {
  const float* x;      // [rows, cols] stride x_stride; not null
  float* residual;     // [rows, cols] stride res_stride; null: plain rms_norm of x
  const void* weight;  // [cols] bf16 (weight_bf16) or f32
  float* out;          // [rows, cols] contiguous
  int64_t rows, cols, x_stride, res_stride;
  bool weight_bf16;
  double eps;
  // Optional FP8 copy of `out` in the GEMM recipe's activation format (launch_quant_fp8's codes and scales,
  // bit for bit): q_codes [q_rows_pad, cols] e4m3, q_scales [cols / 128, q_rows_pad]; rows >= `rows` are
  // padding (codes 0, scale 1). Needs rms_norm_fp8_fusable(); null q_codes: no copy.
  uint8_t* q_codes;
  float* q_scales;
  int64_t q_rows_pad;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
  // Tests: one CTA a row at any row count (the cluster kernel's twin; rms_norm_cluster_ctas).
  bool one_cta_per_row = false;
};
// Whether launch_rms_norm can also write the FP8 copy of these rows (the vectorised path, cols % 128 == 0).
bool rms_norm_fp8_fusable(const RmsNormParams& p);
// The vectorised path's CTAs a row: rows of at least kRmsNormClusterMinCols columns, up to
// kRmsNormClusterMaxRows of them (a decode step's), are split over a cluster of 8, 4 or 2 CTAs (at least 768
// columns each, cols a multiple of 128 x that), else 1. Measured on an H100 (ops_gpu_bench norm, add + norm +
// FP8 copy, one CTA / cluster us): 6,144 columns 4.81 / 3.24 at 1 row, 4.89 / 3.32 at 8, 5.05 / 4.24 at 32,
// 5.13 / 5.00 at 64 (the plain norm 4.43 / 5.02 at 64); 2,048 columns over 4 CTAs 2.51 / 2.87 at 1 row, 2.84
// / 3.69 at 64 (a narrow row is no slower on one CTA than a launch's floor).
inline constexpr int64_t kRmsNormClusterMaxRows = 32;
inline constexpr int64_t kRmsNormClusterMinCols = 4096;
int rms_norm_cluster_ctas(int64_t rows, int64_t cols);
cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

// out = (x - mean) / sqrt(var + eps) * w + b (biased variance, fp64 statistics).
struct LayerNormParams {
  const float* x;  // [rows, cols] stride x_stride
  const void* w;   // [cols] bf16 | f32 (w_bf16)
  const void* b;   // [cols] bf16 | f32 (b_bf16)
  float* out;      // [rows, cols] contiguous
  int64_t rows, cols, x_stride;
  bool w_bf16, b_bf16;
  double eps;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_layer_norm(const LayerNormParams& p, cudaStream_t stream);

// out[t] = table[ids[t]] as f32.
struct EmbeddingParams {
  const void* table;   // [vocab, cols] bf16 | f32 (table_bf16), contiguous
  const int32_t* ids;  // [rows], each in [0, vocab) (checked by the host)
  float* out;          // [rows, cols] contiguous
  int64_t rows, cols;
  bool table_bf16;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_embedding(const EmbeddingParams& p, cudaStream_t stream);

// out = silu(gate) * up.
struct SiluMulParams {
  const float* gate;  // [rows, cols] stride gate_stride
  const float* up;    // [rows, cols] stride up_stride
  float* out;         // [rows, cols] stride out_stride
  int64_t rows, cols, gate_stride, up_stride, out_stride;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_silu_mul(const SiluMulParams& p, cudaStream_t stream);

// dst = src (op copy), dst += src (op add), with dtype casts between f32 and bf16 (cast rows).
enum class RowOp : int { copy, add };
struct RowsParams {
  const void* src;  // [rows, cols] stride src_stride, f32 or bf16 (src_bf16)
  void* dst;        // [rows, cols] stride dst_stride, f32 or bf16 (dst_bf16); add needs f32 both
  int64_t rows, cols, src_stride, dst_stride;
  bool src_bf16, dst_bf16;
  RowOp op;
  // Optional row indirection: src row i = src_rows[i] (gather) and/or dst row i = dst_rows[i] (scatter).
  const int32_t* src_rows;  // [rows] or null
  const int32_t* dst_rows;  // [rows] or null
  // Optional paged source: src row i = page_table[i / page_size] * page_size + i % page_size.
  const int32_t* page_table;  // [ceil(rows / page_size)] or null
  int64_t page_size;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_rows(const RowsParams& p, cudaStream_t stream);

// out[r] = index of the first maximum of x[r].
struct ArgmaxParams {
  const float* x;  // [rows, cols] stride x_stride
  int32_t* out;    // [rows]
  int64_t rows, cols, x_stride;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_argmax(const ArgmaxParams& p, cudaStream_t stream);

// Rotary embedding in place on x [tokens, heads, dim] (strides s0, s1; the last dimension contiguous).
struct RopeKernelParams {
  float* x;
  const int32_t* positions;  // [tokens]
  const float* inv_freq;     // [dim / 2] f32 (kernels::rope_inv_freq)
  int64_t tokens, heads, dim, s0, s1;
  bool interleaved;
  double attention_factor;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_rope(const RopeKernelParams& p, cudaStream_t stream);

// FP8 activation quantisation per token per 128-group: scale = amax / 448, q = e4m3(x / scale) saturated.
// Rows rows..rows_pad-1 are padding (q = 0, scale = 1).
struct QuantFp8Params {
  const float* x;  // [rows, cols] stride x_stride; cols % 128 == 0
  uint8_t* q;      // [rows_pad, cols] e4m3 codes, contiguous
  float* scales;   // [cols / 128, rows_pad] (token index fastest: cuBLASLt VEC128_32F)
  int64_t rows, rows_pad, cols, x_stride;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_quant_fp8(const QuantFp8Params& p, cudaStream_t stream);

// W (fp8 e4m3 with block scales) -> bf16 or f32: out[r][c] = code(w[r][c]) * scale_inv[r / bn][c / bk].
struct DequantFp8Params {
  const uint8_t* w;        // [rows, cols] contiguous
  const float* scale_inv;  // [ceil(rows / bn), ceil(cols / bk)]
  void* out;               // [rows, cols] bf16 bits, or f32 when out_f32
  int64_t rows, cols, bn, bk;
  bool out_f32;
};
cudaError_t launch_dequant_fp8(const DequantFp8Params& p, cudaStream_t stream);

// Pads fp8 block scales for cuBLASLt BLK128x128_32F: out [nb][ld] from in [nb][kb], ld = round_up(kb, 4).
struct PadScalesParams {
  const float* in;  // [nb, kb]
  float* out;       // [nb, ld] (padding = 1)
  int64_t nb, kb, ld;
};
cudaError_t launch_pad_scales(const PadScalesParams& p, cudaStream_t stream);

// Two-term bf16 split of f32 activations: hi = bf16(x), lo = bf16(x - hi) (x ~ hi + lo to ~2^-17).
struct SplitBf16Params {
  const float* x;  // [rows, cols] stride x_stride
  uint16_t* hi;    // [rows, cols] bf16 bits, contiguous
  uint16_t* lo;    // [rows, cols] bf16 bits, contiguous
  int64_t rows, cols, x_stride;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_split_bf16(const SplitBf16Params& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
