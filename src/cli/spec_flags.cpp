#include "cli/spec_flags.h"

namespace dsaserve::cli {

void add_spec_flags(CLI::App& sub, runtime::SpeculativeConfig& cfg) {
  const char* group = "Speculative decoding";
  sub.add_option(
         "--speculative-algorithm", cfg.algorithm,
         "EAGLE (or its alias NEXTN): the model's MTP layer drafts, the target verifies (greedy requests)")
      ->group(group);
  sub.add_option("--speculative-num-steps", cfg.num_steps, "draft tokens per round (1-16)")->group(group);
  sub.add_option("--speculative-eagle-topk", cfg.eagle_topk, "draft branches per step (only 1)")
      ->capture_default_str()
      ->group(group);
  sub.add_option("--speculative-num-draft-tokens", cfg.num_draft_tokens,
                 "rows verified per request: --speculative-num-steps + 1 (the default)")
      ->group(group);
}

}  // namespace dsaserve::cli
