#include "kernels/op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "kernels/op_table_cases.h"
#include "kernels/tensor_compare.h"

namespace dsaserve::kernels::testing {

std::string_view measure_name(Measure m) {
  switch (m) {
    case Measure::elem: return "max_rel";
    case Measure::gemm_l2: return "l2_rel";
    case Measure::ids: return "mismatch";
    case Measure::bytes: return "bytes_differ";
  }
  return "?";
}

double measure(Measure m, const Tensor& got, const Tensor& want) {
  switch (m) {
    case Measure::elem: return row_rel_error(got, want);
    case Measure::gemm_l2: return row_l2_rel_error(got, want);
    case Measure::ids: return mismatch(got, want);
    case Measure::bytes: return byte_mismatch(got, want);
  }
  return INFINITY;
}

namespace cases {

Tensor on(const Tensor& t, const Backend& b) { return t.device() == b.device() ? t : t.to(b.device()); }
WeightRef on(const WeightRef& w, const Backend& b, WeightUse use) {
  WeightRef r = weight_on(w, b.device());
  r.derived = b.derive_weight(r, use);
  return r;
}
Tensor ids_on(const std::vector<int32_t>& v, const Backend& b) { return i32_tensor(v, b.device()); }
Tensor own(const Tensor& t, const Backend& b) {
  return t.device() == b.device() ? t.clone() : t.to(b.device());
}
double weight_bytes(const WeightRef& w) { return double(w.weight.nbytes()); }

OpRun same_op(Backend& dev, Backend& ref, std::function<Outs(Backend&)> on_dev,
              std::function<Outs(Backend&)> on_ref, std::vector<Check> checks, double bytes, double flops,
              bool fp8) {
  OpRun r;
  r.device = [&dev, f = std::move(on_dev)] { return f(dev); };
  r.reference = [&ref, f = std::move(on_ref)] { return f(ref); };
  r.checks = std::move(checks);
  r.bytes = bytes;
  r.flops = flops;
  r.fp8 = fp8;
  return r;
}

std::vector<int32_t> random_ids(int64_t n, int64_t below, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  Rng r(seed);
  for (auto& x : v) x = int32_t(r.below(below));
  return v;
}

RopeParams glm_rope(bool interleaved) {
  RopeParams p;
  p.dim = kRope;
  p.theta = 1e6;
  p.interleaved = interleaved;
  return p;
}

RopeParams yarn_rope() {
  RopeParams p = glm_rope(true);
  p.theta = 10000;
  p.yarn = true;
  p.factor = 40;
  p.original_max_position_embeddings = 4096;
  return p;
}

// ---- row operators ----

void add_row_cases(std::vector<OpCase>& t) {
  for (auto [variant, dt, vocab, width] :
       {std::tuple{"bf16 table", DType::bf16, int64_t(16384), kH},
        std::tuple{"f32 table", DType::f32, int64_t(512), int64_t(1000)},
        std::tuple{"width 1004", DType::bf16, int64_t(512), int64_t(1004)}}) {
    t.push_back(
        {"embedding", variant, kTokens, [=](Backend& d, Backend& r, int64_t T) {
           const Tensor tab = dt == DType::bf16 ? rand_bf16({vocab, width}, 1) : rand_f32({vocab, width}, 1);
           const std::vector<int32_t> ids = random_ids(T, vocab, uint64_t(T));
           const Tensor tab_d = on(tab, d), ids_d = ids_on(ids, d), ids_r = i32_tensor(ids);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.embedding(tab_d, ids_d)}; },
               [=](Backend& b) { return Outs{b.embedding(tab, ids_r)}; }, {kElem},
               double(T) * double(width) * (dtype_size(dt) + kF32));
         }});
  }
  // rms_norm: the model width, the register-resident variants (1..8 float4 per thread), one past the
  // largest (scalar), a width off the vector width, and views (the kv latent; shifted by one element).
  for (int64_t n :
       {kH, int64_t(1002), int64_t(2048), int64_t(4096), int64_t(7168), int64_t(8192), int64_t(8196)}) {
    t.push_back(
        {"rms_norm", fmt::format("width {}", n), kTokens, [=](Backend& d, Backend& r, int64_t T) {
           const Tensor x = rand_f32({T, n}, 10 + uint64_t(T) + uint64_t(n), 3.0f), w = rand_bf16({n}, 2);
           const Tensor xd = on(x, d), wd = on(w, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.rms_norm(xd, wd, 1e-5)}; },
               [=](Backend& b) { return Outs{b.rms_norm(x, w, 1e-5)}; }, {kElem}, double(T * n) * 2 * kF32);
         }});
  }
  for (int64_t c0 : {int64_t(0), int64_t(1)}) {
    t.push_back(
        {"rms_norm", c0 ? "kv latent view shifted by 1" : "kv latent view", kTokens,
         [=](Backend& d, Backend& r, int64_t T) {
           const Tensor ckv = rand_f32({T, kKvLora + kRope}, 30 + uint64_t(T)), w = rand_bf16({kKvLora}, 5);
           const Tensor cd = on(ckv, d), wd = on(w, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.rms_norm(cd.slice(1, c0, c0 + kKvLora), wd, 1e-6)}; },
               [=](Backend& b) { return Outs{b.rms_norm(ckv.slice(1, c0, c0 + kKvLora), w, 1e-6)}; }, {kElem},
               double(T * kKvLora) * 2 * kF32);
         }});
  }
  // add_rms_norm: the normed output and the updated residual; bf16 and f32 weights; the residual a view
  // inside a wider tensor (aligned, and shifted by one element: the scalar path).
  for (auto [variant, f32w, shift] : {std::tuple{"bf16 weight", false, int64_t(-1)},
                                      std::tuple{"f32 weight, residual view", true, int64_t(64)},
                                      std::tuple{"f32 weight, residual shifted by 1", true, int64_t(1)}}) {
    t.push_back({"add_rms_norm", variant, kTokens, [=](Backend& d, Backend& r, int64_t T) {
                   const Tensor x = rand_f32({T, kH}, 40 + uint64_t(T), 3.0f);
                   const Tensor w = f32w ? rand_f32({kH}, 8) : rand_bf16({kH}, 2);
                   const int64_t c0 = shift < 0 ? 0 : shift, width = kH + (shift < 0 ? 0 : 64);
                   const Tensor wide = rand_f32({T, width}, 50 + uint64_t(T)), xd = on(x, d), wd = on(w, d);
                   const Tensor mine_d = own(wide, d), mine_r = own(wide, r);
                   auto run = [c0](Backend& b, Tensor all, const Tensor& xx, const Tensor& ww) {
                     Tensor res = all.slice(1, c0, c0 + kH);
                     Tensor o = b.add_rms_norm(res, xx, ww, 1e-5);
                     return Outs{o, all};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, mine_d, xd, wd); },
                       [=](Backend& b) { return run(b, mine_r, x, w); }, {kElem, kElem},
                       double(T * kH) * 4 * kF32);
                 }});
  }
  t.push_back({"layer_norm", "indexer k (128)", kTokens, [](Backend& d, Backend& r, int64_t T) {
                 const Tensor x = rand_f32({T, kId}, 60 + uint64_t(T), 2.0f), w = rand_bf16({kId}, 3),
                              bb = rand_bf16({kId}, 4);
                 const Tensor xd = on(x, d), wd = on(w, d), bd = on(bb, d);
                 return same_op(
                     d, r, [=](Backend& b) { return Outs{b.layer_norm(xd, wd, bd, 1e-6)}; },
                     [=](Backend& b) { return Outs{b.layer_norm(x, w, bb, 1e-6)}; }, {kElem},
                     double(T * kId) * 2 * kF32);
               }});
}

// ---- linears ----

struct GemmShape {
  const char* name;
  int64_t n, k;
};
constexpr GemmShape kGemms[] = {{"q_a_proj", kQLora, kH},
                                {"q_b_proj", kHeads*(kNope + kRope), kQLora},
                                {"kv_a_proj", kKvLora + kRope, kH},
                                {"kv_b_proj", kHeads*(kNope + kV), kKvLora},
                                {"o_proj", kH, kHeads* kV},
                                {"expert_gate_up", kI, kH},
                                {"expert_down", kH, kI},
                                {"router_gate", kExperts, kH},
                                {"indexer_wk_weights", kId + kIh, kH}};

void add_linear_cases(std::vector<OpCase>& t) {
  for (DType dt : {DType::bf16, DType::f8e4m3fn, DType::f32}) {
    const char* tag = dt == DType::bf16 ? "bf16" : dt == DType::f32 ? "f32" : "fp8";
    for (const GemmShape& g : kGemms) {
      const std::string name = g.name;
      if (dt == DType::f8e4m3fn && (name == "router_gate" || name == "indexer_wk_weights")) continue;  // bf16
      if (dt == DType::f32 && name != "router_gate") continue;  // f32 routers (DeepSeek's e_score path)
      const double tol = dt == DType::bf16 ? kTolBf16 : dt == DType::f32 ? kTolAttn : kTolFp8;
      const Measure m = dt == DType::f32 ? Measure::elem : Measure::gemm_l2;
      t.push_back({"linear", fmt::format("{} {} [{} x {}]", tag, g.name, g.n, g.k), kTokens,
                   [=](Backend& d, Backend& r, int64_t T) {
                     const WeightRef w = rand_weight(g.n, g.k, dt, 900 + uint64_t(g.n + g.k)), wd = on(w, d);
                     const Tensor x = rand_f32({T, g.k}, 1000 + uint64_t(T + g.n)), xd = on(x, d);
                     return same_op(
                         d, r, [=](Backend& b) { return Outs{b.linear(xd, wd, 0, -1, {})}; },
                         [=](Backend& b) { return Outs{b.linear(x, w, 0, -1, {})}; }, {{m, tol}},
                         weight_bytes(w) + double(T) * double(g.k + g.n) * kF32, 2.0 * double(T * g.n * g.k),
                         dt == DType::f8e4m3fn);
                   }});
    }
  }
  // The narrow bf16 linears at decode and prefill sizes, held to the two-term recipe's accuracy (1e-4 per
  // row L2; one bf16 term would give ~3e-3): router_gate (the split pass + cuBLASLt at T = 4096), and the
  // indexer's wk + weights_proj through linear_multi (at T = 4096 one launch of the fused two-term kernel:
  // KernelOptions::gemm_split_fused_min_tokens, kernels/cuda/gemm/gemm_f32act_params.h).
  const std::vector<int64_t> prefill_tokens = {1, 33, 4096};
  constexpr double kTolSplit = 1e-4;
  t.push_back(
      {"linear", "bf16 router_gate [256 x 6144], prefill sizes", prefill_tokens,
       [=](Backend& d, Backend& r, int64_t T) {
         const WeightRef w = rand_weight(kExperts, kH, DType::bf16, 950), wd = on(w, d);
         const Tensor x = rand_f32({T, kH}, 960 + uint64_t(T), 2.0f), xd = on(x, d);
         return same_op(
             d, r, [=](Backend& b) { return Outs{b.linear(xd, wd, 0, -1, {})}; },
             [=](Backend& b) { return Outs{b.linear(x, w, 0, -1, {})}; }, {{Measure::gemm_l2, kTolSplit}},
             weight_bytes(w) + double(T) * double(kH + kExperts) * kF32, 2.0 * double(T * kExperts * kH));
       }});
  t.push_back({"linear_multi", "bf16 indexer wk + weights_proj [128 + 32 x 6144], prefill sizes",
               prefill_tokens, [=](Backend& d, Backend& r, int64_t T) {
                 const std::vector<WeightRef> ws = {rand_weight(kId, kH, DType::bf16, 970),
                                                    rand_weight(kIh, kH, DType::bf16, 971)};
                 const std::vector<WeightRef> wd = {on(ws[0], d), on(ws[1], d)};
                 const Tensor x = rand_f32({T, kH}, 980 + uint64_t(T), 2.0f), xd = on(x, d);
                 return same_op(
                     d, r, [=](Backend& b) { return b.linear_multi(xd, wd, nullptr); },
                     [=](Backend& b) { return b.linear_multi(x, ws, nullptr); },
                     {{Measure::gemm_l2, kTolSplit}, {Measure::gemm_l2, kTolSplit}},
                     weight_bytes(ws[0]) + weight_bytes(ws[1]) + double(T) * double(kH + kId + kIh) * kF32,
                     2.0 * double(T * (kId + kIh) * kH));
               }});
  // The absorbed-MLA products on one head's rows of kv_b: q_lat[h] = q_nope[h] @ W_UK[h] (linear_t) and
  // o[h] = out_lat[h] @ W_UV[h]^T written into a column slice of the output (the neighbouring head must
  // stay as it was), for head 0 and an odd head (unaligned rows).
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
    const double tol = dt == DType::bf16 ? kTolBf16 : kTolFp8;
    for (int64_t h : {int64_t(0), int64_t(5)}) {
      const int64_t base = h * (kNope + kV);
      t.push_back(
          {"linear_t", fmt::format("{} W_UK head {}", tag, h), kTokens,
           [=](Backend& d, Backend& r, int64_t T) {
             const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 1200),
                             wd = on(w, d, WeightUse::absorb);
             const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 1300 + uint64_t(T)), qd = on(q, d);
             return same_op(
                 d, r,
                 [=](Backend& b) {
                   return Outs{b.linear_t(qd.select(1, h).slice(1, 0, kNope), wd, base, base + kNope, {})};
                 },
                 [=](Backend& b) {
                   return Outs{b.linear_t(q.select(1, h).slice(1, 0, kNope), w, base, base + kNope, {})};
                 },
                 {{Measure::gemm_l2, tol}}, double(kNope * kKvLora) * double(dtype_size(dt)),
                 2.0 * double(T * kNope * kKvLora));
           }});
      t.push_back({"linear", fmt::format("{} W_UV into a head's columns, head {}", tag, h), kTokens,
                   [=](Backend& d, Backend& r, int64_t T) {
                     const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 1200),
                                     wd = on(w, d, WeightUse::absorb);
                     const Tensor lat = rand_f32({T, kKvLora}, 1400 + uint64_t(T)), ld = on(lat, d);
                     const Tensor out = rand_f32({T, kHeads, kV}, 1500 + uint64_t(T));
                     const Tensor out_d = own(out, d), out_r = own(out, r);
                     auto run = [=](Backend& b, Tensor all, const Tensor& x, const WeightRef& ww) {
                       Tensor o = all.select(1, h);
                       b.linear(x, ww, base + kNope, base + kNope + kV, o);
                       // The head's columns and its neighbour's, as contiguous tensors (strided device
                       // views do not copy to the host).
                       Outs heads;
                       for (int64_t k : {h, h + 1}) {
                         Tensor c = Tensor::empty({all.size(0), kV}, DType::f32, b.device());
                         b.copy_rows(c, all.select(1, k));
                         heads.push_back(c);
                       }
                       return heads;
                     };
                     return same_op(
                         d, r, [=](Backend& b) { return run(b, out_d, ld, wd); },
                         [=](Backend& b) { return run(b, out_r, lat, w); },
                         {{Measure::gemm_l2, tol}, {Measure::elem, 0.0}},
                         double(kV * kKvLora) * double(dtype_size(dt)), 2.0 * double(T * kV * kKvLora));
                   }});
    }
  }
  // derive_weight: the forms a backend derives from a weight at model load (kernels/ops.h DerivedWeight;
  // every case's device weights carry them, as a model's do: cases::on), here read by the products of an
  // FP8 kv_b (the MHA form's linear and the absorbed q projection), against the CPU's on the weight as
  // stored (which derives none).
  t.push_back({"derive_weight", "fp8 kv_b: linear and absorb_q on its derived forms", kTokens,
               [=](Backend& d, Backend& r, int64_t T) {
                 const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, DType::f8e4m3fn, 1250);
                 const WeightRef wd = on(w, d, WeightUse::absorb);
                 const Tensor x = rand_f32({T, kKvLora}, 1260 + uint64_t(T)), xd = on(x, d);
                 const Tensor q = rand_f32({T, kHeads, kNope}, 1270 + uint64_t(T)), qd = on(q, d);
                 return same_op(
                     d, r,
                     [=](Backend& b) {
                       return Outs{b.linear(xd, wd, 0, -1, {}), b.absorb_q(qd, wd, {})};
                     },
                     [=](Backend& b) {
                       return Outs{b.linear(x, w, 0, -1, {}), b.absorb_q(q, w, {})};
                     },
                     {{Measure::gemm_l2, kTolFp8}, {Measure::gemm_l2, kTolBf16}}, 2.0 * weight_bytes(w),
                     2.0 * double(T * kHeads * (kNope + kV) * kKvLora) +
                         2.0 * double(T * kHeads * kNope * kKvLora),
                     true);
               }});
  // linear_multi: the parts of a projection sharing their input (q_a + kv_a; gate + up), with and without
  // the FP8 copy of the input that norm_fp8 leaves (the CPU makes none: its results are the plain ones).
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    for (bool via_norm : {false, true}) {
      if (via_norm && dt != DType::f8e4m3fn) continue;
      const double tol = dt == DType::bf16 ? kTolBf16 : kTolFp8;
      t.push_back({"linear_multi",
                   fmt::format("{} q_a + kv_a{}", dt == DType::bf16 ? "bf16" : "fp8",
                               via_norm ? " on norm_fp8's copy" : ""),
                   kTokens, [=](Backend& d, Backend& r, int64_t T) {
                     const std::vector<WeightRef> ws = {rand_weight(kQLora, kH, dt, 1600),
                                                        rand_weight(kKvLora + kRope, kH, dt, 1601)};
                     const std::vector<WeightRef> wd = {on(ws[0], d), on(ws[1], d)};
                     const Tensor x = rand_f32({T, kH}, 1700 + uint64_t(T), 3.0f), nw = rand_bf16({kH}, 9);
                     const Tensor xd = on(x, d), nwd = on(nw, d);
                     auto run = [=](Backend& b, const Tensor& xx, const Tensor& nn,
                                    const std::vector<WeightRef>& w) {
                       if (!via_norm) return b.linear_multi(xx, w, nullptr);
                       Fp8Act q;
                       const Tensor h = b.norm_fp8(nullptr, xx, nn, 1e-5, q);
                       return b.linear_multi(h, w, q.defined() ? &q : nullptr);
                     };
                     return same_op(
                         d, r, [=](Backend& b) { return run(b, xd, nwd, wd); },
                         [=](Backend& b) { return run(b, x, nw, ws); },
                         {{Measure::gemm_l2, tol}, {Measure::gemm_l2, tol}},
                         weight_bytes(ws[0]) + weight_bytes(ws[1]) +
                             double(T) * double(kH + kQLora + kKvLora + kRope) * kF32,
                         2.0 * double(T * kH * (kQLora + kKvLora + kRope)), dt == DType::f8e4m3fn);
                   }});
    }
  }
  // norm_fp8: the normed output and the residual are the plain norm's; its FP8 copy is checked by what
  // reads it (linear_multi above; gemm_small_test checks the codes themselves).
  for (bool with_residual : {false, true}) {
    t.push_back({"norm_fp8", with_residual ? "add + rms_norm" : "rms_norm", kTokens,
                 [=](Backend& d, Backend& r, int64_t T) {
                   const Tensor x = rand_f32({T, kH}, 1800 + uint64_t(T), 3.0f), w = rand_bf16({kH}, 10);
                   const Tensor res = rand_f32({T, kH}, 1900 + uint64_t(T));
                   const Tensor xd = on(x, d), wd = on(w, d);
                   const Tensor res_d = own(res, d), res_r = own(res, r);
                   auto run = [=](Backend& b, Tensor rr, const Tensor& xx, const Tensor& ww) {
                     Fp8Act q;
                     const Tensor o = b.norm_fp8(with_residual ? &rr : nullptr, xx, ww, 1e-5, q);
                     return Outs{o, rr};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, res_d, xd, wd); },
                       [=](Backend& b) { return run(b, res_r, x, w); }, {kElem, kElem},
                       double(T * kH) * 4 * kF32);
                 }});
  }
}

// ---- elementwise, copies, paged caches ----

void add_elementwise_cases(std::vector<OpCase>& t) {
  for (auto [variant, n, pos_scale] :
       {std::tuple{"interleaved, 64 heads", kHeads, 0}, std::tuple{"yarn, 64 heads", kHeads, 1},
        std::tuple{"neox, indexer 32 heads", kIh, 2}, std::tuple{"interleaved, 5 heads", int64_t(5), 0},
        std::tuple{"neox, 1 head", int64_t(1), 2}}) {
    t.push_back({"rope_inplace", variant, kTokens, [=](Backend& d, Backend& r, int64_t T) {
                   const RopeParams p = pos_scale == 1 ? yarn_rope() : glm_rope(pos_scale == 0);
                   const std::vector<int32_t> pos = random_ids(T, 160000, uint64_t(T));
                   // The rope part inside wider rows (q: nope first; the indexer key: rope first).
                   const int64_t width = kNope + kRope, c0 = pos_scale == 2 ? 0 : kNope;
                   const Tensor x = rand_f32({T, n, width}, 700 + uint64_t(T + n));
                   const Tensor xd = own(x, d), xr = own(x, r);
                   const Tensor pd = ids_on(pos, d), pr = i32_tensor(pos);
                   auto run = [=](Backend& b, Tensor all, const Tensor& pp) {
                     Tensor v = all.slice(2, c0, c0 + kRope);
                     b.rope_inplace(v, pp, p);
                     return Outs{all};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, xd, pd); },
                       [=](Backend& b) { return run(b, xr, pr); }, {kElem}, double(T * n * kRope) * 2 * kF32);
                 }});
  }
  for (int64_t I : {kI, int64_t(1003)}) {
    t.push_back(
        {"silu_mul", fmt::format("gate_up halves, I {}", I), kTokens, [=](Backend& d, Backend& r, int64_t T) {
           const Tensor gu = rand_f32({T, 2 * I}, 1900 + uint64_t(T + I), 4.0f), gd = on(gu, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.silu_mul(gd.slice(1, 0, I), gd.slice(1, I, 2 * I))}; },
               [=](Backend& b) { return Outs{b.silu_mul(gu.slice(1, 0, I), gu.slice(1, I, 2 * I))}; },
               {kElem}, double(T * I) * 3 * kF32);
         }});
  }
  // silu_mul_fp8: silu_mul and (CUDA) its output's FP8 copy, read by an FP8 down projection (768 of its rows)
  // through linear_multi: what the linear gives quantising the output itself (the CPU makes no copy: its
  // linear is exact). The shared expert's width (2048) and the dense MLP's (12288), at decode and prefill
  // sizes.
  for (int64_t I : {kI, int64_t(12288)}) {
    t.push_back({"silu_mul_fp8", fmt::format("gate_up halves, I {}, into an FP8 down projection", I),
                 I == kI ? std::vector<int64_t>{1, 33, 4096} : std::vector<int64_t>{1, 33, 257},
                 [=](Backend& d, Backend& r, int64_t T) {
                   const Tensor gu = rand_f32({T, 2 * I}, 1950 + uint64_t(T + I), 4.0f), gd = on(gu, d);
                   const WeightRef w = rand_weight(768, I, DType::f8e4m3fn, 1960), wd = on(w, d);
                   auto run = [=](Backend& b, const Tensor& x, const WeightRef& down) {
                     Fp8Act q;
                     const Tensor a = b.silu_mul_fp8(x.slice(1, 0, I), x.slice(1, I, 2 * I), q);
                     return Outs{a, b.linear_multi(a, {down}, q.defined() ? &q : nullptr)[0]};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, gd, wd); },
                       [=](Backend& b) { return run(b, gu, w); }, {kElem, {Measure::gemm_l2, kTolFp8}},
                       double(T * I) * 3 * kF32 + double(T * I) + weight_bytes(w) + double(T * 768) * kF32,
                       2.0 * double(T * 768 * I), true);
                 }});
  }
  // argmax over the vocabulary; and rows of small integers full of ties (the first maximum wins; even rows
  // also hold three 6s spread over threads): whole, a vectorised view, an odd width, a shifted view.
  t.push_back({"argmax", "vocab 154880", kTokens, [](Backend& d, Backend& r, int64_t T) {
                 const Tensor x = rand_f32({T, kVocab}, 70 + uint64_t(T), 10.0f), xd = on(x, d);
                 return same_op(
                     d, r, [=](Backend& b) { return Outs{b.argmax(xd)}; },
                     [=](Backend& b) { return Outs{b.argmax(x)}; }, {kExact}, double(T * kVocab) * kF32);
               }});
  for (auto [c0, c1] : {std::pair{int64_t(0), int64_t(20004)}, std::pair{int64_t(0), int64_t(20000)},
                        std::pair{int64_t(0), int64_t(20001)}, std::pair{int64_t(1), int64_t(20001)}}) {
    t.push_back(
        {"argmax", fmt::format("ties, cols {}..{}", c0, c1), kTokens, [=](Backend& d, Backend& r, int64_t T) {
           Tensor ties = Tensor::empty({T, 20004}, DType::f32);
           Rng g(uint64_t(T) + 5);
           float* tp = ties.data<float>();
           for (int64_t i = 0; i < ties.numel(); ++i) tp[i] = float(g.below(6));
           for (int64_t row = 0; row < T; row += 2) {
             for (int k = 0; k < 3; ++k) tp[row * 20004 + g.below(20004)] = 6.0f;
           }
           const Tensor td = on(ties, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.argmax(td.slice(1, c0, c1))}; },
               [=](Backend& b) { return Outs{b.argmax(ties.slice(1, c0, c1))}; }, {kExact},
               double(T * (c1 - c0)) * kF32);
         }});
  }
  // add_inplace: the model width, an odd width, a view shifted by one element (scalar path).
  for (auto [variant, width, c0] :
       {std::tuple{"width 6144", kH, int64_t(-1)}, std::tuple{"width 1003", int64_t(1003), int64_t(-1)},
        std::tuple{"view shifted by 1", kH, int64_t(1)}}) {
    t.push_back({"add_inplace", variant, kTokens, [=](Backend& d, Backend& r, int64_t T) {
                   const int64_t full = c0 < 0 ? width : width + 4, b0 = c0 < 0 ? 0 : c0;
                   const Tensor a = rand_f32({T, full}, 100 + uint64_t(T)),
                                bb = rand_f32({T, width}, 200 + uint64_t(T));
                   const Tensor ad = own(a, d), ar = own(a, r);
                   const Tensor bd = on(bb, d);
                   auto run = [=](Backend& b, Tensor all, const Tensor& y) {
                     Tensor v = all.slice(1, b0, b0 + width);
                     b.add_inplace(v, y);
                     return Outs{all};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, ad, bd); },
                       [=](Backend& b) { return run(b, ar, bb); }, {kElem}, double(T * width) * 3 * kF32);
                 }});
  }
  t.push_back({"copy_rows", "into a column slice", kTokens, [](Backend& d, Backend& r, int64_t T) {
                 const Tensor wide = rand_f32({T, 2 * kH}, 300 + uint64_t(T)),
                              src = rand_f32({T, kH}, 310 + uint64_t(T));
                 const Tensor wd = own(wide, d), wr = own(wide, r);
                 const Tensor sd = on(src, d);
                 auto run = [](Backend& b, Tensor all, const Tensor& s) {
                   Tensor dst = all.slice(1, kH, 2 * kH);
                   b.copy_rows(dst, s);
                   return Outs{all};
                 };
                 return same_op(
                     d, r, [=](Backend& b) { return run(b, wd, sd); },
                     [=](Backend& b) { return run(b, wr, src); }, {kElem}, double(T * kH) * 2 * kF32);
               }});
  t.push_back({"gather_rows", "hidden rows", kTokens, [](Backend& d, Backend& r, int64_t T) {
                 const Tensor x = rand_f32({T, kH}, 320 + uint64_t(T)), xd = on(x, d);
                 const std::vector<int32_t> idx = random_ids(T, T, uint64_t(T) + 1);
                 const Tensor id = ids_on(idx, d), ir = i32_tensor(idx);
                 return same_op(
                     d, r, [=](Backend& b) { return Outs{b.gather_rows(xd, id)}; },
                     [=](Backend& b) { return Outs{b.gather_rows(x, ir)}; }, {kElem},
                     double(T * kH) * 2 * kF32);
               }});
  // Paged KV: one request's new rows (start 100, pages in reverse order) stored into the kv_lora columns
  // and the rope columns of a [slots, kv_lora + rope] cache; then its first 100 + T rows gathered.
  for (bool gather : {false, true}) {
    t.push_back({gather ? "paged_gather" : "paged_store", "latent columns, pages reversed", kTokens,
                 [=](Backend& d, Backend& r, int64_t T) {
                   const int64_t start = 100, n = start + T, pages = (n + kPage - 1) / kPage + 3;
                   std::vector<int32_t> table(static_cast<size_t>(pages));
                   std::iota(table.rbegin(), table.rend(), 0);
                   std::vector<int32_t> slots(static_cast<size_t>(T));
                   for (int64_t i = 0; i < T; ++i) {
                     const int64_t p = start + i;
                     slots[size_t(i)] = int32_t(table[size_t(p / kPage)] * kPage + p % kPage);
                   }
                   const Tensor cache = rand_f32({pages * kPage, kKvLora + kRope}, 400 + uint64_t(T));
                   const Tensor cd = own(cache, d), cr = own(cache, r);
                   const Tensor kv = rand_f32({T, kKvLora}, 500 + uint64_t(T)),
                                pe = rand_f32({T, kRope}, 600 + uint64_t(T));
                   const Tensor kvd = on(kv, d), ped = on(pe, d), sd = ids_on(slots, d),
                                sr = i32_tensor(slots);
                   const Tensor td = ids_on(table, d), tr = i32_tensor(table);
                   auto run = [=](Backend& b, Tensor c, const Tensor& s, const Tensor& k, const Tensor& e,
                                  const Tensor& tab) {
                     if (gather) return Outs{b.paged_gather(PagedSeq{c, tab, kPage}, n)};
                     Tensor lat = c.slice(1, 0, kKvLora), rope = c.slice(1, kKvLora, kKvLora + kRope);
                     b.paged_store(lat, s, k);
                     b.paged_store(rope, s, e);
                     return Outs{c};
                   };
                   return same_op(
                       d, r, [=](Backend& b) { return run(b, cd, sd, kvd, ped, td); },
                       [=](Backend& b) { return run(b, cr, sr, kv, pe, tr); }, {kElem},
                       double((gather ? n : T) * (kKvLora + kRope)) * 2 * kF32);
                 }});
  }
}

}  // namespace cases

std::vector<OpCase> op_table() {
  std::vector<OpCase> t;
  cases::add_row_cases(t);
  cases::add_linear_cases(t);
  cases::add_elementwise_cases(t);
  cases::add_attention_cases(t);
  cases::add_mla_cases(t);
  cases::add_moe_cases(t);
  cases::add_dummy_cases(t);
  return t;
}

std::vector<std::string> op_table_ops() {
  std::set<std::string> s;
  for (const OpCase& c : op_table()) s.insert(c.op);
  return {s.begin(), s.end()};
}

}  // namespace dsaserve::kernels::testing
