// flashmla_peer: a benchmark peer for issue 16 (bench/peer/README.md). It times FlashMLA's SM90 kernels
// (github.com/deepseek-ai/FlashMLA, MIT; staged into .peer/ by scripts/stage_flashmla.sh, never tracked
// and never linked into dsaserve) at the attention shapes of bench/attention_gpu_bench.cpp, with its
// method: CUDA events around each run, the median of 20 runs after 3 warm-ups, a 256 MiB memset before
// each run to flush L2, a paged KV pool (page size 64) of 4M token slots with each request's pages drawn
// at random from it, top-2048 selections of one distinct position in each of 2048 equal spans of the
// request's context, one query token per request unless q=2 is named.
//
// This file is ours: it only includes FlashMLA's parameter structs and kernel launcher declarations and
// fills them the way FlashMLA's own torch front end (csrc/api/*.h) does, without torch. What is timed:
//   sparse-fp8   the FP8 sparse decode kernel ("V32" 656-byte KV rows) + the split-KV combine kernel; the
//                scheduler-metadata kernel runs once per case outside the timed region (as a server runs
//                it once per batch and reuses it for every layer); --with-meta adds a row that times it too.
//   sparse-bf16  bf16 sparse decode the way SGLang's "flashmla_sparse" backend does it: FlashMLA's sparse
//                prefill kernel with each decode query row as one s_q row and the selection mapped to
//                flat indices into the bf16 pool (one kernel, no split-KV).
//   dense        the dense bf16 decode kernel over the block table + the combine kernel (metadata outside).
//   prefill      the sparse prefill kernel over one request's T = 4096 new tokens after ctx cached ones
//                (rows that see at most 2048 keys get all of them, the rest of the row -1).
// FLOPs: 2 * heads * (576 + 512) per key and query row. Bytes: the KV rows the keys read (656 B FP8, 1152 B
// bf16), 4 B per selected index (as attention_gpu_bench counts them), q (bf16, 576 per head and row) and the
// output (bf16, 512 per head and row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

// FlashMLA (from .peer/flashmla/csrc, on the include path of scripts/stage_flashmla.sh).
#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "sm90/prefill/sparse/phase1.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

// Ours: the timing method and allocation helpers attention_gpu_bench uses.
#include "flushed_timing.h"

namespace {

using namespace dsaserve::bench;

constexpr int kPage = 64;
constexpr int kDqk = 576, kDv = 512, kTopk = 2048;
constexpr int kFp8RowBytes = 656;        // 512 e4m3 codes, 4 f32 scales (one per 128), 64 bf16 rope
constexpr int kBf16RowBytes = kDqk * 2;  // 1152
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kFp8RowBytes == kFp8MlaRowBytes, "flushed_timing.h's FP8 rows");
// FlashMLA's decode scheduler constants for SM90 (csrc/api/sparse_decode.h / dense_decode.h): 64 keys a
// block, 5 blocks of fixed cost per request.
constexpr int kSchedBlock = 64, kSchedOverhead = 5;

float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

float e4m3_value(unsigned char b) {  // no NaN codes here (the pool's exponents stay below 15)
  const int e = (b >> 3) & 15, m = b & 7;
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return (b & 0x80u) ? -v : v;
}

void header(const char* title) {
  std::printf("\n%s\n\n| case | us | TFLOP/s | GB/s |\n| --- | --- | --- | --- |\n", title);
}

void row(const std::string& name, double us, double bytes, double flops) {
  std::printf("| %s | %.1f | %.1f | %.0f |\n", name.c_str(), us, flops / (us * 1e-6) / 1e12,
              bytes / (us * 1e-6) / 1e9);
  std::fflush(stdout);
}

struct Flags {
  int64_t pool_slots = int64_t(4) << 20;  // --pool-slots N (token slots of each KV pool)
  int only_heads = 0, only_batch = 0;     // --heads H / --batch B: just those cases
  bool with_meta = false;                 // --with-meta: also time decode with the scheduler kernel
};

// The shared KV pools (the FP8 one in FlashMLA's 656-byte layout, the bf16 one 576 bf16 a token), filled
// with random valid data: e4m3 codes without NaN, scales in [0.01, 0.02), bf16 values in [-1, 1).
struct Pools {
  int64_t slots = 0, pages = 0;
  unsigned char* fp8 = nullptr;
  uint16_t* bf16 = nullptr;
  std::vector<unsigned char> fp8_rows;  // host copies of the repeated rows, for the output check
  std::vector<uint16_t> bf16_rows;
};

Pools make_pools(int64_t slots, std::mt19937_64& rng) {
  Pools p;
  p.pages = std::max<int64_t>(1, slots / kPage);
  p.slots = p.pages * kPage;
  p.fp8 = dev_alloc<unsigned char>(size_t(p.slots) * kFp8RowBytes);
  p.bf16 = dev_alloc<uint16_t>(size_t(p.slots) * kDqk);
  std::vector<unsigned char> pat = random_fp8_mla_rows(rng);
  fill_device(p.fp8, size_t(p.slots) * kFp8RowBytes, pat);
  const std::vector<unsigned char> patb = random_bf16_rows(rng, kDqk);
  fill_device(p.bf16, size_t(p.slots) * kBf16RowBytes, patb);
  p.fp8_rows = std::move(pat);
  p.bf16_rows.resize(patb.size() / 2);
  std::memcpy(p.bf16_rows.data(), patb.data(), patb.size());
  return p;
}

uint16_t* random_q(int64_t n, std::mt19937_64& rng, std::vector<uint16_t>& q) {
  q.resize(static_cast<size_t>(n));
  for (auto& x : q) x = bf16_bits(float(int64_t(rng() % 2001) - 1000) * 1e-3f);
  return upload(q);
}

// The K row (576 floats; V is its first 512) a slot of each pool holds, as the kernels dequantize it: FP8
// codes times the f32 scale of their 128-value group, then the bf16 rope.
void fp8_key(const Pools& p, int64_t slot, float* k) {
  const unsigned char* x = p.fp8_rows.data() + size_t(slot % kPatternRows) * kFp8RowBytes;
  float sc[4];
  std::memcpy(sc, x + 512, 16);
  for (int i = 0; i < 512; ++i) k[i] = e4m3_value(x[i]) * sc[i / 128];
  for (int i = 0; i < 64; ++i) {
    uint16_t h;
    std::memcpy(&h, x + 528 + 2 * i, 2);
    k[512 + i] = bf16_value(h);
  }
}

void bf16_key(const Pools& p, int64_t slot, float* k) {
  const uint16_t* x = p.bf16_rows.data() + size_t(slot % kPatternRows) * kDqk;
  for (int i = 0; i < kDqk; ++i) k[i] = bf16_value(x[i]);
}

// The output check: a timing only means something if the kernels computed the attention asked for, and a
// wrong stride, index form or row layout would still run (and time) without an error. For a query row, the
// host computes softmax(q K^T / sqrt(576)) V over the row's keys for heads 0, h/2 and h-1 and compares with
// the GPU's bf16 output (copied back after the timed runs, which all write the same result).
int g_checked = 0, g_mismatched = 0;

struct Check {
  double err = 0, ref = 0;  // max |gpu - host| and max |host| over the rows and heads checked
};

void check_row(const std::vector<uint16_t>& q_host, const uint16_t* out_dev, int64_t row, int heads,
               const std::vector<int64_t>& slots, const std::function<void(int64_t, float*)>& key,
               Check& ck) {
  std::vector<uint16_t> o(size_t(heads) * kDv);
  CK(cudaMemcpy(o.data(), out_dev + size_t(row) * heads * kDv, o.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> k(slots.size() * kDqk);
  for (size_t j = 0; j < slots.size(); ++j) key(slots[j], k.data() + j * kDqk);
  const double scale = 1.0 / std::sqrt(double(kDqk));
  std::vector<double> s(slots.size()), acc(kDv);
  for (int h : {0, heads / 2, heads - 1}) {
    const uint16_t* q = q_host.data() + (size_t(row) * heads + h) * kDqk;
    double mx = -1e300, sum = 0;
    for (size_t j = 0; j < slots.size(); ++j) {
      double d = 0;
      for (int i = 0; i < kDqk; ++i) d += double(bf16_value(q[i])) * k[j * kDqk + i];
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (size_t j = 0; j < slots.size(); ++j) {
      const double w = std::exp(s[j] - mx);
      sum += w;
      for (int i = 0; i < kDv; ++i) acc[i] += w * k[j * kDqk + i];
    }
    for (int i = 0; i < kDv; ++i) {
      const double r = acc[i] / sum;
      ck.ref = std::max(ck.ref, std::fabs(r));
      ck.err = std::max(ck.err, std::fabs(r - double(bf16_value(o[size_t(h) * kDv + i]))));
    }
  }
}

// bf16 rounding of K, P and O keeps the error near 1e-3 of the output's scale; a wrong key, scale or row
// would be off by the output's own size.
void report_check(const std::string& name, const Check& ck) {
  ++g_checked;
  if (ck.err <= 2e-3 + 0.02 * ck.ref) return;
  ++g_mismatched;
  std::fprintf(stderr,
               "flashmla_peer: %s: output differs from the host reference (max |err| %.3g, max |ref| %.3g)\n",
               name.c_str(), ck.err, ck.ref);
}

// The slots a row of flat indices selects (-1: none).
std::vector<int64_t> row_slots(const std::vector<int32_t>& flat, int64_t row) {
  std::vector<int64_t> v;
  for (int j = 0; j < kTopk; ++j)
    if (flat[size_t(row) * kTopk + j] >= 0) v.push_back(flat[size_t(row) * kTopk + j]);
  return v;
}

// One decode case as attention_gpu_bench's MLA table names it.
struct Case {
  int heads, batch, ctx, qtok = 1;
  // sparse-fp8 with qtok > 1: pass the batch * qtok query rows as that many requests of one token each
  // (SGLang's flashmla_kv form for a verify: its q view and metadata take one token per row), instead of
  // FlashMLA's s_q = qtok form. Same indices, q and output memory; only b, s_q and the split differ.
  bool rows_as_requests = false;
};

// Page table of `batch` requests of `ctx` tokens (random pages of the pool, as attention_gpu_bench draws
// them) and, per query row, 2048 distinct ascending positions (one in each of 2048 equal spans of the
// context) mapped through the page table to flat slots (page * 64 + offset), FlashMLA's index form.
struct Selection {
  std::vector<int32_t> pt;    // [batch, pages]
  std::vector<int32_t> flat;  // [batch * qtok, 2048]
  int pages = 0;
};

Selection make_selection(const Case& c, const Pools& pools, std::mt19937_64& rng) {
  Selection s;
  s.pages = (c.ctx + kPage - 1) / kPage;
  s.pt.resize(size_t(c.batch) * s.pages);
  for (auto& x : s.pt) x = int32_t(rng() % uint64_t(pools.pages));
  const int rows = c.batch * c.qtok, span = std::max(1, c.ctx / kTopk);
  s.flat.resize(size_t(rows) * kTopk);
  for (int r = 0; r < rows; ++r) {
    const int req = r / c.qtok;
    for (int j = 0; j < kTopk; ++j) {
      const int64_t pos = int64_t(j) * c.ctx / kTopk + int64_t(rng() % uint64_t(span));
      s.flat[size_t(r) * kTopk + j] =
          s.pt[size_t(req) * s.pages + size_t(pos / kPage)] * kPage + int32_t(pos % kPage);
    }
  }
  return s;
}

std::string case_name(const char* what, const Case& c) {
  char b[160];
  std::snprintf(b, sizeof b, "%s heads=%d batch=%d%s ctx=%d", what, c.heads, c.batch,
                c.qtok > 1 ? (" q=" + std::to_string(c.qtok)).c_str() : "", c.ctx);
  return b;
}

bool wanted(const Case& c, const Flags& fl) {
  return (fl.only_heads <= 0 || c.heads == fl.only_heads) && (fl.only_batch <= 0 || c.batch == fl.only_batch);
}

// The decode cases of attention_gpu_bench's MLA table that FlashMLA's kernels take (64 or 128 heads).
std::vector<Case> sparse_cases() {
  std::vector<Case> v;
  for (int b : {1, 32, 128})
    for (int ctx : {4096, 32768, 131072}) v.push_back({64, b, ctx});
  for (int b : {1, 32, 128}) v.push_back({128, b, 32768});  // DeepSeek-V3.2's heads
  for (int h : {128, 64}) {                                 // two query tokens per request
    v.push_back({h, 128, 32768, 2});
    v.push_back({h, 128, 32768, 2, true});
  }
  return v;
}

// ---- sparse FP8 decode (FlashMLA's sparse_decode_fwd on SM90, "V32" KV layout) ----
void bench_sparse_fp8(const Pools& pools, int num_sms, void* flush, const Flags& fl, std::mt19937_64& rng) {
  header(
      "### FlashMLA sparse top-2048 decode, FP8 KV (656 B rows), SM90 kernel + split-KV combine "
      "(scheduler metadata outside the timed region)");
  for (const Case& c : sparse_cases()) {
    if (!wanted(c, fl)) continue;
    const int b = c.rows_as_requests ? c.batch * c.qtok : c.batch, s_q = c.rows_as_requests ? 1 : c.qtok;
    const int h_q = c.heads;
    const Selection sel = make_selection(c, pools, rng);
    std::vector<uint16_t> q_host;
    uint16_t* q = random_q(int64_t(b) * s_q * h_q * kDqk, rng, q_host);
    int32_t* idx = upload(sel.flat);
    // FlashMLA's SM90 decode split: max(SMs / s_q / (h_q / 64), 1) partitions of the work.
    const int num_sm_parts = std::max(num_sms / s_q / (h_q / 64), 1);
    const int total_splits = b + num_sm_parts;
    auto* out = dev_alloc<uint16_t>(size_t(b) * s_q * h_q * kDv);
    auto* lse = dev_alloc<float>(size_t(b) * s_q * h_q);
    auto* o_acc = dev_alloc<float>(size_t(total_splits) * s_q * h_q * kDv);
    auto* lse_acc = dev_alloc<float>(size_t(total_splits) * s_q * h_q);
    auto* meta = dev_alloc<DecodingSchedMeta>(size_t(num_sm_parts));
    auto* nsplits = dev_alloc<int>(size_t(b) + 1);

    GetDecodeSchedMetaParams mp{};
    mp.b = b;
    mp.s_q = s_q;
    mp.block_size_n = kSchedBlock;
    mp.fixed_overhead_num_blocks = kSchedOverhead;
    mp.topk = kTopk;
    mp.extra_topk = 0;
    mp.topk_length = nullptr;
    mp.extra_topk_length = nullptr;
    mp.seqlens_k_ptr = nullptr;
    mp.tile_scheduler_metadata_ptr = meta;
    mp.num_splits_ptr = nsplits;
    mp.num_sm_parts = num_sm_parts;
    mp.stream = nullptr;

    SparseAttnDecodeParams p{};
    p.b = b;
    p.s_q = s_q;
    p.h_q = h_q;
    p.h_kv = 1;
    p.d_qk = kDqk;
    p.d_v = kDv;
    p.sm_scale = 1.0f / std::sqrt(float(kDqk));
    p.sm_scale_div_log2 = p.sm_scale * kLog2e;
    p.num_blocks = int(pools.pages);
    p.page_block_size = kPage;
    p.topk = kTopk;
    p.model_type = ModelType::V32;
    p.q = reinterpret_cast<cutlass::bfloat16_t*>(q);
    p.kv = reinterpret_cast<cutlass::bfloat16_t*>(pools.fp8);  // FlashMLA reads it as bytes
    p.indices = idx;
    p.topk_length = nullptr;
    p.attn_sink = nullptr;
    p.lse = lse;
    p.out = reinterpret_cast<cutlass::bfloat16_t*>(out);
    p.stride_q_b = s_q * h_q * kDqk;
    p.stride_q_s_q = h_q * kDqk;
    p.stride_q_h_q = kDqk;
    p.stride_kv_block = kPage * kFp8RowBytes;  // bytes (the cache is a byte tensor)
    p.stride_kv_row = kFp8RowBytes;
    p.stride_indices_b = s_q * kTopk;
    p.stride_indices_s_q = kTopk;
    p.stride_lse_b = s_q * h_q;
    p.stride_lse_s_q = h_q;
    p.stride_o_b = s_q * h_q * kDv;
    p.stride_o_s_q = h_q * kDv;
    p.stride_o_h_q = kDv;
    p.stream = nullptr;
    p.lse_accum = lse_acc;
    p.o_accum = o_acc;
    p.stride_lse_accum_split = s_q * h_q;
    p.stride_lse_accum_s_q = h_q;
    p.stride_o_accum_split = s_q * h_q * kDv;
    p.stride_o_accum_s_q = h_q * kDv;
    p.stride_o_accum_h_q = kDv;
    p.tile_scheduler_metadata_ptr = meta;
    p.num_splits_ptr = nsplits;
    p.num_sm_parts = num_sm_parts;

    CombineParams cp{};
    cp.b = b;
    cp.s_q = s_q;
    cp.h_q = h_q;
    cp.d_v = kDv;
    cp.lse = lse;
    cp.out = out;
    cp.stride_lse_b = p.stride_lse_b;
    cp.stride_lse_s_q = p.stride_lse_s_q;
    cp.stride_o_b = p.stride_o_b;
    cp.stride_o_s_q = p.stride_o_s_q;
    cp.stride_o_h_q = p.stride_o_h_q;
    cp.lse_accum = lse_acc;
    cp.o_accum = o_acc;
    cp.stride_lse_accum_split = p.stride_lse_accum_split;
    cp.stride_lse_accum_s_q = p.stride_lse_accum_s_q;
    cp.stride_o_accum_split = p.stride_o_accum_split;
    cp.stride_o_accum_s_q = p.stride_o_accum_s_q;
    cp.stride_o_accum_h_q = p.stride_o_accum_h_q;
    cp.tile_scheduler_metadata_ptr = meta;
    cp.num_splits_ptr = nsplits;
    cp.num_sm_parts = num_sm_parts;
    cp.attn_sink = nullptr;
    cp.stream = nullptr;

    auto kernel = [&] {
      if (h_q == 64)
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(p);
      else
        sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(p);
      smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(cp);
    };
    smxx::decode::run_get_decoding_sched_meta_kernel(mp);
    CK(cudaDeviceSynchronize());
    const double keys = double(b) * s_q * kTopk;
    const double bytes = keys * (kFp8RowBytes + 4) + double(b) * s_q * h_q * (kDqk + kDv) * 2;
    const double flops = keys * h_q * 2.0 * (kDqk + kDv);
    char tail[96];
    std::snprintf(tail, sizeof tail, "%s sm_parts=%d",
                  c.rows_as_requests ? " (as b*q requests of s_q=1: SGLang's form)" : "", num_sm_parts);
    row(case_name("flashmla sparse top-2048 kv=fp8", c) + tail, time_us(kernel, flush), bytes, flops);
    {
      Check ck;
      const auto key = [&](int64_t slot, float* k) { fp8_key(pools, slot, k); };
      for (int64_t r : {int64_t(0), int64_t(b) * s_q - 1})
        check_row(q_host, out, r, h_q, row_slots(sel.flat, r), key, ck);
      report_check(case_name("sparse-fp8", c) + tail, ck);
    }
    if (fl.with_meta)
      row(case_name("flashmla sparse top-2048 kv=fp8", c) + tail + " +metadata",
          time_us(
              [&] {
                smxx::decode::run_get_decoding_sched_meta_kernel(mp);
                kernel();
              },
              flush),
          bytes, flops);
    for (void* x : {(void*)q, (void*)idx, (void*)out, (void*)lse, (void*)o_acc, (void*)lse_acc, (void*)meta,
                    (void*)nsplits})
      CK(cudaFree(x));
  }
}

// FlashMLA's sparse prefill kernel (sparse_prefill_fwd on SM90) over `rows` query rows and flat indices
// into the bf16 pool; returns its time.
struct PrefillRun {
  SparseAttnFwdParams p{};
  void* bufs[6] = {};
  std::vector<uint16_t> q_host;
};

PrefillRun make_prefill(int rows, int h_q, const Pools& pools, const std::vector<int32_t>& flat, int num_sms,
                        std::mt19937_64& rng) {
  PrefillRun r;
  uint16_t* q = random_q(int64_t(rows) * h_q * kDqk, rng, r.q_host);
  int32_t* idx = upload(flat);
  auto* out = dev_alloc<uint16_t>(size_t(rows) * h_q * kDv);
  auto* max_logits = dev_alloc<float>(size_t(rows) * h_q);
  auto* lse = dev_alloc<float>(size_t(rows) * h_q);
  SparseAttnFwdParams& p = r.p;
  p.s_q = rows;
  p.s_kv = int(pools.slots);
  p.h_q = h_q;
  p.h_kv = 1;
  p.d_qk = kDqk;
  p.d_v = kDv;
  p.topk = kTopk;
  p.sm_scale = 1.0f / std::sqrt(float(kDqk));
  p.sm_scale_div_log2 = p.sm_scale * kLog2e;
  p.q = reinterpret_cast<cutlass::bfloat16_t*>(q);
  p.kv = reinterpret_cast<cutlass::bfloat16_t*>(pools.bf16);
  p.indices = idx;
  p.attn_sink = nullptr;
  p.topk_length = nullptr;
  p.stride_q_s_q = h_q * kDqk;
  p.stride_q_h_q = kDqk;
  p.stride_kv_s_kv = kDqk;  // elements
  p.stride_kv_h_kv = kDqk;
  p.stride_indices_s_q = kTopk;
  p.stride_indices_h_kv = kTopk;
  p.out = reinterpret_cast<cutlass::bfloat16_t*>(out);
  p.max_logits = max_logits;
  p.lse = lse;
  p.num_sm = num_sms;
  p.stream = nullptr;
  r.bufs[0] = q;
  r.bufs[1] = idx;
  r.bufs[2] = out;
  r.bufs[3] = max_logits;
  r.bufs[4] = lse;
  return r;
}

// The prefill kernel's output check: its first and last query rows.
void check_prefill(const PrefillRun& r, const Pools& pools, const std::vector<int32_t>& flat, int rows,
                   int h_q, const std::string& name) {
  Check ck;
  const auto key = [&](int64_t slot, float* k) { bf16_key(pools, slot, k); };
  for (int64_t t : {int64_t(0), int64_t(rows) - 1})
    check_row(r.q_host, static_cast<const uint16_t*>(r.bufs[2]), t, h_q, row_slots(flat, t), key, ck);
  report_check(name, ck);
}

void free_prefill(PrefillRun& r) {
  for (void* x : r.bufs)
    if (x) CK(cudaFree(x));
}

// ---- sparse bf16 decode through the sparse prefill kernel (SGLang's "flashmla_sparse" decode) ----
void bench_sparse_bf16(const Pools& pools, int num_sms, void* flush, const Flags& fl, std::mt19937_64& rng) {
  header(
      "### FlashMLA sparse top-2048 decode, bf16 KV, through the sparse prefill kernel (each query row one "
      "s_q row, flat indices)");
  for (const Case& c : sparse_cases()) {
    if (!wanted(c, fl) || c.rows_as_requests) continue;  // the prefill kernel takes rows either way
    const Selection sel = make_selection(c, pools, rng);
    const int rows = c.batch * c.qtok;
    PrefillRun r = make_prefill(rows, c.heads, pools, sel.flat, num_sms, rng);
    const double keys = double(rows) * kTopk;
    const double bytes = keys * (kBf16RowBytes + 4) + double(rows) * c.heads * (kDqk + kDv) * 2;
    const double flops = keys * c.heads * 2.0 * (kDqk + kDv);
    row(case_name("flashmla sparse top-2048 kv=bf16 (prefill kernel)", c),
        time_us([&] { sm90::fwd::run_fwd_phase1_kernel<kDqk, false>(r.p); }, flush), bytes, flops);
    check_prefill(r, pools, sel.flat, rows, c.heads, case_name("sparse-bf16", c));
    free_prefill(r);
  }
}

// ---- dense bf16 decode (FlashMLA's dense_decode_fwd on SM90) ----
void bench_dense(const Pools& pools, int num_sms, void* flush, const Flags& fl, std::mt19937_64& rng) {
  header(
      "### FlashMLA dense decode, bf16 KV, SM90 kernel + split-KV combine (scheduler metadata outside the "
      "timed region)");
  std::vector<Case> cases;
  for (int b : {1, 32, 128}) cases.push_back({64, b, 2048});
  cases.push_back({64, 128, 8192});
  for (const Case& c : cases) {
    if (!wanted(c, fl)) continue;
    const int b = c.batch, h_q = c.heads, s_q = 1, h_k = 1, q_per_hk = s_q * h_q;
    const Selection sel = make_selection(c, pools, rng);
    std::vector<uint16_t> q_host;
    uint16_t* q = random_q(int64_t(b) * h_q * kDqk, rng, q_host);
    int32_t* bt = upload(sel.pt);
    int32_t* seqlens = upload(std::vector<int32_t>(size_t(b), c.ctx));
    // FlashMLA's dense split: max(SMs / h_k / ceil(s_q * h_q / h_k / 64), 1) partitions.
    const int num_sm_parts = std::max(num_sms / h_k / ((q_per_hk + 63) / 64), 1);
    const int total_splits = b + num_sm_parts;
    auto* out = dev_alloc<uint16_t>(size_t(b) * h_q * kDv);
    auto* lse = dev_alloc<float>(size_t(b) * h_q);
    auto* o_acc = dev_alloc<float>(size_t(total_splits) * h_q * kDv);
    auto* lse_acc = dev_alloc<float>(size_t(total_splits) * h_q);
    auto* meta = dev_alloc<DecodingSchedMeta>(size_t(num_sm_parts));
    auto* nsplits = dev_alloc<int>(size_t(b) + 1);

    GetDecodeSchedMetaParams mp{};
    mp.b = b;
    mp.s_q = s_q;
    mp.block_size_n = kSchedBlock;
    mp.fixed_overhead_num_blocks = kSchedOverhead;
    mp.topk = -1;  // dense
    mp.extra_topk = -1;
    mp.seqlens_k_ptr = seqlens;
    mp.tile_scheduler_metadata_ptr = meta;
    mp.num_splits_ptr = nsplits;
    mp.num_sm_parts = num_sm_parts;
    mp.stream = nullptr;

    // q viewed as [b, q_per_hk, h_k, 576], out as [b, h_k, q_per_hk, 512] (FlashMLA's dense layout).
    DenseAttnDecodeParams p{};
    p.b = b;
    p.s_q = s_q;
    p.q_seq_per_hk = q_per_hk;
    p.d = kDqk;
    p.d_v = kDv;
    p.h_q = h_q;
    p.h_k = h_k;
    p.num_blocks = int(pools.pages);
    p.q_head_per_hk = h_q / h_k;
    p.is_causal = false;
    p.scale_softmax = 1.0f / std::sqrt(float(kDqk));
    p.scale_softmax_log2 = p.scale_softmax * kLog2e;
    p.q_ptr = q;
    p.k_ptr = pools.bf16;
    p.o_ptr = out;
    p.softmax_lse_ptr = lse;
    p.q_batch_stride = int64_t(q_per_hk) * h_k * kDqk;
    p.q_row_stride = int64_t(h_k) * kDqk;
    p.q_head_stride = kDqk;
    p.k_batch_stride = int64_t(kPage) * h_k * kDqk;
    p.k_row_stride = int64_t(h_k) * kDqk;
    p.k_head_stride = kDqk;
    p.o_batch_stride = int64_t(h_k) * q_per_hk * kDv;
    p.o_row_stride = kDv;
    p.o_head_stride = int64_t(q_per_hk) * kDv;
    p.block_table = bt;
    p.block_table_batch_stride = sel.pages;
    p.page_block_size = kPage;
    p.seqlens_k_ptr = seqlens;
    p.tile_scheduler_metadata_ptr = meta;
    p.num_sm_parts = num_sm_parts;
    p.num_splits_ptr = nsplits;
    p.total_num_splits = total_splits;
    p.softmax_lseaccum_ptr = lse_acc;
    p.oaccum_ptr = o_acc;
    p.stream = nullptr;

    CombineParams cp{};
    cp.b = b;
    cp.s_q = s_q;
    cp.h_q = h_q;
    cp.d_v = kDv;
    cp.lse = lse;
    cp.out = out;
    cp.stride_lse_b = h_k * q_per_hk;
    cp.stride_lse_s_q = h_q;
    cp.stride_o_b = h_q * s_q * kDv;
    cp.stride_o_s_q = h_q * kDv;
    cp.stride_o_h_q = kDv;
    cp.lse_accum = lse_acc;
    cp.o_accum = o_acc;
    cp.stride_lse_accum_split = h_k * q_per_hk;
    cp.stride_lse_accum_s_q = h_q;
    cp.stride_o_accum_split = h_q * s_q * kDv;
    cp.stride_o_accum_s_q = h_q * kDv;
    cp.stride_o_accum_h_q = kDv;
    cp.tile_scheduler_metadata_ptr = meta;
    cp.num_splits_ptr = nsplits;
    cp.num_sm_parts = num_sm_parts;
    cp.attn_sink = nullptr;
    cp.stream = nullptr;

    auto kernel = [&] {
      sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);
      smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(cp);
    };
    smxx::decode::run_get_decoding_sched_meta_kernel(mp);
    CK(cudaDeviceSynchronize());
    const double keys = double(b) * c.ctx;
    const double bytes = keys * kBf16RowBytes + double(b) * h_q * (kDqk + kDv) * 2;
    const double flops = keys * h_q * 2.0 * (kDqk + kDv);
    char tail[64];
    std::snprintf(tail, sizeof tail, " sm_parts=%d", num_sm_parts);
    row(case_name("flashmla dense kv=bf16", c) + tail, time_us(kernel, flush), bytes, flops);
    {
      // out is [b, h_k = 1, s_q * h_q, 512]: with s_q = 1 the same [b, h_q, 512] rows as q.
      Check ck;
      const auto key = [&](int64_t slot, float* k) { bf16_key(pools, slot, k); };
      for (int64_t r : {int64_t(0), int64_t(b) - 1}) {
        std::vector<int64_t> slots(size_t(c.ctx));
        for (int64_t pos = 0; pos < c.ctx; ++pos)
          slots[size_t(pos)] =
              int64_t(sel.pt[size_t(r) * sel.pages + size_t(pos / kPage)]) * kPage + pos % kPage;
        check_row(q_host, out, r, h_q, slots, key, ck);
      }
      report_check(case_name("dense", c), ck);
    }
    if (fl.with_meta)
      row(case_name("flashmla dense kv=bf16", c) + tail + " +metadata",
          time_us(
              [&] {
                smxx::decode::run_get_decoding_sched_meta_kernel(mp);
                kernel();
              },
              flush),
          bytes, flops);
    for (void* x : {(void*)q, (void*)bt, (void*)seqlens, (void*)out, (void*)lse, (void*)o_acc, (void*)lse_acc,
                    (void*)meta, (void*)nsplits})
      CK(cudaFree(x));
  }
}

// ---- sparse prefill: one request's T new tokens after ctx cached ones (attention_gpu_bench's prefill) ----
void bench_prefill(const Pools& pools, int num_sms, void* flush, const Flags& fl, std::mt19937_64& rng) {
  header(
      "### FlashMLA sparse prefill (SM90, d_qk 576, bf16 KV): one request's T new tokens after ctx cached "
      "ones, top-2048 (rows with at most 2048 keys: all of them, the rest -1)");
  const int T = 4096;
  for (int h_q : {64, 128}) {
    if (fl.only_heads > 0 && h_q != fl.only_heads) continue;
    for (int ctx : {0, 8192, 32768}) {
      const int S = ctx + T, pages = (S + kPage - 1) / kPage;
      if (int64_t(pages) > pools.pages) continue;
      // The request's pages: distinct pages of the pool in random order.
      std::vector<int32_t> perm(static_cast<size_t>(pools.pages));
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<int32_t> flat(size_t(T) * kTopk, -1);
      double keys = 0;
      for (int t = 0; t < T; ++t) {
        const int64_t v = int64_t(ctx) + t + 1;  // keys row t sees (causal)
        int32_t* r = flat.data() + size_t(t) * kTopk;
        const int n = int(std::min<int64_t>(v, kTopk));
        keys += n;
        for (int j = 0; j < n; ++j) {
          const int64_t pos = v <= kTopk ? j : int64_t(j) * v / kTopk + int64_t(rng() % uint64_t(v / kTopk));
          r[j] = perm[size_t(pos / kPage)] * kPage + int32_t(pos % kPage);
        }
      }
      PrefillRun r = make_prefill(T, h_q, pools, flat, num_sms, rng);
      const double bytes = keys * kBf16RowBytes + double(T) * kTopk * 4 + double(T) * h_q * (kDqk + kDv) * 2;
      const double flops = keys * h_q * 2.0 * (kDqk + kDv);
      char name[128];
      std::snprintf(name, sizeof name, "flashmla sparse prefill kv=bf16 heads=%d ctx=%d T=%d", h_q, ctx, T);
      row(name, time_us([&] { sm90::fwd::run_fwd_phase1_kernel<kDqk, false>(r.p); }, flush), bytes, flops);
      check_prefill(r, pools, flat, T, h_q, name);
      free_prefill(r);
    }
  }
}

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: flashmla_peer [--all | TABLE...] [--heads H] [--batch B] [--pool-slots N] [--with-meta]\n"
      "  TABLE: sparse-fp8 | sparse-bf16 | dense | prefill (default / --all: all four)\n"
      "  --heads H, --batch B  only the cases with that head count / batch\n"
      "  --pool-slots N        token slots of each KV pool (default 4194304: every read from HBM)\n"
      "  --with-meta           also time sparse-fp8 / dense decode with the scheduler kernel\n"
      "Times FlashMLA's SM90 kernels (sm_90a GPUs only) at bench/attention_gpu_bench's shapes.\n");
}

}  // namespace

int main(int argc, char** argv) {
  Flags fl;
  std::vector<std::string> tables;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> long long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flashmla_peer: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--all") {
      tables.clear();
    } else if (a == "--heads") {
      fl.only_heads = int(value());
    } else if (a == "--batch") {
      fl.only_batch = int(value());
    } else if (a == "--pool-slots") {
      fl.pool_slots = value();
    } else if (a == "--with-meta") {
      fl.with_meta = true;
    } else if (a == "sparse-fp8" || a == "sparse-bf16" || a == "dense" || a == "prefill") {
      tables.push_back(a);
    } else {
      std::fprintf(stderr, "flashmla_peer: unknown argument %s\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  auto on = [&](const char* t) {
    return tables.empty() || std::find(tables.begin(), tables.end(), t) != tables.end();
  };
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  int driver = 0;  // 0: no driver installed (no libcuda), which cudart also reports as "insufficient"
  if (e == cudaErrorInsufficientDriver && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    std::fprintf(stderr,
                 "flashmla_peer: the driver (CUDA %d) is older than this binary's static CUDA runtime (%d); "
                 "rebuild it on this machine: scripts/stage_flashmla.sh with .peer carried\n",
                 driver, CUDART_VERSION);
    return 1;
  }
  if (e != cudaSuccess || n == 0) {
    std::printf("flashmla_peer: no CUDA device, nothing to measure (%s)\n",
                e == cudaSuccess ? "none found" : cudaGetErrorString(e));
    return 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    std::fprintf(stderr, "flashmla_peer: %s is sm_%d%d; FlashMLA's SM90 kernels here need sm_90a\n",
                 prop.name, prop.major, prop.minor);
    return 1;
  }
  std::printf(
      "## flashmla_peer (FlashMLA SM90 kernels) on %s (%d SMs); median of 20, L2 flushed before each\n",
      prop.name, prop.multiProcessorCount);
  try {
    std::mt19937_64 rng(1);
    void* flush = dev_alloc<unsigned char>(kFlushBytes);
    const Pools pools = make_pools(fl.pool_slots, rng);
    const int sms = prop.multiProcessorCount;
    if (on("sparse-fp8")) bench_sparse_fp8(pools, sms, flush, fl, rng);
    if (on("sparse-bf16")) bench_sparse_bf16(pools, sms, flush, fl, rng);
    if (on("dense")) bench_dense(pools, sms, flush, fl, rng);
    if (on("prefill")) bench_prefill(pools, sms, flush, fl, rng);
    std::printf(
        "\ncheck: %d of %d cases match a host reference (first and last query row, heads 0, h/2, h-1)%s\n",
        g_checked - g_mismatched, g_checked, g_mismatched ? "; the others are named on stderr" : "");
    CK(cudaFree(flush));
    CK(cudaFree(pools.fp8));
    CK(cudaFree(pools.bf16));
  } catch (const std::exception& e) {  // FlashMLA's host checks throw (kerutils::KUException)
    std::fprintf(stderr, "flashmla_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
