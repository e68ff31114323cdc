#include "runtime/scheduler/output_processor.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace dsaserve::runtime {

OutputProcessor::Result OutputProcessor::process(Request& r, std::span<SampleResult> run,
                                                 std::vector<StepOutput>& out) const {
  Result res;
  if (run.empty()) return res;
  const size_t slot = r.tokens.size() - 1;
  DSA_CHECK(!r.tokens.empty() && r.tokens[slot] == kFutureToken,
            "output processor: request {} has no future token to fill", r.id);
  for (SampleResult& s : run) {
    const int32_t token = s.token;
    if (r.params.constraint != nullptr) {
      // A grammar that cannot continue fails its request only.
      try {
        if (!r.params.constraint->accept(token))
          res.error = fmt::format("the grammar rejected token {}", token);
      } catch (const std::exception& e) {
        res.error = e.what();
      }
      if (!res.error.empty()) {
        res.finish = FinishReason::error;
        break;
      }
    }
    if (res.kept == 0) {
      r.tokens[slot] = token;
    } else {
      r.tokens.push_back(token);
    }
    ++res.kept;
    r.sampler.record(token);
    const auto& stop = r.params.stop_token_ids;
    if ((!r.params.ignore_eos && std::find(eos_.begin(), eos_.end(), token) != eos_.end()) ||
        std::find(stop.begin(), stop.end(), token) != stop.end() ||
        (r.params.constraint != nullptr && r.params.constraint->terminated())) {
      res.finish = FinishReason::stop;
    } else if (r.at_length_limit(max_context_)) {
      res.finish = FinishReason::length;
    }
    StepOutput o;
    o.id = r.id;
    o.token = token;
    o.logprob = s.logprob;
    o.top_logprobs = std::move(s.top);
    o.prompt_tokens = r.prompt_len;
    o.cached_tokens = r.cached_tokens;
    o.completion_tokens = r.num_output();
    o.spec_verify_ct = r.spec_verify_ct;
    o.spec_accepted_drafts = r.spec_accepted_drafts;
    o.finish = res.finish;
    out.push_back(std::move(o));
    if (res.finish != FinishReason::none) break;
  }
  // A rejected first token leaves the slot unfilled: the request fails, nothing reads it.
  return res;
}

}  // namespace dsaserve::runtime
