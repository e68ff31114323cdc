// MLA attention on the CPU: the paged latent cache, the absorbed (MQA) form and the MHA form.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/parallel.h"
#include "kernels/cpu/cpu_ops.h"

namespace dsaserve::kernels::cpu {

namespace {

struct PagedView {
  Rows cache;
  const int32_t* pages = nullptr;
  int64_t n_pages = 0;
  int64_t page_size = 0;
  const float* row(int64_t pos) const { return cache.row(paged_slot(pages, page_size, pos)); }
};

PagedView paged_view(const PagedSeq& seq, int64_t n, const char* what) {
  PagedView v;
  v.cache = as_rows(seq.cache, what);
  v.pages = i32_data(seq.page_table, what);
  v.n_pages = seq.page_table.size(0);
  v.page_size = seq.page_size;
  DSA_CHECK(seq.page_size > 0, "{}: page size must be positive", what);
  DSA_CHECK(n <= v.n_pages * seq.page_size, "{}: {} positions need {} pages, the page table has {}", what, n,
            (n + seq.page_size - 1) / seq.page_size, v.n_pages);
  const int64_t used = (n + seq.page_size - 1) / seq.page_size;
  const int64_t total_pages = v.cache.rows / seq.page_size;
  for (int64_t i = 0; i < used; ++i) {
    DSA_CHECK(v.pages[i] >= 0 && v.pages[i] < total_pages, "{}: page id {} outside the pool of {} pages",
              what, v.pages[i], total_pages);
  }
  return v;
}

// The key positions row t attends to: sel[t] (skipping -1) or all of 0..last.
void keys_of_row(const Tensor& sel, int64_t t, int64_t last, std::vector<int32_t>& keys) {
  keys.clear();
  if (!sel.defined()) {
    for (int64_t s = 0; s <= last; ++s) keys.push_back(int32_t(s));
    return;
  }
  const int32_t* row = static_cast<const int32_t*>(sel.raw_data()) + t * sel.stride(0);
  for (int64_t j = 0; j < sel.size(1); ++j) {
    if (row[j] >= 0) keys.push_back(row[j]);
  }
}

void check_sel(const Tensor& sel, int64_t T, int64_t start_pos, const char* what) {
  if (!sel.defined()) return;
  DSA_CHECK(sel.device() == Device::cpu && sel.dtype() == DType::i32 && sel.dim() == 2 && sel.size(0) == T &&
                (sel.stride(1) == 1 || sel.size(1) <= 1),
            "{}: selection must be CPU i32 [{}, k], got {}", what, T, sel.describe());
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* row = static_cast<const int32_t*>(sel.raw_data()) + t * sel.stride(0);
    for (int64_t j = 0; j < sel.size(1); ++j) {
      DSA_CHECK(row[j] >= -1 && row[j] <= start_pos + t,
                "{}: selected key {} is not visible from position {}", what, row[j], start_pos + t);
    }
  }
}

// In place: scores -> softmax probabilities; returns nothing. Empty rows are left empty.
void softmax_inplace(std::vector<float>& s) {
  if (s.empty()) return;
  const float m = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (float& v : s) {
    v = std::exp(v - m);
    sum += v;
  }
  const float inv = float(1.0 / sum);
  for (float& v : s) v *= inv;
}

}  // namespace

Tensor mla_latent_fp8_round(const Tensor& rows, int64_t latent) {
  const Rows r = as_rows(rows, "mla_latent_fp8_round rows");
  DSA_CHECK(latent >= 0 && latent % 128 == 0 && latent <= r.cols,
            "mla_latent_fp8_round: {} latent values in rows of {} (a multiple of 128 expected)", latent,
            r.cols);
  Tensor out = Tensor::empty({r.rows, r.cols}, DType::f32);
  for (int64_t i = 0; i < r.rows; ++i) {
    const float* x = r.row(i);
    float* o = out.data<float>() + i * r.cols;
    for (int64_t g = 0; g < latent; g += 128) {
      float amax = 0.0f;
      for (int64_t c = g; c < g + 128; ++c) amax = std::fmax(amax, std::fabs(x[c]));
      const float scale = amax / 448.0f, inv = amax > 0.0f ? 448.0f / amax : 0.0f;
      for (int64_t c = g; c < g + 128; ++c) o[c] = f8e4m3fn_to_f32(f32_to_f8e4m3fn_sat(x[c] * inv)) * scale;
    }
    for (int64_t c = latent; c < r.cols; ++c) o[c] = bf16_to_f32(f32_to_bf16(x[c]));
  }
  return out;
}

void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) {
  const Rows c = as_rows(cache, "paged_store cache");
  const Rows s = as_rows(src, "paged_store source");
  const int32_t* sl = i32_data(slots, "paged_store slots");
  DSA_CHECK(slots.size(0) == s.rows && s.cols == c.cols, "paged_store: {} slots, source {}, cache {}",
            slots.size(0), src.describe(), cache.describe());
  for (int64_t i = 0; i < s.rows; ++i) {
    DSA_CHECK(sl[i] >= 0 && sl[i] < c.rows, "paged_store: slot {} outside the cache of {} slots", sl[i],
              c.rows);
    std::copy_n(s.row(i), s.cols, c.row(sl[i]));
  }
}

Tensor paged_gather(const PagedSeq& seq, int64_t n) {
  const PagedView v = paged_view(seq, n, "paged_gather");
  Tensor out = Tensor::empty({n, v.cache.cols}, DType::f32);
  float* o = out.data<float>();
  parallel_for(n, 64, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) std::copy_n(v.row(s), v.cache.cols, o + s * v.cache.cols);
  });
  return out;
}

Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale) {
  const Rows3 ql = as_rows3(q_lat, "mla q_lat");
  const Rows3 qr = as_rows3(q_rope, "mla q_rope");
  const int64_t T = ql.n0, nh = ql.n1, L = ql.n2, R = qr.n2;
  DSA_CHECK(qr.n0 == T && qr.n1 == nh, "mla: q_lat {} and q_rope {} differ", q_lat.describe(),
            q_rope.describe());
  const PagedView v = paged_view(kv, start_pos + T, "mla kv cache");
  DSA_CHECK(v.cache.cols == L + R, "mla: cache rows of {} values, expected kv_lora {} + rope {}",
            v.cache.cols, L, R);
  check_sel(sel, T, start_pos, "mla");
  Tensor out = Tensor::zeros({T, nh, L}, DType::f32);
  float* o = out.data<float>();
  const float sc = float(scale);
  parallel_for(T * nh, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> keys;
    std::vector<float> p;
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / nh, h = i % nh;
      keys_of_row(sel, t, start_pos + t, keys);
      p.resize(keys.size());
      const float* qa = ql.at(t, h);
      const float* qb = qr.at(t, h);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* k = v.row(keys[j]);
        p[j] = (dot(qa, k, L) + dot(qb, k + L, R)) * sc;
      }
      softmax_inplace(p);
      float* oi = o + i * L;
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* k = v.row(keys[j]);
        const float pj = p[j];
        for (int64_t c = 0; c < L; ++c) oi[c] += pj * k[c];
      }
    }
  });
  return out;
}

Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale) {
  const Rows3 qv = as_rows3(q, "mha q");
  const Rows3 kn = as_rows3(k_nope, "mha k_nope");
  const Rows kr = as_rows(k_rope, "mha k_rope");
  const Rows3 vv = as_rows3(v, "mha v");
  const int64_t T = qv.n0, nh = qv.n1, nope = kn.n2, R = kr.cols, dv = vv.n2;
  check_attention_mha_shapes(q, k_nope, k_rope, v, start_pos);
  check_sel(sel, T, start_pos, "mha");
  Tensor out = Tensor::zeros({T, nh, dv}, DType::f32);
  float* o = out.data<float>();
  const float sc = float(scale);
  parallel_for(T * nh, 1, [&](int64_t b, int64_t e) {
    std::vector<int32_t> keys;
    std::vector<float> p;
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / nh, h = i % nh;
      keys_of_row(sel, t, start_pos + t, keys);
      p.resize(keys.size());
      const float* qi = qv.at(t, h);
      for (size_t j = 0; j < keys.size(); ++j) {
        const int64_t s = keys[j];
        p[j] = (dot(qi, kn.at(s, h), nope) + dot(qi + nope, kr.row(s), R)) * sc;
      }
      softmax_inplace(p);
      float* oi = o + i * dv;
      for (size_t j = 0; j < keys.size(); ++j) {
        const float* vs = vv.at(keys[j], h);
        const float pj = p[j];
        for (int64_t c = 0; c < dv; ++c) oi[c] += pj * vs[c];
      }
    }
  });
  return out;
}

}  // namespace dsaserve::kernels::cpu
