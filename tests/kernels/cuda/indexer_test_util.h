#pragma once
// Helpers shared by the attention and indexer GPU tests: a seeded generator, bf16-exact random tensors,
// ragged batches paged over a shuffled pool, and the indexer selection check against the CPU operator.
#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <numeric>
#include <set>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cuda/indexer/indexer_topk_params.h"

namespace dsaserve::kernels::cuda::test_util {

inline constexpr int64_t kPage = 64;

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 7) {}
  uint64_t next() { return splitmix64(s); }
  float uniform() { return float(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// f32 CPU tensor of U(-amp, amp) values rounded to bf16 (so the kernels' bf16 inputs are exact).
inline Tensor rand_bf16_values(const Shape& shape, Rng& r, float amp) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = round_bf16(r.uniform() * amp);
  return t;
}

// A bf16 CPU copy of an f32 CPU tensor (exact when its values are bf16-rounded).
inline Tensor bf16_copy(const Tensor& f32) {
  Tensor t = Tensor::empty(f32.shape(), DType::bf16);
  for (int64_t i = 0; i < f32.numel(); ++i) t.data_u16()[i] = f32_to_bf16(f32.data<float>()[i]);
  return t;
}

// Pages of a ragged batch scattered over a shuffled pool; page_table [B, max_pages] (unused: 0).
struct Paging {
  std::vector<int64_t> lens;
  int64_t max_pages = 1, num_pages = 0;
  std::vector<int32_t> pt;
  int64_t slot(size_t b, int64_t pos) const {
    return int64_t(pt[b * size_t(max_pages) + size_t(pos / kPage)]) * kPage + pos % kPage;
  }
  Tensor table_gpu() const {
    Tensor t = Tensor::empty({int64_t(lens.size()), max_pages}, DType::i32);
    std::copy(pt.begin(), pt.end(), t.data<int32_t>());
    return t.to(Device::cuda);
  }
  Tensor row_cpu(size_t b) const {
    Tensor t = Tensor::empty({max_pages}, DType::i32);
    std::copy_n(pt.begin() + ptrdiff_t(b * size_t(max_pages)), max_pages, t.data<int32_t>());
    return t;
  }
};

inline Paging make_paging(const std::vector<int64_t>& lens, Rng& r) {
  Paging pg;
  pg.lens = lens;
  int64_t used = 0;
  for (int64_t n : lens) {
    pg.max_pages = std::max(pg.max_pages, (n + kPage - 1) / kPage);
    used += (n + kPage - 1) / kPage;
  }
  pg.num_pages = used + 3;
  std::vector<int32_t> perm(size_t(pg.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(r.below(int64_t(i)))]);
  pg.pt.assign(lens.size() * size_t(pg.max_pages), 0);
  size_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b) {
    for (int64_t j = 0; j < (lens[b] + kPage - 1) / kPage; ++j)
      pg.pt[b * size_t(pg.max_pages) + size_t(j)] = perm[next++];
  }
  return pg;
}

inline Tensor gpu_i32(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::cuda);
}

// Exact score in double of key position s for query row t (for judging near-ties).
inline double exact_score(const Tensor& q, const Tensor& w, int64_t t, const float* key, double scale,
                          double ws) {
  const int64_t ih = q.size(1);
  double acc = 0;
  for (int64_t h = 0; h < ih; ++h) {
    const float* qh = q.data<float>() + (t * ih + h) * kIndexerDim;
    double d = 0;
    for (int j = 0; j < kIndexerDim; ++j) d += double(qh[j]) * double(key[j]);
    d *= scale;
    if (d > 0) acc += d * double(w.data<float>()[t * ih + h]) * ws;
  }
  return acc;
}

// GPU selection row vs the CPU op's row: identical, or differing only where the exact scores tie within
// float rounding. Returns the number of differing positions (-1 when invalid).
inline int64_t check_selection(const int32_t* got, const int32_t* want, int64_t k, int64_t n, const Tensor& q,
                               const Tensor& w, int64_t t, const std::function<const float*(int64_t)>& key,
                               double scale, double ws, double* worst_gap) {
  std::vector<int32_t> g(got, got + k), c(want, want + k);
  for (int64_t j = 0; j < k; ++j) {
    if (j > 0 && g[size_t(j)] >= 0 && g[size_t(j)] <= g[size_t(j - 1)]) return -1;  // ascending, distinct
    if (g[size_t(j)] >= n || (g[size_t(j)] < 0 && j < std::min(k, n))) return -1;
  }
  std::vector<int32_t> only_g, only_c;
  std::sort(g.begin(), g.end());
  std::sort(c.begin(), c.end());
  std::set_difference(g.begin(), g.end(), c.begin(), c.end(), std::back_inserter(only_g));
  std::set_difference(c.begin(), c.end(), g.begin(), g.end(), std::back_inserter(only_c));
  *worst_gap = 0;
  for (int32_t x : only_g) {
    for (int32_t y : only_c) {
      const double sx = exact_score(q, w, t, key(x), scale, ws), sy = exact_score(q, w, t, key(y), scale, ws);
      // Equal scores must go to the lower position; otherwise only float rounding may separate them.
      if (sx == sy && x > y) *worst_gap = INFINITY;
      *worst_gap = std::max(*worst_gap, (sy - sx) / std::max(1e-30, std::fabs(sy)));
    }
  }
  return int64_t(only_g.size());
}

}  // namespace dsaserve::kernels::cuda::test_util
