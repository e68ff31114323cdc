#pragma once
// TokenConstraint: a per-request rule on which tokens may come next (grammar-constrained decoding:
// tool_choice required / named, response_format). The sampler masks the logits with it before every
// draw; the scheduler advances it with every token the request produces. The engine does not know how a
// constraint decides (the grammar module implements it with xgrammar); it only runs it on its thread.
#include <cstdint>
#include <span>

namespace dsaserve::runtime {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logits [vocab] of the tokens not allowed next to -infinity. At least one token stays
  // allowed while !terminated().
  virtual void mask_logits(std::span<float> logits) = 0;
  // Advances by the token the request produced. False when the constraint does not allow it (the
  // request then fails: with the mask applied this does not happen).
  virtual bool accept(int32_t token) = 0;
  // The constraint is complete (its grammar ended, the stop token included): the request finishes.
  virtual bool terminated() const = 0;
};

}  // namespace dsaserve::runtime
