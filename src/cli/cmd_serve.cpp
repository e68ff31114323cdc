// dsaserve serve: the OpenAI-compatible server (flags named like SGLang's where the concept is the same).
// With --tp N the process launches N ranks of itself (cli/serving_ranks.h): rank 0 is the server (HTTP
// front, engine) and sends each step's batch to the others, which hold their shards of the weights and run
// the same forward (runtime/ranks/leader.h). With --attn-dp-size D each of the D DP groups' leaders runs
// an engine of its own and rank 0's front routes the requests to them (runtime/ranks/dp.h). SIGTERM to
// the process reaches rank 0, which drains its requests and then stops the others; a rank that dies ends
// them all with an error.
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "cli/dist_flags.h"
#include "cli/model_options.h"
#include "cli/serving_ranks.h"
#include "command.h"
#include "core/error.h"
#include "kernel_flags.h"
#include "spec_flags.h"
#ifdef DSASERVE_HAVE_SERVER
#include "model/load.h"
#include "runtime/engine/device.h"
#include "runtime/ranks/dp.h"
#include "runtime/ranks/leader.h"
#include "server/builtin.h"
#include "server/server.h"
#include "trace/trace.h"
#endif

namespace dsaserve::cli {
namespace {

#ifdef DSASERVE_HAVE_SERVER
// A rank's model as rank 0 loads it: its shard, on its device, warmed up alike.
std::shared_ptr<model::Model> load_rank_model(const server::ServerConfig& cfg, const runtime::Ranks& ranks) {
  const Device device = runtime::parse_device(cfg.device);
  runtime::use_device(device);
  std::shared_ptr<model::Model> model;
  if (server::is_builtin_model(cfg.model.model)) {
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsaserve-builtin-{}", ::getpid());
    model = server::make_builtin_model(dir, cfg.builtin_seed);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);  // the weights stay mapped
  } else {
    model = model::load_model(cfg.model, device, false);
  }
  const model::KvCacheDtype kv_dtype =
      runtime::resolve_kv_cache_dtype(cfg.kv_cache_dtype, device, model->config());
  if (ranks.world_size() > 1) model = model->sharded(ranks.shard());
  model = runtime::model_on_device(std::move(model), device, cfg.kernels, kv_dtype);
  if (device == Device::cuda) runtime::warm_up(*model, kv_dtype, 64, cfg.engine.forward);  // as rank 0 does
  runtime::release_cached_memory(device);
  return model;
}

// `run()` on a rank other than rank 0; with --trace-dir D it records the rank's spans (its model's ops and
// collectives) and writes them, with their plan summary, to D/rank<r> once run() returns.
int traced_rank(const server::ServerConfig& cfg, const runtime::Ranks& ranks, const model::Model& model,
                const std::function<int()>& run) {
  if (cfg.engine.trace_dir.empty()) return run();
  DSA_CHECK(cfg.trace_max_events > 0, "--trace-max-events must be positive, got {}", cfg.trace_max_events);
  trace::Recorder recorder;
  recorder.set_max_events(size_t(cfg.trace_max_events));
  recorder.set_annotator(server::trace_plan_annotator(cfg, model.config()));
  struct Uninstall {
    ~Uninstall() { trace::set_active(nullptr); }
  } uninstall;
  trace::set_active(&recorder);
  const int rc = run();
  trace::set_active(nullptr);
  recorder.write(fmt::format("{}/rank{}", cfg.engine.trace_dir, ranks.rank()));
  return rc;
}

// A follower rank of `serve --tp N`: its leader's steps until the server stops.
int follow_server(const server::ServerConfig& cfg, const runtime::Ranks& ranks) {
  const std::shared_ptr<model::Model> model = load_rank_model(cfg, ranks);
  return traced_rank(cfg, ranks, *model, [&] {
    runtime::follow_steps(*model, ranks);
    return 0;
  });
}

CommandRun setup(CLI::App& sub) {
  auto cfg = std::make_shared<server::ServerConfig>();
  cfg->engine.kv_pages = -1;  // auto: 512 pages on the CPU, from free memory on CUDA
  add_model_options(sub, cfg->model, "--model-path,--model",
                    "model folder (config.json + safetensors), builtin:demo (alias builtin), or with "
                    "--load-format dummy a config file")
      ->required();
  sub.add_option("--tokenizer-path,--tokenizer", cfg->tokenizer_path,
                 "tokenizer folder or tokenizer.json, or builtin:bytes (default: the model folder's)");
  sub.add_option("--chat-template", cfg->chat_template_path,
                 "Jinja file overriding the tokenizer's chat template");
  sub.add_option("--served-model-name", cfg->served_model_name,
                 "model name in the API (default: folder name)");
  sub.add_option("--host", cfg->host, "address or host name to listen on")->capture_default_str();
  sub.add_option("--port", cfg->port, "port (0: any free one, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  sub.add_option("--api-key", cfg->api_key, "require Authorization: Bearer <key> on /v1/*");
  sub.add_option(
      "--reasoning-parser", cfg->reasoning_parser,
      "split <think>...</think> into reasoning_content: deepseek-r1, deepseek-v3, glm45, qwen3, kimi");
  sub.add_option("--tool-call-parser", cfg->tool_call_parser,
                 "parse tool calls into tool_calls: glm45, glm47, deepseekv3, deepseekv31, deepseekv32");
  sub.add_option("--context-length", cfg->context_length,
                 "max prompt + output tokens (default: the model's)");
  sub.add_option("--max-running-requests", cfg->engine.scheduler.max_running_requests,
                 "requests in the running batch")
      ->capture_default_str();
  sub.add_option("--max-prefill-tokens", cfg->engine.scheduler.max_prefill_tokens,
                 "new prefill tokens per step")
      ->capture_default_str();
  sub.add_option("--chunked-prefill-size", cfg->engine.scheduler.chunked_prefill_size,
                 "most prefill tokens of one request per step (<= 0: no chunking)")
      ->capture_default_str();
  sub.add_option("--page-size", cfg->engine.page_size, "tokens per KV page")->capture_default_str();
  sub.add_option("--kv-pages", cfg->engine.kv_pages,
                 "KV pool pages (0: from --mem-fraction-static; default: 512 on the CPU, on CUDA the memory "
                 "free after the weights less the activation workspace a step can hold and a 1% reserve)");
  sub.add_option("--mem-fraction-static", cfg->mem_fraction_static,
                 "with --kv-pages 0: fraction of RAM for weights + KV cache (cpu); fraction of the device "
                 "memory free after the weights, less an activation workspace estimate, for the KV cache "
                 "(cuda)");
  sub.add_option("--device", cfg->device, "where the model runs: cpu or cuda")->capture_default_str();
  sub.add_option("--sampling-device", cfg->sampling_device,
                 "where the tokens are sampled: cpu (the logits are copied to the host) or gpu (needs "
                 "--device cuda; requests with a grammar constraint still sample on the CPU)")
      ->capture_default_str();
  sub.add_option("--kv-cache-dtype", cfg->kv_cache_dtype,
                 "KV cache dtype: auto (bf16 on cuda when the sm_90a kernels fit the model, else f32), bf16, "
                 "fp8_e4m3 (cuda) or f32")
      ->capture_default_str();
  sub.add_option("--cuda-graph-max-bs", cfg->engine.cuda_graph_max_bs,
                 "with --device cuda: replay captured CUDA graphs for decode batches of up to this many "
                 "requests (capped by --max-running-requests; 0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  auto disable_graphs = std::make_shared<bool>(false);
  sub.add_flag("--disable-cuda-graph", *disable_graphs, "run every step eagerly (no CUDA graphs)");
  sub.add_flag(
      "--disable-radix-cache", [cfg](int64_t) { cfg->engine.enable_prefix_cache = false; },
      "no prefix cache");
  sub.add_option("--max-queued-requests", cfg->max_queued_requests, "waiting requests before 503")
      ->capture_default_str();
  sub.add_option("--max-prompt-tokens", cfg->max_prompt_tokens, "prompt length limit (default: context - 1)");
  sub.add_option("--max-body-bytes", cfg->max_body_bytes, "request body limit (larger: 413)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub.add_option("--shutdown-grace", cfg->shutdown_grace_s,
                 "seconds in-flight requests get after SIGTERM (then they end with an error)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--seed", cfg->builtin_seed, "seed of the builtin model's random weights")
      ->capture_default_str();
  sub.add_flag(
      "--disable-overlap-schedule", [cfg](int64_t) { cfg->engine.overlap_schedule = false; },
      "schedule step N+1 only after step N (default: while step N's forward runs)");
  sub.add_flag("--enable-priority-scheduling", cfg->engine.scheduler.enable_priority,
               "admit waiting requests by their `priority` field (larger first), FCFS within a priority; "
               "retract the lowest priority first (default: pure FCFS)");
  sub.add_flag("--schedule-low-priority-values-first", cfg->engine.scheduler.low_priority_values_first,
               "with --enable-priority-scheduling: smaller priority values are more urgent");
  sub.add_option("--trace-dir", cfg->engine.trace_dir,
                 "write a Chrome trace (engine phases per step, model layer/op/kernel spans) to "
                 "DIR/trace-<pid>-<n>.json every --trace-flush-steps steps and at shutdown (with --tp: "
                 "rank 0's; each other rank writes its model spans to DIR/rank<r>/ when it ends)");
  sub.add_option("--trace-flush-steps", cfg->engine.trace_flush_steps,
                 "with --trace-dir: steps between trace files (0: only at shutdown)")
      ->capture_default_str();
  sub.add_option("--trace-max-events", cfg->trace_max_events,
                 "with --trace-dir: events kept per trace file; later ones are dropped and counted")
      ->capture_default_str();
  sub.add_flag("--check-integrity", cfg->engine.check_integrity,
               "check scheduler/KV invariants every step (debug)");
  add_spec_flags(sub, cfg->engine.speculative);
  auto kflags = add_kernel_flags(sub);
  auto dflags = add_dist_flags(sub);
  auto rflags = add_serving_rank_flags(sub);
  return [cfg, disable_graphs, kflags, dflags, rflags] {
    if (*disable_graphs) cfg->engine.cuda_graph_max_bs = 0;
    cfg->engine.speculative.validate(1);  // the flags alone; the engine checks the model has an MTP layer
    cfg->kernels = kflags->options();
    const Device device = runtime::parse_device(cfg->device);
    check_serving_ranks(*dflags, *rflags, "serve", device, cfg->model,
                        server::is_builtin_model(cfg->model.model), cfg->engine.speculative.enabled());
    if (const auto status = launch_serving_ranks(*dflags, *rflags, device, true)) return *status;
    if (const auto ranks = connect_serving_rank(*dflags, device, 0)) {
      cfg->engine.ranks = ranks;
      cfg->engine.forward.dist = &ranks->groups();
      cfg->engine.forward.dsa_topk_broadcast = rflags->dsa_topk_broadcast;
      cfg->engine.forward.moe_a2a_deepep = dflags->deepep();
      cfg->engine.forward.deepep_fp8_dispatch = !dflags->deepep_bf16_dispatch;
      cfg->load_balance_method = rflags->load_balance_method;
      if (!ranks->leader()) return follow_server(*cfg, *ranks);
      // Attention DP: another DP group's leader runs that group's engine for the front (runtime/ranks/dp.h).
      if (!ranks->front()) {
        std::shared_ptr<model::Model> model = load_rank_model(*cfg, *ranks);
        return traced_rank(*cfg, *ranks, *model, [&] { return runtime::serve_dp_group(model, ranks); });
      }
    }
    return server::run_server(*cfg);
  };
}
#else
CommandRun setup(CLI::App& sub) {
  sub.allow_extras();
  return
      []() -> int { fail("dsaserve was built without Boost: the server (dsaserve serve) is not available"); };
}
#endif

const CommandRegistration reg("serve", "OpenAI-compatible server (chat/completions, SSE, /metrics)", setup);

}  // namespace
}  // namespace dsaserve::cli
