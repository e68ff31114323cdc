#include "runtime/spec/spec_sampling.h"

#include <exception>

#include "core/error.h"

namespace dsaserve::runtime {

int32_t draw_from(std::span<const double> dist, double u) {
  DSA_CHECK(!dist.empty(), "spec: drawing from an empty distribution");
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < dist.size(); ++i) {
    if (dist[i] <= 0.0) continue;
    last = int32_t(i);
    cum += dist[i];
    if (u < cum) return int32_t(i);
  }
  DSA_CHECK(last >= 0, "spec: drawing from a distribution without mass");
  return last;
}

std::vector<double> residual_distribution(std::span<const double> p, std::span<const double> q) {
  DSA_CHECK(p.size() == q.size(), "spec: p has {} entries, q {}", p.size(), q.size());
  std::vector<double> r(p.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    r[i] = p[i] > q[i] ? p[i] - q[i] : 0.0;
    sum += r[i];
  }
  // p <= q everywhere happens only when p == q (both sum to 1), where nothing is rejected; a rounding
  // residue of that case falls back to p.
  if (!(sum > 1e-12)) return std::vector<double>(p.begin(), p.end());
  for (double& x : r) x /= sum;
  return r;
}

ChainStep accept_or_resample(std::span<const double> p, std::span<const double> q, int32_t x,
                             SamplerState& rng, const ResidualRule& residual) {
  DSA_CHECK(x >= 0 && size_t(x) < p.size() && p.size() == q.size(), "spec: draft token {} of {}", x,
            p.size());
  DSA_CHECK(q[size_t(x)] > 0.0, "spec: draft token {} has no mass in the draft distribution", x);
  const double u = rng.uniform();
  if (u * q[size_t(x)] < p[size_t(x)]) return {true, x};  // u < p(x) / q(x)
  const std::vector<double> r = residual ? residual(p, q) : residual_distribution(p, q);
  DSA_CHECK(r.size() == p.size(), "spec: a residual of {} entries for {}", r.size(), p.size());
  return {false, draw_from(r, rng.uniform())};
}

namespace {
int32_t argmax_of(std::span<const double> d) {
  size_t best = 0;
  for (size_t i = 1; i < d.size(); ++i) {
    if (d[i] > d[best]) best = i;
  }
  return int32_t(best);
}
}  // namespace

ChainSampler::ChainSampler(const SamplingParams& params, SamplerState& state, ResidualRule residual)
    : params_(params),
      state_(state),
      history_(state),
      draft_history_(state),
      residual_(std::move(residual)),
      constraint_(params.constraint.get()) {
  following_ = constraint_ != nullptr && !constraint_->terminated();
}

ChainSampler::~ChainSampler() {
  try {
    restore_constraint();
  } catch (const std::exception&) {
    // Only a round that threw before judge() gets here with drafts to undo; its requests fail.
  }
}

const TokenMask* ChainSampler::next_mask() {
  if (constraint_ == nullptr) return nullptr;
  const size_t row = drafts_.size();
  if (following_ && masks_.size() == row) {
    masks_.emplace_back();
    constraint_->fill_mask(masks_.back());
  }
  return row < masks_.size() ? &masks_[row] : nullptr;
}

void ChainSampler::restore_constraint() {
  following_ = false;
  if (constraint_ != nullptr && advanced_ > 0) {
    const int64_t n = advanced_;
    advanced_ = 0;
    constraint_->rollback(n);
  }
}

int32_t ChainSampler::propose(std::span<const float> mtp_logits, int64_t index, const DraftTokenHook& hook) {
  const TokenMask* mask = next_mask();  // draft i under the grammar's state after drafts 0..i-1
  int32_t x = 0;
  if (params_.temperature <= 0.0f) {
    // Greedy: the argmax of the adjusted logits (sample() draws nothing at temperature 0).
    x = sample(mtp_logits, params_, draft_history_, scratch_, mask).token;
    if (hook) x = hook(index, x);
  } else {
    std::vector<double> q = sampling_distribution(mtp_logits, params_, draft_history_, mask);
    if (hook) {
      x = hook(index, argmax_of(q));
      q.assign(q.size(), 0.0);
      if (x >= 0 && size_t(x) < q.size()) q[size_t(x)] = 1.0;
    } else {
      x = draw_from(q, state_.uniform());
    }
    q_.push_back(std::move(q));
  }
  DSA_CHECK(x >= 0 && int64_t(x) < int64_t(mtp_logits.size()), "spec: draft token {} outside the vocabulary",
            x);
  if (following_) {
    // A draft the grammar refuses (a hook's) is rejected at its row: no row after it is judged.
    if (constraint_->accept(x)) {
      ++advanced_;
      if (constraint_->terminated()) {
        ends_at_ = int64_t(drafts_.size());
        following_ = false;
      }
    } else {
      following_ = false;
    }
  }
  drafts_.push_back(x);
  draft_history_.record(x);
  return x;
}

std::vector<SampleResult> ChainSampler::judge(std::span<const float> rows, int64_t vocab) {
  const size_t N = drafts_.size();
  DSA_CHECK(int64_t(rows.size()) == int64_t(N + 1) * vocab,
            "spec: {} verify logits for {} drafts of vocab {}", rows.size(), N, vocab);
  next_mask();  // the bonus row's
  restore_constraint();
  const bool want_logprobs = params_.logprobs || params_.top_logprobs > 0;
  std::vector<SampleResult> run;
  SamplerState& h = history_;  // + the drafts accepted so far
  for (size_t i = 0; i <= N; ++i) {
    const TokenMask* mask = i < masks_.size() ? &masks_[i] : nullptr;
    // Every accepted draft was allowed by its row's mask, so the constraint followed it: a later row
    // without a mask means the constraint and its masks disagree; the run then ends at the last draft
    // (the OutputProcessor's accept has the last word on it).
    if (constraint_ != nullptr && mask == nullptr && i > 0) break;
    const std::span<const float> row = rows.subspan(i * size_t(vocab), size_t(vocab));
    int32_t token = 0;
    bool accepted = false;
    if (params_.temperature <= 0.0f) {
      token = sample(row, params_, h, scratch_, mask).token;
      accepted = i < N && token == drafts_[i];
    } else {
      const std::vector<double> p = sampling_distribution(row, params_, h, mask);
      if (i < N) {
        const ChainStep st = accept_or_resample(p, q_[i], drafts_[i], state_, residual_);
        accepted = st.accepted;
        token = st.token;
      } else {
        token = draw_from(p, state_.uniform());  // every draft accepted: the bonus token
      }
    }
    SampleResult res =
        want_logprobs ? token_logprobs(row, token, params_.top_logprobs) : SampleResult{token, 0.0f, {}};
    res.token = token;
    run.push_back(std::move(res));
    if (!accepted) break;
    h.record(token);
    if (int64_t(i) == ends_at_) break;  // the draft completed the grammar: nothing may follow it
  }
  return run;
}

}  // namespace dsaserve::runtime
