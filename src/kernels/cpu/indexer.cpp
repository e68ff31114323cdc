// The DSA indexer on the CPU: weighted ReLU scores of every visible key, causal top-k per query; and the
// FP8 index-key format (indexer_key_fp8.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/indexer_key_fp8.h"

namespace dsaserve::kernels::cpu {

Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale, const TopkObserver* observer) {
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
  // Pass 1: scores of (query, block of kBlock keys) work items; q_t [ih, id] x keys^T as one small GEMM.
  constexpr int64_t kBlock = 64;
  std::vector<std::pair<int32_t, int32_t>> items;  // (t, first key)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n = start_pos + t + 1;
    if (n <= topk) continue;
    for (int64_t s0 = 0; s0 < n; s0 += kBlock) items.emplace_back(int32_t(t), int32_t(s0));
  }
  std::vector<float> score(static_cast<size_t>(T * S));
  parallel_for(int64_t(items.size()), 1, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(ih * kBlock));
    for (int64_t it = b; it < e; ++it) {
      const int64_t t = items[size_t(it)].first, s0 = items[size_t(it)].second;
      const int64_t nb = std::min(kBlock, start_pos + t + 1 - s0);
      gemm_nt(qv.at(t, 0), qv.s1, ih, k + s0 * id, nb, id, tmp.data(), kBlock);  // [ih, nb]
      const float* wrow = wv.row(t);
      float* out_s = score.data() + t * S + s0;
      std::fill_n(out_s, nb, 0.0f);
      for (int64_t h = 0; h < ih; ++h) {  // heads in order: the same sum for every key
        const float wh = wrow[h] * ws;
        const float* th = tmp.data() + h * kBlock;
        for (int64_t j = 0; j < nb; ++j) {
          const float d = th[j] * sc;
          out_s[j] += d > 0.0f ? d * wh : 0.0f;
        }
      }
    }
  });
  // Pass 2: top-k per query.
  parallel_for(T, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> idx;
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = start_pos + t + 1;  // visible keys
      int32_t* row = o + t * kout;
      if (n <= topk) {
        for (int64_t j = 0; j < kout; ++j) row[j] = j < n ? int32_t(j) : -1;
        continue;
      }
      const float* sr = score.data() + t * S;
      idx.resize(size_t(n));
      std::iota(idx.begin(), idx.end(), 0);
      // Highest score first; equal scores: lower position first.
      std::nth_element(idx.begin(), idx.begin() + topk, idx.end(),
                       [&](int32_t a, int32_t c) { return sr[a] > sr[c] || (sr[a] == sr[c] && a < c); });
      std::sort(idx.begin(), idx.begin() + topk);
      std::copy_n(idx.begin(), topk, row);
    }
  });
  if (observer) {
    Tensor scores = Tensor::empty({T, S}, DType::f32);
    std::fill_n(scores.data<float>(), T * S, std::numeric_limits<float>::quiet_NaN());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = start_pos + t + 1;
      if (n > topk) std::copy_n(score.data() + t * S, n, scores.data<float>() + t * S);
    }
    (*observer)("indexer_topk", scores, out);
  }
  return out;
}

}  // namespace dsaserve::kernels::cpu

namespace dsaserve::kernels::cpu {

float indexer_key_fp8_quantize(const float* k, int64_t dim, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t d = 0; d < dim; ++d) amax = std::fmax(amax, std::fabs(k[d]));  // fmaxf: a NaN does not win
  const float s = fp8_act_scale(amax);
  fp8_quantize(k, dim, s, codes);
  return s;
}

Tensor indexer_key_fp8_encode(const Tensor& keys) {
  const Rows kr = as_rows(keys, "indexer_key_fp8_encode keys");
  const int64_t n = kr.rows, dim = kr.cols;
  Tensor out = Tensor::zeros({n, dim + 4}, DType::u8);
  uint8_t* codes = out.data_u8();
  float* scales = reinterpret_cast<float*>(codes + n * dim);  // 4-byte aligned: n * dim is a multiple of 4
  DSA_CHECK(dim % 4 == 0, "indexer_key_fp8_encode: key width {} should be a multiple of 4", dim);
  for (int64_t i = 0; i < n; ++i) scales[i] = indexer_key_fp8_quantize(kr.row(i), dim, codes + i * dim);
  return out;
}

Tensor indexer_key_fp8_decode(const Tensor& cache) {
  DSA_CHECK(cache.defined() && cache.device() == Device::cpu && cache.dtype() == DType::u8 &&
                cache.dim() == 2 && cache.is_contiguous() && cache.size(1) > 4 &&
                (cache.size(1) - 4) % 4 == 0,
            "indexer_key_fp8_decode: expected a contiguous CPU u8 [n, dim + 4] cache, got {}",
            cache.defined() ? cache.describe() : std::string("nothing"));
  const int64_t n = cache.size(0), dim = cache.size(1) - 4;
  const uint8_t* codes = cache.data_u8();
  const float* scales = reinterpret_cast<const float*>(codes + n * dim);
  Tensor out = Tensor::empty({n, dim}, DType::f32);
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) o[i * dim + d] = f8e4m3fn_to_f32(codes[i * dim + d]) * scales[i];
  return out;
}

}  // namespace dsaserve::kernels::cpu
