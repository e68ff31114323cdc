#pragma once
// Speculative sampling of one draft chain (topk 1; the rejection rule of Leviathan et al. 2023 and Chen et
// al. 2023, as SGLang's and vLLM's rejection samplers apply it to a chain). Draft token x_i is drawn from
// q_i, the request's adjusted distribution (penalties, temperature, top_k / top_p / min_p: the sampler's
// sampling_distribution) over the MTP layer's logits; the target's row i gives p_i, the same adjustment
// of its logits with the penalties counting the drafts before row i. Row by row: x_i is accepted with
// probability min(1, p_i(x_i) / q_i(x_i)); the first rejected row emits a token drawn from
// normalise(max(0, p_i - q_i)) and ends the run; when every draft is accepted the last row emits a token
// drawn from p_N (the bonus). Each emitted token is then distributed as non-speculative sampling would
// draw it. Greedy requests (temperature 0) take the argmax of the adjusted logits on both sides and
// accept a draft only when it equals the target's.
// Draws come from the request's own generator (SamplerState): a seeded request reproduces its tokens
// with the same speculation flags, but they differ from the ones it draws without speculation (the
// draws are consumed differently); the distribution is the same.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/sampler/sampler.h"
#include "runtime/sampler/sampling_params.h"

namespace dsaserve::runtime {

// The index the cumulative scan of `dist` (in id order) stops at for the uniform `u` in [0, 1): the first
// i with u < dist[0] + .. + dist[i]; the last index of positive mass when rounding leaves u above the sum.
int32_t draw_from(std::span<const double> dist, double u);

// normalise(max(0, p - q)); p itself when that has no mass (p <= q everywhere, up to rounding).
std::vector<double> residual_distribution(std::span<const double> p, std::span<const double> q);

struct ChainStep {
  bool accepted = false;
  int32_t token = 0;  // x when accepted, else the resampled token
};

// One row of the rule: draws u (rng.uniform()) and accepts x when u < p(x) / q(x); else draws the token
// from residual_distribution(p, q) with a second uniform. `q(x)` must be positive (x was drawn from q).
// `wrong_residual_for_tests`: resample from p instead (a broken rule: tests prove that their statistic
// catches it).
ChainStep accept_or_resample(std::span<const double> p, std::span<const double> q, int32_t x,
                             SamplerState& rng, bool wrong_residual_for_tests = false);

// Replaces a draft token after the MTP layer proposed it (spec_round.h's DraftHook).
using DraftTokenHook = std::function<int32_t(int64_t index, int32_t proposed)>;

// One request's sampling through a round: propose() for each draft step (the MTP's logits row), then
// judge() over the verify rows. `params` must have no constraint; `state` is the request's sampler
// state: its generator makes the draws, its token history (copied at construction) feeds the penalties
// (the caller records the emitted tokens into it afterwards, e.g. through the OutputProcessor).
class ChainSampler {
 public:
  ChainSampler(const SamplingParams& params, SamplerState& state, bool wrong_residual_for_tests = false);
  // The draft at token index `index` (hook: may replace it; a sampled request's hooked draft is proposed
  // from the MTP's argmax and counts as drawn from the one-hot q at the hook's token, which keeps the rule
  // exact whatever the hook returns).
  int32_t propose(std::span<const float> mtp_logits, int64_t index, const DraftTokenHook& hook = {});
  // `rows` [drafts + 1, vocab]: the target's logits at the pending token and each draft. Returns the
  // emitted run (accepted drafts, then the resampled or bonus token), each with the target's raw
  // logprob (and top_logprobs) when params.logprobs / top_logprobs ask for them.
  std::vector<SampleResult> judge(std::span<const float> rows, int64_t vocab);
  const std::vector<int32_t>& drafts() const { return drafts_; }

 private:
  const SamplingParams& params_;
  SamplerState& state_;
  SamplerState history_;  // token history at the round's start (the penalties' counts)
  SamplerState draft_history_;
  std::vector<int32_t> drafts_;
  std::vector<std::vector<double>> q_;  // per draft (sampled requests): the distribution it came from
  std::vector<float> scratch_;
  bool wrong_residual_;
};

}  // namespace dsaserve::runtime
