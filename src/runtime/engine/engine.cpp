#include "runtime/engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "runtime/engine/cuda_graph_spec.h"
#include "runtime/engine/device_sampling.h"
#include "runtime/ranks/leader.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The batch's shape as span args: batch size, prefill and decode tokens, request ids.
void batch_args(trace::Scope& s, int64_t step, const ScheduleBatch& b) {
  if (!s.on()) return;
  nlohmann::json ids = nlohmann::json::array();
  for (const ScheduledRequest& it : b.items) ids.push_back(it.id);
  s.arg("step", step)
      .arg("batch_size", int64_t(b.items.size()))
      .arg("prefill_tokens", b.num_prefill_tokens)
      .arg("decode_tokens", b.num_decode)
      .arg("request_ids", std::move(ids));
}
}  // namespace

Engine::Engine(std::shared_ptr<const model::Model> model, EngineConfig cfg)
    : model_(std::move(model)), cfg_(std::move(cfg)) {
  DSA_CHECK(model_ != nullptr, "engine: no model");
  DSA_CHECK(cfg_.kv_pages > 0, "--kv-pages must be positive, got {}", cfg_.kv_pages);
  DSA_CHECK(cfg_.page_size > 0, "--page-size must be positive, got {}", cfg_.page_size);
  shape_ = {model_->config().vocab_size, model_->config().max_position_embeddings};
  if (cfg_.ranks) {
    const Ranks& rk = *cfg_.ranks;
    DSA_CHECK(rk.leader(), "engine: rank {} runs no engine (rank 0 leads the steps)", rk.rank());
    DSA_CHECK(!cfg_.speculative.enabled(),
              "--speculative-algorithm with --tp {}: speculative decoding runs on one rank only (not yet "
              "with many)",
              rk.world_size());
    DSA_CHECK(cfg_.forward.dist == nullptr || cfg_.forward.dist == &rk.groups(),
              "engine: forward.dist is not the ranks' groups");
    const model::Shard& sh = model_->shard();
    DSA_CHECK(sh.whole() ? rk.world_size() == 1 : sh.layout == rk.layout() && sh.rank == rk.rank(),
              "engine: the model is not rank {}'s shard of {}", rk.rank(), rk.layout().describe());
    cfg_.forward.dist = &rk.groups();
    cfg_.cuda_graph_max_bs = 0;  // the followers replay no graphs: every step runs eagerly on every rank
  }
  int64_t spec_graph_bs = 0;  // the verify / draft graphs' largest batch (0: every pass eager)
  if (cfg_.speculative.enabled()) {
    cfg_.speculative.validate(model_->num_mtp_layers());
    cfg_.speculative = cfg_.speculative.resolved();
    // In order: each speculative step's drafts depend on the previous step's verdict. The round's verify
    // and draft passes replay graphs under the decode graphs' rule (rows of steps + 1 tokens for verify);
    // the normal steps (prefills, constrained decodes) keep their hidden states for the MTP layer and run
    // eagerly.
    cfg_.overlap_schedule = false;
    GraphSupport gs = graph_support(*model_, cfg_.kv_dtype, cfg_.forward, cfg_.cuda_graph_max_bs,
                                    cfg_.scheduler.max_running_requests, cuda_graphs_built());
    gs.tokens = cfg_.speculative.verify_rows();
    spec_graph_bs = cuda_graph_max_batch(gs);
    cfg_.cuda_graph_max_bs = 0;
    cfg_.forward.keep_hidden = true;
    cfg_.scheduler.speculative_num_steps = cfg_.speculative.num_steps;
  }
  // The KV cache lives where the model's weights do (see runtime/engine/device.h); the engine only ever
  // moves page ids, so prefix reuse, retraction and aborts need no device copies.
  // CUDA graphs (when cuda_graph_max_batch allows: the one rule) need one KV page no request owns (their
  // padding rows write there): the cache's last.
  const int64_t graph_bs =
      cuda_graph_max_batch(graph_support(*model_, cfg_.kv_dtype, cfg_.forward, cfg_.cuda_graph_max_bs,
                                         cfg_.scheduler.max_running_requests, cuda_graphs_built()));
  const bool graphs = graph_bs > 0 || spec_graph_bs > 0;
  const int64_t cache_pages = cfg_.kv_pages + (graphs ? 1 : 0);
  make_parts(cfg_.kv_dtype ? model::KvCache::create(model_->config(), cache_pages, cfg_.page_size,
                                                    model_->num_mtp_layers() > 0,
                                                    model_->weights().embed_tokens.device(), cfg_.kv_dtype)
                           : model_->make_cache(cache_pages, cfg_.page_size),
             graphs ? 1 : 0);
  cfg_.forward.all_logits = false;
  if (cfg_.sample_on_device) {
    DSA_CHECK(device_sampling_available(), "--sampling-device gpu: this dsaserve was built without CUDA");
    DSA_CHECK(model_->weights().embed_tokens.device() == Device::cuda,
              "--sampling-device gpu needs the model on the CUDA device (--device cuda)");
  }
  std::unique_ptr<CudaGraphRunner> graph_runner;
  if (graphs) {
    graph_runner = std::make_unique<CudaGraphRunner>(*model_, pool_->cache(), pool_->reserved_page(0),
                                                     graph_bs, cfg_.forward, cfg_.cuda_graph_log);
    stats_.cuda_graph_seconds = graph_runner->capture_all();
    stats_.cuda_graphs = graph_runner->stats().graphs;
  }
  if (spec_graph_bs > 0) {
    spec_graphs_ =
        std::make_unique<SpecGraphRunner>(*model_, pool_->cache(), pool_->reserved_page(0), spec_graph_bs,
                                          cfg_.forward, cfg_.speculative.num_steps, cfg_.cuda_graph_log);
    stats_.cuda_graph_seconds += spec_graphs_->capture_all();
    stats_.cuda_graphs += spec_graphs_->graphs();
  }
  runner_ = std::make_unique<ForwardModelRunner>(*model_, pool_->cache(), cfg_.forward, cfg_.overlap_schedule,
                                                 cfg_.sample_on_device, std::move(graph_runner));
  if (cfg_.ranks) {
    // The followers' caches: the same pages (ids), dtype and MTP layers as this one.
    runner_ = std::make_unique<LeaderRunner>(
        std::move(runner_), cfg_.ranks,
        StepInit::of(pool_->cache().num_pages, cfg_.page_size, model_->num_mtp_layers() > 0, cfg_.kv_dtype,
                     cfg_.forward));
  }
}

Engine::Engine(ModelShape shape, model::KvCache cache, RunnerFactory make_runner, EngineConfig cfg)
    : shape_(shape), cfg_(std::move(cfg)) {
  DSA_CHECK(shape_.vocab_size > 0, "engine: vocabulary of {} tokens", shape_.vocab_size);
  DSA_CHECK(make_runner != nullptr, "engine: no runner");
  DSA_CHECK(!cfg_.sample_on_device, "engine: device sampling needs the model's runner");
  DSA_CHECK(!cfg_.speculative.enabled(), "engine: speculative decoding needs the model's runner");
  cfg_.kv_pages = cache.num_pages;
  cfg_.page_size = cache.page_size;
  cfg_.cuda_graph_max_bs = 0;
  make_parts(std::move(cache), 0);
  runner_ = make_runner(pool_->cache());
  DSA_CHECK(runner_ != nullptr, "engine: the runner factory made no runner");
}

void Engine::make_parts(model::KvCache cache, int64_t reserved) {
  pool_ = std::make_unique<KvPool>(std::move(cache), reserved);
  cache_ = std::make_unique<RadixCache>(*pool_, cfg_.enable_prefix_cache);
  if (cfg_.scheduler.max_context <= 0) cfg_.scheduler.max_context = shape_.max_position_embeddings;
  scheduler_ = std::make_unique<Scheduler>(cfg_.scheduler, *pool_, *cache_);
  stats_.kv_pages_total = pool_->num_pages();
  stats_.kv_pages_free = pool_->free_pages();
  seed_counter_ = std::random_device{}();
}

Engine::~Engine() { stop(); }

void Engine::start() {
  DSA_CHECK(!thread_.joinable(), "engine: already started");
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    stop_ = true;
  }
  in_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::submit(GenerateRequest req) {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    in_submit_.push_back(std::move(req));
  }
  in_cv_.notify_one();
}

void Engine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    in_abort_.push_back(id);
  }
  in_cv_.notify_one();
}

bool Engine::wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(out_mu_);
  if (out_.empty() && !out_cv_.wait_for(lk, timeout, [&] { return !out_.empty(); })) return false;
  for (auto& o : out_) out.push_back(std::move(o));
  out_.clear();
  return true;
}

void Engine::publish(std::vector<StepOutput>& out) {
  if (out.empty()) return;
  {
    std::lock_guard<std::mutex> lk(out_mu_);
    for (auto& o : out) out_.push_back(std::move(o));
  }
  out.clear();
  out_cv_.notify_all();
}

void Engine::drain_inputs(std::vector<StepOutput>& out) {
  std::vector<GenerateRequest> submits;
  std::vector<uint64_t> aborts;
  {
    std::lock_guard<std::mutex> lk(in_mu_);
    submits.swap(in_submit_);
    aborts.swap(in_abort_);
  }
  const int64_t vocab = shape_.vocab_size;
  for (GenerateRequest& g : submits) {
    auto r = std::make_unique<Request>();
    r->id = g.id;
    r->tokens = std::move(g.prompt);
    r->params = std::move(g.params);
    std::string bad;
    for (int32_t t : r->tokens) {
      if (t < 0 || t >= vocab) {
        bad = fmt::format("prompt token id {} is outside the vocabulary [0, {})", t, vocab);
        break;
      }
    }
    if (bad.empty()) {
      try {
        r->params.validate(vocab);
      } catch (const std::exception& e) {
        bad = e.what();
      }
    }
    if (!bad.empty()) {
      StepOutput o;
      o.id = g.id;
      o.finish = FinishReason::error;
      o.error = bad;
      out.push_back(std::move(o));
      continue;
    }
    // Every request speculates, grammar-constrained ones included (runtime/spec/spec_sampling.h).
    r->speculate = cfg_.speculative.enabled();
    // Without penalties the sampler keeps no token history (no per-token map updates).
    r->sampler = SamplerState(r->params.seed ? *r->params.seed : seed_counter_++, r->tokens,
                              uses_token_history(r->params));
    if (scheduler_->find(r->id) != nullptr) {
      StepOutput o;
      o.id = g.id;
      o.finish = FinishReason::error;
      o.error = fmt::format("request id {} is already running", g.id);
      out.push_back(std::move(o));
      continue;
    }
    scheduler_->add(std::move(r), out);
  }
  for (uint64_t id : aborts) scheduler_->abort(id, out);
}

int64_t Engine::complete_in_flight(std::vector<StepOutput>& out, double& sched_s) {
  ScheduleBatch batch = std::move(in_flight_);
  in_flight_ = ScheduleBatch();
  const int64_t step = in_flight_step_;
  Tensor logits;
  std::string error;
  try {
    trace::Scope span("wait", "engine");
    span.arg("step", step);
    logits = runner_->wait();
  } catch (const std::exception& e) {
    error = e.what();
  }

  // Aborts are applied only now: the step that ran may have written the aborted requests' pages.
  drain_inputs(out);
  const auto t0 = std::chrono::steady_clock::now();
  const size_t first = out.size();
  trace::Scope sample_span("sample", "engine");
  batch_args(sample_span, step, batch);
  if (error.empty()) {
    try {
      // Prompt logprobs: their rows follow the R last-token rows; reported before the samples.
      const int64_t R = int64_t(batch.items.size());
      if (logits.size(0) > R) {
        const Tensor rows = logits.slice(0, R, logits.size(0)).to(Device::cpu).contiguous();
        scheduler_->process_prompt_logprobs(
            batch, std::span<const float>(rows.data<float>(), size_t(rows.numel())), rows.size(1), out);
        logits = logits.slice(0, 0, R);
      }
      const Tensor hidden = runner_->hidden();
      if (cfg_.sample_on_device) {
        DeviceSampledStep sampled;
        sample_on_device(*scheduler_, batch, logits, sampled);
        scheduler_->process(batch, sampled.rows, out);
      } else {
        scheduler_->process(batch, std::span<const float>(logits.data<float>(), size_t(logits.numel())),
                            logits.size(1), out);
      }
      if (cfg_.speculative.enabled()) mtp_after_step(batch, hidden);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // A failed step fails the requests in it; the engine keeps serving the others.
  if (!error.empty()) scheduler_->fail(batch, error, out);
  int64_t generated = 0;
  for (size_t i = first; i < out.size(); ++i) generated += out[i].token >= 0 ? 1 : 0;
  sched_s += seconds_since(t0);
  return generated;
}

bool Engine::step() {
  std::vector<StepOutput> out;
  const bool flying = !in_flight_.empty();
  if (!flying) {
    drain_inputs(out);
    if (scheduler_->idle()) {
      {
        std::lock_guard<std::mutex> lk(stats_mu_);  // aborts may have freed pages
        stats_.num_waiting = 0;
        stats_.num_running = 0;
        stats_.kv_pages_free = pool_->free_pages();
        stats_.prefix_cache_pages = cache_->cached_pages();
        stats_.last_batch_size = 0;
      }
      if (cfg_.check_integrity) scheduler_->check_integrity();
      runner_->idle();
      publish(out);
      return false;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Step N+1's batch, from the state step N (in flight) will leave: its samples are future tokens.
  const int64_t step_no = step_no_;
  trace::Scope step_span("step", "engine");
  ScheduleBatch batch, spec_batch;
  model::ForwardBatch fb;
  if (!scheduler_->idle()) {
    {
      trace::Scope span("schedule", "engine");
      batch = scheduler_->schedule(out);
      batch_args(span, step_no, batch);
    }
    // Speculative items run their own passes after the normal ones (spec_round).
    spec_batch.items.clear();
    std::erase_if(batch.items, [&](const ScheduledRequest& s) {
      if (s.drafts > 0) spec_batch.items.push_back(s);
      return s.drafts > 0;
    });
    batch.num_decode -= int64_t(spec_batch.items.size());
    spec_batch.num_decode = int64_t(spec_batch.items.size());
    if (!batch.empty()) {
      trace::Scope span("build_batch", "engine");
      span.arg("step", step_no);
      fb = scheduler_->build_forward(batch);
    }
  }
  double sched_s = seconds_since(t0);
  int64_t generated = 0;
  if (flying) {
    generated += complete_in_flight(out, sched_s);
    // Step N's samples are known: drop finished requests, fill in the future input ids.
    const auto t1 = std::chrono::steady_clock::now();
    trace::Scope span("build_batch", "engine");
    span.arg("step", step_no).arg("resolve", true);
    if (scheduler_->prune(batch)) {
      fb = batch.empty() ? model::ForwardBatch() : scheduler_->build_forward(batch);
    } else if (!batch.empty()) {
      scheduler_->resolve(batch, fb);
    }
    sched_s += seconds_since(t1);
  }
  if (cfg_.check_integrity) scheduler_->check_integrity();
  const int64_t batch_size = int64_t(batch.items.size() + spec_batch.items.size());
  const int64_t prefill_tokens = batch.num_prefill_tokens;
  batch_args(step_span, step_no, batch);
  if (!batch.empty()) {
    {
      trace::Scope span("launch", "engine");
      batch_args(span, step_no, batch);
      scheduler_->commit(batch);
      runner_->launch(std::move(fb));
    }
    in_flight_ = std::move(batch);
    in_flight_step_ = step_no;
    step_no_ += 1;
    if (!cfg_.overlap_schedule) {
      generated += complete_in_flight(out, sched_s);
      if (cfg_.check_integrity) scheduler_->check_integrity();
    }
  }
  if (!spec_batch.empty()) {
    generated += spec_round(spec_batch, out);
    step_no_ += batch.empty() ? 1 : 0;
    if (cfg_.check_integrity) scheduler_->check_integrity();
  }
  trace::Scope post_span("postprocess", "engine");
  post_span.arg("step", step_no).arg("outputs", int64_t(out.size()));
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.num_waiting = scheduler_->num_waiting();
    stats_.num_running = scheduler_->num_running();
    stats_.kv_pages_free = pool_->free_pages();
    stats_.prefix_cache_pages = cache_->cached_pages();
    stats_.steps += batch_size > 0 ? 1 : 0;
    stats_.prompt_tokens = scheduler_->num_admitted_prompt_tokens();
    stats_.prefix_hit_tokens = scheduler_->num_prefix_hit_tokens();
    stats_.prefill_tokens += prefill_tokens;
    stats_.generated_tokens += generated;
    stats_.retractions = scheduler_->num_retractions();
    stats_.last_batch_size = batch_size;
    stats_.busy_seconds += seconds_since(t0);
    stats_.schedule_seconds += sched_s;
    stats_.launch_gap_seconds = runner_->gap_seconds();
    stats_.cuda_graph_replays = runner_->graph_replays() + (spec_graphs_ ? spec_graphs_->replays() : 0);
  }
  publish(out);
  trace::Recorder* rec = trace::active();
  if (rec != nullptr && batch_size > 0 && !cfg_.trace_dir.empty() && cfg_.trace_flush_steps > 0 &&
      step_no_ % cfg_.trace_flush_steps == 0) {
    // The runner may be recording meanwhile: flush() takes the events under the recorder's lock.
    try {
      const auto path = rec->flush(cfg_.trace_dir);
      std::fprintf(stderr, "dsaserve engine: trace -> %s\n", path.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dsaserve engine: %s\n", e.what());
    }
  }
  return true;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void Engine::loop() {
  while (!stop_) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      // A bug in the scheduler (an integrity check, an invariant): say so and keep serving what can be.
      std::fprintf(stderr, "dsaserve engine: step failed: %s\n", e.what());
      worked = true;
    }
    if (worked) continue;
    std::unique_lock<std::mutex> lk(in_mu_);
    in_cv_.wait_for(lk, std::chrono::milliseconds(100),
                    [&] { return stop_ || !in_submit_.empty() || !in_abort_.empty(); });
  }
}

}  // namespace dsaserve::runtime
