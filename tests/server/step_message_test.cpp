// The step messages rank 0 sends the other ranks (runtime/ranks/step_message.h): a ForwardBatch and the
// init survive the bytes exactly; a payload that is cut or has bytes left over is an error, not a batch.
#include "runtime/ranks/step_message.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/ranks/leader.h"

namespace dsaserve::runtime {
namespace {

model::ForwardBatch mixed_batch() {
  model::ForwardBatch b;
  b.page_size = 16;
  const std::vector<int32_t> pages_a = {3, 7, 9}, pages_b = {1}, pages_c = {4, 5};
  b.add_request(std::vector<int32_t>{11, 12, 13, 14, 15}, 30, pages_a, false);  // a prefill chunk
  b.add_request(std::vector<int32_t>{42}, 9, pages_b, true);                    // a decode
  b.add_request(std::vector<int32_t>{5, 6, 7}, 20, pages_c, true);              // a verify
  b.extra_logit_rows = {0, 2};
  return b;
}

void expect_same(const model::ForwardBatch& a, const model::ForwardBatch& b) {
  EXPECT_EQ(a.page_size, b.page_size);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.out_cache_loc, b.out_cache_loc);
  EXPECT_EQ(a.token_begin, b.token_begin);
  EXPECT_EQ(a.start_pos, b.start_pos);
  EXPECT_EQ(a.decoding, b.decoding);
  EXPECT_EQ(a.page_begin, b.page_begin);
  EXPECT_EQ(a.page_indices, b.page_indices);
  EXPECT_EQ(a.extra_logit_rows, b.extra_logit_rows);
}

TEST(StepMessage, ABatchSurvivesItsBytes) {
  const model::ForwardBatch b = mixed_batch();
  const model::ForwardBatch back = decode_batch(encode_batch(b));
  expect_same(back, b);
  back.validate(512, 16);
  expect_same(decode_batch(encode_batch(model::ForwardBatch{})), model::ForwardBatch{});
}

TEST(StepMessage, InitSurvivesItsBytes) {
  model::ForwardOptions o;
  o.attention = model::AttentionForm::absorbed;
  o.mha_min_tokens = 17;
  o.form_rule.narrow_max_heads = 3;
  o.form_rule.wide.mha_attn = 1.25;
  o.all_logits = false;
  o.dsa_topk_broadcast = true;
  o.moe_a2a_deepep = true;
  o.deepep_fp8_dispatch = false;
  const StepInit s = StepInit::of(77, 32, true, model::KvCacheDtype::bf16, o);
  const StepInit t = decode_init(encode_init(s));
  EXPECT_EQ(t.num_pages, 77);
  EXPECT_EQ(t.page_size, 32);
  EXPECT_TRUE(t.mtp_layers);
  EXPECT_EQ(t.kv_dtype, model::KvCacheDtype::bf16);
  const model::ForwardOptions f = t.forward(nullptr);
  EXPECT_EQ(f.attention, model::AttentionForm::absorbed);
  EXPECT_EQ(f.mha_min_tokens, 17);
  EXPECT_EQ(f.form_rule.narrow_max_heads, 3);
  EXPECT_EQ(f.form_rule.wide.mha_attn, 1.25);
  EXPECT_FALSE(f.all_logits);
  EXPECT_TRUE(f.dsa_topk_broadcast);
  EXPECT_TRUE(f.moe_a2a_deepep);  // the followers dispatch / combine as the leader does
  EXPECT_FALSE(f.deepep_fp8_dispatch);
  const model::ForwardOptions d =
      decode_init(encode_init(StepInit::of(1, 64, false, std::nullopt, {}))).forward(nullptr);
  EXPECT_FALSE(d.moe_a2a_deepep);
  EXPECT_TRUE(d.deepep_fp8_dispatch);
  EXPECT_FALSE(decode_init(encode_init(StepInit::of(1, 64, false, std::nullopt, {}))).kv_dtype.has_value());
}

TEST(StepMessage, ACutOrPaddedPayloadIsAnError) {
  std::vector<uint8_t> bytes = encode_batch(mixed_batch());
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 3);
  EXPECT_THROW(decode_batch(cut), Error);
  bytes.push_back(0);
  EXPECT_THROW(decode_batch(bytes), Error);
  std::vector<uint8_t> init = encode_init(StepInit::of(4, 16, false, std::nullopt, {}));
  init.resize(init.size() / 2);
  EXPECT_THROW(decode_init(init), Error);
}

TEST(StepMessage, BeatsComeWellInsideTheTimeout) {
  using std::chrono::milliseconds;
  EXPECT_EQ(beat_interval(milliseconds(60000)), milliseconds(1000));
  EXPECT_EQ(beat_interval(milliseconds(1000)), milliseconds(250));
  EXPECT_EQ(beat_interval(milliseconds(1)), milliseconds(10));
}

}  // namespace
}  // namespace dsaserve::runtime
