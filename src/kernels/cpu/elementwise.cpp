// Row-wise CPU operators: embedding, RMSNorm (+ fused residual add), LayerNorm, SiLU-and-mul, argmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

// A 1-D norm weight as f32 (bf16 or f32 storage).
std::vector<float> vec_f32(const Tensor& w, int64_t n, const char* what) {
  DSA_CHECK(w.defined() && w.device() == Device::cpu && w.dim() == 1 && w.size(0) == n && w.is_contiguous(),
            "{}: expected a contiguous CPU vector of {} values, got {}", what, n,
            w.defined() ? w.describe() : "undefined");
  std::vector<float> out(static_cast<size_t>(n));
  WeightRef ref{w.view({1, n}), {}, 128, 128};
  check_weight(ref, what);
  weight_row(ref, 0, 0, n, out.data());
  return out;
}

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

void rms_row(const float* x, const float* w, int64_t n, double eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * double(x[i]);
  const float r = float(1.0 / std::sqrt(ss / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids) {
  DSA_CHECK(table.defined() && table.dim() == 2 && table.is_contiguous(), "embedding: table must be 2-D");
  const int32_t* id = i32_data(ids, "embedding ids");
  const int64_t T = ids.size(0), V = table.size(0), H = table.size(1);
  for (int64_t t = 0; t < T; ++t) {
    DSA_CHECK(id[t] >= 0 && id[t] < V, "token id {} at index {} is out of range [0, {})", id[t], t, V);
  }
  Tensor out = Tensor::empty({T, H}, DType::f32);
  float* o = out.data<float>();
  const WeightRef ref{table, {}, 128, 128};
  check_weight(ref, "embedding table");
  parallel_for(T, row_grain(H), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) weight_row(ref, id[t], 0, H, o + t * H);
  });
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  const Rows xr = as_rows(x, "rms_norm input");
  const std::vector<float> wv = vec_f32(w, xr.cols, "rms_norm weight");
  Tensor out = Tensor::empty({xr.rows, xr.cols}, DType::f32);
  float* o = out.data<float>();
  parallel_for(xr.rows, row_grain(xr.cols), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) rms_row(xr.row(t), wv.data(), xr.cols, eps, o + t * xr.cols);
  });
  return out;
}

Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) {
  const Rows rr = as_rows(residual, "add_rms_norm residual");
  const Rows xr = as_rows(x, "add_rms_norm input");
  DSA_CHECK(rr.rows == xr.rows && rr.cols == xr.cols, "add_rms_norm: residual {} and input {} differ",
            residual.describe(), x.describe());
  const std::vector<float> wv = vec_f32(w, xr.cols, "rms_norm weight");
  Tensor out = Tensor::empty({xr.rows, xr.cols}, DType::f32);
  float* o = out.data<float>();
  parallel_for(xr.rows, row_grain(xr.cols), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* r = rr.row(t);
      const float* xi = xr.row(t);
      for (int64_t i = 0; i < xr.cols; ++i) r[i] += xi[i];
      rms_row(r, wv.data(), xr.cols, eps, o + t * xr.cols);
    }
  });
  return out;
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Rows xr = as_rows(x, "layer_norm input");
  const std::vector<float> wv = vec_f32(w, xr.cols, "layer_norm weight");
  const std::vector<float> bv = vec_f32(b, xr.cols, "layer_norm bias");
  Tensor out = Tensor::empty({xr.rows, xr.cols}, DType::f32);
  float* o = out.data<float>();
  const int64_t n = xr.cols;
  parallel_for(xr.rows, row_grain(n), [&](int64_t tb, int64_t te) {
    for (int64_t t = tb; t < te; ++t) {
      const float* xi = xr.row(t);
      double mean = 0.0;
      for (int64_t i = 0; i < n; ++i) mean += xi[i];
      mean /= double(n);
      double var = 0.0;
      for (int64_t i = 0; i < n; ++i) var += (xi[i] - mean) * (xi[i] - mean);
      var /= double(n);
      const double r = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < n; ++i)
        o[t * n + i] = float((xi[i] - mean) * r * wv[size_t(i)] + bv[size_t(i)]);
    }
  });
  return out;
}

Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  const Rows g = as_rows(gate, "silu_mul gate");
  const Rows u = as_rows(up, "silu_mul up");
  DSA_CHECK(g.rows == u.rows && g.cols == u.cols, "silu_mul: gate {} and up {} differ", gate.describe(),
            up.describe());
  Tensor out = Tensor::empty({g.rows, g.cols}, DType::f32);
  float* o = out.data<float>();
  parallel_for(g.rows, row_grain(g.cols), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* gi = g.row(t);
      const float* ui = u.row(t);
      for (int64_t i = 0; i < g.cols; ++i) o[t * g.cols + i] = gi[i] / (1.0f + std::exp(-gi[i])) * ui[i];
    }
  });
  return out;
}

Tensor argmax(const Tensor& x) {
  const Rows xr = as_rows(x, "argmax input");
  DSA_CHECK(xr.cols > 0, "argmax of an empty row");
  Tensor out = Tensor::empty({xr.rows}, DType::i32);
  int32_t* o = out.data<int32_t>();
  for (int64_t t = 0; t < xr.rows; ++t) {
    const float* r = xr.row(t);
    int64_t best = 0;
    for (int64_t i = 1; i < xr.cols; ++i) {
      if (r[i] > r[best]) best = i;
    }
    o[t] = int32_t(best);
  }
  return out;
}

void add_inplace(Tensor& a, const Tensor& b) {
  const Rows ar = as_rows(a, "add_inplace target");
  const Rows br = as_rows(b, "add_inplace source");
  DSA_CHECK(ar.rows == br.rows && ar.cols == br.cols, "add_inplace: {} and {} differ", a.describe(),
            b.describe());
  parallel_for(ar.rows, row_grain(ar.cols), [&](int64_t rb, int64_t re) {
    for (int64_t t = rb; t < re; ++t) {
      float* d = ar.row(t);
      const float* s = br.row(t);
      for (int64_t i = 0; i < ar.cols; ++i) d[i] += s[i];
    }
  });
}

void copy_rows(Tensor& dst, const Tensor& src) {
  const Rows dr = as_rows(dst, "copy_rows target");
  const Rows sr = as_rows(src, "copy_rows source");
  DSA_CHECK(dr.rows == sr.rows && dr.cols == sr.cols, "copy_rows: {} into {}", src.describe(),
            dst.describe());
  for (int64_t t = 0; t < dr.rows; ++t) std::copy_n(sr.row(t), sr.cols, dr.row(t));
}

Tensor gather_rows(const Tensor& x, const Tensor& idx) {
  const Rows xr = as_rows(x, "gather_rows input");
  const int32_t* id = i32_data(idx, "gather_rows indices");
  const int64_t m = idx.size(0);
  Tensor out = Tensor::empty({m, xr.cols}, DType::f32);
  for (int64_t i = 0; i < m; ++i) {
    DSA_CHECK(id[i] >= 0 && id[i] < xr.rows, "gather_rows: row {} outside [0, {})", id[i], xr.rows);
    std::copy_n(xr.row(id[i]), xr.cols, out.data<float>() + i * xr.cols);
  }
  return out;
}

}  // namespace dsaserve::kernels::cpu
