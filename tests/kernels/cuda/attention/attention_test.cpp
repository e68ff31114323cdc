// The sm_90a attention-side kernels (kernels/cuda/attention/attention_kernels.h, indexer/indexer_kernels.h)
// (kernels::backend(Device::cpu)): sparse and dense MLA decode over bf16 and FP8 latent caches, ragged
// batches across page boundaries, and the lightning indexer + top-k up to 131072 keys. Every case prints
// a "RESULT " line (op, shape, error, tolerance). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "gpu_test.h"
#include "indexer_test_util.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace test_util;

struct Err {
  double max_abs = 0, ref_max = 0;
  double rel() const { return ref_max > 0 ? max_abs / ref_max : max_abs; }
};
Err compare(const float* got, const float* want, int64_t n) {
  Err e;
  for (int64_t i = 0; i < n; ++i) {
    e.max_abs = std::max(e.max_abs, double(std::fabs(got[i] - want[i])));
    e.ref_max = std::max(e.ref_max, double(std::fabs(want[i])));
  }
  return e;
}

class CudaMlaDecode : public testing::GpuTest {};

// The latent cache: random f32 rows written through the kernel's store, read back and decoded on the
// host as the CPU reference's f32 cache (and the f32 source itself, for the FP8 error vs full precision).
struct LatentCache {
  Tensor gpu;      // kernel format
  Tensor decoded;  // f32 [slots, 576] CPU: exactly what the kernel reads
  Tensor source;   // f32 [slots, 576] CPU: what was stored
};

LatentCache make_latent(int64_t slots, MlaKvFormat f, Rng& r) {
  LatentCache c;
  c.source = Tensor::empty({slots, kMlaDim}, DType::f32);
  float* s = c.source.data<float>();
  for (int64_t i = 0; i < slots * kMlaDim; ++i) s[i] = r.uniform() * (i % kMlaDim < kMlaLatent ? 1.0f : 2.0f);
  c.gpu = mla_kv_cache_empty(slots, f);
  std::vector<int32_t> ids(static_cast<size_t>(slots));
  std::iota(ids.begin(), ids.end(), 0);
  mla_kv_cache_store(c.gpu, gpu_i32(ids, {slots}), c.source.to(Device::cuda));
  const Tensor raw = c.gpu.to(Device::cpu);
  c.decoded = Tensor::empty({slots, kMlaDim}, DType::f32);
  float* d = c.decoded.data<float>();
  for (int64_t i = 0; i < slots; ++i) {
    if (f == MlaKvFormat::bf16) {
      for (int j = 0; j < kMlaDim; ++j) d[i * kMlaDim + j] = bf16_to_f32(raw.data_u16()[i * kMlaDim + j]);
    } else {
      const uint8_t* row = raw.data_u8() + i * kMlaFp8RowBytes;
      float sc[4];
      std::memcpy(sc, row + kMlaLatent, 16);
      for (int j = 0; j < kMlaLatent; ++j) d[i * kMlaDim + j] = f8e4m3fn_to_f32(row[j]) * sc[j / 128];
      for (int j = 0; j < kMlaRope; ++j) {
        uint16_t h;
        std::memcpy(&h, row + kMlaLatent + 16 + 2 * j, 2);
        d[i * kMlaDim + kMlaLatent + j] = bf16_to_f32(h);
      }
    }
  }
  return c;
}

const char* fmt_name(MlaKvFormat f) { return f == MlaKvFormat::bf16 ? "bf16" : "fp8"; }

// min(topk, len) distinct random positions below len, ascending, then -1 up to topk, into dst[0, topk).
void random_selection(int64_t len, int64_t topk, Rng& r, int32_t* dst) {
  std::vector<int32_t> pos(static_cast<size_t>(len));
  std::iota(pos.begin(), pos.end(), 0);
  for (size_t i = 0; i < pos.size() && int64_t(i) < topk; ++i)
    std::swap(pos[i], pos[i + size_t(r.below(int64_t(pos.size() - i)))]);
  const int64_t k = std::min<int64_t>(topk, int64_t(pos.size()));
  std::sort(pos.begin(), pos.begin() + k);
  for (int64_t j = 0; j < topk; ++j) dst[j] = j < k ? pos[size_t(j)] : -1;
}

// One ragged decode batch (one row per request): GPU vs the CPU op per row; returns the GPU's output.
// `ko`: the kernel choice (KernelOptions::mla_decode; automatic: the selector's default for the shape).
Tensor run_decode_batch(const std::vector<int64_t>& lens, int64_t nh, MlaKvFormat f, int64_t topk,
                        uint64_t seed, const KernelOptions& ko = {}) {
  Rng r(seed);
  const Paging pg = make_paging(lens, r);
  const LatentCache cache = make_latent(pg.num_pages * kPage, f, r);
  const int64_t B = int64_t(lens.size());
  const Tensor q_lat = rand_bf16_values({B, nh, kMlaLatent}, r, 2.0f);
  const Tensor q_rope = rand_bf16_values({B, nh, kMlaRope}, r, 2.0f);
  const double scale = 1.0 / std::sqrt(256.0);
  Tensor sel;
  if (topk > 0) {  // random distinct positions, ascending, -1 padded
    sel = Tensor::empty({B, topk}, DType::i32);
    for (int64_t b = 0; b < B; ++b)
      random_selection(lens[size_t(b)], topk, r, sel.data<int32_t>() + b * topk);
  }
  std::vector<int32_t> len32(lens.begin(), lens.end());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  const Tensor got = mla_decode(q_lat.to(Device::cuda), q_rope.to(Device::cuda), cache.gpu, pg.table_gpu(),
                                kPage, {}, gpu_i32(len32, {B}), max_len,
                                sel.defined() ? sel.to(Device::cuda) : Tensor(), scale, nullptr, ko)
                         .to(Device::cpu);
  const double tol = 1e-2, tol_src = 8e-2;
  for (int64_t b = 0; b < B; ++b) {
    const Tensor sel_b = sel.defined() ? sel.slice(0, b, b + 1) : Tensor();
    const int64_t start = lens[size_t(b)] - 1;
    const Tensor ref = kernels::backend(Device::cpu)
                           .mla_attention_absorbed(q_lat.slice(0, b, b + 1), q_rope.slice(0, b, b + 1),
                                                   PagedSeq{cache.decoded, pg.row_cpu(size_t(b)), kPage},
                                                   start, sel_b, scale);
    const Err e = compare(got.data<float>() + b * nh * kMlaLatent, ref.data<float>(), nh * kMlaLatent);
    std::string extra;
    bool src_ok = true;
    if (f == MlaKvFormat::fp8_e4m3) {
      const Tensor ref_src = kernels::backend(Device::cpu)
                                 .mla_attention_absorbed(q_lat.slice(0, b, b + 1), q_rope.slice(0, b, b + 1),
                                                         PagedSeq{cache.source, pg.row_cpu(size_t(b)), kPage},
                                                         start, sel_b, scale);
      const Err es = compare(got.data<float>() + b * nh * kMlaLatent, ref_src.data<float>(), nh * kMlaLatent);
      extra = " vs_f32_source_rel=" + std::to_string(es.rel()) + " (tol " + std::to_string(tol_src) + ")";
      src_ok = es.rel() <= tol_src;
    }
    std::printf(
        "RESULT mla_decode kernel=%s kv=%s %s heads=%lld ctx=%lld batch=%lld max_abs=%.3g rel=%.3g "
        "tol=%.0e%s %s\n",
        name(select_mla_decode_kernel(ko.mla_decode, nh, B, f == MlaKvFormat::fp8_e4m3)).data(), fmt_name(f),
        topk > 0 ? ("sparse_top" + std::to_string(topk)).c_str() : "dense", (long long)nh,
        (long long)lens[size_t(b)], (long long)B, e.max_abs, e.rel(), tol, extra.c_str(),
        e.rel() <= tol && src_ok ? "ok" : "FAIL");
    EXPECT_LE(e.rel(), tol) << "row " << b << " ctx " << lens[size_t(b)];
    EXPECT_TRUE(src_ok) << "row " << b << extra;
  }
  return got;
}

const std::vector<int64_t> kContexts = {1, 63, 64, 65, 2048, 2049, 8191, 32768};

TEST_F(CudaMlaDecode, SparseBf16RaggedBatch) {
  for (int64_t nh : {64, 16, 8}) run_decode_batch(kContexts, nh, MlaKvFormat::bf16, 2048, 11 + uint64_t(nh));
}
TEST_F(CudaMlaDecode, DenseBf16RaggedBatch) {
  for (int64_t nh : {64, 8}) run_decode_batch(kContexts, nh, MlaKvFormat::bf16, 0, 21 + uint64_t(nh));
}
TEST_F(CudaMlaDecode, SparseFp8RaggedBatch) {
  for (int64_t nh : {64, 16, 8})
    run_decode_batch(kContexts, nh, MlaKvFormat::fp8_e4m3, 2048, 31 + uint64_t(nh));
}
TEST_F(CudaMlaDecode, DenseFp8RaggedBatch) { run_decode_batch(kContexts, 64, MlaKvFormat::fp8_e4m3, 0, 41); }
TEST_F(CudaMlaDecode, SingleRequestManySplits) {  // batch 1: the split-K path with its combine kernel
  run_decode_batch({32768}, 64, MlaKvFormat::bf16, 2048, 51);
  run_decode_batch({131072}, 16, MlaKvFormat::bf16, 2048, 52);
  run_decode_batch({8191}, 8, MlaKvFormat::bf16, 0, 53);
  run_decode_batch({2049}, 128, MlaKvFormat::fp8_e4m3, 0, 54);  // two head groups of 64
}

// A decode kernel whatever the default for the head count.
KernelOptions with_kernel(MlaDecodeKernel k) {
  KernelOptions o;
  o.mla_decode = k;
  return o;
}

// v2 (16 heads a block, both cache formats) at every head count, off its default range too (v5 and v6, the
// defaults above 16 heads, run their own cases in PingPongKernelV5 and PairedBlocksKernelV6).
TEST_F(CudaMlaDecode, V2AllHeadCounts) {
  const KernelOptions o = with_kernel(MlaDecodeKernel::v2);
  for (int64_t nh : {64, 16, 8}) {
    run_decode_batch({1, 63, 65, 2049, 32768}, nh, MlaKvFormat::bf16, 2048, 71 + uint64_t(nh), o);
    run_decode_batch({2, 64, 129, 4096}, nh, MlaKvFormat::fp8_e4m3, 2048, 72 + uint64_t(nh), o);
  }
  run_decode_batch({2049}, 128, MlaKvFormat::fp8_e4m3, 0, 73, o);  // several head groups
  run_decode_batch({1000, 8191}, 8, MlaKvFormat::bf16, 0, 74, o);  // dense
  run_decode_batch({131072}, 16, MlaKvFormat::bf16, 2048, 75, o);  // batch 1: many splits + combine
  run_decode_batch({130}, 24, MlaKvFormat::bf16, 0, 76, o);        // a partial last head group
}

// A decode step captured in a CUDA graph (split combine included, launched as a programmatic dependent)
// replays to exactly the direct launch's output.
void check_graph_replay(MlaDecodeKernel kernel, int64_t nh) {
  int num_sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  Rng r(81 + uint64_t(nh) + uint64_t(kernel));
  const std::vector<int64_t> lens = {2049, 64, 5000};
  const int64_t B = int64_t(lens.size()), topk = 2048;
  const Paging pg = make_paging(lens, r);
  const LatentCache cache = make_latent(pg.num_pages * kPage, MlaKvFormat::bf16, r);
  const Tensor q_lat = rand_bf16_values({B, nh, kMlaLatent}, r, 2.0f).to(Device::cuda);
  const Tensor q_rope = rand_bf16_values({B, nh, kMlaRope}, r, 2.0f).to(Device::cuda);
  std::vector<int32_t> sel(size_t(B * topk)), len32(lens.begin(), lens.end());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < topk; ++j) sel[size_t(b * topk + j)] = int32_t(r.below(lens[size_t(b)] + 8)) - 4;
  const Tensor table = pg.table_gpu(), sel_gpu = gpu_i32(sel, {B, topk}), len_gpu = gpu_i32(len32, {B});
  MlaDecodeParams p{};
  p.q_lat = q_lat.data<float>();
  p.q_rope = q_rope.data<float>();
  p.ql_s0 = nh * kMlaLatent;
  p.ql_s1 = kMlaLatent;
  p.qr_s0 = nh * kMlaRope;
  p.qr_s1 = kMlaRope;
  p.cache = cache.gpu.raw_data();
  p.page_table = table.data<int32_t>();
  p.row_len = len_gpu.data<int32_t>();
  p.sel = sel_gpu.data<int32_t>();
  p.sel_k = p.sel_stride = topk;
  p.rows = B;
  p.heads = nh;
  p.num_seqs = B;
  p.pt_cols = p.pt_stride = pg.max_pages;
  p.page_size = kPage;
  p.num_slots = cache.gpu.size(0);
  p.max_keys = topk;
  p.kernel = kernel;
  p.splits = mla_decode_splits(B, nh, p.max_keys, num_sms, kernel);
  p.scale = 0.0625f;
  p.format = MlaKvFormat::bf16;
  const Tensor out = Tensor::empty({B, nh, kMlaLatent}, DType::f32, Device::cuda);
  const Tensor part = Tensor::empty({B, p.splits, nh, kMlaLatent}, DType::f32, Device::cuda);
  const Tensor lse = Tensor::empty({B, p.splits, nh}, DType::f32, Device::cuda);
  p.out = out.data<float>();
  p.partial_out = part.data<float>();
  p.partial_lse = lse.data<float>();
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(launch_mla_decode(p, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  const Tensor direct = out.to(Device::cpu);
  ASSERT_EQ(cudaMemsetAsync(p.out, 0xff, size_t(B * nh * kMlaLatent) * 4, st), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const cudaError_t le = launch_mla_decode(p, st);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(le, cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  const Tensor replay = out.to(Device::cpu);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  const bool same =
      std::memcmp(direct.data<float>(), replay.data<float>(), size_t(B * nh * kMlaLatent) * 4) == 0;
  const Err e = compare(replay.data<float>(), direct.data<float>(), B * nh * kMlaLatent);
  std::printf("RESULT mla_decode graph replay kernel=%s heads=%lld batch=%lld splits=%d max_abs=%.3g %s\n",
              name(kernel).data(), (long long)nh, (long long)B, p.splits, e.max_abs,
              same ? "ok (bitwise)" : "FAIL");
  EXPECT_TRUE(same) << "kernel " << name(kernel) << " heads " << nh;
}

// v2 here; v5 replays in PingPongKernelV5 (run_wgmma_kernel_cases).
TEST_F(CudaMlaDecode, GraphCaptureMatchesDirectLaunch) {
  for (int64_t nh : {64, 16}) check_graph_replay(MlaDecodeKernel::v2, nh);
}

// Runs `body` in a fresh process (gtest's threadsafe death-test style re-executes this binary for the
// current test alone), so that an experimental kernel which faults cannot poison the CUDA context of the
// tests after it; fails when the body had a failure or did not exit normally.
template <class F>
void run_isolated(F&& body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        body();
        std::fflush(stdout);
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// Kernel v5 (64 heads a block, Q K^T and P V by wgmma from swizzled shared memory), all head counts and
// formats, and its graph replay.
void run_wgmma_kernel_cases(MlaDecodeKernel kernel) {
  const KernelOptions o = with_kernel(kernel);
  for (int64_t nh : {64, 16}) {
    run_decode_batch({1, 63, 65, 2049, 32768}, nh, MlaKvFormat::bf16, 2048, 91 + uint64_t(nh), o);
    run_decode_batch({2, 64, 129, 4096}, nh, MlaKvFormat::fp8_e4m3, 2048, 92 + uint64_t(nh), o);
  }
  run_decode_batch({2049}, 128, MlaKvFormat::fp8_e4m3, 0, 93, o);   // two head groups
  run_decode_batch({1000, 8191}, 64, MlaKvFormat::bf16, 0, 94, o);  // dense
  run_decode_batch({131072}, 64, MlaKvFormat::bf16, 2048, 95, o);   // batch 1: many splits + combine
  run_decode_batch({130}, 24, MlaKvFormat::bf16, 0, 96, o);         // a partial head group
  // Dense rows of 1, 2, 3, 6 key tiles (v5 hands tiles between its warpgroups: odd and tiny counts).
  run_decode_batch({1, 33, 95, 161}, 64, MlaKvFormat::bf16, 0, 97, o);
  for (int64_t nh : {64, 16}) check_graph_replay(kernel, nh);
  if (kernel == MlaDecodeKernel::v5) {  // both orders, each on dense and sparse rows, both formats
    for (MlaV5Order order : {MlaV5Order::early, MlaV5Order::late}) {
      KernelOptions ord = o;
      ord.mla_v5_order = order;
      for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
        run_decode_batch({2049, 64, 5000}, 64, f, 2048, 98, ord);
        run_decode_batch({1000, 8191, 33}, 64, f, 0, 99, ord);
      }
    }
    // FP8 dense rows of 1, 1, 2, 3, 6 key tiles and a partial head group (the producer warpgroup's edges).
    run_decode_batch({1, 17, 33, 95, 161}, 64, MlaKvFormat::fp8_e4m3, 0, 100, o);
    run_decode_batch({130, 7}, 24, MlaKvFormat::fp8_e4m3, 0, 101, o);
    run_decode_batch({131072}, 64, MlaKvFormat::fp8_e4m3, 2048, 102, o);  // batch 1: many splits
  }
}
// v5: the two warpgroups take turns on whole key tiles (bf16; an FP8 cache adds a producer warpgroup that
// dequantises: sm90_mla_decode_v5_fp8.cu).
TEST_F(CudaMlaDecode, PingPongKernelV5) {
  run_isolated([] { run_wgmma_kernel_cases(MlaDecodeKernel::v5); });
}
// v6: 64-key blocks taken in pairs by the two warpgroups, fed by a producer warpgroup that copies bf16 rows
// or dequantises FP8 ones: v5's cases in both formats (odd block counts leave an empty last block, splits,
// graphs), plus DeepSeek-V3.2's 128 heads sparse and a partial second head group dense over bf16.
TEST_F(CudaMlaDecode, PairedBlocksKernelV6) {
  run_isolated([] {
    run_wgmma_kernel_cases(MlaDecodeKernel::v6);
    const KernelOptions o = with_kernel(MlaDecodeKernel::v6);
    run_decode_batch({2049, 64, 5000, 1}, 128, MlaKvFormat::bf16, 2048, 120, o);
    run_decode_batch({130, 7, 4097}, 96, MlaKvFormat::bf16, 0, 121, o);
  });
}

// KernelOptions::mla_head_groups_adjacent moves v5's blocks, not its arithmetic: the same output bits as
// the head groups on grid.y (and both within the CPU op's tolerance), at DeepSeek-V3.2's 128 heads and a
// partial second group (96), sparse and dense, both cache formats, with key splits (four rows).
TEST_F(CudaMlaDecode, HeadGroupsAdjacentAreBitIdentical) {
  run_isolated([] {
    KernelOptions apart = with_kernel(MlaDecodeKernel::v5), adjacent = apart;
    apart.mla_head_groups_adjacent = false;
    adjacent.mla_head_groups_adjacent = true;
    const std::vector<int64_t> lens = {2049, 1, 64, 5000};
    for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3})
      for (int64_t nh : {128, 96})
        for (int64_t topk : {2048, 0}) {
          const uint64_t seed = 110 + uint64_t(nh) + uint64_t(topk);
          const Tensor a = run_decode_batch(lens, nh, f, topk, seed, apart);
          const Tensor b = run_decode_batch(lens, nh, f, topk, seed, adjacent);
          ASSERT_EQ(a.numel(), b.numel());
          EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * sizeof(float)), 0)
              << fmt_name(f) << " heads " << nh << " topk " << topk;
        }
  });
}

// The ops.h contract (T rows of one request at start_pos + t, causal, with a selection holding -1).
TEST_F(CudaMlaDecode, OpsContractPrefillRows) {
  Rng r(61);
  const int64_t T = 5, start = 3000, nh = 16, n = start + T;
  const Paging pg = make_paging({n}, r);
  const LatentCache cache = make_latent(pg.num_pages * kPage, MlaKvFormat::bf16, r);
  const Tensor q_lat = rand_bf16_values({T, nh, kMlaLatent}, r, 2.0f);
  const Tensor q_rope = rand_bf16_values({T, nh, kMlaRope}, r, 2.0f);
  Tensor sel = Tensor::empty({T, 300}, DType::i32);
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> s;
    while (int64_t(s.size()) < 250) s.insert(int32_t(r.below(start + t + 1)));
    std::vector<int32_t> v(s.begin(), s.end());
    v.resize(300, -1);
    std::copy(v.begin(), v.end(), sel.data<int32_t>() + t * 300);
  }
  for (bool sparse : {true, false}) {
    const Tensor s = sparse ? sel : Tensor();
    const Tensor got = mla_attention_absorbed_sm90(q_lat.to(Device::cuda), q_rope.to(Device::cuda),
                                                   PagedSeq{cache.gpu, pg.row_cpu(0).to(Device::cuda), kPage},
                                                   start, sparse ? s.to(Device::cuda) : Tensor(), 0.0625)
                           .to(Device::cpu);
    const Tensor ref =
        kernels::backend(Device::cpu)
            .mla_attention_absorbed(q_lat, q_rope, PagedSeq{cache.decoded, pg.row_cpu(0), kPage}, start, s,
                                    0.0625);
    const Err e = compare(got.data<float>(), ref.data<float>(), T * nh * kMlaLatent);
    std::printf(
        "RESULT mla_attention_absorbed_sm90 rows=%lld start=%lld heads=%lld %s max_abs=%.3g rel=%.3g "
        "tol=1e-02 %s\n",
        (long long)T, (long long)start, (long long)nh, sparse ? "sparse" : "dense", e.max_abs, e.rel(),
        e.rel() <= 1e-2 ? "ok" : "FAIL");
    EXPECT_LE(e.rel(), 1e-2);
  }
}

// Prefill-sized rows over an FP8 cache run v6 (v5 when asked for) on a bf16 copy of the sequences' rows
// (select_mla_fp8_bf16_copy): two sequences' chunks of rows, each row its own visible length and top-1024
// selection, against the CPU op per row and against v2 on the FP8 rows (forced: the direct path).
TEST_F(CudaMlaDecode, Fp8PrefillRowsThroughTheBf16Copy) {
  Rng r(67);
  const std::vector<int64_t> lens = {3000, 1500};
  const int64_t nh = 64, per = 48, R = per * 2, topk = 1024;
  const Paging pg = make_paging(lens, r);
  const LatentCache cache = make_latent(pg.num_pages * kPage, MlaKvFormat::fp8_e4m3, r);
  const Tensor q_lat = rand_bf16_values({R, nh, kMlaLatent}, r, 2.0f);
  const Tensor q_rope = rand_bf16_values({R, nh, kMlaRope}, r, 2.0f);
  std::vector<int32_t> seq(static_cast<size_t>(R)), len(static_cast<size_t>(R));
  Tensor sel = Tensor::empty({R, topk}, DType::i32);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t b = i / per;
    seq[size_t(i)] = int32_t(b);
    len[size_t(i)] = int32_t(lens[size_t(b)] - per + 1 + i % per);
    std::set<int32_t> chosen;
    while (int64_t(chosen.size()) < topk - 24) chosen.insert(int32_t(r.below(len[size_t(i)])));
    std::vector<int32_t> v(chosen.begin(), chosen.end());
    v.resize(size_t(topk), -1);
    std::copy(v.begin(), v.end(), sel.data<int32_t>() + i * topk);
  }
  const int64_t max_len = lens[0], seq_pages = (max_len + kPage - 1) / kPage;
  ASSERT_TRUE(select_mla_fp8_bf16_copy(MlaDecodeKernel::automatic, nh, R, 2 * seq_pages * kPage, topk));
  auto run = [&](MlaDecodeKernel k) {
    KernelOptions ko;
    ko.mla_decode = k;
    return mla_decode(q_lat.to(Device::cuda), q_rope.to(Device::cuda), cache.gpu, pg.table_gpu(), kPage,
                      gpu_i32(seq, {R}), gpu_i32(len, {R}), max_len, sel.to(Device::cuda), 0.0625, nullptr,
                      ko)
        .to(Device::cpu);
  };
  const Tensor copy = run(MlaDecodeKernel::automatic), direct = run(MlaDecodeKernel::v2);
  const Tensor copy5 = run(MlaDecodeKernel::v5);  // v5 (asked for) on the same copy
  Err worst, vs_direct, worst5;
  for (int64_t i = 0; i < R; ++i) {
    const size_t b = size_t(seq[size_t(i)]);
    const Tensor ref = kernels::backend(Device::cpu)
                           .mla_attention_absorbed(q_lat.slice(0, i, i + 1), q_rope.slice(0, i, i + 1),
                                                   PagedSeq{cache.decoded, pg.row_cpu(b), kPage},
                                                   len[size_t(i)] - 1, sel.slice(0, i, i + 1), 0.0625);
    const Err e = compare(copy.data<float>() + i * nh * kMlaLatent, ref.data<float>(), nh * kMlaLatent);
    const Err d = compare(copy.data<float>() + i * nh * kMlaLatent,
                          direct.data<float>() + i * nh * kMlaLatent, nh * kMlaLatent);
    const Err e5 = compare(copy5.data<float>() + i * nh * kMlaLatent, ref.data<float>(), nh * kMlaLatent);
    if (e.rel() > worst.rel()) worst = e;
    if (d.rel() > vs_direct.rel()) vs_direct = d;
    if (e5.rel() > worst5.rel()) worst5 = e5;
  }
  std::printf(
      "RESULT mla_decode fp8 prefill rows via bf16 copy (v6) rows=%lld heads=%lld top%lld rel=%.3g "
      "(tol 1e-02) vs v2 direct rel=%.3g (tol 1e-02); v5 on the copy rel=%.3g (tol 1e-02) %s\n",
      (long long)R, (long long)nh, (long long)topk, worst.rel(), vs_direct.rel(), worst5.rel(),
      worst.rel() <= 1e-2 && vs_direct.rel() <= 1e-2 && worst5.rel() <= 1e-2 ? "ok" : "FAIL");
  EXPECT_LE(worst.rel(), 1e-2);
  EXPECT_LE(vs_direct.rel(), 1e-2);
  EXPECT_LE(worst5.rel(), 1e-2);
}

// A speculative verify step: each request contributes 1-6 query rows at consecutive positions (row t of q
// sees len - q + 1 + t keys), each row with its own selection list of width 2,048 (a random 2,048 of the
// 2,100-key request's keys; all keys, -1 padded, for the shorter ones), across page boundaries; every head
// count one rank holds under TP (8, 16, 32, 64) and DeepSeek-V3.2's 128, both cache formats, through the
// kernel choice `ko` (automatic: what the verify step runs), against the CPU op per row.
void run_verify_rows(const KernelOptions& ko) {
  const std::vector<int64_t> lens = {300, 700, 2100, 1500};  // the last row's visible keys
  const std::vector<int64_t> qs = {1, 2, 3, 6};              // query rows per request
  const int64_t topk = 2048;
  for (MlaKvFormat f : {MlaKvFormat::fp8_e4m3, MlaKvFormat::bf16}) {
    for (int64_t nh : {8, 16, 32, 64, 128}) {
      if (f == MlaKvFormat::bf16 && nh != 32 && nh != 128) continue;
      Rng r(200 + uint64_t(nh) + (f == MlaKvFormat::bf16 ? 1000 : 0));
      const Paging pg = make_paging(lens, r);
      const LatentCache cache = make_latent(pg.num_pages * kPage, f, r);
      std::vector<int32_t> seq, len;
      for (size_t b = 0; b < lens.size(); ++b)
        for (int64_t t = 0; t < qs[b]; ++t) {
          seq.push_back(int32_t(b));
          len.push_back(int32_t(lens[b] - qs[b] + 1 + t));
        }
      const int64_t R = int64_t(seq.size());
      const Tensor q_lat = rand_bf16_values({R, nh, kMlaLatent}, r, 2.0f);
      const Tensor q_rope = rand_bf16_values({R, nh, kMlaRope}, r, 2.0f);
      Tensor sel = Tensor::empty({R, topk}, DType::i32);
      for (int64_t i = 0; i < R; ++i)
        random_selection(len[size_t(i)], topk, r, sel.data<int32_t>() + i * topk);
      const int64_t max_len = *std::max_element(lens.begin(), lens.end());
      const Tensor got =
          mla_decode(q_lat.to(Device::cuda), q_rope.to(Device::cuda), cache.gpu, pg.table_gpu(), kPage,
                     gpu_i32(seq, {R}), gpu_i32(len, {R}), max_len, sel.to(Device::cuda), 0.0625, nullptr, ko)
              .to(Device::cpu);
      Err worst;
      for (int64_t i = 0; i < R; ++i) {
        const Tensor ref =
            kernels::backend(Device::cpu)
                .mla_attention_absorbed(q_lat.slice(0, i, i + 1), q_rope.slice(0, i, i + 1),
                                        PagedSeq{cache.decoded, pg.row_cpu(size_t(seq[size_t(i)])), kPage},
                                        len[size_t(i)] - 1, sel.slice(0, i, i + 1), 0.0625);
        const Err e = compare(got.data<float>() + i * nh * kMlaLatent, ref.data<float>(), nh * kMlaLatent);
        if (e.rel() > worst.rel()) worst = e;
        EXPECT_LE(e.rel(), 1e-2) << "row " << i << " heads " << nh << " " << fmt_name(f);
      }
      std::printf(
          "RESULT mla_decode verify rows kernel=%s kv=%s heads=%lld rows=%lld (1-6 a request) rel=%.3g "
          "tol=1e-02 %s\n",
          name(select_mla_decode_kernel(ko.mla_decode, nh, R, f == MlaKvFormat::fp8_e4m3)).data(),
          fmt_name(f), (long long)nh, (long long)R, worst.rel(), worst.rel() <= 1e-2 ? "ok" : "FAIL");
    }
  }
}
TEST_F(CudaMlaDecode, VerifyRowsOneToSixTokensPerRequest) { run_verify_rows({}); }
// The same rows through v6 (all five head counts; 8-32 heads padded to its 64-head blocks).
TEST_F(CudaMlaDecode, VerifyRowsThroughV6) {
  run_isolated([] { run_verify_rows(with_kernel(MlaDecodeKernel::v6)); });
}

// The kernel choice is host code (no device needed; its rule: tests/kernels/kernel_options_test.cpp). The
// split count follows the kernel the launch will run, and a launch's params select through the same rule.
TEST(MlaDecodeKernelChoice, SplitsFollowTheSelectedKernel) {
  using K = MlaDecodeKernel;
  for (int64_t rows : {1, 2})
    EXPECT_EQ(mla_decode_splits(rows, 64, 2048, 132), mla_decode_splits(rows, 64, 2048, 132, K::v2)) << rows;
  EXPECT_EQ(mla_decode_splits(4, 64, 2048, 132), mla_decode_splits(4, 64, 2048, 132, K::v6));
  EXPECT_EQ(mla_decode_splits(4, 16, 2048, 132), mla_decode_splits(4, 16, 2048, 132, K::v2));
  // v2's blocks are 16 heads x 64-key tiles, v5's 64 x 32: 64 keys of one 16-head row are one v2 tile (no
  // split) but two tiles of v5's (a split each fills more SMs).
  EXPECT_NE(mla_decode_splits(1, 16, 64, 132, K::v2), mla_decode_splits(1, 16, 64, 132, K::v5));
  MlaDecodeParams p{};
  p.rows = 128;
  p.heads = 64;
  p.format = MlaKvFormat::bf16;
  EXPECT_EQ(mla_decode_kernel(p), K::v6);
  p.format = MlaKvFormat::fp8_e4m3;  // FP8: v5 (v6's register-fed producer is slower there)
  EXPECT_EQ(mla_decode_kernel(p), K::v5);
  p.kernel = K::v2;
  EXPECT_EQ(mla_decode_kernel(p), K::v2);
  p.rows = 2;
  p.kernel = K::automatic;
  EXPECT_EQ(mla_decode_kernel(p), K::v2);
}

TEST_F(CudaMlaDecode, RejectsBadInput) {
  const Tensor q = Tensor::zeros({1, 8, kMlaLatent}, DType::f32, Device::cuda);
  const Tensor qr = Tensor::zeros({1, 8, kMlaRope}, DType::f32, Device::cuda);
  const Tensor bad_cache = Tensor::zeros({64, 512}, DType::bf16, Device::cuda);
  const Tensor pt = gpu_i32({0}, {1, 1});
  const Tensor len = gpu_i32({1}, {1});
  EXPECT_THROW(mla_decode(q, qr, bad_cache, pt, kPage, {}, len, 1, {}, 1.0), Error);
  const Tensor cache = mla_kv_cache_empty(64, MlaKvFormat::bf16);
  EXPECT_THROW(mla_decode(q, qr, cache, pt, kPage, {}, len, 65, {}, 1.0), Error);  // pages too few
  EXPECT_THROW(mla_decode(q.slice(2, 0, 256), qr, cache, pt, kPage, {}, len, 1, {}, 1.0), Error);
}

// Selection entries are device data: one outside its row (negative, at or past the row's length, at the i32
// extremes) is skipped exactly as a -1 is -- the same output bits -- and never becomes an address. Every
// kernel checks an entry where it looks its page up (RowKeys::slot, page_entry), after loading it unchecked.
TEST_F(CudaMlaDecode, OutOfRangeEntriesAreSkippedLikeMinusOne) {
  const std::vector<int64_t> lens = {300, 2049, 64, 5000};
  const int64_t B = int64_t(lens.size()), nh = 64, topk = 2048;
  for (MlaDecodeKernel k : {MlaDecodeKernel::v2, MlaDecodeKernel::v5, MlaDecodeKernel::v6})
    for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
      Rng r(300 + uint64_t(k) * 2 + (f == MlaKvFormat::bf16 ? 0 : 1));
      const Paging pg = make_paging(lens, r);
      const LatentCache cache = make_latent(pg.num_pages * kPage, f, r);
      const Tensor q_lat = rand_bf16_values({B, nh, kMlaLatent}, r, 2.0f).to(Device::cuda);
      const Tensor q_rope = rand_bf16_values({B, nh, kMlaRope}, r, 2.0f).to(Device::cuda);
      Tensor hostile = Tensor::empty({B, topk}, DType::i32), skipped = Tensor::empty({B, topk}, DType::i32);
      for (int64_t b = 0; b < B; ++b) {
        int32_t* h = hostile.data<int32_t>() + b * topk;
        int32_t* s = skipped.data<int32_t>() + b * topk;
        random_selection(lens[size_t(b)], topk, r, h);
        const int32_t len = int32_t(lens[size_t(b)]);
        const int32_t bad[] = {-5, len, len + 1000, 0x7fffffff, int32_t(0x80000000u)};
        for (int64_t j = 0; j < topk; ++j) {
          if (j % 7 == 3) h[j] = bad[(j / 7) % 5];
          s[j] = h[j] >= 0 && h[j] < len ? h[j] : -1;
        }
      }
      std::vector<int32_t> len32(lens.begin(), lens.end());
      auto run = [&](const Tensor& sel) {
        return mla_decode(q_lat, q_rope, cache.gpu, pg.table_gpu(), kPage, {}, gpu_i32(len32, {B}), 5000,
                          sel.to(Device::cuda), 1.0 / 16.0, nullptr, with_kernel(k))
            .to(Device::cpu);
      };
      const Tensor a = run(hostile), b = run(skipped);
      ASSERT_EQ(a.numel(), b.numel());
      EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * sizeof(float)), 0)
          << name(k) << " " << fmt_name(f);
    }
}

class CudaIndexerTopk : public testing::GpuTest {};

void run_indexer_batch(const std::vector<int64_t>& lens, int64_t ih, uint64_t seed, bool ties) {
  Rng r(seed);
  const Paging pg = make_paging(lens, r);
  const int64_t slots = pg.num_pages * kPage, B = int64_t(lens.size()), topk = 2048;
  // Keys bf16; with `ties`, only 97 distinct key rows (many exactly equal scores).
  Tensor keys = rand_bf16_values({slots, kIndexerDim}, r, 1.0f);
  if (ties) {
    for (size_t b = 0; b < lens.size(); ++b)
      for (int64_t s = 0; s < lens[b]; ++s)
        std::copy_n(keys.data<float>() + (s % 97) * kIndexerDim, kIndexerDim,
                    keys.data<float>() + pg.slot(b, s) * kIndexerDim);
  }
  Tensor keys_bf16 = Tensor::empty({slots, kIndexerDim}, DType::bf16);
  for (int64_t i = 0; i < slots * kIndexerDim; ++i)
    keys_bf16.data_u16()[i] = f32_to_bf16(keys.data<float>()[i]);
  const Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  std::vector<int32_t> len32(lens.begin(), lens.end());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  // Dense scores ([B, max_len]), and packed (the host passes the lengths; offsets computed on the device).
  const Tensor got =
      indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda), keys_bf16.to(Device::cuda), pg.table_gpu(),
                        kPage, {}, gpu_i32(len32, {B}), max_len, topk, scale, ws)
          .to(Device::cpu);
  const Tensor got_packed =
      indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda), keys_bf16.to(Device::cuda), pg.table_gpu(),
                        kPage, {}, gpu_i32(len32, {B}), max_len, topk, scale, ws, nullptr, len32)
          .to(Device::cpu);
  const int64_t out_k = std::min(topk, max_len);
  ASSERT_EQ(got.size(1), out_k);
  ASSERT_EQ(got_packed.shape(), got.shape());
  const bool same_packed =
      std::equal(got.data<int32_t>(), got.data<int32_t>() + B * out_k, got_packed.data<int32_t>());
  std::printf("RESULT indexer_topk packed scores == dense scores batch=%lld %s\n", (long long)B,
              same_packed ? "ok" : "FAIL");
  EXPECT_TRUE(same_packed) << "packed and dense score layouts select differently";
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[size_t(b)];
    const Tensor ref =
        kernels::backend(Device::cpu)
            .indexer_topk(q.slice(0, b, b + 1), w.slice(0, b, b + 1),
                          PagedSeq{keys, pg.row_cpu(size_t(b)), kPage}, n - 1, topk, scale, ws);
    std::vector<int32_t> want(static_cast<size_t>(out_k), -1);
    std::copy_n(ref.data<int32_t>(), ref.size(1), want.begin());
    double gap = 0;
    auto key = [&](int64_t s) { return keys.data<float>() + pg.slot(size_t(b), s) * kIndexerDim; };
    const int64_t diff = check_selection(got.data<int32_t>() + b * out_k, want.data(), out_k, n,
                                         q.slice(0, b, b + 1).contiguous(), w.slice(0, b, b + 1).contiguous(),
                                         0, key, scale, ws, &gap);
    const bool ok = diff == 0 || (diff > 0 && gap <= 1e-5);
    std::printf(
        "RESULT indexer_topk heads=%lld ctx=%lld batch=%lld top=%lld%s differing=%lld worst_rel_gap=%.2g "
        "tol=1e-05 %s\n",
        (long long)ih, (long long)n, (long long)B, (long long)topk, ties ? " ties" : "", (long long)diff, gap,
        ok ? "ok" : "FAIL");
    EXPECT_TRUE(ok) << "row " << b << " ctx " << n << " differing " << diff << " gap " << gap;
  }
}

TEST_F(CudaIndexerTopk, RaggedDecodeBatchTo131072) {
  run_indexer_batch({1, 63, 64, 65, 2048, 2049, 8191, 32768, 131072}, 32, 71, false);
}
TEST_F(CudaIndexerTopk, SixtyFourHeads) { run_indexer_batch({2049, 8191, 32768}, 64, 72, false); }
TEST_F(CudaIndexerTopk, ExactTiesBreakTowardLowerPositions) {
  run_indexer_batch({4000, 20000}, 32, 73, true);
}

TEST_F(CudaIndexerTopk, OpsContractPrefillRows) {
  Rng r(81);
  const int64_t T = 4, start = 3000, n = start + T, ih = 32;
  const Paging pg = make_paging({n}, r);
  const Tensor keys = rand_bf16_values({pg.num_pages * kPage, kIndexerDim}, r, 1.0f);
  const Tensor keys_bf16 = bf16_copy(keys);
  const Tensor q = rand_bf16_values({T, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({T, ih}, r, 1.0f);
  const Tensor got =
      indexer_topk_sm90(q.to(Device::cuda), w.to(Device::cuda),
                        PagedSeq{keys_bf16.to(Device::cuda), pg.row_cpu(0).to(Device::cuda), kPage}, start,
                        2048, 0.088, 0.17)
          .to(Device::cpu);
  const Tensor ref = kernels::backend(Device::cpu)
                         .indexer_topk(q, w, PagedSeq{keys, pg.row_cpu(0), kPage}, start, 2048, 0.088, 0.17);
  ASSERT_EQ(got.shape(), ref.shape());
  for (int64_t t = 0; t < T; ++t) {
    double gap = 0;
    auto key = [&](int64_t s) { return keys.data<float>() + pg.slot(0, s) * kIndexerDim; };
    const int64_t diff = check_selection(got.data<int32_t>() + t * 2048, ref.data<int32_t>() + t * 2048, 2048,
                                         start + t + 1, q, w, t, key, 0.088, 0.17, &gap);
    std::printf("RESULT indexer_topk_sm90 row=%lld ctx=%lld differing=%lld worst_rel_gap=%.2g %s\n",
                (long long)t, (long long)(start + t + 1), (long long)diff, gap,
                diff == 0 || (diff > 0 && gap <= 1e-5) ? "ok" : "FAIL");
    EXPECT_TRUE(diff == 0 || (diff > 0 && gap <= 1e-5));
  }
}

// More rows than grid y allows (65,535): a batched prefill of 32 requests x 2048 tokens passes 65,536
// rows to one indexer call. Every row reads the same 200-key sequence with its own visible length; a
// sample of rows is checked against the CPU operator. The host passes the lengths, so the scores are
// packed (the device computes the offsets of the 66,000 rows).
TEST_F(CudaIndexerTopk, MoreRowsThanGridYLimit) {
  Rng r(97);
  const int64_t R = 66000, n = 200, ih = 32, topk = 64;
  const Paging pg = make_paging({n}, r);
  const Tensor keys = rand_bf16_values({pg.num_pages * kPage, kIndexerDim}, r, 1.0f);
  const Tensor keys_bf16 = bf16_copy(keys);
  const Tensor q = rand_bf16_values({R, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({R, ih}, r, 1.0f);
  std::vector<int32_t> seq(static_cast<size_t>(R), 0), len(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < R; ++i) len[size_t(i)] = int32_t(1 + (i * 7) % n);  // some rows <= topk, most above
  const Tensor got =
      indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda), keys_bf16.to(Device::cuda), pg.table_gpu(),
                        kPage, gpu_i32(seq, {R}), gpu_i32(len, {R}), n, topk, 0.088, 0.17, nullptr, len)
          .to(Device::cpu);
  ASSERT_EQ(got.shape(), (Shape{R, topk}));
  int64_t checked = 0, bad = 0;
  for (int64_t i = 0; i < R; i += 997) {
    const int64_t vis = len[size_t(i)];
    const Tensor qi = q.slice(0, i, i + 1), wi = w.slice(0, i, i + 1);
    const Tensor ref = kernels::backend(Device::cpu)
                           .indexer_topk(qi.contiguous(), wi.contiguous(),
                                         PagedSeq{keys, pg.row_cpu(0), kPage}, vis - 1, topk, 0.088, 0.17);
    auto key = [&](int64_t s) { return keys.data<float>() + pg.slot(0, s) * kIndexerDim; };
    double gap = 0;
    std::vector<int32_t> want(size_t(topk), -1);
    for (int64_t j = 0; j < ref.size(1); ++j) want[size_t(j)] = ref.data<int32_t>()[j];
    const int64_t diff = check_selection(got.data<int32_t>() + i * topk, want.data(), topk, vis, qi, wi, 0,
                                         key, 0.088, 0.17, &gap);
    bad += diff == 0 || (diff > 0 && gap <= 1e-5) ? 0 : 1;
    ++checked;
  }
  std::printf("RESULT indexer_topk_rows rows=%lld (> 65535) checked=%lld bad=%lld %s\n", (long long)R,
              (long long)checked, (long long)bad, bad == 0 ? "ok" : "FAIL");
  EXPECT_EQ(bad, 0);
}

// The batched ops of ops.h (PagedRows: one launch for many requests) on the GPU vs the CPU backend on
// ragged rows at real shapes: prefill chunks (rows of one request at consecutive positions) and decode
// rows of requests above and below index_topk, over one shuffled pool; bf16 keys, bf16 and FP8 latents.
TEST_F(CudaIndexerTopk, BatchedRowsOpsMatchCpu) {
  install_backend();  // the ops.h entry points dispatch to the registered CUDA backend
  Rng r(91);
  const int64_t ih = 32, nh = 64, topk = 2048;
  const std::vector<std::pair<int64_t, int64_t>> reqs = {
      {3000, 4}, {1500, 1}, {9000, 1}, {100, 3}, {5000, 2}};
  std::vector<int64_t> lens;
  std::vector<int32_t> seq, len;
  int64_t max_len = 0;
  for (size_t b = 0; b < reqs.size(); ++b) {
    lens.push_back(reqs[b].first + reqs[b].second);
    max_len = std::max(max_len, lens.back());
    for (int64_t t = 0; t < reqs[b].second; ++t) {
      seq.push_back(int32_t(b));
      len.push_back(int32_t(reqs[b].first + t + 1));
    }
  }
  const int64_t R = int64_t(seq.size());
  const Paging pg = make_paging(lens, r);
  Tensor table_cpu = Tensor::empty({int64_t(lens.size()), pg.max_pages}, DType::i32);
  std::copy(pg.pt.begin(), pg.pt.end(), table_cpu.data<int32_t>());
  const Tensor table_gpu = pg.table_gpu();
  Tensor seq_cpu = Tensor::empty({R}, DType::i32), len_cpu = Tensor::empty({R}, DType::i32);
  std::copy(seq.begin(), seq.end(), seq_cpu.data<int32_t>());
  std::copy(len.begin(), len.end(), len_cpu.data<int32_t>());
  const Tensor seq_gpu = seq_cpu.to(Device::cuda), len_gpu = len_cpu.to(Device::cuda);

  // Indexer: bf16 keys on the GPU, the same values in f32 on the CPU.
  const Tensor keys = rand_bf16_values({pg.num_pages * kPage, kIndexerDim}, r, 1.0f);
  const Tensor keys_bf16 = bf16_copy(keys);
  const Tensor q = rand_bf16_values({R, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({R, ih}, r, 1.0f);
  const Tensor got_sel = kernels::indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda),
                                                    PagedRows{keys_bf16.to(Device::cuda), table_gpu, kPage,
                                                              seq_gpu, len_gpu, seq, len, max_len},
                                                    topk, 0.088, 0.17)
                             .to(Device::cpu);
  const Tensor ref_sel = kernels::indexer_topk_rows(
      q, w, PagedRows{keys, table_cpu, kPage, seq_cpu, len_cpu, seq, len, max_len}, topk, 0.088, 0.17);
  ASSERT_EQ(got_sel.shape(), ref_sel.shape());
  ASSERT_EQ(got_sel.size(1), topk);
  for (int64_t i = 0; i < R; ++i) {
    double gap = 0;
    const size_t b = size_t(seq[size_t(i)]);
    auto key = [&](int64_t s) { return keys.data<float>() + pg.slot(b, s) * kIndexerDim; };
    const int64_t diff =
        check_selection(got_sel.data<int32_t>() + i * topk, ref_sel.data<int32_t>() + i * topk, topk,
                        len[size_t(i)], q, w, i, key, 0.088, 0.17, &gap);
    std::printf("RESULT indexer_topk_rows batched row=%lld ctx=%d differing=%lld worst_rel_gap=%.2g %s\n",
                (long long)i, len[size_t(i)], (long long)diff, gap,
                diff == 0 || (diff > 0 && gap <= 1e-5) ? "ok" : "FAIL");
    EXPECT_TRUE(diff == 0 || (diff > 0 && gap <= 1e-5)) << "row " << i;
  }

  // MLA over the CPU selection (the same keys on both sides), and dense.
  for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
    const LatentCache cache = make_latent(pg.num_pages * kPage, f, r);
    const Tensor q_lat = rand_bf16_values({R, nh, kMlaLatent}, r, 2.0f);
    const Tensor q_rope = rand_bf16_values({R, nh, kMlaRope}, r, 2.0f);
    for (bool sparse : {true, false}) {
      const Tensor got = kernels::mla_attention_rows(
                             q_lat.to(Device::cuda), q_rope.to(Device::cuda),
                             PagedRows{cache.gpu, table_gpu, kPage, seq_gpu, len_gpu, seq, len, max_len},
                             sparse ? ref_sel.to(Device::cuda) : Tensor(), 0.0625)
                             .to(Device::cpu);
      const Tensor ref = kernels::mla_attention_rows(
          q_lat, q_rope, PagedRows{cache.decoded, table_cpu, kPage, seq_cpu, len_cpu, seq, len, max_len},
          sparse ? ref_sel : Tensor(), 0.0625);
      const Err e = compare(got.data<float>(), ref.data<float>(), R * nh * kMlaLatent);
      std::printf(
          "RESULT mla_attention_rows batched rows=%lld heads=%lld %s %s max_abs=%.3g rel=%.3g tol=1e-02 %s\n",
          (long long)R, (long long)nh, fmt_name(f), sparse ? "sparse" : "dense", e.max_abs, e.rel(),
          e.rel() <= 1e-2 ? "ok" : "FAIL");
      EXPECT_LE(e.rel(), 1e-2);
    }
  }
}

TEST_F(CudaIndexerTopk, RejectsBadInput) {
  const Tensor q = Tensor::zeros({1, 16, kIndexerDim}, DType::f32, Device::cuda);  // 16 heads: unsupported
  const Tensor w = Tensor::zeros({1, 16}, DType::f32, Device::cuda);
  const Tensor cache = Tensor::zeros({64, kIndexerDim}, DType::bf16, Device::cuda);
  EXPECT_THROW(
      indexer_topk_rows(q, w, cache, gpu_i32({0}, {1, 1}), kPage, {}, gpu_i32({5}, {1}), 5, 2048, 1, 1),
      Error);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
