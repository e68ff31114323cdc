// The activation workspace estimate and the memory split serve --device cuda sizes its KV pool with
// (runtime/engine/memory_plan.h): pure arithmetic over the real GLM-5.3 config and the serving options.
#include "runtime/engine/memory_plan.h"

#include <gtest/gtest.h>

#include "common/fixtures.h"
#include "kernels/ops.h"
#include "model/dummy_weights.h"

namespace dsaserve::runtime {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

model::ModelConfig glm53(const std::string& overrides = "") {
  return model::ModelConfig::load(testing::fixtures_dir() / "configs/glm-5.3.json", overrides);
}

// serve's defaults (cmd_serve.cpp, SchedulerConfig): 64 running, 16384 prefill tokens, chunks of 4096,
// the model's context (1M positions), CUDA graphs up to batch 256 (capped by the running batch).
StepLimits serve_defaults() {
  StepLimits l;
  l.cuda_graph_max_bs = 256;
  return l;
}

int64_t term(const WorkspaceEstimate& e, const std::string& prefix) {
  for (const WorkspaceTerm& t : e.step)
    if (t.name.rfind(prefix, 0) == 0) return t.bytes;
  return -1;
}

// The issue's start-up: an 8-layer FP8 slice of GLM-5.3 on an H200 with the default flags gives the KV
// pool at least 80% of the memory left after the weights (it refused before: a 160.73 GiB "workspace").
TEST(MemoryPlan, Glm53EightLayersOnAnH200GivesTheKvPoolMostOfTheMemory) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const model::ModelConfig c = glm53(R"({"num_hidden_layers": 8})");
  const int64_t weights = model::dummy_weight_bytes(c);
  const WorkspaceEstimate e = estimate_workspace(c, serve_defaults());
  EXPECT_EQ(e.step_tokens, 16384 + 64);
  EXPECT_EQ(e.chunk_tokens, 4096);
  // The H200 as torch reports it (plan/), the CUDA context and cuBLASLt taking ~1 GiB before the weights,
  // load's and warm-up's lasting data (RoPE tables, dequantised kv_b, expert tables) 0.5 GiB.
  const int64_t total = 150'109'880'320;
  const int64_t free_after_weights = total - weights - kGiB;
  const MemorySplit s =
      split_memory(weights, free_after_weights, free_after_weights - kGiB / 2, total, e.total());
  std::printf(
      "RESULT glm-5.3 x8 on an H200: weights %.2f GiB, free after them %.2f GiB, workspace %s, reserve "
      "%.2f GiB, KV %.2f GiB (%.1f%%)\n",
      double(weights) / kGiB, double(free_after_weights) / kGiB, e.describe().c_str(),
      double(s.reserve) / kGiB, double(s.kv_bytes) / kGiB, 100 * s.kv_share());
  for (const WorkspaceTerm& t : e.step)
    std::printf("  %-70s %8.3f GiB\n", t.name.c_str(), double(t.bytes) / kGiB);
  EXPECT_GE(s.kv_share(), 0.80);
  EXPECT_LT(e.total(), 24 * kGiB);
  EXPECT_GT(e.total(), 8 * kGiB);  // 16K tokens through 64 heads and 256 experts hold real memory
  EXPECT_EQ(e.peak_phase, "moe");
}

// The indexer's scores count the CUDA indexer's budget, not rows x context (16K rows x 1M keys would be
// 64 GiB); a context under index_topk has none.
TEST(MemoryPlan, IndexerScoresAreBoundedByTheSplitBudget) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const model::ModelConfig c = glm53(R"({"num_hidden_layers": 8})");
  const WorkspaceEstimate e = estimate_workspace(c, serve_defaults());
  StepLimits attn_only = serve_defaults();
  const int64_t scores = [&] {
    // The attention phase's terms are in `step` only when it is the peak: ask with a dense-only model.
    const model::ModelConfig d = glm53(R"({"num_hidden_layers": 3})");
    return term(estimate_workspace(d, attn_only), "indexer scores");
  }();
  EXPECT_GT(scores, kernels::kIndexerScoreBudgetBytes - 1);
  EXPECT_LE(scores, kernels::kIndexerScoreBudgetBytes + 4 * (int64_t(1) << 20));
  StepLimits short_ctx = serve_defaults();
  short_ctx.max_context = 2048;  // = index_topk: the indexer never runs
  EXPECT_LT(estimate_workspace(glm53(R"({"num_hidden_layers": 3})"), short_ctx).total(),
            estimate_workspace(glm53(R"({"num_hidden_layers": 3})"), serve_defaults()).total());
  EXPECT_EQ(term(estimate_workspace(glm53(R"({"num_hidden_layers": 3})"), short_ctx), "indexer scores"), -1);
  (void)e;
}

// It follows the scheduler's limits: more prefill tokens a step or more running requests hold more; the
// MHA form's per-head K/V of the whole context counts only when the form can be chosen; graphs add their
// pool only when on.
TEST(MemoryPlan, FollowsTheStepLimits) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const model::ModelConfig c = glm53(R"({"num_hidden_layers": 8})");
  const StepLimits base = serve_defaults();
  const WorkspaceEstimate b = estimate_workspace(c, base);
  StepLimits more = base;
  more.max_prefill_tokens = 32768;
  EXPECT_GT(estimate_workspace(c, more).step_bytes, b.step_bytes * 3 / 2);
  StepLimits fewer = base;
  fewer.max_prefill_tokens = 4096;
  EXPECT_LT(estimate_workspace(c, fewer).step_bytes, b.step_bytes / 3);
  StepLimits no_chunk = base;
  no_chunk.chunked_prefill_size = 0;  // a request's chunk is then the step's prefill budget
  EXPECT_EQ(estimate_workspace(c, no_chunk).chunk_tokens, 16384);
  StepLimits mha = base;
  mha.max_context = 131072;
  const WorkspaceEstimate automatic = estimate_workspace(c, mha);
  // Today's rates take the MHA form for dense chunks only: at most the top-k's 2,048 positions expanded, not
  // the whole context (the MoE phase stays the peak, so the estimate does not grow).
  EXPECT_EQ(mha_expand_context(c, mha.forward, 4096, 131072), 2048);
  EXPECT_EQ(automatic.peak_phase, "moe");
  model::ForwardOptions absorbed = mha.forward;
  absorbed.attention = model::AttentionForm::absorbed;
  EXPECT_EQ(mha_expand_context(c, absorbed, 4096, 131072), 0);
  mha.forward.attention = model::AttentionForm::mha;
  EXPECT_EQ(mha_expand_context(c, mha.forward, 4096, 131072), 131072);
  const WorkspaceEstimate forced = estimate_workspace(c, mha);
  EXPECT_EQ(forced.peak_phase, "attention");
  EXPECT_GE(term(forced, "MHA form: per-head K/V"), int64_t(131072) * 64 * (192 + 256) * 4);
  EXPECT_GT(forced.total(), automatic.total());
  StepLimits graphs_off = base;
  graphs_off.cuda_graph_max_bs = 0;
  EXPECT_EQ(estimate_workspace(c, graphs_off).graph_pool_bytes, 0);
  EXPECT_GT(b.graph_pool_bytes, int64_t(64) * c.vocab_size * 4);  // at least the graphs' logits
  EXPECT_LE(b.graph_pool_bytes, 4 * kGiB);
}

TEST(MemoryPlan, SplitWithAndWithoutMemFractionStatic) {
  const int64_t total = 100 * kGiB;
  const MemorySplit a = split_memory(20 * kGiB, 79 * kGiB, 78 * kGiB, total, 10 * kGiB);
  EXPECT_EQ(a.reserve, kGiB);  // max(1 GiB, 1% of 100 GiB)
  EXPECT_EQ(a.kv_bytes, 78 * kGiB - 10 * kGiB - kGiB);
  const MemorySplit f = split_memory(20 * kGiB, 79 * kGiB, 78 * kGiB, total, 10 * kGiB, 0.5);
  EXPECT_EQ(f.kv_bytes, 39 * kGiB - 10 * kGiB);
  EXPECT_LE(split_memory(0, kGiB, kGiB, total, 2 * kGiB).kv_bytes, 0);  // the caller refuses
}

}  // namespace
}  // namespace dsaserve::runtime
