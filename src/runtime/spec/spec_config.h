#pragma once
// SpeculativeConfig: the `--speculative-*` flags of `generate` and `serve` (SGLang's names): MTP drafting
// (EAGLE, NEXTN an alias) of num_steps tokens per round, one draft chain (eagle_topk 1), verified by
// the target over num_draft_tokens = num_steps + 1 rows per request. validate() names the bad flag.
#include <cstdint>
#include <string>

namespace dsaserve::runtime {

struct SpeculativeConfig {
  std::string algorithm;         // "" (off), "EAGLE" or "NEXTN" (same thing: the model's MTP layer drafts)
  int64_t num_steps = 0;         // --speculative-num-steps: draft tokens per round (>= 1 when on)
  int64_t eagle_topk = 1;        // --speculative-eagle-topk: only 1 (one chain)
  int64_t num_draft_tokens = 0;  // --speculative-num-draft-tokens: 0 = num_steps + 1; else must equal it
  bool enabled() const { return !algorithm.empty(); }
  // Rows the verify forward computes per request (num_steps + 1).
  int64_t verify_rows() const { return num_steps + 1; }
  // Checks the flags and fills num_draft_tokens' default; throws dsaserve::Error naming the flag.
  // `mtp_layers`: MTP layers the model has (speculation needs one).
  void validate(int64_t mtp_layers) const;
  SpeculativeConfig resolved() const;
};

}  // namespace dsaserve::runtime
