// Exhaustive checks of the 8- and 16-bit conversions against an independent reference: decode every
// code, re-encode it, and check the rounding decision at every boundary between adjacent codes
// (the exact midpoint must round to the even code, one float ulp either side to the nearer one).
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace dsaserve {
namespace {

struct Format {
  const char* name;
  int bits;                               // 8 or 16
  std::function<float(uint32_t)> decode;  // code -> f32
  std::function<uint32_t(float)> encode;  // f32 -> code (torch cast)
  float overflow_at;                      // |x| >= this (and inf) -> overflow code
  uint32_t overflow_code;                 // positive overflow code (inf or NaN)
};

// Reference decode computed from first principles (IEEE-style layout with the type's specials).
double ref_decode(uint32_t code, int ebits, int mbits, bool fn_variant) {
  const int bias = (1 << (ebits - 1)) - 1;
  const bool neg = (code >> (ebits + mbits)) & 1;
  const uint32_t e = (code >> mbits) & ((1u << ebits) - 1);
  const uint32_t m = code & ((1u << mbits) - 1);
  double v;
  if (fn_variant) {
    if (e == (1u << ebits) - 1 && m == (1u << mbits) - 1) return std::nan("");
  } else if (e == (1u << ebits) - 1) {
    return m ? std::nan("") : (neg ? -INFINITY : INFINITY);
  }
  if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mbits);
  } else {
    v = std::ldexp(double(m + (1u << mbits)), int(e) - bias - mbits);
  }
  return neg ? -v : v;
}

std::vector<Format> formats() {
  return {
      {"bf16", 16, [](uint32_t c) { return bf16_to_f32(uint16_t(c)); },
       [](float f) { return uint32_t(f32_to_bf16(f)); }, INFINITY, 0x7f80},
      {"f16", 16, [](uint32_t c) { return f16_to_f32(uint16_t(c)); },
       [](float f) { return uint32_t(f32_to_f16(f)); }, 65520.0f, 0x7c00},
      {"f8e4m3fn", 8, [](uint32_t c) { return f8e4m3fn_to_f32(uint8_t(c)); },
       [](float f) { return uint32_t(f32_to_f8e4m3fn(f)); }, 464.0f, 0x7f},
      {"f8e5m2", 8, [](uint32_t c) { return f8e5m2_to_f32(uint8_t(c)); },
       [](float f) { return uint32_t(f32_to_f8e5m2(f)); }, 61440.0f, 0x7c},
  };
}

void ref_layout(const std::string& name, int* ebits, int* mbits, bool* fn) {
  *fn = false;
  if (name == "bf16") *ebits = 8, *mbits = 7;
  if (name == "f16") *ebits = 5, *mbits = 10;
  if (name == "f8e4m3fn") *ebits = 4, *mbits = 3, *fn = true;
  if (name == "f8e5m2") *ebits = 5, *mbits = 2;
}

TEST(DType, DecodeEveryCodeMatchesReference) {
  for (const Format& f : formats()) {
    int eb, mb;
    bool fn;
    ref_layout(f.name, &eb, &mb, &fn);
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const double want = ref_decode(c, eb, mb, fn);
      const float got = f.decode(c);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
      } else {
        EXPECT_EQ(double(got), want) << f.name << " code " << c;
        EXPECT_EQ(std::signbit(got), bool(c >> (f.bits - 1))) << f.name << " code " << c;
      }
    }
  }
}

TEST(DType, EveryCodeRoundTrips) {
  for (const Format& f : formats()) {
    for (uint32_t c = 0; c < (1u << f.bits); ++c) {
      const float v = f.decode(c);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(f.decode(f.encode(v)))) << f.name << " code " << c;
        continue;
      }
      EXPECT_EQ(f.encode(v), c) << f.name << " code " << c;
    }
  }
}

// For each pair of adjacent positive finite codes (a, b): the midpoint goes to the even one, one float
// ulp below it to a, one above to b. Negative values mirror with the sign bit.
TEST(DType, RoundsToNearestEvenAtEveryBoundary) {
  for (const Format& f : formats()) {
    const uint32_t sign_bit = 1u << (f.bits - 1);
    std::vector<std::pair<float, uint32_t>> finite;
    for (uint32_t c = 0; c < sign_bit; ++c) {
      const float v = f.decode(c);
      if (std::isfinite(v)) finite.emplace_back(v, c);
    }
    std::sort(finite.begin(), finite.end());
    for (size_t i = 0; i + 1 < finite.size(); ++i) {
      const auto [a, ca] = finite[i];
      const auto [b, cb] = finite[i + 1];
      const float mid = float((double(a) + double(b)) / 2);  // exact in f32 for these formats
      ASSERT_EQ(double(mid), (double(a) + double(b)) / 2) << f.name;
      const uint32_t even = (ca & 1) ? cb : ca;
      for (float s : {1.0f, -1.0f}) {
        const uint32_t sb = s < 0 ? sign_bit : 0;
        EXPECT_EQ(f.encode(s * mid), even | sb) << f.name << " midpoint " << s * mid;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, 0.0f)), ca | sb) << f.name << " below " << s * mid;
        EXPECT_EQ(f.encode(s * std::nextafter(mid, INFINITY)), cb | sb) << f.name << " above " << s * mid;
      }
    }
    // Past the largest finite value: torch's overflow rule.
    const float top = finite.back().first;
    const float above_top = f.overflow_at;
    EXPECT_EQ(f.encode(INFINITY), f.overflow_code) << f.name;
    EXPECT_EQ(f.encode(-INFINITY), f.overflow_code | sign_bit) << f.name;
    if (std::isfinite(above_top)) {
      EXPECT_EQ(f.encode(std::nextafter(above_top, INFINITY)), f.overflow_code) << f.name;
      EXPECT_EQ(f.encode(1e30f), f.overflow_code) << f.name;
      EXPECT_EQ(f.decode(f.encode(top)), top) << f.name;
    }
    EXPECT_TRUE(std::isnan(f.decode(f.encode(std::numeric_limits<float>::quiet_NaN())))) << f.name;
  }
}

TEST(DType, TorchSpecialValues) {
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(f32_to_f8e4m3fn(448.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3fn(464.0f), 0x7e);  // tie between 448 (even) and 480 -> 448
  EXPECT_EQ(f32_to_f8e4m3fn(470.0f), 0x7f);  // nearer 480, which e4m3fn spends on NaN
  EXPECT_EQ(f32_to_f8e4m3fn(-1000.0f), 0xff);
  EXPECT_EQ(f32_to_f8e4m3fn_sat(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3fn_sat(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3fn_sat(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_f8e4m3fn(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(f32_to_f8e4m3fn(std::ldexp(1.0f, -10)), 0x00);  // half of it: tie to even (zero)
  EXPECT_EQ(f32_to_f8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7c);  // tie between 57344 (odd code) and inf -> inf
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

// Random floats over the whole range against a nearest-code search in double.
TEST(DType, RandomFloatsMatchNearestSearch) {
  std::mt19937 rng(123);
  for (const Format& f : formats()) {
    std::vector<std::pair<double, uint32_t>> finite;
    for (uint32_t c = 0; c < (1u << (f.bits - 1)); ++c) {
      const float v = f.decode(c);
      if (std::isfinite(v)) finite.emplace_back(v, c);
    }
    std::sort(finite.begin(), finite.end());
    const double top = finite.back().first;
    for (int i = 0; i < 200000; ++i) {
      // Exponents concentrated where the format lives, with a tail outside.
      const float x = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                                 std::uniform_int_distribution<int>(f.bits == 8 ? -14 : -30, 18)(rng));
      if (!(x < f.overflow_at) || x > top * 2) continue;
      auto it = std::lower_bound(finite.begin(), finite.end(), std::make_pair(double(x), 0u));
      uint32_t want;
      if (it == finite.end()) {
        want = finite.back().second;  // above the top value but below the overflow threshold
      } else if (it == finite.begin() || it->first == x) {
        want = it->second;
      } else {
        const auto lo = *(it - 1), hi = *it;
        const double dl = x - lo.first, dh = hi.first - x;
        want = dl < dh ? lo.second : dh < dl ? hi.second : ((lo.second & 1) ? hi.second : lo.second);
      }
      ASSERT_EQ(f.encode(x), want) << f.name << " x=" << x;
    }
  }
}

TEST(DType, SafetensorsNames) {
  for (DType t : kAllDTypes) EXPECT_EQ(dtype_from_safetensors(dtype_safetensors_name(t)), t);
  EXPECT_FALSE(dtype_from_safetensors("F64").has_value());
  EXPECT_FALSE(dtype_from_safetensors("bf16").has_value());
}

TEST(DType, BulkConvertMatchesScalar) {
  std::vector<float> src = {0.0f, -1.5f, 3.14159f, 1e-8f, 65504.0f, -448.0f, 1e6f};
  std::vector<uint16_t> bf(src.size());
  convert(src.data(), DType::f32, bf.data(), DType::bf16, src.size());
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(bf[i], f32_to_bf16(src[i]));
  std::vector<int32_t> ints(src.size());
  convert(src.data(), DType::f32, ints.data(), DType::i32, src.size());
  EXPECT_EQ(ints[1], -1);  // truncation toward zero, like torch
  EXPECT_EQ(ints[2], 3);
}

}  // namespace
}  // namespace dsaserve
