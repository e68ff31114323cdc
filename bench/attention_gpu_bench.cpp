// attention_gpu_bench: the sm_90a attention-side kernels at GLM-5.3 shapes (576/512 latent, top-2048,
// 32 indexer heads of 128) and per-rank head counts, timed with CUDA events (median of 20 runs, the L2
// flushed before each), with bytes, FLOPs, the floor (bytes / 4.3 TB/s, FLOPs / 797 TFLOP/s) and the
// ratio floor / measured. Prints one Markdown table per kernel. The `prefill` table (issue 8) times a
// prefill chunk's whole attention part in both MLA forms through the public ops (kernels/ops.h) and
// prints the rates model::AttentionFormRule takes; the `mha` table (issue 16) the dense MHA-form kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "flushed_timing.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/attention/mla_decode_params.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace {

using namespace dsaserve::kernels;
using namespace dsaserve::kernels::cuda;
using namespace dsaserve::bench;

constexpr double kHbm = 4.3e12;   // device-to-device copy, bytes/s (docs/GPU.md)
constexpr double kBf16 = 797e12;  // dense bf16 GEMM, FLOP/s
constexpr int64_t kPage = 64;

void row(const char* name, double us, double bytes, double flops) {
  const double floor_us = std::max(bytes / kHbm, flops / kBf16) * 1e6;
  const char* bound = bytes / kHbm >= flops / kBf16 ? "HBM" : "bf16 MMA";
  std::printf("| %s | %.1f | %.3g | %.0f | %.1f | %.1f | %s | %.2f |\n", name, us, bytes / 1e6,
              bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12, floor_us, bound, floor_us / us);
}

void header(const char* title) {
  std::printf("\n%s\n\n| case | us (median) | MB | GB/s | TFLOP/s | floor us | floor from | ratio |\n",
              title);
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
}

const char* name_of_kernel(MlaDecodeKernel k) { return name(k).data(); }

// The MLA table's knobs (command-line flags, see main).
struct MlaBenchFlags {
  int64_t only_heads = 0, only_batch = 0;  // > 0: just the cases with that head count / batch
  int forced_splits = 0;                  // --mla-splits N: N key splits (to check mla_decode_splits' choice)
  int64_t pool_slots = int64_t(4) << 20;  // --pool-slots N (16384 keeps the cache inside L2)
  MlaV5Order v5_order = MlaV5Order::automatic;  // --mla-v5-order early|late
  bool head_groups_adjacent = true;             // --mla-head-groups apart|adjacent (v5 above 64 heads)
  MlaDecodeKernel kernel =
      MlaDecodeKernel::automatic;  // --mla-kernel K: each case's first row (auto: default)
};

void bench_mla(int num_sms, void* flush, const MlaBenchFlags& fl) {
  const int64_t only_heads = fl.only_heads, only_batch = fl.only_batch;
  const int forced_splits = fl.forced_splits;
  if (!fl.head_groups_adjacent)
    std::printf("\nv5 above 64 heads: a row's head groups on grid.y (--mla-head-groups apart)\n");
  header(
      "### sparse / dense MLA decode (absorbed, 576/512), one query token per request (q=2: two, a verify)");
  // 4M token slots shared by all requests (4.8 GB bf16: every read comes from HBM); --pool-slots 16384
  // keeps the cache inside L2 (the kernels' speed without HBM).
  const int64_t pool_slots = std::max<int64_t>(kPage, fl.pool_slots);
  void* cache_bf16 = dev_alloc<unsigned char>(size_t(pool_slots) * kMlaBf16RowBytes);
  void* cache_fp8 = dev_alloc<unsigned char>(size_t(pool_slots) * kMlaFp8RowBytes);
  std::mt19937_64 rng(1);
  static_assert(kMlaFp8RowBytes == kFp8MlaRowBytes, "flushed_timing.h's FP8 rows");
  fill_device(cache_fp8, size_t(pool_slots) * kMlaFp8RowBytes, random_fp8_mla_rows(rng));  // as the peer's
  fill_device(cache_bf16, size_t(pool_slots) * kMlaBf16RowBytes, random_bf16_rows(rng, kMlaDim));
  const int64_t topk = 2048;
  struct Case {
    int64_t heads, batch, ctx;
    bool sparse;
    int64_t qtok = 1;  // query rows per request (a speculative verify: 2-6), each its own selection
  };
  std::vector<Case> cases;
  for (int64_t h : {64, 16, 8})
    for (int64_t b : only_batch > 0 ? std::vector<int64_t>{only_batch} : std::vector<int64_t>{1, 32, 128})
      for (int64_t c : {4096, 32768, 131072}) cases.push_back({h, b, c, true});
  for (int64_t b : only_batch > 0 ? std::vector<int64_t>{only_batch} : std::vector<int64_t>{1, 32, 128})
    cases.push_back({128, b, 32768, true});  // DeepSeek-V3.2's heads (two groups of 64)
  // Two query tokens per request (FlashMLA's published FP8 sparse case: 128 heads, batch 128, s_q 2).
  for (int64_t h : {128, 64})
    if (only_batch <= 0 || only_batch == 128) cases.push_back({h, 128, 32768, true, 2});
  for (int64_t h : {64, 8})
    for (int64_t b : only_batch > 0 ? std::vector<int64_t>{only_batch} : std::vector<int64_t>{1, 32, 128})
      cases.push_back({h, b, 2048, false});
  for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
    for (const Case& cs : cases) {
      if ((only_heads > 0 && cs.heads != only_heads) || (only_batch > 0 && cs.batch != only_batch)) continue;
      const int64_t S = cs.batch, B = cs.batch * cs.qtok, nh = cs.heads, pages = (cs.ctx + kPage - 1) / kPage;
      std::vector<int32_t> pt(size_t(S * pages)), len(size_t(B), int32_t(cs.ctx)), sel(size_t(B * topk)),
          seq(static_cast<size_t>(B));
      for (auto& x : pt) x = int32_t(rng() % uint64_t(pool_slots / kPage));
      for (int64_t b = 0; b < B; ++b) seq[size_t(b)] = int32_t(b / cs.qtok);  // row b: request b / qtok
      for (int64_t b = 0; b < B; ++b) {  // topk distinct sorted positions
        std::vector<int32_t> s(static_cast<size_t>(topk));
        for (int64_t j = 0; j < topk; ++j)
          s[size_t(j)] =
              int32_t(j * cs.ctx / topk + int64_t(rng() % uint64_t(std::max<int64_t>(1, cs.ctx / topk))));
        std::copy(s.begin(), s.end(), sel.begin() + b * topk);
      }
      std::vector<float> q(size_t(B * nh * kMlaDim));
      for (auto& x : q) x = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
      float* dq = upload(q);
      int32_t *dpt = upload(pt), *dlen = upload(len), *dsel = upload(sel), *dseq = upload(seq);
      MlaDecodeParams p{};
      p.q_lat = dq;
      p.q_rope = dq + kMlaLatent;
      p.ql_s0 = p.qr_s0 = nh * kMlaDim;
      p.ql_s1 = p.qr_s1 = kMlaDim;
      p.cache = f == MlaKvFormat::bf16 ? cache_bf16 : cache_fp8;
      p.page_table = dpt;
      p.row_seq = dseq;
      p.row_len = dlen;
      p.sel = cs.sparse ? dsel : nullptr;
      p.sel_k = topk;
      p.sel_stride = topk;
      p.rows = B;
      p.heads = nh;
      p.num_seqs = S;
      p.pt_cols = pages;
      p.pt_stride = pages;
      p.page_size = kPage;
      p.num_slots = pool_slots;
      p.max_keys = cs.sparse ? topk : cs.ctx;
      p.scale = 0.0625f;
      p.format = f;
      p.v5_order = fl.v5_order;
      p.head_groups_adjacent = fl.head_groups_adjacent;
      p.out = dev_alloc<float>(size_t(B * nh * kMlaLatent));
      // The default kernel for the shape (or --mla-kernel's), and (at one context per shape) the others to
      // compare (v2; v5 and v6, 64 heads a block, only above 16 heads).
      using K = MlaDecodeKernel;
      const K dflt = select_mla_decode_kernel(fl.kernel, nh, B, f == MlaKvFormat::fp8_e4m3);
      const K kernels[4] = {fl.kernel, K::v2, K::v5, K::v6};
      for (int ki = 0; ki < 4; ++ki) {
        const K kernel = kernels[ki];
        if (ki > 0 && (kernel == dflt || (cs.sparse && cs.ctx != 32768) || (kernel != K::v2 && nh <= 16) ||
                       cs.qtok > 1))
          continue;
        p.kernel = kernel;
        p.splits = forced_splits > 0 ? forced_splits : mla_decode_splits(B, nh, p.max_keys, num_sms, kernel);
        p.partial_out = dev_alloc<float>(size_t(B * p.splits * nh * kMlaLatent));
        p.partial_lse = dev_alloc<float>(size_t(B * p.splits * nh));
        const double us = time_us([&] { CK(launch_mla_decode(p, nullptr)); }, flush);
        const double keys = double(B) * double(p.max_keys);
        const double row_bytes = f == MlaKvFormat::bf16 ? kMlaBf16RowBytes : kMlaFp8RowBytes;
        const double bytes =
            keys * (row_bytes + (cs.sparse ? 4 : 0)) + double(B * nh) * (kMlaDim + kMlaLatent) * 4;
        const double flops = keys * double(nh) * 2.0 * (kMlaDim + kMlaLatent);
        char name[160];
        std::snprintf(name, sizeof name, "%s kv=%s heads=%lld batch=%lld%s ctx=%lld kernel=%s splits=%d",
                      cs.sparse ? "sparse top-2048" : "dense", f == MlaKvFormat::bf16 ? "bf16" : "fp8",
                      (long long)nh, (long long)S,
                      cs.qtok > 1 ? (" q=" + std::to_string(cs.qtok)).c_str() : "", (long long)cs.ctx,
                      name_of_kernel(mla_decode_kernel(p)), p.splits);
        row(name, us, bytes, flops);
        CK(cudaFree(p.partial_out));
        CK(cudaFree(p.partial_lse));
      }
      CK(cudaFree(dq));
      CK(cudaFree(dpt));
      CK(cudaFree(dlen));
      CK(cudaFree(dsel));
      CK(cudaFree(dseq));
      CK(cudaFree(p.out));
    }
  }
  CK(cudaFree(cache_bf16));
  CK(cudaFree(cache_fp8));
}

const char* score_kernel_name(IndexerScoreKernel k) { return name(k).data(); }

// The indexer + top-2048 at batch B and context ctx over a bf16 or FP8 key cache. Bytes: the key cache
// rows read (bf16 256, FP8 132 per key), q, w and the output; the score and select times are measured
// apart (select = full - scores alone). Each name says which select path ran (row_fused: in the score
// kernel's last CTA of each row; row: a select kernel of one CTA per row; coop: the four passes in one
// cooperative launch of `grid` CTAs; passes: four launches), and the score kernel that ran (the default,
// select_indexer_score_kernel: v3, which runs bf16 keys as v2) with (FP8) v2's time for comparison.
void bench_indexer(void* flush) {
  header("### lightning indexer + top-2048 (32 heads x 128), one query row per request");
  std::mt19937_64 rng(2);
  const int64_t ih = 32, topk = 2048;
  for (IndexerKeyFormat f : {IndexerKeyFormat::bf16, IndexerKeyFormat::fp8_e4m3}) {
    const bool fp8 = f == IndexerKeyFormat::fp8_e4m3;
    for (int64_t B : {1, 8, 32, 64}) {
      for (int64_t ctx : {4096, 32768, 131072, 1048576}) {
        if (ctx > 131072 && B > 8) continue;
        const int64_t pages = ctx / kPage, slots = B * ctx;
        const size_t row_bytes = fp8 ? kIndexerFp8RowBytes : kIndexerDim * 2;
        void* cache = dev_alloc<unsigned char>(size_t(slots) * row_bytes);
        // Random keys: bf16 in [-1, 1), or e4m3 codes (no NaN: exponent < 15) with scales in [0.01, 0.02).
        std::vector<unsigned char> codes(size_t(kPage * 1024) * kIndexerDim * 2);
        if (fp8) {
          for (auto& x : codes) x = static_cast<unsigned char>(rng() & 0xf7u);
          fill_device(cache, size_t(slots) * kIndexerDim, codes);
          std::vector<float> sc(size_t(kPage * 1024));
          for (auto& x : sc) x = 0.01f + float(rng() % 1000) * 1e-5f;
          std::vector<unsigned char> scb(sc.size() * 4);
          std::memcpy(scb.data(), sc.data(), scb.size());
          fill_device(static_cast<char*>(cache) + slots * kIndexerDim, size_t(slots) * 4, scb);
        } else {
          for (size_t i = 0; i < codes.size(); i += 2) {
            const float v = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
            uint32_t u;
            std::memcpy(&u, &v, 4);
            codes[i] = static_cast<unsigned char>(u >> 16);
            codes[i + 1] = static_cast<unsigned char>(u >> 24);
          }
          fill_device(cache, size_t(slots) * kIndexerDim * 2, codes);
        }
        std::vector<int32_t> perm(static_cast<size_t>(B * pages)), len(static_cast<size_t>(B), int32_t(ctx));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<float> q(size_t(B * ih * kIndexerDim)), w(size_t(B * ih));
        for (auto& x : q) x = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
        for (auto& x : w) x = float(int64_t(rng() % 2001) - 1000) * 1e-3f;
        IndexerTopkParams p{};
        p.q = upload(q);
        p.w = upload(w);
        p.cache = cache;
        p.page_table = upload(perm);
        p.row_len = upload(len);
        p.scores = dev_alloc<float>(size_t(B * ctx));
        p.splits = indexer_select_splits(B, ctx, indexer_num_sms(), &p.split_len);
        uint32_t* work = dev_alloc<uint32_t>(size_t(indexer_workspace_words(B, p.splits)));
        p.rows = B;
        indexer_workspace_pointers(p, work);
        p.out = dev_alloc<int32_t>(size_t(B * topk));
        p.heads = ih;
        p.q_s0 = ih * kIndexerDim;
        p.q_s1 = kIndexerDim;
        p.w_s0 = ih;
        p.num_seqs = B;
        p.pt_cols = pages;
        p.pt_stride = pages;
        p.page_size = kPage;
        p.num_slots = slots;
        p.score_stride = ctx;
        p.out_stride = topk;
        p.out_k = topk;
        p.topk = topk;
        p.max_len = ctx;
        p.scale = 0.088f;
        p.weight_scale = 0.177f;
        p.key_format = f;
        p.scores_only = true;
        const double us_scores = time_us([&] { CK(launch_indexer_topk_fused(p, nullptr)); }, flush);
        p.score_kernel = IndexerScoreKernel::v2;  // FP8: v2 (f16 mma.sync) for comparison (bf16: the default)
        const double us_scores_v2 =
            fp8 ? time_us([&] { CK(launch_indexer_topk_fused(p, nullptr)); }, flush) : 0.0;
        p.score_kernel = IndexerScoreKernel::automatic;
        p.scores_only = false;
        const double bytes =
            double(slots) * double(row_bytes) + double(B * ih) * (kIndexerDim + 1) * 4 + double(B * topk) * 4;
        const double flops = double(slots) * double(ih) * kIndexerDim * 2;
        // The default select path, and for comparison the old one (four launches, or the row kernel).
        const std::vector<IndexerSelectPath> paths{
            IndexerSelectPath::automatic, p.splits > 1 ? IndexerSelectPath::passes : IndexerSelectPath::row};
        for (IndexerSelectPath path : paths) {
          p.select_path = path;
          const IndexerSelectPath ran = indexer_select_path(p);
          const double us = time_us([&] { CK(launch_indexer_topk_fused(p, nullptr)); }, flush);
          char grid[32] = "";
          if (ran == IndexerSelectPath::cooperative)
            std::snprintf(grid, sizeof grid, " grid=%lld", (long long)indexer_select_coop_grid(p));
          char v2_note[32] = "";
          if (fp8) std::snprintf(v2_note, sizeof v2_note, " [v2 %.1f us]", us_scores_v2);
          char name[224];
          std::snprintf(
              name, sizeof name,
              "indexer+top-k %s batch=%lld ctx=%lld select=%s%s (scores %s %.1f us%s, select %.1f us, "
              "%lld CTAs/row)",
              fp8 ? "fp8" : "bf16", (long long)B, (long long)ctx, indexer_select_path_name(ran), grid,
              score_kernel_name(indexer_score_kernel(p)), us_scores, v2_note, us - us_scores,
              (long long)p.splits);
          row(name, us, bytes, flops);
        }
        p.select_path = IndexerSelectPath::automatic;
        CK(cudaFree(cache));
        CK(cudaFree(const_cast<float*>(p.q)));
        CK(cudaFree(const_cast<float*>(p.w)));
        CK(cudaFree(const_cast<int32_t*>(p.page_table)));
        CK(cudaFree(const_cast<int32_t*>(p.row_len)));
        CK(cudaFree(p.scores));
        CK(cudaFree(work));
        CK(cudaFree(p.out));
      }
    }
  }
}

// ---- sparse prefill (issue 8): one request's chunk in the absorbed form and in the MHA form ----

namespace ko = dsaserve::kernels;
namespace dm = dsaserve::model;
using dsaserve::Device;
using dsaserve::DType;
using dsaserve::Tensor;

constexpr int64_t kLat = 512, kRopeDim = 64, kNopeDim = 192, kVDim = 256, kTopk = 2048;
constexpr double kMhaBudgetUs = 250e3;  // MHA runs estimated above this are not run whole (see below)
constexpr int64_t kProbeRows = 64;

Tensor rand_f32(const dsaserve::Shape& s, uint64_t seed, float scale) {
  return dsaserve::bench::rand_f32_gpu(s, seed, scale);
}

Tensor i32_dev(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::cuda);
}

// One run of fn() in microseconds (CUDA events).
template <class F>
double once_us(F&& fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  fn();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return double(ms) * 1000.0;
}

// time_us (median of 20 after 3 warm-ups, the L2 flushed before each); when one run takes over 20 ms,
// the median of 3 runs after that one instead (the table must stay well under a minute).
template <class F>
double time_adaptive_us(F&& fn, void* flush) {
  if (once_us(fn) <= 20e3) return time_us(fn, flush);
  std::vector<double> us;
  for (int i = 0; i < 3; ++i) {
    CK(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
    us.push_back(once_us(fn));
  }
  std::sort(us.begin(), us.end());
  return us[1];
}

// The DSA selection of a chunk as the forward passes it: row t (position ctx + t) attends 2048 distinct
// ascending positions of 0..ctx+t, one in each of 2048 equal spans; rows that see at most 2048 keys get
// all of them, padded with -1. Undefined when the request has at most 2048 keys (all of them, causally).
Tensor dsa_selection(int64_t ctx, int64_t T, std::mt19937_64& rng) {
  if (ctx + T <= kTopk) return Tensor();
  std::vector<int32_t> sel(size_t(T * kTopk), -1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = ctx + t + 1;
    int32_t* r = sel.data() + t * kTopk;
    if (v <= kTopk) {
      for (int64_t j = 0; j < v; ++j) r[j] = int32_t(j);
      continue;
    }
    for (int64_t j = 0; j < kTopk; ++j) r[j] = int32_t(j * v / kTopk + int64_t(rng() % uint64_t(v / kTopk)));
  }
  Tensor h = Tensor::empty({T, kTopk}, DType::i32);
  std::copy(sel.begin(), sel.end(), h.data<int32_t>());
  return h.to(Device::cuda);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// For each head count and (ctx, T): the absorbed form (absorb_q, mla_attention_rows over the chunk's rows,
// absorb_v into the layer's [T, nh, 256] output) and the MHA form (paged_gather of the request's latents,
// the kv_b_proj linear over all of them, attention_mha, copy_rows into the output), as
// model::Model::attention runs them for a one-request step (RoPE of q, the same in both, left out). The
// parts are timed apart: the GEMMs alone (absorb_q + absorb_v; paged_gather + linear), attention = whole -
// GEMMs. FLOPs as model::attention_form_flops counts them. The MHA attention kernel (attention.cu) is a
// plain stand-in: an MHA run estimated over 250 ms from its last 64 rows (the rows with the most keys,
// scaled by keys) is not run whole and its row says "est.". The expansion is also timed with an FP8
// kv_b_proj (the FP8 checkpoints' dtype; the FP8 GEMM), shown in the parts column and its own RESULT line.
void bench_prefill(void* flush) {
  ko::cuda::install_backend();
  std::printf(
      "\n### sparse prefill (issue 8): one request's chunk of T new tokens after ctx cached ones, top-2048, "
      "bf16 latent cache and kv_b_proj; absorbed = absorb_q + mla_attention_rows + absorb_v, MHA = "
      "paged_gather + kv_b linear + attention_mha + copy_rows\n");
  std::mt19937_64 rng(3);
  const int64_t t_max = 4096, ctx_max = 32768, pool_pages = (ctx_max + t_max) / kPage + 8;
  Tensor cache = mla_kv_cache_empty(pool_pages * kPage, MlaKvFormat::bf16);
  CK(cudaMemset(cache.raw_data(), 0x3c, cache.nbytes()));  // bf16 0.0115 everywhere
  std::vector<int32_t> perm(static_cast<size_t>(pool_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const double scale = 1.0 / std::sqrt(double(kNopeDim + kRopeDim));
  for (int64_t nh : {int64_t(64), int64_t(16)}) {
    Tensor w = Tensor::empty({nh * (kNopeDim + kVDim), kLat}, DType::bf16, Device::cuda);
    CK(cudaMemset(w.raw_data(), 0x3c, w.nbytes()));
    const ko::WeightRef kv_b{w, {}, 128, 128};
    // The same kv_b_proj as an FP8 checkpoint stores it (e4m3 1.0, block scales 1e-3): only the MHA
    // expansion is timed with it (absorb_q / absorb_v run on its dequantised bf16 copy, as above).
    Tensor w8 = Tensor::empty({nh * (kNopeDim + kVDim), kLat}, DType::f8e4m3fn, Device::cuda);
    CK(cudaMemset(w8.raw_data(), 0x38, w8.nbytes()));
    Tensor sc = Tensor::empty({(nh * (kNopeDim + kVDim) + 127) / 128, (kLat + 127) / 128}, DType::f32);
    std::fill(sc.data<float>(), sc.data<float>() + sc.numel(), 1e-3f);
    const ko::WeightRef kv_b8{w8, sc.to(Device::cuda), 128, 128};
    std::printf(
        "\n| heads | ctx | T | form | us (median) | parts us | TFLOP | TFLOP/s | / 797 peak | faster |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    std::fflush(stdout);
    const Tensor q_all = rand_f32({t_max, nh, kNopeDim + kRopeDim}, uint64_t(10 + nh), 1.0f);
    // Attention rates of requests with a selection and of dense ones (ctx + T <= 2048: no selection).
    std::vector<double> r_abs_attn, r_abs_gemm, r_mha_attn, r_expand, r_expand8, r_abs_dense;
    std::vector<std::pair<int64_t, double>> r_mha_dense;  // (new tokens, TFLOP/s) of the dense cases
    struct Case {
      dm::AttentionShape shape;
      bool mha_faster;
    };
    std::vector<Case> cases;
    for (int64_t ctx : {int64_t(0), int64_t(8192), ctx_max}) {
      for (int64_t T : {int64_t(256), int64_t(1024), t_max}) {
        const int64_t S = ctx + T, pages = (S + kPage - 1) / kPage;
        const Tensor pt = i32_dev(std::vector<int32_t>(perm.begin(), perm.begin() + pages));
        const ko::PagedSeq seq{cache, pt, kPage};
        std::vector<int32_t> seq_h(static_cast<size_t>(T), 0), len_h(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) len_h[size_t(t)] = int32_t(ctx + t + 1);
        ko::PagedRows rows;
        rows.cache = cache;
        rows.page_table = pt.view({1, pages});
        rows.page_size = kPage;
        rows.row_seq = i32_dev(seq_h);
        rows.row_len = i32_dev(len_h);
        rows.seq_host = seq_h;
        rows.len_host = len_h;
        rows.max_len = S;
        const Tensor sel = dsa_selection(ctx, T, rng);
        const Tensor q = q_all.slice(0, 0, T), q_nope = q.slice(2, 0, kNopeDim),
                     q_rope = q.slice(2, kNopeDim, kNopeDim + kRopeDim);
        Tensor attn = Tensor::empty({T, nh, kVDim}, DType::f32, Device::cuda);
        dm::AttentionShape shape;
        shape.tokens = T;
        shape.context = ctx;
        shape.heads = nh;
        shape.topk = kTopk;
        const dm::AttentionFormFlops fl = dm::attention_form_flops(shape);

        // Absorbed form, and its two GEMMs alone (absorb_v reads a zero out_lat of the same shape).
        Tensor lat_zero = Tensor::empty({T, nh, kLat}, DType::f32, Device::cuda);
        CK(cudaMemset(lat_zero.raw_data(), 0, lat_zero.nbytes()));
        const double abs_us = time_adaptive_us(
            [&] {
              const Tensor q_lat = ko::absorb_q(q_nope, kv_b);
              const Tensor out_lat = ko::mla_attention_rows(q_lat, q_rope, rows, sel, scale);
              ko::absorb_v(out_lat, kv_b, kVDim, attn);
            },
            flush);
        const double abs_gemm_us = time_adaptive_us(
            [&] {
              (void)ko::absorb_q(q_nope, kv_b);
              ko::absorb_v(lat_zero, kv_b, kVDim, attn);
            },
            flush);
        lat_zero = Tensor();

        // MHA form: the expansion alone, a probe of the attention's last rows, then the whole form when
        // the estimate allows.
        auto expand = [&](Tensor& lat, Tensor& kvx) {
          lat = ko::paged_gather(seq, S);                                                 // [S, 576]
          kvx = ko::linear(lat.slice(1, 0, kLat), kv_b).view({S, nh, kNopeDim + kVDim});  // [S, nh, 448]
        };
        const double expand_us = time_adaptive_us(
            [&] {
              Tensor lat, kvx;
              expand(lat, kvx);
            },
            flush);
        const double expand8_us = time_adaptive_us(
            [&] {
              const Tensor lat = ko::paged_gather(seq, S);
              (void)ko::linear(lat.slice(1, 0, kLat), kv_b8);
            },
            flush);
        double probe_attn_us = 0;
        const int64_t P = std::min(T, kProbeRows);
        dm::AttentionShape probe_shape = shape;
        probe_shape.tokens = P;
        probe_shape.context = ctx + T - P;
        {
          Tensor lat, kvx;
          expand(lat, kvx);
          auto probe = [&] {
            (void)ko::attention_mha(q.slice(0, T - P, T), kvx.slice(2, 0, kNopeDim),
                                    lat.slice(1, kLat, kLat + kRopeDim),
                                    kvx.slice(2, kNopeDim, kNopeDim + kVDim), ctx + T - P,
                                    sel.defined() ? sel.slice(0, T - P, T) : Tensor(), scale);
          };
          probe();
          CK(cudaDeviceSynchronize());
          probe_attn_us = once_us(probe);
        }
        const double est_attn_us =
            probe_attn_us * fl.mha_attn / dm::attention_form_flops(probe_shape).mha_attn;
        const bool estimated = expand_us + est_attn_us > kMhaBudgetUs;
        const double mha_us =
            estimated ? expand_us + est_attn_us
                      : time_adaptive_us(
                            [&] {
                              Tensor lat, kvx;
                              expand(lat, kvx);
                              const Tensor o = ko::attention_mha(
                                  q, kvx.slice(2, 0, kNopeDim), lat.slice(1, kLat, kLat + kRopeDim),
                                  kvx.slice(2, kNopeDim, kNopeDim + kVDim), ctx, sel, scale);
                              Tensor dst = attn.view({T * nh, kVDim});
                              ko::copy_rows(dst, o.view({T * nh, kVDim}));
                            },
                            flush);
        CK(cudaDeviceSynchronize());

        const double abs_attn_us = std::max(abs_us - abs_gemm_us, 1e-3),
                     mha_attn_us = std::max(mha_us - expand_us, 1e-3);
        (sel.defined() ? r_abs_attn : r_abs_dense).push_back(fl.absorbed_attn / (abs_attn_us * 1e6));
        r_abs_gemm.push_back(fl.absorb_gemm / (abs_gemm_us * 1e6));
        if (sel.defined())
          r_mha_attn.push_back(fl.mha_attn / (mha_attn_us * 1e6));
        else
          r_mha_dense.push_back({T, fl.mha_attn / (mha_attn_us * 1e6)});
        r_expand.push_back(fl.expand_gemm / (expand_us * 1e6));
        r_expand8.push_back(fl.expand_gemm / (expand8_us * 1e6));
        const bool mha_faster = mha_us < abs_us;
        cases.push_back({shape, mha_faster});
        auto print = [&](const char* form, double us, const std::string& parts, double flops, bool faster) {
          const double tflops = flops / (us * 1e-6) / 1e12;
          std::printf("| %lld | %lld | %lld | %s | %.1f | %s | %.3f | %.1f | %.3f | %s |\n", (long long)nh,
                      (long long)ctx, (long long)T, form, us, parts.c_str(), flops / 1e12, tflops,
                      tflops * 1e12 / kBf16, faster ? "yes" : "");
        };
        char parts[160];
        std::snprintf(parts, sizeof parts, "absorb GEMMs %.1f + attention %.1f", abs_gemm_us, abs_attn_us);
        print("absorbed", abs_us, parts, fl.absorbed(), !mha_faster);
        std::snprintf(parts, sizeof parts, "gather + kv_b %.1f (FP8 kv_b %.1f) + attention %.1f%s", expand_us,
                      expand8_us, mha_attn_us, estimated ? " (est. from its last 64 rows)" : "");
        print(estimated ? "MHA (est.)" : "MHA", mha_us, parts, fl.mha(), mha_faster);
        std::fflush(stdout);
      }
    }
    // The rates of this head class for model::AttentionFormRule (medians over the cases), and how often
    // the rule with them picks the form measured faster.
    dm::AttentionFormRates r;
    r.absorbed_attn = median(r_abs_attn);
    r.absorb_gemm = median(r_abs_gemm);
    r.mha_attn = median(r_mha_attn);
    r.expand_gemm = median(r_expand);
    r.absorbed_attn_dense = median(r_abs_dense);
    // One point per chunk size (the median of the cases of that size), ascending: RateByTokens' points.
    std::map<int64_t, std::vector<double>> by_tokens;
    for (const auto& [tokens, rate] : r_mha_dense) by_tokens[tokens].push_back(rate);
    std::string dense_pts;
    size_t np = 0;
    for (auto& [tokens, rates] : by_tokens) {
      if (np == size_t(dm::RateByTokens::kPoints)) break;
      r.mha_attn_dense.tokens[np] = tokens;
      r.mha_attn_dense.tflops[np] = median(rates);
      char pt[64];
      std::snprintf(pt, sizeof pt, "%s%lld: %.1f", np > 0 ? ", " : "", (long long)tokens,
                    r.mha_attn_dense.tflops[np]);
      dense_pts += pt;
      ++np;
    }
    dm::AttentionFormRule rule;
    (nh <= rule.narrow_max_heads ? rule.narrow : rule.wide) = r;
    int agree = 0;
    std::string wrong;
    for (const Case& c : cases) {
      const bool pick = dm::automatic_uses_mha(256, rule, c.shape);
      if (pick == c.mha_faster) {
        ++agree;
      } else {
        char w2[96];
        std::snprintf(w2, sizeof w2, " ctx=%lld,T=%lld", (long long)c.shape.context,
                      (long long)c.shape.tokens);
        wrong += w2;
      }
    }
    const char* cls = nh <= rule.narrow_max_heads ? "narrow" : "wide";
    std::printf(
        "\nRESULT form_rates heads=%lld (%s) absorbed_attn=%.1f absorb_gemm=%.1f mha_attn=%.1f "
        "expand_gemm=%.1f "
        "absorbed_attn_dense=%.1f mha_attn_dense (tokens: rate)={%s} TFLOP/s -> model.h "
        "AttentionFormRule::%s "
        "= {%.1f, %.1f, %.1f, %.1f, %.1f, {those points}}\n",
        (long long)nh, cls, r.absorbed_attn, r.absorb_gemm, r.mha_attn, r.expand_gemm, r.absorbed_attn_dense,
        dense_pts.c_str(), cls, r.absorbed_attn, r.absorb_gemm, r.mha_attn, r.expand_gemm,
        r.absorbed_attn_dense);
    std::printf(
        "RESULT form_rates heads=%lld expand_gemm with an FP8 kv_b_proj: %.1f TFLOP/s (for FP8 "
        "checkpoints)\n",
        (long long)nh, median(r_expand8));
    std::printf("RESULT form_rule heads=%lld picks the faster form in %d of %zu cases%s%s\n", (long long)nh,
                agree, cases.size(), wrong.empty() ? "" : "; not in:", wrong.c_str());
    std::fflush(stdout);
  }
}

// ---- dense MHA-form prefill (issue 16): the tensor-core kernel alone and the attention_mha operator ----

// One request's dense chunk (no selection: every row attends 0 .. ctx + t) at GLM-5.3 (192 + 64, 256) and
// DeepSeek-V3.2 (128 + 64, 128) head dims: `kernel` is mha_prefill over bf16 keys and values made ahead,
// `op` the attention_mha operator on the f32 expansion (as the model calls it: its bf16 copies of k_nope,
// k_rope and v included). FLOPs 2 (nope + rope + dv) per key, head and row, as attention_form_flops counts.
void bench_mha(void* flush) {
  ko::cuda::install_backend();
  std::printf(
      "\n### dense MHA-form prefill (issue 16): tensor-core kernel (bf16 mma.sync, f32 accumulation); "
      "op = attention_mha on f32 inputs (+ its bf16 copies)\n\n"
      "| dims | heads | ctx | T | kernel us | kernel TFLOP/s | / 797 peak | op us | op TFLOP/s |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  struct D {
    const char* name;
    int64_t nope, rope, dv;
  };
  for (const D d : {D{"glm-5.3", 192, 64, 256}, D{"deepseek-v3.2", 128, 64, 128}}) {
    const double scale = 1.0 / std::sqrt(double(d.nope + d.rope));
    std::vector<double> rates;
    for (int64_t nh : {int64_t(128), int64_t(64), int64_t(32), int64_t(16), int64_t(8)}) {
      for (const auto& [ctx, T] : {std::pair<int64_t, int64_t>{0, 4096}, {0, 1024}, {4096, 1024}, {0, 256}}) {
        const int64_t S = ctx + T;
        const Tensor q = rand_f32({T, nh, d.nope + d.rope}, uint64_t(100 + nh + T), 1.0f);
        const Tensor kvx = rand_f32({S, nh, d.nope + d.dv}, uint64_t(200 + nh + S), 1.0f);
        const Tensor lat = rand_f32({S, kLat + d.rope}, uint64_t(300 + S), 1.0f);
        const Tensor kn = kvx.slice(2, 0, d.nope), kr = lat.slice(1, kLat, kLat + d.rope),
                     v = kvx.slice(2, d.nope, d.nope + d.dv);
        const Tensor kn16 = ko::cuda::mha_bf16_copy(kn), kr16 = ko::cuda::mha_bf16_copy(kr),
                     v16 = ko::cuda::mha_bf16_copy(v);
        const double keys = double(T) * double(ctx) + double(T) * double(T + 1) / 2;
        const double flops = 2.0 * keys * double(nh) * double(d.nope + d.rope + d.dv);
        const double kernel_us = time_adaptive_us(
            [&] { (void)ko::cuda::mha_prefill(q, kn16, kr16, v16, ctx, scale, ko::cuda::op_stream()); },
            flush);
        const double op_us =
            time_adaptive_us([&] { (void)ko::attention_mha(q, kn, kr, v, ctx, Tensor(), scale); }, flush);
        CK(cudaDeviceSynchronize());
        const double k_tf = flops / (kernel_us * 1e-6) / 1e12, o_tf = flops / (op_us * 1e-6) / 1e12;
        if (T >= 1024) rates.push_back(o_tf);
        std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.3f | %.1f | %.1f |\n", d.name, (long long)nh,
                    (long long)ctx, (long long)T, kernel_us, k_tf, k_tf * 1e12 / kBf16, op_us, o_tf);
        std::fflush(stdout);
      }
    }
    std::printf("\nRESULT mha_prefill dims=%s op TFLOP/s median over heads 8-128, T >= 1024: %.1f\n", d.name,
                median(rates));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("attention_gpu_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("## attention_gpu_bench on %s (%d SMs); floor = max(bytes / 4.3 TB/s, FLOPs / 797 TFLOP/s)\n",
              prop.name, prop.multiProcessorCount);
  void* flush = dev_alloc<unsigned char>(kFlushBytes);
  // An argument picks one table: "indexer", "mla", "prefill" or "mha" (default: all); "mla HEADS BATCH" runs
  // only the MLA decode cases of that shape (for a profiler). Flags (anywhere): --mla-splits N, --pool-slots
  // N, --mla-v5-order early|late, --mla-head-groups apart|adjacent, --mla-kernel auto|v2|v5|v6
  // (MlaBenchFlags).
  std::vector<std::string> pos;
  MlaBenchFlags fl;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attention_gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mla-splits") {
      fl.forced_splits = std::atoi(value().c_str());
    } else if (a == "--pool-slots") {
      fl.pool_slots = std::atoll(value().c_str());
    } else if (a == "--mla-v5-order" || a == "--mla-kernel") {
      try {
        if (a == "--mla-kernel")
          fl.kernel = parse_mla_decode_kernel(value(), a);
        else
          fl.v5_order = parse_mla_v5_order(value(), a);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "attention_gpu_bench: %s\n", e.what());
        return 2;
      }
    } else if (a == "--mla-head-groups") {
      const std::string v = value();
      if (v != "apart" && v != "adjacent") {
        std::fprintf(stderr, "attention_gpu_bench: --mla-head-groups: %s is not apart or adjacent\n",
                     v.c_str());
        return 2;
      }
      fl.head_groups_adjacent = v == "adjacent";
    } else {
      pos.push_back(a);
    }
  }
  const std::string only = pos.size() > 0 ? pos[0] : "";
  fl.only_heads = pos.size() > 1 ? std::atoll(pos[1].c_str()) : 0;
  fl.only_batch = pos.size() > 2 ? std::atoll(pos[2].c_str()) : 0;
  if (only.empty() || only == "indexer") bench_indexer(flush);
  if (only.empty() || only == "mla") bench_mla(prop.multiProcessorCount, flush, fl);
  if (only.empty() || only == "prefill") bench_prefill(flush);
  if (only.empty() || only == "mha") bench_mha(flush);
  CK(cudaFree(flush));
  return 0;
}
