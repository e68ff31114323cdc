// Rotary position embedding on the CPU (interleaved and NeoX pairings), angles as the reference rounds them.
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) {
  const Rows3 v = as_rows3(x, "rope input");
  DSA_CHECK(v.n2 == p.dim, "rope: last dimension of {} should be the rope dim {}", x.describe(), p.dim);
  const int32_t* pos = i32_data(positions, "rope positions");
  DSA_CHECK(positions.size(0) == v.n0, "rope: {} positions for {} tokens", positions.size(0), v.n0);
  const std::vector<float> inv = rope_inv_freq(p);
  const int64_t half = p.dim / 2;
  for (int64_t t = 0; t < v.n0; ++t) DSA_CHECK(pos[t] >= 0, "rope: negative position {}", pos[t]);
  parallel_for(v.n0, 4, [&](int64_t b, int64_t e) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half)),
        tmp(static_cast<size_t>(p.dim));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        // fp32 angle (torch: inv_freq.float() @ position.float()), cos/sin rounded to fp32.
        const float ang = inv[size_t(i)] * float(pos[t]);
        cs[size_t(i)] = float(std::cos(double(ang)) * p.attention_factor);
        sn[size_t(i)] = float(std::sin(double(ang)) * p.attention_factor);
      }
      for (int64_t h = 0; h < v.n1; ++h) {
        float* r = v.at(t, h);
        for (int64_t i = 0; i < half; ++i) {
          const float a = p.interleaved ? r[2 * i] : r[i];
          const float c = p.interleaved ? r[2 * i + 1] : r[i + half];
          tmp[size_t(i)] = a * cs[size_t(i)] - c * sn[size_t(i)];
          tmp[size_t(i + half)] = c * cs[size_t(i)] + a * sn[size_t(i)];
        }
        std::copy(tmp.begin(), tmp.end(), r);
      }
    }
  });
}

}  // namespace dsaserve::kernels::cpu
