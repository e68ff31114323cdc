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
// A grammar constraint (params.constraint) masks both sides at the same state: draft i and verify row i
// under the constraint after drafts 0..i-1 (the masks are taken while drafting, as SGLang's EAGLE +
// grammar path does, then the drafts are rolled back). A draft the grammar refuses has p_i(x_i) = 0 and
// is rejected (greedy: it cannot equal the masked argmax); a draft that completes the grammar ends the
// run when it is accepted (nothing may follow it).
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

// The distribution a rejected row draws its token from, given (p, q). Empty: residual_distribution. A
// test seam: tests inject a wrong one (p itself) to prove that their statistics catch it.
using ResidualRule = std::function<std::vector<double>(std::span<const double> p, std::span<const double> q)>;

// One row of the rule: draws u (rng.uniform()) and accepts x when u < p(x) / q(x); else draws the token
// from residual_distribution(p, q) (or `residual`'s) with a second uniform. `q(x)` must be positive (x
// was drawn from q).
ChainStep accept_or_resample(std::span<const double> p, std::span<const double> q, int32_t x,
                             SamplerState& rng, const ResidualRule& residual = {});

// Replaces a draft token after the MTP layer proposed it (spec_round.h's DraftHook).
using DraftTokenHook = std::function<int32_t(int64_t index, int32_t proposed)>;

// One request's sampling through a round: propose() for each draft step (the MTP's logits row), then
// judge() over the verify rows. `state` is the request's sampler state: its generator makes the draws,
// its token history (copied at construction) feeds the penalties (the caller records the emitted tokens
// into it afterwards, e.g. through the OutputProcessor). params.constraint (optional) is advanced through
// the drafts while proposing and rolled back to its state at construction before judge() (or at
// destruction): the caller accepts the emitted run into it, as after a plain step.
class ChainSampler {
 public:
  ChainSampler(const SamplingParams& params, SamplerState& state, ResidualRule residual = {});
  ~ChainSampler();
  ChainSampler(const ChainSampler&) = delete;
  ChainSampler& operator=(const ChainSampler&) = delete;
  // The draft at token index `index` (hook: may replace it; a sampled request's hooked draft is proposed
  // from the MTP's argmax and counts as drawn from the one-hot q at the hook's token, which keeps the rule
  // exact whatever the hook returns).
  int32_t propose(std::span<const float> mtp_logits, int64_t index, const DraftTokenHook& hook = {});
  // `rows` [drafts + 1, vocab]: the target's logits at the pending token and each draft. Returns the
  // emitted run (accepted drafts, then the resampled or bonus token; or, when an accepted draft completes
  // the grammar, the run up to it), each with the target's raw logprob (and top_logprobs) when
  // params.logprobs / top_logprobs ask for them.
  std::vector<SampleResult> judge(std::span<const float> rows, int64_t vocab);
  const std::vector<int32_t>& drafts() const { return drafts_; }

 private:
  // The mask of the next row (the constraint's state after the drafts so far), or null when rows from
  // here on are never judged (the grammar refused or completed a draft before) or there is no grammar.
  const TokenMask* next_mask();
  void restore_constraint();

  const SamplingParams& params_;
  SamplerState& state_;
  SamplerState history_;  // token history at the round's start (the penalties' counts)
  SamplerState draft_history_;
  std::vector<int32_t> drafts_;
  std::vector<std::vector<double>> q_;  // per draft (sampled requests): the distribution it came from
  std::vector<float> scratch_;
  ResidualRule residual_;
  // Grammar: masks_[i] is row i's (drafts 0..i-1 accepted), for i < live rows; the constraint has
  // accepted `advanced_` drafts; `ends_at_` is the draft that completed it (-1: none).
  TokenConstraint* constraint_ = nullptr;
  std::vector<TokenMask> masks_;
  bool following_ = true;  // the constraint has accepted every draft so far and is not complete
  int64_t advanced_ = 0;
  int64_t ends_at_ = -1;
};

}  // namespace dsaserve::runtime
