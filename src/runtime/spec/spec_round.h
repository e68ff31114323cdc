#pragma once
// The model passes of one speculative round (runtime/spec/spec_decoder.h describes the algorithm), over
// page tables the caller owns: SpecDecoder and the Engine share them, each doing its own KV bookkeeping.
// A slot without sampling params is greedy (argmax, ties to the lowest id); one with them drafts and
// accepts by speculative sampling (runtime/spec/spec_sampling.h), greedy requests included (their
// penalties and logit_bias then apply on both sides).
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/model.h"
#include "runtime/sampler/sampler.h"
#include "runtime/spec/spec_sampling.h"

namespace dsaserve::runtime {

// One request in a round: `len` target-KV tokens, `pending` its next input token (tokens[len]), `hidden`
// [1, H] the target's hidden state at len - 1, `pages` room for len + num_steps + 1 tokens.
struct SpecSlot {
  uint64_t key = 0;  // the request's id (for a DraftHook)
  int32_t pending = 0;
  int64_t len = 0;
  std::span<const int32_t> pages;
  Tensor hidden;
  // Null: greedy on the raw logits. Else the request's params and sampler state: the round draws from
  // its generator and reads its token history (it records nothing into it); a grammar constraint masks
  // the drafts and the verify rows and is back at its state before the round when the round returns.
  const SamplingParams* params = nullptr;
  SamplerState* sampler = nullptr;
};

// Replaces a draft token after the MTP layer proposed it: (slot key, the draft's token index in its
// request, i.e. len + 1 + step, the proposal) -> the draft. A test seam: the fixtures' random-weight MTP
// layers almost never agree with their targets, so tests plant an oracle drafter (the known greedy
// continuation with planted mistakes) to exercise acceptance, rollback and draft_extend. Empty: none.
using DraftHook = std::function<int32_t(uint64_t key, int64_t index, int32_t proposed)>;

// The round's draft steps and verify pass through captured CUDA graphs where they apply (the engine's:
// runtime/engine/cuda_graph_spec.h). Each returns what the eager forward under the round's options
// returns (every row's logits, the final hidden states), or nullopt to decline: the pass then runs
// eagerly. Null: every pass eager.
class SpecGraphs {
 public:
  virtual ~SpecGraphs() = default;
  // One draft step: the MTP layer over `mb` (one token per request) fed `hidden` [R, H].
  virtual std::optional<model::ForwardOutput> draft(const model::ForwardBatch& mb, const Tensor& hidden) = 0;
  // The verify forward over `fb` (steps + 1 rows per request).
  virtual std::optional<model::ForwardOutput> verify(const model::ForwardBatch& fb) = 0;
};

struct SpecVerdict {
  std::vector<std::vector<int32_t>> run;  // per slot: the accepted drafts, then the target's next token
  std::vector<int64_t> accepted;          // per slot: accepted drafts (run.size() - 1)
  // per slot: the run with the target's logprobs of each token (when the slot's params ask for them)
  std::vector<std::vector<SampleResult>> results;
  Tensor hidden;  // the verify pass's target hidden states [slots * (N + 1), H]
};

// Argmax of a row (ties to the lowest id, as the sampler's greedy path).
int32_t greedy_token(const float* row, int64_t n);
// The rows of `parts` one after the other ([sum rows, H], on the parts' device).
Tensor stack_rows(const kernels::Ops& ops, const std::vector<Tensor>& parts);

// draft (num_steps one-token MTP forwards, at positions len - 1 ..), verify (one target forward over
// pending + drafts, logits at every row), accept (greedy: the longest agreeing prefix + the target's
// token; sampled: the rejection rule of spec_sampling.h; a grammar masks both sides). The caller has
// reserved len + num_steps + 1 tokens per slot; the verify writes the target KV of them all. `residual`
// (tests): replaces the rejection rule's residual (spec_sampling.h). `graphs`: where the draft steps and
// the verify may replay CUDA graphs (null: eager).
SpecVerdict draft_and_verify(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                             int64_t num_steps, const std::vector<SpecSlot>& slots,
                             const DraftHook& hook = {}, const ResidualRule& residual = {},
                             SpecGraphs* graphs = nullptr);

// The MTP layer over `mb` (its token p is t_{p+1}) with the target's hidden rows (one part per request,
// in order): its KV at those positions. No-op for an empty batch.
void mtp_extend(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                const model::ForwardBatch& mb, const std::vector<Tensor>& hidden_rows);

// After draft_and_verify: the MTP layer over each slot's accepted drafts (positions len .. len + j - 1,
// tokens = the drafts, hidden = the verify rows), so its KV there is the target-fed one. Slot k's
// hidden for the next round is verdict.hidden row k * (N + 1) + j (next_hidden).
void draft_extend(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                  int64_t num_steps, const std::vector<SpecSlot>& slots, const SpecVerdict& v);
Tensor next_hidden(const SpecVerdict& v, int64_t num_steps, size_t slot);

}  // namespace dsaserve::runtime
