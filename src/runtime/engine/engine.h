#pragma once
// Engine: the one thread that owns the model's state (KV pool, prefix cache, scheduler) and runs the
// loop schedule -> forward -> sample/postprocess. With overlap scheduling (the default) step N's forward
// runs on the ModelRunner while this thread schedules and builds step N+1 (its decode inputs are the
// future tokens of step N, resolved after step N is sampled and before step N+1 launches); the tokens
// are the same as without overlap. Other threads talk to it only through two queues of
// plain structs: submit()/abort() in, wait_outputs() out (one StepOutput per generated token or finish,
// in order per request). step() runs one iteration on the caller's thread (tests, `generate` and the
// scheduler bench drive it directly). The parts: Scheduler (policy), KvManager (pages per request),
// RadixCache, the ModelRunner (the model's ForwardModelRunner, or one the caller injects) and the
// OutputProcessor (stop rules over each request's sampled tokens).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/engine/model_runner.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/radix/radix_cache.h"
#include "runtime/scheduler/scheduler.h"
#include "runtime/spec/spec_config.h"
#include "runtime/spec/spec_round.h"

namespace dsaserve::runtime {

class Ranks;            // runtime/ranks/ranks.h
class SpecGraphRunner;  // runtime/engine/cuda_graph_spec.h

struct EngineConfig {
  SchedulerConfig scheduler;
  int64_t kv_pages = 1024;  // pages of page_size tokens in the pool
  int64_t page_size = 64;
  bool enable_prefix_cache = true;
  bool check_integrity = false;  // Scheduler::check_integrity() after every step (tests, debug)
  bool overlap_schedule = true;  // prepare step N+1 while step N's forward runs
  // With a trace recorder installed (trace::set_active): every step's phases are recorded as "engine"
  // spans, and when trace_dir is set the engine thread flushes the recorder to trace_dir every
  // trace_flush_steps steps (the caller flushes the rest at shutdown).
  std::string trace_dir;
  int64_t trace_flush_steps = 256;
  model::ForwardOptions forward;
  // Sample on the device (serve --sampling-device gpu; engine/device_sampling.h): the logits stay on the
  // CUDA device and only constrained requests' rows are copied to the host. Needs a CUDA build and the
  // model on the CUDA device.
  bool sample_on_device = false;
  // The KV cache's dtype (on the model's device); unset: the device's default (model::KvCache::create).
  std::optional<model::KvCacheDtype> kv_dtype;
  // CUDA graphs for decode batches of up to this many requests (--cuda-graph-max-bs; 0 or
  // --disable-cuda-graph: off); with speculation for the verify / draft passes instead
  // (cuda_graph_spec.h). Used when the model is on CUDA with a bf16 / FP8 KV cache; the cache then has
  // one page more than kv_pages, outside the pool (padding rows write there). See cuda_graph_runner.h.
  int64_t cuda_graph_max_bs = 256;
  bool cuda_graph_log = true;  // the graph runner's capture lines on stdout (generate: off, stdout is JSON)
  // Speculative decoding (--speculative-*; runtime/spec): every decode drafts with the model's MTP layer
  // and verifies num_steps + 1 tokens per step (greedy: exact agreement; sampled: speculative sampling,
  // runtime/spec/spec_sampling.h; a grammar constraint masks drafts and verify rows at the state after
  // the drafts before them). On: no overlap scheduling; the round's verify and draft passes replay CUDA
  // graphs (under cuda_graph_max_bs, as decode steps would: runtime/engine/cuda_graph_spec.h), every other
  // step is eager.
  SpeculativeConfig speculative;
  // Test seams (spec_round.h, spec_sampling.h; empty in production): replace the MTP drafts (the key:
  // the request id) and the rejection rule's residual.
  DraftHook spec_draft_hook;
  ResidualRule spec_residual;
  // Many ranks (serve / generate --tp N; runtime/ranks/leader.h): this engine is rank 0's and leads the
  // others, sending each step's batch to them before its own forward. The model is this rank's shard;
  // forward.dist is set to the ranks' groups. No speculative decoding and no CUDA graphs (every rank
  // runs each step eagerly).
  std::shared_ptr<Ranks> ranks;
};

// Makes the runner an engine drives, over the engine's KV cache (called once, when the pool exists).
using RunnerFactory = std::function<std::unique_ptr<ModelRunner>(model::KvCache& cache)>;

// What the engine must know of the model behind an injected runner.
struct ModelShape {
  int64_t vocab_size = 0;               // prompt ids and sampling params are checked against it
  int64_t max_position_embeddings = 0;  // the default context limit (0: none)
};

struct GenerateRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Counters and gauges for /metrics; a consistent copy is taken after each step.
struct EngineStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t kv_pages_total = 0;
  int64_t kv_pages_free = 0;
  int64_t prefix_cache_pages = 0;
  int64_t steps = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  int64_t prefix_hit_tokens = 0;  // of which served from the prefix cache
  int64_t prefill_tokens = 0;     // tokens prefilled (computed), recomputation included
  int64_t generated_tokens = 0;
  int64_t retractions = 0;
  int64_t last_batch_size = 0;
  double busy_seconds = 0;      // time in steps
  double schedule_seconds = 0;  // of which the scheduler's own CPU time (schedule + build + process)
  // The model's idle time between back-to-back steps (a step's end to the next one's start, measured by
  // the runner): what the engine thread's own work costs the device. Overlap hides schedule + build.
  double launch_gap_seconds = 0;
  int64_t cuda_graphs = 0;         // decode (speculation: verify and draft) graphs captured at start-up
  double cuda_graph_seconds = 0;   // their capture time (start-up)
  int64_t cuda_graph_replays = 0;  // steps (and speculative verify / draft passes) that replayed a graph
  // Speculative decoding: request-rounds verified, draft tokens proposed / accepted, and rounds per accept
  // length (tokens a round yields: accepted drafts + 1; index 0 unused).
  int64_t spec_rounds = 0;
  int64_t spec_drafted_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accept_length_hist;
};

class Engine {
 public:
  // Serves `model` through a ForwardModelRunner on the model's device (CUDA graphs where they apply).
  Engine(std::shared_ptr<const model::Model> model, EngineConfig cfg);
  // Drives the runner `make_runner` makes over `cache` (the pool's pages: cfg.kv_pages and page_size are
  // taken from it) for a model of `shape`; the tokens are the runner's logits sampled as usual. No CUDA
  // graphs, no device sampling (cfg.sample_on_device must be off). Tests and benches inject a model-free
  // runner this way.
  Engine(ModelShape shape, model::KvCache cache, RunnerFactory make_runner, EngineConfig cfg);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts / stops the engine thread (stop() finishes the current step, then aborts nothing: queued
  // requests stay unanswered; callers drain first).
  void start();
  void stop();

  // Thread-safe. Ids are the caller's and must be unique among live requests.
  void submit(GenerateRequest req);
  void abort(uint64_t id);
  // Moves available outputs into `out`; waits up to `timeout` when there are none. False on timeout.
  bool wait_outputs(std::vector<StepOutput>& out, std::chrono::milliseconds timeout);

  // One loop iteration on the calling thread (only when the thread is not started): applies queued
  // submits/aborts, schedules and launches one step if there is work; with overlap it also completes
  // the step in flight (its outputs are published by this call). Returns false when idle (nothing in
  // flight either).
  bool step();

  EngineStats stats() const;
  const ModelShape& shape() const { return shape_; }
  const EngineConfig& config() const { return cfg_; }
  // For tests (engine thread not running): the scheduler and memory.
  const Scheduler& scheduler() const { return *scheduler_; }
  const KvPool& pool() const { return *pool_; }
  const RadixCache& cache() const { return *cache_; }

 private:
  // Makes the pool over `cache` (its last `reserved` pages outside it), the prefix cache and the
  // scheduler (the context limit defaults to the model's).
  void make_parts(model::KvCache cache, int64_t reserved);
  void loop();
  void drain_inputs(std::vector<StepOutput>& out);
  void publish(std::vector<StepOutput>& out);
  // Waits for the step in flight and samples it; returns the tokens generated.
  int64_t complete_in_flight(std::vector<StepOutput>& out, double& sched_s);
  // Speculative decoding (engine_spec.cpp): the MTP layer over a finished normal step's positions (its KV
  // there, each sampled request's draft hidden state); one draft / verify / draft_extend round over the
  // batch's speculative items (returns the tokens generated).
  void mtp_after_step(const ScheduleBatch& batch, const Tensor& hidden);
  int64_t spec_round(ScheduleBatch& batch, std::vector<StepOutput>& out);

  std::shared_ptr<const model::Model> model_;  // null with an injected runner
  ModelShape shape_;
  EngineConfig cfg_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<RadixCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;  // after pool_: destroyed (its step finished) before the pool
  std::unique_ptr<SpecGraphRunner> spec_graphs_;  // speculation's verify / draft graphs (null: eager)
  ScheduleBatch in_flight_;                       // launched, not yet processed (overlap)

  std::mutex in_mu_;
  std::condition_variable in_cv_;
  std::vector<GenerateRequest> in_submit_;
  std::vector<uint64_t> in_abort_;

  std::mutex out_mu_;
  std::condition_variable out_cv_;
  std::deque<StepOutput> out_;

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  std::atomic<bool> stop_{false};
  std::thread thread_;
  uint64_t seed_counter_ = 0;
  int64_t step_no_ = 0;          // steps launched (the trace's step numbers)
  int64_t in_flight_step_ = -1;  // in_flight_'s step number
};

}  // namespace dsaserve::runtime
