#include "runtime/spec/spec_round.h"

#include <memory>

#include "core/error.h"
#include "runtime/spec/spec_sampling.h"
#include "trace/trace.h"

namespace dsaserve::runtime {

namespace {
Tensor host_f32(const Tensor& t) { return (t.device() == Device::cpu ? t : t.to(Device::cpu)).contiguous(); }
}  // namespace

int32_t greedy_token(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return int32_t(best);
}

Tensor stack_rows(const kernels::Ops& ops, const std::vector<Tensor>& parts) {
  DSA_CHECK(!parts.empty(), "spec: no hidden rows");
  int64_t n = 0;
  for (const Tensor& p : parts) n += p.size(0);
  Tensor out = Tensor::empty({n, parts[0].size(1)}, DType::f32, parts[0].device());
  int64_t at = 0;
  for (const Tensor& p : parts) {
    Tensor dst = out.slice(0, at, at + p.size(0));
    ops.copy_rows(dst, p);
    at += p.size(0);
  }
  return out;
}

SpecVerdict draft_and_verify(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                             int64_t num_steps, const std::vector<SpecSlot>& slots, const DraftHook& hook,
                             const ResidualRule& residual, SpecGraphs* graphs) {
  const int64_t V = m.config().vocab_size, N = num_steps, K = num_steps + 1;
  const size_t R = slots.size();
  DSA_CHECK(R > 0 && N >= 1, "spec: a round of {} requests and {} steps", R, N);
  std::vector<std::vector<int32_t>> drafts(R);
  // Slots with params draft and accept through their ChainSampler; the others greedily.
  std::vector<std::unique_ptr<ChainSampler>> samplers(R);
  for (size_t r = 0; r < R; ++r) {
    if (slots[r].params != nullptr) {
      DSA_CHECK(slots[r].sampler != nullptr, "spec: slot {} has params but no sampler state", r);
      samplers[r] = std::make_unique<ChainSampler>(*slots[r].params, *slots[r].sampler, residual);
    }
  }
  {
    trace::Scope span("draft", "spec");
    span.arg("requests", int64_t(R)).arg("steps", N);
    std::vector<Tensor> hs;
    std::vector<int32_t> cur(R);
    for (size_t r = 0; r < R; ++r) {
      hs.push_back(slots[r].hidden);
      cur[r] = slots[r].pending;
    }
    Tensor h = stack_rows(m.ops(), hs);
    model::ForwardOptions mo = fo;
    mo.inputs = nullptr;
    mo.all_logits = true;
    mo.keep_hidden = true;
    for (int64_t i = 0; i < N; ++i) {
      model::ForwardBatch mb;
      mb.page_size = cache.page_size;
      for (size_t r = 0; r < R; ++r) {
        mb.add_request(std::span<const int32_t>(&cur[r], 1), slots[r].len - 1 + i, slots[r].pages, true);
      }
      std::optional<model::ForwardOutput> g = graphs != nullptr ? graphs->draft(mb, h) : std::nullopt;
      const model::ForwardOutput o = g ? std::move(*g) : m.forward_mtp(mb, h, cache, mo, 0);
      const Tensor lg = host_f32(o.logits);
      for (size_t r = 0; r < R; ++r) {
        const int64_t index = slots[r].len + 1 + i;
        const std::span<const float> row(lg.data<float>() + int64_t(r) * V, size_t(V));
        if (samplers[r]) {
          DraftTokenHook h1;
          if (hook) h1 = [&](int64_t at, int32_t proposed) { return hook(slots[r].key, at, proposed); };
          cur[r] = samplers[r]->propose(row, index, h1);
        } else {
          cur[r] = greedy_token(row.data(), V);
          if (hook) cur[r] = hook(slots[r].key, index, cur[r]);
        }
        DSA_CHECK(cur[r] >= 0 && cur[r] < V, "spec: draft token {} outside the vocabulary", cur[r]);
        drafts[r].push_back(cur[r]);
      }
      h = o.hidden;
    }
  }
  model::ForwardBatch fb;
  fb.page_size = cache.page_size;
  for (size_t r = 0; r < R; ++r) {
    std::vector<int32_t> rows{slots[r].pending};
    rows.insert(rows.end(), drafts[r].begin(), drafts[r].end());
    fb.add_request(rows, slots[r].len, slots[r].pages, false);  // several new tokens: not a decode
  }
  model::ForwardOptions vo = fo;
  vo.inputs = nullptr;
  vo.all_logits = true;
  vo.keep_hidden = true;
  model::ForwardOutput out;
  {
    trace::Scope span("verify", "spec");
    span.arg("requests", int64_t(R)).arg("rows", int64_t(R) * K);
    std::optional<model::ForwardOutput> g = graphs != nullptr ? graphs->verify(fb) : std::nullopt;
    out = g ? std::move(*g) : m.forward(fb, cache, vo);
  }
  const Tensor lg = host_f32(out.logits);
  SpecVerdict v;
  v.hidden = out.hidden;
  for (size_t r = 0; r < R; ++r) {
    const float* rows = lg.data<float>() + (int64_t(r) * K) * V;
    std::vector<SampleResult> res;
    if (samplers[r]) {
      res = samplers[r]->judge(std::span<const float>(rows, size_t(K * V)), V);
    } else {
      int64_t j = 0;
      int32_t next = greedy_token(rows, V);
      while (j < N && drafts[r][size_t(j)] == next) {
        res.push_back({next, 0.0f, {}});
        ++j;
        next = greedy_token(rows + j * V, V);
      }
      res.push_back({next, 0.0f, {}});
    }
    std::vector<int32_t> run;
    for (const SampleResult& x : res) run.push_back(x.token);
    v.accepted.push_back(int64_t(run.size()) - 1);
    v.run.push_back(std::move(run));
    v.results.push_back(std::move(res));
  }
  return v;
}

void mtp_extend(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                const model::ForwardBatch& mb, const std::vector<Tensor>& hidden_rows) {
  if (mb.num_tokens() == 0) return;
  trace::Scope span("draft_extend", "spec");
  span.arg("tokens", mb.num_tokens());
  model::ForwardOptions mo = fo;
  mo.inputs = nullptr;
  mo.all_logits = false;
  mo.keep_hidden = false;
  m.forward_mtp(mb, stack_rows(m.ops(), hidden_rows), cache, mo, 0);
}

void draft_extend(const model::Model& m, model::KvCache& cache, const model::ForwardOptions& fo,
                  int64_t num_steps, const std::vector<SpecSlot>& slots, const SpecVerdict& v) {
  const int64_t K = num_steps + 1;
  model::ForwardBatch eb;
  eb.page_size = cache.page_size;
  std::vector<Tensor> rows;
  for (size_t r = 0; r < slots.size(); ++r) {
    const int64_t j = v.accepted[r];
    if (j == 0) continue;
    eb.add_request(std::span<const int32_t>(v.run[r]).first(size_t(j)), slots[r].len, slots[r].pages, false);
    rows.push_back(v.hidden.slice(0, int64_t(r) * K, int64_t(r) * K + j));
  }
  mtp_extend(m, cache, fo, eb, rows);
}

Tensor next_hidden(const SpecVerdict& v, int64_t num_steps, size_t slot) {
  const int64_t row = int64_t(slot) * (num_steps + 1) + v.accepted[slot];
  return v.hidden.slice(0, row, row + 1);
}

}  // namespace dsaserve::runtime
