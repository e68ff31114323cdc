// Speculative sampling through the Engine (issue 17): with temperature 1 on the tiny model the tokens a
// request emits with speculation on are distributed as without it (a two-sample chi-square test over
// thousands of seeded draws, per output position and jointly over two positions), with the MTP layer's
// own drafts, against the same test of a deliberately broken rule, which must fail it; greedy
// requests with penalties, logit_bias and logprobs speculate and equal their non-speculative tokens and
// logprobs (constrained requests: tests/server/serve_spec_test.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "common/chi_square.h"
#include "common/fixtures.h"
#include "model/model.h"
#include "runtime/engine/engine.h"

namespace dsaserve::runtime {
namespace {

SpeculativeConfig eagle(int64_t steps) {
  SpeculativeConfig c;
  c.algorithm = "EAGLE";
  c.num_steps = steps;
  return c;
}

struct Draws {
  std::vector<std::vector<int32_t>> tokens;  // per draw
  std::vector<std::vector<float>> logprobs;
  EngineStats stats;
};

// `n` requests of `prompt` (seeds seed0 ..), all submitted at once, run to completion.
Draws run_draws(const std::shared_ptr<const model::Model>& m, const SpeculativeConfig& spec, int64_t n,
                uint64_t seed0, const SamplingParams& params, const std::vector<int32_t>& prompt,
                bool wrong_residual = false) {
  EngineConfig ec;
  ec.kv_pages = 2048;
  ec.page_size = 4;
  ec.scheduler.max_running_requests = 128;
  ec.speculative = spec;
  if (wrong_residual) {  // the broken rule: a rejected row resamples from p, not from the residual
    ec.spec_residual = [](std::span<const double> p, std::span<const double>) {
      return std::vector<double>(p.begin(), p.end());
    };
  }
  Engine engine(m, ec);
  for (int64_t i = 0; i < n; ++i) {
    GenerateRequest g;
    g.id = uint64_t(i);
    g.prompt = prompt;
    g.params = params;
    g.params.seed = seed0 + uint64_t(i);
    engine.submit(std::move(g));
  }
  Draws d;
  d.tokens.resize(size_t(n));
  d.logprobs.resize(size_t(n));
  std::vector<StepOutput> outs;
  auto drain = [&] {
    engine.wait_outputs(outs, std::chrono::milliseconds(0));
    for (const StepOutput& o : outs) {
      EXPECT_NE(o.finish, FinishReason::error) << o.error;
      if (o.token < 0) continue;
      d.tokens[o.id].push_back(o.token);
      d.logprobs[o.id].push_back(o.logprob);
    }
    outs.clear();
  };
  while (engine.step()) drain();
  drain();
  engine.scheduler().check_integrity();
  EXPECT_EQ(engine.pool().num_pages() - engine.pool().free_pages(), engine.cache().cached_pages());
  d.stats = engine.stats();
  return d;
}

// Output position `pos`'s tokens (joint: the pair at pos, pos + 1).
std::map<int64_t, int64_t> histogram(const Draws& d, size_t pos, bool joint) {
  std::map<int64_t, int64_t> h;
  for (const auto& t : d.tokens) {
    EXPECT_GT(t.size(), pos + (joint ? 1 : 0));
    if (t.size() <= pos + (joint ? 1 : 0)) continue;
    h[joint ? int64_t(t[pos]) * 100000 + t[pos + 1] : int64_t(t[pos])] += 1;
  }
  return h;
}

// The smallest p-value of the per-position tests (positions 1, 2: the first speculative tokens; 0 is the
// prefill's sample) and of the joint test over positions 1 and 2.
double min_p_value(const Draws& a, const Draws& b, const std::string& what) {
  double lo = 1;
  for (int pos : {1, 2, -1, -2}) {
    const bool joint = pos < 0;
    const size_t at = joint ? size_t(-pos - 1) : size_t(pos);
    const auto t = testing::chi_square_homogeneity(histogram(a, at, joint), histogram(b, at, joint));
    fmt::print("{} {}: chi2 {:.1f} df {} p {:.3g}\n", what,
               joint ? fmt::format("joint({},{})", at, at + 1) : fmt::format("pos {}", pos), t.stat, t.df,
               t.p_value);
    lo = std::min(lo, t.p_value);
  }
  return lo;
}

constexpr int64_t kDraws = 4000;
// The random-weight model's distributions at temperature 1 are nearly flat over its 512 tokens, and a
// position's marginal mixes over every earlier token: errors of the rule wash out. A logit_bias on four
// tokens (applied to the target and the draft alike) puts most of the mass there, so that the pair of
// positions 0 and 1 (or 1 and 2) has few contexts and the within-four weights (where p and q differ)
// decide the test.
const std::vector<std::pair<int32_t, float>> kBias{{10, 6.0f}, {11, 6.0f}, {12, 6.0f}, {13, 6.0f}};

// Each case: plain draws, speculative ones (must match: p > 1e-3) and ones under the broken rule (must
// not: p < 1e-6). Seeds differ between the runs (independent samples).
void check_distribution(const std::shared_ptr<const model::Model>& m, const SamplingParams& sp,
                        const std::string& name, std::initializer_list<int64_t> steps) {
  const std::vector<int32_t> prompt{3, 17, 42, 99, 7, 250};
  const Draws plain = run_draws(m, {}, kDraws, 1, sp, prompt);
  for (int64_t n : steps) {
    const Draws spec = run_draws(m, eagle(n), kDraws, 1000000, sp, prompt);
    const EngineStats& st = spec.stats;
    EXPECT_GT(st.spec_rounds, kDraws / 2);
    EXPECT_GT(st.spec_accepted_tokens, 0);
    EXPECT_LT(st.spec_accepted_tokens, st.spec_drafted_tokens);  // rejections: the residual is drawn from
    fmt::print("{} steps {}: accept rate {:.3f}\n", name, n,
               double(st.spec_accepted_tokens) / double(st.spec_drafted_tokens));
    EXPECT_GT(min_p_value(plain, spec, fmt::format("{} steps {}", name, n)), 1e-3) << name << " steps " << n;
  }
  const Draws wrong = run_draws(m, eagle(1), kDraws, 1000000, sp, prompt, true);
  EXPECT_LT(min_p_value(plain, wrong, name + " wrong residual"), 1e-6) << name;
}

TEST(EngineSpecSampling, TemperatureOneMatchesNonSpeculative) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.logit_bias = kBias;
  sp.max_new_tokens = 3;
  sp.ignore_eos = true;
  check_distribution(m, sp, "T=1", {1, 3});
}

TEST(EngineSpecSampling, TopKTopPMatchesNonSpeculative) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 24;
  sp.top_p = 0.9f;
  sp.min_p = 0.05f;
  sp.logit_bias = kBias;
  sp.max_new_tokens = 3;
  sp.ignore_eos = true;
  check_distribution(m, sp, "top_k/p/min_p", {3});
}

// Greedy requests with penalties, logit_bias and logprobs speculate: the tokens and the target's logprobs
// equal the engine's without speculation, with the MTP's drafts and with an oracle drafter that knows the
// answer except at planted mistakes (so drafts are accepted and the penalties count the accepted ones).
TEST(EngineSpecSampling, GreedyPenaltiesAndLogprobsEqualNonSpeculative) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  const std::vector<int32_t> prompt{3, 17, 42, 99, 7, 250, 3, 17};
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.frequency_penalty = 0.7f;
  sp.presence_penalty = 0.3f;
  sp.repetition_penalty = 1.3f;
  sp.logit_bias = {{10, 1.5f}};
  sp.logprobs = true;
  sp.top_logprobs = 2;
  sp.max_new_tokens = 24;
  sp.ignore_eos = true;
  const Draws plain = run_draws(m, {}, 4, 1, sp, prompt);
  const std::vector<int32_t>& want = plain.tokens[0];
  ASSERT_EQ(want.size(), 24u);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(plain.tokens[i], want);  // greedy: seeds do not matter
  for (bool oracle : {false, true}) {
    EngineConfig ec;
    ec.kv_pages = 256;
    ec.page_size = 4;
    ec.check_integrity = true;
    ec.speculative = eagle(3);
    if (oracle) {
      ec.spec_draft_hook = [&](uint64_t, int64_t index, int32_t proposed) -> int32_t {
        const int64_t o = index - int64_t(prompt.size());
        if (o < 0 || o >= int64_t(want.size())) return proposed;
        return index % 7 == 3 ? int32_t((want[size_t(o)] + 1) % 512) : want[size_t(o)];
      };
    }
    Engine engine(m, ec);
    GenerateRequest g;
    g.prompt = prompt;
    g.params = sp;
    engine.submit(std::move(g));
    std::vector<int32_t> got;
    std::vector<float> lps;
    std::vector<StepOutput> outs;
    while (engine.step()) {
      engine.wait_outputs(outs, std::chrono::milliseconds(0));
      for (const StepOutput& o : outs) {
        EXPECT_NE(o.finish, FinishReason::error) << o.error;
        if (o.token < 0) continue;
        got.push_back(o.token);
        lps.push_back(o.logprob);
        EXPECT_EQ(o.top_logprobs.size(), 2u);
      }
      outs.clear();
    }
    EXPECT_EQ(got, want) << (oracle ? "oracle" : "mtp");
    ASSERT_EQ(lps.size(), plain.logprobs[0].size());
    for (size_t i = 0; i < lps.size(); ++i) EXPECT_NEAR(lps[i], plain.logprobs[0][i], 1e-5) << i;
    const EngineStats st = engine.stats();
    EXPECT_GT(st.spec_rounds, 0);
    if (oracle) {
      EXPECT_GT(st.spec_accepted_tokens, st.spec_rounds);
    }
  }
}

}  // namespace
}  // namespace dsaserve::runtime
