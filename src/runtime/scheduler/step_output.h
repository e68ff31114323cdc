#pragma once
// StepOutput: what a step produced for one request, as plain data for the engine's output queue.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampler/sampler.h"
#include "runtime/scheduler/request.h"

namespace dsaserve::runtime {

// What a step produced for one request (plain data for the output queue).
struct StepOutput {
  uint64_t id = 0;
  int32_t token = -1;  // -1: none (a finish without a new token: abort, error; prompt logprobs)
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  // params.prompt_logprobs: entries for consecutive prompt tokens, from position prompt_logprobs_from on
  // (the first prompt token has none); they come before the request's first sample.
  std::vector<SampleResult> prompt_logprobs;
  int64_t prompt_logprobs_from = 0;
  FinishReason finish = FinishReason::none;
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  // Speculative decoding so far: the request's verify rounds and the draft tokens they accepted (its mean
  // accept length: 1 + spec_accepted_drafts / spec_verify_ct). 0 without speculation.
  int64_t spec_verify_ct = 0;
  int64_t spec_accepted_drafts = 0;
};

}  // namespace dsaserve::runtime
