// The speculative-sampling rule (runtime/spec/spec_sampling.h) against exact distributions: the residual
// and acceptance give exactly p (analytically, for random p and q, disjoint and equal supports
// included); accept_or_resample's empirical output over 200,000 draws fits p (chi-square) while the
// broken rule (resampling from p) fails the same statistic; ChainSampler's first token fits p_0 with
// any q; greedy chains accept only the target's argmax and the penalties count the drafts before a row.
// Under a grammar constraint (a small rule with real rollback; xgrammar's in tests/grammar): each verify
// row is masked at the state after the drafts before it, a draft the rule refuses is rejected, a draft
// that completes the rule ends the run, the constraint is back at its round-start state afterwards, and
// the first emitted token of a sampled chain fits the masked p_0.
#include "runtime/spec/spec_sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "common/chi_square.h"

namespace dsaserve::runtime {
namespace {

std::vector<double> random_dist(SamplerState& g, size_t n, double zero_frac) {
  std::vector<double> d(n);
  double s = 0;
  for (double& x : d) {
    x = g.uniform() < zero_frac ? 0.0 : std::pow(g.uniform(), 3.0);
    s += x;
  }
  if (s == 0) d[0] = s = 1;
  for (double& x : d) x /= s;
  return d;
}

// The exact law of the emitted token: x ~ q, accepted with min(1, p/q), else the residual.
std::vector<double> exact_output(const std::vector<double>& p, const std::vector<double>& q) {
  const std::vector<double> res = residual_distribution(p, q);
  double reject = 0;
  std::vector<double> out(p.size(), 0.0);
  for (size_t x = 0; x < p.size(); ++x) {
    if (q[x] <= 0) continue;
    const double a = std::min(1.0, p[x] / q[x]);
    out[x] += q[x] * a;
    reject += q[x] * (1 - a);
  }
  for (size_t y = 0; y < p.size(); ++y) out[y] += reject * res[y];
  return out;
}

TEST(SpecSampling, ResidualRuleGivesExactlyTheTarget) {
  SamplerState g(7, {});
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 2 + size_t(trial % 9);
    const std::vector<double> p = random_dist(g, n, trial % 3 == 0 ? 0.4 : 0.0);
    std::vector<double> q = random_dist(g, n, trial % 4 == 1 ? 0.4 : 0.0);
    if (trial % 10 == 5) q = p;  // equal: everything accepted
    if (trial % 10 == 7) {       // disjoint supports: everything rejected
      q.assign(n, 0.0);
      for (size_t i = 0; i < n; ++i) q[i] = p[i] > 0 ? 0.0 : 1.0;
      double s = 0;
      for (double x : q) s += x;
      if (s == 0) continue;
      for (double& x : q) x /= s;
    }
    const std::vector<double> out = exact_output(p, q);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], p[i], 1e-12) << "trial " << trial << " token " << i;
  }
}

TEST(SpecSampling, DrawFromFollowsTheCumulativeScan) {
  const std::vector<double> d{0.0, 0.25, 0.0, 0.75};
  EXPECT_EQ(draw_from(d, 0.0), 1);
  EXPECT_EQ(draw_from(d, 0.2499), 1);
  EXPECT_EQ(draw_from(d, 0.25), 3);
  EXPECT_EQ(draw_from(d, 0.9999999), 3);
  EXPECT_EQ(draw_from(std::vector<double>{0.5, 0.49999, 0.0}, 0.999995), 1);  // rounding: last positive
}

// The broken rule the statistics must catch: a rejected row resamples from p, not from the residual.
ResidualRule wrong_residual() {
  return [](std::span<const double> p, std::span<const double>) {
    return std::vector<double>(p.begin(), p.end());
  };
}

// Draws x ~ q and applies accept_or_resample `n` times; returns the emitted tokens' counts.
std::vector<int64_t> simulate(const std::vector<double>& p, const std::vector<double>& q, int64_t n,
                              bool wrong) {
  SamplerState g(12345, {});
  std::vector<int64_t> counts(p.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t x = draw_from(q, g.uniform());
    counts[size_t(accept_or_resample(p, q, x, g, wrong ? wrong_residual() : ResidualRule{}).token)] += 1;
  }
  return counts;
}

TEST(SpecSampling, AcceptOrResampleFitsTheTargetAndTheBrokenRuleFails) {
  const std::vector<double> p{0.30, 0.05, 0.25, 0.10, 0.0, 0.30};
  const std::vector<double> q{0.10, 0.40, 0.05, 0.25, 0.20, 0.0};
  constexpr int64_t kN = 200000;
  const auto good = testing::chi_square_fit(simulate(p, q, kN, false), p);
  EXPECT_GT(good.p_value, 1e-3) << "chi2 " << good.stat << " df " << good.df;
  const auto bad = testing::chi_square_fit(simulate(p, q, kN, true), p);
  EXPECT_LT(bad.p_value, 1e-6) << "chi2 " << bad.stat << " df " << bad.df;
}

SamplingParams sampled(float t) {
  SamplingParams sp;
  sp.temperature = t;
  return sp;
}

TEST(SpecSampling, ChainSamplerFirstTokenFitsTheTargetRow) {
  // Target row 0 and a draft row whose distribution differs; the first emitted token must follow p_0
  // whatever q is (and whether or not the draft is accepted).
  const std::vector<float> target{2.0f, 0.5f, 1.0f, -1.0f, 0.0f};
  const std::vector<float> draft{0.0f, 2.0f, 0.5f, 1.0f, -2.0f};
  const SamplingParams sp = sampled(1.0f);
  const std::vector<double> p0 = sampling_distribution(target, sp, SamplerState(0, {}));
  std::vector<float> rows(target.begin(), target.end());
  rows.insert(rows.end(), target.begin(), target.end());  // row 1 (after an accepted draft)
  std::vector<int64_t> counts(target.size(), 0);
  int64_t accepted = 0;
  for (uint64_t seed = 0; seed < 50000; ++seed) {
    SamplerState st(seed, {});
    ChainSampler cs(sp, st);
    cs.propose(draft, 10);
    const std::vector<SampleResult> run = cs.judge(rows, int64_t(target.size()));
    ASSERT_GE(run.size(), 1u);
    ASSERT_LE(run.size(), 2u);
    accepted += int64_t(run.size()) - 1;
    counts[size_t(run[0].token)] += 1;
    if (run.size() == 2) {
      EXPECT_EQ(run[0].token, cs.drafts()[0]);
    }
  }
  const auto t = testing::chi_square_fit(counts, p0);
  EXPECT_GT(t.p_value, 1e-3) << "chi2 " << t.stat;
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 50000);
}

TEST(SpecSampling, HookedDraftIsOneHotAndStaysExact) {
  // A hook that always plants token 3: q is one-hot there, accepted with p(3), else p without 3.
  const std::vector<float> target{1.0f, 0.0f, 0.5f, 1.5f};
  const SamplingParams sp = sampled(1.0f);
  const std::vector<double> p0 = sampling_distribution(target, sp, SamplerState(0, {}));
  std::vector<float> rows(target.begin(), target.end());
  rows.insert(rows.end(), target.begin(), target.end());
  std::vector<int64_t> counts(target.size(), 0);
  for (uint64_t seed = 0; seed < 40000; ++seed) {
    SamplerState st(seed, {});
    ChainSampler cs(sp, st);
    EXPECT_EQ(cs.propose(target, 0, [](int64_t, int32_t) { return int32_t(3); }), 3);
    counts[size_t(cs.judge(rows, 4)[0].token)] += 1;
  }
  EXPECT_GT(testing::chi_square_fit(counts, p0).p_value, 1e-3);
}

TEST(SpecSampling, GreedyChainAcceptsTheArgmaxAndCountsDraftsInPenalties) {
  // Greedy with a frequency penalty: the MTP proposes 2 twice (its row favours 2); the target's rows all
  // favour 2 by 1.0, so row 0 accepts 2, and row 1 (2 once in the history, penalty 1.5) picks 1.
  SamplingParams sp = sampled(0.0f);
  sp.frequency_penalty = 1.5f;
  SamplerState st(1, std::vector<int32_t>{}, true);
  ChainSampler cs(sp, st);
  const std::vector<float> mtp{0.0f, 0.0f, 5.0f, 0.0f};
  EXPECT_EQ(cs.propose(mtp, 0), 2);
  EXPECT_EQ(cs.propose(mtp, 1), 2);  // 5 - 1.5 still wins on the draft side
  const std::vector<float> row{0.0f, 1.0f, 2.0f, 0.0f};
  std::vector<float> rows;
  for (int i = 0; i < 3; ++i) rows.insert(rows.end(), row.begin(), row.end());
  const std::vector<SampleResult> run = cs.judge(rows, 4);
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0].token, 2);
  EXPECT_EQ(run[1].token, 1);
  // The logprob is the target's raw one (log_softmax of the row), as without speculation.
  SamplingParams lp = sp;
  lp.logprobs = true;
  SamplerState st2(1, std::vector<int32_t>{}, true);
  ChainSampler c2(lp, st2);
  c2.propose(mtp, 0);
  c2.propose(mtp, 1);
  const std::vector<SampleResult> r2 = c2.judge(rows, 4);
  ASSERT_EQ(r2.size(), 2u);
  const double lse = std::log(std::exp(0.0) * 2 + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(r2[0].logprob, 2.0 - lse, 1e-6);
  EXPECT_NEAR(r2[1].logprob, 1.0 - lse, 1e-6);
}

// Tokens strictly increasing, then the stop token 0 (allowed after two tokens), which completes the rule.
class Ascending final : public TokenConstraint {
 public:
  explicit Ascending(int64_t vocab) : vocab_(vocab) {}
  void mask_logits(std::span<float> logits) override {
    TokenMask m;
    fill_mask(m);
    m.apply(logits);
  }
  void fill_mask(TokenMask& m) override {
    ASSERT_FALSE(terminated());
    m.vocab = vocab_;
    m.words.assign(size_t((vocab_ + 31) / 32), 0u);
    for (int32_t t = 0; t < int32_t(vocab_); ++t) {
      if (allows(t)) m.words[size_t(t) / 32] |= 1u << (uint32_t(t) % 32);
    }
  }
  bool accept(int32_t t) override {
    if (terminated() || !allows(t)) return false;
    seq.push_back(t);
    return true;
  }
  void rollback(int64_t n) override {
    ASSERT_LE(size_t(n), seq.size());
    seq.resize(seq.size() - size_t(n));
  }
  bool terminated() const override { return !seq.empty() && seq.back() == 0; }

  std::vector<int32_t> seq;

 private:
  bool allows(int32_t t) const {
    if (t == 0) return seq.size() >= 2;
    return seq.empty() || t > seq.back();
  }
  int64_t vocab_;
};

TEST(SpecSamplingGrammar, GreedyRowsAreMaskedAfterTheDraftsBeforeThem) {
  constexpr int64_t V = 8;
  auto c = std::make_shared<Ascending>(V);
  c->seq = {2};  // a request that has produced token 2
  SamplingParams sp = sampled(0.0f);
  sp.constraint = c;
  SamplerState st(1, {});
  // The MTP favours 1, refused after 2: the masked draft is 7.
  const std::vector<float> mtp{0.0f, 9.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  {
    ChainSampler cs(sp, st);
    EXPECT_EQ(cs.propose(mtp, 0), 7);
    EXPECT_EQ(c->seq, (std::vector<int32_t>{2, 7}));
  }  // a round that is never judged (its forward threw) rolls its drafts back when it goes
  EXPECT_EQ(c->seq, (std::vector<int32_t>{2}));
  // The hook plants 3, 5, 4: draft 2 (4 after 5) is refused, so the constraint follows drafts 0 and 1.
  ChainSampler hooked(sp, st);
  const std::vector<int32_t> plant{3, 5, 4};
  for (int64_t i = 0; i < 3; ++i)
    hooked.propose(mtp, i, [&](int64_t at, int32_t) { return plant[size_t(at)]; });
  EXPECT_EQ(c->seq, (std::vector<int32_t>{2, 3, 5})) << "the constraint follows the drafts it allows";
  // Target rows: row 0 and row 1 favour the drafts; row 2 favours 4 (refused after 5): its masked argmax
  // is 6, so the refused draft is rejected there and 6 emitted.
  std::vector<float> rows(size_t(4 * V), 0.0f);
  rows[0 * V + 3] = 5.0f;
  rows[1 * V + 5] = 5.0f;
  rows[2 * V + 4] = 9.0f;
  rows[2 * V + 6] = 1.0f;
  const std::vector<SampleResult> run = hooked.judge(rows, V);
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(run[0].token, 3);
  EXPECT_EQ(run[1].token, 5);
  EXPECT_EQ(run[2].token, 6);
  EXPECT_EQ(c->seq, (std::vector<int32_t>{2})) << "rolled back to the round's start";
}

TEST(SpecSamplingGrammar, AnAcceptedDraftThatCompletesTheRuleEndsTheRun) {
  constexpr int64_t V = 8;
  auto c = std::make_shared<Ascending>(V);
  c->seq = {1, 2};
  SamplingParams sp = sampled(0.0f);
  sp.constraint = c;
  SamplerState st(1, {});
  ChainSampler cs(sp, st);
  const std::vector<int32_t> plant{4, 0, 6};  // 0 completes the rule: nothing may follow it
  const std::vector<float> mtp(size_t(V), 0.0f);
  for (int64_t i = 0; i < 3; ++i) cs.propose(mtp, i, [&](int64_t at, int32_t) { return plant[size_t(at)]; });
  EXPECT_EQ(c->seq, (std::vector<int32_t>{1, 2, 4, 0}));
  std::vector<float> rows(size_t(4 * V), 0.0f);
  rows[0 * V + 4] = 5.0f;
  rows[1 * V + 0] = 5.0f;
  rows[2 * V + 6] = 5.0f;
  rows[3 * V + 7] = 5.0f;
  const std::vector<SampleResult> run = cs.judge(rows, V);
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0].token, 4);
  EXPECT_EQ(run[1].token, 0);
  EXPECT_EQ(c->seq, (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(c->terminated());
}

TEST(SpecSamplingGrammar, SampledFirstTokenFitsTheMaskedTargetRow) {
  // The draft's q and the target's p_0 both masked at the state after token 5 (allowed: 6, 7, and 0):
  // the emitted token follows masked p_0 whatever q is; a second row follows its own mask after draft 0.
  constexpr int64_t V = 8;
  const std::vector<float> target{0.5f, 2.0f, 1.0f, 0.0f, 1.5f, 0.2f, 0.3f, -0.5f};
  const std::vector<float> draft{-1.0f, 0.0f, 0.5f, 1.0f, 0.0f, 2.0f, -1.0f, 1.5f};
  SamplingParams sp = sampled(1.0f);
  auto ref = std::make_shared<Ascending>(V);
  ref->seq = {3, 5};
  const std::vector<double> p0 = sampling_distribution(target, sp, SamplerState(0, {}), ref.get());
  EXPECT_EQ(p0[1], 0.0);
  std::vector<float> rows(target.begin(), target.end());
  rows.insert(rows.end(), target.begin(), target.end());
  std::vector<int64_t> counts(size_t(V), 0);
  int64_t accepted = 0;
  for (uint64_t seed = 0; seed < 40000; ++seed) {
    auto c = std::make_shared<Ascending>(V);
    c->seq = {3, 5};
    SamplingParams p = sp;
    p.constraint = c;
    SamplerState st(seed, {});
    ChainSampler cs(p, st);
    cs.propose(draft, 10);
    const std::vector<SampleResult> run = cs.judge(rows, V);
    ASSERT_EQ(c->seq, (std::vector<int32_t>{3, 5}));
    ASSERT_TRUE(run[0].token == 0 || run[0].token == 6 || run[0].token == 7) << run[0].token;
    counts[size_t(run[0].token)] += 1;
    if (run.size() == 2) {
      ++accepted;
      ASSERT_NE(run[0].token, 0) << "the stop token ends the run";
      ASSERT_GT(run[1].token == 0 ? 8 : run[1].token, run[0].token) << "row 1 masked after draft 0";
    }
  }
  const auto t = testing::chi_square_fit(counts, p0);
  EXPECT_GT(t.p_value, 1e-3) << "chi2 " << t.stat;
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace dsaserve::runtime
