// The CPU FP8 index-key format (kernels/cpu/indexer_key_fp8.h): scales, the zero / underflow rules,
// round trips within e4m3's half-ulp, and the byte layout (codes first, then one f32 scale per key).
#include "kernels/cpu/indexer_key_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"

namespace dsaserve::kernels::cpu {
namespace {

TEST(IndexerKeyFp8, ScaleIsAmaxOver448AndCodesRoundTrip) {
  float k[128];
  for (int d = 0; d < 128; ++d) k[d] = std::sin(0.37f * float(d) + 0.1f) * 3.5f;
  k[7] = -896.0f;  // amax 896: scale 2
  uint8_t codes[128];
  const float s = indexer_key_fp8_quantize(k, 128, codes);
  EXPECT_EQ(s, 2.0f);
  EXPECT_EQ(f8e4m3fn_to_f32(codes[7]), -448.0f);
  for (int d = 0; d < 128; ++d) {
    const float back = f8e4m3fn_to_f32(codes[d]) * s;
    // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; below 2^-6 * s the step is 2^-9 * s.
    EXPECT_LE(std::fabs(back - k[d]), std::max(std::fabs(k[d]) / 16.0f, s * 0.001953125f / 2.0f)) << d;
  }
}

TEST(IndexerKeyFp8, ZeroAndUnderflowingKeysGetScaleOne) {
  float zeros[128] = {};
  uint8_t codes[128];
  EXPECT_EQ(indexer_key_fp8_quantize(zeros, 128, codes), 1.0f);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  float tiny[128];
  for (int d = 0; d < 128; ++d) tiny[d] = d % 2 ? 1e-44f : -1e-45f;  // amax / 448 underflows to 0
  EXPECT_EQ(indexer_key_fp8_quantize(tiny, 128, codes), 1.0f);
  float sub[128];
  for (int d = 0; d < 128; ++d) sub[d] = 1e-40f * float(d + 1) / 128.0f;  // subnormal amax: finite scale
  const float s = indexer_key_fp8_quantize(sub, 128, codes);
  EXPECT_TRUE(std::isfinite(s) && s > 0.0f);
  EXPECT_EQ(f8e4m3fn_to_f32(codes[127]), 448.0f);
}

TEST(IndexerKeyFp8, EncodeLayoutAndDecode) {
  Tensor keys = Tensor::empty({3, 128}, DType::f32);
  for (int64_t i = 0; i < 3 * 128; ++i)
    keys.data<float>()[i] = float((i * 37) % 101 - 50) * float(1 + i / 128);
  const Tensor bytes = indexer_key_fp8_encode(keys);
  ASSERT_EQ(bytes.shape(), (Shape{3, 132}));
  const Tensor back = indexer_key_fp8_decode(bytes);
  for (int64_t i = 0; i < 3; ++i) {
    uint8_t codes[128];
    const float s = indexer_key_fp8_quantize(keys.data<float>() + i * 128, 128, codes);
    EXPECT_EQ(std::memcmp(bytes.data_u8() + i * 128, codes, 128), 0);
    float stored;
    std::memcpy(&stored, bytes.data_u8() + 3 * 128 + i * 4, 4);
    EXPECT_EQ(stored, s);
    for (int d = 0; d < 128; ++d) EXPECT_EQ(back.data<float>()[i * 128 + d], f8e4m3fn_to_f32(codes[d]) * s);
  }
  EXPECT_THROW(indexer_key_fp8_decode(Tensor::zeros({2, 4}, DType::u8)), Error);
}

}  // namespace
}  // namespace dsaserve::kernels::cpu
