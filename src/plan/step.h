#pragma once
// "Plan this step": the operators of the one engine step that ran a given batch, with its exact token
// counts and context lengths, so that a trace of the step can be compared with the plan op by op
// (same ops, same shapes) and its measured time with the roofline. build_plan (plan.h) prices a
// deployment's typical prefill and decode; plan_step prices what the engine actually ran.
#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace dsaserve::plan {

// One request of an engine step.
struct StepRequest {
  int64_t new_tokens = 0;  // tokens computed in this step
  int64_t cached = 0;      // tokens already in its cache (the position of its first new token)
};

struct StepShape {
  std::vector<StepRequest> requests;
  bool decode = false;      // the requests are decoding (the step's phase); else a prefill or a chunk of one
  bool mtp = false;         // the MTP layer's pass over these tokens ("draft" / "prefill_draft_extend")
  bool all_logits = false;  // the LM head runs on every token (score), else on each request's last one
  // Attention DP: every DP group's tokens in this step (the traced pass's "dp_tokens") and whether the
  // world gathers padded them to equal lengths ("dp_equal": ranks x the largest slice) or gathered the
  // rows themselves (the variable-length form). Empty: every DP group runs a batch like this one.
  std::vector<int64_t> dp_tokens;
  bool dp_equal = false;
};

// The pass of one step on one rank of `d` (its layout and KV dtype; batch, context and prefill flags are
// not used: the requests give them). With attention DP, every DP group is assumed to run a batch like
// this one (the gathers and the MoE see attn_dp_size times these tokens) unless s.dp_tokens says
// otherwise. Named like the forward's trace context: "prefill" / "decode", or for the MTP layer
// "prefill_draft_extend" / "draft". Unlike build_plan's passes, the final norm runs on every token (the
// engine normalises the whole batch) and sampling is the LM head's rows (the engine samples outside the
// model's forward pass).
// Throws dsaserve::Error for an empty batch or a request without new tokens.
Pass plan_step(const model::ModelConfig& c, const Deployment& d, const Hardware& hw, const StepShape& s);

// Totals of one step made of these passes (each once).
StepTotals step_totals(const std::vector<Pass>& passes, int64_t tp);

// Parses a deployment written as comma-separated items "tp8,ep8,dp8[,deepep][,fp8]" (tp, ep-size,
// attn-dp-size, --moe-a2a-backend deepep, --kv-cache-dtype fp8_e4m3); throws dsaserve::Error naming the
// item at fault, and validates it against the model.
Deployment parse_deployment(const std::string& spec, const model::ModelConfig& c);

}  // namespace dsaserve::plan
