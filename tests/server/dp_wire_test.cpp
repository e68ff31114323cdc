// What the DP controller's rounds carry between the DP leaders (runtime/ranks/dp.h): routed requests
// with every sampling field, outputs with their logprobs and errors, engine stats and the engine settings
// survive their bytes exactly; a cut or padded payload, or a constrained request, is an error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/ranks/dp.h"
#include "runtime/sampler/constraint.h"

namespace dsaserve::runtime {
namespace {

GenerateRequest full_request() {
  GenerateRequest g;
  g.id = 77;
  g.prompt = {5, 6, 7, 8};
  SamplingParams& p = g.params;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.top_k = 40;
  p.min_p = 0.05f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.repetition_penalty = 1.1f;
  p.logit_bias = {{3, -100.0f}, {9, 2.5f}};
  p.seed = 1234;
  p.logprobs = true;
  p.top_logprobs = 3;
  p.prompt_logprobs = 2;
  p.max_new_tokens = 33;
  p.stop_token_ids = {1, 2};
  p.ignore_eos = true;
  p.priority = -4;
  return g;
}

TEST(DpWire, RoutedRequestsAndAbortsSurviveTheirBytes) {
  std::vector<DpRouted> in = {{1, full_request()}, {2, GenerateRequest{}}};
  in[1].req.id = 9;
  in[1].req.prompt = {1};
  const std::vector<std::pair<int64_t, uint64_t>> aborts = {{1, 70}, {3, 71}};
  const std::vector<uint8_t> b = encode_routed(in, aborts);
  std::vector<DpRouted> out;
  std::vector<std::pair<int64_t, uint64_t>> got_aborts;
  decode_routed(b.data(), b.size(), out, got_aborts);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(got_aborts, aborts);
  const SamplingParams &p = out[0].req.params, &q = in[0].req.params;
  EXPECT_EQ(out[0].group, 1);
  EXPECT_EQ(out[0].req.id, 77u);
  EXPECT_EQ(out[0].req.prompt, in[0].req.prompt);
  EXPECT_EQ(p.temperature, q.temperature);
  EXPECT_EQ(p.top_p, q.top_p);
  EXPECT_EQ(p.top_k, q.top_k);
  EXPECT_EQ(p.min_p, q.min_p);
  EXPECT_EQ(p.presence_penalty, q.presence_penalty);
  EXPECT_EQ(p.frequency_penalty, q.frequency_penalty);
  EXPECT_EQ(p.repetition_penalty, q.repetition_penalty);
  EXPECT_EQ(p.logit_bias, q.logit_bias);
  EXPECT_EQ(p.seed, q.seed);
  EXPECT_EQ(p.logprobs, q.logprobs);
  EXPECT_EQ(p.top_logprobs, q.top_logprobs);
  EXPECT_EQ(p.prompt_logprobs, q.prompt_logprobs);
  EXPECT_EQ(p.max_new_tokens, q.max_new_tokens);
  EXPECT_EQ(p.stop_token_ids, q.stop_token_ids);
  EXPECT_EQ(p.ignore_eos, q.ignore_eos);
  EXPECT_EQ(p.priority, q.priority);
  EXPECT_FALSE(out[1].req.params.seed.has_value());
  EXPECT_EQ(out[1].group, 2);
  // Cut or padded: an error, not requests.
  std::vector<uint8_t> cut(b.begin(), b.end() - 3), padded = b;
  padded.push_back(0);
  out.clear();
  EXPECT_THROW(decode_routed(cut.data(), cut.size(), out, got_aborts), Error);
  EXPECT_THROW(decode_routed(padded.data(), padded.size(), out, got_aborts), Error);
}

TEST(DpWire, AConstrainedRequestDoesNotTravel) {
  class Always final : public TokenConstraint {
   public:
    void mask_logits(std::span<float>) override {}
    void fill_mask(TokenMask&) override {}
    bool accept(int32_t) override { return true; }
    void rollback(int64_t) override {}
    bool terminated() const override { return false; }
  };
  std::vector<DpRouted> in = {{1, full_request()}};
  in[0].req.params.constraint = std::make_shared<Always>();
  EXPECT_THROW((void)encode_routed(in, {}), Error);
}

TEST(DpWire, OutputsAndStatsSurviveTheirBytes) {
  std::vector<StepOutput> in(3);
  in[0].id = 5;
  in[0].token = 42;
  in[0].logprob = -0.5f;
  in[0].top_logprobs = {{42, -0.5f}, {7, -1.5f}};
  in[0].prompt_logprobs = {{1, -2.0f, {{1, -2.0f}, {3, -2.5f}}}, {2, -3.0f, {}}};
  in[0].prompt_logprobs_from = 1;
  in[0].prompt_tokens = 9;
  in[0].cached_tokens = 4;
  in[0].completion_tokens = 1;
  in[1].id = 6;
  in[1].finish = FinishReason::error;
  in[1].error = "prompt token id 900 is outside the vocabulary";
  in[2].id = 7;
  in[2].token = 3;
  in[2].finish = FinishReason::length;
  in[2].spec_verify_ct = 2;
  in[2].spec_accepted_drafts = 1;
  EngineStats st;
  st.num_waiting = 1;
  st.num_running = 2;
  st.kv_pages_total = 128;
  st.kv_pages_free = 100;
  st.prefix_cache_pages = 3;
  st.steps = 17;
  st.generated_tokens = 40;
  st.busy_seconds = 1.5;
  st.spec_accept_length_hist = {0, 4, 2};
  const std::vector<uint8_t> b = encode_outputs(in, st);
  std::vector<StepOutput> out;
  EngineStats back;
  decode_outputs(b.data(), b.size(), out, back);
  ASSERT_EQ(out.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].id, in[i].id);
    EXPECT_EQ(out[i].token, in[i].token);
    EXPECT_EQ(out[i].logprob, in[i].logprob);
    ASSERT_EQ(out[i].top_logprobs.size(), in[i].top_logprobs.size());
    for (size_t k = 0; k < in[i].top_logprobs.size(); ++k) {
      EXPECT_EQ(out[i].top_logprobs[k].token, in[i].top_logprobs[k].token);
      EXPECT_EQ(out[i].top_logprobs[k].logprob, in[i].top_logprobs[k].logprob);
    }
    ASSERT_EQ(out[i].prompt_logprobs.size(), in[i].prompt_logprobs.size());
    for (size_t k = 0; k < in[i].prompt_logprobs.size(); ++k) {
      EXPECT_EQ(out[i].prompt_logprobs[k].token, in[i].prompt_logprobs[k].token);
      EXPECT_EQ(out[i].prompt_logprobs[k].top.size(), in[i].prompt_logprobs[k].top.size());
    }
    EXPECT_EQ(out[i].prompt_logprobs_from, in[i].prompt_logprobs_from);
    EXPECT_EQ(out[i].finish, in[i].finish);
    EXPECT_EQ(out[i].error, in[i].error);
    EXPECT_EQ(out[i].prompt_tokens, in[i].prompt_tokens);
    EXPECT_EQ(out[i].cached_tokens, in[i].cached_tokens);
    EXPECT_EQ(out[i].completion_tokens, in[i].completion_tokens);
    EXPECT_EQ(out[i].spec_verify_ct, in[i].spec_verify_ct);
    EXPECT_EQ(out[i].spec_accepted_drafts, in[i].spec_accepted_drafts);
  }
  EXPECT_EQ(back.num_waiting, 1);
  EXPECT_EQ(back.num_running, 2);
  EXPECT_EQ(back.kv_pages_total, 128);
  EXPECT_EQ(back.kv_pages_free, 100);
  EXPECT_EQ(back.prefix_cache_pages, 3);
  EXPECT_EQ(back.steps, 17);
  EXPECT_EQ(back.generated_tokens, 40);
  EXPECT_EQ(back.busy_seconds, 1.5);
  EXPECT_EQ(back.spec_accept_length_hist, st.spec_accept_length_hist);
  std::vector<uint8_t> cut(b.begin(), b.end() - 1);
  out.clear();
  EXPECT_THROW(decode_outputs(cut.data(), cut.size(), out, back), Error);
}

TEST(DpWire, EngineSettingsSurviveTheirBytes) {
  EngineConfig c;
  c.scheduler.max_running_requests = 7;
  c.scheduler.max_prefill_tokens = 300;
  c.scheduler.chunked_prefill_size = 32;
  c.scheduler.max_context = 1000;
  c.scheduler.eos_token_ids = {2, 3};
  c.scheduler.enable_priority = true;
  c.scheduler.low_priority_values_first = true;
  c.enable_prefix_cache = false;
  c.check_integrity = true;
  c.overlap_schedule = false;
  c.kv_pages = 128;
  c.page_size = 16;
  c.kv_dtype = model::KvCacheDtype::f32;
  c.forward.dsa_topk_broadcast = true;
  c.forward.mha_min_tokens = 99;
  const EngineConfig d = decode_engine_config(encode_engine_config(c));
  EXPECT_EQ(d.scheduler.max_running_requests, 7);
  EXPECT_EQ(d.scheduler.max_prefill_tokens, 300);
  EXPECT_EQ(d.scheduler.chunked_prefill_size, 32);
  EXPECT_EQ(d.scheduler.max_context, 1000);
  EXPECT_EQ(d.scheduler.eos_token_ids, c.scheduler.eos_token_ids);
  EXPECT_TRUE(d.scheduler.enable_priority);
  EXPECT_TRUE(d.scheduler.low_priority_values_first);
  EXPECT_FALSE(d.enable_prefix_cache);
  EXPECT_TRUE(d.check_integrity);
  EXPECT_FALSE(d.overlap_schedule);
  EXPECT_EQ(d.kv_pages, 128);
  EXPECT_EQ(d.page_size, 16);
  EXPECT_EQ(d.kv_dtype, model::KvCacheDtype::f32);
  EXPECT_TRUE(d.forward.dsa_topk_broadcast);
  EXPECT_EQ(d.forward.mha_min_tokens, 99);
}

}  // namespace
}  // namespace dsaserve::runtime
