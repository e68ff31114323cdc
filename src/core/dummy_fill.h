#pragma once
// Dummy weights (--load-format dummy): the value of element i of the tensor with key `key` under `seed`
// is a pure function of (seed, key, i), a counter-based hash (splitmix64), so the CPU (parallel_for)
// and the CUDA kernel write the same bytes for the same seed and any split of the work.
//
// One 64-bit hash serves 2 bf16 / f32 elements or 4 FP8 codes (see element_bits).
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

// The 64 random bits of hash group g. bf16 / f32 element i takes the 32-bit half (i & 1) of group i / 2,
// an FP8 code the 16-bit quarter (i & 3) of group i / 4 (kGroupBf16 / kGroupFp8 elements per group).
DSA_DUMMY_HD uint64_t element_bits(uint64_t base, uint64_t g) {
  return splitmix64(base + g * 0xd1b54a32d192ed03ull);
}
inline constexpr int kGroupValues = 2;  // bf16 / f32 elements per hash
inline constexpr int kGroupFp8 = 4;     // FP8 codes per hash
DSA_DUMMY_HD uint32_t value_bits(uint64_t h, uint64_t i) { return uint32_t(h >> (32 * (i & 1))); }
DSA_DUMMY_HD uint32_t code_bits(uint64_t h, uint64_t i) { return uint32_t(h >> (16 * (i & 3))) & 0xffffu; }

// v in [-1, 1) from 24 random bits (exact in f32).
DSA_DUMMY_HD float uniform_pm1(uint32_t b) {
  const int32_t m = int32_t(b >> 8);                    // [0, 2^24)
  return float(2 * m - (int32_t(1) << 24)) * 0x1p-24f;  // exact: |2m - 2^24| <= 2^24
}
// w in [0.5, 1) from 24 random bits (exact in f32).
DSA_DUMMY_HD float uniform_half1(uint32_t b) {
  const int32_t m = int32_t(b >> 8);
  return float(m + (int32_t(1) << 24)) * 0x1p-25f;
}

DSA_DUMMY_HD float value_f32(const FillSpec& f, uint32_t h) {
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

// An e4m3fn code from 16 random bits: sign, exponent field 5..8, mantissa 0..7.
DSA_DUMMY_HD uint8_t fp8_code(uint32_t c) {
  const uint32_t sign = ((c >> 15) & 1u) << 7;
  const uint32_t exp = 5u + (c & 3u);
  const uint32_t man = (c >> 2) & 7u;
  return uint8_t(sign | (exp << 3) | man);
}

// Element i of a tensor (the reference both fills follow).
DSA_DUMMY_HD uint16_t bf16_element(const FillSpec& f, uint64_t base, uint64_t i) {
  return bf16_rne(value_f32(f, value_bits(element_bits(base, i / kGroupValues), i)));
}
DSA_DUMMY_HD float f32_element(const FillSpec& f, uint64_t base, uint64_t i) {
  return value_f32(f, value_bits(element_bits(base, i / kGroupValues), i));
}
DSA_DUMMY_HD uint8_t fp8_element(uint64_t base, uint64_t i) {
  return fp8_code(code_bits(element_bits(base, i / kGroupFp8), i));
}

}  // namespace dsaserve::dummy
