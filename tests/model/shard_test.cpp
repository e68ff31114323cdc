// One rank's shard of the weights (model/shard.h): the right slices of the whole, views where the split is
// by rows, the embedding's zero row, experts by EP rank, FP8 scales with their blocks, and the size errors.
#include "model/shard.h"

#include <gtest/gtest.h>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/dummy_weights.h"
#include "model/model.h"

namespace dsaserve::model {
namespace {

ModelConfig tiny_config() {
  return ModelConfig::from_file(testing::repo_dir() / "configs/dsaserve-tiny.json");
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_f32_vector() == b.to_f32_vector();
}

TEST(Shard, TensorParallelSlicesOfTheWhole) {
  const ModelConfig c = tiny_config();  // 4 heads, vocab 512, 16 experts
  const ModelWeights w = make_dummy_weights(c, Device::cpu, 7, true);
  for (int64_t r = 0; r < 2; ++r) {
    const Shard s{{2, 1, 1}, r};
    const ModelWeights x = shard_weights(w, c, s);
    const AttentionWeights &a = w.layers[1].attn, &b = x.layers[1].attn;
    const int64_t dq = c.qk_head_dim(), kv = c.qk_nope_head_dim + c.v_head_dim, dv = c.v_head_dim;
    EXPECT_EQ(b.q_b_proj.weight.raw_data(),
              a.q_b_proj.weight.slice(0, r * 2 * dq, (r + 1) * 2 * dq).raw_data());
    EXPECT_TRUE(same(b.kv_b_proj.weight, a.kv_b_proj.weight.slice(0, r * 2 * kv, (r + 1) * 2 * kv)));
    EXPECT_TRUE(same(b.o_proj.weight, a.o_proj.weight.slice(1, r * 2 * dv, (r + 1) * 2 * dv)));
    EXPECT_TRUE(b.o_proj.weight.is_contiguous());
    EXPECT_EQ(b.q_a_proj.weight.raw_data(), a.q_a_proj.weight.raw_data());  // replicated
    ASSERT_TRUE(x.layers[2].attn.indexer.has_value());                      // layer 2: a full indexer layer
    EXPECT_EQ(x.layers[2].attn.indexer->wq_b.weight.raw_data(),
              w.layers[2].attn.indexer->wq_b.weight.raw_data());
    // Embedding: rows [256 r, 256 r + 256) and a zero row.
    ASSERT_EQ(x.embed_tokens.shape(), (Shape{257, c.hidden_size}));
    EXPECT_TRUE(same(x.embed_tokens.slice(0, 0, 256), w.embed_tokens.slice(0, r * 256, (r + 1) * 256)));
    for (float v : x.embed_tokens.slice(0, 256, 257).to_f32_vector()) EXPECT_EQ(v, 0.f);
    EXPECT_TRUE(same(x.lm_head.weight, w.lm_head.weight.slice(0, r * 256, (r + 1) * 256)));
    // Dense MLP and every expert split by their intermediate size; all experts kept (EP 1).
    const int64_t I = c.intermediate_size / 2, Im = c.moe_intermediate_size / 2;
    EXPECT_TRUE(
        same(x.layers[0].mlp->gate.weight, w.layers[0].mlp->gate.weight.slice(0, r * I, (r + 1) * I)));
    EXPECT_TRUE(
        same(x.layers[0].mlp->down.weight, w.layers[0].mlp->down.weight.slice(1, r * I, (r + 1) * I)));
    ASSERT_EQ(x.layers[1].moe->experts.size(), 16u);
    EXPECT_TRUE(same(x.layers[1].moe->experts[5].up.weight,
                     w.layers[1].moe->experts[5].up.weight.slice(0, r * Im, (r + 1) * Im)));
    EXPECT_TRUE(same(x.layers[1].moe->shared_experts->down.weight,
                     w.layers[1].moe->shared_experts->down.weight.slice(1, r * Im, (r + 1) * Im)));
    ASSERT_EQ(x.mtp.size(), 1u);  // the MTP layer is sharded like the others
    EXPECT_EQ(x.mtp[0].layer.attn.q_b_proj.out_features(), 2 * dq);
  }
}

TEST(Shard, ExpertParallelKeepsThisRanksExpertsWhole) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = make_dummy_weights(c, Device::cpu, 7, false);
  const Shard s{{2, 2, 1}, 1};  // MoE TP 1: experts 8..15 whole
  EXPECT_EQ(s.expert_begin(c), 8);
  const ModelWeights x = shard_weights(w, c, s);
  ASSERT_EQ(x.layers[2].moe->experts.size(), 8u);
  EXPECT_EQ(x.layers[2].moe->experts[0].gate.weight.raw_data(),
            w.layers[2].moe->experts[8].gate.weight.raw_data());
  EXPECT_EQ(x.layers[2].moe->shared_experts->gate.weight.raw_data(),
            w.layers[2].moe->shared_experts->gate.weight.raw_data());
  EXPECT_EQ(x.layers[2].attn.q_b_proj.out_features(), 2 * c.qk_head_dim());  // attention still TP 2
}

TEST(Shard, Fp8ScalesSplitWithTheirBlocks) {
  DSA_FIXTURE_PATH(dir, "models/realdims_fp8");
  const auto m = Model::load(dir, false);
  const ModelConfig& c = m->config();
  const Shard s{{2, 2, 1}, 1};
  const ModelWeights x = shard_weights(m->weights(), c, s);
  const Linear &a = m->weights().layers[0].attn.kv_b_proj, &b = x.layers[0].attn.kv_b_proj;
  ASSERT_TRUE(b.is_fp8());
  const int64_t half = a.out_features() / 2;
  EXPECT_EQ(b.out_features(), half);
  EXPECT_EQ(b.scale_inv.size(0), half / c.fp8.block_n);
  EXPECT_TRUE(same(b.scale_inv, a.scale_inv.slice(0, half / c.fp8.block_n, 2 * half / c.fp8.block_n)));
  const Linear &o = m->weights().layers[0].attn.o_proj, &p = x.layers[0].attn.o_proj;
  EXPECT_EQ(p.scale_inv.size(1), o.scale_inv.size(1) / 2);
  EXPECT_TRUE(same(p.scale_inv, o.scale_inv.slice(1, o.scale_inv.size(1) / 2, o.scale_inv.size(1))));
  // MoE TP 2 would cut the 128-wide experts inside an FP8 block.
  try {
    Shard{{2, 1, 1}, 0}.validate(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("moe_intermediate_size 128 does not split 2 ways into multiples of the "
                                   "FP8 block 128"),
        std::string::npos)
        << e.what();
  }
}

TEST(Shard, SizesThatDoNotSplitAreErrors) {
  const ModelConfig c = tiny_config();
  EXPECT_THROW(Shard({{8, 1, 1}, 0}).validate(c), Error);  // 4 heads
  EXPECT_THROW(Shard({{2, 1, 1}, 2}).validate(c), Error);  // rank outside
  ModelConfig odd = c;
  odd.vocab_size = 511;
  EXPECT_THROW(Shard({{2, 1, 1}, 0}).validate(odd), Error);
  EXPECT_NO_THROW(Shard({{4, 4, 1}, 3}).validate(c));
}

// The rows of a step over the ranks (the scattered mode): tensor_split within each DP group's attention TP
// ranks, every DP group's tokens in world order, the padded block of a decode.
TEST(RowSplit, SlicesOfEachDpGroupsTokens) {
  // --tp 4 --attn-dp-size 2: DP group 0 = ranks 0, 1; group 1 = ranks 2, 3.
  const dist::ParallelLayout l{4, 1, 2};
  const RowSplit r1 = RowSplit::make(Shard{l, 1}, {5, 2}, false);
  EXPECT_EQ(r1.rank_rows, (std::vector<int64_t>{3, 2, 1, 1}));
  EXPECT_EQ(r1.attn_rows, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(r1.begin, 3);
  EXPECT_EQ(r1.end, 5);
  EXPECT_EQ(r1.block, 3);
  EXPECT_EQ(r1.world_rows(), 7);                                  // variable: the rows themselves
  const RowSplit r2 = RowSplit::make(Shard{l, 2}, {1, 0}, true);  // decode; group 1 idle
  EXPECT_EQ(r2.rank_rows, (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(r2.attn_rows, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(r2.rows(), 0);
  EXPECT_EQ(r2.world_rows(), 4);  // equal: every rank padded to the block of 1
  EXPECT_THROW(RowSplit::make(Shard{l, 0}, {1, 2, 3}, false), Error);  // not one count per DP group
}

}  // namespace
}  // namespace dsaserve::model
