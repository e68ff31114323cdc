// fill_dummy on the CPU: core/dummy_fill.h's values, in parallel (each element depends only on its index).
#include <algorithm>

#include "core/dummy_fill.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

void fill_dummy(Tensor& t, const dummy::FillSpec& f) {
  DSA_CHECK(t.defined() && t.device() == Device::cpu && t.is_contiguous(),
            "fill_dummy: needs a contiguous CPU tensor, got {}", t.defined() ? t.describe() : "undefined");
  const DType dt = t.dtype();
  DSA_CHECK(dt == DType::bf16 || dt == DType::f32 || dt == DType::f8e4m3fn,
            "fill_dummy: dtype {} (bf16, f32 or f8e4m3fn)", dtype_name(dt));
  const int64_t n = t.numel();
  const uint64_t base = dummy::stream_base(f.seed, f.key);
  void* out = t.raw_data();
  // Ranges of whole hash groups (4 elements: a multiple of both group sizes), each group hashed once.
  const int64_t groups = (n + 3) / 4;
  parallel_for(groups, int64_t(1) << 14, [&](int64_t g0, int64_t g1) {
    const int64_t e = std::min(n, g1 * 4);
    if (dt == DType::f8e4m3fn) {
      uint8_t* o = static_cast<uint8_t*>(out);
      for (int64_t i = g0 * 4; i < e; i += dummy::kGroupFp8) {
        const uint64_t h = dummy::element_bits(base, uint64_t(i / dummy::kGroupFp8));
        for (int64_t k = i; k < std::min(e, i + dummy::kGroupFp8); ++k)
          o[k] = dummy::fp8_code(dummy::code_bits(h, uint64_t(k)));
      }
      return;
    }
    for (int64_t i = g0 * 4; i < e; i += dummy::kGroupValues) {
      const uint64_t h = dummy::element_bits(base, uint64_t(i / dummy::kGroupValues));
      for (int64_t k = i; k < std::min(e, i + dummy::kGroupValues); ++k) {
        const float v = dummy::value_f32(f, dummy::value_bits(h, uint64_t(k)));
        if (dt == DType::bf16) {
          static_cast<uint16_t*>(out)[k] = dummy::bf16_rne(v);
        } else {
          static_cast<float*>(out)[k] = v;
        }
      }
    }
  });
}

}  // namespace dsaserve::kernels::cpu
