#pragma once
// Sampling on the device (serve --sampling-device gpu): the step's logits stay on the CUDA device; the
// rows that sample without a constraint are sampled there by kernels::cuda::sample_rows (the CPU
// sampler's semantics, the request's own draw), and only the rows of constrained requests (grammar
// masks, which the CPU sampler applies) are copied to the host. The results go to
// Scheduler::process(batch, rows, out), which shares every line of stop/output handling with the CPU path.
#include <vector>

#include "core/tensor.h"
#include "runtime/scheduler/scheduler.h"

namespace dsaserve::runtime {

// The inputs of Scheduler::process for one step, and the storage they point into.
struct DeviceSampledStep {
  std::vector<SampleRow> rows;        // [items]
  std::vector<SampleResult> results;  // [items]: the device's results (rows[k].sampled points here)
  Tensor host_logits;                 // [constrained rows, vocab] f32 host (rows[k].logits points here)
};

// Samples `batch`'s unconstrained sampling items from `logits` ([items, vocab] f32 on the CUDA device),
// consuming each request's draw as sample() would, and copies the constrained items' rows to the host.
// Throws dsaserve::Error in a build without CUDA.
void sample_on_device(Scheduler& scheduler, const ScheduleBatch& batch, const Tensor& logits,
                      DeviceSampledStep& step);

// True when this build can sample on the device (it was built with CUDA).
bool device_sampling_available();

}  // namespace dsaserve::runtime
