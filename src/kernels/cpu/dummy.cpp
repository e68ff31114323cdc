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
    // Locals (no reloads through the references) and one loop per dtype, 4 elements (2 hashes) a step.
    const dummy::FillSpec spec = f;
    auto run = [&](auto* o, auto convert) {
      int64_t i = g0 * 4;
      for (; i + 4 <= e; i += 4) {
        const uint64_t h0 = dummy::element_bits(base, uint64_t(i / 2));
        const uint64_t h1 = dummy::element_bits(base, uint64_t(i / 2 + 1));
        o[i] = convert(dummy::value_f32(spec, dummy::value_bits(h0, 0)));
        o[i + 1] = convert(dummy::value_f32(spec, dummy::value_bits(h0, 1)));
        o[i + 2] = convert(dummy::value_f32(spec, dummy::value_bits(h1, 0)));
        o[i + 3] = convert(dummy::value_f32(spec, dummy::value_bits(h1, 1)));
      }
      for (; i < e; ++i) {
        o[i] = convert(dummy::value_f32(
            spec, dummy::value_bits(dummy::element_bits(base, uint64_t(i / 2)), uint64_t(i))));
      }
    };
    if (dt == DType::bf16) {
      run(static_cast<uint16_t*>(out), [](float v) { return dummy::bf16_rne(v); });
    } else {
      run(static_cast<float*>(out), [](float v) { return v; });
    }
  });
}

}  // namespace dsaserve::kernels::cpu
