#pragma once
// Measured vs planned time per op for a trace (trace/trace.h) of dsaserve's forward passes: every traced
// pass (its span carries the batch) is priced with plan_step (step.h) for its exact requests, and the
// op spans' measured time sits next to the plan's roofline time for the same ops and shapes, per key
// "step/pass/kind/op" (step: prefill | decode), with per-step totals and the ratio.
//
// The roofline is the plan's hardware (the H200 ceilings of GPU.md): on the GPU path the comparison is
// like for like (op spans timed with CUDA events); on the CPU path the ratio says how far the CPU
// reference is from an H200, and the summary says so. Collectives: the spans found (one process has
// none, and the summary says so) and, for a `what_if` deployment, what its plan would move for the
// traced batches (bytes per collective, per step).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "trace/trace.h"

namespace dsaserve::plan {

struct TraceSummaryOptions {
  Deployment deployment;  // the deployment that ran (one process: tp = 1)
  Hardware hardware = Hardware::named("h200");
  std::optional<Deployment> what_if;  // collectives a multi-GPU deployment would run for these batches
};

// {"hardware", "device", "note", "rows": [{key, step, pass, kind, op, count, measured_us, planned_us,
//  ratio, planned}], "steps": [{step, passes, measured_us, planned_us, ratio}], "not_traced": [...],
//  "collectives": {"traced": [...], "note", "what_if": {...}}}. Passes without their batch args (an old
// trace) are skipped and counted in "passes_without_batch"; op spans whose pass span is not among the
// events (a periodic flush between them) in "op_spans_without_pass".
nlohmann::json measured_vs_planned(const std::vector<trace::Event>& events, const model::ModelConfig& c,
                                   const TraceSummaryOptions& o);

// The summary as a text table (one line per row, then the step totals and the collectives).
std::string format_summary(const nlohmann::json& summary);

}  // namespace dsaserve::plan
