// Host wrapper of silu_mul_fp8 (silu_fp8_params.h): SiLU-mul writing its output's FP8 copy for the down
// projection, or plain silu_mul (no copy) where the kernel's shapes or the options do not allow it.
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise/silu_fp8_params.h"
#include "kernels/cuda/gemm/gemm.h"

namespace dsaserve::kernels::cuda {

Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q, const KernelOptions& o) {
  q = Fp8Act{};
  const RowView g = rows_f32(gate, "silu_mul gate");
  const RowView u = rows_f32(up, "silu_mul up");
  DSA_CHECK(g.rows == u.rows && g.cols == u.cols, "silu_mul: gate {} and up {} differ", gate.describe(),
            up.describe());
  if (!o.silu_mul_fp8_copy || o.gemm != GemmPrecision::fast || g.cols % 128 != 0 || g.rows == 0)
    return silu_mul(gate, up, o);
  Tensor out = Tensor::empty({g.rows, g.cols}, DType::f32, Device::cuda);
  const int64_t Tp = fp8_act_rows(g.rows, o.gemm_fp8_small_max_tokens);
  Fp8Act copy = empty_fp8_act(g.rows, Tp, g.cols);
  SiluMulFp8Params p{};
  p.gate = g.p;
  p.up = u.p;
  p.out = out.data<float>();
  p.q_codes = copy.codes.data_u8();
  p.q_scales = copy.scales.data<float>();
  p.rows = g.rows;
  p.rows_pad = Tp;
  p.cols = g.cols;
  p.gate_stride = g.stride;
  p.up_stride = u.stride;
  p.out_stride = g.cols;
  p.pdl = o.pdl;
  if (!silu_mul_fp8_supported(p)) return silu_mul(gate, up, o);
  check_launch(launch_silu_mul_fp8(p, op_stream()), "silu_mul_fp8");
  q = std::move(copy);
  return out;
}

}  // namespace dsaserve::kernels::cuda
