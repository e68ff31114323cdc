// The CPU emulation of the CUDA backend's FP8 activation arithmetic (kernels/cpu/cpu_ops.h Fp8Emulation,
// run by kernels::make_fp8_emulation_backend): the quantisation rule of kernels/cuda/elementwise/quant.cu on
// edge cases (zeros, an amax that e4m3 represents exactly, saturation, e4m3 subnormals, an f32-subnormal amax
// whose scale underflows), the scale granularities, and linear through the emulating backend (which rows
// it applies to, the select predicate, bf16 output) while the plain CPU backend stays the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::randn;
using testing::random_weight;

// linear through the emulating backend.
Tensor emu_linear(const cpu::Fp8Emulation& e, const Tensor& x, const WeightRef& w, int64_t r0 = 0,
                  int64_t r1 = -1, Tensor out = {}) {
  return Ops(make_fp8_emulation_backend(e).get()).linear(x, w, r0, r1, std::move(out));
}

cpu::Fp8Emulation on(bool bf16_output = false) {
  cpu::Fp8Emulation e;
  e.enabled = true;
  e.bf16_output = bf16_output;
  return e;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

TEST(Fp8Emulation, ScaleRule) {
  EXPECT_EQ(cpu::fp8_act_scale(0.0f), 1.0f);  // an all-zero group
  EXPECT_EQ(cpu::fp8_act_scale(448.0f), 1.0f);
  EXPECT_EQ(cpu::fp8_act_scale(56.0f), 0.125f);
  EXPECT_EQ(cpu::fp8_act_scale(3.7f), 3.7f / 448.0f);  // fp32 division, as the kernel's m / 448.0f
  // An f32-subnormal amax below 448 * 2^-150: amax / 448 underflows, so the scale is 1 (not 0, which
  // would turn the group's zeros into 0 / 0 = NaN).
  EXPECT_EQ(cpu::fp8_act_scale(1e-44f), 1.0f);
  EXPECT_GT(cpu::fp8_act_scale(1e-40f), 0.0f);
}

TEST(Fp8Emulation, QuantizeEdgeCases) {
  uint8_t q[1];
  auto code = [&](float x, float s) {
    cpu::fp8_quantize(&x, 1, s, q);
    return q[0];
  };
  EXPECT_EQ(code(0.0f, 1.0f), 0x00);
  EXPECT_EQ(code(-0.0f, 1.0f), 0x80);
  EXPECT_EQ(code(448.0f, 1.0f), 0x7e);  // the largest finite e4m3
  EXPECT_EQ(code(-448.0f, 1.0f), 0xfe);
  // Saturation (__NV_SATFINITE): beyond 448 stays 448, where torch's plain cast would give NaN.
  EXPECT_EQ(code(470.0f, 1.0f), 0x7e);
  EXPECT_EQ(code(1000.0f, 1.0f), 0x7e);
  EXPECT_EQ(code(-1e30f, 1.0f), 0xfe);
  EXPECT_EQ(code(std::numeric_limits<float>::infinity(), 1.0f), 0x7e);
  EXPECT_EQ(code(std::numeric_limits<float>::quiet_NaN(), 1.0f) & 0x7f, 0x7f);
  // Round to nearest even between 256 (0x78) and 288 (0x79): 272 is the tie.
  EXPECT_EQ(code(272.0f, 1.0f), 0x78);
  EXPECT_EQ(code(272.5f, 1.0f), 0x79);
  // e4m3 subnormals: multiples of 2^-9 below 2^-6.
  EXPECT_EQ(code(std::ldexp(1.0f, -9), 1.0f), 0x01);
  EXPECT_EQ(code(std::ldexp(1.0f, -10), 1.0f), 0x00);   // the tie 0.5 ulp rounds to even (0)
  EXPECT_EQ(code(std::ldexp(3.0f, -10), 1.0f), 0x02);   // 1.5 ulp: to even (2)
  EXPECT_EQ(code(std::ldexp(7.0f, -9), 1.0f), 0x07);    // the largest subnormal
  EXPECT_EQ(code(std::ldexp(15.0f, -10), 1.0f), 0x08);  // rounds up into the smallest normal 2^-6
  EXPECT_EQ(code(std::ldexp(1.0f, -12), 1.0f), 0x00);   // underflow to zero
  EXPECT_EQ(code(-std::ldexp(5.0f, -9), 1.0f), 0x85);
  // The division is by s (not a multiplication by 1 / s): x / s rounds once in fp32.
  EXPECT_EQ(code(3.7f, 3.7f / 448.0f), f32_to_f8e4m3fn_sat(3.7f / (3.7f / 448.0f)));
}

TEST(Fp8Emulation, QuantDequantGroups) {
  // Row 0: zeros in group 0; group 1 holds exactly representable values with amax 56 (s = 1/8).
  // Row 1: a group whose amax is an f32 subnormal (amax / 448 underflows: scale 1, everything
  // quantises to 0, no NaN); then a group with one large value that sends the small ones to e4m3
  // subnormals or zero.
  Tensor x = Tensor::zeros({2, 256}, DType::f32);
  float* p = x.data<float>();
  p[128] = 56.0f;
  p[129] = -28.0f;
  p[130] = 0.125f * 0.875f;                // 7/8 * 2^-3: code 0x2e... times 1/8, exact
  p[131] = 0.125f * std::ldexp(3.0f, -9);  // an e4m3 subnormal times s
  p[256 + 0] = 1e-44f;
  p[256 + 128] = 448.0f * 1024.0f;
  p[256 + 129] = 1.0f;  // 1 / 1024 in e4m3 units: subnormal 2^-10 -> ties to 0
  p[256 + 130] = 3.0f;  // 3 * 2^-10 -> 2^-8
  const Tensor y = cpu::fp8_quant_dequant(x);
  const float* o = y.data<float>();
  for (int i = 0; i < 128; ++i) EXPECT_EQ(o[i], 0.0f) << i;
  EXPECT_EQ(o[128], 56.0f);
  EXPECT_EQ(o[129], -28.0f);
  EXPECT_EQ(o[130], p[130]);
  EXPECT_EQ(o[131], p[131]);
  for (int i = 132; i < 256; ++i) EXPECT_EQ(o[i], 0.0f) << i;
  for (int i = 0; i < 128; ++i) EXPECT_EQ(o[256 + i], 0.0f) << "group with an underflowing scale, col " << i;
  EXPECT_EQ(o[256 + 128], 448.0f * 1024.0f);
  EXPECT_EQ(o[256 + 129], 0.0f);
  EXPECT_EQ(o[256 + 130], 4.0f);
  // Random groups: the largest magnitude comes back exactly (it maps to +-448); every value within half
  // an e4m3 step (2^-4 relative for normals, 2^-10 * s absolute for subnormals).
  std::mt19937 rng(3);
  const Tensor r = randn({5, 384}, rng);
  const Tensor rq = cpu::fp8_quant_dequant(r);
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t g = 0; g < 3; ++g) {
      const float* in = r.data<float>() + t * 384 + g * 128;
      const float* out = rq.data<float>() + t * 384 + g * 128;
      int64_t arg = 0;
      for (int64_t i = 1; i < 128; ++i)
        if (std::fabs(in[i]) > std::fabs(in[arg])) arg = i;
      const float s = cpu::fp8_act_scale(std::fabs(in[arg]));
      EXPECT_EQ(out[arg], in[arg]) << "row " << t << " group " << g;
      for (int64_t i = 0; i < 128; ++i) {
        EXPECT_LE(std::fabs(in[i] - out[i]), std::max(std::fabs(in[i]) / 16.0f, s / 1024.0f) * 1.0001f)
            << "row " << t << " group " << g << " col " << i;
      }
    }
  }
}

TEST(Fp8Emulation, ScaleGranularities) {
  // Row 0: a group near 1000 and one near 0.01; row 1: values near 0.5. Per group, the small group keeps
  // e4m3's relative precision; per token it shares the large group's scale and drops to coarse e4m3
  // subnormals; per tensor, row 1 uses row 0's scale too.
  Tensor x = Tensor::empty({2, 256}, DType::f32);
  float* p = x.data<float>();
  for (int i = 0; i < 256; ++i) {
    p[i] = (i < 128 ? 1000.0f : 0.01f) * (1.0f + float(i % 7) / 8.0f);  // row 0 amax 1750
    p[256 + i] = 0.5f * (1.0f + float(i % 5) / 8.0f);                   // row 1 amax 0.75
  }
  const Tensor g = cpu::fp8_quant_dequant(x, cpu::Fp8ActScale::group128);
  const Tensor t = cpu::fp8_quant_dequant(x, cpu::Fp8ActScale::token);
  const Tensor a = cpu::fp8_quant_dequant(x, cpu::Fp8ActScale::tensor);
  auto q = [](float v, float s) { return f8e4m3fn_to_f32(f32_to_f8e4m3fn_sat(v / s)) * s; };
  const float s_small = cpu::fp8_act_scale(0.01f * 1.75f), s_row0 = cpu::fp8_act_scale(1750.0f),
              s_row1 = cpu::fp8_act_scale(0.75f);
  double worst_group = 0, worst_token = 0;
  for (int i = 128; i < 256; ++i) {
    EXPECT_EQ(g.data<float>()[i], q(p[i], s_small)) << i;
    EXPECT_EQ(t.data<float>()[i], q(p[i], s_row0)) << i;
    worst_group = std::max(worst_group, double(std::fabs(g.data<float>()[i] - p[i]) / p[i]));
    worst_token = std::max(worst_token, double(std::fabs(t.data<float>()[i] - p[i]) / p[i]));
  }
  EXPECT_LE(worst_group, 1.0 / 16.0);
  EXPECT_GT(worst_token, 0.2);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(t.data<float>()[256 + i], q(p[256 + i], s_row1)) << i;
    EXPECT_EQ(a.data<float>()[256 + i], q(p[256 + i], s_row0)) << i;
    EXPECT_EQ(a.data<float>()[i], t.data<float>()[i]) << i;  // row 0 holds the tensor's amax
  }
  EXPECT_THROW(cpu::fp8_quant_dequant(Tensor::zeros({1, 100}, DType::f32)), Error);
  EXPECT_NO_THROW(cpu::fp8_quant_dequant(Tensor::zeros({1, 100}, DType::f32), cpu::Fp8ActScale::token));
}

TEST(Fp8Emulation, EligibleRowsFollowTheGpuRule) {
  std::mt19937 rng(5);
  const auto w = random_weight(1792, 512, DType::f8e4m3fn, rng);
  EXPECT_TRUE(cpu::fp8_gemm_eligible(w.ref, 0, -1));
  EXPECT_TRUE(cpu::fp8_gemm_eligible(w.ref, 640, 896));   // MLA's W_UV of head 1 (448 * 1 + 192)
  EXPECT_FALSE(cpu::fp8_gemm_eligible(w.ref, 192, 448));  // head 0: r0 not a multiple of 128
  EXPECT_FALSE(cpu::fp8_gemm_eligible(w.ref, 0, 100));    // rows not a multiple of 8
  const auto bf = random_weight(256, 512, DType::bf16, rng);
  EXPECT_FALSE(cpu::fp8_gemm_eligible(bf.ref, 0, -1));
  const auto odd = random_weight(256, 200, DType::f8e4m3fn, rng);
  EXPECT_FALSE(cpu::fp8_gemm_eligible(odd.ref, 0, -1));  // in features not whole groups
}

TEST(Fp8Emulation, LinearUsesTheQuantisedInput) {
  std::mt19937 rng(7);
  const auto w = random_weight(384, 256, DType::f8e4m3fn, rng);
  const Tensor x = randn({9, 256}, rng);
  const Tensor plain = linear(x, w.ref);
  const Tensor emu = emu_linear(on(false), x, w.ref);
  // The emulation is the plain fp32 product of the quantised input.
  EXPECT_TRUE(same_bits(emu, linear(cpu::fp8_quant_dequant(x), w.ref)));
  EXPECT_FALSE(same_bits(emu, plain));
  // The plain backend after it: bit-identical to before; a disabled emulation is the plain product.
  EXPECT_TRUE(same_bits(linear(x, w.ref), plain));
  EXPECT_TRUE(same_bits(emu_linear({}, x, w.ref), plain));
  // bf16 output: the product rounded to bf16.
  const Tensor emu16 = emu_linear(on(true), x, w.ref);
  const std::vector<float> a = emu.to_f32_vector(), b = emu16.to_f32_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(a[i]))) << i;
  // Fp8ActScale::none: the input is not quantised, only the product rounded (the study's baseline).
  cpu::Fp8Emulation none = on(true);
  none.scale = cpu::Fp8ActScale::none;
  const std::vector<float> r16 = emu_linear(none, x, w.ref).to_f32_vector(), pl = plain.to_f32_vector();
  for (size_t i = 0; i < pl.size(); ++i) EXPECT_EQ(r16[i], bf16_to_f32(f32_to_bf16(pl[i]))) << i;
  EXPECT_THROW(cpu::fp8_quant_dequant(x, cpu::Fp8ActScale::none), Error);
  // A row range the GPU runs dequantised (r0 % 128 != 0) is not quantised, even into a strided view.
  Tensor wide = Tensor::zeros({9, 400}, DType::f32);
  Tensor view = wide.slice(1, 10, 10 + 200);
  emu_linear(on(true), x, w.ref, 64, 264, view);
  EXPECT_TRUE(same_bits(view, linear(x, w.ref, 64, 264)));
  // select restricts the emulation to chosen weights.
  cpu::Fp8Emulation sel = on(false);
  sel.select = [](const WeightRef&) { return false; };
  EXPECT_TRUE(same_bits(emu_linear(sel, x, w.ref), plain));
  // A strided input view is read like a contiguous one.
  Tensor xw = Tensor::zeros({9, 300}, DType::f32);
  Tensor xv = xw.slice(1, 20, 276);
  copy_rows(xv, x);
  EXPECT_TRUE(same_bits(emu_linear(on(false), xv, w.ref), emu));
}

}  // namespace
}  // namespace dsaserve::kernels
