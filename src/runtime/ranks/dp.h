#pragma once
// Attention DP when serving (serve / generate --tp N --attn-dp-size D): the DP controller.
//
// Design (SGLang's DP attention: one HTTP front, a controller sending each request to one DP rank whose
// scheduler owns its requests and KV; DP ranks with nothing to run take an IDLE step so that the MoE
// collectives line up):
// - The N ranks form D DP groups of attention TP = N / D consecutive ranks (dist::ParallelLayout). Each
//   group's attention-TP rank 0 (global ranks 0, N/D, 2N/D, ...) is its DP leader: it runs an engine of
//   its own (scheduler, KV manager with its own pages, prefix cache, sampler, output processor) over its
//   shard of the model. The group's other ranks follow its steps as with --tp alone (follow_steps: the
//   leader's step messages over the group's `control` communicator, runtime/ranks/step_message.h).
// - Global rank 0 is the front as well as DP group 0's leader: serve's HTTP server (or generate's
//   request) talks to a DpFront (runtime/ranks/front.h), which routes each new request to one DP group,
//   round robin (SGLang's default --load-balance-method round_robin) or to the group with the fewest
//   unfinished requests the front routed there (shortest_queue). Group 0's requests go to the local
//   engine; the others' travel to their leaders, and their outputs come back to the front, which answers
//   the HTTP requests as with one engine. Requests with a grammar constraint (a host object that does
//   not travel) stay on group 0.
// - Every step is a round of the DP leaders' DpLinks (a thread on each leader; its engine's model runner,
//   DpRunner, hands it the batch to run): one small all-gather over the leaders' `dp_control`
//   communicator of a fixed header per leader (round number, this step's tokens and whether they are a
//   decode, stop, payload bytes), then, when any leader has a payload, one variable all-gather of the
//   payloads: the front's new requests and aborts for each group, each other leader's outputs since the
//   last round and its engine's stats. The header's token counts are ForwardOptions::dp_tokens: a group
//   with a batch runs its forward, a group without one takes the idle step (Model::idle_step), and its
//   followers do the same (dp_step / dp_idle messages); a round where no group has tokens runs nothing
//   (followers get an idle beat when one is due). All collectives are Gloo's (Communicator::all_gather,
//   all_gather_v, broadcast).
// - When to join a round: at once with a batch, a payload, or when the last round ran a step; a leader
//   whose engine has work but no batch yet waits up to the beat interval for it; an idle deployment polls
//   (1 ms, doubling to 16 ms), so an idle server costs little and a new request waits at most that long.
// - Ending: the front's DpFront::stop() (SIGTERM's drain done, or generate done) sets the stop flag of
//   the next round; every leader ends after that round (a batch still waiting fails: "the deployment is
//   stopping"), tells its followers to shut down, and its process stops its engine and exits 0. A
//   collective that fails (a rank died, or hung past --dist-timeout) ends the rank with status 1 and the
//   reason (the launcher then ends the others), as LeaderRunner does.
// Limits: CPU ranks (Gloo); no speculative decoding; each group sizes nothing itself: the front sends its
// engine settings (KV pages, page size, scheduler limits, EOS ids) to every leader at start.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_runner.h"
#include "runtime/ranks/ranks.h"
#include "runtime/ranks/step_message.h"

namespace dsaserve::runtime {

// A request the front routes to DP group `group` (submit), or an abort of one of that group's requests.
struct DpRouted {
  int64_t group = 0;
  GenerateRequest req;  // params.constraint must be null (it does not travel)
};

// The bytes of what travels between the leaders, and back (throw dsaserve::Error when malformed).
std::vector<uint8_t> encode_outputs(const std::vector<StepOutput>& outs, const EngineStats& stats);
void decode_outputs(const uint8_t* data, size_t size, std::vector<StepOutput>& outs, EngineStats& stats);
std::vector<uint8_t> encode_routed(const std::vector<DpRouted>& submits,
                                   const std::vector<std::pair<int64_t, uint64_t>>& aborts);
void decode_routed(const uint8_t* data, size_t size, std::vector<DpRouted>& submits,
                   std::vector<std::pair<int64_t, uint64_t>>& aborts);
// The engine settings every DP group shares with the front's (its runner's StepInit carries the forward
// options and KV cache shape).
std::vector<uint8_t> encode_engine_config(const EngineConfig& cfg);
EngineConfig decode_engine_config(const std::vector<uint8_t>& bytes);

// One DP leader's side of the rounds (see above). Made on every DP leader, before its engine.
class DpLink {
 public:
  DpLink(std::shared_ptr<const model::Model> model, std::shared_ptr<Ranks> ranks);
  ~DpLink();
  DpLink(const DpLink&) = delete;
  DpLink& operator=(const DpLink&) = delete;

  const Ranks& ranks() const { return *ranks_; }

  // Start-up, collective over the leaders: the front sends its engine's settings, the others get them.
  void send_engine_config(const EngineConfig& cfg);
  EngineConfig receive_engine_config();

  // The engine's runner (DpRunner): the KV cache the steps run on; sends `init` to the followers and
  // starts the rounds.
  void attach(model::KvCache& cache, const StepInit& init);
  void launch(model::ForwardBatch fb);
  Tensor wait();  // throws dsaserve::Error once the deployment stops
  void engine_idle();

  // A leader that is not the front: the engine its received requests go to and its outputs come from.
  void serve(Engine* engine);
  // The front: routes (thread-safe); `on_outputs(group, outputs, stats)` gets each other group's
  // outputs and stats, on the link's thread.
  void route(DpRouted r);
  void route_abort(int64_t group, uint64_t id);
  void on_outputs(std::function<void(int64_t, std::vector<StepOutput>&, const EngineStats&)> f);

  // The front: ends the rounds (the next round is the last) and waits for it. Others: waits until the
  // front ended them.
  void stop();
  void wait_stopped();
  bool stopped() const;

 private:
  void rounds();
  // One round; false once the rounds end.
  bool round(int64_t seq, bool& active);
  void send_followers(StepMessage m);
  [[noreturn]] void die(const char* what, const std::exception& e) const;

  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<Ranks> ranks_;
  std::chrono::milliseconds beat_;
  model::KvCache* cache_ = nullptr;
  model::ForwardOptions opt_;
  int64_t follower_seq_ = 0;
  std::chrono::steady_clock::time_point follower_last_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // the link's thread: a batch, the engine idle, a route, stop
  std::condition_variable done_cv_;  // wait(): the batch ran, or the rounds ended
  std::optional<model::ForwardBatch> pending_;
  bool running_batch_ = false;
  bool batch_done_ = false;
  Tensor result_;
  std::chrono::milliseconds poll_{1};  // an idle deployment's wait before the next round
  bool idle_ = true;                   // the engine said it has no work (and has launched nothing since)
  bool stop_requested_ = false;
  bool stopped_ = false;
  Engine* engine_ = nullptr;
  std::vector<DpRouted> inbox_;         // received, for the engine (non-front)
  std::vector<uint64_t> inbox_aborts_;  //
  std::vector<DpRouted> outbox_;        // the front's routed requests
  std::vector<std::pair<int64_t, uint64_t>> outbox_aborts_;
  std::function<void(int64_t, std::vector<StepOutput>&, const EngineStats&)> on_outputs_;
  EngineStats sent_stats_;
  bool stats_sent_ = false;
  std::thread thread_;
};

// The model runner of a DP leader's engine: its steps run in the link's rounds.
class DpRunner final : public ModelRunner {
 public:
  DpRunner(std::shared_ptr<DpLink> link, model::KvCache& cache, const StepInit& init);
  void launch(model::ForwardBatch fb) override { link_->launch(std::move(fb)); }
  Tensor wait() override { return link_->wait(); }
  void idle() override { link_->engine_idle(); }

 private:
  std::shared_ptr<DpLink> link_;
};

// A DP leader's engine over `model` (this rank's shard) with the injected DpRunner: its own KV pool of
// cfg.kv_pages pages; no CUDA graphs, no device sampling, no speculative decoding (refused).
std::unique_ptr<Engine> make_dp_engine(std::shared_ptr<const model::Model> model, EngineConfig cfg,
                                       std::shared_ptr<DpLink> link);

// A DP leader that is not the front: gets the front's engine settings, serves its requests until the
// front stops the deployment. Returns the process's exit status.
int serve_dp_group(std::shared_ptr<const model::Model> model, std::shared_ptr<Ranks> ranks);

}  // namespace dsaserve::runtime
