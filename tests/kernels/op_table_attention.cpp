// The operator table's attention, indexer, MLA, MoE and dummy-fill cases (op_table.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "core/dummy_fill.h"
#include "kernels/op_table_cases.h"

namespace dsaserve::kernels::testing::cases {

namespace {

// ---- attention and the indexer ----

// One request with `start` cached tokens and T new ones over a paged f32 cache; pages reversed.
struct OneSeq {
  Tensor cache;
  std::vector<int32_t> table;
};
OneSeq one_seq(int64_t start, int64_t T, int64_t cols, uint64_t seed, float scale = 1.0f) {
  const int64_t pages = (start + T + kPage - 1) / kPage + 2;
  OneSeq s{rand_f32({pages * kPage, cols}, seed, scale), std::vector<int32_t>(size_t(pages))};
  std::iota(s.table.rbegin(), s.table.rend(), 0);
  return s;
}

// A ragged decode batch of R requests (one row each) over one paged f32 cache: request i sees
// len[i] positions (random up to max_ctx); pages handed out in a shuffled order.
struct RowsBatch {
  Tensor cache;
  std::vector<int32_t> table, seq, len;  // table [R, max_pages]
  int64_t max_pages = 0, max_len = 0;
};
std::shared_ptr<RowsBatch> rows_batch(int64_t R, int64_t max_ctx, int64_t cols, uint64_t seed, float scale) {
  auto b = std::make_shared<RowsBatch>();
  Rng g(seed);
  for (int64_t i = 0; i < R; ++i) {
    b->len.push_back(int32_t(1 + g.below(max_ctx)));
    b->seq.push_back(int32_t(i));
  }
  if (R > 1) b->len[0] = int32_t(max_ctx);  // the longest row present
  b->max_len = *std::max_element(b->len.begin(), b->len.end());
  b->max_pages = (b->max_len + kPage - 1) / kPage;
  const int64_t pool = R * b->max_pages;
  std::vector<int32_t> order(static_cast<size_t>(pool));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = pool - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(g.below(i + 1))]);
  b->table = order;  // row i's pages: order[i * max_pages ...]
  b->cache = rand_f32({pool * kPage, cols}, seed + 1, scale);
  return b;
}

PagedRows paged_rows(const std::shared_ptr<RowsBatch>& b, const Tensor& cache, const Backend& be) {
  PagedRows p;
  p.cache = cache;
  p.page_table = i32_tensor(b->table, be.device()).view({int64_t(b->len.size()), b->max_pages});
  p.page_size = kPage;
  p.row_seq = i32_tensor(b->seq, be.device());
  p.row_len = i32_tensor(b->len, be.device());
  p.seq_host = b->seq;
  p.len_host = b->len;
  p.max_len = b->max_len;
  return p;
}

// Per row min(k, visible) distinct random visible positions, about one in eight of them -1 (a DSA
// selection: the indexer never repeats a position).
Tensor random_selection(const std::vector<int32_t>& visible, int64_t k, uint64_t seed) {
  Tensor sel = Tensor::empty({int64_t(visible.size()), k}, DType::i32);
  Rng g(seed);
  for (size_t row = 0; row < visible.size(); ++row) {
    std::vector<int32_t> pos(static_cast<size_t>(visible[row]));
    std::iota(pos.begin(), pos.end(), 0);
    int32_t* out = sel.data<int32_t>() + int64_t(row) * k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t left = int64_t(pos.size()) - j;
      if (left <= 0) {
        out[j] = -1;
        continue;
      }
      std::swap(pos[size_t(j)], pos[size_t(j + g.below(left))]);
      out[j] = g.below(8) == 0 ? -1 : pos[size_t(j)];
    }
  }
  return sel;
}

// What the indexer hands the attention: per row min(k, visible) distinct positions, ascending, -1 padded.
Tensor indexer_like_selection(const std::vector<int32_t>& visible, int64_t k, uint64_t seed) {
  Tensor sel = Tensor::empty({int64_t(visible.size()), k}, DType::i32);
  Rng g(seed);
  for (size_t row = 0; row < visible.size(); ++row) {
    std::vector<int32_t> pos(static_cast<size_t>(visible[row]));
    std::iota(pos.begin(), pos.end(), 0);
    const int64_t n = std::min<int64_t>(k, int64_t(pos.size()));
    for (int64_t j = 0; j < n; ++j)
      std::swap(pos[size_t(j)], pos[size_t(j + g.below(int64_t(pos.size()) - j))]);
    std::sort(pos.begin(), pos.begin() + n);
    int32_t* out = sel.data<int32_t>() + int64_t(row) * k;
    for (int64_t j = 0; j < k; ++j) out[j] = j < n ? pos[size_t(j)] : -1;
  }
  return sel;
}

}  // namespace

void add_attention_cases(std::vector<OpCase>& t) {
  const double iscale = 1.0 / std::sqrt(double(kId)), wscale = 1.0 / std::sqrt(double(kIh));
  const double mscale = 1.0 / std::sqrt(double(kNope + kRope));
  // Selections may legitimately differ at near-ties of fp32 sums in another order: 1e-3 of entries.
  for (int64_t start : {int64_t(0), int64_t(4000)}) {
    t.push_back(
        {"indexer_topk", fmt::format("one request, start {}", start), kTokens,
         [=](Backend& d, Backend& r, int64_t T) {
           const OneSeq s = one_seq(start, T, kId, 2300 + uint64_t(T + start));
           const Tensor q = rand_f32({T, kIh, kId}, 2400 + uint64_t(T)),
                        w = rand_f32({T, kIh}, 2500 + uint64_t(T));
           const Tensor cd = on(s.cache, d), td = ids_on(s.table, d), tr = i32_tensor(s.table);
           const Tensor qd = on(q, d), wd = on(w, d);
           return same_op(
               d, r,
               [=](Backend& b) {
                 return Outs{b.indexer_topk(qd, wd, PagedSeq{cd, td, kPage}, start, kTopk, iscale, wscale)};
               },
               [=](Backend& b) {
                 return Outs{
                     b.indexer_topk(q, w, PagedSeq{s.cache, tr, kPage}, start, kTopk, iscale, wscale)};
               },
               {{Measure::ids, 1e-3}}, double((start + T) * kId) * kF32,
               2.0 * double(T * kIh * kId * (start + T)));
         }});
  }
  t.push_back(
      {"indexer_topk_rows",
       "ragged decode batch, contexts to 8192",
       {1, 7, 33},
       [=](Backend& d, Backend& r, int64_t R) {
         const auto b = rows_batch(R, 8192, kId, 2600 + uint64_t(R), 1.0f);
         const Tensor q = rand_f32({R, kIh, kId}, 2700 + uint64_t(R)),
                      w = rand_f32({R, kIh}, 2800 + uint64_t(R));
         const Tensor cd = on(b->cache, d), qd = on(q, d), wd = on(w, d);
         double keys = 0;
         for (int32_t l : b->len) keys += l;
         return same_op(
             d, r,
             [=](Backend& be) {
               return Outs{be.indexer_topk_rows(qd, wd, paged_rows(b, cd, be), kTopk, iscale, wscale)};
             },
             [=](Backend& be) {
               return Outs{be.indexer_topk_rows(q, w, paged_rows(b, b->cache, be), kTopk, iscale, wscale)};
             },
             {{Measure::ids, 1e-3}}, keys * kId * kF32, 2.0 * keys * kIh * kId);
       }});
  for (bool selected : {false, true}) {
    t.push_back({"mla_attention_absorbed",
                 selected ? "one request, 128 selected keys" : "one request, all keys", kTokens,
                 [=](Backend& d, Backend& r, int64_t T) {
                   const int64_t start = 300;
                   const OneSeq s = one_seq(start, T, kKvLora + kRope, 2900 + uint64_t(T));
                   const Tensor ql = rand_f32({T, kHeads, kKvLora}, 3000 + uint64_t(T), 0.2f);
                   const Tensor qr = rand_f32({T, kHeads, kRope}, 3100 + uint64_t(T), 0.2f);
                   std::vector<int32_t> vis(static_cast<size_t>(T));
                   for (int64_t i = 0; i < T; ++i) vis[size_t(i)] = int32_t(start + i + 1);
                   const Tensor sel = selected ? random_selection(vis, 128, uint64_t(T)) : Tensor();
                   const Tensor cd = on(s.cache, d), td = ids_on(s.table, d), tr = i32_tensor(s.table);
                   const Tensor qld = on(ql, d), qrd = on(qr, d), seld = selected ? on(sel, d) : Tensor();
                   const double keys =
                       selected ? double(T * 128) : double(T) * double(start) + double(T * (T + 1)) / 2;
                   return same_op(
                       d, r,
                       [=](Backend& b) {
                         return Outs{b.mla_attention_absorbed(qld, qrd, PagedSeq{cd, td, kPage}, start, seld,
                                                              mscale)};
                       },
                       [=](Backend& b) {
                         return Outs{b.mla_attention_absorbed(ql, qr, PagedSeq{s.cache, tr, kPage}, start,
                                                              sel, mscale)};
                       },
                       {{Measure::elem, kTolAttn}}, double((start + T) * (kKvLora + kRope)) * kF32,
                       2.0 * keys * kHeads * double(2 * kKvLora + kRope));
                 }});
  }
  for (bool selected : {false, true}) {
    t.push_back({"mla_attention_rows",
                 selected ? "ragged decode batch, top-2048 selection" : "ragged decode batch, all keys",
                 {1, 7, 33},
                 [=](Backend& d, Backend& r, int64_t R) {
                   const auto b = rows_batch(R, 3000, kKvLora + kRope, 3200 + uint64_t(R), 0.3f);
                   const Tensor ql = rand_f32({R, kHeads, kKvLora}, 3300 + uint64_t(R), 0.2f);
                   const Tensor qr = rand_f32({R, kHeads, kRope}, 3400 + uint64_t(R), 0.2f);
                   const Tensor sel = selected ? random_selection(b->len, kTopk, uint64_t(R)) : Tensor();
                   const Tensor cd = on(b->cache, d), qld = on(ql, d), qrd = on(qr, d),
                                seld = selected ? on(sel, d) : Tensor();
                   double keys = 0;
                   for (int32_t l : b->len)
                     keys += selected ? double(std::min<int64_t>(l, kTopk)) : double(l);
                   return same_op(
                       d, r,
                       [=](Backend& be) {
                         return Outs{be.mla_attention_rows(qld, qrd, paged_rows(b, cd, be), seld, mscale)};
                       },
                       [=](Backend& be) {
                         return Outs{be.mla_attention_rows(ql, qr, paged_rows(b, b->cache, be), sel, mscale)};
                       },
                       {{Measure::elem, kTolAttn}}, keys * double(kKvLora + kRope) * kF32,
                       2.0 * keys * kHeads * double(2 * kKvLora + kRope));
                 }});
  }
  // The planners: the rows operators on kernel-format (bf16) caches under the device backend's own plan
  // (the step plan's path: Backend::plan_mla_rows / plan_indexer_rows, then the call with the plan), against
  // the CPU on the same bf16-rounded keys.
  t.push_back({"plan_indexer_rows",
               "indexer_topk_rows on a bf16 key cache under its plan",
               {1, 7, 33},
               [=](Backend& d, Backend& r, int64_t R) {
                 const auto b = rows_batch(R, 8192, kId, 3600 + uint64_t(R), 1.0f);
                 const Tensor keys_r = b->cache.to(DType::bf16).to(DType::f32);
                 const Tensor keys_d = on(b->cache.to(DType::bf16), d);
                 // bf16-exact queries and weights: the kernel's bf16 operands are the CPU's values.
                 const Tensor q = rand_f32({R, kIh, kId}, 3700 + uint64_t(R)).to(DType::bf16).to(DType::f32),
                              w = rand_f32({R, kIh}, 3800 + uint64_t(R)).to(DType::bf16).to(DType::f32);
                 const Tensor qd = on(q, d), wd = on(w, d);
                 double keys = 0;
                 for (int32_t l : b->len) keys += l;
                 return same_op(
                     d, r,
                     [=](Backend& be) {
                       PagedRows pr = paged_rows(b, keys_d, be);
                       const IndexerRowsPlan plan = be.plan_indexer_rows(R, b->max_len, kTopk, b->len);
                       pr.indexer_plan = &plan;
                       return Outs{be.indexer_topk_rows(qd, wd, pr, kTopk, iscale, wscale)};
                     },
                     [=](Backend& be) {
                       return Outs{
                           be.indexer_topk_rows(q, w, paged_rows(b, keys_r, be), kTopk, iscale, wscale)};
                     },
                     {{Measure::ids, 1e-3}}, keys * kId * 2, 2.0 * keys * kIh * kId);
               }});
  t.push_back({"plan_mla_rows",
               "mla_attention_rows on a bf16 latent cache under its plan",
               {1, 7, 33},
               [=](Backend& d, Backend& r, int64_t R) {
                 const auto b = rows_batch(R, 3000, kKvLora + kRope, 3900 + uint64_t(R), 0.3f);
                 const Tensor lat_r = b->cache.to(DType::bf16).to(DType::f32);
                 const Tensor lat_d = on(b->cache.to(DType::bf16), d);
                 const Tensor ql =
                     rand_f32({R, kHeads, kKvLora}, 4000 + uint64_t(R), 0.2f).to(DType::bf16).to(DType::f32);
                 const Tensor qr =
                     rand_f32({R, kHeads, kRope}, 4100 + uint64_t(R), 0.2f).to(DType::bf16).to(DType::f32);
                 const Tensor sel = indexer_like_selection(b->len, kTopk, uint64_t(R) + 7);
                 const Tensor qld = on(ql, d), qrd = on(qr, d), seld = on(sel, d);
                 double keys = 0;
                 for (int32_t l : b->len) keys += double(std::min<int64_t>(l, kTopk));
                 return same_op(
                     d, r,
                     [=](Backend& be) {
                       PagedRows pr = paged_rows(b, lat_d, be);
                       const MlaRowsPlan plan = be.plan_mla_rows(R, kHeads, kTopk);
                       pr.mla_plan = &plan;
                       return Outs{be.mla_attention_rows(qld, qrd, pr, seld, mscale)};
                     },
                     [=](Backend& be) {
                       return Outs{be.mla_attention_rows(ql, qr, paged_rows(b, lat_r, be), sel, mscale)};
                     },
                     {{Measure::elem, kTolBf16}}, keys * double(kKvLora + kRope) * 2,
                     2.0 * keys * kHeads * double(2 * kKvLora + kRope));
               }});
  t.push_back(
      {"attention_mha", "one request, start 100", kTokens, [=](Backend& d, Backend& r, int64_t T) {
         // bf16-exact inputs and the bf16 tolerance: the CUDA backend runs these dense chunks on its
         // tensor-core kernel (bf16 operands and P, f32 accumulation), like the absorbed form's cases.
         const int64_t start = 100, S = start + T;
         auto bf16_exact = [](const Tensor& x) { return x.to(DType::bf16).to(DType::f32); };
         const Tensor q = bf16_exact(rand_f32({T, kHeads, kNope + kRope}, 3500 + uint64_t(T), 0.3f));
         const Tensor kvx = bf16_exact(rand_f32({S, kHeads, kNope + kV}, 3600 + uint64_t(T), 0.3f));
         const Tensor lat = bf16_exact(rand_f32({S, kKvLora + kRope}, 3700 + uint64_t(T), 0.3f));
         const Tensor qd = on(q, d), kd = on(kvx, d), ld = on(lat, d);
         auto run = [=](Backend& b, const Tensor& qq, const Tensor& kk, const Tensor& ll) {
           return Outs{b.attention_mha(qq, kk.slice(2, 0, kNope), ll.slice(1, kKvLora, kKvLora + kRope),
                                       kk.slice(2, kNope, kNope + kV), start, {}, mscale)};
         };
         const double keys = double(T) * double(start) + double(T * (T + 1)) / 2;
         return same_op(
             d, r, [=](Backend& b) { return run(b, qd, kd, ld); },
             [=](Backend& b) { return run(b, q, kvx, lat); }, {{Measure::elem, kTolBf16}},
             double(S * kHeads * (kNope + kV)) * kF32, 2.0 * keys * kHeads * double(kNope + kRope + kV));
       }});
}

// ---- MLA fused / batched operators ----

void add_mla_cases(std::vector<OpCase>& t) {
  // Absorbed projections over all 64 heads of kv_b [64 x 448, 512]: bf16 products (an FP8 kv_b runs as
  // its bf16 dequantisation), per row L2 within 1e-2; at decode sizes and at a 4,096-token prefill chunk
  // (the fused f32-activation kernel from KernelOptions::absorb_fused_min_tokens on).
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    for (bool prefill : {false, true}) {
      const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
      const std::vector<int64_t> tokens = prefill ? std::vector<int64_t>{4096} : kTokens;
      const char* size = prefill ? ", prefill" : "";
      t.push_back({"absorb_q", fmt::format("{} kv_b, 64 heads{}", tag, size), tokens,
                   [=](Backend& d, Backend& r, int64_t T) {
                     const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 3800),
                                     wd = on(w, d, WeightUse::absorb);
                     const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 3900 + uint64_t(T)), qd = on(q, d);
                     return same_op(
                         d, r, [=](Backend& b) { return Outs{b.absorb_q(qd.slice(2, 0, kNope), wd, {})}; },
                         [=](Backend& b) { return Outs{b.absorb_q(q.slice(2, 0, kNope), w, {})}; },
                         {{Measure::gemm_l2, kTolBf16}},
                         double(kHeads * kNope * kKvLora) * double(dtype_size(dt)),
                         2.0 * double(T * kHeads * kNope * kKvLora));
                   }});
      t.push_back({"absorb_v", fmt::format("{} kv_b, 64 heads{}", tag, size), tokens,
                   [=](Backend& d, Backend& r, int64_t T) {
                     const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 3800),
                                     wd = on(w, d, WeightUse::absorb);
                     const Tensor lat = rand_f32({T, kHeads, kKvLora}, 4000 + uint64_t(T)), ld = on(lat, d);
                     return same_op(
                         d, r, [=](Backend& b) { return Outs{b.absorb_v(ld, wd, kV, {})}; },
                         [=](Backend& b) { return Outs{b.absorb_v(lat, w, kV, {})}; },
                         {{Measure::gemm_l2, kTolBf16}},
                         double(kHeads * kV * kKvLora) * double(dtype_size(dt)),
                         2.0 * double(T * kHeads * kV * kKvLora));
                   }});
    }
  }
  // absorb_v_fp8: absorb_v and, where the CUDA backend's fused launch runs it (from
  // KernelOptions::absorb_fused_min_tokens: T = 257 here), the output's FP8 copy; an FP8 linear in o_proj's
  // place (768 of its rows) reading the output through linear_multi with that copy gives what it gives
  // quantising the output itself (the CPU makes no copy: its linear is exact).
  t.push_back(
      {"absorb_v_fp8",
       "bf16 kv_b, 64 heads, into an FP8 o_proj",
       {1, 33, 257},
       [=](Backend& d, Backend& r, int64_t T) {
         const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, DType::bf16, 3800),
                         wd = on(w, d, WeightUse::absorb);
         const WeightRef o = rand_weight(768, kHeads * kV, DType::f8e4m3fn, 3810), od = on(o, d);
         const Tensor lat = rand_f32({T, kHeads, kKvLora}, 4100 + uint64_t(T)), ld = on(lat, d);
         auto run = [=](Backend& b, const Tensor& x, const WeightRef& kv, const WeightRef& op) {
           Fp8Act q;
           const Tensor a = b.absorb_v_fp8(x, kv, kV, {}, q);
           return Outs{a, b.linear_multi(a.view({T, kHeads * kV}), {op}, q.defined() ? &q : nullptr)[0]};
         };
         return same_op(
             d, r, [=](Backend& b) { return run(b, ld, wd, od); },
             [=](Backend& b) { return run(b, lat, w, o); },
             {{Measure::gemm_l2, kTolBf16}, {Measure::gemm_l2, kTolFp8}},
             weight_bytes(w) * double(kV) / double(kNope + kV) + weight_bytes(o) +
                 double(T) * double(kHeads * (kKvLora + kV) + 768) * kF32,
             2.0 * double(T * kHeads * kV * kKvLora) + 2.0 * double(T * 768 * kHeads * kV), true);
       }});
  // The cache writes of T tokens at slots scattered over the pages, positions up to 128K, into f32 caches
  // (the kernel formats and their rounding: mla_fused_test).
  for (bool indexer : {false, true}) {
    t.push_back({indexer ? "indexer_k_write" : "mla_kv_write", "f32 cache, scattered slots", kTokens,
                 [=](Backend& d, Backend& r, int64_t T) {
                   const int64_t cols = indexer ? kId : kKvLora + kRope, pool = (T / kPage + 9) * kPage;
                   std::vector<int32_t> all(static_cast<size_t>(pool));
                   std::iota(all.begin(), all.end(), 0);
                   Rng g(uint64_t(T) + 11);
                   for (int64_t i = pool - 1; i > 0; --i)
                     std::swap(all[size_t(i)], all[size_t(g.below(i + 1))]);
                   const std::vector<int32_t> slots(all.begin(), all.begin() + T),
                       pos = random_ids(T, 131072, uint64_t(T) + 12);
                   const Tensor x = rand_f32({T, cols}, 4100 + uint64_t(T), 3.0f);
                   const Tensor nw = rand_bf16({indexer ? kId : kKvLora}, 13), nb = rand_bf16({kId}, 14);
                   const Tensor cache = rand_f32({pool, cols}, 4200 + uint64_t(T));
                   const Tensor cd = own(cache, d), cr = own(cache, r);
                   const Tensor xd = on(x, d), nwd = on(nw, d), nbd = on(nb, d);
                   const Tensor sd = ids_on(slots, d), sr = i32_tensor(slots), pd = ids_on(pos, d),
                                pr = i32_tensor(pos);
                   const RopeParams rp = glm_rope(!indexer);
                   auto run = [=](Backend& b, Tensor c, const Tensor& xx, const Tensor& w, const Tensor& bias,
                                  const Tensor& p, const Tensor& s) {
                     if (indexer) {
                       b.indexer_k_write(xx, w, bias, 1e-6, p, rp, c, s);
                     } else {
                       b.mla_kv_write(xx, w, 1e-6, p, rp, c, s);
                     }
                     return Outs{c};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, cd, xd, nwd, nbd, pd, sd); },
                       [=](Backend& b) { return run(b, cr, x, nw, nb, pr, sr); }, {kElem},
                       double(T * cols) * 2 * kF32);
                 }});
  }
}

// ---- MoE ----

void add_moe_cases(std::vector<OpCase>& t) {
  struct Route {
    const char* name;
    MoeRouteParams p;
    bool ties;
  };
  const MoeRouteParams glm{1, 1, kTopK, true, 2.5}, dsv3{8, 4, kTopK, true, 2.5};
  for (const Route& c :
       {Route{"glm (1 group)", glm, false}, Route{"deepseek (8 groups, 4 chosen)", dsv3, false},
        Route{"ties (toward the lower index)", dsv3, true}}) {
    t.push_back({"moe_route", c.name, kTokens, [=](Backend& d, Backend& r, int64_t T) {
                   Tensor logits = rand_f32({T, kExperts}, 4300 + uint64_t(T), 4.0f),
                          bias = rand_f32({kExperts}, 4400, 0.1f);
                   if (c.ties) {  // few distinct values: every choice is a tie
                     for (int64_t i = 0; i < logits.numel(); ++i)
                       logits.data<float>()[i] = std::round(logits.data<float>()[i]);
                     for (int64_t i = 0; i < kExperts; ++i) bias.data<float>()[i] = 0.0f;
                   }
                   const Tensor ld = on(logits, d), bd = on(bias, d);
                   auto run = [p = c.p](Backend& b, const Tensor& l, const Tensor& bb) {
                     const Routing x = b.moe_route(l, bb, p);
                     return Outs{x.ids, x.weights};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, ld, bd); },
                       [=](Backend& b) { return run(b, logits, bias); }, {kExact, kElem},
                       double(T * kExperts) * kF32);
                 }});
  }
  // 32 experts' weights at the real expert shapes (256 would not test more), top-8 of distinct random
  // experts with positive weights like a router's; the device side's experts carry the forms its backend
  // derives, each weight's and the set's (derive_experts), as a model's do.
  // derive_experts: the same experts' products on the derived set and on none (the op makes it for the
  // call), both against the CPU's on the weights as stored.
  struct ExpertCase {
    const char* op;
    DType dt;
    bool also_underived;
  };
  for (const ExpertCase& c :
       {ExpertCase{"moe_experts", DType::bf16, false}, ExpertCase{"moe_experts", DType::f8e4m3fn, false},
        ExpertCase{"derive_experts", DType::f8e4m3fn, true}}) {
    constexpr int64_t kE = 32;
    const DType dt = c.dt;
    const std::string tag = dt == DType::bf16 ? "bf16" : "fp8";
    t.push_back(
        {c.op,
         c.also_underived ? tag + " 32 experts top-8: on the derived set and made for the call"
                          : tag + " 32 experts top-8",
         dt == DType::bf16 ? std::vector<int64_t>{1, 7, 33} : kTokens,
         [=](Backend& d, Backend& r, int64_t T) {
           auto ex = std::make_shared<std::vector<MlpRef>>(), ex_d = std::make_shared<std::vector<MlpRef>>();
           for (int64_t e = 0; e < kE; ++e) {
             MlpRef m{rand_weight(kI, kH, dt, 5000 + 3 * uint64_t(e)),
                      rand_weight(kI, kH, dt, 5001 + 3 * uint64_t(e)),
                      rand_weight(kH, kI, dt, 5002 + 3 * uint64_t(e))};
             ex_d->push_back({on(m.gate, d, WeightUse::expert), on(m.up, d, WeightUse::expert),
                              on(m.down, d, WeightUse::expert)});
             ex->push_back(std::move(m));
           }
           const std::shared_ptr<const DerivedExperts> set_d = d.derive_experts(*ex_d);
           Routing rt{Tensor::empty({T, kTopK}, DType::i32), rand_f32({T, kTopK}, 5100 + uint64_t(T))};
           for (int64_t i = 0; i < T * kTopK; ++i)
             rt.weights.data<float>()[i] = 0.55f + 0.45f * rt.weights.data<float>()[i];
           Rng g(static_cast<uint64_t>(T));
           std::set<int32_t> used;
           for (int64_t row = 0; row < T; ++row) {
             std::vector<int32_t> all(kE);
             std::iota(all.begin(), all.end(), 0);
             for (int64_t k = 0; k < kTopK; ++k) {
               std::swap(all[size_t(k)], all[size_t(k + g.below(kE - k))]);
               rt.ids.data<int32_t>()[row * kTopK + k] = all[size_t(k)];
               used.insert(all[size_t(k)]);
             }
           }
           // The second output adds a [T, H] addend (a shared expert's output) in the combine.
           const Tensor x = rand_f32({T, kH}, 5200 + uint64_t(T)), xd = on(x, d);
           const Tensor add = rand_f32({T, kH}, 5300 + uint64_t(T)), add_d = on(add, d);
           const Routing rd{on(rt.ids, d), on(rt.weights, d)};
           const double per_expert = 3.0 * double(kI * kH) * double(dtype_size(dt));
           const bool both = c.also_underived;
           const Check check{Measure::gemm_l2, dt == DType::bf16 ? kTolBf16 : kTolFp8};
           return same_op(
               d, r,
               [=](Backend& b) {
                 Outs o{b.moe_experts(xd, rd, *ex_d, nullptr, set_d.get(), nullptr),
                        b.moe_experts(xd, rd, *ex_d, nullptr, set_d.get(), &add_d)};
                 if (both) o.push_back(b.moe_experts(xd, rd, *ex_d, nullptr, nullptr, nullptr));
                 return o;
               },
               [=](Backend& b) {
                 Outs o{b.moe_experts(x, rt, *ex, nullptr, nullptr, nullptr),
                        b.moe_experts(x, rt, *ex, nullptr, nullptr, &add)};
                 if (both) o.push_back(o[0]);
                 return o;
               },
               both ? std::vector<Check>{check, check, check} : std::vector<Check>{check, check},
               per_expert * double(used.size()) + double(T * kH) * 2 * kF32,
               6.0 * double(T * kTopK * kI * kH), dt == DType::f8e4m3fn);
         }});
  }
}

// ---- dummy weights ----

void add_dummy_cases(std::vector<OpCase>& t) {
  for (auto [variant, dt, spec] :
       {std::tuple{"bf16 [4096 x 6144]", DType::bf16, dummy::FillSpec{7, 11, 0.02f, 0.0f, false}},
        std::tuple{"f32 block scales, positive", DType::f32, dummy::FillSpec{7, 12, 0.001f, 0.0f, true}},
        std::tuple{"fp8 codes [4096 x 6144]", DType::f8e4m3fn, dummy::FillSpec{7, 13, 1.0f, 0.0f, false}},
        std::tuple{"bf16 norm weights, offset 1", DType::bf16,
                   dummy::FillSpec{7, 14, 0.0625f, 1.0f, false}}}) {
    t.push_back({"fill_dummy", variant, {4096}, [=](Backend& d, Backend& r, int64_t T) {
                   const Shape s = dt == DType::f32 ? Shape{T / 128, kH / 128} : Shape{T, kH};
                   auto run = [=](Backend& b) {
                     Tensor x = Tensor::empty(s, dt, b.device());
                     b.fill_dummy(x, spec);
                     return Outs{x};
                   };
                   const double bytes = double(dtype_size(dt)) * double(s[0] * s[1]);
                   return same_op(d, r, run, run, {{Measure::bytes, 0.0}}, bytes);
                 }});
  }
}

}  // namespace dsaserve::kernels::testing::cases
