// fill_dummy on the CPU: core/dummy_fill.h's values, in parallel (each element depends only on its index).
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
  parallel_for(n, int64_t(1) << 16, [&](int64_t b, int64_t e) {
    if (dt == DType::bf16) {
      uint16_t* o = static_cast<uint16_t*>(out);
      for (int64_t i = b; i < e; ++i) o[i] = dummy::bf16_rne(dummy::value_f32(f, dummy::element_bits(base, uint64_t(i))));
    } else if (dt == DType::f32) {
      float* o = static_cast<float*>(out);
      for (int64_t i = b; i < e; ++i) o[i] = dummy::value_f32(f, dummy::element_bits(base, uint64_t(i)));
    } else {
      uint8_t* o = static_cast<uint8_t*>(out);
      for (int64_t i = b; i < e; ++i) o[i] = dummy::fp8_code(dummy::element_bits(base, uint64_t(i)));
    }
  });
}

}  // namespace dsaserve::kernels::cpu
