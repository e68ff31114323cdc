// Linear layers on the CPU: y = x @ W^T (and x @ W for MLA's absorbed projection), W read as stored.
//
// The weight is processed in tiles of kTileRows rows, dequantised once per tile into a thread-local f32
// buffer (never the whole matrix), then every input row is multiplied against the tile with four rows at
// a time sharing each load of x and two inputs sharing each load of W (gemm_nt): the inner loops are
// fixed-width and vectorise without -ffast-math.
//
// Opt-in (an Fp8Emulation argument): the CUDA backend's FP8 activation arithmetic, for the linears it runs in
// FP8.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

constexpr int64_t kTileRows = 16;
constexpr int64_t kFp8Group = 128;
constexpr float kE4m3Max = 448.0f;

// The emulation settings for this call of linear, or null when they do not apply.
const Fp8Emulation* emulation_for(const Fp8Emulation* e, const WeightRef& w, int64_t r0, int64_t r1) {
  if (!e || !e->enabled || !fp8_gemm_eligible(w, r0, r1)) return nullptr;
  if (e->select && !e->select(w)) return nullptr;
  return e;
}

Tensor make_out(Tensor out, int64_t rows, int64_t cols, const char* what) {
  if (!out.defined()) return Tensor::empty({rows, cols}, DType::f32);
  const Rows o = as_rows(out, what);
  DSA_CHECK(o.rows == rows && o.cols == cols, "{}: output {} should be [{}, {}]", what, out.describe(), rows,
            cols);
  return out;
}

}  // namespace

bool fp8_gemm_eligible(const WeightRef& w, int64_t r0, int64_t r1) {
  if (r1 < 0) r1 = w.rows();
  return w.weight.dtype() == DType::f8e4m3fn && w.block_n == 128 && w.block_k == 128 && w.cols() % 128 == 0 &&
         r0 % 128 == 0 && (r1 - r0) % 8 == 0;
}

float fp8_act_scale(float amax) {
  const float s = amax / kE4m3Max;
  return s > 0.0f ? s : 1.0f;  // all zeros, or an amax whose scale underflows: 1 (quant.cu's rule)
}

void fp8_quantize(const float* x, int64_t n, float s, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = f32_to_f8e4m3fn_sat(x[i] / s);
}

namespace {
// Largest magnitude of n values; fmax as the GPU's fmaxf (a NaN input does not win).
float amax_of(const float* p, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(p[i]));
  return m;
}
}  // namespace

void fp8_quantize_row128(const float* x, int64_t K, uint8_t* codes, float* scales, int64_t scale_stride) {
  DSA_CHECK(K % kFp8Group == 0, "fp8_quantize_row128: {} columns are not whole groups of {}", K, kFp8Group);
  for (int64_t g = 0; g < K / kFp8Group; ++g) {
    const float s = fp8_act_scale(amax_of(x + g * kFp8Group, kFp8Group));
    scales[g * scale_stride] = s;
    fp8_quantize(x + g * kFp8Group, kFp8Group, s, codes + g * kFp8Group);
  }
}

Tensor fp8_quant_dequant(const Tensor& x, Fp8ActScale scale) {
  const Rows xr = as_rows(x, "fp8_quant_dequant input");
  const int64_t T = xr.rows, K = xr.cols;
  DSA_CHECK(scale != Fp8ActScale::none, "fp8_quant_dequant: no scale granularity given");
  const int64_t group = scale == Fp8ActScale::group128 ? kFp8Group : K;
  DSA_CHECK(scale != Fp8ActScale::group128 || K % kFp8Group == 0,
            "fp8_quant_dequant: {} columns are not whole groups of {}", K, kFp8Group);
  // Largest magnitude of each (row, group): amax_of.
  float tensor_scale = 1.0f;
  if (scale == Fp8ActScale::tensor) {
    float m = 0.0f;
    for (int64_t t = 0; t < T; ++t) m = std::fmax(m, amax_of(xr.row(t), K));
    tensor_scale = fp8_act_scale(m);
  }
  Tensor out = Tensor::empty({T, K}, DType::f32);
  float* o = out.data<float>();
  std::vector<uint8_t> q(static_cast<size_t>(group > 0 ? group : 1));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t g0 = 0; g0 < K; g0 += group) {
      const float* src = xr.row(t) + g0;
      const float s = scale == Fp8ActScale::tensor ? tensor_scale : fp8_act_scale(amax_of(src, group));
      fp8_quantize(src, group, s, q.data());
      float* dst = o + t * K + g0;
      for (int64_t i = 0; i < group; ++i) dst[i] = f8e4m3fn_to_f32(q[size_t(i)]) * s;
    }
  }
  return out;
}

Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
              const Fp8Emulation* e) {
  check_weight(w, "linear");
  if (r1 < 0) r1 = w.rows();
  DSA_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "linear: rows [{}, {}) outside weight {}", r0, r1,
            w.weight.describe());
  const Rows xr = as_rows(x, "linear input");
  const int64_t K = w.cols();
  DSA_CHECK(xr.cols == K, "linear: input {} does not match weight {} (in features {})", x.describe(),
            w.weight.describe(), K);
  const int64_t N = r1 - r0, T = xr.rows;
  out = make_out(std::move(out), T, N, "linear output");
  const Rows o = as_rows(out, "linear output");
  if (T == 0 || N == 0) return out;
  // FP8 emulation (off by default): the GEMM reads the FP8 value of x instead of x.
  const Fp8Emulation* emu = emulation_for(e, w, r0, r1);
  const bool quantise = emu && emu->scale != Fp8ActScale::none;
  const Tensor xq = quantise ? fp8_quant_dequant(x, emu->scale) : Tensor();
  const Rows xin = quantise ? as_rows(xq, "linear input") : xr;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  parallel_for(tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> buf(size_t(kTileRows * K));
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t n0 = tile * kTileRows, n1 = std::min(N, n0 + kTileRows);
      const int64_t nr = n1 - n0;
      for (int64_t r = 0; r < nr; ++r) weight_row(w, r0 + n0 + r, 0, K, buf.data() + r * K);
      gemm_nt(xin.p, xin.stride, T, buf.data(), nr, K, o.p + n0, o.stride);
    }
  });
  if (emu && emu->bf16_output) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = o.row(t);
      for (int64_t c = 0; c < N; ++c) row[c] = bf16_to_f32(f32_to_bf16(row[c]));
    }
  }
  return out;
}

Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) {
  check_weight(w, "linear_t");
  DSA_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "linear_t: rows [{}, {}) outside weight {}", r0, r1,
            w.weight.describe());
  const Rows xr = as_rows(x, "linear_t input");
  const int64_t R = r1 - r0, C = w.cols(), T = xr.rows;
  DSA_CHECK(xr.cols == R, "linear_t: input {} should have {} columns", x.describe(), R);
  out = make_out(std::move(out), T, C, "linear_t output");
  const Rows o = as_rows(out, "linear_t output");
  if (T == 0 || C == 0) return out;
  constexpr int64_t kCols = 128;
  const int64_t chunks = (C + kCols - 1) / kCols;
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    std::vector<float> wbuf(static_cast<size_t>(kCols));
    std::vector<float> acc(size_t(T * kCols));
    for (int64_t chunk = cb; chunk < ce; ++chunk) {
      const int64_t c0 = chunk * kCols, c1 = std::min(C, c0 + kCols), nc = c1 - c0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t r = 0; r < R; ++r) {
        weight_row(w, r0 + r, c0, c1, wbuf.data());
        for (int64_t t = 0; t < T; ++t) {
          const float xv = xr.row(t)[r];
          float* a = acc.data() + t * kCols;
          for (int64_t c = 0; c < nc; ++c) a[c] += xv * wbuf[size_t(c)];
        }
      }
      for (int64_t t = 0; t < T; ++t) std::copy_n(acc.data() + t * kCols, nc, o.row(t) + c0);
    }
  });
  return out;
}

}  // namespace dsaserve::kernels::cpu
