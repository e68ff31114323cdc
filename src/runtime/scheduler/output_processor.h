#pragma once
// OutputProcessor: what a step's sampled tokens do to their request. Per request and step it takes a run
// of 0..k+1 tokens (one per step today; a speculative verify accepts up to k+1) and goes through it token
// by token: the grammar advances (a token it rejects fails the request), then the stop rules apply (EOS
// unless ignore_eos, stop_token_ids, a grammar that terminated) and the length limits (max_new_tokens,
// the context). The run is cut at the token that ends the request; the tokens after it are dropped.
// Every kept token is appended to the request (the first fills the kFutureToken slot its step committed),
// recorded in the sampler state and reported as one StepOutput (the last one carries the finish reason).
// Stop strings are text: the server applies them to the detokenized stream (server/stop_matcher.h) and
// aborts the request; the token-level outputs it reads are these.
// The processor does not free anything: the caller (Scheduler) releases a finished request's pages.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/scheduler/request.h"
#include "runtime/scheduler/step_output.h"

namespace dsaserve::runtime {

class OutputProcessor {
 public:
  // `max_context`: prompt + output tokens per request (0: unlimited).
  OutputProcessor(std::vector<int32_t> eos_token_ids, int64_t max_context)
      : eos_(std::move(eos_token_ids)), max_context_(max_context) {}

  struct Result {
    int64_t kept = 0;  // tokens of the run appended to the request (and reported)
    FinishReason finish = FinishReason::none;
    std::string error;  // finish == error: why (the grammar rejected a token); no StepOutput for it
  };
  // Applies `run` to `r`, whose last token is the kFutureToken slot of this step (when the run is not
  // empty). Outputs go to `out` (one per kept token). A request that ends (stop, length) has its finish
  // reason on its last output; one that fails (error) gets no output for the rejected token: the caller
  // finishes it with `error`.
  Result process(Request& r, std::span<SampleResult> run, std::vector<StepOutput>& out) const;

 private:
  std::vector<int32_t> eos_;
  int64_t max_context_;
};

}  // namespace dsaserve::runtime
