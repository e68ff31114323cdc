// Shared helpers of the CPU kernels: tensor views, weight dequantisation, dot products.
#include <array>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

// fp8 e4m3fn -> f32 for all 256 codes.
const std::array<float, 256>& f8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = f8e4m3fn_to_f32(uint8_t(i));
    return t;
  }();
  return table;
}

}  // namespace

Rows as_rows(const Tensor& t, const char* what) {
  DSA_CHECK(t.defined(), "{}: tensor is undefined", what);
  DSA_CHECK(t.device() == Device::cpu, "{}: expected a CPU tensor, got {}", what, t.describe());
  DSA_CHECK(t.dtype() == DType::f32, "{}: expected f32, got {}", what, t.describe());
  DSA_CHECK(t.dim() == 2, "{}: expected 2-D [rows, cols], got {}", what, t.describe());
  DSA_CHECK(t.stride(1) == 1 || t.size(1) <= 1, "{}: last dimension must be contiguous ({})", what,
            t.describe());
  return Rows{static_cast<float*>(t.raw_data()), t.size(0), t.size(1), t.stride(0)};
}

Rows3 as_rows3(const Tensor& t, const char* what) {
  DSA_CHECK(t.defined(), "{}: tensor is undefined", what);
  DSA_CHECK(t.device() == Device::cpu, "{}: expected a CPU tensor, got {}", what, t.describe());
  DSA_CHECK(t.dtype() == DType::f32, "{}: expected f32, got {}", what, t.describe());
  DSA_CHECK(t.dim() == 3, "{}: expected 3-D, got {}", what, t.describe());
  DSA_CHECK(t.stride(2) == 1 || t.size(2) <= 1, "{}: last dimension must be contiguous ({})", what,
            t.describe());
  return Rows3{static_cast<float*>(t.raw_data()), t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1)};
}

const int32_t* i32_data(const Tensor& t, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cpu && t.dtype() == DType::i32 && t.dim() == 1 &&
                (t.stride(0) == 1 || t.size(0) <= 1),
            "{}: expected a contiguous CPU i32 vector, got {}", what,
            t.defined() ? t.describe() : "undefined");
  return static_cast<const int32_t*>(t.raw_data());
}

void check_weight(const WeightRef& w, const char* what) {
  DSA_CHECK(w.weight.defined(), "{}: weight is undefined", what);
  DSA_CHECK(w.weight.device() == Device::cpu, "{}: expected a CPU weight, got {}", what, w.weight.describe());
  DSA_CHECK(w.weight.dim() == 2 && w.weight.is_contiguous(), "{}: weight must be contiguous 2-D, got {}",
            what, w.weight.describe());
  const DType dt = w.weight.dtype();
  if (dt == DType::f8e4m3fn) {
    DSA_CHECK(w.scale_inv.defined() && w.scale_inv.dtype() == DType::f32 && w.scale_inv.is_contiguous() &&
                  w.scale_inv.dim() == 2,
              "{}: fp8 weight {} needs an f32 2-D scale_inv", what, w.weight.describe());
    DSA_CHECK(w.block_n > 0 && w.block_k > 0, "{}: bad fp8 block size", what);
    const int64_t sn = (w.rows() + w.block_n - 1) / w.block_n, sk = (w.cols() + w.block_k - 1) / w.block_k;
    DSA_CHECK(w.scale_inv.size(0) == sn && w.scale_inv.size(1) == sk,
              "{}: scale_inv {} does not match {} blocks", what, w.scale_inv.describe(), shape_str({sn, sk}));
  } else {
    DSA_CHECK(dt == DType::bf16 || dt == DType::f32, "{}: unsupported weight dtype {}", what, dtype_name(dt));
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSA_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DSA_CLONES
#endif

// bf16 -> f32 is a 16-bit shift; written on integers so that it vectorises.
DSA_CLONES static void bf16_row(const uint16_t* src, int64_t n, float* out) {
  static_assert(sizeof(float) == sizeof(uint32_t));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(out + i, &u, sizeof(u));
  }
}

void weight_row(const WeightRef& w, int64_t r, int64_t c0, int64_t c1, float* out) {
  const int64_t cols = w.cols();
  switch (w.weight.dtype()) {
    case DType::f32: {
      const float* src = static_cast<const float*>(w.weight.raw_data()) + r * cols;
      for (int64_t c = c0; c < c1; ++c) out[c - c0] = src[c];
      break;
    }
    case DType::bf16:
      bf16_row(static_cast<const uint16_t*>(w.weight.raw_data()) + r * cols + c0, c1 - c0, out);
      break;
    case DType::f8e4m3fn: {
      const auto& lut = f8_table();
      const uint8_t* src = static_cast<const uint8_t*>(w.weight.raw_data()) + r * cols;
      const float* scales =
          static_cast<const float*>(w.scale_inv.raw_data()) + (r / w.block_n) * w.scale_inv.size(1);
      int64_t c = c0;
      while (c < c1) {
        const int64_t blk = c / w.block_k;
        const int64_t end = std::min(c1, (blk + 1) * w.block_k);
        const float s = scales[blk];
        for (; c < end; ++c) out[c - c0] = lut[src[c]] * s;
      }
      break;
    }
    default: fail("unsupported weight dtype {}", dtype_name(w.weight.dtype()));
  }
}

namespace {

constexpr int kLanes = 8;

// Sums of x0.w{0..3} and x1.w{0..3} over n floats; lane j of every accumulator sees elements j, j+8, ...
inline void micro_2x4(const float* x0, const float* x1, const float* w0, const float* w1, const float* w2,
                      const float* w3, int64_t n, float* o0, float* o1) {
  float a[8][kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float u = x0[i + j], v = x1[i + j];
      a[0][j] += u * w0[i + j];
      a[1][j] += u * w1[i + j];
      a[2][j] += u * w2[i + j];
      a[3][j] += u * w3[i + j];
      a[4][j] += v * w0[i + j];
      a[5][j] += v * w1[i + j];
      a[6][j] += v * w2[i + j];
      a[7][j] += v * w3[i + j];
    }
  }
  float s[8];
  for (int k = 0; k < 8; ++k) {
    float t = 0.0f;
    for (int j = 0; j < kLanes; ++j) t += a[k][j];
    s[k] = t;
  }
  for (; i < n; ++i) {
    s[0] += x0[i] * w0[i];
    s[1] += x0[i] * w1[i];
    s[2] += x0[i] * w2[i];
    s[3] += x0[i] * w3[i];
    s[4] += x1[i] * w0[i];
    s[5] += x1[i] * w1[i];
    s[6] += x1[i] * w2[i];
    s[7] += x1[i] * w3[i];
  }
  for (int k = 0; k < 4; ++k) {
    o0[k] = s[k];
    o1[k] = s[4 + k];
  }
}

inline float dot_impl(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

DSA_CLONES void gemm_nt(const float* x, int64_t sx, int64_t T, const float* w, int64_t N, int64_t K,
                        float* out, int64_t so) {
  float o0[4], o1[4];
  int64_t t = 0;
  for (; t + 2 <= T; t += 2) {
    const float* x0 = x + t * sx;
    const float* x1 = x0 + sx;
    int64_t r = 0;
    for (; r + 4 <= N; r += 4) {
      const float* wr = w + r * K;
      micro_2x4(x0, x1, wr, wr + K, wr + 2 * K, wr + 3 * K, K, o0, o1);
      for (int k = 0; k < 4; ++k) {
        out[t * so + r + k] = o0[k];
        out[(t + 1) * so + r + k] = o1[k];
      }
    }
    for (; r < N; ++r) {
      out[t * so + r] = dot_impl(x0, w + r * K, K);
      out[(t + 1) * so + r] = dot_impl(x1, w + r * K, K);
    }
  }
  if (t < T) {
    const float* x0 = x + t * sx;
    int64_t r = 0;
    for (; r + 4 <= N; r += 4) {
      const float* wr = w + r * K;
      micro_2x4(x0, x0, wr, wr + K, wr + 2 * K, wr + 3 * K, K, o0, o1);
      for (int k = 0; k < 4; ++k) out[t * so + r + k] = o0[k];
    }
    for (; r < N; ++r) out[t * so + r] = dot_impl(x0, w + r * K, K);
  }
}

DSA_CLONES float dot(const float* a, const float* b, int64_t n) { return dot_impl(a, b, n); }

}  // namespace dsaserve::kernels::cpu
