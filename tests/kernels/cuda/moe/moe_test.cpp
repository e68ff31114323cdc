// The MoE experts on the GPU: the device grouping of the routing against a host reference, moe_experts on
// both paths (device-grouped kernels, host-grouped cuBLASLt) against the CPU op at GLM-5.3 shapes (hidden
// 6144, moe_intermediate 2048, 256 experts top-8) and realdims shapes (hidden 256, 16 experts top-4,
// intermediate 128), the grouped FP8 tensor-core kernels (device_fp8) at GLM-5.3 shapes with ragged rows,
// dropped out-of-range ids, and a CUDA-graph capture replayed with new routings.
//
// GLM-5.3 shapes: the 256 experts share 16 distinct weight sets (expert e uses set e % 16; random weights
// for 256 experts would take minutes to make), so the kernels still see 256 experts' pointers; the CPU
// reference runs the 16 sets with the ids taken mod 16 (the same products, summed in another order).
// Tolerances (per row ||diff||_2 / ||ref||_2): the device path multiplies the exactly dequantised weights
// with the f32 activations like the CPU, 1e-4; the host path rounds activations to bf16 (1e-2 from the
// CPU op) or, with FP8 weights, runs the FP8 recipe, as the device_fp8 path (the grouped tensor-core
// kernels) does: both are held to the CPU op with that arithmetic emulated
// (kernels::make_fp8_emulation_backend; 3e-2, 1e-2 at GLM-5.3 widths: see kTolFp8EmulatedGlm) and, at
// GLM-5.3 widths, device_fp8 to the exact CPU op within the dense FP8 linears' tolerance (5e-2, ops_test);
// at realdims widths the FP8 rounding itself (up to ~9e-2) is printed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/fixtures.h"
#include "core/error.h"
#include "gpu_test.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/moe/moe_params.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "op_test_util.h"
#include "runtime/engine/device.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace testing;

constexpr double kTolDevice = 1e-4, kTolBf16 = 1e-2;
// The FP8 host path against the CPU emulation of its arithmetic: the expert inputs quantise to the same
// codes bit for bit (CudaFp8Emulation.QuantKernelMatchesCpuRule), the gate / up products differ by
// accumulation order (or by a bf16 rounding where cuBLASLt has no f32-output algorithm), and such a
// difference moves an occasional SiLU output across an e4m3 rounding boundary (a 2^-4 step), which at
// realdims widths (one or two 128-groups per output) shows in the row. Measured on the CPU at realdims
// shapes (T = 300, FP8 weights): relative changes of 1e-5 / 1e-4 / 1e-3 in the gate and up products move
// the worst row by 0.9e-2 / 1.9e-2 / 2.4e-2, bf16 products by 3.2e-2; the FP8 rounding itself is 6e-2 from
// the exact product there (9.3e-2 measured on the H200).
constexpr double kTolFp8Emulated = 3e-2;
// device_fp8 against the emulation at GLM-5.3 widths: the inputs quantise to the same codes, the f32 sums
// differ by accumulation order (~1e-6 relative), which flips an e4m3 code of the down projection's input
// (the SiLU-mul output) only within ~1e-6 of a rounding boundary: ~3e-5 of the 2,048 values of a row,
// each flip moving one of 2,048 products by at most one e4m3 step (2^-3): ~1e-3 of the row at worst.
constexpr double kTolFp8EmulatedGlm = 1e-2;
// The same for prefill-sized groups (moe_fp8_tile_rows 128: the wgmma form): Hopper's FP8 wgmma keeps fewer
// bits than f32 in its own accumulation of a 128-wide K block (four k32 steps; the kernel promotes each
// block's sum into f32, DeepGEMM's recipe), so the block sums differ from the emulation's f32 order by
// ~1e-4 relative, not 1e-6, and flip more SiLU-mul codes: measured 1.06e-2 / 1.69e-2 (T = 1,024, kinds
// 0 / 2) on the H200, while the distance to the exact product stays within kTolFp8Exact.
constexpr double kTolFp8EmulatedGlmWgmma = 3e-2;
// The FP8 recipe against the exact product at GLM-5.3 widths: the dense FP8 linears' tolerance (ops_test).
constexpr double kTolFp8Exact = 5e-2;

class CudaMoe : public testing::GpuTest {};

// moe_experts on a CUDA backend whose KernelOptions force the experts' path; `set`: the experts' derived
// table (null: the op makes one for the call).
Tensor moe_on_path(MoePath path, const Tensor& x_d, const Routing& r_d, const std::vector<MlpRef>& experts,
                   const DerivedExperts* set) {
  KernelOptions o;
  o.moe = path;
  return make_backend(o)->moe_experts(x_d, r_d, experts, nullptr, set, nullptr);
}

const char* dtype_tag(DType dt) { return dt == DType::bf16 ? "bf16" : dt == DType::f32 ? "f32" : "fp8"; }

// ---- device grouping ------------------------------------------------------------------------------------

struct GroupRef {
  std::vector<int32_t> counts, offsets, active, rows, pos;
  int32_t dropped = 0;
};

GroupRef group_on_host(const std::vector<int32_t>& ids, int64_t K, int64_t E) {
  GroupRef g;
  g.counts.assign(size_t(E), 0);
  for (int32_t e : ids) {
    if (e >= 0 && e < E)
      ++g.counts[size_t(e)];
    else
      ++g.dropped;
  }
  g.offsets.assign(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    g.offsets[size_t(e) + 1] = g.offsets[size_t(e)] + g.counts[size_t(e)];
    if (g.counts[size_t(e)] > 0) g.active.push_back(int32_t(e));
  }
  std::vector<int32_t> fill(g.offsets.begin(), g.offsets.end() - 1);
  g.rows.assign(size_t(g.offsets.back()), -1);
  g.pos.assign(ids.size(), -1);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= E) continue;
    const int32_t m = fill[size_t(e)]++;
    g.rows[size_t(m)] = int32_t(int64_t(i) / K);
    g.pos[i] = m;
  }
  return g;
}

// Runs launch_moe_group on `ids` and checks every output against the host reference.
void check_grouping(const std::string& name, const std::vector<int32_t>& ids, int64_t K, int64_t E) {
  const int64_t M = int64_t(ids.size());
  Tensor ids_h = Tensor::empty({M}, DType::i32);
  std::copy(ids.begin(), ids.end(), ids_h.data<int32_t>());
  const Tensor ids_d = ids_h.to(Device::cuda);
  // header [4], offsets [E + 1], counts [E], active [E], rows [M], pos [M]
  const int64_t n = 4 + (E + 1) + 2 * E + 2 * M;
  Tensor buf = Tensor::empty({n}, DType::i32, Device::cuda);
  int32_t* d = buf.data<int32_t>();
  MoeGroupParams p{ids_d.data<int32_t>(), d, d + 4, d + 4 + E + 1, d + 4 + 2 * E + 1, d + 4 + 3 * E + 1,
                   d + 4 + 3 * E + 1 + M, M, K,     int(E)};
  ASSERT_EQ(launch_moe_group(p, op_stream()), cudaSuccess) << name;
  const Tensor h = buf.to(Device::cpu);
  const int32_t* o = h.data<int32_t>();
  const GroupRef want = group_on_host(ids, K, E);
  int64_t bad = 0;
  const int32_t n_active = o[0];
  bad += n_active != int32_t(want.active.size());
  bad += o[1] != want.dropped;
  for (int64_t e = 0; e <= E; ++e) bad += o[4 + e] != want.offsets[size_t(e)];
  for (int64_t e = 0; e < E; ++e) bad += o[4 + E + 1 + e] != want.counts[size_t(e)];
  for (size_t a = 0; a < want.active.size() && int32_t(a) < n_active; ++a)
    bad += o[4 + 2 * E + 1 + int64_t(a)] != want.active[a];
  for (size_t m = 0; m < want.rows.size(); ++m) bad += o[4 + 3 * E + 1 + int64_t(m)] != want.rows[m];
  for (int64_t i = 0; i < M; ++i) bad += o[4 + 3 * E + 1 + M + i] != want.pos[size_t(i)];
  fmt::print(
      "RESULT op=moe_group {:<24} pairs={:<6} experts={:<5} active={:<4} dropped={:<3} mismatches={} {}\n",
      name, M, E, n_active, o[1], bad, bad == 0 ? "ok" : "FAIL");
  EXPECT_EQ(bad, 0) << name;
}

TEST_F(CudaMoe, GroupingMatchesHostReference) {
  struct Case {
    const char* name;
    int64_t T, K, E;
    int kind;  // 0 distinct experts per token, 1 independent draws (repeats within a token), 2 all to one
  };
  const Case cases[] = {{"glm T=1", 1, 8, 256, 0},
                        {"glm T=3", 3, 8, 256, 0},
                        {"glm T=37", 37, 8, 256, 0},
                        {"glm T=256", 256, 8, 256, 0},
                        {"glm T=256 repeats", 256, 8, 256, 1},
                        {"glm T=256 one expert", 256, 8, 256, 2},
                        {"glm T=4096", 4096, 8, 256, 0},
                        {"realdims T=300", 300, 4, 16, 1},
                        {"e=1024 T=77", 77, 8, 1024, 0},
                        {"e=1 T=5", 5, 1, 1, 2},
                        {"few experts ties", 200, 8, 3, 1}};
  for (const Case& c : cases) {
    std::vector<int32_t> ids(size_t(c.T * c.K));
    Rng r(uint64_t(c.T * 131 + c.E));
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int32_t> all(size_t(c.E));
      std::iota(all.begin(), all.end(), 0);
      for (int64_t k = 0; k < c.K; ++k) {
        int32_t v = 0;
        if (c.kind == 0 && c.K <= c.E) {
          std::swap(all[size_t(k)], all[size_t(k + r.below(c.E - k))]);
          v = all[size_t(k)];
        } else if (c.kind == 1) {
          v = int32_t(r.below(c.E));
        } else {
          v = int32_t(std::min<int64_t>(5, c.E - 1));
        }
        ids[size_t(t * c.K + k)] = v;
      }
    }
    check_grouping(c.name, ids, c.K, c.E);
  }
  // Out-of-range ids are dropped (pos -1) and counted.
  int64_t before = 0;
  ASSERT_EQ(moe_take_dropped_pairs(&before), cudaSuccess);
  std::vector<int32_t> ids(64 * 8);
  Rng r(5);
  for (auto& v : ids) v = int32_t(r.below(256));
  ids[3] = -1;
  ids[100] = 256;
  ids[511] = 1 << 30;
  check_grouping("glm T=64 3 bad ids", ids, 8, 256);
  int64_t dropped = 0;
  ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
  EXPECT_EQ(dropped, 3);
}

// ---- moe_experts ----------------------------------------------------------------------------------------

struct ExpertSet {
  std::vector<MlpRef> cpu, gpu;  // cpu: the distinct sets; gpu: `experts` entries, expert e -> set e % sets
  std::shared_ptr<const DerivedExperts> table;  // gpu's derived table, as a model holds it (model load)
};

ExpertSet make_experts(int64_t sets, int64_t experts, int64_t H, int64_t I, DType dt, uint64_t seed) {
  ExpertSet s;
  std::vector<MlpRef> distinct;
  for (int64_t i = 0; i < sets; ++i) {
    MlpRef m{rand_weight(I, H, dt, seed + 3 * uint64_t(i)), rand_weight(I, H, dt, seed + 3 * uint64_t(i) + 1),
             rand_weight(H, I, dt, seed + 3 * uint64_t(i) + 2)};
    distinct.push_back({to_cuda(m.gate), to_cuda(m.up), to_cuda(m.down)});
    s.cpu.push_back(std::move(m));
  }
  for (int64_t e = 0; e < experts; ++e) s.gpu.push_back(distinct[size_t(e % sets)]);
  s.table = derive_moe_experts(s.gpu);
  return s;
}

// Top-K routing over E experts with positive router-like weights; kind as in the grouping test (0 distinct
// experts per token, 1 repeats, 2 every pair on expert 7), and 3 skewed: slot 0 of token t on expert t % 3,
// the other slots distinct experts of 3 .. E - 1 (three crowded experts beside many light ones: the wgmma
// form's passes of 128 rows, several per expert with ragged tails, next to one-pass experts).
Routing make_routing(int64_t T, int64_t K, int64_t E, int kind, uint64_t seed) {
  DSA_CHECK(kind != 3 || E >= K + 2, "make_routing kind 3: {} experts, {} slots (needs E >= K + 2)", E, K);
  Routing r{Tensor::empty({T, K}, DType::i32), rand_f32({T, K}, seed)};
  for (int64_t i = 0; i < T * K; ++i) r.weights.data<float>()[i] = 0.55f + 0.45f * r.weights.data<float>()[i];
  Rng rng(seed);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t k = 0; k < K; ++k) {
      int32_t v = 7 % int32_t(E);
      if (kind == 0) {
        std::swap(all[size_t(k)], all[size_t(k + rng.below(E - k))]);
        v = all[size_t(k)];
      } else if (kind == 3) {
        if (k == 0) {
          v = int32_t(t % 3);
        } else {
          std::swap(all[size_t(k + 2)], all[size_t(k + 2 + rng.below(E - k - 2))]);
          v = all[size_t(k + 2)];
        }
      } else if (kind == 1) {
        v = int32_t(rng.below(E));
      }
      r.ids.data<int32_t>()[t * K + k] = v;
    }
  }
  return r;
}

// The CPU reference over the distinct sets (ids mod sets).
Tensor reference(const Tensor& x, const Routing& r, const ExpertSet& s) {
  Routing m{r.ids.clone(), r.weights};
  const int32_t sets = int32_t(s.cpu.size());
  for (int64_t i = 0; i < m.ids.numel(); ++i) m.ids.data<int32_t>()[i] %= sets;
  return backend(Device::cpu).moe_experts(x, m, s.cpu, nullptr, nullptr, nullptr);
}

// The CPU reference with the GPU's FP8 linear arithmetic emulated: each expert linear's input quantised per
// token per 128-group (e4m3, amax / 448), then multiplied in f32 with the dequantised weight; f32 products
// (the GPU's FP8 GEMMs write f32 D: gemm.h).
Tensor reference_fp8_emulated(const Tensor& x, const Routing& r, const ExpertSet& s) {
  kernels::cpu::Fp8Emulation e;
  e.enabled = true;
  e.bf16_output = false;
  Routing m{r.ids.clone(), r.weights};
  const int32_t sets = int32_t(s.cpu.size());
  for (int64_t i = 0; i < m.ids.numel(); ++i) m.ids.data<int32_t>()[i] %= sets;
  return make_fp8_emulation_backend(e)->moe_experts(x, m, s.cpu, nullptr, nullptr, nullptr);
}

Tensor run_path(MoePath path, const Tensor& x_d, const Routing& r_d, const ExpertSet& s) {
  return moe_on_path(path, x_d, r_d, s.gpu, s.table.get()).to(Device::cpu);
}

// Both paths against the CPU op and against each other.
void check_both_paths(const std::string& name, const Tensor& x, const Routing& r, const ExpertSet& s,
                      DType dt, bool host_path = true) {
  const Tensor x_d = x.to(Device::cuda);
  const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
  const Tensor want = reference(x, r, s);
  const Tensor dev = run_path(MoePath::device, x_d, r_d, s);
  report_gemm(name + " device", shape_str(x.shape()), dev, want, kTolDevice);
  if (!host_path) return;
  const Tensor host = run_path(MoePath::host, x_d, r_d, s);
  if (dt == DType::f8e4m3fn) {
    const Tensor emulated = reference_fp8_emulated(x, r, s);
    report_gemm(name + " host~cpu_fp8_emulation", shape_str(x.shape()), host, emulated, kTolFp8Emulated);
    fmt::print("RESULT op={:<22} shape={:<34} l2_rel_err={:.3g} (the FP8 rounding: printed, not asserted)\n",
               name + " host~exact", shape_str(x.shape()), row_l2_rel_error(host, want));
    const Tensor tc = run_path(MoePath::device_fp8, x_d, r_d, s);
    report_gemm(name + " device_fp8~cpu_fp8_emulation", shape_str(x.shape()), tc, emulated, kTolFp8Emulated);
    fmt::print("RESULT op={:<22} shape={:<34} l2_rel_err={:.3g} (printed, not asserted)\n",
               name + " device_fp8~exact", shape_str(x.shape()), row_l2_rel_error(tc, want));
    return;
  }
  const double tol = dt == DType::bf16 ? kTolBf16 : kTolDevice;
  report_gemm(name + " host", shape_str(x.shape()), host, want, tol);
  report_gemm(name + " device~host", shape_str(x.shape()), dev, host, tol);
}

TEST_F(CudaMoe, GlmShapesBothPaths) {
  constexpr int64_t kH = 6144, kI = 2048, kE = 256, kK = 8, kSets = 16;
  for (DType dt : {DType::f8e4m3fn, DType::bf16}) {
    const ExpertSet s = make_experts(kSets, kE, kH, kI, dt, 5000);
    for (int64_t T : {1, 3, 32, 256}) {
      if (dt == DType::bf16 && T > 32) continue;  // the CPU reference is the slow part
      const Routing r = make_routing(T, kK, kE, 0, 5100 + uint64_t(T));
      const Tensor x = rand_f32({T, kH}, 5200 + uint64_t(T));
      check_both_paths(fmt::format("moe_experts glm {} T={}", dtype_tag(dt), T), x, r, s, dt);
    }
  }
}

TEST_F(CudaMoe, RealdimsShapesAllDtypesAndRoutings) {
  constexpr int64_t kH = 256, kI = 128, kE = 16, kK = 4;
  for (DType dt : {DType::f8e4m3fn, DType::bf16, DType::f32}) {
    const ExpertSet s = make_experts(kE, kE, kH, kI, dt, 6000);
    for (int64_t T : {1, 5, 64, 300}) {
      for (int kind : {0, 1, 2}) {
        const Routing r = make_routing(T, kK, kE, kind, 6100 + uint64_t(T * 3 + kind));
        const Tensor x = rand_f32({T, kH}, 6200 + uint64_t(T));
        check_both_paths(fmt::format("moe_experts realdims {} T={} kind={}", dtype_tag(dt), T, kind), x, r, s,
                         dt);
      }
    }
    // Input rows that are not 16-byte aligned (a view one column in): the device path gathers them first.
    const Tensor wide = rand_f32({33, kH + 1}, 6300);
    const Tensor x = wide.slice(1, 1, kH + 1);
    const Routing r = make_routing(33, kK, kE, 0, 6301);
    check_both_paths(fmt::format("moe_experts realdims {} unaligned", dtype_tag(dt)), x.contiguous(), r, s,
                     dt, false);
    const Tensor x_d = wide.to(Device::cuda).slice(1, 1, kH + 1);
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    report_gemm(fmt::format("moe_experts realdims {} unaligned view", dtype_tag(dt)), "[33,256]",
                run_path(MoePath::device, x_d, r_d, s), reference(x.contiguous(), r, s), kTolDevice);
  }
}

// The grouped FP8 tensor-core kernels (device_fp8) at GLM-5.3 widths against the CPU op with their
// arithmetic emulated and against the exact CPU op: ragged row counts, every pair on one expert (1,024 rows
// at T = 128: 128 mma.sync passes of 8; 2,056 at T = 257: wgmma passes of 128), prefill-sized groups (the
// wgmma form from 8 rows per expert), out-of-range ids dropped (adding nothing, counted).
TEST_F(CudaMoe, Fp8TensorCoreGlmShapes) {
  constexpr int64_t kH = 6144, kI = 2048, kE = 256, kK = 8, kSets = 16;
  const ExpertSet s = make_experts(kSets, kE, kH, kI, DType::f8e4m3fn, 9000);
  struct Case {
    int64_t T;
    int kind;  // as make_routing: 0 distinct experts per token, 2 every pair on expert 7, 3 skewed
    bool bad_ids;
  };
  // T = 1,024: 32 rows per expert on average, the wgmma form (tile_rows 128); kind 2 there: 8,192 rows of
  // one expert, 64 passes of 128; kind 3: experts 0-2 with 342 / 341 / 341 rows (passes of 128, 128, 86 /
  // 85), the others ~28.
  const Case cases[] = {{1, 0, false},    {3, 0, false},    {32, 0, false},  {128, 0, false},
                        {128, 2, false},  {257, 0, false},  {257, 2, false}, {1024, 0, false},
                        {1024, 2, false}, {1024, 3, false}, {32, 0, true}};
  for (const Case& c : cases) {
    Routing r = make_routing(c.T, kK, kE, c.kind, 9100 + uint64_t(c.T * 3 + c.kind));
    const Tensor x = rand_f32({c.T, kH}, 9200 + uint64_t(c.T));
    Routing clean{r.ids.clone(), r.weights.clone()};  // the dropped pairs as weight-0 pairs on expert 0
    if (c.bad_ids) {
      r.ids.data<int32_t>()[5] = -1;
      r.ids.data<int32_t>()[70] = int32_t(kE);
      r.ids.data<int32_t>()[255] = 1 << 30;
      for (int64_t i : {5, 70, 255}) {
        clean.ids.data<int32_t>()[i] = 0;
        clean.weights.data<float>()[i] = 0.0f;
      }
    }
    const std::string name =
        fmt::format("moe_experts glm device_fp8 T={} kind={}{}", c.T, c.kind, c.bad_ids ? " bad_ids" : "");
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    int64_t dropped = 0;
    ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
    const Tensor got = run_path(MoePath::device_fp8, x.to(Device::cuda), r_d, s);
    ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
    EXPECT_EQ(dropped, c.bad_ids ? 3 : 0) << name;
    const bool wgmma = moe_fp8_tile_rows(c.T * kK, kE) == 128;
    report_gemm(name + " ~cpu_fp8_emulation", shape_str(x.shape()), got, reference_fp8_emulated(x, clean, s),
                wgmma ? kTolFp8EmulatedGlmWgmma : kTolFp8EmulatedGlm);
    report_gemm(name + " ~exact", shape_str(x.shape()), got, reference(x, clean, s), kTolFp8Exact);
  }
}

// The wgmma form where K is not a multiple of four 128-wide blocks: H = 6,784 (53 K blocks for gate / up)
// and I = 2,432 (19 for down), against the emulation. The rows stay GLM-wide so that the GLM tolerances
// hold. Mean 64 rows per expert (passes of 33-64 and 65-128 rows), 128 (128-row passes, remainders of up to
// 32 rows taken by the pass before them, larger ones in passes of their own), and the skewed routing at T =
// 384 (experts 0-2 exactly one 128-row pass each, the other 13 ~207 rows: a 128-row pass and one of ~79).
TEST_F(CudaMoe, Fp8TensorCoreKBlocksPastWholeRuns) {
  constexpr int64_t kH = 6784, kI = 2432, kE = 16, kK = 8;
  const ExpertSet s = make_experts(8, kE, kH, kI, DType::f8e4m3fn, 9800);
  struct Case {
    int64_t T;
    int kind;
  };
  for (const Case& c : {Case{128, 0}, Case{256, 0}, Case{384, 3}}) {
    ASSERT_EQ(moe_fp8_tile_rows(c.T * kK, kE), 128) << c.T;
    const Routing r = make_routing(c.T, kK, kE, c.kind, 9810 + uint64_t(c.T + c.kind));
    const Tensor x = rand_f32({c.T, kH}, 9820 + uint64_t(c.T));
    const std::string name = fmt::format("moe_experts H=6784 I=2432 device_fp8 T={} kind={}", c.T, c.kind);
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    const Tensor got = run_path(MoePath::device_fp8, x.to(Device::cuda), r_d, s);
    // Against the emulation only: the recipe's distance to the exact product sits at kTolFp8Exact's bound
    // at these widths (4.7e-2 / 5.0e-2 measured in Fp8TensorCoreGlmShapes), a property of FP8, not of the
    // loop this test is for; Fp8TensorCoreGlmShapes keeps that check.
    report_gemm(name + " ~cpu_fp8_emulation", shape_str(x.shape()), got, reference_fp8_emulated(x, r, s),
                kTolFp8EmulatedGlmWgmma);
  }
}

// A group's last pass takes up to KernelOptions::moe_fp8_tail_rows (32) rows past 128, so a remainder of
// 129-160 rows is one pass and its weights stream once: the rows past 128 multiply as a second wgmma (N 16 or
// 32) on the same weight tile, in the same commit group. The sums equal, bit for bit, those of tail_rows 0
// (the same rows in a pass of their own, the first 128 in a plain 128-row pass). GLM-5.3 widths: n tokens
// all on one expert (top-1), n = 129, 144, 145, 160 (tails of 1, 16, 17, 32 rows: N 16, 16, 32, 32), 161
// (33: a pass of its own either way), 288 (a 128-row pass, then 128 + 32); and random top-8 routings of 256
// and 320 tokens over 16 experts (128 / 160 rows an expert on average: many 129-160-row groups). Each fused
// result also against the emulation.
TEST_F(CudaMoe, Fp8WgmmaTailRowsEqualTheirOwnPass) {
  constexpr int64_t kH = 6144, kI = 2048, kE = 16;
  const ExpertSet s = make_experts(8, kE, kH, kI, DType::f8e4m3fn, 9950);
  auto backend_with_tail = [](int tail) {
    KernelOptions o;
    o.moe = MoePath::device_fp8;
    o.moe_fp8_tile_rows = 128;
    o.moe_fp8_tail_rows = tail;
    return make_backend(o);
  };
  const std::shared_ptr<Backend> fused = backend_with_tail(32), apart = backend_with_tail(0);
  struct Case {
    int64_t T, K;
  };
  for (const Case& c : {Case{129, 1}, Case{144, 1}, Case{145, 1}, Case{160, 1}, Case{161, 1}, Case{288, 1},
                        Case{256, 8}, Case{320, 8}}) {
    const Routing r =
        make_routing(c.T, c.K, kE, c.K == 1 ? 2 : 0, 9960 + uint64_t(c.T));  // K 1: all on expert 7
    const Tensor x = rand_f32({c.T, kH}, 9970 + uint64_t(c.T));
    const Tensor x_d = x.to(Device::cuda);
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    const Tensor a = fused->moe_experts(x_d, r_d, s.gpu, nullptr, s.table.get(), nullptr).to(Device::cpu);
    const Tensor b = apart->moe_experts(x_d, r_d, s.gpu, nullptr, s.table.get(), nullptr).to(Device::cpu);
    ASSERT_EQ(a.numel(), b.numel());
    int64_t differ = 0;
    for (int64_t i = 0; i < a.numel(); ++i)
      differ += std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0 ? 1 : 0;
    fmt::print("RESULT op=moe_experts wgmma_tail T={} top-{}: {} of {} outputs differ from tail_rows 0 {}\n",
               c.T, c.K, differ, a.numel(), differ == 0 ? "ok" : "FAIL");
    EXPECT_EQ(differ, 0) << "T=" << c.T << " K=" << c.K;
    report_gemm(fmt::format("moe_experts glm device_fp8 wgmma_tail T={} top-{} ~cpu_fp8_emulation", c.T, c.K),
                shape_str(x.shape()), a, reference_fp8_emulated(x, r, s), kTolFp8EmulatedGlmWgmma);
  }
}

// The input's FP8 copy given (ops.h moe_experts q: a DeepEP FP8 dispatch's codes and scales, quantised on
// the sender by the CPU rule kernels::cpu::fp8_quantize_row128, which quant.cu matches bit for bit:
// CudaFp8Emulation.QuantKernelMatchesCpuRule), with padding rows (Tp > T): device_fp8 reads it instead of
// quantising x and gives its own result bit for bit, at GLM-5.3 and realdims widths, decode and prefill
// sizes; x is the copy's dequantised value, as a receiver holds it.
TEST_F(CudaMoe, Fp8PreQuantisedInputIsBitIdentical) {
  struct Case {
    int64_t H, I, E, K, T;
  };
  for (const Case& c : {Case{6144, 2048, 256, 8, 3}, Case{6144, 2048, 256, 8, 257}, Case{256, 128, 16, 4, 1},
                        Case{256, 128, 16, 4, 33}}) {
    const ExpertSet s = make_experts(std::min<int64_t>(c.E, 16), c.E, c.H, c.I, DType::f8e4m3fn, 9500);
    const Routing r = make_routing(c.T, c.K, c.E, 0, 9600 + uint64_t(c.T));
    const Tensor x = rand_f32({c.T, c.H}, 9700 + uint64_t(c.T));
    const int64_t Tp = c.T + 5, G = c.H / 128;
    Fp8Act q{Tensor::zeros({Tp, c.H}, DType::u8), Tensor::zeros({G, Tp}, DType::f32), c.T};
    for (int64_t t = 0; t < c.T; ++t)
      kernels::cpu::fp8_quantize_row128(x.data<float>() + t * c.H, c.H, q.codes.data_u8() + t * c.H,
                                        q.scales.data<float>() + t, Tp);
    const Tensor xdq = kernels::cpu::fp8_quant_dequant(x);
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    KernelOptions o;
    o.moe = MoePath::device_fp8;
    const std::shared_ptr<Backend> b = make_backend(o);
    const std::shared_ptr<const DerivedExperts> set = b->derive_experts(s.gpu);  // as a model holds it
    const Tensor want =
        b->moe_experts(x.to(Device::cuda), r_d, s.gpu, nullptr, set.get(), nullptr).to(Device::cpu);
    const Fp8Act q_d{q.codes.to(Device::cuda), q.scales.to(Device::cuda), c.T};
    const Tensor got =
        b->moe_experts(xdq.to(Device::cuda), r_d, s.gpu, &q_d, set.get(), nullptr).to(Device::cpu);
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), size_t(want.nbytes())), 0)
        << "H=" << c.H << " T=" << c.T << " diff " << row_l2_rel_error(got, want);
    const Fp8Act bad{q_d.codes, q_d.scales, c.T + 1};
    EXPECT_THROW(b->moe_experts(xdq.to(Device::cuda), r_d, s.gpu, &bad, set.get(), nullptr), Error);
  }
}

// The addend (ops.h moe_experts add: the shared expert's output, added by the combine) equals the same call
// followed by add_inplace bit for bit, on every path, at one token and at many; T = 0 gives an empty result
// and top-0 routing the addend itself. A wrong-shaped addend throws.
TEST_F(CudaMoe, AddendInTheCombineEqualsAddInplace) {
  struct Case {
    MoePath path;
    DType dt;
    int64_t H, I, E, K, T;
  };
  for (const Case& c : {Case{MoePath::device_fp8, DType::f8e4m3fn, 6144, 2048, 32, 8, 1},
                        Case{MoePath::device_fp8, DType::f8e4m3fn, 6144, 2048, 32, 8, 300},
                        Case{MoePath::device, DType::bf16, 256, 128, 16, 4, 33},
                        Case{MoePath::host, DType::bf16, 256, 128, 16, 4, 7},
                        Case{MoePath::device, DType::bf16, 256, 128, 16, 0, 5},
                        Case{MoePath::device, DType::bf16, 256, 128, 16, 4, 0}}) {
    const ExpertSet s = make_experts(std::min<int64_t>(c.E, 16), c.E, c.H, c.I, c.dt, 9800);
    const Routing r = c.K > 0
                          ? make_routing(c.T, c.K, c.E, 0, 9810 + uint64_t(c.T))
                          : Routing{Tensor::empty({c.T, 0}, DType::i32), Tensor::empty({c.T, 0}, DType::f32)};
    const Tensor x = rand_f32({c.T, c.H}, 9820 + uint64_t(c.T)).to(Device::cuda);
    const Tensor add = rand_f32({c.T, c.H}, 9830 + uint64_t(c.T)).to(Device::cuda);
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    KernelOptions o;
    o.moe = c.path;
    const std::shared_ptr<Backend> b = make_backend(o);
    const std::shared_ptr<const DerivedExperts> set = b->derive_experts(s.gpu);
    Tensor want = b->moe_experts(x, r_d, s.gpu, nullptr, set.get(), nullptr);
    b->add_inplace(want, add);
    const Tensor got = b->moe_experts(x, r_d, s.gpu, nullptr, set.get(), &add);
    const Tensor w = want.to(Device::cpu), g = got.to(Device::cpu);
    ASSERT_EQ(w.numel(), g.numel());
    EXPECT_EQ(std::memcmp(g.raw_data(), w.raw_data(), size_t(w.nbytes())), 0)
        << "path " << int(c.path) << " T=" << c.T << " K=" << c.K << " diff " << row_l2_rel_error(g, w);
    if (c.K == 0 && c.T > 0) {
      const Tensor a = add.to(Device::cpu);
      EXPECT_EQ(std::memcmp(g.raw_data(), a.raw_data(), size_t(a.nbytes())), 0);
    }
    const Tensor bad = Tensor::zeros({c.T + 1, c.H}, DType::f32).to(Device::cuda);
    EXPECT_THROW(b->moe_experts(x, r_d, s.gpu, nullptr, set.get(), &bad), Error);
  }
}

// Out-of-range ids: the device path drops those pairs (they add nothing) and counts them; the host path
// throws.
TEST_F(CudaMoe, OutOfRangeIds) {
  constexpr int64_t kH = 256, kI = 128, kE = 16, kK = 4, kT = 9;
  const ExpertSet s = make_experts(kE, kE, kH, kI, DType::bf16, 7000);
  Routing r = make_routing(kT, kK, kE, 0, 7001);
  const Tensor x = rand_f32({kT, kH}, 7002);
  r.ids.data<int32_t>()[1] = -3;
  r.ids.data<int32_t>()[17] = int32_t(kE);
  const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
  int64_t dropped = 0;
  ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
  const Tensor got = run_path(MoePath::device, x.to(Device::cuda), r_d, s);
  ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
  EXPECT_EQ(dropped, 2);
  Routing clean{r.ids.clone(), r.weights.clone()};
  for (int64_t i : {1, 17}) {
    clean.ids.data<int32_t>()[i] = 0;
    clean.weights.data<float>()[i] = 0.0f;
  }
  report_gemm("moe_experts dropped ids", "[9,256]", got, reference(x, clean, s), kTolDevice);
  EXPECT_THROW(moe_on_path(MoePath::host, x.to(Device::cuda), r_d, s.gpu, s.table.get()), Error);
  ASSERT_EQ(moe_take_dropped_pairs(&dropped), cudaSuccess);
}

// Captures moe_experts on a non-blocking stream (OpStreamScope points the ops at it) and replays the graph
// with routings and inputs written into the same device buffers: each replay equals an eager call
// bit for bit, and the CPU op within tolerance.
// FP8 experts run the device_fp8 kernels (asked for, eagerly and in the capture) and are held to the CPU
// emulation of their arithmetic; the others the CUDA-core kernels (the capture asks for host: capture takes
// the device path whatever is asked), held to the exact CPU op.
void capture_and_replay(const std::string& name, int64_t T, int64_t K, int64_t E, int64_t H, int64_t I,
                        int64_t sets, DType dt) {
  const bool fp8 = dt == DType::f8e4m3fn;
  const MoePath eager_path = fp8 ? MoePath::device_fp8 : MoePath::device;
  const ExpertSet s = make_experts(sets, E, H, I, dt, 8000 + uint64_t(H));
  // The uploads above ran on the legacy stream, which a non-blocking stream does not wait for.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  Tensor x_d = Tensor::empty({T, H}, DType::f32, Device::cuda);
  const Routing r_d{Tensor::empty({T, K}, DType::i32, Device::cuda),
                    Tensor::empty({T, K}, DType::f32, Device::cuda)};
  auto upload = [&](const Tensor& x, const Routing& r) {
    ASSERT_EQ(cudaMemcpyAsync(x_d.raw_data(), x.raw_data(), x.nbytes(), cudaMemcpyHostToDevice, st),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemcpyAsync(r_d.ids.raw_data(), r.ids.raw_data(), r.ids.nbytes(), cudaMemcpyHostToDevice, st),
        cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(r_d.weights.raw_data(), r.weights.raw_data(), r.weights.nbytes(),
                              cudaMemcpyHostToDevice, st),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  };
  auto eager = [&] {
    OpStreamScope scope(st);
    Tensor out = moe_on_path(eager_path, x_d, r_d, s.gpu, s.table.get());  // large T: host path if automatic
    Tensor h = Tensor::empty(out.shape(), DType::f32);
    EXPECT_EQ(cudaMemcpyAsync(h.raw_data(), out.raw_data(), out.nbytes(), cudaMemcpyDeviceToHost, st),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    return h;
  };
  // Warm-up: fills the allocator's free lists with this call's sizes (the expert table was derived with the
  // weights, as at model load: a capture cannot upload one).
  const Routing r0 = make_routing(T, K, E, 0, 8100);
  const Tensor x0 = rand_f32({T, H}, 8101);
  upload(x0, r0);
  eager();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Tensor out_g;
  {
    OpStreamScope scope(st);
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    out_g = moe_on_path(fp8 ? MoePath::device_fp8 : MoePath::host, x_d, r_d, s.gpu, s.table.get());
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess) << name << ": capture failed";
  }
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 4; ++round) {
    const int kind = round % 3;  // distinct, repeats, all tokens to one expert
    const Routing r = make_routing(T, K, E, kind, 8200 + uint64_t(round));
    const Tensor x = rand_f32({T, H}, 8300 + uint64_t(round));
    upload(x, r);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    Tensor got = Tensor::empty({T, H}, DType::f32);
    ASSERT_EQ(cudaMemcpyAsync(got.raw_data(), out_g.raw_data(), out_g.nbytes(), cudaMemcpyDeviceToHost, st),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const Tensor want = eager();
    const double diff = row_rel_error(got, want);
    fmt::print("RESULT op=moe_graph {:<30} round={} kind={} replay_vs_eager_max_rel={:.3g} {}\n", name, round,
               kind, diff, diff == 0.0 ? "ok" : "FAIL");
    EXPECT_EQ(diff, 0.0) << name << " round " << round;
    report_gemm(fmt::format("moe_graph {} r{}", name, round), shape_str(x.shape()), got,
                fp8 ? reference_fp8_emulated(x, r, s) : reference(x, r, s),
                fp8 ? kTolFp8Emulated : kTolDevice);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

// The experts' derived table (ops.h DerivedExperts: derive_moe_experts, made at model load) changes no bit:
// every device path on it equals the same call given none (the op then makes one for the call), bf16 and
// FP8 experts at realdims and GLM-5.3 widths, decode and prefill sizes. A table made from other experts is
// refused, and so is a call without one inside a CUDA graph capture (it cannot upload one there); the CPU
// backend derives none.
TEST_F(CudaMoe, DerivedExpertTableChangesNoBit) {
  struct Case {
    int64_t H, I, E, K, T;
    DType dt;
  };
  for (const Case& c :
       {Case{256, 128, 16, 4, 5, DType::bf16}, Case{256, 128, 16, 4, 300, DType::f32},
        Case{256, 128, 16, 4, 64, DType::f8e4m3fn}, Case{6144, 2048, 256, 8, 3, DType::f8e4m3fn},
        Case{6144, 2048, 256, 8, 257, DType::f8e4m3fn}}) {
    const ExpertSet s = make_experts(std::min<int64_t>(c.E, 16), c.E, c.H, c.I, c.dt, 9800);
    ASSERT_NE(s.table, nullptr);
    EXPECT_TRUE(s.table->unusable.empty()) << s.table->unusable;
    EXPECT_EQ(s.table->weights.size(), size_t(6 * c.E));
    EXPECT_EQ(s.table->table.nbytes(), c.E * int64_t(sizeof(MoeExpertWeights)));
    const Routing r = make_routing(c.T, c.K, c.E, 0, 9810 + uint64_t(c.T));
    const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
    const Tensor x_d = rand_f32({c.T, c.H}, 9820 + uint64_t(c.T)).to(Device::cuda);
    for (MoePath path : {MoePath::device, MoePath::device_fp8, MoePath::automatic}) {
      if (path == MoePath::device && c.H > 256 && c.T > 32) continue;  // the CUDA-core kernels: slow there
      const Tensor with = moe_on_path(path, x_d, r_d, s.gpu, s.table.get()).to(Device::cpu);
      const Tensor without = moe_on_path(path, x_d, r_d, s.gpu, nullptr).to(Device::cpu);
      EXPECT_EQ(std::memcmp(with.raw_data(), without.raw_data(), size_t(with.nbytes())), 0)
          << dtype_tag(c.dt) << " H=" << c.H << " T=" << c.T << " path=" << int(path);
    }
  }
  // A table made from other experts (other weights of the same shapes): refused, on every device path.
  const ExpertSet a = make_experts(4, 16, 256, 128, DType::bf16, 9900),
                  b = make_experts(4, 16, 256, 128, DType::bf16, 9950);
  const Routing r = make_routing(5, 4, 16, 0, 9960);
  const Routing r_d{r.ids.to(Device::cuda), r.weights.to(Device::cuda)};
  const Tensor x_d = rand_f32({5, 256}, 9970).to(Device::cuda);
  EXPECT_THROW(moe_on_path(MoePath::device, x_d, r_d, a.gpu, b.table.get()), Error);
  std::vector<MlpRef> fewer(a.gpu.begin(), a.gpu.end() - 1);
  EXPECT_THROW(moe_on_path(MoePath::device, x_d, r_d, fewer, a.table.get()), Error);
  // Inside a capture without a table: refused (nothing uploaded), and the capture ends cleanly.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  moe_on_path(MoePath::device, x_d, r_d, a.gpu, a.table.get());  // warm the allocator outside the capture
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    OpStreamScope scope(st);
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_THROW(moe_on_path(MoePath::device, x_d, r_d, a.gpu, nullptr), Error);
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
  cudaStreamDestroy(st);
  EXPECT_EQ(backend(Device::cpu).derive_experts(a.cpu), nullptr) << "the CPU backends derive none";
}

// A model put on the GPU derives each MoE layer's expert table at load (model::Model::derive_weights:
// MoeWeights::experts_derived), from the experts its forward hands to moe_experts: the tiny built-in
// model's 3 MoE layers and its MTP layer.
TEST_F(CudaMoe, ModelDerivesEachMoeLayersTable) {
  const model::ModelConfig c =
      model::ModelConfig::from_file(dsaserve::testing::repo_dir() / "configs/dsaserve-tiny.json");
  const auto m = runtime::model_on_device(model::make_dummy_model(c, Device::cpu, 3, true), Device::cuda);
  model::ModelWeights w = m->weights();
  int64_t layers = 0;
  model::for_each_moe(w, [&](model::MoeWeights& moe) {
    ++layers;
    ASSERT_NE(moe.experts_derived, nullptr);
    EXPECT_TRUE(moe.experts_derived->table.defined()) << moe.experts_derived->unusable;
    ASSERT_EQ(moe.experts_derived->weights.size(), 6 * moe.experts.size());
    EXPECT_EQ(moe.experts_derived->weights[0], moe.experts[0].gate.weight.raw_data());
    EXPECT_EQ(moe.experts_derived->inter, c.moe_intermediate_size);
    EXPECT_EQ(moe.experts_derived->hidden, c.hidden_size);
  });
  EXPECT_EQ(layers, 4);
}

TEST_F(CudaMoe, GraphCaptureReplaysWithNewRoutings) {
  capture_and_replay("realdims fp8 T=7", 7, 4, 16, 256, 128, 16, DType::f8e4m3fn);
  capture_and_replay("realdims bf16 T=64", 64, 4, 16, 256, 128, 16, DType::bf16);
  // A large T (the host path's range when eager) captured: the device path all the same.
  capture_and_replay("realdims bf16 T=2048", 2048, 4, 16, 256, 128, 16, DType::bf16);
  capture_and_replay("glm fp8 T=8", 8, 8, 256, 6144, 2048, 4, DType::f8e4m3fn);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
