#pragma once
// SamplingParams: how one request picks its next tokens (OpenAI / SGLang sampling fields), plus the
// engine-side stop rules. Stop *strings* are not here: they need text, which the server's per-request
// output stage produces (it aborts the request when one matches).
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace dsaserve::runtime {

class TokenConstraint;

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax, ties to the lowest id)
  float top_p = 1.0f;               // (0, 1]
  int32_t top_k = 0;                // <= 0: no limit
  float min_p = 0.0f;               // [0, 1]: drop tokens with p < min_p * p_max
  float presence_penalty = 0.0f;    // [-2, 2], OpenAI: subtracted once per token seen in the output
  float frequency_penalty = 0.0f;   // [-2, 2], OpenAI: subtracted per occurrence in the output
  float repetition_penalty = 1.0f;  // (0, 2], HF/CTRL: logit / p (if > 0) or * p over prompt + output
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits, each in [-100, 100]
  std::optional<uint64_t> seed;  // reproducible sampling; unset: a random seed per request
  bool logprobs = false;         // report the sampled token's log-probability
  int32_t top_logprobs = 0;      // [0, 20]: also the most likely alternatives
  // vLLM's prompt_logprobs: -1 off; k in [0, 20]: the log-probability of every prompt token after the
  // first (and its k most likely alternatives), reported before the first sample. Such a request skips
  // the prefix cache until they are reported (cached tokens have no logits).
  int32_t prompt_logprobs = -1;
  int64_t max_new_tokens = 16;  // >= 0
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // Scheduling, not sampling (carried here so that it reaches the scheduler with the request): with
  // SchedulerConfig::enable_priority, waiting requests are admitted by priority (larger first unless
  // low_priority_values_first), FCFS within a priority. Ignored otherwise.
  int64_t priority = 0;
  // Grammar-constrained decoding (tool_choice / response_format): masks every sample and is advanced
  // with every token the request produces; its completion finishes the request. Null: unconstrained.
  // One per request: copies of these params share it, so each request needs its own.
  std::shared_ptr<TokenConstraint> constraint;

  // Throws dsaserve::Error naming the offending field (OpenAI's name) when a value is out of range.
  void validate(int64_t vocab_size) const;
};

}  // namespace dsaserve::runtime
