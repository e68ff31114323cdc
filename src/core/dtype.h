#pragma once
// Element types and scalar conversions that match PyTorch bit for bit.
//
// f32 -> bf16 / f16: round to nearest, ties to even; NaN stays NaN (bf16 NaN is 0x7fc0 like torch).
// f32 -> fp8 e4m3fn: torch's cast (round to nearest even, |x| >= 480 or inf -> NaN 0x7f/0xff);
//   f32_to_f8e4m3fn_sat clamps to +-448 first, the rule of FP8 quantisation kernels (satfinite).
// f32 -> fp8 e5m2: torch's cast (round to nearest even through the f16 bit pattern; overflow -> inf).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dsaserve {

enum class DType : uint8_t { f32, f16, bf16, f8e4m3fn, f8e5m2, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f32,    DType::f16, DType::bf16, DType::f8e4m3fn,
                                       DType::f8e5m2, DType::i32, DType::i64,  DType::u8};

size_t dtype_size(DType t);
// Short lower-case name: "f32", "bf16", "f8e4m3fn", ...
std::string_view dtype_name(DType t);
// safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I32", "I64", "U8".
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view name);
bool dtype_is_float(DType t);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN (torch: UINT16_C(0x7FC0))
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3fn_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3fn(float f);
uint8_t f32_to_f8e4m3fn_sat(float f);
float f8e5m2_to_f32(uint8_t v);
uint8_t f32_to_f8e5m2(float f);

// Converts n elements of src (type from) into dst (type to), both contiguous on the CPU.
// Float -> integer truncates toward zero like torch; integer -> float rounds like the scalar functions.
void convert(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace dsaserve
