#pragma once
// Scheduler: decides what each model step computes and owns the requests' KV pages (nano-vllm's
// schedule -> run -> postprocess loop; the engine thread calls it, nothing else touches it).
//
// schedule(): running requests first (oldest first): decodes get their next page, unfinished
// prefills their next chunk; when pages run out even after evicting the prefix cache, the youngest
// running request (with priority scheduling: the lowest-priority one, youngest of them) is retracted (its
// pages go to the prefix cache, its tokens, generated ones included, go back to the front of the waiting
// queue to be recomputed). Then the prefill adder admits waiting requests FCFS (or highest priority first,
// FCFS within a priority) while the token budget (max_prefill_tokens), chunked_prefill_size and
// max_running_requests allow, matching each against the prefix cache first. Decodes and prefill chunks
// share one step (a mixed batch). A request that cannot fit the whole pool fails with an error; the
// loop never deadlocks.
// commit(): called when a batch's forward launches: advances each item's committed KV length
// (KvManager::commit) and appends a kFutureToken for each sample, so that the next schedule() can run
// while this step computes (overlap scheduling: the next decode's input is the future token).
// process(): samples the requests whose input is complete into those slots, applies the stop rules and
// releases finished requests' pages into the prefix cache. prune()/resolve(): before the next batch
// launches, drop its items whose request finished meanwhile and fill its future input ids from the
// sampled tokens.
// Step order: schedule -> build_forward -> commit -> forward -> process; with overlap the engine runs
// schedule(N+1) and build_forward(N+1) during forward(N), then process(N), prune/resolve(N+1),
// commit(N+1), forward(N+1). The tokens are the same either way.
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/forward_batch.h"
#include "runtime/kv/kv_manager.h"
#include "runtime/kv/kv_pool.h"
#include "runtime/radix/radix_cache.h"
#include "runtime/scheduler/output_processor.h"
#include "runtime/scheduler/request.h"
#include "runtime/scheduler/step_output.h"

namespace dsaserve::runtime {

struct SchedulerConfig {
  int64_t max_running_requests = 64;
  int64_t max_prefill_tokens = 16384;   // new prefill tokens per step (decodes not counted)
  int64_t chunked_prefill_size = 4096;  // most tokens of one request per step; <= 0: no chunking
  int64_t max_context = 0;              // prompt + output tokens per request; 0: unlimited
  std::vector<int32_t> eos_token_ids;
  // Priority scheduling (SGLang's --enable-priority-scheduling): off: pure FCFS. On: the waiting queue
  // is ordered by params.priority (larger = more urgent, or smaller with low_priority_values_first),
  // then arrival (serial); the running batch by priority, then admission, so that retraction takes
  // the lowest-priority request, the youngest of them.
  bool enable_priority = false;
  bool low_priority_values_first = false;
  // Speculative decoding (runtime/spec): a decode of a request with `speculate` set and a draft hidden
  // state reserves KV for its pending token and this many draft tokens (ScheduledRequest::drafts); 0: off.
  int64_t speculative_num_steps = 0;
};

// One request's part of a step: its next num_new input tokens; sample when they complete its input.
struct ScheduledRequest {
  Request* req = nullptr;  // only valid while alive(): the request may be finished and freed meanwhile
  uint64_t id = 0;         // req->id and req->serial when scheduled
  uint64_t serial = 0;
  int64_t start = 0;  // req->kv.len when scheduled: the item's input is tokens[start .. start + num_new)
  int64_t num_new = 0;
  bool sample = false;
  bool decode = false;  // a running request's single next token (else a prefill or a chunk of one)
  // Prompt logprobs: the logits rows of positions [logprob_from, logprob_from + logprob_rows) (each
  // predicts the prompt token after it) come back after the batch's last-token rows.
  int64_t logprob_from = 0;
  int64_t logprob_rows = 0;
  // Speculative decode (> 0): the item verifies its pending token + `drafts` draft tokens; its KV is
  // reserved for 1 + drafts tokens, commit() commits them all, accept_drafts() keeps the accepted ones.
  int64_t drafts = 0;
};

struct ScheduleBatch {
  std::vector<ScheduledRequest> items;
  int64_t num_prefill_tokens = 0;  // tokens of items that are not single decodes
  int64_t num_decode = 0;
  bool empty() const { return items.empty(); }
};

// One item's input to process(): its host logits row [vocab], or (`sampled` non-null) the token the
// caller already sampled with the request's params and sampler state (the engine's device sampler; see
// sampling_request()). Rows of items that do not sample or whose request is gone are not read.
struct SampleRow {
  std::span<const float> logits;
  const SampleResult* sampled = nullptr;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig cfg, KvPool& pool, RadixCache& cache);
  ~Scheduler();

  const SchedulerConfig& config() const { return cfg_; }
  // Queues a request (FCFS, or by priority with cfg.enable_priority). Requests with max_new_tokens 0 or an
  // empty prompt finish at once.
  void add(std::unique_ptr<Request> req, std::vector<StepOutput>& out);
  // Aborts a waiting or running request (its pages are released now); false when unknown.
  bool abort(uint64_t id, std::vector<StepOutput>& out);

  ScheduleBatch schedule(std::vector<StepOutput>& out);
  model::ForwardBatch build_forward(const ScheduleBatch& batch) const;
  // The batch's forward launches: kv.len += num_new, a kFutureToken per sample.
  void commit(const ScheduleBatch& batch);
  // Removes items whose request finished (or was aborted) since schedule(); true when any was removed
  // (the ForwardBatch must then be rebuilt).
  bool prune(ScheduleBatch& batch) const;
  // Fills `fb`'s kFutureToken input ids (built by build_forward(batch)) from the sampled tokens.
  void resolve(const ScheduleBatch& batch, model::ForwardBatch& fb) const;
  // A committed batch whose forward failed: its live requests finish with an error; their KV of this
  // step (never written) is not given to the prefix cache.
  void fail(const ScheduleBatch& batch, const std::string& error, std::vector<StepOutput>& out);
  // `logits` [batch.items.size(), vocab]: each item's last-token logits. Items whose request is gone
  // (finished, aborted) are skipped.
  void process(const ScheduleBatch& batch, std::span<const float> logits, int64_t vocab,
               std::vector<StepOutput>& out);
  // The batch's prompt-logprob rows ([sum of items' logprob_rows, vocab], in item order, the rows after
  // the last-token ones): one StepOutput with prompt_logprobs per live item that has rows. Call before
  // process() (the entries precede the first sample).
  void process_prompt_logprobs(const ScheduleBatch& batch, std::span<const float> rows, int64_t vocab,
                               std::vector<StepOutput>& out);
  // Sum of the items' logprob_rows.
  static int64_t num_prompt_logprob_rows(const ScheduleBatch& batch);
  // The CPU sampler's part of process(`logits`): rows[k].logits = item k's row, and for every item that
  // samples, is alive and has no constraint, results[k] = its sample (drawn from the request's sampler
  // state exactly as process() would) with rows[k].sampled pointing at it. Constrained rows are left to
  // process(batch, rows, out). `results` and `rows` are resized to the batch (reused between steps).
  void sample_rows(const ScheduleBatch& batch, std::span<const float> logits, int64_t vocab,
                   std::vector<SampleResult>& results, std::vector<SampleRow>& rows);
  // The same with one SampleRow per item; a presampled row takes the stop/output handling of a row
  // sampled here (a request with a constraint must be sampled here: its row needs `logits`).
  void process(const ScheduleBatch& batch, std::span<const SampleRow> rows, std::vector<StepOutput>& out);
  // A speculative item's verdict (`run`: the accepted drafts, then the target's token): the KV of the
  // rejected drafts rolls back (pages past the kept length return to the pool), the run goes through the
  // OutputProcessor (EOS, stop ids, max_new_tokens and the context cut it). No-op when the request is gone.
  // `results`: the run with its logprobs (moved into the outputs). Counts the round in the request's
  // spec_verify_ct / spec_accepted_drafts (reported with its outputs: usage).
  void accept_drafts(const ScheduledRequest& s, std::span<SampleResult> results,
                     std::vector<StepOutput>& out);
  void accept_drafts(const ScheduledRequest& s, std::span<const int32_t> run, std::vector<StepOutput>& out);
  // Item k's request when it samples this step and is still alive, else null: for a sampler outside
  // process(), which reads the params and consumes the request's draw (sampler.uniform()) exactly as
  // sample() would, then passes its result to process().
  Request* sampling_request(const ScheduleBatch& batch, size_t k) const;

  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t num_waiting() const { return int64_t(waiting_.size()); }
  int64_t num_running() const { return int64_t(running_.size()); }
  int64_t num_retractions() const { return num_retractions_; }
  // Prompt tokens of requests admitted so far, and how many of them the prefix cache served.
  int64_t num_admitted_prompt_tokens() const { return admitted_prompt_tokens_; }
  int64_t num_prefix_hit_tokens() const { return prefix_hit_tokens_; }
  const Request* find(uint64_t id) const;

  // Throws dsaserve::Error when pages are lost, shared or double-counted, or a queue invariant fails.
  void check_integrity() const;

 private:
  int64_t chunk_cap() const;
  // Priority rank: larger is more urgent (0 for every request without cfg.enable_priority).
  int64_t rank(const Request& r) const;
  // Queues a waiting request: priority mode: after every request of higher rank or same rank and older
  // serial; FCFS: at the back, or at the front when `front` (a retracted request).
  void enqueue(Request& r, bool front);
  // Frees pool pages by evicting the prefix cache until `pages` are free; false when it cannot.
  bool make_room(int64_t pages);
  // Gives a request's pages to the prefix cache (full computed pages) and the pool (the rest).
  void release(Request& r);
  void retract(Request& r);
  void finish(Request& r, FinishReason why, std::string error, std::vector<StepOutput>& out);
  void erase_running(Request* r);
  // Releases, unqueues and destroys a request.
  void drop(Request& r);
  // The item's request if it is still alive (same serial), else null.
  Request* alive(const ScheduledRequest& s) const;
  bool admit(Request& r, int64_t budget, ScheduleBatch& b, std::vector<StepOutput>& out);

  SchedulerConfig cfg_;
  KvManager kv_;
  RadixCache& cache_;
  OutputProcessor output_;  // stop rules and outputs of each sampled run
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;
  // Admission order, the youngest last (priority mode: by rank, highest first, then admission order):
  // the back is the retraction victim.
  std::vector<Request*> running_;
  std::vector<float> scratch_;
  std::vector<SampleResult> sample_results_;  // process(logits)'s rows, reused between steps
  std::vector<SampleRow> sample_rows_;
  std::vector<Request*> sample_reqs_;  // sample_rows(): the rows sampled there
  int64_t num_retractions_ = 0;
  int64_t admitted_prompt_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  uint64_t next_serial_ = 1;
};

}  // namespace dsaserve::runtime
