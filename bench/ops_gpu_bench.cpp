// GPU operator benchmark: for each main operator at T in {1, 32, 256, 4096} tokens (GLM-5.3 layer shapes),
// the median time over 20 runs after 3 warm-ups (CUDA events around each call, so host work inside an
// operator shows), the bytes it must move and the FLOPs it must do, the floor from the measured ceilings
// of docs/GPU.md (4.3 TB/s; 797 TFLOP/s bf16, 1434 TFLOP/s FP8, 67 TFLOP/s fp32 for non-tensor work) and
// floor / time. Weights are filled on the GPU with a constant pattern (values do not change GEMM speed).
// The routed experts have their own table at the end (bench_moe_experts; `ops_gpu_bench moe` runs only it).
// `ops_gpu_bench pdl` times chains of a decode step's small kernels with programmatic dependent launches
// off and on (bench_pdl_chains); `ops_gpu_bench fuse` linear_multi's pairs in one launch or two;
// `ops_gpu_bench stages` the FP8 small-T kernel's pipeline depth; `ops_gpu_bench norm` RMSNorm's decode rows
// on one CTA a row or split over a cluster.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpu_timing.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemm_small_params.h"
#include "kernels/cuda/moe/moe_params.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/ops.h"

namespace ops = dsaserve::kernels;
using dsaserve::Device;
using dsaserve::DType;
using dsaserve::Tensor;

namespace {

constexpr double kHbm = 4.3e12, kBf16 = 797e12, kFp8 = 1434e12, kF32 = 67e12;
constexpr int64_t kH = 6144, kQLora = 2048, kKvLora = 512, kRope = 64, kNope = 192, kV = 256, kHeads = 64;

Tensor rand_gpu(const dsaserve::Shape& s, uint64_t seed, float scale = 1.0f) {
  return dsaserve::bench::rand_f32_gpu(s, seed, scale);
}

Tensor filled(const dsaserve::Shape& s, DType dt, int byte) {
  Tensor t = Tensor::empty(s, dt, Device::cuda);
  cudaMemset(t.raw_data(), byte, t.nbytes());
  return t;
}

Tensor i32_gpu(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::cuda);
}

// With the forms the backend derives at model load (padded FP8 scales), as the model's linears run.
ops::WeightRef weight(int64_t n, int64_t k, DType dt) {
  if (dt == DType::bf16) return {filled({n, k}, DType::bf16, 0x3c), {}, 128, 128};
  Tensor sc = Tensor::empty({(n + 127) / 128, (k + 127) / 128}, DType::f32);
  for (int64_t i = 0; i < sc.numel(); ++i) sc.data<float>()[i] = 1e-3f;
  ops::WeightRef w{filled({n, k}, DType::f8e4m3fn, 0x38), sc.to(Device::cuda), 128, 128};
  w.derived = dsaserve::kernels::cuda::derive_gemm_weight(w, ops::WeightUse::linear, {});
  return w;
}

// Median microseconds of fn() over `iters` runs (CUDA events around each).
double time_us(const std::function<void()>& fn, int warm = 3, int iters = 20) {
  return dsaserve::bench::median_event_us(fn, warm, iters);
}

void row(const std::string& op, int64_t T, const std::string& shape, double us, double bytes, double flops,
         double peak) {
  const double floor_us = std::max(bytes / kHbm, flops / peak) * 1e6;
  fmt::print("| {:<24} | {:>5} | {:<22} | {:>10.1f} | {:>8.1f} | {:>8.1f} | {:>9.2f} | {:>5.2f} |\n", op, T,
             shape, us, bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12, floor_us, floor_us / us);
  std::fflush(stdout);
}

// MLA's batched absorbed projections (one strided-batched GEMM over the heads) beside the per-head loop
// they replace, at GLM-5.3's 64 heads and per-rank 16 / 8; and the fused KV-cache writes beside the
// unfused op sequences. Bytes: bf16 weights read once, f32 activations in and out; cache writes: the f32
// rows read, the cache rows written.
void bench_mla_fused(const int64_t* Ts, size_t nT) {
  for (int64_t nh : {int64_t(64), int64_t(16), int64_t(8)}) {
    const ops::WeightRef kv_b = weight(nh * (kNope + kV), kKvLora, DType::bf16);
    for (size_t i = 0; i < nT; ++i) {
      const int64_t T = Ts[i];
      const Tensor q = rand_gpu({T, nh, kNope + kRope}, 21), lat = rand_gpu({T, nh, kKvLora}, 22);
      const Tensor q_nope = q.slice(2, 0, kNope);
      Tensor q_lat = Tensor::empty({T, nh, kKvLora}, DType::f32, Device::cuda);
      Tensor o = Tensor::empty({T, nh, kV}, DType::f32, Device::cuda);
      const double qb = 2.0 * double(nh * kNope * kKvLora) + 4.0 * double(T * nh * (kNope + kKvLora));
      const double vb = 2.0 * double(nh * kV * kKvLora) + 4.0 * double(T * nh * (kKvLora + kV));
      const double qf = 2.0 * double(T * nh * kNope * kKvLora), vf = 2.0 * double(T * nh * kKvLora * kV);
      const std::string qs = fmt::format("{}x[{},{},{}]", nh, T, kNope, kKvLora),
                        vs = fmt::format("{}x[{},{},{}]", nh, T, kKvLora, kV);
      row(fmt::format("absorb_q {}h", nh), T, qs, time_us([&] { ops::absorb_q(q_nope, kv_b, q_lat); }), qb,
          qf, kBf16);
      row(fmt::format("absorb_q {}h per-head", nh), T, qs, time_us([&] {
            for (int64_t h = 0; h < nh; ++h) {
              const int64_t base = h * (kNope + kV);
              ops::linear_t(q_nope.select(1, h), kv_b, base, base + kNope, q_lat.select(1, h));
            }
          }),
          qb, qf, kBf16);
      row(fmt::format("absorb_v {}h", nh), T, vs, time_us([&] { ops::absorb_v(lat, kv_b, kV, o); }), vb, vf,
          kBf16);
      row(fmt::format("absorb_v {}h per-head", nh), T, vs, time_us([&] {
            for (int64_t h = 0; h < nh; ++h) {
              const int64_t base = h * (kNope + kV) + kNope;
              ops::linear(lat.select(1, h), kv_b, base, base + kV, o.select(1, h));
            }
          }),
          vb, vf, kBf16);
    }
  }
  namespace kc = dsaserve::kernels::cuda;
  const Tensor wn = filled({kKvLora}, DType::bf16, 0x3f), wi = filled({128}, DType::bf16, 0x3f),
               bi = filled({128}, DType::bf16, 0x00);
  ops::RopeParams rp;
  rp.dim = kRope;
  rp.theta = 1e6;
  for (size_t i = 0; i < nT; ++i) {
    const int64_t T = Ts[i], pool = 64 * (T / 64 + 2);
    std::vector<int32_t> slots(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      slots[size_t(t)] = int32_t((t * 67) % pool);  // scattered over the pages (67 is prime to the pool)
      pos[size_t(t)] = int32_t(1000 + t);
    }
    const Tensor sl = i32_gpu(slots), ps = i32_gpu(pos);
    const Tensor ckv = rand_gpu({T, kKvLora + kRope}, 23), k = rand_gpu({T, 128}, 24);
    for (auto f : {kc::MlaKvFormat::bf16, kc::MlaKvFormat::fp8_e4m3}) {
      Tensor cache = kc::mla_kv_cache_empty(pool, f);
      const bool bf = f == kc::MlaKvFormat::bf16;
      const double bytes = 4.0 * double(T * (kKvLora + kRope)) + double(T * (bf ? 1152 : 656));
      row(fmt::format("mla_kv_write {}", bf ? "bf16" : "fp8"), T, fmt::format("[{},{}]", T, kKvLora + kRope),
          time_us([&] { ops::mla_kv_write(ckv, wn, 1e-6, ps, rp, cache, sl); }), bytes, 0, kF32);
      row(fmt::format("mla_kv_write {} unfused", bf ? "bf16" : "fp8"), T,
          fmt::format("[{},{}]", T, kKvLora + kRope), time_us([&] {
            Tensor c2 = Tensor::empty({T, kKvLora + kRope}, DType::f32, Device::cuda);
            ops::copy_rows(c2, ckv);
            Tensor k_pe = c2.view({T, 1, kKvLora + kRope}).slice(2, kKvLora, kKvLora + kRope);
            ops::rope_inplace(k_pe, ps, rp);
            Tensor l = c2.slice(1, 0, kKvLora);
            ops::copy_rows(l, ops::rms_norm(ckv.slice(1, 0, kKvLora), wn, 1e-6));
            ops::paged_store(cache, sl, c2);
          }),
          bytes, 0, kF32);
    }
    Tensor icache = Tensor::empty({pool, 128}, DType::bf16, Device::cuda);
    const double ib = 4.0 * double(T * 128) + 2.0 * double(T * 128);
    row("indexer_k_write bf16", T, fmt::format("[{},128]", T),
        time_us([&] { ops::indexer_k_write(k, wi, bi, 1e-6, ps, rp, icache, sl); }), ib, 0, kF32);
    row("indexer_k_write unfused", T, fmt::format("[{},128]", T), time_us([&] {
          const Tensor ki = ops::layer_norm(k, wi, bi, 1e-6);
          Tensor ki_pe = ki.view({T, 1, 128}).slice(2, 0, kRope);
          ops::rope_inplace(ki_pe, ps, rp);
          ops::paged_store(icache, sl, ki);
        }),
        ib, 0, kF32);
  }
}

// The routed experts of one GLM-5.3 MoE layer (256 experts of 2048 x 6144, top-8 of a random routing,
// FP8 weights with 128x128 block scales) per path of moe_experts: dev (the device-grouped CUDA-core
// kernels), dev_fp8 (the device-grouped tensor-core FP8 kernels; fp8/tN: with N packed rows per pass,
// --moe-fp8-tile-rows), host (per-expert cuBLASLt GEMMs), auto (what select_moe_path picks). Floor: the
// weights of the experts that received tokens + the activations in and out (f32) at 4.3 TB/s, or the FLOPs at
// the FP8 peak, whichever is larger. DeepGEMM column: the active experts times DeepGEMM's single-expert T = 1
// times on the H200 (GPU.md: gate_up 16.1 us + down 10.3 us, its weight-streaming rate; it has no grouped
// decode figure on this machine).
constexpr int64_t kMoeTokens[] = {1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096};
void bench_moe_experts(const std::vector<int64_t>& tokens) {
  namespace kc = dsaserve::kernels::cuda;
  constexpr int64_t kE = 256, kI = 2048, kTopK = 8;
  constexpr double kDeepGemmExpertUs = 16.1 + 10.3;
  fmt::print("\n| {:<18} | {:>5} | {:>6} | {:<7} | {:>10} | {:>8} | {:>9} | {:>5} | {:>13} |\n",
             "moe_experts fp8", "T", "active", "path", "time us", "GB/s", "floor us", "ratio",
             "DeepGEMM-eq us");
  fmt::print("|{:-<20}|{:->7}|{:->8}|{:-<9}|{:->12}|{:->10}|{:->11}|{:->7}|{:->15}|\n", "", "", "", "", "",
             "", "", "", "");
  std::vector<ops::MlpRef> experts;
  for (int64_t e = 0; e < kE; ++e)
    experts.push_back(
        {weight(kI, kH, DType::f8e4m3fn), weight(kI, kH, DType::f8e4m3fn), weight(kH, kI, DType::f8e4m3fn)});
  // The experts' device table, derived once as at model load (it depends on no option).
  const std::shared_ptr<const ops::DerivedExperts> set = kc::make_backend({})->derive_experts(experts);
  std::mt19937 r(11);
  for (int64_t T : tokens) {
    Tensor ids = Tensor::empty({T, kTopK}, DType::i32);
    std::vector<bool> used(kE, false);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(kE);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), r);
      for (int64_t k = 0; k < kTopK; ++k) {
        ids.data<int32_t>()[t * kTopK + k] = all[size_t(k)];
        used[size_t(all[size_t(k)])] = true;
      }
    }
    const int64_t active = std::count(used.begin(), used.end(), true);
    const ops::Routing routing{ids.to(Device::cuda), rand_gpu({T, kTopK}, 12)};
    const Tensor x = rand_gpu({T, kH}, 13);
    const double bytes = double(active * 3 * kI * kH) + 8.0 * double(T * kH);
    const double flops = 2.0 * double(T * kTopK * 3 * kI * kH);
    const double floor_us = std::max(bytes / kHbm, flops / kFp8) * 1e6;
    const struct {
      const char* tag;
      ops::MoePath path;
      int tile_rows, tail_rows;
    } paths[] = {{"dev", ops::MoePath::device, 0, ops::kMoeFp8TailRowsDefault},
                 {"dev_fp8", ops::MoePath::device_fp8, 0, ops::kMoeFp8TailRowsDefault},
                 {"fp8/t8", ops::MoePath::device_fp8, 8, ops::kMoeFp8TailRowsDefault},
                 {"fp8/t128", ops::MoePath::device_fp8, 128, ops::kMoeFp8TailRowsDefault},
                 // The wgmma form with every remainder past 128 rows in a pass of its own
                 // (KernelOptions::moe_fp8_tail_rows 0).
                 {"fp8/tail0", ops::MoePath::device_fp8, 128, 0},
                 {"host", ops::MoePath::host, 0, ops::kMoeFp8TailRowsDefault},
                 {"auto", ops::MoePath::automatic, 0, ops::kMoeFp8TailRowsDefault}};
    for (const auto& pa : paths) {
      if (pa.path == ops::MoePath::device && T > 256) continue;  // the CUDA-core kernels: ~100 ms there
      if (pa.tile_rows == 8 && T > 1024) continue;  // mma.sync passes at prefill sizes: ~11 ms at T = 1,024
      ops::KernelOptions ko;
      ko.moe = pa.path;
      ko.moe_fp8_tile_rows = pa.tile_rows;
      ko.moe_fp8_tail_rows = pa.tail_rows;
      const std::shared_ptr<ops::Backend> be = kc::make_backend(ko);
      const double us =
          time_us([&] { be->moe_experts(x, routing, experts, nullptr, set.get(), nullptr); }, 2, 10);
      fmt::print(
          "| {:<18} | {:>5} | {:>6} | {:<7} | {:>10.1f} | {:>8.1f} | {:>9.1f} | {:>5.2f} | {:>13.1f} |\n",
          "per layer", T, active, pa.tag, us, bytes / (us * 1e-6) / 1e9, floor_us, floor_us / us,
          double(active) * kDeepGemmExpertUs);
      std::fflush(stdout);
    }
  }
}

// GLM-5.3's FP8 linears at decode ([n, k]), for the small-T kernel's sweeps.
const struct {
  const char* name;
  int64_t n, k;
} kFp8DecodeShapes[] = {
    {"q_a", kQLora, kH},        {"kv_a", kKvLora + kRope, kH}, {"q_b", kHeads*(kNope + kRope), kQLora},
    {"o_proj", kH, kHeads* kV}, {"mlp_gate", 12288, kH},       {"mlp_down", kH, 12288},
    {"shared_gate", 2048, kH},  {"shared_down", kH, 2048}};

// The small-T FP8 kernel's parameters for weight w [n, k] on activations a into out [T, n]: `splits` CTAs
// along K (partial: [splits, T, n] scratch), `occ` CTAs an SM; the sweeps below vary the rest.
dsaserve::kernels::cuda::Fp8SmallGemmParams fp8_small_params(const ops::WeightRef& w, const ops::Fp8Act& a,
                                                             Tensor& out, int64_t T, int64_t n, int64_t k,
                                                             int splits, Tensor& partial, Tensor& counters,
                                                             int occ) {
  dsaserve::kernels::cuda::Fp8SmallGemmParams p{};
  p.w = static_cast<const uint8_t*>(w.weight.raw_data());
  p.w_scale = static_cast<const float*>(w.scale_inv.raw_data());
  p.w_scale_ld = w.scale_inv.size(1);
  p.xq = static_cast<const uint8_t*>(a.codes.raw_data());
  p.x_scale = a.scales.data<float>();
  p.out = out.data<float>();
  p.out_stride = n;
  p.T = T;
  p.Tp = a.codes.size(0);
  p.N = n;
  p.K = k;
  p.splits = splits;
  p.partial = partial.data<float>();
  p.counters = static_cast<uint32_t*>(counters.raw_data());
  p.ctas_per_sm = occ;
  return p;
}

// Calls fn(shape, T, weight, activations, output) for each GLM-5.3 FP8 decode shape at T = 1 and 8: the
// operands both FP8 small-T sweeps time (a random weight, random activations and their FP8 quantisation).
template <class F>
void for_each_fp8_decode_case(F&& fn) {
  namespace kc = dsaserve::kernels::cuda;
  for (const auto& g : kFp8DecodeShapes) {
    const ops::WeightRef w = weight(g.n, g.k, DType::f8e4m3fn);
    for (int64_t T : {1, 8}) {
      const ops::Fp8Act a = kc::quantize_fp8_activations(rand_gpu({T, g.k}, 1));
      Tensor out = Tensor::empty({T, g.n}, DType::f32, Device::cuda);
      fn(g, T, w, a, out);
    }
  }
}

// The small-T FP8 kernel's K split (gemm_small_params.h) swept at GLM-5.3's decode shapes: `splits` CTAs
// along K per 128-row slice (auto: fp8_small_gemm_splits, one wave) at 2 and 3 CTAs per SM. CUDA-graph
// replays of the kernel alone; floor: the weight bytes at 4.3 TB/s.
void bench_fp8_small_splits() {
  namespace kc = dsaserve::kernels::cuda;
  fmt::print("\n| {:<16} | {:>3} | {:<16} | {:>6} | {:>6} | {:>6} | {:>9} | {:>9} | {:>5} |\n", "fp8 small",
             "T", "[K, N]", "CTA/SM", "splits", "CTAs", "time us", "floor us", "ratio");
  Tensor counters = Tensor::zeros({kc::kFp8SmallCounters}, DType::i32, Device::cuda);
  for_each_fp8_decode_case([&](const auto& g, int64_t T, const ops::WeightRef& w, const ops::Fp8Act& a,
                               Tensor& out) {
    const int64_t slices = (g.n + 127) / 128, kb = g.k / 128, Tp = a.codes.size(0);
    for (int occ : {2, 3}) {
      const int auto_s = kc::fp8_small_gemm_splits(g.n, g.k, Tp, occ);
      std::vector<int> cands = {auto_s};
      for (int s : {1, 2, 4, 8, 16, 32})
        if (s != auto_s && s <= kb && slices * s <= 65535) cands.push_back(s);
      for (int s : cands) {
        Tensor partial = Tensor::empty({s, T, g.n}, DType::f32, Device::cuda);
        const kc::Fp8SmallGemmParams p = fp8_small_params(w, a, out, T, g.n, g.k, s, partial, counters, occ);
        const double us = kc::graph_time_us([&] { (void)kc::launch_fp8_small_gemm(p, kc::op_stream()); });
        const double floor_us = double(g.n * g.k) / kHbm * 1e6;
        const bool dflt = s == auto_s && occ == kc::fp8_small_ctas_per_sm(g.n, Tp);
        fmt::print("| {:<16} | {:>3} | {:<16} | {:>6} | {:>6} | {:>6} | {:>9.1f} | {:>9.2f} | {:>5.2f} |\n",
                   fmt::format("{}{}", g.name,
                               dflt          ? " default"
                               : s == auto_s ? " auto"
                                             : ""),
                   T, fmt::format("[{},{}]", g.k, g.n), kc::fp8_small_ctas_per_sm(g.n, Tp, occ), s,
                   slices * s, us, floor_us, floor_us / us);
        std::fflush(stdout);
      }
    }
  });
}
// The small-T FP8 kernel's pipeline depth (Fp8SmallGemmParams::stages): at T = 1 and 8 per GLM-5.3 decode
// shape, the default launch (4 K blocks in flight, the default CTAs per SM and split), then 4 and
// kFp8SmallDeepStages blocks at 2 CTAs per SM with that occupancy's split, each with every thread's cp.async
// and with the tensor-map kernel (Fp8SmallGemmParams::tma: a producer warp's two tensor-map copies a K block,
// consumers released by mbarriers): whether more bytes in flight per SM, or a pipeline without block barriers
// and copy instructions in the consumers, move the weight stream closer to the bandwidth. CUDA-graph replays
// of the kernel alone; floor: the weight bytes at 4.3 TB/s.
void bench_fp8_small_stages() {
  namespace kc = dsaserve::kernels::cuda;
  fmt::print("\n| {:<12} | {:>2} | {:<13} | {:>6} | {:>6} | {:>6} | {:>9} | {:>9} | {:>5} |\n", "fp8 small",
             "T", "[K, N]", "stages", "CTA/SM", "splits", "time us", "floor us", "ratio");
  Tensor counters = Tensor::zeros({kc::kFp8SmallCounters}, DType::i32, Device::cuda);
  for_each_fp8_decode_case(
      [&](const auto& g, int64_t T, const ops::WeightRef& w, const ops::Fp8Act& a, Tensor& out) {
        const int64_t Tp = a.codes.size(0);
        const struct {
          int stages, occ;
          bool tma;
        } runs[] = {{0, 0, false},
                    {4, 2, false},
                    {kc::kFp8SmallDeepStages, 2, false},
                    {4, 2, true},
                    {kc::kFp8SmallDeepStages, 2, true}};
        for (const auto& r : runs) {
          const int occ = kc::fp8_small_ctas_per_sm(g.n, Tp, r.occ);
          const int s = kc::fp8_small_gemm_splits(g.n, g.k, Tp, occ);
          Tensor partial = Tensor::empty({s, T, g.n}, DType::f32, Device::cuda);
          kc::Fp8SmallGemmParams p = fp8_small_params(w, a, out, T, g.n, g.k, s, partial, counters, occ);
          p.stages = r.stages;
          p.tma = r.tma;
          if (kc::launch_fp8_small_gemm(p, kc::op_stream()) != cudaSuccess) {
            cudaGetLastError();
            fmt::print("| {:<12} | {:>2} | {:<13} | {:>6} | refused |\n", g.name, T,
                       r.tma ? "tensor map" : "", r.stages);
            continue;
          }
          const double us = kc::graph_time_us([&] { (void)kc::launch_fp8_small_gemm(p, kc::op_stream()); });
          const double floor_us = double(g.n * g.k) / kHbm * 1e6;
          fmt::print("| {:<12} | {:>2} | {:<13} | {:>6} | {:>6} | {:>6} | {:>9.1f} | {:>9.2f} | {:>5.2f} |\n",
                     fmt::format("{}{}", g.name,
                                 r.stages == 0 ? " default"
                                 : r.tma       ? " tmap"
                                               : ""),
                     T, fmt::format("[{},{}]", g.k, g.n), r.stages == 0 ? 4 : r.stages, occ, s, us, floor_us,
                     floor_us / us);
          std::fflush(stdout);
        }
      });
}

// Programmatic dependent launch (KernelOptions::pdl) changes how consecutive kernels overlap, so it shows
// only on chains: per T in {1, 8}, two chains captured in one CUDA graph (20 chains a graph), replayed with
// a backend of pdl off and one of pdl on: the dense MLP of a GLM-5.3 layer (add_rms_norm with its FP8
// copy, the gate + up FP8 GEMMs, SiLU-mul, the down projection's quantisation and GEMM: 6 kernels) and a
// launch-bound chain of elementwise ops (add_inplace then rms_norm, 4 times: 8 kernels).
void bench_pdl_chains() {
  namespace kc = dsaserve::kernels::cuda;
  constexpr int64_t kInter = 12288;
  const ops::WeightRef gate = weight(kInter, kH, DType::f8e4m3fn), up = weight(kInter, kH, DType::f8e4m3fn),
                       down = weight(kH, kInter, DType::f8e4m3fn);
  const Tensor nw = filled({kH}, DType::bf16, 0x3f);
  fmt::print("\n| {:<28} | {:>3} | {:>11} | {:>10} | {:>7} |\n", "pdl chain (per chain)", "T", "pdl off us",
             "pdl on us", "on/off");
  for (int64_t T : {1, 8}) {
    const Tensor x = rand_gpu({T, kH}, 31, 1e-2f);
    Tensor res = rand_gpu({T, kH}, 32, 1e-2f);
    double us[2][2] = {};
    for (int on = 0; on < 2; ++on) {
      ops::KernelOptions ko;
      ko.pdl = on == 1;
      const std::shared_ptr<ops::Backend> be = kc::make_backend(ko);
      const ops::Ops o(be.get());
      auto mlp = [&] {
        ops::Fp8Act q;
        const Tensor h = o.add_rms_norm_fp8(res, x, nw, 1e-6, q);
        const std::vector<Tensor> gu = o.linear_multi(h, {gate, up}, &q);
        (void)o.linear(o.silu_mul(gu[0], gu[1]), down);
      };
      auto elementwise = [&] {
        for (int i = 0; i < 4; ++i) {
          o.add_inplace(res, x);
          (void)o.rms_norm(res, nw, 1e-6);
        }
      };
      mlp();
      elementwise();
      us[0][on] = kc::graph_time_us(mlp);
      us[1][on] = kc::graph_time_us(elementwise);
    }
    const char* names[2] = {"dense MLP (6 kernels)", "add + rms_norm x4 (8 kernels)"};
    for (int c = 0; c < 2; ++c)
      fmt::print("| {:<28} | {:>3} | {:>11.1f} | {:>10.1f} | {:>7.3f} |\n", names[c], T, us[c][0], us[c][1],
                 us[c][1] / us[c][0]);
    std::fflush(stdout);
  }
}

// RMSNorm at decode row counts, as a decode step runs it (the residual added and written back, bf16 weights,
// the FP8 copy for the next GEMM; and the plain norm), on one CTA a row or over a cluster of CTAs
// (rms_norm_cluster_ctas). Each time is a graph of the one launch (GPU time per call, launches excluded);
// floor: the bytes at 4.3 TB/s (x, residual in and out, weights, output, FP8 codes).
void bench_rms_norm_cluster() {
  namespace kc = dsaserve::kernels::cuda;
  fmt::print("\n| {:<24} | {:>3} | {:>4} | {:>11} | {:>10} | {:>8} | {:>9} | {:>8} |\n", "rms_norm", "T",
             "CTAs", "one CTA us", "cluster us", "floor us", "ratio on", "gain");
  for (bool add : {true, false}) {
    for (int64_t cols : {kH, kQLora}) {
      for (int64_t T : {1, 8, 32, 64}) {
        const Tensor x = rand_gpu({T, cols}, 41, 1.0f), w = filled({cols}, DType::bf16, 0x3f);
        Tensor res = rand_gpu({T, cols}, 42, 1.0f), out = Tensor::empty({T, cols}, DType::f32, Device::cuda);
        const int64_t pad = ((T + 7) / 8) * 8;
        Tensor codes = Tensor::empty({pad, cols}, DType::u8, Device::cuda),
               scales = Tensor::empty({cols / 128, pad}, DType::f32, Device::cuda);
        double us[2] = {};
        for (int one = 0; one < 2; ++one) {
          kc::RmsNormParams p{x.data<float>(),
                              add ? res.data<float>() : nullptr,
                              w.raw_data(),
                              out.data<float>(),
                              T,
                              cols,
                              cols,
                              cols,
                              true,
                              1e-6};
          p.q_codes = codes.data_u8();
          p.q_scales = scales.data<float>();
          p.q_rows_pad = pad;
          p.one_cta_per_row = one == 1;
          auto fn = [&] { (void)kc::launch_rms_norm(p, kc::op_stream()); };
          fn();
          us[one] = kc::graph_time_us(fn);
        }
        const double bytes = double(T * cols) * (4.0 * (add ? 4 : 2) + 1.0) + double(cols) * 2;
        const double floor_us = bytes / kHbm * 1e6;
        fmt::print("| {:<24} | {:>3} | {:>4} | {:>11.2f} | {:>10.2f} | {:>8.2f} | {:>9.2f} | {:>8.2f} |\n",
                   fmt::format("{}{} + fp8", add ? "add + norm " : "norm ", cols), T,
                   kc::rms_norm_cluster_ctas(T, cols), us[1], us[0], floor_us, floor_us / us[0],
                   us[1] / us[0]);
        std::fflush(stdout);
      }
    }
  }
}

// The LM head of the GLM-5.3 slice (bf16 [154,880 x 6,144], 1.9 GB) at decode sizes, the two paths of a wide
// bf16 linear (KernelOptions::gemm_bf16_small_wide): x rounded to bf16 once and cuBLASLt (off), or the
// weight-streaming small-T kernel with the two-term split (on). Floor: the weight bytes at 4.3 TB/s. Each
// time is a CUDA-graph replay of the one op (the weights far exceed L2).
void bench_lm_head() {
  namespace kc = dsaserve::kernels::cuda;
  constexpr int64_t kVocab = 154880;
  const ops::WeightRef w = weight(kVocab, kH, DType::bf16);
  const double floor_us = double(kVocab * kH * 2) / kHbm * 1e6;
  fmt::print("\n| {:<26} | {:>3} | {:>12} | {:>12} | {:>9} | {:>9} | {:>9} |\n",
             "lm_head [154880 x 6144] bf16", "T", "cuBLASLt us", "small-T us", "floor us", "ratio off",
             "ratio on");
  for (int64_t T : {1, 2, 4, 8, 16, 32}) {
    const Tensor x = rand_gpu({T, kH}, 41, 1e-1f);
    Tensor out = Tensor::empty({T, kVocab}, DType::f32, Device::cuda);
    double us[2] = {};
    for (int on = 0; on < 2; ++on) {
      ops::KernelOptions ko;
      ko.gemm_bf16_small_wide = on == 1;
      const std::shared_ptr<ops::Backend> be = kc::make_backend(ko);
      const ops::Ops o(be.get());
      auto run = [&] { (void)o.linear(x, w, 0, -1, out); };
      run();
      us[on] = kc::graph_time_us(run);
    }
    fmt::print("| {:<26} | {:>3} | {:>12.1f} | {:>12.1f} | {:>9.1f} | {:>9.2f} | {:>9.2f} |\n", "", T, us[0],
               us[1], floor_us, floor_us / us[0], floor_us / us[1]);
    std::fflush(stdout);
  }
}

// linear_multi's pairs at decode sizes, a launch per part (off) or one fused small-T launch
// (KernelOptions::gemm_small_fuse on): q_a + kv_a, the shared expert's gate + up, the dense MLP's gate +
// up (FP8), the indexer's wk + weights_proj (bf16, the two-term recipe) (GLM-5.3); then absorb_q / absorb_v
// through cuBLASLt or the absorbed projections' small-T kernel (KernelOptions::absorb_small_max_tokens). Each
// time is a CUDA-graph replay of linear_multi (the activations' quantisation included, the same in both).
// Floor: the weights' bytes at 4.3 TB/s.
void bench_small_fuse() {
  namespace kc = dsaserve::kernels::cuda;
  struct Pair {
    const char* name;
    int64_t n0, n1;
    DType dt;
  };
  const Pair pairs[] = {{"q_a + kv_a", kQLora, kKvLora + kRope, DType::f8e4m3fn},
                        {"shared gate + up", 2048, 2048, DType::f8e4m3fn},
                        {"dense gate + up", 12288, 12288, DType::f8e4m3fn},
                        {"idx wk + weights (bf16)", 128, 32, DType::bf16}};
  fmt::print("\n| {:<23} | {:>2} | {:>12} | {:>12} | {:>8} | {:>9} | {:>8} | {:>5} |\n", "linear_multi pair",
             "T", "separate us", "fused us", "floor us", "ratio off", "ratio on", "gain");
  for (const Pair& pr : pairs) {
    const ops::WeightRef a = weight(pr.n0, kH, pr.dt), b = weight(pr.n1, kH, pr.dt);
    const double floor_us = double((pr.n0 + pr.n1) * kH * int64_t(dsaserve::dtype_size(pr.dt))) / kHbm * 1e6;
    for (int64_t T : {1, 2, 4, 8}) {
      const Tensor x = rand_gpu({T, kH}, 43, 1e-1f);
      double us[2] = {};
      for (int on = 0; on < 2; ++on) {
        ops::KernelOptions ko;
        ko.gemm_small_fuse = on == 1;
        const std::shared_ptr<ops::Backend> be = kc::make_backend(ko);
        auto run = [&] { (void)be->linear_multi(x, {a, b}, nullptr); };
        run();
        us[on] = kc::graph_time_us(run);
      }
      fmt::print("| {:<23} | {:>2} | {:>12.1f} | {:>12.1f} | {:>8.1f} | {:>9.2f} | {:>8.2f} | {:>5.2f} |\n",
                 pr.name, T, us[0], us[1], floor_us, floor_us / us[0], floor_us / us[1], us[0] / us[1]);
      std::fflush(stdout);
    }
  }
  // The absorbed projections at 64 heads (KernelOptions::absorb_small_max_tokens): conversion pass +
  // cuBLASLt's strided batch (0) against the small-T kernel (8). Floor: W_UK / W_UV's bf16 bytes.
  fmt::print("\n| {:<23} | {:>2} | {:>12} | {:>12} | {:>8} | {:>9} | {:>8} | {:>5} |\n",
             "absorbed projection", "T", "cuBLASLt us", "small-T us", "floor us", "ratio off", "ratio on",
             "gain");
  const ops::WeightRef kv_b = weight(kHeads * (kNope + kV), kKvLora, DType::bf16);
  for (bool q_form : {true, false}) {
    const double floor_us = double(kHeads * (q_form ? kNope : kV) * kKvLora * 2) / kHbm * 1e6;
    for (int64_t T : {1, 2, 4, 8}) {
      const Tensor q = rand_gpu({T, kHeads, kNope + kRope}, 47), lat = rand_gpu({T, kHeads, kKvLora}, 48);
      const Tensor q_nope = q.slice(2, 0, kNope);
      Tensor out = Tensor::empty({T, kHeads, q_form ? kKvLora : kV}, DType::f32, Device::cuda);
      double us[2] = {};
      for (int on = 0; on < 2; ++on) {
        ops::KernelOptions ko;
        ko.absorb_small_max_tokens = on == 1 ? 8 : 0;
        const std::shared_ptr<ops::Backend> be = kc::make_backend(ko);
        auto run = [&] {
          if (q_form) {
            (void)be->absorb_q(q_nope, kv_b, out);
          } else {
            (void)be->absorb_v(lat, kv_b, kV, out);
          }
        };
        run();
        us[on] = kc::graph_time_us(run);
      }
      fmt::print("| {:<23} | {:>2} | {:>12.1f} | {:>12.1f} | {:>8.1f} | {:>9.2f} | {:>8.2f} | {:>5.2f} |\n",
                 q_form ? "absorb_q (W_UK)" : "absorb_v (W_UV)", T, us[0], us[1], floor_us, floor_us / us[0],
                 floor_us / us[1], us[0] / us[1]);
      std::fflush(stdout);
    }
  }
}

// The prefill path's small ops before and after the f32-activation kernel (kernels/cuda/gemm/
// gemm_f32act_params.h), each through a backend that forces one path (KernelOptions thresholds 0: the old
// path; 1: the fused kernel wherever it applies; the default switches at gemm_split_fused_min_tokens /
// absorb_fused_min_tokens): router_gate [256 x 6144] and the indexer's wk + weights_proj [128 + 32 x 6144]
// (the narrow two-term recipe: split pass + two cuBLASLt GEMMs per weight, or one fused launch), absorb_q /
// absorb_v at 64 heads (conversion pass + cuBLASLt's strided batch, or one fused launch; with o_proj's
// activation quantisation: a pass over the f32 output, or absorb_v_fp8's epilogue), silu_mul with the down
// projection's quantisation (a pass, or silu_mul_fp8; KernelOptions::silu_mul_fp8_copy). Floor: the plan's
// arithmetic (one bf16 term) at the bf16 peak, or the bytes the fused kernel must move (bf16 weights, f32
// activations in and out) at 4.3 TB/s, whichever is larger; ratio = floor / the default path's time.
void bench_prefill_ops() {
  namespace kc = dsaserve::kernels::cuda;
  ops::KernelOptions old_o, new_o;
  old_o.gemm_split_fused_min_tokens = 0;
  old_o.absorb_fused_min_tokens = 0;
  old_o.silu_mul_fp8_copy = false;
  new_o.gemm_split_fused_min_tokens = 1;
  new_o.absorb_fused_min_tokens = 1;
  const std::shared_ptr<ops::Backend> old_be = kc::make_backend(old_o), new_be = kc::make_backend(new_o),
                                      def_be = kc::make_backend({});
  fmt::print("\n| {:<22} | {:>5} | {:<20} | {:>9} | {:>9} | {:>9} | {:>9} | {:>5} | {:>5} |\n", "prefill op",
             "T", "shape", "old us", "fused us", "dflt us", "floor us", "gain", "ratio");
  auto line = [](const std::string& op, int64_t T, const std::string& shape, double t_old, double t_new,
                 double t_def, double bytes, double flops) {
    const double floor_us = std::max(bytes / kHbm, flops / kBf16) * 1e6;
    fmt::print(
        "| {:<22} | {:>5} | {:<20} | {:>9.1f} | {:>9.1f} | {:>9.1f} | {:>9.2f} | {:>5.2f} | {:>5.2f} |\n", op,
        T, shape, t_old, t_new, t_def, floor_us, t_old / t_new, floor_us / t_def);
    std::fflush(stdout);
  };
  const ops::WeightRef router = weight(256, kH, DType::bf16), wk = weight(128, kH, DType::bf16),
                       wp = weight(32, kH, DType::bf16);
  const ops::WeightRef kv_b = weight(kHeads * (kNope + kV), kKvLora, DType::bf16);
  for (int64_t T : {1, 32, 128, 1024, 4096, 16384}) {
    {
      const Tensor x = rand_gpu({T, kH}, 7);
      Tensor out = Tensor::empty({T, 256}, DType::f32, Device::cuda);
      auto run = [&](ops::Backend& b) { return time_us([&] { b.linear(x, router, 0, -1, out); }); };
      line("router_gate", T, fmt::format("[{},{},256]", T, kH), run(*old_be), run(*new_be), run(*def_be),
           double(256 * kH) * 2 + 4.0 * double(T * (kH + 256)), 2.0 * double(T * 256 * kH));
      auto run_multi = [&](ops::Backend& b) {
        return time_us([&] { b.linear_multi(x, {wk, wp}, nullptr); });
      };
      line("indexer_wk_weights", T, fmt::format("[{},{},128+32]", T, kH), run_multi(*old_be),
           run_multi(*new_be), run_multi(*def_be), double(160 * kH) * 2 + 4.0 * double(T * (kH + 160)),
           2.0 * double(T * 160 * kH));
    }
    for (int64_t I : {int64_t(2048), int64_t(12288)}) {  // shared expert, dense MLP: silu_mul + down's quant
      const Tensor gu = rand_gpu({T, 2 * I}, 10);
      const Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
      auto run = [&](ops::Backend& b) {
        return time_us([&] {
          ops::Fp8Act q;
          const Tensor a = b.silu_mul_fp8(g, u, q);
          if (!q.defined()) (void)kc::quantize_fp8_activations(a);
        });
      };
      line(fmt::format("silu_mul+fp8 quant {}", I), T, fmt::format("[{},{}]", T, I), run(*old_be),
           run(*new_be), run(*def_be), double(T * I) * (4.0 * 3 + 1), 0);
    }
    {
      const Tensor q = rand_gpu({T, kHeads, kNope + kRope}, 8);
      const Tensor q_nope = q.slice(2, 0, kNope);
      Tensor q_lat = Tensor::empty({T, kHeads, kKvLora}, DType::f32, Device::cuda);
      auto run = [&](ops::Backend& b) { return time_us([&] { b.absorb_q(q_nope, kv_b, q_lat); }); };
      line("absorb_q 64h", T, fmt::format("64x[{},{},{}]", T, kNope, kKvLora), run(*old_be), run(*new_be),
           run(*def_be), double(kHeads * kNope * kKvLora) * 2 + 4.0 * double(T * kHeads * (kNope + kKvLora)),
           2.0 * double(T * kHeads * kNope * kKvLora));
    }
    {
      const Tensor lat = rand_gpu({T, kHeads, kKvLora}, 9);
      Tensor o = Tensor::empty({T, kHeads, kV}, DType::f32, Device::cuda);
      auto run = [&](ops::Backend& b) { return time_us([&] { b.absorb_v(lat, kv_b, kV, o); }); };
      line("absorb_v 64h", T, fmt::format("64x[{},{},{}]", T, kKvLora, kV), run(*old_be), run(*new_be),
           run(*def_be), double(kHeads * kV * kKvLora) * 2 + 4.0 * double(T * kHeads * (kKvLora + kV)),
           2.0 * double(T * kHeads * kKvLora * kV));
      // With o_proj's activation quantisation: absorb_v_fp8's copy, or (no copy) a quantisation pass over
      // the f32 output. Floor: + the codes written.
      auto run_q = [&](ops::Backend& b) {
        return time_us([&] {
          ops::Fp8Act q;
          b.absorb_v_fp8(lat, kv_b, kV, o, q);
          if (!q.defined()) (void)kc::quantize_fp8_activations(o.view({T, kHeads * kV}));
        });
      };
      line("absorb_v+o_proj quant", T, fmt::format("64x[{},{},{}]", T, kKvLora, kV), run_q(*old_be),
           run_q(*new_be), run_q(*def_be),
           double(kHeads * kV * kKvLora) * 2 + 4.0 * double(T * kHeads * (kKvLora + kV)) +
               double(T * kHeads * kV),
           2.0 * double(T * kHeads * kKvLora * kV));
    }
  }
}
}  // namespace

// `ops_gpu_bench moe [T,T,..]` runs only the routed experts' table (at the given token counts),
// `ops_gpu_bench splits` only the small-T FP8 kernel's K-split sweep, `ops_gpu_bench pdl` only the
// programmatic-dependent-launch chains, `ops_gpu_bench prefill` only the prefill ops' old / fused table.
int main(int argc, char** argv) {
  if (dsaserve::kernels::cuda::device_count() == 0) {
    fmt::print("ops_gpu_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  ops::cuda::install_backend();
  fmt::print("ops_gpu_bench on {}\n", dsaserve::kernels::cuda::device_summary());
  if (argc > 1 && std::string(argv[1]) == "moe") {
    std::vector<int64_t> tokens(std::begin(kMoeTokens), std::end(kMoeTokens));
    if (argc > 2) {
      tokens.clear();
      std::stringstream list(argv[2]);
      for (std::string item; std::getline(list, item, ',');) {
        const int64_t t = std::strtoll(item.c_str(), nullptr, 10);
        if (t < 1 || t > 65536) {
          fmt::print(stderr, "ops_gpu_bench moe: token counts are 1..65536, got '{}'\n", item);
          return 2;
        }
        tokens.push_back(t);
      }
    }
    bench_moe_experts(tokens);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "splits") {
    bench_fp8_small_splits();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "lmhead") {
    bench_lm_head();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "stages") {
    bench_fp8_small_stages();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "fuse") {
    bench_small_fuse();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "norm") {
    bench_rms_norm_cluster();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "pdl") {
    bench_pdl_chains();
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "prefill") {
    bench_prefill_ops();
    return 0;
  }
  fmt::print("| {:<24} | {:>5} | {:<22} | {:>10} | {:>8} | {:>8} | {:>9} | {:>5} |\n", "op", "T",
             "shape [T,K,N]", "time us", "GB/s", "TFLOP/s", "floor us", "ratio");
  fmt::print("|{:-<26}|{:->7}|{:-<24}|{:->12}|{:->10}|{:->10}|{:->11}|{:->7}|\n", "", "", "", "", "", "", "",
             "");
  const int64_t kTs[] = {1, 32, 256, 4096};
  struct G {
    const char* name;
    int64_t n, k;
  };
  const G gemms[] = {{"q_a_proj", kQLora, kH},           {"q_b_proj", kHeads * (kNope + kRope), kQLora},
                     {"kv_a_proj", kKvLora + kRope, kH}, {"o_proj", kH, kHeads * kV},
                     {"expert_gate", 2048, kH},          {"expert_down", kH, 2048}};
  for (DType dt : {DType::f8e4m3fn, DType::bf16}) {
    for (const G& g : gemms) {
      const ops::WeightRef w = weight(g.n, g.k, dt);
      for (int64_t T : kTs) {
        const Tensor x = rand_gpu({T, g.k}, 1);
        Tensor out = Tensor::empty({T, g.n}, DType::f32, Device::cuda);
        const double us = time_us([&] { ops::linear(x, w, 0, -1, out); });
        const double wb = double(g.n * g.k) * (dt == DType::bf16 ? 2 : 1);
        row(fmt::format("linear {} {}", dt == DType::bf16 ? "bf16" : "fp8", g.name), T,
            fmt::format("[{},{},{}]", T, g.k, g.n), us, wb + 4.0 * double(T * (g.k + g.n)),
            2.0 * double(T * g.n * g.k), dt == DType::bf16 ? kBf16 : kFp8);
      }
    }
  }
  // The FP8 linear in its two steps (the activation quantisation, an elementwise pass a producer could
  // fuse, and the block-scaled GEMM on quantised activations), and for T <= 256 the whole linear as a
  // CUDA-graph replay (GPU time without the host's launch overhead).
  for (const G& g : gemms) {
    const ops::WeightRef w = weight(g.n, g.k, DType::f8e4m3fn);
    for (int64_t T : kTs) {
      const Tensor x = rand_gpu({T, g.k}, 1);
      Tensor out = Tensor::empty({T, g.n}, DType::f32, Device::cuda);
      namespace kc = dsaserve::kernels::cuda;
      const double uq = time_us([&] { kc::quantize_fp8_activations(x); });
      row(fmt::format("fp8 act quant {}", g.name), T, fmt::format("[{},{}]", T, g.k), uq,
          5.0 * double(T * g.k) + 4.0 * double(T * g.k / 128), 0, kF32);
      const ops::Fp8Act a = kc::quantize_fp8_activations(x);
      const double ug = time_us([&] { kc::gemm_linear_fp8(a, w, 0, g.n, out); });
      row(fmt::format("fp8 gemm-only {}", g.name), T, fmt::format("[{},{},{}]", T, g.k, g.n), ug,
          double(g.n * g.k) + double(T * g.k) + 4.0 * double(T * g.n), 2.0 * double(T * g.n * g.k), kFp8);
      if (T <= 256) {
        ops::linear(x, w, 0, -1, out);
        const double ul = kc::graph_time_us([&] { ops::linear(x, w, 0, -1, out); });
        row(fmt::format("linear fp8 {} (graph)", g.name), T, fmt::format("[{},{},{}]", T, g.k, g.n), ul,
            double(g.n * g.k) + 4.0 * double(T * (g.k + g.n)), 2.0 * double(T * g.n * g.k), kFp8);
      }
    }
  }
  const Tensor wn = filled({kH}, DType::bf16, 0x3f);
  for (int64_t T : kTs) {
    const Tensor x = rand_gpu({T, kH}, 2);
    Tensor res = rand_gpu({T, kH}, 3);
    const double b = 4.0 * double(T * kH);
    row("rms_norm", T, fmt::format("[{},{}]", T, kH), time_us([&] { ops::rms_norm(x, wn, 1e-5); }), 2 * b, 0,
        kF32);
    row("add_rms_norm", T, fmt::format("[{},{}]", T, kH),
        time_us([&] { ops::add_rms_norm(res, x, wn, 1e-5); }), 4 * b, 0, kF32);
    const Tensor g = rand_gpu({T, 2048}, 4), u = rand_gpu({T, 2048}, 5);
    row("silu_mul", T, fmt::format("[{},2048]", T), time_us([&] { ops::silu_mul(g, u); }),
        12.0 * double(T * 2048), 0, kF32);
    Tensor q = rand_gpu({T, kHeads, kNope + kRope}, 6);
    Tensor qpe = q.slice(2, kNope, kNope + kRope);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    std::iota(pos.begin(), pos.end(), 1000);
    const Tensor pos_d = i32_gpu(pos);
    ops::RopeParams rp;
    rp.dim = kRope;
    rp.theta = 1e6;
    row("rope q_pe", T, fmt::format("[{},{},{}]", T, kHeads, kRope),
        time_us([&] { ops::rope_inplace(qpe, pos_d, rp); }), 8.0 * double(T * kHeads * kRope), 0, kF32);
    Tensor acc = rand_gpu({T, kH}, 7);
    row("add_inplace", T, fmt::format("[{},{}]", T, kH), time_us([&] { ops::add_inplace(acc, x); }), 3 * b, 0,
        kF32);
    const Tensor logits = rand_gpu({T, 256}, 8, 4.0f), bias = rand_gpu({256}, 9, 0.1f);
    const ops::MoeRouteParams mp{1, 1, 8, true, 2.5};
    row("moe_route 256 top-8", T, fmt::format("[{},256]", T),
        time_us([&] { ops::moe_route(logits, bias, mp); }), 4.0 * double(T * (256 + 16)), 0, kF32);
  }
  {
    const Tensor table = filled({154880, kH}, DType::bf16, 0x3c);
    for (int64_t T : kTs) {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % 154880);
      const Tensor ids_d = i32_gpu(ids);
      row("embedding", T, fmt::format("[{},{}]", T, kH), time_us([&] { ops::embedding(table, ids_d); }),
          6.0 * double(T * kH), 0, kF32);
      const Tensor lg = filled({T, 154880}, DType::f32, 0x3c);
      row("argmax (lm head out)", T, fmt::format("[{},154880]", T), time_us([&] { ops::argmax(lg); }),
          4.0 * double(T * 154880), 0, kF32);
    }
  }
  {
    // Absorbed MLA over a DSA selection of 2048 keys (the plain kernel; the fast one is CUDA path part 2).
    const int64_t start = 8192, ps = 64;
    for (int64_t T : kTs) {
      const int64_t S = start + T, pages = (S + ps - 1) / ps;
      const Tensor cache = rand_gpu({pages * ps, kKvLora + kRope}, 14);
      std::vector<int32_t> table(static_cast<size_t>(pages));
      std::iota(table.begin(), table.end(), 0);
      const ops::PagedSeq seq{cache, i32_gpu(table), ps};
      const Tensor ql = rand_gpu({T, kHeads, kKvLora}, 15, 0.1f), qr = rand_gpu({T, kHeads, kRope}, 16, 0.1f);
      Tensor sel = Tensor::empty({T, 2048}, DType::i32);
      for (int64_t i = 0; i < sel.numel(); ++i)
        sel.data<int32_t>()[i] = int32_t((i * 2654435761u) % uint64_t(start));
      const Tensor sel_d = sel.to(Device::cuda);
      row("mla_absorbed sel 2048", T, fmt::format("[{},{},2048]", T, kHeads),
          time_us([&] { ops::mla_attention_absorbed(ql, qr, seq, start, sel_d, 0.0625); }, 1, 5),
          4.0 * double(T * 2048 * (kKvLora + kRope)), 4.0 * double(T * kHeads * 2048 * (2 * kKvLora + kRope)),
          kF32);
    }
  }
  {
    // GPU sampler (kernels/cuda/sampling/sampling.h) over a batch of GLM-5.3 logit rows (vocab 154,880): the
    // whole sample_rows call (request packing, upload, kernels, result download). Bytes: the logits read
    // once.
    namespace kc = dsaserve::kernels::cuda;
    const int64_t V = 154880;
    std::vector<int32_t> seen(300);
    std::vector<std::pair<int32_t, int32_t>> counts(40);
    for (size_t i = 0; i < seen.size(); ++i) seen[i] = int32_t(i * 511 % uint64_t(V));
    for (size_t i = 0; i < counts.size(); ++i) counts[i] = {seen[i], 1 + int32_t(i % 3)};
    struct Mode {
      const char* name;
      kc::SampleRequest q;
    };
    std::vector<Mode> modes(4);
    modes[0].name = "sample greedy";
    modes[0].q.temperature = 0.0f;
    modes[1].name = "sample temperature";
    modes[2].name = "sample k50 p0.95 +lp5";
    modes[2].q.top_k = 50;
    modes[2].q.top_p = 0.95f;
    modes[2].q.logprobs = true;
    modes[2].q.top_logprobs = 5;
    modes[3].name = "sample p0.9 penalties";
    modes[3].q.top_p = 0.9f;
    modes[3].q.repetition_penalty = 1.1f;
    modes[3].q.frequency_penalty = 0.5f;
    modes[3].q.seen_tokens = seen;
    modes[3].q.output_counts = counts;
    for (const Mode& m : modes) {
      for (int64_t R : {int64_t(1), int64_t(32), int64_t(256)}) {
        const Tensor logits = rand_gpu({R, V}, 17, 8.0f);
        std::vector<kc::SampleRequest> req(size_t(R), m.q);
        for (size_t i = 0; i < req.size(); ++i) req[i].uniform = double(i % 97) / 97.0;
        row(m.name, R, fmt::format("[{},{}]", R, V), time_us([&] { kc::sample_rows(logits, req); }),
            4.0 * double(R * V), 0.0, kF32);
      }
    }
  }
  bench_mla_fused(kTs, sizeof(kTs) / sizeof(kTs[0]));
  bench_moe_experts({std::begin(kMoeTokens), std::end(kMoeTokens)});
  const auto st = dsaserve::kernels::cuda::gemm_stats();
  fmt::print(
      "GEMM paths: {} FP8 block-scaled calls, {} bf16, {} f32, {} FP8 weights dequantised (fallback), {} "
      "shapes "
      "without an algorithm {}\n",
      st.fp8_calls, st.bf16_calls, st.f32_calls, st.dequantised, st.failed_plans, st.last_failure);
  return 0;
}
