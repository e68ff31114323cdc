#pragma once
// Seeded random tensors (never zeros), random weights as checkpoints store them (bf16, f32, FP8 e4m3 with
// 128x128 block scales), and the error measures the operator tests hold a backend's results to. No
// GoogleTest here: the operator table (op_table.h) and its benchmark use these too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::testing {

// splitmix64: fast, seeded, reproducible.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() { return splitmix64(s); }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }  // [-1, 1)
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

// f32 CPU tensor of uniform values in [-scale, scale) (zero has probability 2^-24).
inline Tensor rand_f32(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Rng r(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.uniform() * scale;
  return t;
}

inline Tensor rand_bf16(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  Rng r(seed);
  uint16_t* p = t.data_u16();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(r.uniform() * scale);
  return t;
}

// A Linear weight [n, k] on the CPU: bf16 ~ U(-1, 1) / sqrt(k), or fp8 e4m3 codes (finite) with block
// scales around 1 / (64 sqrt(k)) (f32: U(-1, 1) / sqrt(k)).
inline WeightRef rand_weight(int64_t n, int64_t k, DType dt, uint64_t seed) {
  const float s = 1.0f / std::sqrt(float(k));
  if (dt == DType::bf16) return WeightRef{rand_bf16({n, k}, seed, s), {}, 128, 128};
  if (dt == DType::f32) return WeightRef{rand_f32({n, k}, seed, s), {}, 128, 128};
  Tensor w = Tensor::empty({n, k}, DType::f8e4m3fn);
  Rng r(seed);
  uint8_t* p = w.data_u8();
  for (int64_t i = 0; i < n * k; ++i) {
    uint8_t c = uint8_t(r.next() & 0xff);
    if ((c & 0x7f) == 0x7f) c = 0x7e;               // NaN codes -> largest finite
    if ((c & 0x78) >= 0x60) c = uint8_t(c & 0xe7);  // keep most values within ~2^4 (like real weights)
    p[i] = c;
  }
  const int64_t nb = (n + 127) / 128, kb = (k + 127) / 128;
  Tensor sc = Tensor::empty({nb, kb}, DType::f32);
  for (int64_t i = 0; i < nb * kb; ++i) sc.data<float>()[i] = s / 8.0f * (1.0f + 0.5f * r.uniform());
  return WeightRef{w, sc, 128, 128};
}

inline WeightRef weight_on(const WeightRef& w, Device d) {
  return WeightRef{w.weight.to(d), w.scale_inv.defined() ? w.scale_inv.to(d) : Tensor(), w.block_n,
                   w.block_k};
}

inline Tensor host(const Tensor& t) { return t.device() == Device::cpu ? t : t.to(Device::cpu); }

inline Tensor i32_tensor(const std::vector<int32_t>& v, Device d = Device::cpu) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return d == Device::cpu ? t : t.to(d);
}

// max over rows of max|a - b| / max|b| (rows = leading dimension; any shape, f32). Different sizes:
// infinity.
inline double row_rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<float> a = host(got).contiguous().to_f32_vector(),
                           b = host(want).contiguous().to_f32_vector();
  if (a.size() != b.size() || b.empty()) return a.size() == b.size() ? 0.0 : INFINITY;
  const int64_t rows = want.size(0), cols = int64_t(b.size()) / std::max<int64_t>(rows, 1);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = a[size_t(r * cols + c)], y = b[size_t(r * cols + c)];
      num = std::max(num, std::isnan(x) ? INFINITY : std::fabs(x - y));
      den = std::max(den, std::fabs(y));
    }
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

// max over rows of ||a - b||_2 / ||b||_2 (the usual measure for quantised GEMMs: FP8 e4m3 activations
// round each value by up to 2^-4, which puts the largest single-element error of a 6144-wide row at ~3%
// of the row's maximum even when the GEMM itself is exact).
inline double row_l2_rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<float> a = host(got).contiguous().to_f32_vector(),
                           b = host(want).contiguous().to_f32_vector();
  if (a.size() != b.size() || b.empty()) return a.size() == b.size() ? 0.0 : INFINITY;
  const int64_t rows = want.size(0), cols = int64_t(b.size()) / std::max<int64_t>(rows, 1);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = a[size_t(r * cols + c)], y = b[size_t(r * cols + c)];
      num += std::isnan(x) ? INFINITY : (x - y) * (x - y);
      den += y * y;
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

// Fraction of differing entries of two i32 tensors (1 when the shapes differ).
inline double mismatch(const Tensor& got, const Tensor& want) {
  const Tensor a = host(got).contiguous(), b = host(want).contiguous();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return 1.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) bad += a.data<int32_t>()[i] != b.data<int32_t>()[i];
  return a.numel() ? double(bad) / double(a.numel()) : 0.0;
}

// Fraction of differing bytes of two tensors of one dtype and shape (1 when they differ in either).
inline double byte_mismatch(const Tensor& got, const Tensor& want) {
  const Tensor a = host(got).contiguous(), b = host(want).contiguous();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return 1.0;
  const auto* x = static_cast<const uint8_t*>(a.raw_data());
  const auto* y = static_cast<const uint8_t*>(b.raw_data());
  int64_t bad = 0;
  for (size_t i = 0; i < a.nbytes(); ++i) bad += x[i] != y[i];
  return a.nbytes() ? double(bad) / double(a.nbytes()) : 0.0;
}

}  // namespace dsaserve::kernels::testing
