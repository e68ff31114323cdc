// Paged cache, MLA attention (absorbed == MHA == a naive reference) and the DSA indexer's top-k.
#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::i32;
using testing::randn;
using testing::random_weight;
using testing::rel_error;

// A paged cache holding `rows` [n, D] at the positions of a shuffled page table.
struct Paged {
  Tensor cache;
  Tensor table;
  PagedSeq seq() const { return {cache, table, 4}; }
};
Paged paged_of(const Tensor& rows, std::mt19937& rng) {
  const int64_t n = rows.size(0), D = rows.size(1), ps = 4;
  const int64_t pages = (n + ps - 1) / ps, pool = pages + 3;
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(size_t(pages));
  Paged p{Tensor::zeros({pool * ps, D}, DType::f32), i32(ids)};
  std::vector<int32_t> slots;
  for (int64_t s = 0; s < n; ++s) slots.push_back(ids[size_t(s / ps)] * int32_t(ps) + int32_t(s % ps));
  paged_store(p.cache, i32(slots), rows);
  return p;
}

TEST(Paged, StoreGatherRoundTripAndErrors) {
  std::mt19937 rng(8);
  const Tensor rows = randn({13, 6}, rng);
  const Paged p = paged_of(rows, rng);
  EXPECT_EQ(paged_gather(p.seq(), 13).to_f32_vector(), rows.to_f32_vector());
  EXPECT_THROW(paged_gather(p.seq(), 17), Error);  // the page table covers 16 positions
  Tensor c = p.cache;
  EXPECT_THROW(paged_store(c, i32({int32_t(c.size(0))}), randn({1, 6}, rng)), Error);
}

// Naive attention of one request: keys/values per head, explicit selection.
std::vector<double> naive_attention(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t T, int64_t nh, int64_t dk,
                                    int64_t dv, int64_t start, const std::vector<std::vector<int32_t>>& sel,
                                    double scale) {
  std::vector<double> out(size_t(T * nh * dv), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      std::vector<int32_t> keys = sel.empty() ? std::vector<int32_t>() : sel[size_t(t)];
      if (sel.empty())
        for (int64_t s = 0; s <= start + t; ++s) keys.push_back(int32_t(s));
      std::vector<double> p;
      double m = -1e300;
      for (int32_t s : keys) {
        double d = 0;
        for (int64_t i = 0; i < dk; ++i)
          d += q[size_t((t * nh + h) * dk + i)] * k[size_t((s * nh + h) * dk + i)];
        p.push_back(d * scale);
        m = std::max(m, p.back());
      }
      double z = 0;
      for (double& x : p) z += (x = std::exp(x - m));
      for (size_t j = 0; j < keys.size(); ++j)
        for (int64_t i = 0; i < dv; ++i)
          out[size_t((t * nh + h) * dv + i)] += p[j] / z * v[size_t((keys[j] * nh + h) * dv + i)];
    }
  return out;
}

class MlaForms : public ::testing::TestWithParam<DType> {};

// Random latents, kv_b (bf16 or FP8), queries: absorbed form == MHA form == naive, with and without DSA
// selection.
TEST_P(MlaForms, AbsorbedEqualsMhaEqualsNaive) {
  std::mt19937 rng(9);
  const int64_t nh = 3, nope = 24, rope = 8, dv = 20, L = 160, start = 6, T = 5, S = start + T;
  const auto kv_b = random_weight(nh * (nope + dv), L, GetParam(), rng);
  const Tensor lat = randn({S, L + rope}, rng);  // cache rows: [kv | k_rope]
  const Tensor q = randn({T, nh, nope + rope}, rng);
  const Paged p = paged_of(lat, rng);
  const double scale = 1.0 / std::sqrt(double(nope + rope));

  // Reference keys/values in double from the exact weight values.
  const std::vector<double> lv = testing::as_double(lat), qv = testing::as_double(q);
  std::vector<double> k(size_t(S * nh * (nope + rope))), v(size_t(S * nh * dv));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < nope + dv; ++i) {
        double acc = 0;
        for (int64_t c = 0; c < L; ++c)
          acc += lv[size_t(s * (L + rope) + c)] * kv_b.value[size_t((h * (nope + dv) + i) * L + c)];
        if (i < nope)
          k[size_t((s * nh + h) * (nope + rope) + i)] = acc;
        else
          v[size_t((s * nh + h) * dv + (i - nope))] = acc;
      }
      for (int64_t i = 0; i < rope; ++i)
        k[size_t((s * nh + h) * (nope + rope) + nope + i)] = lv[size_t(s * (L + rope) + L + i)];
    }

  std::vector<std::vector<int32_t>> sel_rows = {
      {0, 3}, {-1, 6, 2, 7}, {8, 1, 0, 5}, {9, 4, -1, -1}, {10, 0, 3, 7}};
  Tensor sel = Tensor::empty({T, 4}, DType::i32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < 4; ++j)
      sel.data<int32_t>()[t * 4 + j] =
          j < int64_t(sel_rows[size_t(t)].size()) ? sel_rows[size_t(t)][size_t(j)] : -1;
  std::vector<std::vector<int32_t>> sel_clean;
  for (auto r : sel_rows) {
    r.erase(std::remove(r.begin(), r.end(), -1), r.end());
    sel_clean.push_back(r);
  }

  for (bool use_sel : {false, true}) {
    const Tensor s = use_sel ? sel : Tensor();
    const auto ref = naive_attention(qv, k, v, T, nh, nope + rope, dv, start,
                                     use_sel ? sel_clean : decltype(sel_clean){}, scale);
    // MHA form: expand the latents through kv_b.
    const Tensor g = paged_gather(p.seq(), S);
    const Tensor kvx = linear(g.slice(1, 0, L), kv_b.ref).view({S, nh, nope + dv});
    const Tensor mha = attention_mha(q, kvx.slice(2, 0, nope), g.slice(1, L, L + rope),
                                     kvx.slice(2, nope, nope + dv), start, s, scale);
    // Absorbed form: W_UK folded into q, W_UV applied after.
    Tensor q_lat = Tensor::empty({T, nh, L}, DType::f32);
    for (int64_t h = 0; h < nh; ++h)
      linear_t(q.select(1, h).slice(1, 0, nope), kv_b.ref, h * (nope + dv), h * (nope + dv) + nope,
               q_lat.select(1, h));
    const Tensor out_lat =
        mla_attention_absorbed(q_lat, q.slice(2, nope, nope + rope), p.seq(), start, s, scale);
    Tensor absorbed = Tensor::empty({T, nh, dv}, DType::f32);
    for (int64_t h = 0; h < nh; ++h)
      linear(out_lat.select(1, h), kv_b.ref, h * (nope + dv) + nope, (h + 1) * (nope + dv),
             absorbed.select(1, h));
    EXPECT_LT(rel_error(mha, ref), 2e-6) << "selection " << use_sel;
    EXPECT_LT(rel_error(absorbed, ref), 2e-6) << "selection " << use_sel;
    EXPECT_LT(rel_error(absorbed, testing::as_double(mha)), 2e-6);
  }
  // A selected key in the future is an error.
  Tensor bad = sel.clone();
  bad.data<int32_t>()[0] = int32_t(start + 1);
  EXPECT_THROW(mla_attention_absorbed(Tensor::zeros({T, nh, L}, DType::f32), q.slice(2, nope, nope + rope),
                                      p.seq(), start, bad, scale),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Cpu, MlaForms, ::testing::Values(DType::bf16, DType::f8e4m3fn));

TEST(Indexer, TopkMatchesBruteForce) {
  std::mt19937 rng(10);
  const int64_t ih = 4, id = 32, start = 20, T = 6, S = start + T, topk = 9;
  const Tensor keys = randn({S, id}, rng);
  const Tensor q = randn({T, ih, id}, rng), w = randn({T, ih}, rng);
  const Paged p = paged_of(keys, rng);
  const double scale = 1.0 / std::sqrt(double(id)), wscale = 0.5;
  const Tensor sel = indexer_topk(q, w, p.seq(), start, topk, scale, wscale);
  ASSERT_EQ(sel.size(0), T);
  ASSERT_EQ(sel.size(1), topk);
  const auto kv = testing::as_double(keys), qv = testing::as_double(q), wv = testing::as_double(w);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int32_t>> sc;
    for (int64_t s = 0; s <= start + t; ++s) {
      double acc = 0;
      for (int64_t h = 0; h < ih; ++h) {
        double d = 0;
        for (int64_t i = 0; i < id; ++i) d += qv[size_t((t * ih + h) * id + i)] * kv[size_t(s * id + i)];
        acc += wv[size_t(t * ih + h)] * wscale * std::max(0.0, d * scale);
      }
      sc.emplace_back(-acc, int32_t(s));
    }
    std::sort(sc.begin(), sc.end());
    std::vector<int32_t> expect;
    for (int64_t j = 0; j < topk; ++j) expect.push_back(sc[size_t(j)].second);
    std::sort(expect.begin(), expect.end());
    const int32_t* row = sel.data<int32_t>() + t * topk;
    EXPECT_EQ(std::vector<int32_t>(row, row + topk), expect) << "row " << t;
  }
}

TEST(Indexer, ShortRowsTakeEveryKeyAndTiesPreferLowerPositions) {
  std::mt19937 rng(11);
  const int64_t ih = 2, id = 8, topk = 4;
  // Every key identical: all scores tie, so the selection is the lowest positions.
  Tensor keys = Tensor::zeros({7, id}, DType::f32);
  for (int64_t i = 0; i < 7 * id; ++i) keys.data<float>()[i] = 1.0f;
  const Paged p = paged_of(keys, rng);
  const Tensor q = randn({7, ih, id}, rng);
  Tensor w = Tensor::zeros({7, ih}, DType::f32);
  for (int64_t i = 0; i < 14; ++i) w.data<float>()[i] = 1.0f;
  const Tensor sel = indexer_topk(q, w, p.seq(), 0, topk, 0.3, 1.0);
  ASSERT_EQ(sel.size(1), topk);
  const int32_t* s = sel.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(s, s + 4), (std::vector<int32_t>{0, -1, -1, -1}));     // position 0: 1 key
  EXPECT_EQ(std::vector<int32_t>(s + 12, s + 16), (std::vector<int32_t>{0, 1, 2, 3}));  // position 3: 4 keys
  EXPECT_EQ(std::vector<int32_t>(s + 24, s + 28), (std::vector<int32_t>{0, 1, 2, 3}));  // position 6: ties
}

// The batched ops (PagedRows) against one call per request: the same bits, rows of several requests
// (prefill chunks and decode rows, some with at most topk keys) over one shared pool with shuffled pages.
TEST(Batched, RowsEqualPerRequestCalls) {
  std::mt19937 rng(12);
  const int64_t ps = 4, ih = 4, id = 32, nh = 3, L = 16, R = 8, topk = 9;
  const std::vector<std::pair<int64_t, int64_t>> reqs = {
      {0, 5}, {20, 1}, {7, 3}, {37, 1}, {2, 1}};  // start, T
  const int64_t pool = 40;
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  Tensor kcache = randn({pool * ps, id}, rng), lcache = randn({pool * ps, L + R}, rng);
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> seq, len;
  int64_t used = 0, max_pages = 0, max_len = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const int64_t S = reqs[r].first + reqs[r].second, n = (S + ps - 1) / ps;
    tables.emplace_back(ids.begin() + used, ids.begin() + used + n);
    used += n;
    max_pages = std::max(max_pages, n);
    max_len = std::max(max_len, S);
    for (int64_t t = 0; t < reqs[r].second; ++t) {
      seq.push_back(int32_t(r));
      len.push_back(int32_t(reqs[r].first + t + 1));
    }
  }
  std::vector<int32_t> flat(reqs.size() * size_t(max_pages), 0);
  for (size_t r = 0; r < reqs.size(); ++r)
    std::copy(tables[r].begin(), tables[r].end(), flat.begin() + r * max_pages);
  const Tensor table = i32(flat).view({int64_t(reqs.size()), max_pages});
  const int64_t T = int64_t(seq.size());
  const Tensor q = randn({T, ih, id}, rng), w = randn({T, ih}, rng);
  const Tensor q_lat = randn({T, nh, L}, rng), q_rope = randn({T, nh, R}, rng);
  const Tensor row_seq = i32(seq), row_len = i32(len);
  const PagedRows krows{kcache, table, ps, row_seq, row_len, seq, len, max_len};
  const PagedRows lrows{lcache, table, ps, row_seq, row_len, seq, len, max_len};
  const double scale = 0.2, wscale = 0.7, ascale = 0.3;

  const Tensor sel = indexer_topk_rows(q, w, krows, topk, scale, wscale);
  ASSERT_EQ(sel.size(0), T);
  ASSERT_EQ(sel.size(1), topk);
  const Tensor out = mla_attention_rows(q_lat, q_rope, lrows, sel, ascale);
  const Tensor dense = mla_attention_rows(q_lat, q_rope, lrows, Tensor(), ascale);
  int64_t a0 = 0;
  for (size_t r = 0; r < reqs.size(); ++r) {
    const int64_t start = reqs[r].first, Tr = reqs[r].second, S = start + Tr, a1 = a0 + Tr;
    const PagedSeq kseq{kcache, i32(tables[r]), ps}, lseq{lcache, i32(tables[r]), ps};
    Tensor want_sel;  // per request: undefined (every key) when no row sees more than topk
    if (S > topk)
      want_sel = indexer_topk(q.slice(0, a0, a1), w.slice(0, a0, a1), kseq, start, topk, scale, wscale);
    for (int64_t t = 0; t < Tr; ++t) {
      std::vector<int32_t> expect;
      for (int64_t j = 0; j < topk; ++j)
        expect.push_back(want_sel.defined() ? want_sel.data<int32_t>()[t * topk + j]
                                            : (j <= start + t ? int32_t(j) : -1));
      const int32_t* row = sel.data<int32_t>() + (a0 + t) * topk;
      EXPECT_EQ(std::vector<int32_t>(row, row + topk), expect) << "request " << r << " row " << t;
    }
    const Tensor o = mla_attention_absorbed(q_lat.slice(0, a0, a1), q_rope.slice(0, a0, a1), lseq, start,
                                            want_sel, ascale);
    const Tensor od = mla_attention_absorbed(q_lat.slice(0, a0, a1), q_rope.slice(0, a0, a1), lseq, start,
                                             Tensor(), ascale);
    const std::vector<float> got = out.slice(0, a0, a1).contiguous().to_f32_vector(),
                             got_dense = dense.slice(0, a0, a1).contiguous().to_f32_vector();
    EXPECT_EQ(got, o.to_f32_vector()) << "request " << r;  // bit-identical
    EXPECT_EQ(got_dense, od.to_f32_vector()) << "request " << r;
    a0 = a1;
  }

  // Bad metadata is a clear error.
  std::vector<int32_t> bad_seq = seq;
  bad_seq[0] = int32_t(reqs.size());
  EXPECT_THROW(indexer_topk_rows(q, w, PagedRows{kcache, table, ps, row_seq, row_len, bad_seq, len, max_len},
                                 topk, scale, wscale),
               Error);
  EXPECT_THROW(mla_attention_rows(q_lat, q_rope,
                                  PagedRows{lcache, table, ps, row_seq, row_len,
                                            std::span<const int32_t>(seq).first(2), len, max_len},
                                  Tensor(), ascale),
               Error);
  EXPECT_THROW(mla_attention_rows(q_lat, q_rope, PagedRows{lcache, table, ps, row_seq, row_len, seq, len, 3},
                                  Tensor(), ascale),
               Error);  // rows longer than max_len
}

}  // namespace
}  // namespace dsaserve::kernels
