// The Engine's speculative-decoding parts (EngineConfig::speculative; the passes: runtime/spec/spec_round.h).
#include "core/error.h"
#include "runtime/engine/cuda_graph_spec.h"
#include "runtime/engine/engine.h"
#include "runtime/spec/spec_round.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

void Engine::mtp_after_step(const ScheduleBatch& batch, const Tensor& hidden) {
  DSA_CHECK(hidden.defined(), "engine: the step kept no hidden states for the MTP layer");
  model::ForwardBatch mb;
  mb.page_size = cfg_.page_size;
  std::vector<Tensor> rows;
  int64_t off = 0;  // the item's first row in the step (build_forward's order)
  for (size_t k = 0; k < batch.items.size(); ++k) {
    const ScheduledRequest& s = batch.items[k];
    const int64_t row0 = off;
    off += s.num_new;
    const Request* r = scheduler_->find(s.id);
    if (r == nullptr || r->serial != s.serial || !r->speculate) continue;
    // The MTP row at position p takes tokens[p + 1]: every position of the item whose next token is known.
    int64_t m = 0;
    while (m < s.num_new && s.start + m + 1 < int64_t(r->tokens.size()) &&
           r->tokens[size_t(s.start + m + 1)] != kFutureToken)
      ++m;
    if (m > 0) {
      mb.add_request(std::span<const int32_t>(r->tokens).subspan(size_t(s.start + 1), size_t(m)), s.start,
                     r->kv.pages, false);
      rows.push_back(hidden.slice(0, row0, row0 + m));
    }
    if (Request* w = scheduler_->sampling_request(batch, k)) {
      w->spec_hidden = stack_rows(model_->ops(), {hidden.slice(0, row0 + s.num_new - 1, row0 + s.num_new)});
    }
  }
  mtp_extend(*model_, pool_->cache(), cfg_.forward, mb, rows);
}

int64_t Engine::spec_round(ScheduleBatch& batch, std::vector<StepOutput>& out) {
  scheduler_->prune(batch);  // requests that the normal part's aborts or outputs ended
  if (batch.empty()) return 0;
  const int64_t N = cfg_.speculative.num_steps;
  std::vector<SpecSlot> slots;
  for (const ScheduledRequest& s : batch.items) {
    Request& r = *s.req;
    slots.push_back({r.id, r.tokens.back(), r.kv.len, r.kv.pages, r.spec_hidden, &r.params, &r.sampler});
  }
  scheduler_->commit(batch);
  SpecVerdict v;
  try {
    v = draft_and_verify(*model_, pool_->cache(), cfg_.forward, N, slots, cfg_.spec_draft_hook,
                         cfg_.spec_residual, spec_graphs_.get());
    draft_extend(*model_, pool_->cache(), cfg_.forward, N, slots, v);
  } catch (const std::exception& e) {
    scheduler_->fail(batch, e.what(), out);
    return 0;
  }
  const size_t first = out.size();
  int64_t accepted = 0;
  std::vector<int64_t> hist(size_t(N + 2), 0);
  for (size_t k = 0; k < batch.items.size(); ++k) {
    if (Request* r = scheduler_->sampling_request(batch, k)) {
      r->spec_hidden = stack_rows(model_->ops(), {next_hidden(v, N, k)});
    }
    accepted += v.accepted[k];
    hist[size_t(v.accepted[k] + 1)] += 1;
    scheduler_->accept_drafts(batch.items[k], v.results[k], out);
  }
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.spec_rounds += int64_t(batch.items.size());
    stats_.spec_drafted_tokens += N * int64_t(batch.items.size());
    stats_.spec_accepted_tokens += accepted;
    if (stats_.spec_accept_length_hist.size() < hist.size())
      stats_.spec_accept_length_hist.resize(hist.size());
    for (size_t i = 0; i < hist.size(); ++i) stats_.spec_accept_length_hist[i] += hist[i];
  }
  int64_t generated = 0;
  for (size_t i = first; i < out.size(); ++i) generated += out[i].token >= 0 ? 1 : 0;
  return generated;
}

}  // namespace dsaserve::runtime
