#include "runtime/engine/device_sampling.h"

#include <utility>

#include "core/error.h"

#ifdef DSASERVE_HAVE_CUDA
#include "kernels/cuda/sampling/sampling.h"
#endif

namespace dsaserve::runtime {

bool device_sampling_available() {
#ifdef DSASERVE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

#ifdef DSASERVE_HAVE_CUDA
namespace {

// One device row's request data; the SampleRequest's spans point into it.
struct RowHistory {
  std::vector<int32_t> seen;
  std::vector<std::pair<int32_t, int32_t>> counts;
};

}  // namespace
#endif

void sample_on_device([[maybe_unused]] Scheduler& scheduler, const ScheduleBatch& batch, const Tensor& logits,
                      DeviceSampledStep& step) {
  const size_t n = batch.items.size();
  DSA_CHECK(logits.dim() == 2 && logits.size(0) == int64_t(n) && logits.dtype() == DType::f32,
            "device sampling: logits {} for {} requests (expected [requests, vocab] f32)",
            shape_str(logits.shape()), n);
  step.rows.assign(n, SampleRow{});
  step.results.assign(n, SampleResult{});
  step.host_logits = Tensor();
#ifdef DSASERVE_HAVE_CUDA
  DSA_CHECK(logits.device() == Device::cuda, "device sampling: the logits are not on the CUDA device");
  const int64_t vocab = logits.size(1);
  // Rows: the constrained ones go to the host, the others to the device sampler.
  std::vector<size_t> host_items, dev_items;
  for (size_t k = 0; k < n; ++k) {
    const Request* r = scheduler.sampling_request(batch, k);
    if (r == nullptr) continue;
    (r->params.constraint != nullptr ? host_items : dev_items).push_back(k);
  }
  if (!host_items.empty()) {
    step.host_logits = Tensor::empty({int64_t(host_items.size()), vocab}, DType::f32);
    for (size_t i = 0; i < host_items.size(); ++i)
      step.host_logits.select(0, int64_t(i)).copy_from(logits.select(0, int64_t(host_items[i])));
    const float* base = step.host_logits.data<float>();
    for (size_t i = 0; i < host_items.size(); ++i)
      step.rows[host_items[i]].logits = std::span<const float>(base + i * size_t(vocab), size_t(vocab));
  }
  if (dev_items.empty()) return;
  // The device rows as a contiguous [D, vocab] tensor (a view when every item samples on the device).
  Tensor dev_logits = logits;
  if (dev_items.size() != n) {
    dev_logits = Tensor::empty({int64_t(dev_items.size()), vocab}, DType::f32, Device::cuda);
    for (size_t i = 0; i < dev_items.size(); ++i)
      dev_logits.select(0, int64_t(i)).copy_from(logits.select(0, int64_t(dev_items[i])));
  }
  std::vector<RowHistory> hist(dev_items.size());
  std::vector<kernels::cuda::SampleRequest> reqs(dev_items.size());
  for (size_t i = 0; i < dev_items.size(); ++i) {
    Request& r = *scheduler.sampling_request(batch, dev_items[i]);
    const SamplingParams& p = r.params;
    RowHistory& h = hist[i];
    h.seen.reserve(r.sampler.seen().size());
    for (const auto& [tok, cnt] : r.sampler.seen()) h.seen.push_back(tok);
    h.counts.assign(r.sampler.output_counts().begin(), r.sampler.output_counts().end());
    kernels::cuda::SampleRequest& q = reqs[i];
    q.temperature = p.temperature;
    q.top_p = p.top_p;
    q.top_k = p.top_k;
    q.min_p = p.min_p;
    q.presence_penalty = p.presence_penalty;
    q.frequency_penalty = p.frequency_penalty;
    q.repetition_penalty = p.repetition_penalty;
    q.logit_bias = p.logit_bias;
    q.seen_tokens = h.seen;
    q.output_counts = h.counts;
    // The CPU sampler draws only when it samples (temperature > 0); so does this.
    q.uniform = p.temperature > 0.0f ? r.sampler.uniform() : 0.0;
    q.logprobs = p.logprobs;
    q.top_logprobs = p.top_logprobs;
  }
  std::vector<kernels::cuda::SampleOutput> res = kernels::cuda::sample_rows(dev_logits, reqs);
  DSA_CHECK(res.size() == dev_items.size(), "device sampling: {} results for {} rows", res.size(),
            dev_items.size());
  for (size_t i = 0; i < dev_items.size(); ++i) {
    SampleResult& out = step.results[dev_items[i]];
    out.token = res[i].token;
    out.logprob = res[i].logprob;
    out.top.reserve(res[i].top.size());
    for (const auto& t : res[i].top) out.top.push_back(TokenLogprob{t.token, t.logprob});
    step.rows[dev_items[i]].sampled = &out;
  }
#else
  fail("--sampling-device gpu: this dsaserve was built without CUDA");
#endif
}

}  // namespace dsaserve::runtime
