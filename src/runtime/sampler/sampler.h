#pragma once
// Sampler: one token from one row of logits under a request's SamplingParams. Order of operations:
// logit_bias, repetition penalty (prompt + output tokens), presence / frequency penalties (output
// tokens), then greedy argmax (temperature 0) or temperature -> softmax -> top_k -> top_p -> min_p ->
// a draw from the request's own seeded generator. A TokenConstraint (grammar), when given, masks the
// processed logits (disallowed tokens -> -inf) before the pick, for greedy and sampled decoding alike.
// Log-probabilities are reported from the model's raw distribution (log_softmax of the unprocessed,
// unmasked logits), like vLLM's default.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/sampler/constraint.h"
#include "runtime/sampler/sampling_params.h"

namespace dsaserve::runtime {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;           // filled when params.logprobs
  std::vector<TokenLogprob> top;  // params.top_logprobs entries, most likely first
};

// Per-request sampler state: the random generator (xoshiro256**, seeded by splitmix64 from the seed) and
// the token counts the penalties need. Plain data: it moves with the request (also through retraction).
class SamplerState {
 public:
  SamplerState() = default;
  // `prompt` feeds the repetition penalty's set; `seed` the generator. `track_tokens` false: no token
  // history is kept (seen() and output_counts() stay empty, record() does nothing): for a request whose
  // params use none (!uses_token_history(params)), so that it pays no per-token map updates.
  SamplerState(uint64_t seed, std::span<const int32_t> prompt, bool track_tokens = true);
  // Records a token the request produced (for the penalties).
  void record(int32_t token);
  // Uniform in [0, 1).
  double uniform();

  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  const std::unordered_map<int32_t, int32_t>& seen() const { return seen_; }

 private:
  uint64_t s_[4] = {1, 2, 3, 4};
  bool track_ = true;
  std::unordered_map<int32_t, int32_t> output_counts_;  // token -> times generated
  std::unordered_map<int32_t, int32_t> seen_;           // prompt + output tokens (repetition penalty)
};

// The params read the request's token history (repetition, presence or frequency penalty).
inline bool uses_token_history(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

// Samples from `logits` [vocab]. `scratch` is reused between calls to avoid allocations. `constraint`
// (optional) masks the candidates; it is not advanced here (the caller accepts the result).
SampleResult sample(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                    std::vector<float>& scratch, TokenConstraint* constraint = nullptr);
// The same under a mask snapshot (a speculative round's row: the constraint's state after the drafts
// before it); null: no mask.
SampleResult sample(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                    std::vector<float>& scratch, const TokenMask* mask);

// `token`'s log-probability under log_softmax(`logits`) and the `top` most likely tokens (as reported for a
// sample; ties to the lower id): prompt logprobs.
SampleResult token_logprobs(std::span<const float> logits, int32_t token, int32_t top);

// The softmax probabilities the sampler draws from (after penalties, temperature, top_k/top_p/min_p;
// zero for dropped tokens): the distribution that sample() realises (tests; speculative sampling).
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          const SamplerState& state, TokenConstraint* constraint = nullptr);
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          const SamplerState& state, const TokenMask* mask);

}  // namespace dsaserve::runtime
