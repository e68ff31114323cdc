// dsaserve plan --config F | --model DIR --tp N --ep-size N --attn-dp-size N ... [--json]: the deployment
// bill (operators, bytes, collectives, memory, roofline) of a prefill and one decode step.
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "model/config.h"
#include "plan/plan.h"

namespace dsaserve::cli {
namespace {

namespace fs = std::filesystem;

struct PlanArgs {
  std::string model_dir, config_file, kv_dtype = "bf16", a2a = "auto", gpu = "h200";
  plan::Deployment d;
  double interconnect_gbps = 0;
  bool as_json = false;
  bool bf16_dispatch = false;
};

const CommandRegistration reg(
    "plan", "The deployment bill: operators, bytes, collectives and memory per GPU for a layout",
    [](CLI::App& sub) -> CommandRun {
      auto a = std::make_shared<PlanArgs>();
      auto* mo = sub.add_option("--model", a->model_dir, "checkpoint directory (its config.json)");
      auto* co = sub.add_option("--config", a->config_file, "a config.json alone");
      mo->excludes(co);
      sub.add_option("--tp", a->d.tp, "GPUs of the serving group (SGLang --tp)")->default_val(1);
      sub.add_option("--ep-size", a->d.ep_size, "expert parallel size")->default_val(1);
      sub.add_option("--attn-dp-size", a->d.attn_dp_size, "DP attention groups (attention TP = tp / this)")
          ->default_val(1);
      sub.add_option("--moe-dense-tp-size", a->d.moe_dense_tp_size,
                     "TP size of the dense MLP layers: 1 or tp")
          ->default_val(0);
      sub.add_option("--moe-a2a-backend", a->a2a, "none | deepep | auto (deepep when --ep-size > 1)")
          ->default_val("auto");
      sub.add_option("--kv-cache-dtype", a->kv_dtype, "bf16 | fp8_e4m3 (auto = bf16)")->default_val("bf16");
      sub.add_option("--speculative-num-draft-tokens", a->d.speculative_num_draft_tokens,
                     "MTP tokens verified per step (0: off)")
          ->default_val(0);
      sub.add_option("--accept-length", a->d.accept_length,
                     "output tokens per request per decode step (MTP acceptance), for per-token figures")
          ->default_val(1.0);
      sub.add_option("--batch", a->d.batch, "decoding requests in the whole deployment")->default_val(1);
      sub.add_option("--context", a->d.context, "context tokens per decoding request")->default_val(4096);
      sub.add_option("--prefill-tokens", a->d.prefill_tokens,
                     "prompt tokens of the prefill (default: --context)")
          ->default_val(0);
      sub.add_option("--chunked-prefill-size", a->d.chunked_prefill_size, "prefill chunk, -1: none")
          ->default_val(8192);
      sub.add_option("--gpu", a->gpu, "h200")->default_val("h200");
      sub.add_option(
          "--interconnect-gbps", a->interconnect_gbps,
          "interconnect bandwidth per GPU in GB/s (gigabytes, one direction; default 900, NVLink)");
      sub.add_option("--mem-fraction-static", a->d.mem_fraction_static,
                     "fraction of GPU memory for weights + KV")
          ->default_val(0.8);
      sub.add_flag("--dsa-topk-broadcast", a->d.dsa_topk_broadcast,
                   "broadcast rank 0's indexer top-k in attention TP (SGLANG_DSA_TOPK_BROADCAST)");
      sub.add_flag("--deepep-bf16-dispatch", a->bf16_dispatch,
                   "DeepEP dispatches bf16 rows on FP8 models too (SGLANG_DEEPEP_BF16_DISPATCH)");
      sub.add_flag("--json", a->as_json, "print JSON");
      return [a]() -> int {
        if (a->model_dir.empty() && a->config_file.empty())
          throw Error("plan: give --model DIR or --config FILE");
        const fs::path cfg =
            a->config_file.empty() ? fs::path(a->model_dir) / "config.json" : fs::path(a->config_file);
        const model::ModelConfig c = model::ModelConfig::from_file(cfg);
        plan::Deployment d = a->d;
        d.deepep_fp8_dispatch = !a->bf16_dispatch;
        if (a->kv_dtype == "bf16" || a->kv_dtype == "auto") {
          d.kv_cache_dtype = plan::KvDtype::bf16;
        } else if (a->kv_dtype == "fp8_e4m3") {
          d.kv_cache_dtype = plan::KvDtype::fp8_e4m3;
        } else {
          fail("plan: --kv-cache-dtype must be bf16, auto or fp8_e4m3, got '{}'", a->kv_dtype);
        }
        if (a->a2a == "auto") {
          d.moe_a2a_backend = d.ep_size > 1 ? plan::A2aBackend::deepep : plan::A2aBackend::none;
        } else if (a->a2a == "deepep") {
          d.moe_a2a_backend = plan::A2aBackend::deepep;
        } else if (a->a2a == "none") {
          d.moe_a2a_backend = plan::A2aBackend::none;
        } else {
          fail("plan: --moe-a2a-backend must be none, deepep or auto, got '{}'", a->a2a);
        }
        plan::Hardware hw = plan::Hardware::named(a->gpu);
        if (a->interconnect_gbps != 0) {
          DSA_CHECK(a->interconnect_gbps > 0, "plan: --interconnect-gbps must be > 0, got {}",
                    a->interconnect_gbps);
          hw.interconnect_bytes_per_s = a->interconnect_gbps * 1e9;
        }
        const plan::Plan p = plan::build_plan(c, d, hw);
        if (a->as_json) {
          std::cout << plan::to_json(p).dump(2) << "\n";
        } else {
          std::cout << plan::to_text(p);
        }
        return 0;
      };
    });

}  // namespace
}  // namespace dsaserve::cli
