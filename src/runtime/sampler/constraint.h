#pragma once
// TokenConstraint: a per-request rule on which tokens may come next (grammar-constrained decoding:
// tool_choice required / named, response_format). The sampler masks the logits with it before every
// draw; the scheduler advances it with every token the request produces. The engine does not know how a
// constraint decides (the grammar module implements it with xgrammar); it only runs it on its thread.
// Speculative rounds (runtime/spec) advance it through the drafts to mask each verify row at the state
// after the drafts before it, then roll every draft back: the OutputProcessor then accepts the tokens
// the round emitted, as after a plain step.
#include <cstdint>
#include <span>
#include <vector>

namespace dsaserve::runtime {

// The tokens a constraint allows at one position: token t < vocab is allowed when bit t % 32 of
// words[t / 32] is set; tokens at or past vocab never are (logit rows may be wider). A snapshot: it stays
// valid after the constraint moves on.
struct TokenMask {
  std::vector<uint32_t> words;
  int64_t vocab = 0;

  bool allows(int32_t token) const {
    return token >= 0 && token < vocab && ((words[size_t(token) / 32] >> (uint32_t(token) % 32)) & 1u) != 0;
  }
  // Sets the logits of the tokens not allowed to -infinity.
  void apply(std::span<float> logits) const;
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits [vocab] of the tokens not allowed next to -infinity. At least one token stays
  // allowed while !terminated().
  virtual void mask_logits(std::span<float> logits) = 0;
  // The tokens allowed next (what mask_logits keeps), into `mask` (resized). Not once terminated().
  virtual void fill_mask(TokenMask& mask) = 0;
  // Advances by the token the request produced. False when the constraint does not allow it (the
  // request then fails: with the mask applied this does not happen); a refused token changes nothing.
  // The state after a sequence of accepted tokens does not depend on which masks were asked for between
  // them (xgrammar's token budgets act on the next accept only after a mask: the grammar module asks for
  // one itself when the caller did not).
  virtual bool accept(int32_t token) = 0;
  // Undoes the last `n` accepted tokens (0 <= n <= the tokens accepted so far; a terminated constraint
  // rolled back past its stop token is live again). The state then equals the one before those accepts.
  virtual void rollback(int64_t n) = 0;
  // The constraint is complete (its grammar ended, the stop token included): the request finishes.
  virtual bool terminated() const = 0;
};

}  // namespace dsaserve::runtime
