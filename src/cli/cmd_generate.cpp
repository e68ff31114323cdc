// dsaserve generate --model DIR [--load-format dummy] [--json-model-override-args JSON] (--prompt-ids 1,2,3 |
// --prompt-ids-file F) --max-new-tokens N
//                   [--temperature T --top-k K --top-p P --min-p M --seed S] [--page-size P] [--threads N]
//                   [--device cpu|cuda] [--kv-cache-dtype auto|bf16|fp8_e4m3|f32]
//                   [--cuda-graph-max-bs N | --disable-cuda-graph]
//                   [--speculative-algorithm EAGLE|NEXTN --speculative-num-steps N
//                    --speculative-eagle-topk 1 --speculative-num-draft-tokens N+1]
//                   [--tp N [--ep-size E] [--attn-dp-size D [--load-balance-method M]] [--dsa-topk-broadcast]
//                    [--dist-timeout S] [--dist-launch]]
// Continues a token prompt on the CPU or GPU and prints the new token ids as JSON: {"output_ids": [...],
// ...timings}. The serving engine's loop runs it (runtime::Engine::step on this thread, one request: one
// prefill, then one decode step per token, no EOS stop), so `generate` and `serve` share the scheduler,
// KV manager, model runner and sampler. On CUDA the decode steps replay a captured CUDA graph
// (runtime/engine/cuda_graph_runner.h) unless --disable-cuda-graph (or --cuda-graph-max-bs 0). Greedy
// (argmax, ties to the lowest id) unless a sampling flag is given. With --speculative-algorithm the
// request decodes speculatively through the engine (EngineConfig::speculative: the MTP layer drafts N
// tokens, the target verifies N + 1 rows, eagerly, no CUDA graphs; sampled requests by speculative
// sampling: the same distribution, other tokens than without speculation for one seed) and the JSON adds
// "speculative" (its accept statistics).
// With --tp N the process launches N ranks of itself (cli/serving_ranks.h): each holds its shard of the
// weights; rank 0 runs the engine and sends each step's batch to the others, which run the same forward
// (runtime/ranks/leader.h); rank 0 prints the JSON. With --attn-dp-size D the request goes through the DP
// controller (runtime/ranks/front.h) to one DP group's engine (round robin: group 0's) while the other
// groups take idle steps.
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/dist_flags.h"
#include "cli/kernel_flags.h"
#include "cli/model_options.h"
#include "cli/serving_ranks.h"
#include "cli/spec_flags.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/ops.h"
#include "model/load.h"
#include "runtime/engine/device.h"
#include "runtime/engine/engine.h"
#include "runtime/ranks/dp.h"
#include "runtime/ranks/front.h"
#include "runtime/ranks/leader.h"
#include "runtime/sampler/sampler.h"
#include "runtime/spec/spec_config.h"

namespace dsaserve::cli {
namespace {

// Runs one request through the engine on this thread; returns its tokens (a failed request throws).
std::vector<int32_t> generate_on_engine(runtime::Engine& engine, runtime::GenerateRequest req) {
  engine.submit(std::move(req));
  std::vector<int32_t> out;
  std::vector<runtime::StepOutput> outs;
  for (bool working = true; working;) {
    working = engine.step();
    engine.wait_outputs(outs, std::chrono::milliseconds(0));
    for (const runtime::StepOutput& o : outs) {
      DSA_CHECK(o.finish != runtime::FinishReason::error, "generate: {}", o.error);
      if (o.token >= 0) out.push_back(o.token);
    }
    outs.clear();
  }
  return out;
}

// The same through a front (attention DP: the DP controller routes the request to a DP group's engine).
std::vector<int32_t> generate_on_front(runtime::EngineFront& front, runtime::GenerateRequest req) {
  front.start();
  front.submit(std::move(req));
  std::vector<int32_t> out;
  std::string error;
  for (bool done = false; !done;) {
    std::vector<runtime::StepOutput> outs;
    front.wait_outputs(outs, std::chrono::milliseconds(100));
    for (const runtime::StepOutput& o : outs) {
      if (o.token >= 0) out.push_back(o.token);
      if (o.finish == runtime::FinishReason::error) error = o.error;
      done = done || o.finish != runtime::FinishReason::none;
    }
  }
  front.stop();
  DSA_CHECK(error.empty(), "generate: {}", error);
  return out;
}

CommandRun setup(CLI::App& sub) {
  struct Opts {
    model::LoadSpec model;
    std::string prompt, prompt_file, device = "cpu", kv_cache_dtype = "auto";
    int64_t max_new = 16, page_size = 64, cuda_graph_max_bs = 256;
    bool disable_cuda_graph = false;
    int threads = 0;
    float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f;
    int32_t top_k = 0;
    uint64_t seed = 0;
    runtime::SpeculativeConfig spec;
  };
  auto o = std::make_shared<Opts>();
  add_model_options(sub, o->model)->required();
  auto* p = sub.add_option("--prompt-ids", o->prompt, "prompt token ids, comma-separated");
  auto* pf = sub.add_option("--prompt-ids-file", o->prompt_file, "file of prompt token ids");
  p->excludes(pf);
  sub.add_option("--max-new-tokens", o->max_new, "tokens to generate")->check(CLI::NonNegativeNumber);
  auto* temp = sub.add_option("--temperature", o->temperature, "sampling temperature (default: greedy)");
  auto* topk = sub.add_option("--top-k", o->top_k, "sample among the k most likely tokens");
  auto* topp = sub.add_option("--top-p", o->top_p, "nucleus sampling mass");
  auto* minp = sub.add_option("--min-p", o->min_p, "drop tokens below min_p * p_max");
  auto* seed = sub.add_option("--seed", o->seed, "sampling seed");
  sub.add_option("--page-size", o->page_size, "KV cache page size in tokens")->check(CLI::PositiveNumber);
  sub.add_option("--threads", o->threads, "CPU threads (default: DSASERVE_THREADS or all cores)");
  sub.add_option("--device", o->device, "where the model runs: cpu or cuda")->capture_default_str();
  sub.add_option("--kv-cache-dtype", o->kv_cache_dtype,
                 "KV cache dtype: auto (bf16 on cuda when the sm_90a kernels fit the model, else f32), bf16, "
                 "fp8_e4m3 (cuda) or f32")
      ->capture_default_str();
  sub.add_option("--cuda-graph-max-bs", o->cuda_graph_max_bs,
                 "with --device cuda: replay the decode steps through a captured CUDA graph (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--disable-cuda-graph", o->disable_cuda_graph, "run every step eagerly (no CUDA graphs)");
  add_spec_flags(sub, o->spec);
  auto kflags = add_kernel_flags(sub);
  auto dflags = add_dist_flags(sub);
  auto rflags = add_serving_rank_flags(sub);
  return [o, temp, topk, topp, minp, seed, kflags, dflags, rflags]() -> int {
    DSA_CHECK(!o->prompt.empty() || !o->prompt_file.empty(),
              "generate: give the prompt with --prompt-ids or --prompt-ids-file");
    const std::vector<int32_t> prompt =
        read_token_ids(o->prompt, "--prompt-ids", o->prompt_file, "--prompt-ids-file");
    DSA_CHECK(!prompt.empty(), "generate: the prompt is empty");
    if (o->threads > 0) set_num_threads(o->threads);
    const bool sampling = temp->count() + topk->count() + topp->count() + minp->count() + seed->count() > 0;

    const Device device = runtime::parse_device(o->device);
    o->spec.validate(1);  // the flags alone; the model's MTP layer is checked once loaded
    // Ranks: checked once, before any starts; this process runs them, or is one.
    check_serving_ranks(*dflags, *rflags, "generate", device, o->model, false, o->spec.enabled());
    if (const auto status = launch_serving_ranks(*dflags, *rflags, device, false)) return *status;
    const std::shared_ptr<runtime::Ranks> ranks = connect_serving_rank(*dflags, device, o->threads);
    runtime::use_device(device);
    const auto t0 = std::chrono::steady_clock::now();
    o->spec.validate(1);  // the flags alone; the model's MTP layer is checked once loaded
    const bool speculate = o->spec.enabled();
    auto model = model::load_model(o->model, device, speculate);
    if (speculate) o->spec.validate(model->num_mtp_layers());
    const model::KvCacheDtype kv_dtype =
        runtime::resolve_kv_cache_dtype(o->kv_cache_dtype, device, model->config());
    if (ranks && ranks->world_size() > 1) model = model->sharded(ranks->shard());  // this rank's shard only
    const auto t_up = std::chrono::steady_clock::now();
    model = runtime::model_on_device(std::move(model), device, kflags->options(), kv_dtype);
    const double upload_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_up).count();
    if (ranks && !ranks->leader()) {  // a follower: its leader's steps until it is done
      runtime::follow_steps(*model, *ranks);
      return 0;
    }
    // Attention DP: another DP group's leader serves the front's requests to its group (runtime/ranks/dp.h).
    if (ranks && !ranks->front()) return runtime::serve_dp_group(std::move(model), ranks);
    const int64_t V = model->config().vocab_size;
    check_token_ids(prompt, V);
    runtime::SamplingParams sp;
    sp.temperature = sampling && temp->count() == 0 ? 1.0f : o->temperature;
    sp.top_k = o->top_k;
    sp.top_p = o->top_p;
    sp.min_p = o->min_p;
    sp.seed = o->seed;
    sp.max_new_tokens = o->max_new;
    sp.validate(V);
    sp.ignore_eos = true;  // max_new_tokens tokens, whatever they are
    const auto t1 = std::chrono::steady_clock::now();
    // One request: its whole prompt in one prefill step, a context limit that max_new_tokens reaches
    // first, KV pages for all of it (admission counts one token more), no prefix cache.
    const int64_t total = int64_t(prompt.size()) + o->max_new;
    runtime::EngineConfig ec;
    ec.page_size = o->page_size;
    ec.kv_pages = (total + 1 + o->page_size - 1) / o->page_size;
    ec.enable_prefix_cache = false;
    ec.scheduler.max_running_requests = 1;
    ec.scheduler.chunked_prefill_size = 0;
    ec.scheduler.max_prefill_tokens = int64_t(prompt.size());
    ec.scheduler.max_context = total + 1;
    const bool graphs = device == Device::cuda && !o->disable_cuda_graph && o->cuda_graph_max_bs > 0 &&
                        kv_dtype != model::KvCacheDtype::f32;
    ec.cuda_graph_max_bs = graphs ? o->cuda_graph_max_bs : 0;
    ec.cuda_graph_log = false;  // stdout is the JSON line
    ec.ranks = ranks;
    ec.forward.dsa_topk_broadcast = rflags->dsa_topk_broadcast;
    ec.forward.moe_a2a_deepep = dflags->deepep();
    ec.forward.deepep_fp8_dispatch = !dflags->deepep_bf16_dispatch;
    if (speculate) {
      ec.speculative = o->spec;  // the engine: steps in order (verify / draft graphs on CUDA), KV for a round
      ec.kv_pages = (total + 1 + o->spec.num_steps + 1 + o->page_size - 1) / o->page_size;
      ec.scheduler.max_context += o->spec.num_steps + 1;  // max_new_tokens still cuts the last round
    }
    runtime::GenerateRequest req;
    req.prompt = prompt;
    req.params = sp;
    std::vector<int32_t> out;
    runtime::EngineStats st;
    std::vector<int64_t> routed;
    if (ranks && ranks->dp_size() > 1) {
      runtime::DpFront front(std::move(model), ec, ranks,
                             runtime::parse_load_balance(rflags->load_balance_method));
      out = generate_on_front(front, std::move(req));
      st = front.stats();
      routed = front.routed();
    } else {
      runtime::Engine engine(std::move(model), ec);
      out = generate_on_engine(engine, std::move(req));
      st = engine.stats();
    }
    const int64_t replays = st.cuda_graph_replays;
    nlohmann::json spec_json;
    if (speculate) {
      spec_json = {
          {"used", true},
          {"algorithm", o->spec.algorithm},
          {"num_steps", o->spec.num_steps},
          {"num_draft_tokens", o->spec.verify_rows()},
          {"rounds", st.spec_rounds},
          {"drafted_tokens", st.spec_drafted_tokens},
          {"accepted_tokens", st.spec_accepted_tokens},
          {"accept_length_mean",
           st.spec_rounds > 0 ? 1.0 + double(st.spec_accepted_tokens) / double(st.spec_rounds) : 0.0},
          {"accept_length_histogram", st.spec_accept_length_hist}};
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double load_s = std::chrono::duration<double>(t1 - t0).count();
    const double run_s = std::chrono::duration<double>(t2 - t1).count();
    nlohmann::json j{{"output_ids", out},
                     {"prompt_tokens", prompt.size()},
                     {"sampling", sampling ? "sample" : "greedy"},
                     {"device", std::string(device_name(device))},
                     {"kv_cache_dtype", runtime::kv_cache_dtype_name(kv_dtype)},
                     {"load_seconds", load_s},
                     {"upload_seconds", upload_s},
                     {"generate_seconds", run_s},
                     {"cuda_graph_replays", replays},
                     {"threads", num_threads()}};
    if (ranks) j["ranks"] = {{"world_size", ranks->world_size()}, {"layout", ranks->layout().describe()}};
    if (!routed.empty()) j["ranks"]["dp_routed"] = routed;  // requests per DP group
    if (!spec_json.is_null()) j["speculative"] = spec_json;
    fmt::print("{}\n", j.dump());
    return 0;
  };
}

const CommandRegistration reg("generate",
                              "continue a token prompt on the CPU or GPU (greedy, or sampled with flags)",
                              setup);

}  // namespace
}  // namespace dsaserve::cli
