#include "runtime/engine/cuda_graph_spec.h"

namespace dsaserve::runtime {

SpecGraphRunner::SpecGraphRunner(const model::Model& model, model::KvCache& cache, int32_t scratch_page,
                                 int64_t max_bs, const model::ForwardOptions& opt, int64_t num_steps,
                                 bool log)
    : verify_(model, cache, scratch_page, max_bs, opt, log, GraphPass::verify, num_steps + 1),
      draft_(model, cache, scratch_page, max_bs, opt, log, GraphPass::draft, 1) {}

double SpecGraphRunner::capture_all() { return verify_.capture_all() + draft_.capture_all(); }

std::optional<model::ForwardOutput> SpecGraphRunner::draft(const model::ForwardBatch& mb,
                                                           const Tensor& hidden) {
  return draft_.run_pass(mb, hidden);
}

std::optional<model::ForwardOutput> SpecGraphRunner::verify(const model::ForwardBatch& fb) {
  return verify_.run_pass(fb);
}

}  // namespace dsaserve::runtime
