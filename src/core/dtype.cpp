#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace dsaserve {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f8e4m3fn: return 1;
    case DType::f8e5m2: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f8e4m3fn: return "f8e4m3fn";
    case DType::f8e5m2: return "f8e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f8e4m3fn: return "F8_E4M3";
    case DType::f8e5m2: return "F8_E5M2";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (dtype_safetensors_name(t) == name) return t;
  }
  return std::nullopt;
}

bool dtype_is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f8e4m3fn || t == DType::f8e5m2;
}

namespace {

// A binary float format with `ebits` exponent bits, `mbits` mantissa bits and the IEEE bias.
struct SmallFloat {
  int ebits;
  int mbits;
  int bias() const { return (1 << (ebits - 1)) - 1; }
};

// Round a finite, non-negative float to the format's code with round-to-nearest-even, treating every
// exponent field as normal (callers handle overflow). The scalings are by powers of two, so exact.
uint32_t round_to_code(float x, SmallFloat fmt) {
  const int min_exp = 1 - fmt.bias();  // exponent of the smallest normal
  if (x < std::ldexp(1.0f, min_exp)) {
    return uint32_t(std::nearbyint(std::ldexp(x, fmt.mbits - min_exp)));  // may carry into normal: right
  }
  int e;
  float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  e -= 1;                       // x = (2m) * 2^e
  float r = std::nearbyint(std::ldexp(m, fmt.mbits + 1));
  if (r == std::ldexp(1.0f, fmt.mbits + 1)) {
    r = std::ldexp(1.0f, fmt.mbits);
    e += 1;
  }
  return (uint32_t(e + fmt.bias()) << fmt.mbits) | (uint32_t(r) - (1u << fmt.mbits));
}

// Decode a code of the format (sign excluded) as if every exponent field were normal.
float decode_code(uint32_t code, SmallFloat fmt) {
  uint32_t exp_field = code >> fmt.mbits;
  uint32_t mant = code & ((1u << fmt.mbits) - 1);
  if (exp_field == 0) return std::ldexp(float(mant), 1 - fmt.bias() - fmt.mbits);
  return std::ldexp(float(mant + (1u << fmt.mbits)), int(exp_field) - fmt.bias() - fmt.mbits);
}

constexpr SmallFloat kF16{5, 10};
constexpr SmallFloat kE4M3{4, 3};
constexpr SmallFloat kE5M2{5, 2};

}  // namespace

float f16_to_f32(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const uint32_t code = h & 0x7fff;
  if ((code >> 10) == 0x1f) {
    return (code & 0x3ff) ? std::copysign(std::numeric_limits<float>::quiet_NaN(), sign)
                          : sign * std::numeric_limits<float>::infinity();
  }
  return sign * decode_code(code, kF16);
}

uint16_t f32_to_f16(float f) {
  const uint16_t sign = uint16_t((f32_bits(f) >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(a)) return sign | 0x7e00;
  if (a >= 65536.0f) return sign | 0x7c00;
  const uint32_t code = round_to_code(a, kF16);
  return sign | uint16_t(code > 0x7c00 ? 0x7c00 : code);
}

float f8e4m3fn_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const uint32_t code = v & 0x7f;
  if (code == 0x7f) return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  return sign * decode_code(code, kE4M3);
}

uint8_t f32_to_f8e4m3fn(float f) {
  const uint8_t sign = uint8_t((f32_bits(f) >> 24) & 0x80);
  const float a = std::fabs(f);
  if (std::isnan(a) || a >= 480.0f) return sign | 0x7f;  // torch: NaN for inf, NaN and overflow
  return sign | uint8_t(round_to_code(a, kE4M3));
}

uint8_t f32_to_f8e4m3fn_sat(float f) {
  if (std::isnan(f)) return uint8_t(((f32_bits(f) >> 24) & 0x80) | 0x7f);
  return f32_to_f8e4m3fn(std::fmin(std::fmax(f, -448.0f), 448.0f));
}

float f8e5m2_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const uint32_t code = v & 0x7f;
  if ((code >> 2) == 0x1f) {
    return (code & 3) ? std::copysign(std::numeric_limits<float>::quiet_NaN(), sign)
                      : sign * std::numeric_limits<float>::infinity();
  }
  return sign * decode_code(code, kE5M2);
}

uint8_t f32_to_f8e5m2(float f) {
  const uint8_t sign = uint8_t((f32_bits(f) >> 24) & 0x80);
  const float a = std::fabs(f);
  if (std::isnan(a)) return sign | 0x7f;
  if (a >= 65536.0f) return sign | 0x7c;
  const uint32_t code = round_to_code(a, kE5M2);
  return sign | uint8_t(code > 0x7c ? 0x7c : code);
}

namespace {

float load_float(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f8e4m3fn: return f8e4m3fn_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::f8e5m2: return f8e5m2_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::i32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::i64: return float(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

int64_t load_int(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<const int64_t*>(p)[i];
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
    default: return int64_t(load_float(p, t, i));  // truncation toward zero
  }
}

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    switch (to) {
      case DType::f32: static_cast<float*>(dst)[i] = load_float(src, from, i); break;
      case DType::f16: static_cast<uint16_t*>(dst)[i] = f32_to_f16(load_float(src, from, i)); break;
      case DType::bf16: static_cast<uint16_t*>(dst)[i] = f32_to_bf16(load_float(src, from, i)); break;
      case DType::f8e4m3fn: static_cast<uint8_t*>(dst)[i] = f32_to_f8e4m3fn(load_float(src, from, i)); break;
      case DType::f8e5m2: static_cast<uint8_t*>(dst)[i] = f32_to_f8e5m2(load_float(src, from, i)); break;
      case DType::i32: static_cast<int32_t*>(dst)[i] = int32_t(load_int(src, from, i)); break;
      case DType::i64: static_cast<int64_t*>(dst)[i] = load_int(src, from, i); break;
      case DType::u8: static_cast<uint8_t*>(dst)[i] = uint8_t(load_int(src, from, i)); break;
    }
  }
}

}  // namespace dsaserve
