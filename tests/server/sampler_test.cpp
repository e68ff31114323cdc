// Sampler: greedy, seeded reproducibility, the realised distribution under temperature / top_k /
// top_p / min_p, penalties, logit_bias, logprobs, and a token constraint's mask.
#include "runtime/sampler/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "core/error.h"

namespace dsaserve::runtime {
namespace {

std::vector<float> test_logits() { return {1.0f, 2.0f, 0.5f, 3.0f, -1.0f, 2.5f, 0.0f, 1.5f}; }

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  SamplerState st(1, {});
  std::vector<float> scratch;
  EXPECT_EQ(sample(test_logits(), p, st, scratch).token, 3);
  const std::vector<float> tie = {0.f, 5.f, 5.f, 1.f};
  EXPECT_EQ(sample(tie, p, st, scratch).token, 1);
}

TEST(Sampler, SameSeedSameTokensOtherSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<float> scratch;
  auto run = [&](uint64_t seed) {
    SamplerState st(seed, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample(test_logits(), p, st, scratch).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

// Empirical frequencies over many draws match sampling_distribution, which matches the closed form.
void check_distribution(const SamplingParams& p, const std::vector<double>& expected) {
  const std::vector<float> logits = test_logits();
  SamplerState ref(0, {});
  const std::vector<double> dist = sampling_distribution(logits, p, ref);
  ASSERT_EQ(dist.size(), expected.size());
  for (size_t i = 0; i < dist.size(); ++i) EXPECT_NEAR(dist[i], expected[i], 1e-6) << "token " << i;
  SamplerState st(7, {});
  std::vector<float> scratch;
  std::vector<int> counts(logits.size(), 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[size_t(sample(logits, p, st, scratch).token)];
  for (size_t i = 0; i < counts.size(); ++i) {
    const double f = double(counts[i]) / n;
    const double sd = std::sqrt(expected[i] * (1 - expected[i]) / n);
    EXPECT_NEAR(f, expected[i], 5 * sd + 1e-12) << "token " << i;
  }
}

std::vector<double> softmax_of(const std::vector<float>& x, double t, const std::vector<bool>& keep) {
  std::vector<double> p(x.size(), 0.0);
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (keep[i]) s += (p[i] = std::exp(double(x[i]) / t));
  }
  for (double& v : p) v /= s;
  return p;
}

TEST(Sampler, TemperatureDistribution) {
  SamplingParams p;
  p.temperature = 0.7f;
  check_distribution(p, softmax_of(test_logits(), 0.7, std::vector<bool>(8, true)));
}

TEST(Sampler, TopKDistribution) {
  SamplingParams p;
  p.top_k = 3;  // tokens 3 (3.0), 5 (2.5), 1 (2.0)
  check_distribution(p,
                     softmax_of(test_logits(), 1.0, {false, true, false, true, false, true, false, false}));
}

TEST(Sampler, TopPDistribution) {
  SamplingParams p;
  // Full softmax sorted: 3 (0.385), 5 (0.233), 1 (0.142), 7 (0.086) ... top_p 0.7 keeps 3, 5, 1.
  p.top_p = 0.7f;
  check_distribution(p,
                     softmax_of(test_logits(), 1.0, {false, true, false, true, false, true, false, false}));
}

TEST(Sampler, MinPDistribution) {
  SamplingParams p;
  p.min_p = 0.3f;  // p/p_max >= 0.3: exp(l - 3) >= 0.3 -> l >= 1.796: tokens 1, 3, 5
  check_distribution(p,
                     softmax_of(test_logits(), 1.0, {false, true, false, true, false, true, false, false}));
}

TEST(Sampler, LogitBiasAndPenalties) {
  std::vector<float> scratch;
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{4, 10.0f}};
  SamplerState st(1, {});
  EXPECT_EQ(sample(test_logits(), p, st, scratch).token, 4);

  SamplingParams f;
  f.temperature = 0;
  f.frequency_penalty = 0.4f;  // token 3 seen twice: 3.0 - 0.8 = 2.2 < 2.5 (token 5)
  SamplerState fs(1, {});
  fs.record(3);
  EXPECT_EQ(sample(test_logits(), f, fs, scratch).token, 3);  // 3.0 - 0.4 = 2.6 still wins
  fs.record(3);
  EXPECT_EQ(sample(test_logits(), f, fs, scratch).token, 5);

  SamplingParams pr;
  pr.temperature = 0;
  pr.presence_penalty = 0.6f;  // once seen: 3.0 - 0.6 = 2.4 < 2.5
  SamplerState ps(1, {});
  ps.record(3);
  EXPECT_EQ(sample(test_logits(), pr, ps, scratch).token, 5);

  SamplingParams rp;
  rp.temperature = 0;
  rp.repetition_penalty = 1.5f;  // prompt holds 3: 3.0 / 1.5 = 2.0 < 2.5
  const std::vector<int32_t> prompt = {3};
  SamplerState rs(1, prompt);
  EXPECT_EQ(sample(test_logits(), rp, rs, scratch).token, 5);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  p.top_logprobs = 3;
  SamplerState st(1, {});
  std::vector<float> scratch;
  const std::vector<float> x = test_logits();
  const SampleResult r = sample(x, p, st, scratch);
  double s = 0;
  for (float v : x) s += std::exp(double(v));
  EXPECT_NEAR(r.logprob, 3.0 - std::log(s), 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 3);
  EXPECT_EQ(r.top[1].token, 5);
  EXPECT_EQ(r.top[2].token, 1);
  EXPECT_NEAR(r.top[1].logprob, 2.5 - std::log(s), 1e-5);
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  try {
    p.validate(8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  SamplingParams b;
  b.logit_bias = {{9, 1.0f}};
  EXPECT_THROW(b.validate(8), Error);
}

// A constraint that allows a fixed set of ids (the grammar module's masks come through this interface).
class AllowSet : public TokenConstraint {
 public:
  explicit AllowSet(std::vector<bool> allowed) : allowed_(std::move(allowed)) {}
  void mask_logits(std::span<float> logits) override {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (!allowed_[i]) logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
  void fill_mask(TokenMask& m) override {
    m.vocab = int64_t(allowed_.size());
    m.words.assign((allowed_.size() + 31) / 32, 0u);
    for (size_t i = 0; i < allowed_.size(); ++i) {
      if (allowed_[i]) m.words[i / 32] |= 1u << (i % 32);
    }
  }
  bool accept(int32_t token) override { return allowed_[size_t(token)]; }
  void rollback(int64_t) override {}  // stateless
  bool terminated() const override { return false; }

 private:
  std::vector<bool> allowed_;
};

TEST(Sampler, ConstraintMasksGreedyAndSampledDrawsLogprobsStayRaw) {
  const std::vector<bool> keep = {true, false, true, false, false, false, true, true};  // not 3, 5, 1
  AllowSet c(keep);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = true;
  SamplerState st(1, {});
  std::vector<float> scratch;
  const std::vector<float> x = test_logits();
  const SampleResult g = sample(x, p, st, scratch, &c);
  EXPECT_EQ(g.token, 7);  // the best allowed (1.5)
  double s = 0;
  for (float v : x) s += std::exp(double(v));
  EXPECT_NEAR(g.logprob, 1.5 - std::log(s), 1e-5);  // from the unmasked distribution
  // Sampled: the realised distribution is the softmax over the allowed ids, with top_p on top.
  p.temperature = 1.0f;
  const std::vector<double> want = softmax_of(x, 1.0, keep);
  const std::vector<double> dist = sampling_distribution(x, p, st, &c);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(dist[i], want[i], 1e-9) << i;
  p.top_p = 0.5f;  // allowed sorted: 7 (1.5), 0 (1.0), 2 (0.5), 6 (0.0): 7 alone has 0.455 < 0.5 -> 7, 0
  const std::vector<double> top = sampling_distribution(x, p, st, &c);
  EXPECT_NEAR(top[7] + top[0], 1.0, 1e-9);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample(x, p, st, scratch, &c).token;
    EXPECT_TRUE(t == 7 || t == 0) << t;
  }
  AllowSet none(std::vector<bool>(8, false));
  EXPECT_THROW(sample(x, p, st, scratch, &none), Error);
}

// issue 6: the fast paths (greedy argmax read in place, the unfiltered temperature draw without a
// candidate list) pick exactly the tokens of the reference definitions.

// The reference greedy pick: a scan that moves on only to a strictly larger value.
int32_t reference_argmax(const std::vector<float>& x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[size_t(best)]) best = int32_t(i);
  }
  return best;
}

TEST(SamplerFastPath, GreedyEqualsTheReferenceScanOnTiesNaNsInfinitiesAndOddSizes) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  SamplingParams p;
  p.temperature = 0;
  SamplingParams biased = p;  // a zero bias takes the copy path: same logits, other code
  biased.logit_bias = {{0, 0.0f}};
  std::vector<std::vector<float>> rows = {
      {0.f},         {nan, 5.f, 7.f},      {1.f, nan, 7.f, nan, 7.f}, {-inf, -inf, -inf}, {-0.0f, 0.0f, -1.f},
      {0.0f, -0.0f}, {3.f, inf, 2.f, inf},
  };
  std::mt19937 rng(3);
  for (size_t n : {1, 15, 16, 17, 31, 33, 100, 1000, 154880}) {
    std::vector<float> x(n);
    std::uniform_int_distribution<int> small(-4, 4);  // many ties
    for (float& v : x) v = float(small(rng));
    rows.push_back(x);
    x[n - 1] = 9.f;  // the maximum in the scalar tail / last lane
    rows.push_back(x);
    std::normal_distribution<float> nd;
    for (float& v : x) v = nd(rng);
    rows.push_back(x);
  }
  std::vector<float> scratch;
  for (size_t i = 0; i < rows.size(); ++i) {
    SamplerState st(1, {});
    EXPECT_EQ(sample(rows[i], p, st, scratch).token, reference_argmax(rows[i])) << "row " << i;
    if (!std::isnan(rows[i][0])) {
      EXPECT_EQ(sample(rows[i], biased, st, scratch).token, reference_argmax(rows[i])) << "row " << i;
    }
  }
}

TEST(SamplerFastPath, UnfilteredTemperatureDrawEqualsTheDistributionScan) {
  std::mt19937 rng(5);
  std::vector<float> scratch;
  for (int64_t V : {8, 1000, 32768}) {
    std::vector<float> x(static_cast<size_t>(V));
    std::normal_distribution<float> nd(0.f, 3.f);
    for (float& v : x) v = nd(rng);
    for (float t : {0.3f, 1.0f, 1.7f}) {
      SamplingParams p;
      p.temperature = t;
      SamplingParams biased = p;
      biased.logit_bias = {{1, 0.0f}};
      for (uint64_t seed = 0; seed < 20; ++seed) {
        SamplerState st(seed, {});
        SamplerState ref = st;  // the same next uniform
        const std::vector<double> dist = sampling_distribution(x, p, ref);
        const double u = ref.uniform();
        int32_t want = int32_t(V - 1);
        double cum = 0;
        for (size_t i = 0; i < dist.size(); ++i) {
          cum += dist[i];
          if (u < cum) {
            want = int32_t(i);
            break;
          }
        }
        SamplerState st2 = st;
        EXPECT_EQ(sample(x, p, st, scratch).token, want) << "V " << V << " T " << t << " seed " << seed;
        EXPECT_EQ(sample(x, biased, st2, scratch).token, want) << "V " << V << " T " << t << " seed " << seed;
      }
    }
  }
}

TEST(SamplerFastPath, UntrackedStateDrawsTheSameAndKeepsNoHistory) {
  const std::vector<int32_t> prompt = {3, 3, 5};
  SamplerState tracked(9, prompt), untracked(9, prompt, false);
  EXPECT_EQ(tracked.seen().size(), 2u);
  EXPECT_TRUE(untracked.seen().empty());
  untracked.record(4);
  tracked.record(4);
  EXPECT_TRUE(untracked.output_counts().empty());
  EXPECT_EQ(tracked.output_counts().at(4), 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tracked.uniform(), untracked.uniform());
  SamplingParams p;
  EXPECT_FALSE(uses_token_history(p));
  p.presence_penalty = 0.5f;
  EXPECT_TRUE(uses_token_history(p));
}

}  // namespace
}  // namespace dsaserve::runtime
