// OutputProcessor: runs of 0..k+1 tokens per request per step (a speculative verify's accepted tokens;
// one per step today), cut where the request ends: EOS, stop token ids, max_new_tokens, the context
// limit, a grammar that terminates or rejects a token.
#include "runtime/scheduler/output_processor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dsaserve::runtime {
namespace {

constexpr int32_t kEos = 1;

// A request that has committed a step: prompt, then the step's kFutureToken slot.
Request make_request(std::vector<int32_t> prompt, int64_t max_new) {
  Request r;
  r.id = 7;
  r.tokens = std::move(prompt);
  r.prompt_len = int64_t(r.tokens.size());
  r.params.max_new_tokens = max_new;
  r.sampler = SamplerState(1, r.tokens);
  r.tokens.push_back(kFutureToken);
  return r;
}

std::vector<SampleResult> run_of(std::vector<int32_t> tokens) {
  std::vector<SampleResult> run;
  for (int32_t t : tokens) run.push_back({t, -0.5f * float(t), {{t, -0.5f * float(t)}}});
  return run;
}

std::vector<int32_t> output_tokens(const std::vector<StepOutput>& out) {
  std::vector<int32_t> v;
  for (const StepOutput& o : out) v.push_back(o.token);
  return v;
}

// A grammar over token ids: exactly `seq`, then terminated.
class SequenceConstraint final : public TokenConstraint {
 public:
  explicit SequenceConstraint(std::vector<int32_t> seq) : seq_(std::move(seq)) {}
  void mask_logits(std::span<float>) override {}
  void fill_mask(TokenMask& m) override {
    m.vocab = 1 << 16;
    m.words.assign(size_t(m.vocab / 32), 0xFFFFFFFFu);
  }
  bool accept(int32_t token) override {
    if (pos_ >= seq_.size() || seq_[pos_] != token) return false;
    ++pos_;
    return true;
  }
  void rollback(int64_t n) override { pos_ -= size_t(n); }
  bool terminated() const override { return pos_ == seq_.size(); }

 private:
  std::vector<int32_t> seq_;
  size_t pos_ = 0;
};

TEST(OutputProcessor, OneTokenFillsTheFutureSlot) {
  const OutputProcessor op({kEos}, 0);
  Request r = make_request({3, 4, 5}, 8);
  std::vector<StepOutput> out;
  auto run = run_of({9});
  const auto res = op.process(r, run, out);
  EXPECT_EQ(res.kept, 1);
  EXPECT_EQ(res.finish, FinishReason::none);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 4, 5, 9}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, 7u);
  EXPECT_EQ(out[0].token, 9);
  EXPECT_FLOAT_EQ(out[0].logprob, -4.5f);
  ASSERT_EQ(out[0].top_logprobs.size(), 1u);
  EXPECT_EQ(out[0].prompt_tokens, 3);
  EXPECT_EQ(out[0].completion_tokens, 1);
  EXPECT_EQ(r.sampler.output_counts().at(9), 1);
}

TEST(OutputProcessor, AWholeRunIsKeptInOrder) {
  const OutputProcessor op({kEos}, 0);
  Request r = make_request({3, 4}, 16);
  std::vector<StepOutput> out;
  auto run = run_of({9, 8, 9, 6});
  const auto res = op.process(r, run, out);
  EXPECT_EQ(res.kept, 4);
  EXPECT_EQ(res.finish, FinishReason::none);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 4, 9, 8, 9, 6}));
  EXPECT_EQ(output_tokens(out), (std::vector<int32_t>{9, 8, 9, 6}));
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].completion_tokens, int64_t(i) + 1);
    EXPECT_EQ(out[i].finish, FinishReason::none);
  }
  EXPECT_EQ(r.sampler.output_counts().at(9), 2);  // every kept token is recorded (penalties)
}

TEST(OutputProcessor, EmptyRunChangesNothing) {
  const OutputProcessor op({kEos}, 0);
  Request r = make_request({3}, 4);
  std::vector<StepOutput> out;
  std::vector<SampleResult> none;
  const auto res = op.process(r, none, out);
  EXPECT_EQ(res.kept, 0);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(r.tokens.back(), kFutureToken);
}

TEST(OutputProcessor, EosInsideTheRunCutsItThereUnlessIgnored) {
  const OutputProcessor op({kEos, 2}, 0);
  {
    Request r = make_request({3, 4}, 16);
    std::vector<StepOutput> out;
    auto run = run_of({9, kEos, 8, 6});
    const auto res = op.process(r, run, out);
    EXPECT_EQ(res.kept, 2);
    EXPECT_EQ(res.finish, FinishReason::stop);
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 4, 9, kEos}));
    EXPECT_EQ(output_tokens(out), (std::vector<int32_t>{9, kEos}));
    EXPECT_EQ(out[0].finish, FinishReason::none);
    EXPECT_EQ(out[1].finish, FinishReason::stop);
    EXPECT_EQ(r.sampler.output_counts().count(8), 0u);  // dropped tokens are not recorded
  }
  {
    Request r = make_request({3, 4}, 16);
    r.params.ignore_eos = true;
    std::vector<StepOutput> out;
    auto run = run_of({9, kEos, 2, 6});
    EXPECT_EQ(op.process(r, run, out).kept, 4);
  }
}

TEST(OutputProcessor, StopTokenIdsEndTheRunEvenWithIgnoreEos) {
  const OutputProcessor op({kEos}, 0);
  Request r = make_request({3}, 16);
  r.params.ignore_eos = true;
  r.params.stop_token_ids = {6};
  std::vector<StepOutput> out;
  auto run = run_of({9, 6, 8});
  const auto res = op.process(r, run, out);
  EXPECT_EQ(res.kept, 2);
  EXPECT_EQ(res.finish, FinishReason::stop);
  EXPECT_EQ(output_tokens(out), (std::vector<int32_t>{9, 6}));
}

TEST(OutputProcessor, MaxNewTokensAndTheContextCutTheRun) {
  {
    const OutputProcessor op({kEos}, 0);
    Request r = make_request({3, 4}, 5);
    r.tokens = {3, 4, 9, 9, 9, kFutureToken};  // 3 generated, the 4th is this step's
    std::vector<StepOutput> out;
    auto run = run_of({5, 6, 7});
    const auto res = op.process(r, run, out);
    EXPECT_EQ(res.kept, 2);
    EXPECT_EQ(res.finish, FinishReason::length);
    EXPECT_EQ(out.back().completion_tokens, 5);
    EXPECT_EQ(r.tokens.size(), 7u);
  }
  {
    const OutputProcessor op({kEos}, 6);  // at most 6 tokens per request
    Request r = make_request({3, 4, 5}, 100);
    std::vector<StepOutput> out;
    auto run = run_of({9, 8, 7, 6, 5});
    const auto res = op.process(r, run, out);
    EXPECT_EQ(res.kept, 3);
    EXPECT_EQ(res.finish, FinishReason::length);
    EXPECT_EQ(r.tokens.size(), 6u);
  }
}

TEST(OutputProcessor, GrammarAdvancesOverTheRunAndEndsIt) {
  const OutputProcessor op({kEos}, 0);
  {
    // The grammar completes at its third token: the run stops there (terminated).
    Request r = make_request({3}, 16);
    r.params.constraint = std::make_shared<SequenceConstraint>(std::vector<int32_t>{5, 6, 7});
    std::vector<StepOutput> out;
    auto run = run_of({5, 6, 7, 8});
    const auto res = op.process(r, run, out);
    EXPECT_EQ(res.kept, 3);
    EXPECT_EQ(res.finish, FinishReason::stop);
    EXPECT_EQ(output_tokens(out), (std::vector<int32_t>{5, 6, 7}));
  }
  {
    // A token the grammar rejects fails the request there; the tokens before it were reported.
    Request r = make_request({3}, 16);
    r.params.constraint = std::make_shared<SequenceConstraint>(std::vector<int32_t>{5, 6, 7});
    std::vector<StepOutput> out;
    auto run = run_of({5, 9, 7});
    const auto res = op.process(r, run, out);
    EXPECT_EQ(res.kept, 1);
    EXPECT_EQ(res.finish, FinishReason::error);
    EXPECT_NE(res.error.find("rejected token 9"), std::string::npos) << res.error;
    EXPECT_EQ(output_tokens(out), (std::vector<int32_t>{5}));
    EXPECT_EQ(r.tokens, (std::vector<int32_t>{3, 5}));
  }
}

TEST(OutputProcessor, ARunNeedsTheStepsFutureSlot) {
  const OutputProcessor op({kEos}, 0);
  Request r = make_request({3}, 16);
  r.tokens.back() = 4;  // already filled
  std::vector<StepOutput> out;
  auto run = run_of({5});
  EXPECT_THROW(op.process(r, run, out), Error);
}

}  // namespace
}  // namespace dsaserve::runtime
