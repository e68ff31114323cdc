// dsaserve score --model DIR [--load-format dummy] [--json-model-override-args JSON] (--ids 1,2,3 |
// --ids-file F) --out logits.safetensors [--chunk N]
//                [--decode-from K] [--mtp] [--page-size P] [--attention auto|mha|absorbed] [--trace-dir D]
//                [--device cpu|cuda] [--kv-cache-dtype auto|bf16|fp8_e4m3|f32]
// Runs a token sequence through the model the way the engine serves it (a prefill in chunks of N, then
// one token per step from position K on) and writes the logits of every position: "logits" F32
// [n, vocab], "input_ids" I32 [n] and, with --mtp, the MTP head's "mtp_logits" F32 [n - 1, vocab].
// --trace-dir D: a Chrome trace of the forward passes (layer, op and kernel spans, trace/trace.h) in
// D/trace-<pid>-<n>.json, with a per-op summary keyed like `dsaserve plan --json`'s records, and the
// measured time of every op next to the plan's roofline for the same batches (plan/trace_summary.h:
// "plan_summary" in the JSON, and printed). --trace-plan-deployment tp8,ep8,dp8: also what that
// deployment's plan would move in collectives for these batches (one process runs none).
// With --attn-dp-size D > 1 DP group 0 scores the sequence and the other groups companion sequences in
// the same steps (model/score.h: dp_companion).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <optional>

#include "cli/command.h"
#include "cli/dist_flags.h"
#include "cli/kernel_flags.h"
#include "cli/model_options.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "model/load.h"
#include "model/score.h"
#include "plan/step.h"
#include "plan/trace_summary.h"
#include "runtime/engine/device.h"
#include "trace/trace.h"

namespace dsaserve::cli {
namespace {

CommandRun setup(CLI::App& sub) {
  struct Opts {
    model::LoadSpec model;
    std::string ids, ids_file, out, attention = "auto", trace_dir, trace_plan_deployment, device = "cpu",
                                    kv_cache_dtype = "auto";
    int64_t chunk = 0, decode_from = -1, page_size = 64;
    int threads = 0;
    bool mtp = false, dsa_topk_broadcast = false;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(sub, o->model)->required();
  auto* ids_opt = sub.add_option("--ids", o->ids, "token ids, comma-separated");
  auto* file =
      sub.add_option("--ids-file", o->ids_file, "file of token ids (comma/space separated or a JSON array)");
  ids_opt->excludes(file);
  sub.add_option("--out", o->out, "output .safetensors (logits F32 [n, vocab])")->required();
  sub.add_option("--chunk", o->chunk, "prefill chunk size (0: the whole prefill in one step)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--decode-from", o->decode_from, "decode one token per step from this position on");
  sub.add_flag("--mtp", o->mtp, "also write the MTP layer's logits (mtp_logits F32 [n - 1, vocab])");
  sub.add_option("--page-size", o->page_size, "KV cache page size in tokens")->check(CLI::PositiveNumber);
  sub.add_option("--attention", o->attention, "MLA form: auto | mha | absorbed")
      ->check(CLI::IsMember({"auto", "mha", "absorbed"}));
  sub.add_option("--trace-dir", o->trace_dir, "write a Chrome trace of the forward passes to this directory");
  sub.add_option("--trace-plan-deployment", o->trace_plan_deployment,
                 "with --trace-dir: the collectives this deployment's plan would run for the traced batches, "
                 "e.g. tp8,ep8,dp8[,deepep][,fp8]");
  sub.add_option("--threads", o->threads, "CPU threads (default: DSASERVE_THREADS or all cores)");
  sub.add_option("--device", o->device, "where the model runs: cpu or cuda")->capture_default_str();
  sub.add_option("--kv-cache-dtype", o->kv_cache_dtype,
                 "KV cache dtype: auto (bf16 on cuda when the sm_90a kernels fit the model, else f32), bf16, "
                 "fp8_e4m3 (cuda) or f32")
      ->capture_default_str();
  sub.add_flag("--dsa-topk-broadcast", o->dsa_topk_broadcast,
               "with --tp: attention TP ranks take rank 0's DSA top-k indices (SGLANG_DSA_TOPK_BROADCAST)");
  auto kflags = add_kernel_flags(sub);
  auto dflags = add_dist_flags(sub);
  return [o, kflags, dflags]() -> int {
    DSA_CHECK(!o->ids.empty() || !o->ids_file.empty(), "score: give the tokens with --ids or --ids-file");
    const std::vector<int32_t> ids = read_token_ids(o->ids, "--ids", o->ids_file, "--ids-file");
    DSA_CHECK(!ids.empty(), "score: the token sequence is empty");
    if (o->threads > 0) set_num_threads(o->threads);

    const Device device = runtime::parse_device(o->device);
    DSA_CHECK(!dflags->multi_rank() || device == Device::cpu,
              "score: --tp {} runs its ranks on the CPU (Gloo); ranks on GPUs are issue #16",
              dflags->layout.tp);
    dflags->check("score");
    if (dflags->multi_rank()) {  // checked once, before any rank starts
      dflags->layout.validate();
      model::Shard{dflags->layout, 0}.validate(model::load_config(o->model));
    }
    if (const auto status = launch_if_needed(*dflags)) return *status;  // this process ran the ranks
    const std::unique_ptr<dist::ProcessGroups> groups = connect_rank(*dflags);
    // The machine's threads are split over its ranks unless --threads says otherwise.
    if (groups && o->threads <= 0)
      set_num_threads(std::max(1, num_threads() / int(dflags->layout.tp / dflags->launch.nnodes)));
    runtime::use_device(device);
    const auto t0 = std::chrono::steady_clock::now();
    auto model = model::load_model(o->model, device, o->mtp);
    const model::KvCacheDtype kv_dtype =
        runtime::resolve_kv_cache_dtype(o->kv_cache_dtype, device, model->config());
    if (groups) model = model->sharded({dflags->layout, dflags->rank.rank});  // this rank's shard only
    model = runtime::model_on_device(std::move(model), device, kflags->options(), kv_dtype);
    const int64_t V = model->config().vocab_size;
    check_token_ids(ids, V);
    DSA_CHECK(!o->mtp || model->num_mtp_layers() > 0, "--mtp: {} has no MTP layer", o->model.model);
    model::ScoreOptions so;
    so.chunk = o->chunk;
    so.decode_from = o->decode_from;
    so.mtp = o->mtp;
    so.page_size = o->page_size;
    so.dist = groups.get();
    so.dsa_topk_broadcast = o->dsa_topk_broadcast;
    so.moe_a2a_deepep = dflags->deepep();
    so.deepep_fp8_dispatch = !dflags->deepep_bf16_dispatch;
    so.attention = o->attention == "mha"        ? model::AttentionForm::mha
                   : o->attention == "absorbed" ? model::AttentionForm::absorbed
                                                : model::AttentionForm::automatic;
    std::optional<trace::Recorder> recorder;
    std::optional<nlohmann::json> plan_summary;
    if (!o->trace_dir.empty()) {
      plan::TraceSummaryOptions po;
      if (groups) {  // the ops are this rank's shard, the collectives those of the deployment that ran
        po.deployment.tp = dflags->layout.tp;
        po.deployment.ep_size = dflags->layout.ep_size;
        po.deployment.attn_dp_size = dflags->layout.attn_dp_size;
        po.deployment.moe_dense_tp_size = dflags->layout.moe_dense_tp_size;
        po.deployment.dsa_topk_broadcast = o->dsa_topk_broadcast;
        if (dflags->deepep()) po.deployment.moe_a2a_backend = plan::A2aBackend::deepep;
        po.deployment.deepep_fp8_dispatch = !dflags->deepep_bf16_dispatch;
        po.what_if = po.deployment;
      }
      if (!o->trace_plan_deployment.empty())
        po.what_if = plan::parse_deployment(o->trace_plan_deployment, model->config());
      recorder.emplace().set_annotator(
          [&plan_summary, po, cfg = model->config()](const std::vector<trace::Event>& ev, nlohmann::json& j) {
            plan_summary = j["plan_summary"] = plan::measured_vs_planned(ev, cfg, po);
          });
      trace::set_active(&*recorder);
    }
    const auto t1 = std::chrono::steady_clock::now();
    model::ScoreResult r;
    try {
      r = model::score_sequence(*model, ids, so);
    } catch (...) {
      trace::set_active(nullptr);
      throw;
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (recorder) {
      trace::set_active(nullptr);  // each rank writes its trace under D/rank<r>; rank 0 prints its summary
      const auto path =
          recorder->write(groups ? fmt::format("{}/rank{}", o->trace_dir, dflags->rank.rank) : o->trace_dir);
      if (dflags->output_rank()) {
        fmt::print("trace: {} events -> {}\n", recorder->events().size(), path.string());
        if (plan_summary) fmt::print("{}", plan::format_summary(*plan_summary));
      }
    }

    if (!dflags->output_rank()) return 0;  // rank 0 writes the logits (every rank holds all of them)
    Tensor id_t = Tensor::empty({int64_t(ids.size())}, DType::i32);
    std::memcpy(id_t.raw_data(), ids.data(), ids.size() * sizeof(int32_t));
    std::vector<std::pair<std::string, Tensor>> out{{"input_ids", id_t}, {"logits", r.logits}};
    if (o->mtp && r.mtp_logits.defined()) out.emplace_back("mtp_logits", r.mtp_logits);
    io::write_safetensors(o->out, out,
                          {{"model", o->model.model},
                           {"chunk", std::to_string(o->chunk)},
                           {"decode_from", std::to_string(o->decode_from)}});
    const double load_s = std::chrono::duration<double>(t1 - t0).count();
    const double run_s = std::chrono::duration<double>(t2 - t1).count();
    fmt::print(
        "scored {} tokens in {} steps on {}{} (KV {}): load {:.3f} s, forward {:.3f} s ({:.1f} tokens/s, {} "
        "threads) -> {}\n",
        ids.size(), r.steps, device_name(device),
        groups ? fmt::format(" x {} ranks ({})", dflags->layout.tp, dflags->layout.describe())
               : std::string(),
        runtime::kv_cache_dtype_name(kv_dtype), load_s, run_s, double(ids.size()) / std::max(run_s, 1e-9),
        num_threads(), o->out);
    return 0;
  };
}

const CommandRegistration reg("score",
                              "logits of every position of a token sequence (prefill chunks, decode, MTP)",
                              setup);

}  // namespace
}  // namespace dsaserve::cli
