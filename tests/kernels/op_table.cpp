#include "kernels/op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <set>

#include "core/dummy_fill.h"
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

namespace {

// GLM-5.3 layer widths (../shared/fixtures/configs/glm-5.3.json).
constexpr int64_t kH = 6144, kQLora = 2048, kKvLora = 512, kRope = 64, kNope = 192, kV = 256, kHeads = 64;
constexpr int64_t kIh = 32, kId = 128, kTopk = 2048, kExperts = 256, kTopK = 8, kI = 2048, kVocab = 154880;
constexpr int64_t kPage = 64;
const std::vector<int64_t> kTokens = {1, 7, 33, 257};
constexpr double kTolElem = 1e-5, kTolAttn = 1e-4, kTolBf16 = 1e-2, kTolFp8 = 5e-2;
constexpr Check kElem{Measure::elem, kTolElem};
constexpr Check kExact{Measure::ids, 0.0};
constexpr double kF32 = 4, kI32 = 4;  // bytes per element

using Outs = std::vector<Tensor>;

Tensor on(const Tensor& t, const Backend& b) { return t.device() == b.device() ? t : t.to(b.device()); }
WeightRef on(const WeightRef& w, const Backend& b) { return weight_on(w, b.device()); }
Tensor ids_on(const std::vector<int32_t>& v, const Backend& b) { return i32_tensor(v, b.device()); }
// A copy of its own on b's device (what an in-place operator updates: each side works on its own).
Tensor own(const Tensor& t, const Backend& b) {
  return t.device() == b.device() ? t.clone() : t.to(b.device());
}
double weight_bytes(const WeightRef& w) { return double(w.weight.nbytes()); }

// A case over one input pair: `f(backend, inputs...)` run on each side with its own copies.
OpRun same_op(Backend& dev, Backend& ref, std::function<Outs(Backend&)> on_dev,
              std::function<Outs(Backend&)> on_ref, std::vector<Check> checks, double bytes, double flops = 0,
              bool fp8 = false) {
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
  RopeParams p;  // GLM-5.3: theta 1e6; MLA interleaved, the indexer NeoX
  p.dim = kRope;
  p.theta = 1e6;
  p.interleaved = interleaved;
  return p;
}

RopeParams yarn_rope() {
  RopeParams p = glm_rope(true);  // DeepSeek-V3.2's yarn
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
             const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 1200), wd = on(w, d);
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
                     const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 1200), wd = on(w, d);
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
         const int64_t start = 100, S = start + T;
         const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 3500 + uint64_t(T), 0.3f);
         const Tensor kvx = rand_f32({S, kHeads, kNope + kV}, 3600 + uint64_t(T), 0.3f);
         const Tensor lat = rand_f32({S, kKvLora + kRope}, 3700 + uint64_t(T), 0.3f);
         const Tensor qd = on(q, d), kd = on(kvx, d), ld = on(lat, d);
         auto run = [=](Backend& b, const Tensor& qq, const Tensor& kk, const Tensor& ll) {
           return Outs{b.attention_mha(qq, kk.slice(2, 0, kNope), ll.slice(1, kKvLora, kKvLora + kRope),
                                       kk.slice(2, kNope, kNope + kV), start, {}, mscale)};
         };
         const double keys = double(T) * double(start) + double(T * (T + 1)) / 2;
         return same_op(
             d, r, [=](Backend& b) { return run(b, qd, kd, ld); },
             [=](Backend& b) { return run(b, q, kvx, lat); }, {{Measure::elem, kTolAttn}},
             double(S * kHeads * (kNope + kV)) * kF32, 2.0 * keys * kHeads * double(kNope + kRope + kV));
       }});
}

// ---- MLA fused / batched operators ----

void add_mla_cases(std::vector<OpCase>& t) {
  // Absorbed projections over all 64 heads of kv_b [64 x 448, 512]: bf16 products (an FP8 kv_b runs as
  // its bf16 dequantisation), per row L2 within 1e-2.
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
    t.push_back(
        {"absorb_q", fmt::format("{} kv_b, 64 heads", tag), kTokens, [=](Backend& d, Backend& r, int64_t T) {
           const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 3800), wd = on(w, d);
           const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 3900 + uint64_t(T)), qd = on(q, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.absorb_q(qd.slice(2, 0, kNope), wd, {})}; },
               [=](Backend& b) { return Outs{b.absorb_q(q.slice(2, 0, kNope), w, {})}; },
               {{Measure::gemm_l2, kTolBf16}}, double(kHeads * kNope * kKvLora) * double(dtype_size(dt)),
               2.0 * double(T * kHeads * kNope * kKvLora));
         }});
    t.push_back(
        {"absorb_v", fmt::format("{} kv_b, 64 heads", tag), kTokens, [=](Backend& d, Backend& r, int64_t T) {
           const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 3800), wd = on(w, d);
           const Tensor lat = rand_f32({T, kHeads, kKvLora}, 4000 + uint64_t(T)), ld = on(lat, d);
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.absorb_v(ld, wd, kV, {})}; },
               [=](Backend& b) { return Outs{b.absorb_v(lat, w, kV, {})}; }, {{Measure::gemm_l2, kTolBf16}},
               double(kHeads * kV * kKvLora) * double(dtype_size(dt)),
               2.0 * double(T * kHeads * kV * kKvLora));
         }});
  }
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
  // experts with positive weights like a router's.
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    constexpr int64_t kE = 32;
    t.push_back(
        {"moe_experts", fmt::format("{} 32 experts top-8", dt == DType::bf16 ? "bf16" : "fp8"),
         dt == DType::bf16 ? std::vector<int64_t>{1, 7, 33} : kTokens,
         [=](Backend& d, Backend& r, int64_t T) {
           auto ex = std::make_shared<std::vector<MlpRef>>(), ex_d = std::make_shared<std::vector<MlpRef>>();
           for (int64_t e = 0; e < kE; ++e) {
             MlpRef m{rand_weight(kI, kH, dt, 5000 + 3 * uint64_t(e)),
                      rand_weight(kI, kH, dt, 5001 + 3 * uint64_t(e)),
                      rand_weight(kH, kI, dt, 5002 + 3 * uint64_t(e))};
             ex_d->push_back({on(m.gate, d), on(m.up, d), on(m.down, d)});
             ex->push_back(std::move(m));
           }
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
           const Tensor x = rand_f32({T, kH}, 5200 + uint64_t(T)), xd = on(x, d);
           const Routing rd{on(rt.ids, d), on(rt.weights, d)};
           const double per_expert = 3.0 * double(kI * kH) * double(dtype_size(dt));
           return same_op(
               d, r, [=](Backend& b) { return Outs{b.moe_experts(xd, rd, *ex_d)}; },
               [=](Backend& b) { return Outs{b.moe_experts(x, rt, *ex)}; },
               {{Measure::gemm_l2, dt == DType::bf16 ? kTolBf16 : kTolFp8}},
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

}  // namespace

std::vector<OpCase> op_table() {
  std::vector<OpCase> t;
  add_row_cases(t);
  add_linear_cases(t);
  add_elementwise_cases(t);
  add_attention_cases(t);
  add_mla_cases(t);
  add_moe_cases(t);
  add_dummy_cases(t);
  return t;
}

std::vector<std::string> op_table_ops() {
  std::set<std::string> s;
  for (const OpCase& c : op_table()) s.insert(c.op);
  return {s.begin(), s.end()};
}

}  // namespace dsaserve::kernels::testing
