#pragma once
// Scoring a whole sequence: the logits at every position (and the MTP head's), computed the way a serving
// engine would: a prefill in chunks, then optionally one token at a time. Used by `dsaserve score`,
// the golden tests and the benchmark.
#include <cstdint>
#include <span>

#include "model/model.h"

namespace dsaserve::model {

struct ScoreOptions {
  int64_t chunk = 0;         // prefill chunk size; 0 = the whole prefill in one step
  int64_t decode_from = -1;  // >= 0: positions from here on are decoded one token per step
  bool mtp = false;          // also compute the MTP layer's logits (positions 0..n-2)
  int64_t page_size = 64;
  AttentionForm attention = AttentionForm::automatic;
  const dist::ProcessGroups* dist = nullptr;  // a sharded model's groups (ForwardOptions::dist)
  bool dsa_topk_broadcast = false;            // ForwardOptions::dsa_topk_broadcast
  bool moe_a2a_deepep = false;                // ForwardOptions::moe_a2a_deepep
  bool deepep_fp8_dispatch = true;            // ForwardOptions::deepep_fp8_dispatch
};

// Attention DP (--attn-dp-size D > 1): DP group 0 scores the sequence; each other DP group d scores its
// companion (the sequence reversed, d tokens shorter, at least one), in the same steps: other requests, as
// a server's other DP ranks would run, so that every gather carries rows of D requests of different
// lengths (prefill chunks of different sizes) and a group whose sequence ended takes idle steps
// (Model::idle_step). The result is the own group's sequence's.
std::vector<int32_t> dp_companion(std::span<const int32_t> ids, int64_t dp_rank);

struct ScoreResult {
  Tensor logits;      // f32 [n, vocab]
  Tensor mtp_logits;  // f32 [n - 1, vocab] when asked (undefined for n == 1)
  int64_t steps = 0;  // forward calls of the target model
};

// The schedule of steps: [begin, end) token ranges covering [0, n).
std::vector<std::pair<int64_t, int64_t>> score_schedule(int64_t n, const ScoreOptions& opt);

ScoreResult score_sequence(const Model& model, std::span<const int32_t> ids, const ScoreOptions& opt = {});

// Greedy continuation: one prefill of the prompt, then `max_new` single-token decode steps, each taking
// the argmax (ties: the lowest id) of the last logits. Returns the new tokens. The model-level reference
// of the golden tests (model/ sits below the runtime); `dsaserve generate` runs the serving engine's loop.
std::vector<int32_t> greedy_generate(const Model& model, std::span<const int32_t> prompt, int64_t max_new,
                                     int64_t page_size = 64);

}  // namespace dsaserve::model
