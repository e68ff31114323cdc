// Linear layers on the CPU: y = x @ W^T (and x @ W for MLA's absorbed projection), W read as stored.
//
// The weight is processed in tiles of kTileRows rows, dequantised once per tile into a thread-local f32
// buffer (never the whole matrix), then every input row is multiplied against the tile with four rows at
// a time sharing each load of x and two inputs sharing each load of W (gemm_nt): the inner loops are
// fixed-width and vectorise without -ffast-math.
#include <algorithm>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

constexpr int64_t kTileRows = 16;
Tensor make_out(Tensor out, int64_t rows, int64_t cols, const char* what) {
  if (!out.defined()) return Tensor::empty({rows, cols}, DType::f32);
  const Rows o = as_rows(out, what);
  DSA_CHECK(o.rows == rows && o.cols == cols, "{}: output {} should be [{}, {}]", what, out.describe(), rows,
            cols);
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) {
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
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  parallel_for(tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> buf(size_t(kTileRows * K));
    for (int64_t tile = tb; tile < te; ++tile) {
      const int64_t n0 = tile * kTileRows, n1 = std::min(N, n0 + kTileRows);
      const int64_t nr = n1 - n0;
      for (int64_t r = 0; r < nr; ++r) weight_row(w, r0 + n0 + r, 0, K, buf.data() + r * K);
      gemm_nt(xr.p, xr.stride, T, buf.data(), nr, K, o.p + n0, o.stride);
    }
  });
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
