// The FP8 index-key cache (store bit-exact against the CPU quantiser, gather, scores within the
// quantisation bound, top-k against the CPU operator on the same FP8 keys) and the multi-CTA select on few
// long rows (batch 1 and 2 up to 262,149 keys, exact ties across CTA boundaries, bf16 and FP8 keys), run
// both as one cooperative launch and as four launches, or with one CTA per row fused into the score
// kernel and as the row kernel (identical outputs). Every case prints a "RESULT "
// line. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "gpu_test.h"
#include "indexer_test_util.h"
#include "kernels/cpu/indexer_key_fp8.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace test_util;

class CudaIndexerFp8 : public testing::GpuTest {};
using CudaIndexerSelect = CudaIndexerFp8;

// f32 keys [n, 128]: U(-1, 1) times a per-key magnitude 2^U(-6, 6) (so every key gets its own scale).
Tensor rand_keys(int64_t n, Rng& r) {
  Tensor t = Tensor::empty({n, kIndexerDim}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    const float amp = std::exp2(6.0f * r.uniform());
    for (int d = 0; d < kIndexerDim; ++d) t.data<float>()[i * kIndexerDim + d] = r.uniform() * amp;
  }
  return t;
}

// The GPU store writes exactly the CPU quantiser's bytes, including all-zero keys, an f32-subnormal amax
// (scale 1, not inf), huge and exactly-448 values; the gather (and ops::paged_gather) reads them back as
// the CPU decode does.
TEST_F(CudaIndexerFp8, StoreBitExactVsCpuAndGather) {
  install_backend();
  Rng r(101);
  const int64_t n = 300, slots = n + 37;
  Tensor keys = rand_keys(n, r);
  float* k = keys.data<float>();
  std::fill_n(k, kIndexerDim, 0.0f);                                                    // all zeros
  for (int d = 0; d < kIndexerDim; ++d) k[kIndexerDim + d] = 1e-40f * r.uniform();      // subnormal amax
  for (int d = 0; d < kIndexerDim; ++d) k[4 * kIndexerDim + d] = 1e-44f * r.uniform();  // amax / 448 -> 0
  for (int d = 0; d < kIndexerDim; ++d) k[2 * kIndexerDim + d] = 3e37f * r.uniform();
  for (int d = 0; d < kIndexerDim; ++d) k[3 * kIndexerDim + d] = d == 5 ? -448.0f : float(d % 17) - 8.0f;
  // Slot of key i: a shuffle of the pool.
  std::vector<int32_t> perm(static_cast<size_t>(slots));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(r.below(int64_t(i)))]);
  std::vector<int32_t> slot_of(perm.begin(), perm.begin() + n);

  // Expected bytes: the CPU encoding of a pool whose slot slot_of[i] holds key i.
  Tensor pool = Tensor::zeros({slots, kIndexerDim}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(k + i * kIndexerDim, kIndexerDim, pool.data<float>() + slot_of[size_t(i)] * kIndexerDim);
  const Tensor want = kernels::cpu::indexer_key_fp8_encode(pool);
  const float* want_scale = reinterpret_cast<const float*>(want.data_u8() + slots * kIndexerDim);

  const Tensor slots_gpu = gpu_i32(slot_of, {n});
  for (bool via_ops : {false, true}) {
    Tensor cache = Tensor::zeros({slots, kIndexerFp8RowBytes}, DType::u8, Device::cuda);
    if (via_ops) {
      kernels::paged_store(cache, slots_gpu, keys.to(Device::cuda));
    } else {
      indexer_key_cache_store(cache, slots_gpu, keys.to(Device::cuda));
    }
    const Tensor got = cache.to(Device::cpu);
    const float* got_scale = reinterpret_cast<const float*>(got.data_u8() + slots * kIndexerDim);
    int64_t bad_codes = 0, bad_scales = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = slot_of[size_t(i)];
      for (int d = 0; d < kIndexerDim; ++d)
        bad_codes += got.data_u8()[s * kIndexerDim + d] != want.data_u8()[s * kIndexerDim + d];
      bad_scales += std::memcmp(&got_scale[s], &want_scale[s], 4) != 0;
    }
    std::printf(
        "RESULT indexer_key_store_fp8%s keys=%lld bad_codes=%lld bad_scales=%lld subnormal_amax_scale=%g "
        "underflow_scale=%g %s\n",
        via_ops ? " (ops::paged_store)" : "", (long long)n, (long long)bad_codes, (long long)bad_scales,
        double(got_scale[slot_of[1]]), double(got_scale[slot_of[4]]),
        bad_codes == 0 && bad_scales == 0 ? "ok" : "FAIL");
    EXPECT_EQ(bad_codes, 0);
    EXPECT_EQ(bad_scales, 0);
    EXPECT_EQ(got_scale[slot_of[0]], 1.0f);  // all zeros: scale 1
    EXPECT_TRUE(std::isfinite(got_scale[slot_of[1]]) && got_scale[slot_of[1]] > 0.0f);
    EXPECT_EQ(got_scale[slot_of[4]], 1.0f);  // amax / 448 underflows: scale 1, not 0 or inf
  }

  // Gather: positions 0..n-1 of a request whose page table walks the pool in order.
  Tensor cache = Tensor::zeros({slots, kIndexerFp8RowBytes}, DType::u8, Device::cuda);
  indexer_key_cache_store(cache, slots_gpu, keys.to(Device::cuda));
  const Tensor decoded = kernels::cpu::indexer_key_fp8_decode(want);  // [slots, 128]
  std::vector<int32_t> pages(static_cast<size_t>((slots + kPage - 1) / kPage));
  std::iota(pages.begin(), pages.end(), 0);
  const int64_t m = (slots / kPage) * kPage;  // whole pages inside the pool
  const Tensor pt = gpu_i32(pages, {int64_t(pages.size())});
  const Tensor g1 = indexer_key_cache_gather(cache, pt, kPage, m).to(Device::cpu);
  const Tensor g2 = kernels::paged_gather(PagedSeq{cache, pt, kPage}, m).to(Device::cpu);
  int64_t bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    const bool stored = std::find(slot_of.begin(), slot_of.end(), int32_t(i)) != slot_of.end();
    if (!stored) continue;
    for (int d = 0; d < kIndexerDim; ++d) {
      const float w = decoded.data<float>()[i * kIndexerDim + d];
      bad += g1.data<float>()[i * kIndexerDim + d] != w || g2.data<float>()[i * kIndexerDim + d] != w;
    }
  }
  std::printf("RESULT indexer_key_gather_fp8 positions=%lld mismatches=%lld %s\n", (long long)m,
              (long long)bad, bad == 0 ? "ok" : "FAIL");
  EXPECT_EQ(bad, 0);
}

// The score kernel over FP8 keys (run alone through the launch API) against exact double scores:
// within 1e-4 of the bound's scale on the same FP8 keys, and within the quantisation bound of the f32
// source keys: |ds| <= sum_h |w_h| ws scale |q_h| . |k - k_fp8| (ReLU is 1-Lipschitz).
TEST_F(CudaIndexerFp8, ScoresWithinQuantisationBound) {
  Rng r(102);
  const int64_t ih = 64, n = 5000, topk = 2048;
  const Paging pg = make_paging({n}, r);
  const int64_t slots = pg.num_pages * kPage;
  const Tensor src = rand_keys(slots, r);
  const Tensor bytes = kernels::cpu::indexer_key_fp8_encode(src);
  const Tensor deq = kernels::cpu::indexer_key_fp8_decode(bytes);
  const Tensor q = rand_bf16_values({1, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({1, ih}, r, 1.0f);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  const Tensor cache = bytes.to(Device::cuda), qg = q.to(Device::cuda), wg = w.to(Device::cuda);
  const Tensor pt = pg.table_gpu(), len = gpu_i32({int32_t(n)}, {1});
  Tensor scores = Tensor::zeros({1, (n + 3) / 4 * 4}, DType::f32, Device::cuda);
  int64_t split_len = 0;
  const int64_t splits = indexer_select_splits(1, n, indexer_num_sms(), &split_len);
  Tensor work = Tensor::empty({indexer_workspace_words(1, splits)}, DType::i32, Device::cuda);
  Tensor out = Tensor::empty({1, topk}, DType::i32, Device::cuda);
  IndexerTopkParams p{};
  p.q = qg.data<float>();
  p.w = wg.data<float>();
  p.cache = cache.raw_data();
  p.page_table = pt.data<int32_t>();
  p.row_len = len.data<int32_t>();
  p.scores = scores.data<float>();
  p.out = out.data<int32_t>();
  p.rows = 1;
  p.heads = ih;
  p.q_s0 = ih * kIndexerDim;
  p.q_s1 = kIndexerDim;
  p.w_s0 = ih;
  p.num_seqs = 1;
  p.pt_cols = pg.max_pages;
  p.pt_stride = pg.max_pages;
  p.page_size = kPage;
  p.num_slots = slots;
  p.score_stride = scores.size(1);
  p.out_stride = p.out_k = p.topk = topk;
  p.max_len = n;
  p.splits = splits;
  p.split_len = split_len;
  indexer_workspace_pointers(p, reinterpret_cast<uint32_t*>(work.data<int32_t>()));
  p.scale = float(scale);
  p.weight_scale = float(ws);
  p.key_format = IndexerKeyFormat::fp8_e4m3;
  p.scores_only = true;
  ASSERT_EQ(launch_indexer_topk_fused(p, nullptr), cudaSuccess);
  const Tensor got = scores.to(Device::cpu);
  double worst_same = 0, worst_src = 0, max_score = 0;
  for (int64_t s = 0; s < n; ++s) {
    const int64_t slot = pg.slot(0, s);
    const float* kd = deq.data<float>() + slot * kIndexerDim;
    const float* ks = src.data<float>() + slot * kIndexerDim;
    const double e_deq = exact_score(q, w, 0, kd, scale, ws), e_src = exact_score(q, w, 0, ks, scale, ws);
    double bound = 0, mag = 0;
    for (int64_t h = 0; h < ih; ++h) {
      const float* qh = q.data<float>() + h * kIndexerDim;
      double dq = 0, dm = 0;
      for (int d = 0; d < kIndexerDim; ++d) {
        dq += std::fabs(double(qh[d])) * std::fabs(double(ks[d]) - double(kd[d]));
        dm += std::fabs(double(qh[d]) * double(kd[d]));
      }
      const double wh = std::fabs(double(w.data<float>()[h])) * ws * scale;
      bound += wh * dq;
      mag += wh * dm;
    }
    const double g = got.data<float>()[s];
    max_score = std::max(max_score, std::fabs(e_src));
    worst_same = std::max(worst_same, std::fabs(g - e_deq) / std::max(mag, 1e-30));
    worst_src = std::max(worst_src, (std::fabs(g - e_src) - 1e-4 * mag) / std::max(bound, 1e-30));
  }
  std::printf(
      "RESULT indexer_scores_fp8 keys=%lld heads=%lld err_vs_same_fp8=%.2g (of sum|terms|, tol 1e-4) "
      "err_vs_f32_source=%.2f (of the quantisation bound, tol 1) max_score=%.3g %s\n",
      (long long)n, (long long)ih, worst_same, worst_src, max_score,
      worst_same <= 1e-4 && worst_src <= 1.0 ? "ok" : "FAIL");
  EXPECT_LE(worst_same, 1e-4);
  EXPECT_LE(worst_src, 1.0);
}

// Top-k over an FP8 cache vs the CPU operator on the same FP8 keys (decoded): the same set, up to
// float-rounding near-ties; and the agreement with the top-k of the f32 source keys (printed).
void run_fp8_topk(const std::vector<int64_t>& lens, int64_t ih, uint64_t seed) {
  Rng r(seed);
  const Paging pg = make_paging(lens, r);
  const int64_t slots = pg.num_pages * kPage, B = int64_t(lens.size()), topk = 2048;
  const Tensor src = rand_keys(slots, r);
  const Tensor bytes = kernels::cpu::indexer_key_fp8_encode(src);
  const Tensor deq = kernels::cpu::indexer_key_fp8_decode(bytes);
  const Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  std::vector<int32_t> len32(lens.begin(), lens.end());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  const Tensor got =
      indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda), bytes.to(Device::cuda), pg.table_gpu(), kPage,
                        {}, gpu_i32(len32, {B}), max_len, topk, scale, ws)
          .to(Device::cpu);
  const int64_t out_k = std::min(topk, max_len);
  ASSERT_EQ(got.size(1), out_k);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[size_t(b)];
    const Tensor qb = q.slice(0, b, b + 1).contiguous(), wb = w.slice(0, b, b + 1).contiguous();
    auto ref_on = [&](const Tensor& keys) {
      const Tensor ref =
          kernels::backend(Device::cpu)
              .indexer_topk(qb, wb, PagedSeq{keys, pg.row_cpu(size_t(b)), kPage}, n - 1, topk, scale, ws);
      std::vector<int32_t> v(static_cast<size_t>(out_k), -1);
      std::copy_n(ref.data<int32_t>(), ref.size(1), v.begin());
      return v;
    };
    const std::vector<int32_t> want = ref_on(deq), want_src = ref_on(src);
    double gap = 0;
    auto key = [&](int64_t s) { return deq.data<float>() + pg.slot(size_t(b), s) * kIndexerDim; };
    const int64_t diff = check_selection(got.data<int32_t>() + b * out_k, want.data(), out_k, n, qb, wb, 0,
                                         key, scale, ws, &gap);
    const bool ok = diff == 0 || (diff > 0 && gap <= 1e-5);
    std::vector<int32_t> g(got.data<int32_t>() + b * out_k, got.data<int32_t>() + (b + 1) * out_k);
    std::vector<int32_t> s = want_src, common;
    std::sort(g.begin(), g.end());
    std::sort(s.begin(), s.end());
    std::set_intersection(g.begin(), g.end(), s.begin(), s.end(), std::back_inserter(common));
    const double agree = double(common.size()) / double(std::min(n, out_k));
    std::printf(
        "RESULT indexer_topk_fp8 heads=%lld ctx=%lld batch=%lld differing_vs_cpu_same_fp8=%lld "
        "worst_rel_gap=%.2g (tol 1e-05) agreement_with_f32_source=%.4f %s\n",
        (long long)ih, (long long)n, (long long)B, (long long)diff, gap, agree, ok ? "ok" : "FAIL");
    EXPECT_TRUE(ok) << "row " << b << " ctx " << n << " differing " << diff << " gap " << gap;
    EXPECT_GE(agree, 0.5) << "FP8 selection far from the f32 source's, row " << b;
  }
}

TEST_F(CudaIndexerFp8, TopkRaggedBatchMatchesCpuOnSameKeys) {
  run_fp8_topk({1, 2048, 2049, 8191, 32768, 131072}, 32, 103);
}
TEST_F(CudaIndexerFp8, TopkSixtyFourHeads) { run_fp8_topk({4000, 65536}, 64, 104); }

// The ops.h entry points with an FP8 index-key cache (the CUDA backend's dispatch): the batched rows of a
// prefill chunk and a decode row (one launch), and the per-request op, against the CPU on the same keys.
TEST_F(CudaIndexerFp8, OpsDispatchBatchedAndPerRequest) {
  install_backend();
  Rng r(105);
  const int64_t ih = 32, topk = 2048;
  const std::vector<int64_t> lens = {3003, 2600};
  const Paging pg = make_paging(lens, r);
  const int64_t slots = pg.num_pages * kPage;
  const Tensor bytes = kernels::cpu::indexer_key_fp8_encode(rand_keys(slots, r));
  const Tensor deq = kernels::cpu::indexer_key_fp8_decode(bytes);
  const Tensor cache = bytes.to(Device::cuda);
  // Rows: request 0 prefills positions 3000..3002, request 1 decodes position 2599.
  const std::vector<int32_t> seq = {0, 0, 0, 1}, len = {3001, 3002, 3003, 2600};
  const int64_t R = 4, max_len = 3003;
  const Tensor q = rand_bf16_values({R, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({R, ih}, r, 1.0f);
  Tensor table_cpu = Tensor::empty({2, pg.max_pages}, DType::i32);
  std::copy(pg.pt.begin(), pg.pt.end(), table_cpu.data<int32_t>());
  const Tensor got = kernels::indexer_topk_rows(q.to(Device::cuda), w.to(Device::cuda),
                                                PagedRows{cache, pg.table_gpu(), kPage, gpu_i32(seq, {R}),
                                                          gpu_i32(len, {R}), seq, len, max_len},
                                                topk, 0.088, 0.17)
                         .to(Device::cpu);
  const Tensor got_req0 =
      kernels::indexer_topk(q.slice(0, 0, 3).contiguous().to(Device::cuda),
                            w.slice(0, 0, 3).contiguous().to(Device::cuda),
                            PagedSeq{cache, pg.row_cpu(0).to(Device::cuda), kPage}, 3000, topk, 0.088, 0.17)
          .to(Device::cpu);
  ASSERT_EQ(got.shape(), (Shape{R, topk}));
  ASSERT_EQ(got_req0.shape(), (Shape{3, topk}));
  int64_t bad = 0;
  for (int64_t i = 0; i < R; ++i) {
    const size_t b = size_t(seq[size_t(i)]);
    const Tensor qi = q.slice(0, i, i + 1).contiguous(), wi = w.slice(0, i, i + 1).contiguous();
    const Tensor ref =
        kernels::backend(Device::cpu)
            .indexer_topk(qi, wi, PagedSeq{deq, pg.row_cpu(b), kPage}, len[size_t(i)] - 1, topk, 0.088, 0.17);
    auto key = [&](int64_t s) { return deq.data<float>() + pg.slot(b, s) * kIndexerDim; };
    for (int pass = 0; pass < (i < 3 ? 2 : 1); ++pass) {
      const int32_t* g = pass == 0 ? got.data<int32_t>() + i * topk : got_req0.data<int32_t>() + i * topk;
      double gap = 0;
      const int64_t diff =
          check_selection(g, ref.data<int32_t>(), topk, len[size_t(i)], qi, wi, 0, key, 0.088, 0.17, &gap);
      bad += diff == 0 || (diff > 0 && gap <= 1e-5) ? 0 : 1;
    }
  }
  std::printf("RESULT indexer_topk_fp8 ops dispatch (batched rows + per request) rows=%lld bad=%lld %s\n",
              (long long)R, (long long)bad, bad == 0 ? "ok" : "FAIL");
  EXPECT_EQ(bad, 0);
}

// The selection of `run` (an indexer_topk_rows call with these KernelOptions) with the select forced to
// `path` (KernelOptions::indexer_select).
Tensor topk_with_path(IndexerSelectPath path, const std::function<Tensor(const KernelOptions&)>& run) {
  KernelOptions o;
  o.indexer_select = path;
  return run(o).to(Device::cpu);
}

// Positions where two selections differ (both [rows, k] i32 CPU).
int64_t count_differing(const Tensor& a, const Tensor& b) {
  int64_t d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d += a.data<int32_t>()[i] != b.data<int32_t>()[i] ? 1 : 0;
  return d;
}

// Few rows with long contexts: the select spreads each row over many CTAs. Keys bf16 (or FP8: the CPU
// reference then uses the decoded FP8 keys); with `ties` only 97 distinct key rows, so runs of equal
// scores straddle every CTA boundary. Runs the new select path and the old one (several CTAs per row:
// cooperative vs four launches; one: fused into the score kernel vs the row kernel): their outputs must
// be identical, and match the CPU operator.
void run_long_rows(const std::vector<int64_t>& lens, uint64_t seed, bool ties, bool fp8 = false) {
  Rng r(seed);
  const int64_t ih = 32, topk = 2048, B = int64_t(lens.size());
  const Paging pg = make_paging(lens, r);
  const int64_t slots = pg.num_pages * kPage;
  Tensor keys = rand_bf16_values({slots, kIndexerDim}, r, 1.0f);
  if (ties) {
    for (size_t b = 0; b < lens.size(); ++b)
      for (int64_t s = 0; s < lens[b]; ++s)
        std::copy_n(keys.data<float>() + (s % 97) * kIndexerDim, kIndexerDim,
                    keys.data<float>() + pg.slot(b, s) * kIndexerDim);
  }
  const Tensor fp8_bytes = fp8 ? kernels::cpu::indexer_key_fp8_encode(keys) : Tensor();
  const Tensor ref_keys = fp8 ? kernels::cpu::indexer_key_fp8_decode(fp8_bytes) : keys;
  const Tensor cache = fp8 ? fp8_bytes.to(Device::cuda) : bf16_copy(keys).to(Device::cuda);
  const Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  std::vector<int32_t> len32(lens.begin(), lens.end());
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  int64_t split_len = 0;
  const int64_t splits = indexer_select_splits(B, max_len, indexer_num_sms(), &split_len);
  const Tensor qg = q.to(Device::cuda), wg = w.to(Device::cuda), pt = pg.table_gpu(),
               lg = gpu_i32(len32, {B});
  // Two rows or more: packed scores (host lengths given), one row: dense.
  auto run = [&](const KernelOptions& o) {
    return indexer_topk_rows(qg, wg, cache, pt, kPage, {}, lg, max_len, topk, scale, ws, nullptr,
                             B > 1 ? std::span<const int32_t>(len32) : std::span<const int32_t>(),
                             kIndexerScoreBudgetBytes, o);
  };
  // The new path (cooperative with several CTAs per row, else fused into the score kernel) and the old.
  const IndexerSelectPath path_new =
                              splits > 1 ? IndexerSelectPath::cooperative : IndexerSelectPath::row_fused,
                          path_old = splits > 1 ? IndexerSelectPath::passes : IndexerSelectPath::row;
  const Tensor got = topk_with_path(path_new, run);
  const Tensor got_passes = topk_with_path(path_old, run);
  const int64_t out_k = std::min(topk, max_len);
  ASSERT_EQ(got.size(1), out_k);
  IndexerTopkParams probe{};
  probe.rows = B;
  probe.max_len = max_len;
  probe.topk = topk;
  probe.splits = splits;
  probe.select_path = path_new;
  probe.row_done = reinterpret_cast<uint32_t*>(&probe);  // any non-null: the fused path is possible
  const IndexerSelectPath ran = indexer_select_path(probe);
  const int64_t vs_passes = count_differing(got, got_passes);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[size_t(b)];
    const Tensor qb = q.slice(0, b, b + 1).contiguous(), wb = w.slice(0, b, b + 1).contiguous();
    const Tensor ref =
        kernels::backend(Device::cpu)
            .indexer_topk(qb, wb, PagedSeq{ref_keys, pg.row_cpu(size_t(b)), kPage}, n - 1, topk, scale, ws);
    std::vector<int32_t> want(static_cast<size_t>(out_k), -1);
    std::copy_n(ref.data<int32_t>(), std::min(ref.size(1), out_k), want.begin());
    double gap = 0;
    auto key = [&](int64_t s) { return ref_keys.data<float>() + pg.slot(size_t(b), s) * kIndexerDim; };
    const int64_t diff = check_selection(got.data<int32_t>() + b * out_k, want.data(), out_k, n, qb, wb, 0,
                                         key, scale, ws, &gap);
    // With exact ties the sets must be identical (equal scores go to the lower position). FP8: the GPU
    // scales the dot products of the codes, the CPU dots the decoded keys, so distinct tie groups may
    // order differently within float rounding (the gap check); the two GPU paths still agree exactly.
    const bool ok = ties && !fp8 ? diff == 0 : diff == 0 || (diff > 0 && gap <= 1e-5);
    std::printf(
        "RESULT indexer_topk_long_rows %s ctx=%lld batch=%lld splits=%lld split_len=%lld select=%s "
        "grid=%lld%s "
        "differing=%lld worst_rel_gap=%.2g vs_%s_differing=%lld %s\n",
        fp8 ? "fp8" : "bf16", (long long)n, (long long)B, (long long)splits, (long long)split_len,
        indexer_select_path_name(ran),
        (long long)(ran == IndexerSelectPath::cooperative ? indexer_select_coop_grid(probe) : 0),
        ties ? " ties" : "", (long long)diff, gap, indexer_select_path_name(path_old), (long long)vs_passes,
        ok && vs_passes == 0 ? "ok" : "FAIL");
    EXPECT_TRUE(ok) << "row " << b << " ctx " << n << " differing " << diff;
  }
  EXPECT_EQ(vs_passes, 0) << "select " << indexer_select_path_name(ran) << " differs from "
                          << indexer_select_path_name(path_old);
}

TEST_F(CudaIndexerSelect, BatchOne4K) { run_long_rows({4096}, 114, false); }
TEST_F(CudaIndexerSelect, BatchOne32K) { run_long_rows({32768}, 115, false); }
TEST_F(CudaIndexerSelect, BatchOne128K) { run_long_rows({131072}, 116, false); }
TEST_F(CudaIndexerSelect, BatchOneLongContext) { run_long_rows({262149}, 111, false); }
TEST_F(CudaIndexerSelect, BatchTwoRagged) { run_long_rows({100000, 16385}, 112, false); }
TEST_F(CudaIndexerSelect, BatchOneExactTiesAcrossSplits) { run_long_rows({150001}, 113, true); }
TEST_F(CudaIndexerSelect, Fp8BatchOne128K) { run_long_rows({131072}, 117, false, true); }
TEST_F(CudaIndexerSelect, Fp8BatchTwoRaggedTies) { run_long_rows({70001, 2049}, 118, true, true); }

// 200 query rows of different lengths (0, <= topk, up to max_len) over one shared sequence; the new select
// path must equal the old one bit for bit, and a few rows are also checked against the CPU operator.
// max_len 40,000: 2 CTAs per row, more (row, split) pairs than co-resident CTAs (200 x 2 > 2 CTAs of 1024
// threads per SM x 132 SMs), so each cooperative CTA loops over several. max_len 16,384: one CTA per row,
// the select fused into the score kernel (the last score CTA of each row selects) vs the row kernel.
void run_many_rows(int64_t max_len, uint64_t seed) {
  Rng r(seed);
  const int64_t ih = 32, topk = 2048, B = 200;
  const Paging pg = make_paging({max_len}, r);
  const Tensor keys = rand_bf16_values({pg.num_pages * kPage, kIndexerDim}, r, 1.0f);
  const Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  std::vector<int32_t> len32(static_cast<size_t>(B)), seq(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    len32[size_t(b)] = b % 10 == 0   ? 0
                       : b % 10 == 1 ? int32_t(r.below(topk + 1))
                                     : int32_t(r.below(max_len) + 1);
  }
  len32[2] = int32_t(max_len);
  len32[3] = int32_t(topk + 1);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  const Tensor qg = q.to(Device::cuda), wg = w.to(Device::cuda), cache = bf16_copy(keys).to(Device::cuda),
               pt = pg.table_gpu(), lg = gpu_i32(len32, {B}), sg = gpu_i32(seq, {B});
  auto run = [&](const KernelOptions& o) {
    return indexer_topk_rows(qg, wg, cache, pt, kPage, sg, lg, max_len, topk, scale, ws, nullptr,
                             std::span<const int32_t>(len32), kIndexerScoreBudgetBytes, o);
  };
  int64_t split_len = 0;
  IndexerTopkParams probe{};
  probe.rows = B;
  probe.max_len = max_len;
  probe.topk = topk;
  probe.splits = indexer_select_splits(B, max_len, indexer_num_sms(), &split_len);
  probe.row_done = reinterpret_cast<uint32_t*>(&probe);  // any non-null: the fused path is possible
  const bool split = probe.splits > 1;
  const IndexerSelectPath path_new = split ? IndexerSelectPath::cooperative : IndexerSelectPath::row_fused,
                          path_old = split ? IndexerSelectPath::passes : IndexerSelectPath::row;
  probe.select_path = path_new;
  const IndexerSelectPath ran = indexer_select_path(probe);
  const int64_t grid = ran == IndexerSelectPath::cooperative ? indexer_select_coop_grid(probe) : 0;
  const Tensor got = topk_with_path(path_new, run);
  const Tensor got_old = topk_with_path(path_old, run);
  const int64_t vs_old = count_differing(got, got_old);
  int64_t cpu_diff = 0;
  for (int64_t b : {1, 2, 3, 7}) {
    const int64_t n = len32[size_t(b)];
    if (n == 0) continue;
    const Tensor qb = q.slice(0, b, b + 1).contiguous(), wb = w.slice(0, b, b + 1).contiguous();
    const Tensor ref =
        kernels::backend(Device::cpu)
            .indexer_topk(qb, wb, PagedSeq{keys, pg.row_cpu(0), kPage}, n - 1, topk, scale, ws);
    std::vector<int32_t> want(size_t(topk), -1);
    std::copy_n(ref.data<int32_t>(), std::min(ref.size(1), topk), want.begin());
    double gap = 0;
    auto key = [&](int64_t s) { return keys.data<float>() + pg.slot(0, s) * kIndexerDim; };
    const int64_t d = check_selection(got.data<int32_t>() + b * topk, want.data(), topk, n, qb, wb, 0, key,
                                      scale, ws, &gap);
    if (!(d == 0 || (d > 0 && gap <= 1e-5))) ++cpu_diff;
  }
  const bool loops = !split || grid < B * probe.splits;
  std::printf(
      "RESULT indexer_select_many_rows rows=%lld max_len=%lld splits=%lld select=%s grid=%lld capacity=%d "
      "vs_%s_differing=%lld cpu_rows_bad=%lld %s\n",
      (long long)B, (long long)max_len, (long long)probe.splits, indexer_select_path_name(ran),
      (long long)grid, indexer_select_coop_capacity(), indexer_select_path_name(path_old), (long long)vs_old,
      (long long)cpu_diff, vs_old == 0 && cpu_diff == 0 && ran == path_new && loops ? "ok" : "FAIL");
  EXPECT_EQ(ran, path_new) << "no cooperative launch on this device?";
  EXPECT_TRUE(loops) << "the cooperative grid does not loop: the case tests nothing new";
  EXPECT_EQ(vs_old, 0);
  EXPECT_EQ(cpu_diff, 0);
}

TEST_F(CudaIndexerSelect, CooperativeGridLoopsOverRowSplits) { run_many_rows(40000, 119); }
TEST_F(CudaIndexerSelect, FusedRowSelectManyRows) { run_many_rows(16384, 120); }

// The select path depends only on (rows, max_len, topk), the forced path and the device: with splits == 1
// fused into the score kernel (when there is one and the workspace has the counters), else the row
// kernel; with splits > 1 the cooperative launch where the device has one (else the four launches, as on
// a machine without a GPU), never for rows that need no select pass.
TEST(IndexerSelectPathChoice, PicksByShapeAndDevice) {
  IndexerTopkParams p{};
  p.rows = 1;
  p.topk = 2048;
  p.max_len = 131072;
  p.splits = indexer_select_splits(p.rows, p.max_len, 132, &p.split_len);
  ASSERT_EQ(p.splits, 8);
  const bool coop = indexer_select_coop_capacity() > 0;
  // The default for split rows is the measured faster four-launch path; the cooperative one on request.
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::passes);
  p.select_path = IndexerSelectPath::cooperative;
  EXPECT_EQ(indexer_select_path(p), coop ? IndexerSelectPath::cooperative : IndexerSelectPath::passes);
  if (coop) {
    EXPECT_EQ(indexer_select_coop_grid(p), std::min<int64_t>(8, indexer_select_coop_capacity()));
  }
  p.select_path = IndexerSelectPath::passes;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::passes);
  p.select_path = IndexerSelectPath::automatic;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::passes);
  p.max_len = 2048;  // no row has more than topk keys: only the last pass runs
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::passes);
  p.splits = 1;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row);  // no score kernel to fuse into
  p.max_len = 16384;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row);  // no row_done counters
  uint32_t counter = 0;
  p.row_done = &counter;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row_fused);
  p.scores_only = true;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row);
  p.scores_only = false;
  p.select_path = IndexerSelectPath::row;
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row);
  p.select_path = IndexerSelectPath::cooperative;  // the other kind: the default
  EXPECT_EQ(indexer_select_path(p), IndexerSelectPath::row_fused);
  EXPECT_STREQ(indexer_select_path_name(IndexerSelectPath::row_fused), "row_fused");
  EXPECT_STREQ(indexer_select_path_name(IndexerSelectPath::cooperative), "coop");
  EXPECT_STREQ(indexer_select_path_name(IndexerSelectPath::passes), "passes");
  EXPECT_STREQ(indexer_select_path_name(IndexerSelectPath::row), "row");
}

// Score kernels v2 and v3 (IndexerScoreKernel; v1 was removed, 941 vs 527 us) on ragged rows over page sizes
// 64, 16, 1, 100 (FP8: scale copies not 16-byte aligned), 256 (pages longer than a tile), 32 and 64 heads,
// bf16 and FP8 keys. The rows split into many CTAs whose last tile is partial and whose tile count is below
// some pipeline depths; one row has at most topk keys (no scores). Heads 0 and 1 of q are scaled by 2^20
// and 2^-20 (their weights by the inverse), exercising the per-head power-of-two scaling of q for FP8.
// Both within 1e-4 of the sum of |terms| of the exact scores on the same keys; bf16: v3 asked for runs v2
// (select_indexer_score_kernel), so scores and fused selections are bit for bit v2's. Positions without
// scores keep their sentinel.
struct ScoreCase {
  int64_t heads, page;
  bool fp8;
};

void run_score_kernels(const ScoreCase& c, uint64_t seed) {
  Rng r(seed);
  const std::vector<int64_t> lens = {5000, 2048, 129, 40077, 2049, 12345};
  const int64_t B = int64_t(lens.size()), ih = c.heads, ps = c.page, topk = 2048;
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  const int64_t max_pages = (max_len + ps - 1) / ps;
  int64_t num_pages = 2;
  for (int64_t n : lens) num_pages += (n + ps - 1) / ps;
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(r.below(int64_t(i)))]);
  std::vector<int32_t> pt(static_cast<size_t>(B * max_pages), 0);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < (lens[size_t(b)] + ps - 1) / ps; ++j)
      pt[size_t(b * max_pages + j)] = perm[next++];
  const int64_t slots = num_pages * ps;
  const Tensor src = c.fp8 ? rand_keys(slots, r) : rand_bf16_values({slots, kIndexerDim}, r, 1.0f);
  const Tensor bytes = c.fp8 ? kernels::cpu::indexer_key_fp8_encode(src) : Tensor();
  const Tensor keys = c.fp8 ? kernels::cpu::indexer_key_fp8_decode(bytes) : src;
  Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  for (int64_t b = 0; b < B; ++b) {
    for (int d = 0; d < kIndexerDim; ++d) {
      q.data<float>()[(b * ih + 0) * kIndexerDim + d] *= 0x1p20f;
      q.data<float>()[(b * ih + 1) * kIndexerDim + d] *= 0x1p-20f;
    }
    w.data<float>()[b * ih + 0] *= 0x1p-20f;
    w.data<float>()[b * ih + 1] *= 0x1p20f;
  }
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  std::vector<int32_t> len32(lens.begin(), lens.end());
  const Tensor cache = c.fp8 ? bytes.to(Device::cuda) : bf16_copy(src).to(Device::cuda);
  const Tensor qg = q.to(Device::cuda), wg = w.to(Device::cuda), lg = gpu_i32(len32, {B}),
               ptg = gpu_i32(pt, {B, max_pages});
  const int64_t stride = (max_len + 3) / 4 * 4;
  const float sentinel = -12345.0f;
  struct Run {
    Tensor scores, out;
  };
  auto run = [&](IndexerScoreKernel kernel, bool scores_only) {
    Tensor init = Tensor::empty({B, stride}, DType::f32);
    std::fill_n(init.data<float>(), init.numel(), sentinel);
    Run res{init.to(Device::cuda), Tensor::zeros({B, topk}, DType::i32, Device::cuda)};
    int64_t split_len = 0;
    const int64_t splits = indexer_select_splits(B, max_len, indexer_num_sms(), &split_len);
    Tensor work = Tensor::empty({indexer_workspace_words(B, splits)}, DType::i32, Device::cuda);
    IndexerTopkParams p{};
    p.q = qg.data<float>();
    p.w = wg.data<float>();
    p.cache = cache.raw_data();
    p.page_table = ptg.data<int32_t>();
    p.row_len = lg.data<int32_t>();
    p.scores = res.scores.data<float>();
    p.out = res.out.data<int32_t>();
    p.rows = B;
    p.heads = ih;
    p.q_s0 = ih * kIndexerDim;
    p.q_s1 = kIndexerDim;
    p.w_s0 = ih;
    p.num_seqs = B;
    p.pt_cols = max_pages;
    p.pt_stride = max_pages;
    p.page_size = ps;
    p.num_slots = slots;
    p.score_stride = stride;
    p.out_stride = p.out_k = p.topk = topk;
    p.max_len = max_len;
    p.splits = splits;
    p.split_len = split_len;
    indexer_workspace_pointers(p, reinterpret_cast<uint32_t*>(work.data<int32_t>()));
    p.scale = float(scale);
    p.weight_scale = float(ws);
    p.key_format = c.fp8 ? IndexerKeyFormat::fp8_e4m3 : IndexerKeyFormat::bf16;
    p.scores_only = scores_only;
    p.score_kernel = kernel;
    EXPECT_EQ(launch_indexer_topk_fused(p, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return Run{res.scores.to(Device::cpu), res.out.to(Device::cpu)};
  };
  const Run v2 = run(IndexerScoreKernel::v2, true), v3 = run(IndexerScoreKernel::v3, true);
  int64_t bitwise_diff = 0, untouched_bad = 0;
  double worst_v2 = 0, worst_v3 = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[size_t(b)];
    for (int64_t s = 0; s < stride; ++s) {
      const float g2 = v2.scores.data<float>()[b * stride + s], g3 = v3.scores.data<float>()[b * stride + s];
      if (s >= n || n <= topk) {
        untouched_bad += (g2 != sentinel ? 1 : 0) + (g3 != sentinel ? 1 : 0);
        continue;
      }
      uint32_t u2, u3;
      std::memcpy(&u2, &g2, 4);
      std::memcpy(&u3, &g3, 4);
      bitwise_diff += u2 != u3 ? 1 : 0;
      if (s % 7 != 0 && s != n - 1) continue;  // exact scores of a seventh of the keys (and the last)
      const int64_t slot = int64_t(pt[size_t(b * max_pages + s / ps)]) * ps + s % ps;
      const float* kd = keys.data<float>() + slot * kIndexerDim;
      const double e = exact_score(q, w, b, kd, scale, ws);
      double mag = 0;
      for (int64_t h = 0; h < ih; ++h) {
        const float* qh = q.data<float>() + (b * ih + h) * kIndexerDim;
        double dm = 0;
        for (int d = 0; d < kIndexerDim; ++d) dm += std::fabs(double(qh[d]) * double(kd[d]));
        mag += std::fabs(double(w.data<float>()[b * ih + h])) * ws * scale * dm;
      }
      worst_v2 = std::max(worst_v2, std::fabs(double(g2) - e) / std::max(mag, 1e-30));
      worst_v3 = std::max(worst_v3, std::fabs(double(g3) - e) / std::max(mag, 1e-30));
    }
  }
  // The full launch (scores and the select) with each kernel: bf16 selections identical.
  const Run f2 = run(IndexerScoreKernel::v2, false), f3 = run(IndexerScoreKernel::v3, false);
  const int64_t sel_diff = count_differing(f2.out, f3.out);
  const bool ok = worst_v3 <= 1e-4 && worst_v2 <= 1e-4 && untouched_bad == 0 &&
                  (c.fp8 || (bitwise_diff == 0 && sel_diff == 0));
  std::printf(
      "RESULT indexer_score_kernels %s heads=%lld page=%lld err_v2=%.2g err_v3=%.2g (of sum|terms|, tol "
      "1e-4) v2_v3_differing_scores=%lld differing_selected=%lld written_outside_rows=%lld %s\n",
      c.fp8 ? "fp8" : "bf16", (long long)ih, (long long)ps, worst_v2, worst_v3, (long long)bitwise_diff,
      (long long)sel_diff, (long long)untouched_bad, ok ? "ok" : "FAIL");
  EXPECT_LE(worst_v3, 1e-4);
  EXPECT_LE(worst_v2, 1e-4);
  EXPECT_EQ(untouched_bad, 0);
  if (!c.fp8) {
    EXPECT_EQ(bitwise_diff, 0) << "bf16: v3 asked for should run v2";
    EXPECT_EQ(sel_diff, 0);
  }
}

TEST_F(CudaIndexerSelect, ScoreKernelsBf16) {
  for (const ScoreCase& c : {ScoreCase{32, 64, false}, ScoreCase{32, 16, false}, ScoreCase{32, 1, false},
                             ScoreCase{32, 100, false}, ScoreCase{64, 256, false}, ScoreCase{64, 64, false}})
    run_score_kernels(c, 130 + uint64_t(c.page + c.heads));
}
TEST_F(CudaIndexerSelect, ScoreKernelsFp8) {
  for (const ScoreCase& c : {ScoreCase{32, 64, true}, ScoreCase{32, 16, true}, ScoreCase{32, 1, true},
                             ScoreCase{32, 100, true}, ScoreCase{64, 256, true}, ScoreCase{64, 64, true}})
    run_score_kernels(c, 150 + uint64_t(c.page + c.heads));
}

// The score kernels walk pages in 32 bits: a launch that runs them rejects page sizes outside (0, 2^31)
// before touching the device (host checks only; no GPU needed).
TEST(IndexerTopkLaunch, RejectsPageSizesPast31Bits) {
  IndexerTopkParams p{};
  p.rows = 1;
  p.heads = 32;
  p.topk = p.out_k = 2048;
  p.max_len = p.split_len = p.score_stride = 4096;
  p.splits = 1;
  for (int64_t ps : {int64_t(0), int64_t(-64), int64_t(1) << 31})
    EXPECT_EQ(launch_indexer_topk_fused((p.page_size = ps, p), nullptr), cudaErrorInvalidValue) << ps;
}

// The score kernel a launch runs: select_indexer_score_kernel of the request and the key format (its rule:
// tests/kernels/kernel_options_test.cpp).
TEST(IndexerScoreKernelChoice, ParamsSelectThroughTheSelector) {
  IndexerTopkParams p{};
  p.key_format = IndexerKeyFormat::fp8_e4m3;
  EXPECT_EQ(indexer_score_kernel(p), IndexerScoreKernel::v3);
  p.score_kernel = IndexerScoreKernel::v2;
  EXPECT_EQ(indexer_score_kernel(p), IndexerScoreKernel::v2);
  p.key_format = IndexerKeyFormat::bf16;
  p.score_kernel = IndexerScoreKernel::v3;
  EXPECT_EQ(indexer_score_kernel(p), IndexerScoreKernel::v2);
  p.score_kernel = IndexerScoreKernel::automatic;
  EXPECT_EQ(indexer_score_kernel(p), IndexerScoreKernel::v2);
}

TEST(IndexerSelectSplits, DependOnlyOnRowsAndLength) {
  int64_t len = 0;
  EXPECT_EQ(indexer_select_splits(1, 131072, 132, &len), 8);
  EXPECT_EQ(len, 16384);
  EXPECT_EQ(indexer_select_splits(1, 1 << 20, 132, &len), 64);
  EXPECT_EQ(indexer_select_splits(128, 131072, 132, &len), 3);
  EXPECT_GE(3 * len, 131072);
  EXPECT_EQ(indexer_select_splits(4096, 131072, 132, &len), 1);
  EXPECT_GE(len, 131072);
  EXPECT_EQ(indexer_select_splits(1, 100, 132, &len), 1);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
