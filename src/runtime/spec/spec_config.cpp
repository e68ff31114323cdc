#include "runtime/spec/spec_config.h"

#include "core/error.h"

namespace dsaserve::runtime {

void SpeculativeConfig::validate(int64_t mtp_layers) const {
  if (!enabled()) {
    DSA_CHECK(num_steps == 0 && num_draft_tokens == 0 && eagle_topk == 1,
              "--speculative-num-steps / --speculative-eagle-topk / --speculative-num-draft-tokens need "
              "--speculative-algorithm EAGLE (or NEXTN)");
    return;
  }
  DSA_CHECK(algorithm == "EAGLE" || algorithm == "NEXTN",
            "--speculative-algorithm: '{}' is not supported (EAGLE or NEXTN: the model's MTP layer drafts)",
            algorithm);
  DSA_CHECK(num_steps >= 1 && num_steps <= 16, "--speculative-num-steps must be in [1, 16], got {}",
            num_steps);
  DSA_CHECK(eagle_topk == 1,
            "--speculative-eagle-topk: only 1 is supported (one draft chain, no draft tree), got {}",
            eagle_topk);
  DSA_CHECK(num_draft_tokens == 0 || num_draft_tokens == num_steps + 1,
            "--speculative-num-draft-tokens must be --speculative-num-steps + 1 ({}) with topk 1, got {}",
            num_steps + 1, num_draft_tokens);
  DSA_CHECK(mtp_layers >= 1,
            "--speculative-algorithm {}: the model has no MTP layer (num_nextn_predict_layers)", algorithm);
}

SpeculativeConfig SpeculativeConfig::resolved() const {
  SpeculativeConfig c = *this;
  if (c.enabled() && c.num_draft_tokens == 0) c.num_draft_tokens = c.num_steps + 1;
  return c;
}

}  // namespace dsaserve::runtime
