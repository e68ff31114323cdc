// The CPU twin of the GPU's FP8 KV cache (Fp8Emulation::fp8_kv_cache): the latent rounding rule
// (mla_latent_fp8_round) on crafted rows, and the CPU cache writes storing, with the option on, exactly
// the rounded rows they store in f32 with it off (index keys: indexer_key_fp8.h's format).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/indexer_key_fp8.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace dsaserve::kernels::cpu {
namespace {

TEST(CpuFp8KvCache, LatentRoundingRule) {
  // One row: 4 latent groups of 128, then 8 rope values.
  const int64_t L = 512, cols = L + 8;
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < 127; ++c) v[size_t(c)] = 2.0f * f8e4m3fn_to_f32(uint8_t(c));  // e4m3 codes 0..126
  v[127] = -2.0f * f8e4m3fn_to_f32(100);
  v[5] = -896.0f;                                           // amax 896: scale 2, every value exact
  for (int64_t c = 128; c < 256; ++c) v[size_t(c)] = 0.0f;  // an all-zero group
  for (int64_t c = 256; c < 384; ++c) v[size_t(c)] = std::sin(0.3f * float(c)) * 0.01f;
  v[300] = 0.05f;
  for (int64_t c = 384; c < 512; ++c) v[size_t(c)] = 1e3f * std::cos(0.7f * float(c));
  for (int64_t c = L; c < cols; ++c) v[size_t(c)] = 1.0f + std::ldexp(1.0f, -9) + 0.1f * float(c - L);
  const Tensor x = Tensor::from_vector(v, {1, cols});
  const Tensor r = mla_latent_fp8_round(x, L);
  const float* o = r.data<float>();
  for (int64_t c = 0; c < 128; ++c) EXPECT_EQ(o[c], v[size_t(c)]) << c;  // representable: unchanged
  for (int64_t c = 128; c < 256; ++c) EXPECT_EQ(o[c], 0.0f) << c;
  for (int64_t g = 2; g < 4; ++g) {
    float amax = 0.0f;
    for (int64_t c = g * 128; c < (g + 1) * 128; ++c) amax = std::max(amax, std::fabs(v[size_t(c)]));
    const float scale = amax / 448.0f;
    int64_t moved = 0;
    for (int64_t c = g * 128; c < (g + 1) * 128; ++c) {
      const float want = v[size_t(c)];
      // Half an e4m3 step: 2^-4 relative for normals; the subnormal step is 2^-9 times the scale.
      EXPECT_LE(std::fabs(o[c] - want),
                std::max(std::fabs(want) / 16.0f, scale * 0.001953125f / 2.0f) * 1.0001f)
          << c;
      moved += o[c] != want;
    }
    EXPECT_GT(moved, 64) << "group " << g;
  }
  EXPECT_NEAR(o[300], 0.05f, 1e-8f);  // the group's amax maps to +-448: itself
  for (int64_t c = L; c < cols; ++c) EXPECT_EQ(o[c], bf16_to_f32(f32_to_bf16(v[size_t(c)]))) << c;
  EXPECT_NE(o[L], v[size_t(L)]);  // 1 + 2^-9 is not a bf16 value
  EXPECT_THROW(mla_latent_fp8_round(x, 100), Error);
}

TEST(CpuFp8KvCache, CacheWritesStoreTheRoundedRows) {
  std::mt19937 rng(11);
  const int64_t T = 3, n_slots = 8, L = 512, R = 64, D = 128;
  const std::vector<int32_t> sl = {5, 0, 2};
  const Tensor pos = testing::i32({4, 9, 17}), slots = testing::i32(sl);
  const Tensor ckv = testing::randn({T, L + R}, rng), lat_w = testing::randn({L}, rng);
  const Tensor k = testing::randn({T, D}, rng, 3.0f), nw = testing::randn({D}, rng),
               nb = testing::randn({D}, rng);
  RopeParams rope;
  rope.dim = R;
  RopeParams krope;
  krope.dim = 64;
  krope.interleaved = false;
  auto write = [&](bool fp8) {
    Fp8Emulation e;
    e.fp8_kv_cache = fp8;
    const std::shared_ptr<Backend> b = make_fp8_emulation_backend(e);
    const Ops ops(b.get());
    Tensor lat = Tensor::from_vector(std::vector<float>(size_t(n_slots * (L + R)), 7.0f), {n_slots, L + R});
    Tensor keys = Tensor::from_vector(std::vector<float>(size_t(n_slots * D), 7.0f), {n_slots, D});
    ops.mla_kv_write(ckv, lat_w, 1e-6, pos, rope, lat, slots);
    ops.indexer_k_write(k, nw, nb, 1e-6, pos, krope, keys, slots);
    return std::make_pair(lat, keys);
  };
  const auto [lat32, keys32] = write(false);
  const auto [lat8, keys8] = write(true);
  const Tensor want_lat = mla_latent_fp8_round(kernels::gather_rows(lat32, slots), L);
  const Tensor want_keys =
      indexer_key_fp8_decode(indexer_key_fp8_encode(kernels::gather_rows(keys32, slots)));
  int64_t moved = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = sl[size_t(t)];
    for (int64_t c = 0; c < L + R; ++c) {
      EXPECT_EQ(lat8.data<float>()[s * (L + R) + c], want_lat.data<float>()[t * (L + R) + c])
          << t << " " << c;
      moved += lat8.data<float>()[s * (L + R) + c] != lat32.data<float>()[s * (L + R) + c];
    }
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(keys8.data<float>()[s * D + d], want_keys.data<float>()[t * D + d]) << t << " " << d;
      moved += keys8.data<float>()[s * D + d] != keys32.data<float>()[s * D + d];
    }
  }
  EXPECT_GT(moved, T * (L + R + D) / 2);  // e4m3 / bf16 rounding moves most values
  for (int64_t s : {1, 3, 4, 6, 7}) {     // slots nobody wrote
    EXPECT_EQ(lat8.data<float>()[s * (L + R) + 11], 7.0f) << s;
    EXPECT_EQ(keys8.data<float>()[s * D + 11], 7.0f) << s;
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cpu
