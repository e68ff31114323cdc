// AttentionForm::automatic's rule (issue 8): the FLOP counts of the two forms, the default (MHA from
// mha_min_tokens new tokens, as before), the cost-model choice once rates are set, the head classes, bad
// input, and that the forward follows the rule (its logits are exactly those of the forced form).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/model.h"

namespace dsaserve::model {
namespace {

AttentionShape glm(int64_t tokens, int64_t context, int64_t heads, int64_t topk = 2048) {
  AttentionShape s;
  s.tokens = tokens;
  s.context = context;
  s.heads = heads;
  s.topk = topk;
  return s;
}

// The keys every row attends, by a loop (row t sees context + t + 1 positions).
double keys_by_loop(const AttentionShape& s) {
  double k = 0;
  for (int64_t t = 0; t < s.tokens; ++t) {
    const int64_t visible = s.context + t + 1;
    k += double(s.topk > 0 ? std::min(s.topk, visible) : visible);
  }
  return k;
}

TEST(AttentionForm, FlopsCountEveryPart) {
  // 3 rows after 1 cached position, top-2: 2 + 2 + 2 keys; dense: 2 + 3 + 4.
  AttentionShape s = glm(3, 1, 4, 2);
  AttentionFormFlops f = attention_form_flops(s);
  EXPECT_DOUBLE_EQ(f.absorbed_attn, 6.0 * 4 * 2 * (512 + 64 + 512));
  EXPECT_DOUBLE_EQ(f.mha_attn, 6.0 * 4 * 2 * (192 + 64 + 256));
  EXPECT_DOUBLE_EQ(f.absorb_gemm, 3.0 * 4 * 2 * 512 * (192 + 256));
  EXPECT_DOUBLE_EQ(f.expand_gemm, 4.0 * 4 * 2 * 512 * (192 + 256));  // context + tokens positions
  EXPECT_DOUBLE_EQ(f.absorbed(), f.absorbed_attn + f.absorb_gemm);
  EXPECT_DOUBLE_EQ(f.mha(), f.mha_attn + f.expand_gemm);
  s.topk = 0;
  EXPECT_DOUBLE_EQ(attention_form_flops(s).mha_attn, 9.0 * 4 * 2 * (192 + 64 + 256));
  // The closed form of the key count against the loop, across the topk boundary.
  for (int64_t topk : {0, 1, 7, 64, 2048})
    for (int64_t ctx : {0, 5, 63, 64, 100, 4000})
      for (int64_t T : {1, 2, 50, 300}) {
        const AttentionShape g = glm(T, ctx, 1, topk);
        EXPECT_DOUBLE_EQ(attention_form_flops(g).mha_attn / (2.0 * (192 + 64 + 256)), keys_by_loop(g))
            << "topk " << topk << " ctx " << ctx << " T " << T;
      }
}

// The default rates (the H200's, model.h), both head classes: requests with a DSA selection take the
// absorbed form; dense chunks (context + tokens <= top-k) the MHA form from about 300 new tokens (the
// tensor-core MHA kernel), the absorbed form at 256.
TEST(AttentionForm, DefaultRatesTakeTheAbsorbedFormWithASelection) {
  const AttentionFormRule rule;
  for (int64_t heads : {8, 16, 64, 128})
    for (int64_t ctx : {0, 8192, 32768})
      for (int64_t T : {256, 1024, 4096})
        if (ctx + T > 2048) {
          EXPECT_FALSE(automatic_uses_mha(256, rule, glm(T, ctx, heads))) << heads << " " << T;
        }
}
TEST(AttentionForm, DefaultRatesTakeTheMhaFormForDenseChunks) {
  const AttentionFormRule rule;
  for (int64_t heads : {8, 16, 64, 128}) {
    EXPECT_FALSE(automatic_uses_mha(256, rule, glm(256, 0, heads))) << heads;
    for (int64_t T : {512, 1024, 2048})
      EXPECT_TRUE(automatic_uses_mha(256, rule, glm(T, 0, heads))) << heads << " " << T;
    EXPECT_TRUE(automatic_uses_mha(256, rule, glm(1024, 512, heads))) << heads;    // 1,536 keys: still dense
    EXPECT_FALSE(automatic_uses_mha(256, rule, glm(1024, 1025, heads))) << heads;  // a selection
  }
  // Without an indexer (topk 0) every chunk is dense.
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(1024, 0, 64, 0)));
}

// The model's part of the shape, as the engine, the plan's step and the memory plan take it.
TEST(AttentionForm, DimsComeFromTheConfig) {
  DSA_FIXTURE_PATH(p, "configs/glm-5.3.json");
  ModelConfig c = ModelConfig::from_file(p);
  AttentionShape s = attention_dims(c, 8);
  EXPECT_EQ(s.heads, 8);
  EXPECT_EQ(s.topk, 2048);
  EXPECT_EQ(s.latent, 512);
  EXPECT_EQ(s.rope, 64);
  EXPECT_EQ(s.nope, 192);
  EXPECT_EQ(s.dv, 256);
  EXPECT_EQ(s.tokens, 0);
  EXPECT_EQ(s.context, 0);
  c.index_n_heads = 0;  // no indexer: every key
  EXPECT_EQ(attention_dims(c, 8).topk, 0);
}

// The dense MHA rate per chunk size: log-linear between the points, scaled down below the first, the last
// rate above the last, one flat rate from a double; malformed points are errors.
TEST(AttentionForm, RateByTokensInterpolates) {
  const RateByTokens r{{256, 1024, 4096, 0}, {40, 120, 200, 0}};
  EXPECT_TRUE(r.set());
  EXPECT_EQ(r.problem(), "");
  EXPECT_DOUBLE_EQ(r.at(256), 40);
  EXPECT_DOUBLE_EQ(r.at(512), 80);  // halfway in log2 between 256 and 1024
  EXPECT_DOUBLE_EQ(r.at(1024), 120);
  EXPECT_DOUBLE_EQ(r.at(2048), 160);
  EXPECT_DOUBLE_EQ(r.at(4096), 200);
  EXPECT_DOUBLE_EQ(r.at(100000), 200);
  EXPECT_DOUBLE_EQ(r.at(128), 20);  // below the first point: scaled by tokens
  EXPECT_DOUBLE_EQ(r.at(0), 0);
  const RateByTokens flat = 50.0;
  EXPECT_DOUBLE_EQ(flat.at(1), 50);
  EXPECT_DOUBLE_EQ(flat.at(9999), 50);
  EXPECT_FALSE(RateByTokens{}.set());
  EXPECT_FALSE(RateByTokens{0.0}.set());
  EXPECT_DOUBLE_EQ(RateByTokens{}.at(100), 0);
  EXPECT_NE((RateByTokens{{1024, 256, 0, 0}, {1, 2, 0, 0}}.problem()), "");  // not ascending
  EXPECT_NE((RateByTokens{{256, 0, 1024, 0}, {1, 0, 2, 0}}.problem()), "");  // a gap
  EXPECT_NE((RateByTokens{{256, 0, 0, 0}, {-1, 0, 0, 0}}.problem()), "");    // negative
  EXPECT_NE((RateByTokens{{256, 0, 0, 0}, {1, 5, 0, 0}}.problem()), "");     // a rate without tokens
}

TEST(AttentionForm, UnmeasuredRuleIsMhaFromMinTokens) {
  AttentionFormRule rule;  // no rates measured
  rule.wide = rule.narrow = AttentionFormRates{};
  for (int64_t heads : {8, 16, 64})
    for (int64_t ctx : {0, 8192, 32768}) {
      EXPECT_FALSE(automatic_uses_mha(256, rule, glm(1, ctx, heads)));
      EXPECT_FALSE(automatic_uses_mha(256, rule, glm(255, ctx, heads)));
      EXPECT_TRUE(automatic_uses_mha(256, rule, glm(256, ctx, heads)));
      EXPECT_TRUE(automatic_uses_mha(256, rule, glm(4096, ctx, heads)));
    }
  EXPECT_TRUE(automatic_uses_mha(1, rule, glm(1, 0, 64)));
  EXPECT_FALSE(automatic_uses_mha(1 << 30, rule, glm(4096, 0, 64)));
  // Only some rates measured: still the old rule.
  AttentionFormRule part;
  part.wide = AttentionFormRates{};
  part.wide.absorbed_attn = 100;
  EXPECT_TRUE(automatic_uses_mha(256, part, glm(256, 32768, 64)));
}

TEST(AttentionForm, MeasuredRatesPickTheCheaperForm) {
  AttentionFormRule rule;
  rule.wide = {100, 100, 100, 100};  // equal rates: the FLOP counts decide
  rule.narrow = AttentionFormRates{};
  // Sparse top-2048: MHA is cheaper while (context + T) * 458752 < T * (458752 + 2048 * 1152), i.e.
  // context < 5.14 T.
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(4096, 8192, 64)));
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(1024, 5000, 64)));
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(1024, 5400, 64)));
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(256, 32768, 64)));
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(200, 0, 64)));  // below mha_min_tokens
  // The estimated seconds follow the rates.
  const AttentionShape s = glm(1024, 8192, 64);
  const AttentionFormFlops f = attention_form_flops(s);
  const AttentionFormSeconds t = attention_form_seconds(s, rule.wide);
  EXPECT_DOUBLE_EQ(t.absorbed, f.absorbed() / 100e12);
  EXPECT_DOUBLE_EQ(t.mha, f.mha() / 100e12);
  // A slow MHA kernel (the stand-in) moves the choice to the absorbed form.
  rule.wide.mha_attn = 5;
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(4096, 0, 64)));
  // Dense requests (context + tokens <= topk, or no indexer) read the *_dense rates when set.
  rule.wide.mha_attn_dense = 100;
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(1024, 0, 64)));     // 1024 keys <= 2048: dense
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(1024, 0, 64, 0)));  // no indexer: dense
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(4096, 0, 64)));    // a selection: the sparse rate
  rule.wide.absorbed_attn_dense = 1000;
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(1024, 0, 64)));
  rule.wide.absorbed_attn_dense = 0;
  rule.wide.mha_attn_dense = RateByTokens{};
  // Heads <= narrow_max_heads read `narrow` (unmeasured here: the old rule).
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(4096, 0, 16)));
  EXPECT_FALSE(automatic_uses_mha(256, rule, glm(4096, 0, 17)));
  rule.narrow_max_heads = 32;
  EXPECT_TRUE(automatic_uses_mha(256, rule, glm(4096, 0, 17)));
}

TEST(AttentionForm, BadInputIsAnError) {
  const AttentionFormRule rule;
  EXPECT_THROW(automatic_uses_mha(256, rule, glm(-1, 0, 64)), Error);
  EXPECT_THROW(automatic_uses_mha(256, rule, glm(10, -5, 64)), Error);
  EXPECT_THROW(automatic_uses_mha(256, rule, glm(10, 0, 0)), Error);
  EXPECT_THROW(automatic_uses_mha(256, rule, glm(10, 0, 64, -1)), Error);
  AttentionFormRule neg;
  neg.wide.mha_attn = -1;
  EXPECT_THROW(automatic_uses_mha(256, neg, glm(10, 0, 64)), Error);
  neg.wide.mha_attn = 0;
  neg.wide.mha_attn_dense = -1;
  EXPECT_THROW(automatic_uses_mha(256, neg, glm(10, 0, 64)), Error);
  neg.wide.mha_attn_dense = RateByTokens{{512, 256, 0, 0}, {1, 2, 0, 0}};
  EXPECT_THROW(automatic_uses_mha(256, neg, glm(10, 0, 64)), Error);
  EXPECT_THROW(attention_form_seconds(glm(10, 0, 64), AttentionFormRates{}), Error);
}

// The forward takes the form the rule picks, per request: with automatic it gives exactly the logits of
// the forced form.
TEST(AttentionForm, ForwardFollowsTheRule) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = Model::load(dir, false);
  const std::vector<int32_t> a{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22},
      bq{30, 31, 32, 33};
  const std::vector<int32_t> pa{0, 1}, pb{2};
  auto run = [&](const ForwardOptions& o) {
    KvCache cache = m->make_cache(3, 16);
    ForwardBatch b;
    b.page_size = 16;
    b.add_request(a, 0, pa);
    b.add_request(bq, 0, pb);
    return m->forward(b, cache, o).logits.to_f32_vector();
  };
  ForwardOptions mha, absorbed, autom;
  mha.attention = AttentionForm::mha;
  absorbed.attention = AttentionForm::absorbed;
  const std::vector<float> want_mha = run(mha), want_abs = run(absorbed);
  autom.mha_min_tokens = 1;
  autom.form_rule.narrow = {100, 100, 0.001, 100};  // MHA attention very slow: absorbed
  EXPECT_EQ(run(autom), want_abs);
  autom.form_rule.narrow = {0.001, 100, 100, 100};  // absorbed attention very slow: MHA
  EXPECT_EQ(run(autom), want_mha);
  autom.form_rule.narrow = {};  // the old rule: both requests have >= 1 token
  EXPECT_EQ(run(autom), want_mha);
  autom.mha_min_tokens = 1000;
  EXPECT_EQ(run(autom), want_abs);
  // The two forms do differ in their last bits on this model, so the checks above can tell them apart.
  size_t differ = 0;
  for (size_t i = 0; i < want_mha.size(); ++i) differ += want_mha[i] != want_abs[i];
  EXPECT_GT(differ, 0u);
}

}  // namespace
}  // namespace dsaserve::model
