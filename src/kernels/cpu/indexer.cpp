// The DSA indexer on the CPU: weighted ReLU scores of every visible key, causal top-k per query.
#include <algorithm>
#include <numeric>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale) {
  const Rows3 qv = as_rows3(q, "indexer q");
  const Rows wv = as_rows(w, "indexer weights");
  const int64_t T = qv.n0, ih = qv.n1, id = qv.n2;
  DSA_CHECK(wv.rows == T && wv.cols == ih, "indexer: weights {} should be [{}, {}]", w.describe(), T, ih);
  DSA_CHECK(topk > 0 && start_pos >= 0, "indexer: topk {} and start position {} must be positive", topk,
            start_pos);
  const int64_t S = start_pos + T;
  const Tensor k_all = cpu::paged_gather(keys, S);  // [S, id]
  DSA_CHECK(k_all.size(1) == id, "indexer: key cache rows of {} values, queries of {}", k_all.size(1), id);
  const float* k = k_all.data<float>();
  const int64_t kout = std::min(topk, S);
  Tensor out = Tensor::empty({T, kout}, DType::i32);
  int32_t* o = out.data<int32_t>();
  const float sc = float(scale), ws = float(weight_scale);
  parallel_for(T, 1, [&](int64_t b, int64_t e) {
    std::vector<float> score;
    std::vector<int32_t> idx;
    std::vector<float> wt(static_cast<size_t>(ih));
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = start_pos + t + 1;  // visible keys
      int32_t* row = o + t * kout;
      if (n <= topk) {
        for (int64_t j = 0; j < kout; ++j) row[j] = j < n ? int32_t(j) : -1;
        continue;
      }
      for (int64_t h = 0; h < ih; ++h) wt[size_t(h)] = wv.row(t)[h] * ws;
      score.assign(size_t(n), 0.0f);
      for (int64_t s = 0; s < n; ++s) {
        const float* ks = k + s * id;
        float acc = 0.0f;
        for (int64_t h = 0; h < ih; ++h) {
          const float d = dot(qv.at(t, h), ks, id) * sc;
          if (d > 0.0f) acc += d * wt[size_t(h)];
        }
        score[size_t(s)] = acc;
      }
      idx.resize(size_t(n));
      std::iota(idx.begin(), idx.end(), 0);
      // Highest score first; equal scores: lower position first.
      std::nth_element(idx.begin(), idx.begin() + topk, idx.end(), [&](int32_t a, int32_t c) {
        return score[size_t(a)] > score[size_t(c)] || (score[size_t(a)] == score[size_t(c)] && a < c);
      });
      std::sort(idx.begin(), idx.begin() + topk);
      std::copy_n(idx.begin(), topk, row);
    }
  });
  return out;
}

}  // namespace dsaserve::kernels::cpu
