#pragma once
// SiLU-mul with the FP8 copy of its output (silu_fp8.cu): out = silu(gate) * up (the silu_mul kernels'
// arithmetic, bit for bit), and its quantisation in the linears' FP8 recipe (kernels/cuda/gemm/gemm.h: per
// token per 128-group, e4m3, scale amax / 448; bit for bit launch_quant_fp8 on `out`) for the down
// projection that reads it. One warp per (row, 128-group), four values per lane.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

struct SiluMulFp8Params {
  const float* gate;             // [rows, cols] row stride gate_stride; 16-byte aligned, gate_stride % 4 == 0
  const float* up;               // [rows, cols] row stride up_stride; 16-byte aligned, up_stride % 4 == 0
  float* out;                    // [rows, cols] row stride out_stride; 16-byte aligned, out_stride % 4 == 0
  uint8_t* q_codes;              // [rows_pad, cols] e4m3 codes (rows [rows, rows_pad): 0), contiguous
  float* q_scales;               // [cols / 128, rows_pad] (rows [rows, rows_pad): 1)
  int64_t rows, rows_pad, cols;  // cols % 128 == 0, rows_pad >= rows
  int64_t gate_stride, up_stride, out_stride;
  bool pdl = false;  // a programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
// Whether launch_silu_mul_fp8 takes p (the alignments above); it returns cudaErrorInvalidValue otherwise.
bool silu_mul_fp8_supported(const SiluMulFp8Params& p);
cudaError_t launch_silu_mul_fp8(const SiluMulFp8Params& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
