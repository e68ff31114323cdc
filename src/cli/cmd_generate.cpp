// dsaserve generate --model DIR [--load-format dummy] [--json-model-override-args JSON] (--prompt-ids 1,2,3 |
// --prompt-ids-file F) --max-new-tokens N
//                   [--temperature T --top-k K --top-p P --min-p M --seed S] [--page-size P] [--threads N]
//                   [--device cpu|cuda] [--kv-cache-dtype auto|bf16|fp8_e4m3|f32]
//                   [--cuda-graph-max-bs N | --disable-cuda-graph]
// Continues a token prompt on the CPU or GPU (one prefill, then one decode step per token) and prints the
// new token ids as JSON: {"output_ids": [...], ...timings}. On CUDA the decode steps replay a captured
// CUDA graph (runtime/engine/cuda_graph_runner.h) unless --disable-cuda-graph (or --cuda-graph-max-bs 0).
// Greedy (argmax, ties to the lowest id) unless a sampling flag is given; sampling uses the runtime sampler
// (runtime/sampler).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#include "cli/command.h"
#include "cli/model_options.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "core/parallel.h"
#include "kernels/ops.h"
#include "model/load.h"
#include "model/score.h"
#include "runtime/engine/cuda_graph_runner.h"
#include "runtime/engine/device.h"
#include "runtime/sampler/sampler.h"

namespace dsaserve::cli {
namespace {

// model::generate_tokens with the decode steps replayed through a CUDA graph (batch 1): the cache has one
// page more, the padding rows' scratch page (unused at batch 1, but the runner needs one). Returns the
// tokens; `replays` counts the steps that replayed.
std::vector<int32_t> generate_with_graphs(const model::Model& m, std::span<const int32_t> prompt,
                                          int64_t max_new,
                                          const std::function<int32_t(std::span<const float>)>& pick,
                                          int64_t page_size, int64_t& replays) {
  std::shared_ptr<runtime::CudaGraphRunner> graphs;
  return model::generate_tokens(
      m, prompt, max_new, pick, page_size, 1, [&](model::KvCache& cache, int64_t pages) -> model::StepFn {
        model::ForwardOptions fo;
        fo.all_logits = false;
        graphs = std::make_shared<runtime::CudaGraphRunner>(m, cache, int32_t(pages), 1, fo, false);
        return [&](const model::ForwardBatch& b, model::KvCache& c, const model::ForwardOptions& o) {
          if (std::optional<Tensor> g = graphs->run(b)) {
            ++replays;
            return *g;
          }
          return m.forward(b, c, o).logits;
        };
      });
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
  return [o, temp, topk, topp, minp, seed]() -> int {
    DSA_CHECK(!o->prompt.empty() || !o->prompt_file.empty(),
              "generate: give the prompt with --prompt-ids or --prompt-ids-file");
    const std::vector<int32_t> prompt =
        read_token_ids(o->prompt, "--prompt-ids", o->prompt_file, "--prompt-ids-file");
    DSA_CHECK(!prompt.empty(), "generate: the prompt is empty");
    if (o->threads > 0) set_num_threads(o->threads);
    const bool sampling = temp->count() + topk->count() + topp->count() + minp->count() + seed->count() > 0;

    const Device device = runtime::parse_device(o->device);
    runtime::use_device(device);
    const auto t0 = std::chrono::steady_clock::now();
    auto model = model::load_model(o->model, device, false);
    const model::KvCacheDtype kv_dtype =
        runtime::resolve_kv_cache_dtype(o->kv_cache_dtype, device, model->config());
    if (device == Device::cuda) model::set_default_cuda_kv_dtype(kv_dtype);  // the caches generate makes
    const auto t_up = std::chrono::steady_clock::now();
    model = runtime::model_on_device(std::move(model), device);
    const double upload_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_up).count();
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
    runtime::SamplerState state(o->seed, prompt);
    std::vector<float> scratch;
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    // Greedy: the first maximum (ties to the lowest id, like kernels::argmax and greedy_generate).
    const std::function<int32_t(std::span<const float>)> pick = [&](std::span<const float> logits) {
      if (!sampling) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      const runtime::SampleResult r = runtime::sample(logits, sp, state, scratch);
      state.record(r.token);
      return int32_t(r.token);
    };
    const bool graphs = device == Device::cuda && !o->disable_cuda_graph && o->cuda_graph_max_bs > 0 &&
                        kv_dtype != model::KvCacheDtype::f32;
    int64_t replays = 0;
    if (graphs) {
      out = generate_with_graphs(*model, prompt, o->max_new, pick, o->page_size, replays);
    } else if (!sampling) {
      out = model::greedy_generate(*model, prompt, o->max_new, o->page_size);
    } else {
      out = model::generate_tokens(*model, prompt, o->max_new, pick, o->page_size);
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
    fmt::print("{}\n", j.dump());
    return 0;
  };
}

const CommandRegistration reg("generate",
                              "continue a token prompt on the CPU or GPU (greedy, or sampled with flags)",
                              setup);

}  // namespace
}  // namespace dsaserve::cli
