// Every CUDA operator against the CPU reference (kernels/cpu) on random inputs at GLM-5.3 layer shapes
// (hidden 6144, q_lora 2048, kv_lora 512, rope 64, nope 192, v 256, 64 heads, indexer 32 x 128 top-2048,
// 256 experts top-8, moe_intermediate 2048) and ragged token counts (1, 7, 33, 257). Tolerances: bf16
// GEMMs 1e-2, FP8 GEMMs 5e-2 (per row ||diff||_2 / ||ref||_2, the largest-element measure printed beside
// it), elementwise 1e-5 (max |diff| / max |ref| per row), fp32 attention reductions 1e-4, selections
// (routing, indexer top-k) exact up to near-ties. Each row prints a "RESULT" line.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <tuple>

#include "gpu_test.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/runtime.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace testing;

constexpr int64_t kH = 6144, kQLora = 2048, kKvLora = 512, kRope = 64, kNope = 192, kV = 256, kHeads = 64;
constexpr int64_t kTokens[] = {1, 7, 33, 257};
constexpr double kTolElem = 1e-5, kTolAttn = 1e-4, kTolBf16 = 1e-2, kTolFp8 = 5e-2;

class CudaOps : public testing::GpuTest {
 protected:
  void TearDown() override {
    if (has_gpu()) clear_gemm_caches();
  }
  Backend& gpu() { return cuda_backend(); }
  Backend& ref() { return backend(Device::cpu); }
};

Tensor on_gpu(const Tensor& t) { return t.to(Device::cuda); }
Tensor i32(const std::vector<int32_t>& v, Device d = Device::cpu) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return d == Device::cpu ? t : t.to(d);
}
std::string shp(std::initializer_list<int64_t> s) { return shape_str(Shape(s)); }

TEST_F(CudaOps, EmbeddingNormsSiluArgmax) {
  const Tensor table = rand_bf16({16384, kH}, 1);
  const Tensor table_d = on_gpu(table);
  const Tensor w = rand_bf16({kH}, 2), w_d = on_gpu(w);
  const Tensor wl = rand_bf16({128}, 3), bl = rand_bf16({128}, 4);
  for (int64_t T : kTokens) {
    std::vector<int32_t> ids(static_cast<size_t>(T));
    Rng r(T);
    for (auto& v : ids) v = int32_t(r.below(16384));
    report("embedding", shp({T, kH}),
           row_rel_error(gpu().embedding(table_d, i32(ids, Device::cuda)), ref().embedding(table, i32(ids))),
           kTolElem);
    const Tensor x = rand_f32({T, kH}, 10 + T, 3.0f), x_d = on_gpu(x);
    report("rms_norm", shp({T, kH}),
           row_rel_error(gpu().rms_norm(x_d, w_d, 1e-5), ref().rms_norm(x, w, 1e-5)), kTolElem);
    // add_rms_norm: both the normed output and the updated residual.
    Tensor res = rand_f32({T, kH}, 20 + T), res_d = on_gpu(res);
    const Tensor o_d = gpu().add_rms_norm(res_d, x_d, w_d, 1e-5), o = ref().add_rms_norm(res, x, w, 1e-5);
    report("add_rms_norm", shp({T, kH}), std::max(row_rel_error(o_d, o), row_rel_error(res_d, res)),
           kTolElem);
    // rms_norm of a strided view (the kv latent inside [T, kv_lora + rope]).
    const Tensor ckv = rand_f32({T, kKvLora + kRope}, 30 + T), ckv_d = on_gpu(ckv);
    const Tensor wk = rand_bf16({kKvLora}, 5), wk_d = on_gpu(wk);
    report("rms_norm(view)", shp({T, kKvLora}),
           row_rel_error(gpu().rms_norm(ckv_d.slice(1, 0, kKvLora), wk_d, 1e-6),
                         ref().rms_norm(ckv.slice(1, 0, kKvLora), wk, 1e-6)),
           kTolElem);
    const Tensor xi = rand_f32({T, 128}, 40 + T, 2.0f);
    report("layer_norm", shp({T, 128}),
           row_rel_error(gpu().layer_norm(on_gpu(xi), on_gpu(wl), on_gpu(bl), 1e-6),
                         ref().layer_norm(xi, wl, bl, 1e-6)),
           kTolElem);
    const Tensor g = rand_f32({T, 2048}, 50 + T, 4.0f), u = rand_f32({T, 2048}, 60 + T);
    report("silu_mul", shp({T, 2048}),
           row_rel_error(gpu().silu_mul(on_gpu(g), on_gpu(u)), ref().silu_mul(g, u)), kTolElem);
    const Tensor logits = rand_f32({T, 154880}, 70 + T, 10.0f);
    report("argmax", shp({T, 154880}), mismatch(gpu().argmax(on_gpu(logits)), ref().argmax(logits)), 0.0);
  }
}

TEST_F(CudaOps, RowCopiesGathersPagedCache) {
  for (int64_t T : kTokens) {
    Tensor a = rand_f32({T, kH}, 100 + T), b = rand_f32({T, kH}, 200 + T);
    Tensor a_d = on_gpu(a);
    gpu().add_inplace(a_d, on_gpu(b));
    ref().add_inplace(a, b);
    report("add_inplace", shp({T, kH}), row_rel_error(a_d, a), kTolElem);
    // copy_rows into a column slice of a wider tensor.
    Tensor wide = rand_f32({T, 2 * kH}, 300 + T), wide_d = on_gpu(wide);
    Tensor dst = wide.slice(1, kH, 2 * kH), dst_d = wide_d.slice(1, kH, 2 * kH);
    gpu().copy_rows(dst_d, on_gpu(b));
    ref().copy_rows(dst, b);
    report("copy_rows(view)", shp({T, kH}), row_rel_error(wide_d, wide), kTolElem);
    std::vector<int32_t> idx(static_cast<size_t>(T));
    Rng r(T);
    for (auto& v : idx) v = int32_t(r.below(T));
    report(
        "gather_rows", shp({T, kH}),
        row_rel_error(gpu().gather_rows(on_gpu(b), i32(idx, Device::cuda)), ref().gather_rows(b, i32(idx))),
        kTolElem);
    // Paged KV: store the new rows of a request (start 100, pages shuffled) into the kv_lora columns and
    // the rope columns of a [slots, kv_lora + rope] cache, then gather its first 100 + T rows.
    const int64_t ps = 64, start = 100, n = start + T, pages = (n + ps - 1) / ps + 3;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::reverse(table.begin(), table.end());
    Tensor cache = rand_f32({pages * ps, kKvLora + kRope}, 400 + T), cache_d = on_gpu(cache);
    std::vector<int32_t> slots(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = start + t;
      slots[size_t(t)] = int32_t(table[size_t(p / ps)] * ps + p % ps);
    }
    const Tensor kv = rand_f32({T, kKvLora}, 500 + T), pe = rand_f32({T, kRope}, 600 + T);
    for (auto [c0, c1, src] :
         {std::tuple{int64_t(0), kKvLora, kv}, std::tuple{kKvLora, kKvLora + kRope, pe}}) {
      Tensor view = cache.slice(1, c0, c1), view_d = cache_d.slice(1, c0, c1);
      gpu().paged_store(view_d, i32(slots, Device::cuda), on_gpu(src));
      ref().paged_store(view, i32(slots), src);
    }
    report("paged_store", shp({T, kKvLora + kRope}), row_rel_error(cache_d, cache), kTolElem);
    const PagedSeq seq{cache, i32(table), ps}, seq_d{cache_d, i32(table, Device::cuda), ps};
    report("paged_gather", shp({n, kKvLora + kRope}),
           row_rel_error(gpu().paged_gather(seq_d, n), ref().paged_gather(seq, n)), kTolElem);
  }
}

TEST_F(CudaOps, Rope) {
  RopeParams glm;  // GLM-5.3: theta 1e6, interleaved (MLA) and NeoX (indexer)
  glm.dim = kRope;
  glm.theta = 1e6;
  RopeParams yarn = glm;  // DeepSeek-V3.2's yarn
  yarn.theta = 10000;
  yarn.yarn = true;
  yarn.factor = 40;
  yarn.original_max_position_embeddings = 4096;
  yarn.attention_factor = 1.0;
  for (int64_t T : kTokens) {
    std::vector<int32_t> pos(static_cast<size_t>(T));
    Rng r(T);
    for (auto& p : pos) p = int32_t(r.below(160000));
    for (auto [name, p] : {std::pair{"rope(interleaved)", glm}, std::pair{"rope(yarn)", yarn}}) {
      Tensor q = rand_f32({T, kHeads, kNope + kRope}, 700 + T), q_d = on_gpu(q);
      Tensor pe = q.slice(2, kNope, kNope + kRope), pe_d = q_d.slice(2, kNope, kNope + kRope);
      gpu().rope_inplace(pe_d, i32(pos, Device::cuda), p);
      ref().rope_inplace(pe, i32(pos), p);
      report(name, shp({T, kHeads, kRope}), row_rel_error(q_d, q), kTolElem);
    }
    RopeParams neox = glm;
    neox.interleaved = false;
    Tensor k = rand_f32({T, 32, 128}, 800 + T), k_d = on_gpu(k);
    Tensor kp = k.slice(2, 0, kRope), kp_d = k_d.slice(2, 0, kRope);
    gpu().rope_inplace(kp_d, i32(pos, Device::cuda), neox);
    ref().rope_inplace(kp, i32(pos), neox);
    report("rope(neox)", shp({T, 32, kRope}), row_rel_error(k_d, k), kTolElem);
    // Head counts that do not fill a warp's group of 4 heads (5 heads; 1 head), both layouts.
    for (int64_t nh : {int64_t(5), int64_t(1)}) {
      for (bool inter : {true, false}) {
        RopeParams rp = glm;
        rp.interleaved = inter;
        Tensor h = rand_f32({T, nh, 96}, 900 + T + nh), h_d = on_gpu(h);
        Tensor hp = h.slice(2, 32, 96), hp_d = h_d.slice(2, 32, 96);
        gpu().rope_inplace(hp_d, i32(pos, Device::cuda), rp);
        ref().rope_inplace(hp, i32(pos), rp);
        report(fmt::format("rope({}, {} heads)", inter ? "interleaved" : "neox", nh), shp({T, nh, kRope}),
               row_rel_error(h_d, h), kTolElem);
      }
    }
  }
}

// The row kernels take a 16-byte vectorized path when the width is a multiple of the vector width and the
// views are aligned, the scalar one otherwise: both against the CPU at widths off the vector width,
// views shifted by one element, f32 weights / tables, and argmax rows full of ties (first maximum).
TEST_F(CudaOps, VectorAndScalarPaths) {
  const Tensor w1002 = rand_bf16({1002}, 6), wk = rand_bf16({kKvLora}, 7), wf = rand_f32({kH}, 8);
  const Tensor table_f = rand_f32({512, 1000}, 9), table_odd = rand_bf16({512, 1004}, 10);
  for (int64_t T : kTokens) {
    const Tensor x = rand_f32({T, 1002}, 1500 + T, 3.0f);
    report("rms_norm(width 1002)", shp({T, 1002}),
           row_rel_error(gpu().rms_norm(on_gpu(x), on_gpu(w1002), 1e-5), ref().rms_norm(x, w1002, 1e-5)),
           kTolElem);
    // Row widths for each register-resident variant (1, 2, 4, 6, 8 float4 per thread: 512 and 6144 above)
    // and one past the largest (8196: scalar).
    for (int64_t n : {int64_t(2048), int64_t(4096), int64_t(7168), int64_t(8192), int64_t(8196)}) {
      const Tensor xn = rand_f32({T, n}, 1400 + T + n, 2.0f), wn = rand_bf16({n}, 11 + n);
      report(fmt::format("rms_norm(width {})", n), shp({T, n}),
             row_rel_error(gpu().rms_norm(on_gpu(xn), on_gpu(wn), 1e-5), ref().rms_norm(xn, wn, 1e-5)),
             kTolElem);
    }
    // Columns 1..513 of [T, 576]: the row starts 4 bytes past a 16-byte boundary.
    const Tensor ckv = rand_f32({T, kKvLora + kRope}, 1600 + T), ckv_d = on_gpu(ckv);
    report("rms_norm(shifted view)", shp({T, kKvLora}),
           row_rel_error(gpu().rms_norm(ckv_d.slice(1, 1, 1 + kKvLora), on_gpu(wk), 1e-6),
                         ref().rms_norm(ckv.slice(1, 1, 1 + kKvLora), wk, 1e-6)),
           kTolElem);
    // add_rms_norm with an f32 weight, the residual a view inside a wider tensor (vectorized path).
    const Tensor xh = rand_f32({T, kH}, 1700 + T), xh_d = on_gpu(xh);
    Tensor wide = rand_f32({T, kH + 64}, 1800 + T), wide_d = on_gpu(wide);
    Tensor res = wide.slice(1, 64, kH + 64), res_d = wide_d.slice(1, 64, kH + 64);
    const Tensor o_d = gpu().add_rms_norm(res_d, xh_d, on_gpu(wf), 1e-5),
                 o = ref().add_rms_norm(res, xh, wf, 1e-5);
    report("add_rms_norm(f32 weight, view)", shp({T, kH}),
           std::max(row_rel_error(o_d, o), row_rel_error(wide_d, wide)), kTolElem);
    // Residual shifted by one element (scalar path).
    Tensor res1 = wide.slice(1, 1, kH + 1), res1_d = wide_d.slice(1, 1, kH + 1);
    const Tensor o1_d = gpu().add_rms_norm(res1_d, xh_d, on_gpu(wf), 1e-5),
                 o1 = ref().add_rms_norm(res1, xh, wf, 1e-5);
    report("add_rms_norm(shifted residual)", shp({T, kH}),
           std::max(row_rel_error(o1_d, o1), row_rel_error(wide_d, wide)), kTolElem);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    Rng r(T + 5);
    for (auto& v : ids) v = int32_t(r.below(512));
    report("embedding(f32 table)", shp({T, 1000}),
           row_rel_error(gpu().embedding(on_gpu(table_f), i32(ids, Device::cuda)),
                         ref().embedding(table_f, i32(ids))),
           kTolElem);
    report("embedding(width 1004)", shp({T, 1004}),
           row_rel_error(gpu().embedding(on_gpu(table_odd), i32(ids, Device::cuda)),
                         ref().embedding(table_odd, i32(ids))),
           kTolElem);
    // silu_mul on the halves of a fused gate_up [T, 2 I]: I = 2048 (vectorized), I = 1003 (scalar).
    for (int64_t I : {int64_t(2048), int64_t(1003)}) {
      const Tensor gu = rand_f32({T, 2 * I}, 1900 + T + I, 4.0f), gu_d = on_gpu(gu);
      report(fmt::format("silu_mul(gate_up halves, I {})", I), shp({T, I}),
             row_rel_error(gpu().silu_mul(gu_d.slice(1, 0, I), gu_d.slice(1, I, 2 * I)),
                           ref().silu_mul(gu.slice(1, 0, I), gu.slice(1, I, 2 * I))),
             kTolElem);
    }
    // add_inplace at an odd width and on a shifted view (scalar path).
    Tensor a = rand_f32({T, 1003}, 2000 + T), a_d = on_gpu(a);
    const Tensor b = rand_f32({T, 1003}, 2100 + T);
    gpu().add_inplace(a_d, on_gpu(b));
    ref().add_inplace(a, b);
    report("add_inplace(width 1003)", shp({T, 1003}), row_rel_error(a_d, a), kTolElem);
    Tensor aw = rand_f32({T, kH + 4}, 2200 + T), aw_d = on_gpu(aw);
    const Tensor bh = rand_f32({T, kH}, 2300 + T);
    Tensor av = aw.slice(1, 1, kH + 1), av_d = aw_d.slice(1, 1, kH + 1);
    gpu().add_inplace(av_d, on_gpu(bh));
    ref().add_inplace(av, bh);
    report("add_inplace(shifted view)", shp({T, kH}), row_rel_error(aw_d, aw), kTolElem);
    // argmax over small integers (many ties: the first maximum wins; even rows also hold three 6s at
    // random places, so the first of a few maxima spread over threads wins): the whole [T, 20004] and a
    // [T, 20000] view of it (vectorized), an odd width and a view shifted by one element (scalar).
    Tensor ties = Tensor::empty({T, 20004}, DType::f32);
    float* tp = ties.data<float>();
    for (int64_t i = 0; i < ties.numel(); ++i) tp[i] = float(r.below(6));
    for (int64_t t = 0; t < T; t += 2) {
      for (int k = 0; k < 3; ++k) tp[t * 20004 + r.below(20004)] = 6.0f;
    }
    const Tensor ties_d = on_gpu(ties);
    report("argmax(ties)", shp({T, 20004}), mismatch(gpu().argmax(ties_d), ref().argmax(ties)), 0.0);
    for (auto [c0, c1] : {std::pair{int64_t(0), int64_t(20000)}, std::pair{int64_t(0), int64_t(20001)},
                          std::pair{int64_t(1), int64_t(20001)}}) {
      report(fmt::format("argmax(ties, cols {}..{})", c0, c1), shp({T, c1 - c0}),
             mismatch(gpu().argmax(ties_d.slice(1, c0, c1)), ref().argmax(ties.slice(1, c0, c1))), 0.0);
    }
  }
}

struct GemmShape {
  const char* name;
  int64_t n, k;
};
constexpr GemmShape kGemms[] = {
    {"q_a_proj", kQLora, kH},           {"q_b_proj", kHeads*(kNope + kRope), kQLora},
    {"kv_a_proj", kKvLora + kRope, kH}, {"kv_b_proj", kHeads*(kNope + kV), kKvLora},
    {"o_proj", kH, kHeads* kV},         {"expert_gate_up", 2048, kH},
    {"expert_down", kH, 2048},          {"router_gate", 256, kH}};

TEST_F(CudaOps, Linear) {
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    const double tol = dt == DType::bf16 ? kTolBf16 : kTolFp8;
    const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
    for (const GemmShape& g : kGemms) {
      if (dt != DType::bf16 && std::string(g.name) == "router_gate") continue;  // routers stay bf16/f32
      const WeightRef w = rand_weight(g.n, g.k, dt, 900 + g.n + g.k), w_d = to_cuda(w);
      for (int64_t T : kTokens) {
        const Tensor x = rand_f32({T, g.k}, 1000 + T + g.n), x_d = on_gpu(x);
        report_gemm(fmt::format("linear {} {}", tag, g.name), shp({T, g.k, g.n}),
                    gpu().linear(x_d, w_d, 0, -1, {}), ref().linear(x, w, 0, -1, {}), tol);
      }
      clear_gemm_caches();
    }
  }
  const GemmStats st = gemm_stats();
  fmt::print(
      "RESULT op=gemm_paths fp8_block_scaled_calls={} fp8_small_t_calls={} bf16_calls={} f32_calls={} "
      "fp8_weights_dequantised={} tuned_plans={} failed_plans={} {}\n",
      st.fp8_calls, st.fp8_small_calls, st.bf16_calls, st.f32_calls, st.dequantised, st.tuned_plans,
      st.failed_plans, st.last_failure);
  EXPECT_GT(st.fp8_calls, 0) << "the FP8 block-scaled cuBLASLt path never ran";
  EXPECT_GT(st.fp8_small_calls, 0) << "the small-T FP8 kernel never ran";
  // f32 weights (exact-ish f32 GEMM): a router in f32.
  const WeightRef wf = rand_weight(256, kH, DType::f32, 77), wf_d = to_cuda(wf);
  for (int64_t T : kTokens) {
    const Tensor x = rand_f32({T, kH}, 1100 + T), x_d = on_gpu(x);
    report("linear f32 router_gate", shp({T, kH, 256}),
           row_rel_error(gpu().linear(x_d, wf_d, 0, -1, {}), ref().linear(x, wf, 0, -1, {})), kTolAttn);
  }
}

// The absorbed-MLA products: q_lat[h] = q_nope[h] @ W_UK[h] (linear_t) and o[h] = out_lat[h] @ W_UV[h]^T
// (a row slice of kv_b written into a column slice of the output), for an odd head (unaligned rows).
TEST_F(CudaOps, LinearSlices) {
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    const double tol = dt == DType::bf16 ? kTolBf16 : kTolFp8;
    const char* tag = dt == DType::bf16 ? "bf16" : "fp8";
    const WeightRef w = rand_weight(kHeads * (kNope + kV), kKvLora, dt, 1200), w_d = to_cuda(w);
    for (int64_t T : kTokens) {
      for (int64_t h : {int64_t(0), int64_t(5)}) {
        const int64_t base = h * (kNope + kV);
        const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 1300 + T), q_d = on_gpu(q);
        report_gemm(fmt::format("linear_t {} W_UK", tag), fmt::format("{} h{}", shp({T, kNope, kKvLora}), h),
                    gpu().linear_t(q_d.select(1, h).slice(1, 0, kNope), w_d, base, base + kNope, {}),
                    ref().linear_t(q.select(1, h).slice(1, 0, kNope), w, base, base + kNope, {}), tol);
        const Tensor lat = rand_f32({T, kKvLora}, 1400 + T), lat_d = on_gpu(lat);
        Tensor out = rand_f32({T, kHeads, kV}, 1500 + T), out_d = on_gpu(out);
        Tensor o = out.select(1, h), o_d = out_d.select(1, h);
        gpu().linear(lat_d, w_d, base + kNope, base + kNope + kV, o_d);
        ref().linear(lat, w, base + kNope, base + kNope + kV, o);
        const Tensor back = cpu(out_d);
        report_gemm(fmt::format("linear {} W_UV(slice)", tag),
                    fmt::format("{} h{}", shp({T, kKvLora, kV}), h), back.select(1, h), out.select(1, h),
                    tol);
        EXPECT_EQ(row_rel_error(back.select(1, h + 1), out.select(1, h + 1)), 0.0)
            << "a neighbouring head changed";
      }
    }
    clear_gemm_caches();
  }
}

TEST_F(CudaOps, MoeRoute) {
  struct Case {
    const char* name;
    MoeRouteParams p;
    bool ties;
  };
  MoeRouteParams glm{1, 1, 8, true, 2.5}, dsv3{8, 4, 8, true, 2.5};
  for (const Case& c : {Case{"moe_route glm", glm, false}, Case{"moe_route dsv3", dsv3, false},
                        Case{"moe_route ties", dsv3, true}}) {
    for (int64_t T : kTokens) {
      Tensor logits = rand_f32({T, 256}, 1600 + T, 4.0f);
      Tensor bias = rand_f32({256}, 1700, 0.1f);
      if (c.ties) {  // few distinct values: every choice is a tie broken toward the lower index
        for (int64_t i = 0; i < logits.numel(); ++i)
          logits.data<float>()[i] = std::round(logits.data<float>()[i]);
        for (int64_t i = 0; i < 256; ++i) bias.data<float>()[i] = 0.0f;
      }
      const Routing g = gpu().moe_route(on_gpu(logits), on_gpu(bias), c.p),
                    r = ref().moe_route(logits, bias, c.p);
      report(std::string(c.name) + " ids", shp({T, 256}), mismatch(g.ids, r.ids), 0.0);
      report(std::string(c.name) + " weights", shp({T, 256}), row_rel_error(g.weights, r.weights), kTolElem);
    }
  }
}

// 32 experts' weights (the real expert GEMM shapes; 256 experts' weights would not be faster to test),
// top-8 routing with random distinct experts and weights.
TEST_F(CudaOps, MoeExperts) {
  constexpr int64_t kE = 32, kTopK = 8, kI = 2048;
  for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
    std::vector<MlpRef> ex, ex_d;
    for (int64_t e = 0; e < kE; ++e) {
      MlpRef m{rand_weight(kI, kH, dt, 2000 + 3 * e), rand_weight(kI, kH, dt, 2001 + 3 * e),
               rand_weight(kH, kI, dt, 2002 + 3 * e)};
      ex_d.push_back({to_cuda(m.gate), to_cuda(m.up), to_cuda(m.down)});
      ex.push_back(std::move(m));
    }
    for (int64_t T : kTokens) {
      if (dt == DType::bf16 && T > 33) continue;  // the CPU reference is the slow part
      // Positive weights like a router's (signed ones would make rows cancel and inflate relative error).
      Routing r{Tensor::empty({T, kTopK}, DType::i32), rand_f32({T, kTopK}, 2100 + T)};
      for (int64_t i = 0; i < T * kTopK; ++i) {
        r.weights.data<float>()[i] = 0.55f + 0.45f * r.weights.data<float>()[i];
      }
      Rng rng(T);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int32_t> all(kE);
        std::iota(all.begin(), all.end(), 0);
        for (int64_t k = 0; k < kTopK; ++k) {
          std::swap(all[size_t(k)], all[size_t(k + rng.below(kE - k))]);
          r.ids.data<int32_t>()[t * kTopK + k] = all[size_t(k)];
        }
      }
      const Tensor x = rand_f32({T, kH}, 2200 + T), x_d = on_gpu(x);
      const Routing r_d{on_gpu(r.ids), on_gpu(r.weights)};
      report_gemm(fmt::format("moe_experts {}", dt == DType::bf16 ? "bf16" : "fp8"), shp({T, kTopK, kI, kH}),
                  gpu().moe_experts(x_d, r_d, ex_d), ref().moe_experts(x, r, ex),
                  dt == DType::bf16 ? kTolBf16 : kTolFp8);
    }
    clear_gemm_caches();
  }
}

// One request with `start` cached tokens and T new ones; pages of 64 in reverse order.
struct PagedFixture {
  Tensor cache, cache_d;
  PagedSeq seq, seq_d;
  PagedFixture(int64_t start, int64_t T, int64_t cols, uint64_t seed) {
    const int64_t ps = 64, pages = (start + T + ps - 1) / ps + 2;
    std::vector<int32_t> table(static_cast<size_t>(pages));
    std::iota(table.rbegin(), table.rend(), 0);
    cache = rand_f32({pages * ps, cols}, seed);
    cache_d = on_gpu(cache);
    seq = PagedSeq{cache, i32(table), ps};
    seq_d = PagedSeq{cache_d, i32(table, Device::cuda), ps};
  }
};

TEST_F(CudaOps, IndexerTopk) {
  constexpr int64_t kIh = 32, kId = 128, kTopk = 2048;
  for (int64_t T : kTokens) {
    for (int64_t start : {int64_t(0), int64_t(4000)}) {
      const PagedFixture f(start, T, kId, 2300 + T + start);
      const Tensor q = rand_f32({T, kIh, kId}, 2400 + T), w = rand_f32({T, kIh}, 2500 + T);
      const Tensor g = gpu().indexer_topk(on_gpu(q), on_gpu(w), f.seq_d, start, kTopk, 1.0 / std::sqrt(128.0),
                                          1.0 / std::sqrt(32.0));
      const Tensor r =
          ref().indexer_topk(q, w, f.seq, start, kTopk, 1.0 / std::sqrt(128.0), 1.0 / std::sqrt(32.0));
      // Selections may legitimately differ at near-ties of fp32 sums in another order: allow 1e-3 of entries.
      report("indexer_topk", fmt::format("{} start {}", shp({T, kIh, kId}), start), mismatch(g, r), 1e-3);
    }
  }
}

TEST_F(CudaOps, MlaAbsorbed) {
  for (int64_t T : kTokens) {
    const int64_t start = 300;
    const PagedFixture f(start, T, kKvLora + kRope, 2600 + T);
    const Tensor ql = rand_f32({T, kHeads, kKvLora}, 2700 + T, 0.2f);
    const Tensor qr = rand_f32({T, kHeads, kRope}, 2800 + T, 0.2f);
    const double scale = 1.0 / std::sqrt(256.0);
    report("mla_absorbed(all)", shp({T, kHeads, kKvLora + kRope}),
           row_rel_error(gpu().mla_attention_absorbed(on_gpu(ql), on_gpu(qr), f.seq_d, start, {}, scale),
                         ref().mla_attention_absorbed(ql, qr, f.seq, start, {}, scale)),
           kTolAttn);
    // A DSA selection: 128 random visible positions per row, some -1.
    Tensor sel = Tensor::empty({T, 128}, DType::i32);
    Rng r(T);
    for (int64_t i = 0; i < sel.numel(); ++i) {
      const int64_t t = i / 128;
      sel.data<int32_t>()[i] = r.below(8) == 0 ? -1 : int32_t(r.below(start + t + 1));
    }
    report("mla_absorbed(sel)", shp({T, kHeads, 128}),
           row_rel_error(
               gpu().mla_attention_absorbed(on_gpu(ql), on_gpu(qr), f.seq_d, start, on_gpu(sel), scale),
               ref().mla_attention_absorbed(ql, qr, f.seq, start, sel, scale)),
           kTolAttn);
  }
}

TEST_F(CudaOps, AttentionMha) {
  for (int64_t T : kTokens) {
    const int64_t start = 100, S = start + T;
    const Tensor q = rand_f32({T, kHeads, kNope + kRope}, 2900 + T, 0.3f);
    const Tensor kvx = rand_f32({S, kHeads, kNope + kV}, 3000 + T, 0.3f);
    const Tensor lat = rand_f32({S, kKvLora + kRope}, 3100 + T, 0.3f);
    const Tensor q_d = on_gpu(q), kvx_d = on_gpu(kvx), lat_d = on_gpu(lat);
    const double scale = 1.0 / std::sqrt(256.0);
    report("attention_mha", shp({T, kHeads, S}),
           row_rel_error(
               gpu().attention_mha(q_d, kvx_d.slice(2, 0, kNope), lat_d.slice(1, kKvLora, kKvLora + kRope),
                                   kvx_d.slice(2, kNope, kNope + kV), start, {}, scale),
               ref().attention_mha(q, kvx.slice(2, 0, kNope), lat.slice(1, kKvLora, kKvLora + kRope),
                                   kvx.slice(2, kNope, kNope + kV), start, {}, scale)),
           kTolAttn);
  }
}

TEST_F(CudaOps, CachingAllocatorReusesBlocks) {
  const Tensor x = on_gpu(rand_f32({257, kH}, 1));
  const Tensor w = on_gpu(rand_bf16({kH}, 2));
  for (int i = 0; i < 3; ++i) (void)gpu().silu_mul(gpu().rms_norm(x, w, 1e-5), x);  // warm the size classes
  cudaDeviceSynchronize();
  const int64_t before = allocator_stats().device_mallocs;
  for (int i = 0; i < 100; ++i) (void)gpu().silu_mul(gpu().rms_norm(x, w, 1e-5), x);
  EXPECT_EQ(allocator_stats().device_mallocs, before) << "steady state must not call cudaMalloc";
  EXPECT_EQ(allocation_size_class(1), 512u);
  EXPECT_EQ(allocation_size_class(1025), 1280u);
  EXPECT_EQ(allocation_size_class(size_t(100) << 20), size_t(100) << 20);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
