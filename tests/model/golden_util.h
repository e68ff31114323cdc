#pragma once
// Helpers of the golden-logit tests: reading goldens.safetensors and measuring relative error per row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace dsaserve::testing {

// max over rows of max|a - b| / max|b| (FIXTURES.md's relative error per logits row).
inline double max_row_rel_error(const Tensor& ours, const Tensor& ref) {
  const std::vector<float> a = ours.to_f32_vector(), b = ref.to_f32_vector();
  const int64_t rows = ref.size(0), cols = ref.size(1);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      num = std::max(num, std::fabs(double(a[size_t(r * cols + c)]) - double(b[size_t(r * cols + c)])));
      den = std::max(den, std::fabs(double(b[size_t(r * cols + c)])));
    }
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

inline std::vector<int32_t> ids_of(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

}  // namespace dsaserve::testing
