// The plan against the reference article's figures (glm-5.3, TP8 + EP8 + DP-attention 8), other layouts,
// DeepSeek-V3.2, a small config checked by hand, and flag validation.
#include "plan/plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/config.h"
#include "model/param_count.h"
#include "plan/step.h"
#include "plan/trace_summary.h"

namespace dsaserve::plan {
namespace {

using model::ModelConfig;

const Pass& pass_named(const StepPlan& s, const std::string& name) {
  for (const Pass& p : s.passes) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no pass " + name);
}

const LayerKindPlan& kind_named(const Pass& p, const std::string& name) {
  for (const LayerKindPlan& k : p.layer_kinds) {
    if (k.name == name) return k;
  }
  throw std::runtime_error("no layer kind " + name);
}

const Op& op_named(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& o : ops) {
    if (o.name == name) return o;
  }
  throw std::runtime_error("no op " + name);
}

const Collective* coll_named(const std::vector<Collective>& cs, const std::string& name) {
  for (const Collective& c : cs) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::vector<std::string> coll_names(const LayerKindPlan& k) {
  std::vector<std::string> v;
  for (const Collective& c : k.collectives) v.push_back(c.name);
  return v;
}

Deployment article_layout() {
  Deployment d;
  d.tp = 8;
  d.ep_size = 8;
  d.attn_dp_size = 8;
  d.moe_a2a_backend = A2aBackend::deepep;
  d.kv_cache_dtype = KvDtype::fp8_e4m3;
  d.batch = 32;
  d.context = 131072;
  return d;
}

class Glm53 : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto path = testing::fixtures_dir() / "configs/glm-5.3.json";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "fixture " << path << " missing";
    cfg = ModelConfig::from_file(path);
  }
  ModelConfig cfg;
};

TEST_F(Glm53, ArticleKvAndIndexerLayers) {
  const Plan p = build_plan(cfg, article_layout(), Hardware::named("h200"));
  EXPECT_EQ(p.memory.kv_values_per_token, 576 * 78);
  EXPECT_EQ(p.memory.kv_values_per_token, 44928);
  // The article's 1M-context KV: 44,928 B/token (one byte per value) x 1,048,576 = 47.1 GB.
  EXPECT_NEAR(double(p.memory.kv_values_per_token) * 1048576 / 1e9, 47.1, 0.05);
  // The plan stores FlashMLA's FP8 layout: 512 FP8 + 4 float scales + 64 bf16 rope = 656 B per layer.
  EXPECT_EQ(p.memory.kv_bytes_per_token_layer, 656);
  EXPECT_EQ(p.memory.kv_bytes_per_token, 656.0 * 78);
  // 21 full indexer layers, 128 B key + 4 B scale each.
  const Pass& dec = pass_named(p.decode, "decode");
  size_t full = 0;
  for (const LayerKindPlan& k : dec.layer_kinds) {
    const bool has_indexer =
        std::any_of(k.ops.begin(), k.ops.end(), [](const Op& o) { return o.name == "indexer_logits"; });
    EXPECT_EQ(has_indexer, k.name.ends_with(".full")) << k.name;
    if (has_indexer) full += k.layers.size();
  }
  EXPECT_EQ(full, 21u);
  EXPECT_EQ(kind_named(dec, "dense.full").layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(kind_named(dec, "moe.full").layers.size(), 18u);
  EXPECT_EQ(kind_named(dec, "moe.shared").layers.size(), 57u);
  EXPECT_EQ(p.memory.indexer_bytes_per_token, 21 * 132);
}

TEST_F(Glm53, ArticleCollectivesPerDecodeLayer) {
  const Plan p = build_plan(cfg, article_layout(), Hardware::named("h200"));
  const Pass& dec = pass_named(p.decode, "decode");
  EXPECT_EQ(dec.tokens_local, 4);  // 32 requests over 8 DP ranks
  EXPECT_EQ(dec.tokens_global, 32);
  // Every one of the 78 layers: DP all-gather of 32 x 6144 x 2 B = 393,216 B, and the reduce-scatter back.
  size_t layers_with_gather = 0;
  for (const LayerKindPlan& k : dec.layer_kinds) {
    const Collective* g = coll_named(k.collectives, "dp_all_gather");
    const Collective* rs = coll_named(k.collectives, "dp_reduce_scatter");
    ASSERT_NE(g, nullptr) << k.name;
    ASSERT_NE(rs, nullptr) << k.name;
    EXPECT_EQ(g->bytes, 32.0 * 6144 * 2);
    EXPECT_EQ(g->bytes, 393216.0);
    EXPECT_EQ(g->group_size, 8);
    EXPECT_EQ(rs->bytes, 393216.0);
    // Around a DeepEP MoE layer in the article's bill only: each rank dispatches its own rows.
    const bool moe_layer = k.name.rfind("moe.", 0) == 0;
    EXPECT_EQ(g->runs, !moe_layer) << k.name;
    EXPECT_EQ(rs->runs, !moe_layer) << k.name;
    EXPECT_EQ(g->wire_bytes > 0, !moe_layer) << k.name;
    EXPECT_EQ(coll_named(k.collectives, "attn_tp_all_reduce"), nullptr) << "attention TP is 1";
    layers_with_gather += k.layers.size();
  }
  EXPECT_EQ(layers_with_gather, 78u);
  // MoE layers: DeepEP dispatch 8 x 6144 B = 48 KB per token in FP8, combine twice that in bf16.
  const LayerKindPlan& moe = kind_named(dec, "moe.shared");
  EXPECT_EQ(coll_names(moe), (std::vector<std::string>{"dp_all_gather", "ep_dispatch_layout", "ep_dispatch",
                                                       "ep_combine", "dp_reduce_scatter"}));
  const Collective* disp = coll_named(moe.collectives, "ep_dispatch");
  const Collective* comb = coll_named(moe.collectives, "ep_combine");
  const double tokens_per_rank = 32.0 / 8;
  EXPECT_EQ(disp->bytes / tokens_per_rank, 8.0 * 6144);
  EXPECT_EQ(disp->bytes / tokens_per_rank, 49152.0);
  EXPECT_EQ(comb->bytes, 2 * disp->bytes);
  EXPECT_EQ(disp->scale_bytes, tokens_per_rank * 8 * (6144 / 128) * 4);
  EXPECT_EQ(disp->meta_bytes, tokens_per_rank * 8 * 8);  // each pair's expert (i32) and weight (f32)
  EXPECT_EQ(disp->wire_bytes, (disp->bytes + disp->scale_bytes + disp->meta_bytes) * 7 / 8);
  // Before it the pair counts, one i64 per EP rank (left out of the article's bill).
  const Collective* layout = coll_named(moe.collectives, "ep_dispatch_layout");
  EXPECT_EQ(layout->bytes, 8.0 * 8);
  EXPECT_FALSE(layout->article);
  // Dense layers have no EP traffic.
  EXPECT_EQ(coll_names(kind_named(dec, "dense.full")),
            (std::vector<std::string>{"dp_all_gather", "dp_reduce_scatter"}));
  // The article's decode bill: 61 MB of DP gather/scatter + 339 (Mi)B of dispatch/combine -> ~12.5 MB per
  // token; exactly 393,216 x 156 / 32 + 147,456 x 75 = 12,976,128 B.
  EXPECT_DOUBLE_EQ(p.decode.totals.article_bytes_per_output_token, 393216.0 * 156 / 32 + 147456.0 * 75);
  EXPECT_NEAR(p.decode.totals.article_bytes_per_output_token / 1e6, 12.98, 0.01);
  // One decode step on one rank: the dense layers' gather and scatter, the MoE layers' layout, dispatch
  // and combine (the article's gathers around them are not run).
  EXPECT_EQ(p.decode.totals.collectives, 3 * 2 + 75 * 3);
  // DP attention: no embedding all-reduce and no LM-head gather (full vocabulary per rank).
  EXPECT_TRUE(dec.head_collectives.empty());
  EXPECT_TRUE(dec.tail_collectives.empty());
}

TEST_F(Glm53, ArticleExpertWeightsAndReadFloor) {
  const Plan p = build_plan(cfg, article_layout(), Hardware::named("h200"));
  // 75 MoE layers x 32 local experts x 3 FP8 matrices of 6144 x 2048 (+ one float per 128 x 128 block).
  const double expert = 3.0 * (6144.0 * 2048 + 48 * 16 * 4);
  EXPECT_DOUBLE_EQ(p.memory.routed_expert_bytes, 75 * 32 * expert);
  EXPECT_NEAR(p.memory.routed_expert_bytes / 1e9, 91, 0.5);  // "~91 GB per GPU under EP8"
  // The floor: read every local expert once per step. The article divides by 4.8 TB/s (19 ms); the plan
  // uses the measured 4.3 TB/s.
  EXPECT_DOUBLE_EQ(p.memory.expert_read_floor_s, p.memory.routed_expert_bytes / 4.3e12);
  EXPECT_NEAR(p.memory.expert_read_floor_s * 1e3, 21.07, 0.01);
  EXPECT_NEAR(p.memory.routed_expert_bytes / 4.8e12 * 1e3, 19, 0.2);
  // With batch 32 only part of the experts are hit: 32 x (1 - (1 - 8/256)^32) = 20.4 expected.
  const LayerKindPlan& moe = kind_named(pass_named(p.decode, "decode"), "moe.shared");
  const double hit = 32 * (1 - std::pow(1 - 8.0 / 256, 32));
  EXPECT_NEAR(op_named(moe.ops, "experts_gate_up").weight_bytes, hit * 2 * (6144.0 * 2048 + 16 * 48 * 4), 1);
  EXPECT_NEAR(op_named(moe.ops, "experts_down").weight_bytes, hit * (6144.0 * 2048 + 48 * 16 * 4), 1);
  // Replicated: attention, indexer, shared experts, router, embeddings in bf16 (~20 GB, the article's ~18 GB
  // counts the embeddings in FP8); sharded: the experts and the dense MLPs (TP over 8).
  EXPECT_NEAR(p.memory.weights_replicated_bytes / 1e9, 20.0, 0.1);
  EXPECT_NEAR(p.memory.weights_bytes / 1e9, 110.7, 0.1);
  // The batch does not fit: 120 GB budget at 0.8 leaves ~9.4 GB of KV per GPU, one 128K request per rank.
  EXPECT_EQ(p.memory.kv_tokens_fit % 64, 0);
  EXPECT_EQ(p.memory.kv_tokens_fit, int64_t(std::floor((150109880320.0 * 0.8 - p.memory.weights_bytes) /
                                                       (656.0 * 78 + 132 * 21) / 64)) *
                                        64);
  EXPECT_EQ(p.memory.max_requests_per_dp_group, 1);
  EXPECT_EQ(p.memory.max_requests, 8);
  EXPECT_FALSE(p.memory.batch_fits);
  ASSERT_FALSE(p.notes.empty());
  EXPECT_NE(p.notes[0].find("does not fit"), std::string::npos);
}

// Matmul FLOPs of one moe.full decode layer on one rank, counted here from the config alone.
TEST_F(Glm53, DecodeLayerFlopsMatchAnIndependentCount) {
  const Plan p = build_plan(cfg, article_layout(), Hardware::named("h200"));
  const LayerKindPlan& k = kind_named(pass_named(p.decode, "decode"), "moe.full");
  double plan_flops = 0;
  for (const Op& o : k.ops) {
    if (o.kind == OpKind::gemm || o.kind == OpKind::bmm || o.kind == OpKind::attention ||
        o.kind == OpKind::indexer)
      plan_flops += o.flops;
  }
  const double T = 4, S = 131072, H = 6144;
  double f = 0;
  f += 2 * T * H * (2048 + 512 + 64);                      // q_a + kv_a
  f += 2 * T * 2048 * (32 * 128);                          // indexer wq_b
  f += 2 * T * H * (128 + 32);                             // indexer wk + weights_proj
  f += T * S * 32 * (2 * 128 + 3);                         // indexer scores: dot, relu, weight, sum
  f += 2 * T * 2048 * (64 * 256);                          // q_b
  f += 2 * T * 64 * 192 * 512;                             // q_nope -> latent
  f += 2 * T * 64 * 2048 * 576 + 2 * T * 64 * 2048 * 512;  // scores over 2048 keys + weighted sum
  f += 2 * T * 64 * 512 * 256;                             // latent -> v
  f += 2 * T * 64 * 256 * H;                               // o_proj
  const double routed = 32;                  // tokens this rank routes after the gather: 32 / 8 = 4 ...
  f += 2 * (routed / 8) * H * 256;           // router on its 4 tokens
  f += 2 * (routed * 8 / 8) * 3 * H * 2048;  // 32 token-expert pairs land on each rank
  f += 2 * (routed / 8) * 3 * H * 2048;      // shared expert on its 4 tokens
  EXPECT_NEAR(plan_flops / f, 1.0, 1e-12);
}

// The article's decode table, row by row, on one GPU (b tokens, all heads, all experts on the rank).
TEST_F(Glm53, ArticleDecodeTableRows) {
  Deployment d;
  d.batch = 16;
  d.context = 131072;
  d.mem_fraction_static = 1.0;
  d.kv_cache_dtype = KvDtype::fp8_e4m3;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const LayerKindPlan& k = kind_named(pass_named(p.decode, "decode"), "moe.shared");
  const double b = 16;
  EXPECT_NEAR(op_named(k.ops, "qkv_a_proj").flops / (2 * b), 16.12e6, 0.01e6);
  EXPECT_NEAR(op_named(k.ops, "q_b_proj").flops / (2 * b), 33.55e6, 0.01e6);
  EXPECT_NEAR(op_named(k.ops, "q_nope_absorb").flops / (2 * b), 6.29e6, 0.01e6);
  EXPECT_NEAR(op_named(k.ops, "v_up_absorb").flops / (2 * b), 8.39e6, 0.01e6);
  EXPECT_NEAR(op_named(k.ops, "o_proj").flops / (2 * b), 100.66e6, 0.01e6);
  const double experts = op_named(k.ops, "experts_gate_up").flops + op_named(k.ops, "experts_down").flops;
  EXPECT_NEAR(experts / (2 * b), 302e6, 0.1e6);
  // The article's 67.1M counts the 512-dim score product only; the plan adds the rope part and the
  // weighted sum of the latent values: 64 x 2048 x (576 + 512).
  EXPECT_DOUBLE_EQ(op_named(k.ops, "sparse_mla").flops / (2 * b), 64.0 * 2048 * (576 + 512));
  EXPECT_NEAR(64.0 * 512 * 2048 / 1e6, 67.1, 0.05);
  // KV read per token per layer: 2048 selected rows of 656 B (the article: 576 B -> 1.2 MB).
  EXPECT_DOUBLE_EQ(op_named(k.ops, "sparse_mla").kv_read_bytes / b, 2048.0 * 656);
  // Indexer: every token reads the whole indexer cache of its request once per full layer (132 B/token).
  const LayerKindPlan& full = kind_named(pass_named(p.decode, "decode"), "moe.full");
  EXPECT_DOUBLE_EQ(op_named(full.ops, "indexer_logits").kv_read_bytes / b, 131072.0 * 132);
  // No communication on one GPU.
  EXPECT_EQ(p.decode.totals.collectives, 0);
}

TEST_F(Glm53, PureTpLayout) {
  Deployment d;
  d.tp = 8;
  d.batch = 32;
  d.context = 8192;
  d.prefill_tokens = 8192;
  d.chunked_prefill_size = -1;
  d.speculative_num_draft_tokens = 6;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  // Prefill of 8192 tokens: two all-reduces per layer of 8192 x 6144 x 2 B = 96 MiB, 156 in all (+ the
  // embedding's), ~15.7 GB.
  const Pass& pre = pass_named(p.prefill, "prefill");
  for (const LayerKindPlan& k : pre.layer_kinds) {
    EXPECT_EQ(coll_names(k), (std::vector<std::string>{"attn_tp_all_reduce", "tp_all_reduce"})) << k.name;
    for (const Collective& c : k.collectives) EXPECT_EQ(c.bytes, 8192.0 * 6144 * 2);
  }
  ASSERT_EQ(pre.head_collectives.size(), 1u);
  EXPECT_EQ(pre.head_collectives[0].name, "embed_all_reduce");
  double layer_ar = 0;
  for (const LayerKindPlan& k : pre.layer_kinds)
    for (const Collective& c : k.collectives) layer_ar += c.bytes * double(k.layers.size());
  EXPECT_NEAR(layer_ar / 1e9, 15.7, 0.05);
  // Ring all-reduce sends 2 x 7/8 of the message per rank.
  EXPECT_DOUBLE_EQ(pre.layer_kinds[0].collectives[0].wire_bytes, 2.0 * 7 / 8 * 8192 * 6144 * 2);
  // Verify with 6 draft tokens: the LM-head gather of 6 x 32 x 154880 x 2 B = 59.5 MB.
  const Pass& ver = pass_named(p.decode, "verify");
  ASSERT_EQ(ver.tail_collectives.size(), 1u);
  EXPECT_EQ(ver.tail_collectives[0].name, "lm_head_all_gather");
  EXPECT_EQ(ver.tail_collectives[0].bytes, 6.0 * 32 * 154880 * 2);
  // MTP: 5 draft passes, then verify and draft_extend.
  EXPECT_EQ(pass_named(p.decode, "draft").repeat, 5);
  EXPECT_TRUE(pass_named(p.decode, "draft_extend").mtp);
  EXPECT_EQ(pass_named(p.decode, "draft").layer_kinds[0].name, "mtp");
  EXPECT_GT(op_named(pass_named(p.decode, "draft").layer_kinds[0].ops, "mtp_eh_proj").flops, 0);
  // Experts are split by intermediate size: every rank holds all 256 with 2048 / 8 columns.
  const LayerKindPlan& moe = kind_named(ver, "moe.shared");
  EXPECT_NE(op_named(moe.ops, "experts_gate_up").shape.find("256 experts"), std::string::npos);
  EXPECT_NE(op_named(moe.ops, "experts_gate_up").shape.find("[512, 6144]"), std::string::npos);
  // The MTP layer's weights and KV are resident.
  EXPECT_EQ(p.memory.mtp_bytes_per_token, 2 * 576 + 132);
  const model::ParamCount pc = model::count_params(cfg);
  int64_t params = 0;
  for (const WeightGroup& g : p.memory.weights) params += g.params;
  EXPECT_EQ(params, pc.total + pc.mtp_total);
  // Attention weights sharded over 8 ranks, the A projection replicated.
  for (const WeightGroup& g : p.memory.weights) {
    if (g.name == "attention.qkv_a_proj") {
      EXPECT_EQ(g.shards, 1);
    }
    if (g.name == "attention.o_proj") {
      EXPECT_EQ(g.shards, 8);
    }
  }
}

// DP attention with attention TP 2 and DeepEP (tp 8, dp 4): every layer in the scattered mode, as the
// ranks run it; around the MoE the article's DP gathers in its count only, each rank dispatching its
// slice (the average rank's: 32 tokens / 8).
TEST_F(Glm53, DpAttentionUnderAttentionTpWithDeepep) {
  Deployment d = article_layout();
  d.attn_dp_size = 4;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const LayerKindPlan& moe = kind_named(pass_named(p.decode, "decode"), "moe.shared");
  EXPECT_EQ(coll_names(moe), (std::vector<std::string>{"attn_tp_reduce_scatter", "dp_all_gather",
                                                       "ep_dispatch_layout", "ep_dispatch", "ep_combine",
                                                       "dp_reduce_scatter", "attn_tp_all_gather"}));
  for (const Collective& c : moe.collectives) {
    EXPECT_EQ(c.runs, c.name.rfind("dp_", 0) != 0) << c.name;
    if (!c.runs) {
      EXPECT_EQ(c.time_s, 0.0) << c.name;
    }
  }
  EXPECT_EQ(coll_named(moe.collectives, "ep_dispatch")->bytes, 4.0 * 8 * 6144);
  EXPECT_EQ(coll_names(kind_named(pass_named(p.decode, "decode"), "dense.full")),
            (std::vector<std::string>{"attn_tp_reduce_scatter", "dp_all_gather", "dp_reduce_scatter",
                                      "attn_tp_all_gather"}));
}

TEST_F(Glm53, TpAttentionWithEp) {
  Deployment d;
  d.tp = 8;
  d.ep_size = 8;
  d.moe_a2a_backend = A2aBackend::deepep;
  d.batch = 32;
  d.context = 4096;
  Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const Pass& dec = pass_named(p.decode, "decode");
  EXPECT_EQ(dec.tokens_local, 32);  // attention TP: every rank sees the whole batch, 8 heads each
  const LayerKindPlan& moe = kind_named(dec, "moe.shared");
  // The article's "o_proj AllReduce + dispatch/combine", as reduce-scatter, dispatch of this rank's slice,
  // combine, all-gather.
  EXPECT_EQ(coll_names(moe), (std::vector<std::string>{"attn_tp_reduce_scatter", "ep_dispatch_layout",
                                                       "ep_dispatch", "ep_combine", "attn_tp_all_gather"}));
  EXPECT_EQ(coll_named(moe.collectives, "ep_dispatch")->bytes, 4.0 * 8 * 6144);
  EXPECT_EQ(coll_named(moe.collectives, "attn_tp_reduce_scatter")->bytes, 32.0 * 6144 * 2);
  EXPECT_EQ(coll_names(kind_named(dec, "dense.full")),
            (std::vector<std::string>{"attn_tp_all_reduce", "tp_all_reduce"}));
  EXPECT_NE(op_named(moe.ops, "q_b_proj").shape.find("[2048, 2048]"), std::string::npos);  // 8 heads x 256
  // The latent KV is not split by heads: every rank of the attention TP group holds all of it.
  EXPECT_EQ(p.memory.kv_bytes_per_token, 1152.0 * 78);
  // Without DeepEP: each rank runs its 32 experts on all 32 tokens, then one all-reduce.
  d.moe_a2a_backend = A2aBackend::none;
  p = build_plan(cfg, d, Hardware::named("h200"));
  const LayerKindPlan& moe2 = kind_named(pass_named(p.decode, "decode"), "moe.shared");
  EXPECT_EQ(coll_names(moe2), (std::vector<std::string>{"attn_tp_all_reduce", "tp_all_reduce"}));
  EXPECT_DOUBLE_EQ(op_named(moe2.ops, "experts_down").flops, 2.0 * 32 * 8 / 8 * 2048 * 6144);
}

TEST_F(Glm53, MtpVerifyMultipliesTheArticleDecodeTraffic) {
  Deployment d = article_layout();
  d.speculative_num_draft_tokens = 6;
  d.mem_fraction_static = 0.9;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const Pass& ver = pass_named(p.decode, "verify");
  const LayerKindPlan& moe = kind_named(ver, "moe.shared");
  // DP gather ~2.4 MB per layer; dispatch + combine ~2 GB per step for the deployment.
  EXPECT_EQ(coll_named(moe.collectives, "dp_all_gather")->bytes, 6.0 * 32 * 6144 * 2);
  const double a2a =
      (coll_named(moe.collectives, "ep_dispatch")->bytes + coll_named(moe.collectives, "ep_combine")->bytes) *
      8 * 75;
  EXPECT_NEAR(a2a / (1 << 30), 1.98, 0.01);
  EXPECT_EQ(pass_named(p.decode, "draft").tokens_local, 4);
  EXPECT_EQ(ver.tokens_local, 24);
  // The MTP layer adds its own KV and indexer rows per token.
  EXPECT_EQ(p.memory.mtp_bytes_per_token, 656 + 132);
}

TEST_F(Glm53, ArticlePrefillDispatchCombine) {
  // One 8192-token prompt under DP attention + EP8: dispatch ~0.4 GB and combine ~0.8 GB per layer for the
  // deployment, ~90 GB over the 75 MoE layers.
  Deployment d = article_layout();
  d.prefill_tokens = 8192;
  d.chunked_prefill_size = -1;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const Pass& pre = pass_named(p.prefill, "prefill");
  EXPECT_EQ(pre.chunks, 1);
  const LayerKindPlan& moe = kind_named(pre, "moe.shared");
  const double disp = coll_named(moe.collectives, "ep_dispatch")->bytes * 8;
  const double comb = coll_named(moe.collectives, "ep_combine")->bytes * 8;
  EXPECT_DOUBLE_EQ(disp, 8192.0 * 8 * 6144);
  EXPECT_NEAR((disp + comb) / 1e9, 1.21, 0.01);
  EXPECT_NEAR((disp + comb) * 75 / 1e9, 90.6, 0.1);
  // The prompt lives on one DP rank: the gather carries its 8192 rows (variable-length), not 8 x 8192.
  EXPECT_DOUBLE_EQ(coll_named(moe.collectives, "dp_all_gather")->bytes, 8192.0 * 6144 * 2);
  // The MHA-form kv_b_proj figure of the article (2 x 32768 x 512 x 28672 = 0.96 TFLOP) does not apply:
  // DSA prefill runs the absorbed form (FlashMLA sparse), so there is no kv_b_proj op.
  for (const Op& o : moe.ops) EXPECT_NE(o.name, "kv_b_proj");
}

TEST_F(Glm53, SmallDecodeBatchPadsTheDpGather) {
  Deployment d = article_layout();
  d.batch = 3;  // 3 requests over 8 DP ranks: every rank contributes 1 row (padded)
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const LayerKindPlan& moe = kind_named(pass_named(p.decode, "decode"), "moe.shared");
  EXPECT_DOUBLE_EQ(coll_named(moe.collectives, "dp_all_gather")->bytes, 8.0 * 6144 * 2);
  // ... but only the 3 real tokens are routed: 3 x 8 picks over 256 experts.
  const double hit = 32 * (1 - std::pow(1 - 8.0 / 256, 3));
  EXPECT_NE(op_named(moe.ops, "experts_gate_up").shape.find(fmt::format("({:.1f} hit)", hit)),
            std::string::npos)
      << op_named(moe.ops, "experts_gate_up").shape;
}

TEST_F(Glm53, TopkBroadcastOnlyUnderAttentionTp) {
  Deployment d;
  d.tp = 8;
  d.batch = 16;
  d.context = 65536;
  d.dsa_topk_broadcast = true;
  Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const Pass& dec = pass_named(p.decode, "decode");
  const Collective* b = coll_named(kind_named(dec, "moe.full").collectives, "indexer_topk_broadcast");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->after, "indexer_topk");
  EXPECT_EQ(b->bytes, 16.0 * 2048 * 4);
  EXPECT_EQ(coll_named(kind_named(dec, "moe.shared").collectives, "indexer_topk_broadcast"), nullptr);
  // Under DP attention the attention TP group has one rank: nothing to broadcast.
  d = article_layout();
  d.dsa_topk_broadcast = true;
  p = build_plan(cfg, d, Hardware::named("h200"));
  EXPECT_EQ(coll_named(kind_named(pass_named(p.decode, "decode"), "moe.full").collectives,
                       "indexer_topk_broadcast"),
            nullptr);
}

TEST(PlanDeepSeekV32, ArticleLayout) {
  DSA_FIXTURE_PATH(path, "configs/deepseek-v3.2.json");
  const ModelConfig cfg = ModelConfig::from_file(path);
  Deployment d = article_layout();
  d.context = 32768;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  EXPECT_EQ(p.memory.kv_values_per_token, 576 * 61);
  EXPECT_EQ(p.memory.indexer_bytes_per_token, 61 * 132);  // every layer has an indexer
  const Pass& dec = pass_named(p.decode, "decode");
  EXPECT_EQ(kind_named(dec, "dense.full").layers.size(), 3u);
  EXPECT_EQ(kind_named(dec, "moe.full").layers.size(), 58u);
  // 58 MoE layers x 32 experts x 3 x 7168 x 2048 FP8 (+ scales) = 81.7 GB per GPU.
  EXPECT_DOUBLE_EQ(p.memory.routed_expert_bytes, 58 * 32 * 3 * (7168.0 * 2048 + 56 * 16 * 4));
  const LayerKindPlan& moe = kind_named(dec, "moe.full");
  EXPECT_EQ(coll_named(moe.collectives, "ep_dispatch")->bytes, 4.0 * 8 * 7168);
  EXPECT_EQ(coll_named(moe.collectives, "dp_all_gather")->bytes, 32.0 * 7168 * 2);
  // 128 heads, q_lora 1536, heads of 128 + 64.
  EXPECT_DOUBLE_EQ(op_named(moe.ops, "q_b_proj").flops, 2.0 * 4 * 1536 * 128 * 192);
  EXPECT_DOUBLE_EQ(op_named(moe.ops, "sparse_mla").flops, 2.0 * 128 * 4 * 2048 * (576 + 512));
  EXPECT_TRUE(p.memory.batch_fits);
  EXPECT_GT(p.decode.totals.time_s, p.memory.expert_read_floor_s * 0.5);
}

// A small config whose numbers are checked by hand: bf16 weights, 2 layers (dense, MoE), one GPU.
ModelConfig small_config() {
  return ModelConfig::from_json(nlohmann::json::parse(R"({
    "model_type": "glm_moe_dsa", "architectures": ["GlmMoeDsaForCausalLM"],
    "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "routed_scaling_factor": 2.5, "norm_topk_prob": true, "first_k_dense_replace": 1,
    "index_topk": 4, "index_n_heads": 2, "index_head_dim": 16, "indexer_types": ["full", "shared"],
    "max_position_embeddings": 4096, "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})"));
}

// plan_step: one engine step's exact batch. A prompt chunk of 3 tokens and a request extending a 9-token
// prefix by one (not decoding: the step is a prefill), checked by hand.
// Attention DP under attention TP 2 (--tp 8 --attn-dp-size 4): the scattered mode, o_proj's reduction a
// reduce-scatter in attention TP and the rows' all-gather at the layer boundary, the DP gathers over the
// world group between them.
TEST_F(Glm53, AttentionDpUnderAttentionTp) {
  Deployment d;
  d.tp = 8;
  d.ep_size = 8;
  d.attn_dp_size = 4;
  d.batch = 32;
  d.context = 4096;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  const Pass& dec = pass_named(p.decode, "decode");
  EXPECT_EQ(dec.tokens_local, 8);  // 32 requests over 4 DP groups
  for (const char* kind : {"dense.full", "moe.shared"}) {
    const LayerKindPlan& k = kind_named(dec, kind);
    EXPECT_EQ(coll_names(k), (std::vector<std::string>{"attn_tp_reduce_scatter", "dp_all_gather",
                                                       "dp_reduce_scatter", "attn_tp_all_gather"}))
        << kind;
    EXPECT_EQ(coll_named(k.collectives, "attn_tp_reduce_scatter")->group, "attn_tp");
    EXPECT_EQ(coll_named(k.collectives, "attn_tp_reduce_scatter")->bytes, 8.0 * 6144 * 2);
    EXPECT_EQ(coll_named(k.collectives, "attn_tp_all_gather")->bytes, 8.0 * 6144 * 2);
    EXPECT_EQ(coll_named(k.collectives, "dp_all_gather")->group, "world");  // SGLang's TP group
    EXPECT_EQ(coll_named(k.collectives, "dp_all_gather")->bytes, 32.0 * 6144 * 2);
  }
}

// plan_step prices a traced pass's DP gathers from every group's tokens: the rows themselves (prefill's
// variable form) or every rank padded to the largest attention TP slice (decode's equal lengths).
TEST(PlanStep, DpTokensSetTheGatheredRows) {
  const ModelConfig cfg = small_config();
  Deployment d;
  d.tp = 4;
  d.attn_dp_size = 2;  // attention TP 2
  StepShape s;
  s.requests = {{5, 0}};
  s.dp_tokens = {5, 2};
  const double row = double(cfg.hidden_size) * 2;
  auto gather = [&] {
    const Pass p = plan_step(cfg, d, Hardware::named("h200"), s);
    return coll_named(kind_named(p, "dense.full").collectives, "dp_all_gather")->bytes / row;
  };
  EXPECT_EQ(gather(), 7.0);  // 5 + 2
  s.dp_equal = true;
  EXPECT_EQ(gather(), 12.0);  // 4 ranks x the slice of 3 (5 = 3 + 2)
  s.dp_tokens = {5};
  EXPECT_THROW(gather(), Error);
}

TEST(PlanStep, HandComputedBatch) {
  const ModelConfig cfg = small_config();
  StepShape s;
  s.requests = {{3, 0}, {1, 9}};
  const Pass p = plan_step(cfg, Deployment{}, Hardware::named("h200"), s);
  EXPECT_EQ(p.name, "prefill");
  EXPECT_EQ(p.tokens_local, 4);
  const LayerKindPlan& dense = kind_named(p, "dense.full");
  EXPECT_EQ(op_named(dense.ops, "qkv_a_proj").shape, "[4, 256] x [104, 256]^T");
  // Keys: top-4 of causal 1, 2, 3 for the chunk; min(4, 10) for the extension: 10 queries' worth.
  EXPECT_EQ(op_named(dense.ops, "sparse_mla").flops, 2.0 * 4 * 10 * 40 + 2.0 * 4 * 10 * 32);
  EXPECT_EQ(op_named(dense.ops, "sparse_mla").shape, "4 q x 4 heads x [32 + 8] . 4 keys");
  // The indexer scores 1 + 2 + 3 keys and 10 keys, and reads both caches (3 + 10 rows of 20 B).
  EXPECT_EQ(op_named(dense.ops, "indexer_topk").flops, 16.0);
  EXPECT_EQ(op_named(dense.ops, "indexer_logits").kv_read_bytes, 13.0 * 20);
  EXPECT_EQ(op_named(dense.ops, "indexer_logits").shape, "4 q x [2, 16] . 10 keys");
  // The engine normalises every token and takes each request's last one to the LM head.
  EXPECT_EQ(op_named(p.tail_ops, "final_norm").shape, "[4, 256]");
  EXPECT_EQ(op_named(p.tail_ops, "lm_head").shape, "[2, 256] x [1000, 256]^T");
  s.all_logits = true;
  s.mtp = true;
  const Pass m = plan_step(cfg, Deployment{}, Hardware::named("h200"), s);
  EXPECT_EQ(m.name, "prefill_draft_extend");
  EXPECT_EQ(kind_named(m, "mtp").layers, std::vector<int64_t>{2});
  EXPECT_EQ(op_named(m.tail_ops, "lm_head").shape, "[4, 256] x [1000, 256]^T");

  EXPECT_THROW(plan_step(cfg, Deployment{}, Hardware::named("h200"), StepShape{}), Error);
  StepShape bad;
  bad.decode = true;
  bad.requests = {{2, 5}};
  EXPECT_THROW(plan_step(cfg, Deployment{}, Hardware::named("h200"), bad), Error);
}

// A step of B decoding requests at context L prices like build_plan's decode pass for --batch B --context
// L, and one unchunked prompt like its prefill (but for the final norm, on every token here).
TEST(PlanStep, UniformBatchesMatchBuildPlan) {
  const ModelConfig cfg = small_config();
  Deployment d;
  d.batch = 3;
  d.context = 10;
  d.chunked_prefill_size = -1;
  const Hardware hw = Hardware::named("h200");
  const Plan plan = build_plan(cfg, d, hw);
  StepShape dec;
  dec.decode = true;
  dec.requests.assign(3, StepRequest{1, 9});
  StepShape pre;
  pre.requests = {{10, 0}};
  for (const auto& [shape, planned] : {std::pair{dec, &pass_named(plan.decode, "decode")},
                                       std::pair{pre, &pass_named(plan.prefill, "prefill")}}) {
    const Pass p = plan_step(cfg, d, hw, shape);
    SCOPED_TRACE(p.name);
    ASSERT_EQ(p.layer_kinds.size(), planned->layer_kinds.size());
    for (size_t k = 0; k < p.layer_kinds.size(); ++k) {
      ASSERT_EQ(p.layer_kinds[k].ops.size(), planned->layer_kinds[k].ops.size());
      for (size_t i = 0; i < p.layer_kinds[k].ops.size(); ++i) {
        const Op &a = p.layer_kinds[k].ops[i], &b = planned->layer_kinds[k].ops[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.shape, b.shape) << a.name;
        EXPECT_DOUBLE_EQ(a.flops, b.flops) << a.name;
        EXPECT_DOUBLE_EQ(a.bytes(), b.bytes()) << a.name;
      }
    }
    EXPECT_EQ(op_named(p.tail_ops, "lm_head").shape, op_named(planned->tail_ops, "lm_head").shape);
  }
}

TEST(PlanStep, DeploymentSpec) {
  const ModelConfig cfg = small_config();
  const Deployment d = parse_deployment("tp2,ep2,dp2,fp8", cfg);
  EXPECT_EQ(d.tp, 2);
  EXPECT_EQ(d.ep_size, 2);
  EXPECT_EQ(d.attn_dp_size, 2);
  EXPECT_EQ(d.kv_cache_dtype, KvDtype::fp8_e4m3);
  EXPECT_THROW(parse_deployment("tp2,xx", cfg), Error);
  EXPECT_THROW(parse_deployment("tp0", cfg), Error);
  EXPECT_THROW(parse_deployment("", cfg), Error);
  EXPECT_THROW(parse_deployment("tp3", cfg), Error);  // 4 heads do not split over 3
}

// measured_vs_planned on a hand-made trace: a decode pass of 3 requests with two op spans (one fused) and
// one the plan does not have.
TEST(PlanStep, MeasuredVsPlannedSummary) {
  const ModelConfig cfg = small_config();
  auto event = [](std::string name, std::string cat, double ts, double dur, nlohmann::json args) {
    trace::Event e;
    e.name = std::move(name);
    e.cat = std::move(cat);
    e.ts_exact_us = ts;
    e.dur_exact_us = dur;
    e.args = std::move(args);
    return e;
  };
  auto op_args = [](const char* kind, int64_t layer) {
    return nlohmann::json{
        {"step", "decode"}, {"pass", "decode"}, {"kind", kind}, {"layer", layer}, {"pass_id", 7}};
  };
  const std::vector<trace::Event> events = {
      event("decode", "pass", 0, 100,
            {{"step", "decode"},
             {"pass_id", 7},
             {"requests", {{1, 9}, {1, 9}, {1, 9}}},
             {"all_logits", false},
             {"mtp", false},
             {"device", false}}),
      event("qkv_a_proj", "op", 1, 10, op_args("dense.full", 0)),
      event("experts_gate_up+experts_act+experts_down", "op", 20, 5, op_args("moe.shared", 1)),
      event("bogus", "op", 30, 2, op_args("moe.shared", 1)),
      event("qkv_a_proj", "op", 40, 7,
            {{"step", "decode"}, {"pass", "decode"}, {"kind", "dense.full"}, {"pass_id", 99}}),
  };
  TraceSummaryOptions o;
  o.what_if = parse_deployment("tp2", cfg);
  const nlohmann::json s = measured_vs_planned(events, cfg, o);
  StepShape shape;
  shape.decode = true;
  shape.requests.assign(3, StepRequest{1, 9});
  const Pass p = plan_step(cfg, Deployment{}, Hardware::named("h200"), shape);
  const LayerKindPlan& moe = kind_named(p, "moe.shared");
  ASSERT_EQ(s["rows"].size(), 3u);  // the span of an unknown pass (99) is not counted
  EXPECT_EQ(s["rows"][0]["key"], "decode/decode/dense.full/qkv_a_proj");
  EXPECT_EQ(s["rows"][0]["count"], 1);
  EXPECT_DOUBLE_EQ(s["rows"][0]["measured_us"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(s["rows"][0]["planned_us"].get<double>(),
                   op_named(kind_named(p, "dense.full").ops, "qkv_a_proj").time_s() * 1e6);
  EXPECT_NEAR(s["rows"][0]["ratio"].get<double>(), 10.0 / s["rows"][0]["planned_us"].get<double>(), 1e-9);
  EXPECT_DOUBLE_EQ(s["rows"][1]["planned_us"].get<double>(),
                   (op_named(moe.ops, "experts_gate_up").time_s() +
                    op_named(moe.ops, "experts_act").time_s() + op_named(moe.ops, "experts_down").time_s()) *
                       1e6);
  EXPECT_FALSE(s["rows"][2]["planned"].get<bool>());
  EXPECT_EQ(s["device"], "cpu");
  ASSERT_EQ(s["steps"].size(), 1u);
  EXPECT_DOUBLE_EQ(s["steps"][0]["measured_us"].get<double>(), 17.0);
  EXPECT_EQ(s["not_traced"][0]["key"], "decode/decode/tail/sampling");
  EXPECT_TRUE(s["collectives"]["traced"].empty());
  EXPECT_NE(s["collectives"]["note"].get<std::string>().find("no collectives ran"), std::string::npos);
  // tp2 (attention TP): the embedding and each layer's o_proj all-reduce, the MLPs' all-reduce, the logits
  // all-gather.
  bool saw_ar = false;
  for (const auto& c : s["collectives"]["what_if"]["collectives"]) {
    if (c["name"] == "attn_tp_all_reduce") {
      saw_ar = true;
      EXPECT_EQ(c["count_per_step"], 2.0);                // 2 layers
      EXPECT_EQ(c["bytes_per_step"], 2.0 * 3 * 256 * 2);  // 3 tokens x 256 x bf16, twice
    }
  }
  EXPECT_TRUE(saw_ar);
  EXPECT_NE(format_summary(s).find("qkv_a_proj"), std::string::npos);
}

TEST(PlanSmall, HandComputedValues) {
  const ModelConfig cfg = small_config();
  Deployment d;
  d.batch = 3;
  d.context = 10;
  d.prefill_tokens = 10;
  d.chunked_prefill_size = 4;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  // Weights: all bf16 (2 B per parameter), the router's correction bias in fp32 (8 floats).
  EXPECT_DOUBLE_EQ(p.memory.weights_bytes, 2.0 * double(model::count_params(cfg).total) + 2 * 8);
  EXPECT_EQ(p.memory.kv_bytes_per_token, 2 * (32 + 8) * 2);
  EXPECT_EQ(p.memory.indexer_bytes_per_token, 16 + 4);
  const Pass& dec = pass_named(p.decode, "decode");
  const LayerKindPlan& dense = kind_named(dec, "dense.full");
  const Op& a = op_named(dense.ops, "qkv_a_proj");
  EXPECT_EQ(a.flops, 2.0 * 3 * 256 * (64 + 32 + 8));
  EXPECT_EQ(a.weight_bytes, 2.0 * 256 * 104);
  EXPECT_EQ(a.act_read_bytes, 3.0 * 256 * 2);
  EXPECT_EQ(a.shape, "[3, 256] x [104, 256]^T");
  // Decode: 3 queries x min(4, 10) keys, 4 heads, 40-value scores + 32-value sums.
  EXPECT_EQ(op_named(dense.ops, "sparse_mla").flops, 2.0 * 4 * 12 * 40 + 2.0 * 4 * 12 * 32);
  EXPECT_EQ(op_named(dense.ops, "sparse_mla").kv_read_bytes, 12.0 * 80);
  EXPECT_EQ(op_named(dense.ops, "indexer_logits").kv_read_bytes, 3.0 * 10 * 20);
  EXPECT_EQ(op_named(dense.ops, "mlp_gate_up").flops, 2.0 * 3 * 256 * 1024);
  const LayerKindPlan& moe = kind_named(dec, "moe.shared");
  EXPECT_EQ(op_named(moe.ops, "experts_down").flops, 2.0 * 3 * 2 * 128 * 256);
  // 3 tokens x 2 picks over 8 experts: expected 8 x (1 - (6/8)^3) experts read.
  EXPECT_NEAR(op_named(moe.ops, "experts_down").weight_bytes, 8 * (1 - std::pow(0.75, 3)) * 256 * 128 * 2,
              1e-6);
  // Roofline: each op is the max of its floors.
  EXPECT_DOUBLE_EQ(a.time_s(), std::max(a.flops / 797e12, a.bytes() / 4.3e12));
  // Prefill of 10 tokens in chunks of 4, 4, 2: causal top-4 keys 1+2+3+4x7 = 34; the indexer reads
  // 4 + 8 + 10 cache rows and scores 55 query-key pairs; weights are read once per chunk.
  const Pass& pre = pass_named(p.prefill, "prefill");
  EXPECT_EQ(pre.chunks, 3);
  const LayerKindPlan& pd = kind_named(pre, "dense.full");
  EXPECT_EQ(op_named(pd.ops, "sparse_mla").flops, 2.0 * 4 * 34 * 40 + 2.0 * 4 * 34 * 32);
  EXPECT_EQ(op_named(pd.ops, "indexer_logits").kv_read_bytes, 22.0 * 20);
  EXPECT_EQ(op_named(pd.ops, "indexer_logits").flops, 55.0 * 2 * (2 * 16 + 3));
  EXPECT_EQ(op_named(pd.ops, "qkv_a_proj").weight_bytes, 3 * 2.0 * 256 * 104);
  EXPECT_EQ(op_named(pre.tail_ops, "lm_head").flops, 2.0 * 256 * 1000);  // the last token only
  // Totals add up: the step time is the ops plus the (empty) communication.
  EXPECT_EQ(p.decode.totals.comm_s, 0);
  EXPECT_DOUBLE_EQ(p.decode.totals.time_s, p.decode.totals.op_time_s);
}

TEST(PlanSmall, WithoutIndexerPrefillUsesTheMhaForm) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "q_lora_rank": 64,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": true, "first_k_dense_replace": 1, "max_position_embeddings": 4096,
    "num_nextn_predict_layers": 0, "tie_word_embeddings": false, "rms_norm_eps": 1e-6})");
  const ModelConfig cfg = ModelConfig::from_json(j);
  Deployment d;
  d.batch = 2;
  d.context = 100;
  d.prefill_tokens = 10;
  d.chunked_prefill_size = 4;
  const Plan p = build_plan(cfg, d, Hardware::named("h200"));
  EXPECT_EQ(p.memory.indexer_bytes_per_token, 0);
  const LayerKindPlan& pre = kind_named(pass_named(p.prefill, "prefill"), "dense.none");
  // Each chunk expands the latent of its prefix and itself: 4 + 8 + 10 = 22 rows, 4 heads x (16 + 16).
  EXPECT_EQ(op_named(pre.ops, "kv_b_proj").flops, 2.0 * 22 * 32 * 4 * 32);
  EXPECT_EQ(op_named(pre.ops, "kv_b_proj").kv_read_bytes, 22.0 * 80);
  // Causal attention over 55 query-key pairs: scores of 24 values, sums of 16.
  EXPECT_EQ(op_named(pre.ops, "mha").flops, 2.0 * 4 * 55 * 24 + 2.0 * 4 * 55 * 16);
  for (const Op& o : pre.ops) EXPECT_NE(o.name.rfind("indexer", 0), 0u) << o.name;
  // Decode: dense MLA over the whole context, each request's cache read once.
  const LayerKindPlan& dec = kind_named(pass_named(p.decode, "decode"), "moe.none");
  EXPECT_EQ(op_named(dec.ops, "mla").flops, 2.0 * 4 * 2 * 100 * 40 + 2.0 * 4 * 2 * 100 * 32);
  EXPECT_EQ(op_named(dec.ops, "mla").kv_read_bytes, 2.0 * 100 * 80);
}

TEST(PlanFlags, BadLayoutsAreClearErrors) {
  const ModelConfig cfg = small_config();
  auto err = [&](auto mutate) -> std::string {
    Deployment d;
    mutate(d);
    try {
      build_plan(cfg, d, Hardware::named("h200"));
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err([](Deployment& d) {
              d.tp = 8;
              d.ep_size = 3;
            }).find("not divisible by --ep-size 3"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) {
              d.tp = 4;
              d.attn_dp_size = 3;
            }).find("not divisible by --attn-dp-size"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.tp = 8; }).find("num_attention_heads 4"), std::string::npos);
  EXPECT_NE(err([](Deployment& d) {
              d.tp = 16;
              d.attn_dp_size = 16;
              d.ep_size = 16;
            }).find("n_routed_experts 8"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) {
              d.tp = 2;
              d.moe_a2a_backend = A2aBackend::deepep;
            }).find("deepep"),
            std::string::npos);
  EXPECT_NE(
      err([](Deployment& d) { d.speculative_num_draft_tokens = 1; }).find("--speculative-num-draft-tokens"),
      std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.batch = 0; }).find("--batch"), std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.context = 5000; }).find("max_position_embeddings"), std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.mem_fraction_static = 1.5; }).find("--mem-fraction-static"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.chunked_prefill_size = 0; }).find("--chunked-prefill-size"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) {
              d.tp = 2;
              d.moe_dense_tp_size = 4;
            }).find("--moe-dense-tp-size"),
            std::string::npos);
  EXPECT_NE(err([](Deployment& d) { d.accept_length = 2; }).find("--accept-length"), std::string::npos);
  EXPECT_THROW(Hardware::named("a100"), Error);
}

TEST(PlanFlags, Fp8BlockConstrainsTheMoeSplit) {
  // 2048 / 32 = 64 columns per rank is not a multiple of the 128-wide weight block.
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const ModelConfig glm = ModelConfig::from_file(path);
  Deployment d;
  d.tp = 32;
  d.attn_dp_size = 32;
  d.moe_dense_tp_size = 1;
  try {
    build_plan(glm, d, Hardware::named("h200"));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FP8 weight block 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsaserve::plan
