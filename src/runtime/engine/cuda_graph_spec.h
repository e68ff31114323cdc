#pragma once
// SpecGraphRunner: the speculative round's passes through captured CUDA graphs (the reference article's
// two sets): verify graphs (steps + 1 rows per request, every row's logits and hidden state) and draft
// graphs (the MTP layer's one-token steps), each bucketed by batch and context like the decode graphs
// (cuda_graph_plan.h), over one scratch page for the padding requests. The round (runtime/spec/spec_round.h)
// asks it for each pass; a batch it declines (a shape that is not uniform, more requests than the largest
// bucket, a trace recorder active, a capture that failed) runs eagerly. Draft-extend stays eager: its
// rows per request are the accepted drafts, 0 .. steps, not a fixed shape.
//
// Graphs need what decode graphs need (cuda_graph_max_batch: CUDA, a kernel-format cache, the absorbed
// form for steps + 1 rows) and, for the draft graphs, the MTP layer's KV; --disable-cuda-graph (or
// --cuda-graph-max-bs 0) turns them off with the decode graphs.
#include <cstdint>
#include <optional>

#include "model/model.h"
#include "runtime/engine/cuda_graph_runner.h"
#include "runtime/spec/spec_round.h"

namespace dsaserve::runtime {

class SpecGraphRunner final : public SpecGraphs {
 public:
  // `opt`: the engine's forward options; `num_steps`: draft tokens per round (verify graphs run
  // num_steps + 1 rows per request). `log`: capture lines on stdout.
  SpecGraphRunner(const model::Model& model, model::KvCache& cache, int32_t scratch_page, int64_t max_bs,
                  const model::ForwardOptions& opt, int64_t num_steps, bool log = true);

  // Whether either set can replay at all.
  bool enabled() const { return verify_.enabled() || draft_.enabled(); }
  // Captures every batch bucket of both sets at the smallest context; returns the seconds it took.
  double capture_all();

  std::optional<model::ForwardOutput> draft(const model::ForwardBatch& mb, const Tensor& hidden) override;
  std::optional<model::ForwardOutput> verify(const model::ForwardBatch& fb) override;

  CudaGraphStats verify_stats() const { return verify_.stats(); }
  CudaGraphStats draft_stats() const { return draft_.stats(); }
  // Both sets: graphs captured, passes replayed.
  int64_t graphs() const { return verify_.stats().graphs + draft_.stats().graphs; }
  int64_t replays() const { return verify_.stats().replays + draft_.stats().replays; }

 private:
  CudaGraphRunner verify_;
  CudaGraphRunner draft_;
};

}  // namespace dsaserve::runtime
