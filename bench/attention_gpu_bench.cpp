// attention_gpu_bench: the sm_90a attention-side kernels at GLM-5.3 shapes (576/512 latent, top-2048,
// 32 indexer heads of 128) and per-rank head counts, timed with CUDA events (median of 20 runs, the L2
// flushed before each), with bytes, FLOPs, the floor (bytes / 4.3 TB/s, FLOPs / 797 TFLOP/s) and the
// ratio floor / measured. Prints one Markdown table per kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/indexer_topk_params.h"
#include "kernels/cuda/mla_decode_params.h"

namespace {

using namespace dsaserve::kernels::cuda;

constexpr double kHbm = 4.3e12;   // device-to-device copy, bytes/s (docs/GPU.md)
constexpr double kBf16 = 797e12;  // dense bf16 GEMM, FLOP/s
constexpr int64_t kPage = 64;
constexpr size_t kFlushBytes = size_t(256) << 20;

#define CK(x)                                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (x);                                                                                 \
    if (e_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                       \
    }                                                                                                     \
  } while (0)

template <class T>
T* dev_alloc(size_t n) {
  void* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* p = dev_alloc<T>(v.size());
  CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Median time in microseconds of fn() over `reps` runs, each after an L2 flush.
template <class F>
double time_us(F&& fn, void* flush, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaMemsetAsync(flush, i & 0xff, kFlushBytes));
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1000.0;
}

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

void bench_mla(int num_sms, void* flush) {
  header("### sparse / dense MLA decode (absorbed, 576/512), one query token per request");
  const int64_t pool_slots = int64_t(4) << 20;  // 4M token slots shared by all requests
  void* cache_bf16 = dev_alloc<unsigned char>(size_t(pool_slots) * kMlaBf16RowBytes);
  void* cache_fp8 = dev_alloc<unsigned char>(size_t(pool_slots) * kMlaFp8RowBytes);
  CK(cudaMemset(cache_bf16, 0x3c,
                size_t(pool_slots) * kMlaBf16RowBytes));  // bf16 0.0115; fp8 1.5, scale 0.0115
  CK(cudaMemset(cache_fp8, 0x3c, size_t(pool_slots) * kMlaFp8RowBytes));
  std::mt19937_64 rng(1);
  const int64_t topk = 2048;
  struct Case {
    int64_t heads, batch, ctx;
    bool sparse;
  };
  std::vector<Case> cases;
  for (int64_t h : {64, 16, 8})
    for (int64_t b : {1, 32, 128})
      for (int64_t c : {4096, 32768, 131072}) cases.push_back({h, b, c, true});
  for (int64_t h : {64, 8})
    for (int64_t b : {1, 32, 128}) cases.push_back({h, b, 2048, false});
  for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
    for (const Case& cs : cases) {
      const int64_t B = cs.batch, nh = cs.heads, pages = (cs.ctx + kPage - 1) / kPage;
      std::vector<int32_t> pt(size_t(B * pages)), len(size_t(B), int32_t(cs.ctx)), sel(size_t(B * topk));
      for (auto& x : pt) x = int32_t(rng() % uint64_t(pool_slots / kPage));
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
      int32_t *dpt = upload(pt), *dlen = upload(len), *dsel = upload(sel);
      MlaDecodeParams p{};
      p.q_lat = dq;
      p.q_rope = dq + kMlaLatent;
      p.ql_s0 = p.qr_s0 = nh * kMlaDim;
      p.ql_s1 = p.qr_s1 = kMlaDim;
      p.cache = f == MlaKvFormat::bf16 ? cache_bf16 : cache_fp8;
      p.page_table = dpt;
      p.row_len = dlen;
      p.sel = cs.sparse ? dsel : nullptr;
      p.sel_k = topk;
      p.sel_stride = topk;
      p.rows = B;
      p.heads = nh;
      p.num_seqs = B;
      p.pt_cols = pages;
      p.pt_stride = pages;
      p.page_size = kPage;
      p.num_slots = pool_slots;
      p.max_keys = cs.sparse ? topk : cs.ctx;
      p.scale = 0.0625f;
      p.format = f;
      p.out = dev_alloc<float>(size_t(B * nh * kMlaLatent));
      // The default kernel for the head count, and (at one context per shape) the others to compare (v3
      // and v4, 64 heads a block, only above 16 heads).
      const int dflt = mla_decode_kernel(nh, 0);
      const int kernels[5] = {dflt, 1, 2, 3, 4};
      for (int ki = 0; ki < 5; ++ki) {
        const int kernel = kernels[ki];
        if (ki > 0 && (kernel == dflt || (cs.sparse && cs.ctx != 32768) || (kernel >= 3 && nh <= 16)))
          continue;
        p.kernel = kernel;
        p.splits = mla_decode_splits(B, nh, p.max_keys, num_sms, kernel);
        p.partial_out = dev_alloc<float>(size_t(B * p.splits * nh * kMlaLatent));
        p.partial_lse = dev_alloc<float>(size_t(B * p.splits * nh));
        const double us = time_us([&] { CK(launch_mla_decode(p, nullptr)); }, flush);
        const double keys = double(B) * double(p.max_keys);
        const double row_bytes = f == MlaKvFormat::bf16 ? kMlaBf16RowBytes : kMlaFp8RowBytes;
        const double bytes =
            keys * (row_bytes + (cs.sparse ? 4 : 0)) + double(B * nh) * (kMlaDim + kMlaLatent) * 4;
        const double flops = keys * double(nh) * 2.0 * (kMlaDim + kMlaLatent);
        char name[160];
        std::snprintf(name, sizeof name, "%s kv=%s heads=%lld batch=%lld ctx=%lld kernel=v%d splits=%d",
                      cs.sparse ? "sparse top-2048" : "dense", f == MlaKvFormat::bf16 ? "bf16" : "fp8",
                      (long long)nh, (long long)B, (long long)cs.ctx, kernel, p.splits);
        row(name, us, bytes, flops);
        CK(cudaFree(p.partial_out));
        CK(cudaFree(p.partial_lse));
      }
      CK(cudaFree(dq));
      CK(cudaFree(dpt));
      CK(cudaFree(dlen));
      CK(cudaFree(dsel));
      CK(cudaFree(p.out));
    }
  }
  CK(cudaFree(cache_bf16));
  CK(cudaFree(cache_fp8));
}

// Fills n bytes at dst with `pattern` repeated (one upload, then device-to-device doubling).
void fill_device(void* dst, size_t n, const std::vector<unsigned char>& pattern) {
  const size_t first = std::min(n, pattern.size());
  CK(cudaMemcpy(dst, pattern.data(), first, cudaMemcpyHostToDevice));
  for (size_t done = first; done < n;) {
    const size_t c = std::min(done, n - done);
    CK(cudaMemcpy(static_cast<char*>(dst) + done, dst, c, cudaMemcpyDeviceToDevice));
    done += c;
  }
}

// The indexer + top-2048 at batch B and context ctx over a bf16 or FP8 key cache. Bytes: the key cache
// rows read (bf16 256, FP8 132 per key), q, w and the output; the score and select times are measured
// apart (select = full - scores alone). Each name says which select path ran (row_fused: in the score
// kernel's last CTA of each row; row: a select kernel of one CTA per row; coop: the four passes in one
// cooperative launch of `grid` CTAs; passes: four launches).
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
        p.rows = B;
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
          char name[224];
          std::snprintf(
              name, sizeof name,
              "indexer+top-k %s batch=%lld ctx=%lld select=%s%s (scores %.1f us, select %.1f us, %lld "
              "CTAs/row)",
              fp8 ? "fp8" : "bf16", (long long)B, (long long)ctx, indexer_select_path_name(ran), grid,
              us_scores, us - us_scores, (long long)p.splits);
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
  // An argument picks one table: "indexer" or "mla" (default: both).
  const std::string only = argc > 1 ? argv[1] : "";
  if (only.empty() || only == "indexer") bench_indexer(flush);
  if (only.empty() || only == "mla") bench_mla(prop.multiProcessorCount, flush);
  CK(cudaFree(flush));
  return 0;
}
