#include "runtime/sampler/constraint.h"

#include <algorithm>
#include <limits>

namespace dsaserve::runtime {

void TokenMask::apply(std::span<float> logits) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), size_t(std::max<int64_t>(0, vocab)));
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = words[w];
    if (bits == 0xFFFFFFFFu) continue;
    const size_t end = std::min(n, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i) {
      if (((bits >> (i - w * 32)) & 1u) == 0) logits[i] = kNegInf;
    }
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = kNegInf;
}

}  // namespace dsaserve::runtime
