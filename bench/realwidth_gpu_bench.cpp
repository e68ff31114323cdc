// GLM-5.3 at its real widths on one GPU (issue 15): a dummy-weight slice (--load-format dummy: FP8 where the
// config says so, generated on the GPU) of the first --layers layers, then
//   decode: steady-state decode steps (no prefill in the timed window: the KV cache is written with dummy
//           latents / index keys through the real cache-write ops, every request its own pages) at
//           batch x context, bf16 and FP8 KV, replayed through CUDA graphs (--no-graphs: eager);
//   prefill: one request's chunk of N new tokens after 0 cached (eager, last-token logits);
//   ops: for one decode batch and for the first prefill (--trace-prefill), the trace's per-op table,
//        measured (CUDA events, eager) vs the plan's roofline;
//   spec: for the first context, per batch, the speculative round's steps (issue 17), eager: a verify step
//         (--verify-tokens K new tokens per request, a logits row each), a draft step (the MTP layer, one
//         token per request) and a draft-extend (the MTP layer over K tokens per request), beside the
//         decode step; the accept length at which a round of K - 1 drafts pays for itself is
//         (verify + (K - 1) x draft + draft-extend) / decode (the tokens one round must yield to match
//         plain decoding's tokens per second). With graphs (the default) the verify and draft steps also
//         replay their CUDA graphs (runtime/engine/cuda_graph_spec.h; rows "ROW spec graphs": verify
//         graphs, draft graphs, and the round with them; draft-extend stays eager).
//         --verify-tokens 0: no spec rows (nor MTP weights).
// Every row prints the measured ms, the plan's roofline ms for the same batch (plan::plan_step on an H200)
// and plan / measured (1.0 = at the roofline). Rows print as they finish (a timeout still shows them);
// combinations whose KV does not fit the device are skipped with the reason.
//
//   realwidth_gpu_bench [--config $DSASERVE_FIXTURES/configs/glm-5.3.json] [--layers 8]
//                       [--batches 1,8,32,64,128] [--contexts 4096,32768,131072] [--kv bf16,fp8_e4m3]
//                       [--prefill 4096,16384] [--trace-batch 32] [--trace-context 4096] [--steps 20]
//                       [--warmup 3] [--no-graphs] [--max-seconds 420] [--trace-prefill 4096]
//                       [--verify-tokens 4] [--moe-path auto|device|device_fp8|host]
//                       [--prefill-forms auto,absorbed,mha] (the prefill rows' attention forms, a row each)
//                       [--pdl off,on] (KernelOptions::pdl, programmatic dependent launches: the prefill and
//                       decode rows once per value, side by side, each with its own CUDA graphs; the spec
//                       rows and the per-op tables with the first value)
//                       [--split-fused-min-tokens N] [--absorb-fused-min-tokens N] (KernelOptions' thresholds
//                       of the f32-activation kernel; 0: the old paths) [--silu-mul-fp8-copy 0|1]
//                       [--moe-fp8-tail-rows 0..32] (KernelOptions: rows past 128 the experts' last wgmma
//                       pass takes) [--mla-decode-kernel auto|v2|v5|v6]
//                       (KernelOptions::mla_decode, every row's MLA attention kernel)
//                       [--bf16-small-wide 0|1] (KernelOptions::gemm_bf16_small_wide: the LM head at decode
//                       on the small-T kernel or on cuBLASLt)
//                       [--small-fuse 0|1|0,1] (KernelOptions::gemm_small_fuse: linear_multi's FP8
//                       parts at decode in one small-T launch or one each; a list: one variant each, like
//                       --pdl, the rows naming it as fuse=0|1)
//                       [--absorb-small-max-tokens N[,N...]] (KernelOptions::absorb_small_max_tokens: the
//                       absorbed projections' small-T kernel up to N tokens, 0 never; a list: a variant each,
//                       rows naming it as absorb_small=N; with --small-fuse, every pair of values)
//                       [--profile-batch B] (after batch B's timed decode steps, one more step between
//                       cudaProfilerStart / Stop: `ncu --profile-from-start off` then sees that step's
//                       kernels alone, each graph node its own result)
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/backend.h"
#include "kernels/kernel_options.h"
#include "kernels/ops.h"
#include "model/dummy_weights.h"
#include "model/model.h"
#include "plan/step.h"
#include "plan/trace_summary.h"
#include "runtime/engine/cuda_graph_runner.h"
#include "runtime/engine/cuda_graph_spec.h"
#include "runtime/engine/device.h"
#include "trace/trace.h"

namespace dsaserve {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr int64_t kPage = 64;

struct Args {
  std::string config = std::string(std::getenv("DSASERVE_FIXTURES") ? std::getenv("DSASERVE_FIXTURES")
                                                                    : "../shared/fixtures") +
                       "/configs/glm-5.3.json";
  int64_t layers = 8;
  std::vector<int64_t> batches{1, 8, 32, 64, 128}, contexts{4096, 32768, 131072}, prefill{4096, 16384};
  std::vector<std::string> kv{"bf16", "fp8_e4m3"};
  int64_t trace_batch = 32, trace_context = 4096, steps = 20, warmup = 3;
  int64_t trace_prefill = 4096, verify_tokens = 4;
  int64_t profile_batch = 0;  // 0: no profiled step
  bool graphs = true;
  double max_seconds = 420;
  std::string moe_path = "auto";    // KernelOptions::moe (the routed experts' path)
  std::string mla_decode = "auto";  // KernelOptions::mla_decode
  // KernelOptions::gemm_split_fused_min_tokens / absorb_fused_min_tokens (-1: the defaults; 0: the old
  // paths): the f32-activation kernel's thresholds, for an old / new comparison of the prefill rows.
  int64_t split_fused_min_tokens = -1, absorb_fused_min_tokens = -1;
  int moe_fp8_tail_rows = kernels::kMoeFp8TailRowsDefault;  // KernelOptions::moe_fp8_tail_rows
  int silu_mul_fp8_copy = -1;  // KernelOptions::silu_mul_fp8_copy (-1: the default; 0: off; 1: on)
  int bf16_small_wide = -1;    // KernelOptions::gemm_bf16_small_wide (-1: the default; 0: off; 1: on)
  // KernelOptions::gemm_small_fuse values, a variant each (empty: the default, rows without fuse=).
  std::vector<bool> small_fuse;
  // KernelOptions::absorb_small_max_tokens values, a variant each (empty: the default, rows without it).
  std::vector<int64_t> absorb_small;
  // The prefill rows' attention forms (ForwardOptions::attention), each a row: auto (the rule), absorbed,
  // mha.
  std::vector<std::string> prefill_forms{"auto"};
  // KernelOptions::pdl values, each a row of every prefill and decode combination ("off", "on").
  std::vector<bool> pdl{kernels::kPdlDefault};
};

// A flag's comma-separated values ("a,b" -> {"a", "b"}; "" -> {""}).
std::vector<std::string> items(const std::string& s) {
  std::vector<std::string> v;
  for (size_t p = 0; p <= s.size();) {
    const size_t q = std::min(s.find(',', p), s.size());
    v.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return v;
}

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> v;
  for (const std::string& i : items(s))
    if (!i.empty()) v.push_back(std::stoll(i));
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        fmt::print(stderr, "{} needs a value\n", k);
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--config")
      a.config = val();
    else if (k == "--layers")
      a.layers = std::stoll(val());
    else if (k == "--batches")
      a.batches = ints(val());
    else if (k == "--contexts")
      a.contexts = ints(val());
    else if (k == "--prefill")
      a.prefill = val() == "none" ? std::vector<int64_t>{} : ints(argv[i]);
    else if (k == "--kv") {
      a.kv = items(val());
    } else if (k == "--trace-batch")
      a.trace_batch = std::stoll(val());
    else if (k == "--trace-context")
      a.trace_context = std::stoll(val());
    else if (k == "--steps")
      a.steps = std::stoll(val());
    else if (k == "--warmup")
      a.warmup = std::stoll(val());
    else if (k == "--trace-prefill")
      a.trace_prefill = std::stoll(val());
    else if (k == "--verify-tokens")
      a.verify_tokens = std::stoll(val());
    else if (k == "--profile-batch")
      a.profile_batch = std::stoll(val());
    else if (k == "--no-graphs")
      a.graphs = false;
    else if (k == "--max-seconds")
      a.max_seconds = std::stod(val());
    else if (k == "--moe-path")
      a.moe_path = val();
    else if (k == "--mla-decode-kernel")
      a.mla_decode = val();
    else if (k == "--pdl") {
      a.pdl.clear();
      for (const std::string& v : items(val())) a.pdl.push_back(kernels::parse_pdl(v, "--pdl"));
    } else if (k == "--moe-fp8-tail-rows")
      a.moe_fp8_tail_rows = kernels::check_moe_fp8_tail_rows(std::stoi(val()), k);
    else if (k == "--split-fused-min-tokens")
      a.split_fused_min_tokens = std::stoll(val());
    else if (k == "--absorb-fused-min-tokens")
      a.absorb_fused_min_tokens = std::stoll(val());
    else if (k == "--silu-mul-fp8-copy")
      a.silu_mul_fp8_copy = std::stoi(val()) != 0 ? 1 : 0;
    else if (k == "--bf16-small-wide")
      a.bf16_small_wide = std::stoi(val()) != 0 ? 1 : 0;
    else if (k == "--small-fuse") {
      a.small_fuse.clear();
      for (const std::string& v : items(val())) {
        DSA_CHECK(v == "0" || v == "1", "--small-fuse takes 0, 1 or 0,1, got {}", v);
        a.small_fuse.push_back(v == "1");
      }
    } else if (k == "--absorb-small-max-tokens") {
      a.absorb_small.clear();
      for (int64_t t : ints(val())) a.absorb_small.push_back(kernels::check_absorb_small_max_tokens(t, k));
    } else if (k == "--prefill-forms") {
      a.prefill_forms = items(val());
      for (const std::string& f : a.prefill_forms) {
        if (f != "auto" && f != "absorbed" && f != "mha") {
          fmt::print(stderr, "--prefill-forms: {} is not auto, absorbed or mha\n", f);
          std::exit(2);
        }
      }
    } else {
      fmt::print(stderr, "unknown flag {} (see the comment at the top of bench/realwidth_gpu_bench.cpp)\n",
                 k);
      std::exit(2);
    }
  }
  return a;
}

void sync() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) throw Error(fmt::format("CUDA: {}", cudaGetErrorString(e)));
}

double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The plan's H200 roofline (ms) of one step of these requests.
double roofline_ms(const model::ModelConfig& c, model::KvCacheDtype kv,
                   const std::vector<plan::StepRequest>& reqs, bool decode, bool all_logits = false,
                   bool mtp = false) {
  plan::Deployment d;
  d.kv_cache_dtype = kv == model::KvCacheDtype::fp8_e4m3 ? plan::KvDtype::fp8_e4m3 : plan::KvDtype::bf16;
  plan::StepShape s;
  s.requests = reqs;
  s.decode = decode;
  s.all_logits = all_logits;
  s.mtp = mtp;
  const plan::Pass p = plan::plan_step(c, d, plan::Hardware::named("h200"), s);
  return plan::step_totals({p}, 1).time_s * 1e3;
}

// Every slot of the cache written once with dummy latents and index keys through the real cache-write
// ops (the FP8 formats quantise as a prefill would). Values: the layers' own norms over random rows.
void fill_kv(const model::Model& m, model::KvCache& cache) {
  const model::ModelConfig& c = m.config();
  const int64_t slots = cache.num_pages * cache.page_size, chunk = int64_t(1) << 16;
  kernels::RopeParams rope;
  rope.dim = c.qk_rope_head_dim;
  rope.theta = c.rope.theta;
  std::vector<int32_t> host(static_cast<size_t>(chunk));
  // One block of random rows, written to every chunk of slots of every layer (the values do not matter
  // for the timing; the cache-write ops normalise, rotate and quantise them as a prefill would).
  Tensor ckv = Tensor::empty({chunk, c.kv_cache_dim()}, DType::f32, Device::cuda);
  kernels::fill_dummy(ckv, {77, 1, 1.0f, 0.0f, false});
  Tensor k = Tensor::empty({chunk, std::max<int64_t>(c.index_head_dim, 1)}, DType::f32, Device::cuda);
  kernels::fill_dummy(k, {78, 2, 1.0f, 0.0f, false});
  for (int64_t s0 = 0; s0 < slots; s0 += chunk) {
    const int64_t n = std::min(chunk, slots - s0);
    std::iota(host.begin(), host.begin() + n, int32_t(s0));
    Tensor sl = Tensor::empty({n}, DType::i32);
    std::memcpy(sl.raw_data(), host.data(), size_t(n) * 4);
    const Tensor slots_d = sl.to(Device::cuda);
    Tensor pos = Tensor::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) pos.data<int32_t>()[i] = int32_t((s0 + i) % 131072);
    const Tensor pos_d = pos.to(Device::cuda);
    for (size_t l = 0; l < cache.kv.size() && l < m.weights().layers.size(); ++l) {
      const model::LayerWeights& lw = m.weights().layers[l];
      kernels::mla_kv_write(ckv.slice(0, 0, n), lw.attn.kv_a_layernorm, 1e-6, pos_d, rope, cache.kv[l],
                            slots_d);
      if (c.has_indexer() && cache.index_k[l].defined() && lw.attn.indexer) {
        kernels::indexer_k_write(k.slice(0, 0, n), lw.attn.indexer->k_norm_weight,
                                 lw.attn.indexer->k_norm_bias, c.indexer_norm_eps, pos_d, rope,
                                 cache.index_k[l], slots_d);
      }
    }
  }
  sync();
}

struct DecodeResult {
  double ms = 0;
  bool replayed = false;
};

// B requests of ctx cached tokens on their own pages (request r: pages r * per_req ...), `warmup` untimed
// steps (graph capture), then `steps` timed ones; each step `tokens` new tokens per request (1: a decode;
// more: a verify, every row's logits). `mtp`: the MTP layer's pass over them instead (a draft step with
// 1 token, a draft-extend with more), fed `hidden` as the target's final hidden states. `graphs` replays
// decode steps, `spec` verify and draft steps (where they accept the batch; else eager).
DecodeResult time_decode(const model::Model& m, model::KvCache& cache, runtime::CudaGraphRunner* graphs,
                         int64_t B, int64_t ctx, int64_t per_req, const Args& a, int64_t tokens = 1,
                         const Tensor* mtp_hidden = nullptr, runtime::SpecGraphRunner* spec = nullptr) {
  const int64_t vocab = m.config().vocab_size;
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r) {
    tables[size_t(r)].resize(size_t(per_req));
    std::iota(tables[size_t(r)].begin(), tables[size_t(r)].end(), int32_t(r * per_req));
  }
  model::ForwardOptions fo;
  fo.all_logits = false;
  DecodeResult res;
  clock_type::time_point t0;
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  auto step = [&](int64_t s) {
    model::ForwardBatch b;
    b.page_size = kPage;
    const int64_t pos = ctx + s * tokens;
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t j = 0; j < tokens; ++j)
        ids[size_t(j)] = int32_t((r * 7919 + (pos + j) * 104729 + 13) % vocab);
      b.add_request(ids, pos, tables[size_t(r)], true);
    }
    if (mtp_hidden) {
      const Tensor h = mtp_hidden->slice(0, 0, B * tokens);
      std::optional<model::ForwardOutput> g = spec && tokens == 1 ? spec->draft(b, h) : std::nullopt;
      if (g) res.replayed = true;
      if (!g) (void)m.forward_mtp(b, h, cache, fo);
      return;
    }
    if (spec && tokens > 1) {
      std::optional<model::ForwardOutput> g = spec->verify(b);
      if (g) res.replayed = true;
      if (!g) (void)m.forward(b, cache, fo);
      return;
    }
    std::optional<Tensor> g = graphs && tokens == 1 ? graphs->run(b) : std::nullopt;
    if (g) res.replayed = true;
    if (!g) (void)m.forward(b, cache, fo);
  };
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) {
      sync();
      t0 = clock_type::now();
    }
    step(s);
  }
  sync();
  res.ms = since(t0) * 1e3 / double(a.steps);
  if (a.profile_batch == B && tokens == 1 && !mtp_hidden) {  // one more step, for a profiler
    cudaProfilerStart();
    step(a.warmup + a.steps);
    sync();
    cudaProfilerStop();
  }
  return res;
}

// One eager traced run of `step` (a warm-up first, so new shapes are paid for), its per-op table printed
// under `title` beside the plan's roofline for the same ops.
template <class F>
void print_op_table(const model::ModelConfig& c, model::KvCacheDtype kv, const std::string& title, F step) {
  step();
  sync();
  trace::Recorder rec;
  trace::set_active(&rec);
  const auto t = clock_type::now();
  step();
  sync();
  const double ms = since(t) * 1e3;
  trace::set_active(nullptr);
  rec.resolve_device(true);
  plan::TraceSummaryOptions po;
  po.deployment.kv_cache_dtype =
      kv == model::KvCacheDtype::fp8_e4m3 ? plan::KvDtype::fp8_e4m3 : plan::KvDtype::bf16;
  const nlohmann::json s = plan::measured_vs_planned(rec.events(), c, po);
  fmt::print("OPS {} ({:.3f} ms wall; op spans timed with CUDA events):\n{}", title, ms,
             plan::format_summary(s));
  std::fflush(stdout);
}

int run(const Args& a) {
  const auto t_start = clock_type::now();
  runtime::use_device(Device::cuda);
  fmt::print("realwidth_gpu_bench: {}\n", runtime::device_description(Device::cuda));
  const model::ModelConfig c =
      model::ModelConfig::load(a.config, fmt::format(R"({{"num_hidden_layers": {}}})", a.layers));
  fmt::print(
      "model: {} x {} layers ({} dense, {} full indexer), hidden {}, {} heads, {} experts top-{}, vocab {}, "
      "FP8 weights: {}\n",
      a.config, c.num_hidden_layers,
      std::count(c.mlp_layer_types.begin(), c.mlp_layer_types.end(), model::MlpType::dense),
      c.num_full_indexer_layers(), c.hidden_size, c.num_attention_heads, c.n_routed_experts,
      c.num_experts_per_tok, c.vocab_size, c.fp8.enabled ? "yes (128x128 block scales)" : "no (bf16)");
  std::fflush(stdout);
  auto t0 = clock_type::now();
  const bool spec = a.verify_tokens > 1 && c.num_nextn_predict_layers > 0;
  std::shared_ptr<model::Model> model = model::make_dummy_model(c, Device::cuda, 0, spec);
  // One model per --pdl (x --small-fuse x --absorb-small-max-tokens) value (the weights shared; each its
  // own backend with those KernelOptions).
  struct Variant {
    bool pdl;
    std::string fuse;  // " fuse=0|1 absorb_small=N" as given (the rows print it after pdl=)
    std::shared_ptr<model::Model> model;
  };
  std::vector<Variant> variants;
  {
    kernels::KernelOptions ko;
    ko.moe = kernels::parse_moe_path(a.moe_path, "--moe-path");
    ko.mla_decode = kernels::parse_mla_decode_kernel(a.mla_decode, "--mla-decode-kernel");
    if (a.split_fused_min_tokens >= 0) ko.gemm_split_fused_min_tokens = a.split_fused_min_tokens;
    if (a.absorb_fused_min_tokens >= 0) ko.absorb_fused_min_tokens = a.absorb_fused_min_tokens;
    if (a.silu_mul_fp8_copy >= 0) ko.silu_mul_fp8_copy = a.silu_mul_fp8_copy == 1;
    if (a.bf16_small_wide >= 0) ko.gemm_bf16_small_wide = a.bf16_small_wide == 1;
    ko.moe_fp8_tail_rows = a.moe_fp8_tail_rows;
    const std::vector<int> fuses = a.small_fuse.empty()
                                       ? std::vector<int>{-1}
                                       : std::vector<int>(a.small_fuse.begin(), a.small_fuse.end());
    const std::vector<int64_t> absorbs = a.absorb_small.empty() ? std::vector<int64_t>{-1} : a.absorb_small;
    for (bool pdl : a.pdl)
      for (int fuse : fuses)
        for (int64_t absorb : absorbs) {
          ko.pdl = pdl;
          if (fuse >= 0) ko.gemm_small_fuse = fuse == 1;
          if (absorb >= 0) ko.absorb_small_max_tokens = absorb;
          std::string tag = fuse == -1 ? std::string() : fmt::format(" fuse={}", fuse);
          if (absorb >= 0) tag += fmt::format(" absorb_small={}", absorb);
          variants.push_back({pdl, tag,
                              ko == kernels::KernelOptions{}
                                  ? model
                                  : model->with_backend(kernels::cuda::make_backend(ko))});
        }
    model = variants.front().model;
  }
  if (a.moe_path != "auto") fmt::print("routed experts: --moe-path {}\n", a.moe_path);
  if (a.mla_decode != "auto") fmt::print("MLA attention: --mla-decode-kernel {}\n", a.mla_decode);
  for (const Variant& v : variants)
    fmt::print(
        "kernels (pdl={}{}): {}\n", kernels::pdl_name(v.pdl), v.fuse,
        kernels::describe(v.model->backend() ? v.model->backend()->options() : kernels::KernelOptions{}));
  sync();
  fmt::print("dummy weights generated on the GPU: {:.2f} GiB in {:.1f} s\n",
             double(model->weights().bytes()) / kGiB, since(t0));
  t0 = clock_type::now();
  const double warm = runtime::warm_up(*model, model::KvCacheDtype::bf16, 64);
  runtime::release_cached_memory(Device::cuda);
  fmt::print("warm-up {:.1f} s\n", warm);
  std::fflush(stdout);

  // Prefill rows (eager; the KV pool of one request).
  for (const std::string& kvn : a.kv) {
    const model::KvCacheDtype kv =
        kvn == "fp8_e4m3" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
    for (int64_t n : a.prefill)
      for (const std::string& form : a.prefill_forms)
        for (const Variant& var : variants) {
          if (since(t_start) > a.max_seconds) break;
          const int64_t pages = (n + kPage) / kPage;
          model::KvCache cache = model::KvCache::create(c, pages, kPage, false, Device::cuda, kv);
          std::vector<int32_t> table(static_cast<size_t>(pages)), ids(static_cast<size_t>(n));
          std::iota(table.begin(), table.end(), 0);
          for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 104729 + 13) % c.vocab_size);
          model::ForwardOptions fo;
          fo.all_logits = false;
          fo.attention = form == "mha"        ? model::AttentionForm::mha
                         : form == "absorbed" ? model::AttentionForm::absorbed
                                              : model::AttentionForm::automatic;
          double best = 1e30;
          for (int rep = 0; rep < 3; ++rep) {  // the first pays for new shapes; keep the best
            model::ForwardBatch b;
            b.page_size = kPage;
            b.add_request(ids, 0, table);
            sync();
            const auto t = clock_type::now();
            (void)var.model->forward(b, cache, fo);
            sync();
            best = std::min(best, since(t) * 1e3);
          }
          const double plan = roofline_ms(c, kv, {{n, 0}}, false);
          fmt::print(
              "ROW prefill kv={} tokens={} cached=0 form={} pdl={}{} measured_ms={:.2f} plan_ms={:.3f} "
              "plan/measured={:.3f} "
              "tok/s={:.0f}\n",
              kvn, n, form, kernels::pdl_name(var.pdl), var.fuse, best, plan, plan / best,
              double(n) * 1e3 / best);
          std::fflush(stdout);
          if (n == a.trace_prefill && kvn == a.kv.front() && form == a.prefill_forms.front() &&
              &var == &variants.front()) {
            print_op_table(c, kv, fmt::format("kv={} prefill of {} tokens, eager", kvn, n), [&] {
              model::ForwardBatch b;
              b.page_size = kPage;
              b.add_request(ids, 0, table);
              (void)model->forward(b, cache, fo);
            });
          }
        }
  }

  // Decode rows: one KV pool per KV dtype, as large as the device allows, written once.
  for (const std::string& kvn : a.kv) {
    const model::KvCacheDtype kv =
        kvn == "fp8_e4m3" ? model::KvCacheDtype::fp8_e4m3 : model::KvCacheDtype::bf16;
    if (since(t_start) > a.max_seconds) {
      fmt::print("SKIP decode kv={}: --max-seconds {} reached\n", kvn, a.max_seconds);
      continue;
    }
    const int64_t page_bytes = model::KvCache::bytes_per_token(c, spec, kv) * kPage;
    runtime::release_cached_memory(Device::cuda);  // the previous pool's blocks back to the device
    const runtime::DeviceMemory mem = runtime::device_memory(Device::cuda);
    const int64_t keep = int64_t(12 * kGiB);  // step workspace, graph pool, scratch
    const int64_t fit = std::max<int64_t>((mem.free - keep) / page_bytes - 1, 0);
    int64_t want = 0;  // pages of the largest combination that fits (the pool is written once: no more)
    for (int64_t B : a.batches) {
      for (int64_t ctx : a.contexts) {
        const int64_t need =
            B * ((ctx + (a.warmup + a.steps) * std::max<int64_t>(a.verify_tokens, 1) + kPage) / kPage);
        if (need <= fit) want = std::max(want, need);
      }
    }
    const int64_t pages = want + 1;  // + the graphs' scratch page
    t0 = clock_type::now();
    model::KvCache cache = model::KvCache::create(c, pages, kPage, spec, Device::cuda, kv);
    fill_kv(*model, cache);
    fmt::print("KV pool kv={}: {} pages ({} tokens, {:.1f} GiB) written with dummy KV in {:.1f} s\n", kvn,
               pages, pages * kPage, double(pages * page_bytes) / kGiB, since(t0));
    std::fflush(stdout);
    model::ForwardOptions fo;
    fo.all_logits = false;
    const int64_t max_bs = *std::max_element(a.batches.begin(), a.batches.end());
    std::vector<std::unique_ptr<runtime::CudaGraphRunner>> graphs(variants.size());  // one per variant
    std::unique_ptr<runtime::SpecGraphRunner> spec_graphs;  // captured lazily (the timed runs' warm-up)
    if (a.graphs)
      for (size_t v = 0; v < variants.size(); ++v)
        graphs[v] = std::make_unique<runtime::CudaGraphRunner>(*variants[v].model, cache, int32_t(pages - 1),
                                                               max_bs, fo, false);
    if (a.graphs && spec)
      spec_graphs = std::make_unique<runtime::SpecGraphRunner>(*model, cache, int32_t(pages - 1), max_bs, fo,
                                                               a.verify_tokens - 1, false);
    for (int64_t ctx : a.contexts) {
      for (int64_t B : a.batches) {
        const int64_t per_req =
            (ctx + (a.warmup + a.steps) * std::max<int64_t>(a.verify_tokens, 1) + kPage) / kPage;
        if (B * per_req > pages - 1) {
          fmt::print(
              "SKIP decode kv={} batch={} context={}: needs {:.1f} GiB of KV, {:.1f} GiB fit beside the "
              "weights\n",
              kvn, B, ctx, double(B * per_req * page_bytes) / kGiB, double(fit * page_bytes) / kGiB);
          std::fflush(stdout);
          continue;
        }
        if (since(t_start) > a.max_seconds) {
          fmt::print("SKIP decode kv={} batch={} context={}: --max-seconds {} reached\n", kvn, B, ctx,
                     a.max_seconds);
          continue;
        }
        const std::vector<plan::StepRequest> reqs(static_cast<size_t>(B),
                                                  plan::StepRequest{1, ctx + a.warmup});
        const double plan = roofline_ms(c, kv, reqs, true);
        DecodeResult r;  // the first --pdl value's (the spec rows compare against it)
        for (size_t v = 0; v < variants.size(); ++v) {
          const DecodeResult rv = time_decode(*variants[v].model, cache, graphs[v].get(), B, ctx, per_req, a);
          if (v == 0) r = rv;
          fmt::print(
              "ROW decode kv={} batch={} context={} graphs={} pdl={}{} measured_ms={:.3f} plan_ms={:.3f} "
              "plan/measured={:.3f} tok/s={:.0f}\n",
              kvn, B, ctx, rv.replayed ? "yes" : "no", kernels::pdl_name(variants[v].pdl), variants[v].fuse,
              rv.ms, plan, plan / rv.ms, double(B) * 1e3 / rv.ms);
          std::fflush(stdout);
        }
        if (spec && ctx == a.contexts.front() && since(t_start) <= a.max_seconds) {
          const int64_t K = a.verify_tokens;
          Args e = a;
          e.profile_batch = 0;  // the profiled step is the graph row's
          e.warmup = 1;
          e.steps = std::max<int64_t>(a.steps / 4, 3);
          Tensor hidden = Tensor::empty({B * K, c.hidden_size}, DType::f32, Device::cuda);
          kernels::fill_dummy(hidden, {79, 3, 1.0f, 0.0f, false});
          const double dec = time_decode(*model, cache, nullptr, B, ctx, per_req, e).ms;
          const double ver = time_decode(*model, cache, nullptr, B, ctx, per_req, e, K).ms;
          const double dra = time_decode(*model, cache, nullptr, B, ctx, per_req, e, 1, &hidden).ms;
          const double ext = time_decode(*model, cache, nullptr, B, ctx, per_req, e, K, &hidden).ms;
          const std::vector<plan::StepRequest> vr(static_cast<size_t>(B), plan::StepRequest{K, ctx});
          const std::vector<plan::StepRequest> dr(static_cast<size_t>(B), plan::StepRequest{1, ctx});
          const double pv = roofline_ms(c, kv, vr, false, true);  // priced as the plan prices "verify"
          const double pd = roofline_ms(c, kv, dr, true, false, true);
          const double round = ver + double(K - 1) * dra + ext;
          fmt::print(
              "ROW spec kv={} batch={} context={} verify_tokens={} decode_eager_ms={:.3f} "
              "decode_graph_ms={:.3f} verify_ms={:.3f} plan_verify_ms={:.3f} verify/decode_eager={:.2f} "
              "draft_ms={:.3f} plan_draft_ms={:.3f} draft_extend_ms={:.3f} round_ms={:.3f} "
              "pays_at_accept_length={:.2f} (vs graphs decode) {:.2f} (vs eager decode)\n",
              kvn, B, ctx, K, dec, r.ms, ver, pv, ver / dec, dra, pd, ext, round, round / r.ms, round / dec);
          std::fflush(stdout);
          if (spec_graphs) {
            const DecodeResult vg =
                time_decode(*model, cache, nullptr, B, ctx, per_req, e, K, nullptr, spec_graphs.get());
            const DecodeResult dg =
                time_decode(*model, cache, nullptr, B, ctx, per_req, e, 1, &hidden, spec_graphs.get());
            const double round_g = vg.ms + double(K - 1) * dg.ms + ext;
            fmt::print(
                "ROW spec graphs kv={} batch={} context={} verify_tokens={} verify_graphs_ms={:.3f} "
                "(replayed: {}) verify_graphs/decode_graphs={:.2f} draft_graphs_ms={:.3f} (replayed: {}) "
                "draft_extend_ms={:.3f} (eager) round_ms={:.3f} pays_at_accept_length={:.2f} (vs graphs "
                "decode)\n",
                kvn, B, ctx, K, vg.ms, vg.replayed ? "yes" : "no", vg.ms / r.ms, dg.ms,
                dg.replayed ? "yes" : "no", ext, round_g, round_g / r.ms);
            std::fflush(stdout);
          }
        }
      }
    }
    // The per-op table for one batch: one eager step traced (CUDA-event op spans), priced by the plan.
    const int64_t tb = a.trace_batch, tctx = a.trace_context;
    const int64_t per_req = (tctx + a.warmup + a.steps + kPage) / kPage;
    if (tb > 0 && tb * per_req <= pages - 1 && since(t_start) <= a.max_seconds) {
      Args one = a;
      one.profile_batch = 0;
      one.warmup = 0;
      one.steps = 1;
      print_op_table(c, kv,
                     fmt::format("kv={} batch={} context={} (one eager traced decode step)", kvn, tb, tctx),
                     [&] { (void)time_decode(*model, cache, nullptr, tb, tctx, per_req, one); });
    }
  }
  fmt::print("done in {:.1f} s\n", since(t_start));
  return 0;
}

}  // namespace
}  // namespace dsaserve

int main(int argc, char** argv) {
  try {
    return dsaserve::run(dsaserve::parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
