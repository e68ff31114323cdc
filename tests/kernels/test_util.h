#pragma once
// Random inputs and straightforward references for the CPU operator tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::testing {

inline Tensor randn(const Shape& shape, std::mt19937& rng, float std = 1.0f) {
  std::normal_distribution<float> d(0.0f, std);
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
  return t;
}

inline Tensor i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * 4);
  return t;
}

// A random weight [out, in] in `dt` (bf16 | f32 | fp8 with 128x128 block scales) and its exact f32 value.
struct TestWeight {
  WeightRef ref;
  std::vector<double> value;  // [out * in] what the stored weight means
};

inline TestWeight random_weight(int64_t out, int64_t in, DType dt, std::mt19937& rng) {
  TestWeight w;
  const Tensor f = randn({out, in}, rng, float(1.0 / std::sqrt(double(in))));
  const float* fp = f.data<float>();
  w.value.resize(size_t(out * in));
  if (dt == DType::f32) {
    w.ref.weight = f;
    for (int64_t i = 0; i < out * in; ++i) w.value[size_t(i)] = fp[i];
  } else if (dt == DType::bf16) {
    w.ref.weight = f.to(DType::bf16);
    const uint16_t* b = w.ref.weight.data_u16();
    for (int64_t i = 0; i < out * in; ++i) w.value[size_t(i)] = bf16_to_f32(b[i]);
  } else {
    const int64_t sn = (out + 127) / 128, sk = (in + 127) / 128;
    w.ref.weight = Tensor::empty({out, in}, DType::f8e4m3fn);
    w.ref.scale_inv = Tensor::empty({sn, sk}, DType::f32);
    float* s = w.ref.scale_inv.data<float>();
    for (int64_t bi = 0; bi < sn; ++bi) {
      for (int64_t bk = 0; bk < sk; ++bk) {
        float mx = 0.0f;
        for (int64_t r = bi * 128; r < std::min(out, (bi + 1) * 128); ++r)
          for (int64_t c = bk * 128; c < std::min(in, (bk + 1) * 128); ++c)
            mx = std::max(mx, std::fabs(fp[r * in + c]));
        s[bi * sk + bk] = mx > 0 ? mx / 448.0f : 1.0f;
      }
    }
    uint8_t* q = w.ref.weight.data_u8();
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t c = 0; c < in; ++c) {
        const float sc = s[(r / 128) * sk + c / 128];
        q[r * in + c] = f32_to_f8e4m3fn_sat(fp[r * in + c] / sc);
        w.value[size_t(r * in + c)] = double(f8e4m3fn_to_f32(q[r * in + c])) * sc;
      }
    }
  }
  return w;
}

// max |a - b| / max |b| over all elements.
inline double rel_error(const Tensor& ours, const std::vector<double>& ref) {
  const std::vector<float> a = ours.contiguous().to_f32_vector();
  EXPECT_EQ(a.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

inline std::vector<double> as_double(const Tensor& t) {
  const std::vector<float> f = t.contiguous().to_f32_vector();
  return std::vector<double>(f.begin(), f.end());
}

}  // namespace dsaserve::kernels::testing
