#pragma once
// Dummy weights (--load-format dummy): the value of element i of the tensor with key `key` under `seed`
// is a pure function of (seed, key, i), a counter-based hash (splitmix64), so the CPU (parallel_for)
// and the CUDA kernel write the same bytes for the same seed and any split of the work.
//
// Bit-exact on both sides by construction: the uniform draw v in [-1, 1) has 24 bits (exact in f32);
// a value is `offset + scale * v` with offset 0 (one rounding of the product, whether or not a compiler
// fuses it into an FMA) or scale a power of two (the product is exact, one rounding of the sum); bf16
// rounds to nearest even on the bits. FP8 e4m3 weights are codes drawn directly from the hash: a random
// sign, exponent field 5..8 and mantissa, i.e. magnitudes (1 + m/8) * 2^(e-7) in [0.25, 3.75] (no NaN,
// no subnormals); their RMS is kDummyFp8CodeRms, so a block scale of s / kDummyFp8CodeRms gives values
// of RMS ~s. Plain C++ (no fmt): included by CUDA sources too.
#include <cstdint>

#if defined(__CUDACC__)
#define DSA_DUMMY_HD __host__ __device__ __forceinline__
#else
#define DSA_DUMMY_HD inline
#endif

namespace dsaserve::dummy {

// What fill_dummy writes, by the tensor's dtype: bf16 / f32 `offset + scale * v` (v uniform in [-1, 1));
// `positive`: `scale * w` with w uniform in [0.5, 1) instead (block scales); f8e4m3fn: random codes as
// above (scale and offset unused).
struct FillSpec {
  uint64_t seed = 0;
  uint64_t key = 0;  // the tensor's key (tensor_key of its checkpoint name)
  float scale = 1.0f;
  float offset = 0.0f;  // non-zero only with a power-of-two scale (see above)
  bool positive = false;
};

// sqrt(E[x^2]) of the FP8 codes' magnitudes: E[(1 + m/8)^2] = 2.1484375 over m, E[4^(e-7)] = 1.328125
// over e = 5..8.
inline constexpr float kDummyFp8CodeRms = 1.6891f;

DSA_DUMMY_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The per-tensor stream base: computed once per tensor.
DSA_DUMMY_HD uint64_t stream_base(uint64_t seed, uint64_t key) { return splitmix64(seed ^ splitmix64(key)); }

// The 64 random bits of element i.
DSA_DUMMY_HD uint64_t element_bits(uint64_t base, uint64_t i) {
  return splitmix64(base + i * 0xd1b54a32d192ed03ull);
}

// v in [-1, 1) with 24 random bits (exact in f32).
DSA_DUMMY_HD float uniform_pm1(uint64_t h) {
  const int32_t m = int32_t(h >> 40);                 // [0, 2^24)
  return float(2 * m - (int32_t(1) << 24)) * 0x1p-24f;  // exact: |2m - 2^24| <= 2^24
}
// w in [0.5, 1) with 24 random bits (exact in f32).
DSA_DUMMY_HD float uniform_half1(uint64_t h) {
  const int32_t m = int32_t(h >> 40);
  return float(m + (int32_t(1) << 24)) * 0x1p-25f;
}

DSA_DUMMY_HD float value_f32(const FillSpec& f, uint64_t h) {
  if (f.positive) return f.scale * uniform_half1(h);
  return f.offset + f.scale * uniform_pm1(h);
}

// f32 -> bf16, round to nearest even (as core/dtype.h's f32_to_bf16; the values here are finite).
DSA_DUMMY_HD uint16_t bf16_rne(float x) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(x);
#else
  __builtin_memcpy(&u, &x, 4);
#endif
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// An e4m3fn code: sign, exponent field 5..8, mantissa 0..7.
DSA_DUMMY_HD uint8_t fp8_code(uint64_t h) {
  const uint32_t sign = uint32_t(h >> 63) << 7;
  const uint32_t exp = 5u + uint32_t((h >> 40) & 3u);
  const uint32_t man = uint32_t((h >> 48) & 7u);
  return uint8_t(sign | (exp << 3) | man);
}

}  // namespace dsaserve::dummy
