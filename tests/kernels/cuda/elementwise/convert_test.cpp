// CUDA dtype conversions against the CPU reference (core/dtype.h): every 8- and 16-bit code decoded,
// and every rounding boundary encoded, bit for bit. Skips without a GPU.
#include "kernels/cuda/elementwise/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/tensor.h"
#include "gpu_test.h"
#include "kernels/cuda/common/runtime.h"

namespace dsaserve::kernels::cuda {
namespace {

class CudaConvert : public testing::GpuTest {};

Tensor gpu_convert(const Tensor& cpu_src, DType to, bool saturate = false) {
  Tensor src = cpu_src.to(Device::cuda);
  Tensor dst = Tensor::empty(cpu_src.shape(), to, Device::cuda);
  convert(src, dst, saturate);
  return dst.to(Device::cpu);
}

// Inputs: every code of each small type decoded to f32, their midpoints and one ulp around them,
// plus random floats over the whole exponent range and the specials.
std::vector<float> probe_values() {
  std::vector<float> v;
  for (uint32_t c = 0; c < 65536; ++c) {
    const float a = bf16_to_f32(uint16_t(c)), b = f16_to_f32(uint16_t(c));
    for (float x : {a, b}) {
      v.push_back(x);
      v.push_back(std::nextafter(x, INFINITY));
      v.push_back(std::nextafter(x, -INFINITY));
    }
  }
  for (uint32_t c = 0; c < 256; ++c) {
    for (float x : {f8e4m3fn_to_f32(uint8_t(c)), f8e5m2_to_f32(uint8_t(c))}) {
      if (!std::isfinite(x)) continue;
      for (uint32_t d = 0; d < 256; ++d) {  // midpoints with every neighbour candidate
        const float y = f8e4m3fn_to_f32(uint8_t(d));
        if (std::isfinite(y)) v.push_back(float((double(x) + double(y)) / 2));
      }
    }
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) v.push_back(bits_f32(rng()));
  for (float x :
       {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65520.0f}) {
    v.push_back(x);
  }
  return v;
}

TEST_F(CudaConvert, F32ToEveryTypeMatchesCpu) {
  const std::vector<float> v = probe_values();
  const Tensor src = Tensor::from_vector(v, {int64_t(v.size())});
  for (DType to : {DType::bf16, DType::f16, DType::f8e4m3fn, DType::f8e5m2}) {
    for (bool sat : {false, true}) {
      if (sat && to != DType::f8e4m3fn) continue;
      const Tensor got = gpu_convert(src, to, sat);
      int64_t bad = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        uint32_t want, have;
        if (dtype_size(to) == 2) {
          want = to == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
          have = got.data_u16()[i];
        } else {
          want = to == DType::f8e5m2 ? f32_to_f8e5m2(v[i])
                 : sat               ? f32_to_f8e4m3fn_sat(v[i])
                                     : f32_to_f8e4m3fn(v[i]);
          have = got.data_u8()[i];
        }
        if (want != have && bad++ < 10) {
          ADD_FAILURE() << dtype_name(to) << (sat ? " sat" : "") << " x=" << v[i] << " want " << want
                        << " got " << have;
        }
      }
      EXPECT_EQ(bad, 0) << dtype_name(to);
    }
  }
}

TEST_F(CudaConvert, EveryCodeDecodesLikeCpu) {
  for (DType from : {DType::bf16, DType::f16, DType::f8e4m3fn, DType::f8e5m2}) {
    const int64_t n = dtype_size(from) == 2 ? 65536 : 256;
    Tensor codes = Tensor::empty({n}, from);
    for (int64_t c = 0; c < n; ++c) {
      if (n == 256)
        codes.data_u8()[c] = uint8_t(c);
      else
        codes.data_u16()[c] = uint16_t(c);
    }
    const Tensor got = gpu_convert(codes, DType::f32);
    const Tensor want = codes.to(DType::f32);
    for (int64_t c = 0; c < n; ++c) {
      const float w = want.data<float>()[c], g = got.data<float>()[c];
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(g)) << dtype_name(from) << " code " << c;
      } else {
        ASSERT_EQ(f32_bits(w), f32_bits(g)) << dtype_name(from) << " code " << c;
      }
    }
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
