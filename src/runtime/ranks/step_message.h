#pragma once
// What rank 0 (the leader: scheduler, sampling, output) tells the other ranks of a deployment (--tp > 1;
// with attention DP each DP group's leader tells the other ranks of its group),
// as SGLang's scheduler broadcasts its batch to the TP workers: once, the shape of the KV cache and the
// forward options every rank must share; then per step the ForwardBatch (plain data, sent as bytes), an
// idle beat when nothing runs (so a follower's wait never reaches --dist-timeout while the leader is up),
// and shutdown at the end. Each message is two broadcasts from the leader over a control communicator (a
// Gloo group of its own over the attention-TP group, the world without attention DP; never the model's):
// a fixed header, then the payload.
#include <cstdint>
#include <optional>
#include <vector>

#include "dist/communicator.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace dsaserve::runtime {

// dp_step / dp_idle (attention DP, runtime/ranks/dp.h): a DP group's leader to its attention-TP
// followers: the step's batch with every DP group's token count, or an idle step (the group has no rows
// this step; its ranks still join the MLPs' world collectives, Model::idle_step).
enum class StepKind : int64_t { init = 1, step = 2, idle = 3, shutdown = 4, dp_step = 5, dp_idle = 6 };
const char* to_string(StepKind k);

// The KV cache and forward options of the leader's engine: the followers' caches have the same pages (the
// leader's page ids index them) and their forward the same form choices (their partial sums must add up
// to the leader's).
struct StepInit {
  int64_t num_pages = 0;
  int64_t page_size = 64;
  bool mtp_layers = false;                      // the cache holds the MTP layers' KV too
  std::optional<model::KvCacheDtype> kv_dtype;  // unset: the model's make_cache
  model::AttentionForm attention = model::AttentionForm::automatic;
  int64_t mha_min_tokens = 256;
  model::AttentionFormRule form_rule{};
  bool all_logits = false;
  bool keep_hidden = false;
  bool dsa_topk_broadcast = false;
  bool moe_a2a_deepep = false;      // --moe-a2a-backend deepep: every rank dispatches / combines
  bool deepep_fp8_dispatch = true;  // and its payload (model::ForwardOptions)

  // The forward options these describe (dist: the follower's groups).
  model::ForwardOptions forward(const dist::ProcessGroups* dist) const;
  static StepInit of(int64_t num_pages, int64_t page_size, bool mtp_layers,
                     std::optional<model::KvCacheDtype> kv_dtype, const model::ForwardOptions& opt);
};

struct StepMessage {
  StepKind kind = StepKind::idle;
  int64_t seq = 0;            // the leader's message number (0, 1, ...): a follower that misses one fails
  StepInit init;              // kind init
  model::ForwardBatch batch;  // kind step, dp_step
  std::vector<int64_t> dp_tokens;  // kind dp_step, dp_idle: ForwardOptions::dp_tokens
  bool dp_decode = false;          // and ForwardOptions::dp_decode
};

// The bytes of a message's payload and back (throws dsaserve::Error on a malformed payload).
std::vector<uint8_t> encode_batch(const model::ForwardBatch& b);
model::ForwardBatch decode_batch(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> encode_init(const StepInit& s);
StepInit decode_init(const std::vector<uint8_t>& bytes);

// Rank 0's side: sends `m` to every rank of `control` (its rank 0 is the leader).
void send_step_message(dist::Communicator& control, const StepMessage& m);
// A follower's side: the next message (waits up to the communicator's timeout; throws when rank 0 is gone).
StepMessage receive_step_message(dist::Communicator& control);

}  // namespace dsaserve::runtime
