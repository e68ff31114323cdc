// The host side of the speculative round's CUDA graphs (issue 17): verify keys (steps + 1 rows per
// request, uniform batches only), draft keys, padding of verify batches, the rule with rows per request,
// the memory plan's pools for them, and (on the CPU) that a padded, packed verify pass and a padded,
// packed MTP draft step compute the eager passes' logits and hidden states.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/model.h"
#include "model/step_plan.h"
#include "runtime/engine/cuda_graph_plan.h"
#include "runtime/engine/memory_plan.h"
#include "runtime/spec/spec_round.h"

namespace dsaserve::runtime {
namespace {

using model::ForwardBatch;

// Request r: cached[r] tokens in the cache, then `tokens` new ones (the round's verify rows when
// tokens > 1: pending + drafts, marked as prompt rows as draft_and_verify marks them); pages from
// page_base on, consecutive, one page reserved ahead.
ForwardBatch rows_batch(const std::vector<int64_t>& cached, int64_t tokens, int64_t ps = 64,
                        int32_t page_base = 10) {
  ForwardBatch b;
  b.page_size = ps;
  int32_t next = page_base;
  for (size_t r = 0; r < cached.size(); ++r) {
    const int64_t n_pages = (cached[r] + tokens + ps - 1) / ps + 1;
    std::vector<int32_t> pages;
    for (int64_t i = 0; i < n_pages; ++i) pages.push_back(next++);
    std::vector<int32_t> ids;
    for (int64_t j = 0; j < tokens; ++j) ids.push_back(int32_t(100 + r * 10 + j));
    b.add_request(ids, cached[r], pages, tokens == 1);
  }
  return b;
}

GraphPlan plan_of(int64_t max_bs, int64_t topk, int64_t ps) {
  GraphPlanConfig cfg;
  cfg.max_bs = max_bs;
  cfg.index_topk = topk;
  cfg.page_size = ps;
  return GraphPlan(cfg);
}

TEST(CudaGraphSpecPlan, VerifyKeysNeedAUniformBatch) {
  const GraphPlan plan = plan_of(8, 32, 64);
  // 3 requests of 4 rows: bucket 4, the longest 100 + 4 tokens -> context 128.
  auto k = spec_graph_key(rows_batch({5, 30, 100}, 4), 4, plan);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{4, 128, 4}));
  EXPECT_EQ(decode_input_layout(*k, 64).tokens, 16);
  EXPECT_EQ(decode_input_layout(*k, 64).seqs, 4);
  // Within top-k with the rows: the bucket that skips the indexer.
  k = spec_graph_key(rows_batch({5, 28}, 4), 4, plan);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{2, 32, 4}));
  EXPECT_EQ(spec_graph_key(rows_batch({5, 29}, 4), 4, plan)->ctx, 64) << "29 + 4 = 33 > top-k";
  // Rows per request other than the graphs': eager.
  EXPECT_FALSE(spec_graph_key(rows_batch({5, 30}, 3), 4, plan).has_value());
  ForwardBatch ragged = rows_batch({5}, 4);
  const std::vector<int32_t> three{1, 2, 3}, pages{50};
  ragged.add_request(three, 7, pages, false);
  EXPECT_FALSE(spec_graph_key(ragged, 4, plan).has_value()) << "a request of 3 rows in a 4-row batch";
  // More requests than the largest bucket, extra logits rows, rows beyond a page, too many cells.
  EXPECT_FALSE(spec_graph_key(rows_batch(std::vector<int64_t>(9, 10), 4), 4, plan).has_value());
  ForwardBatch extra = rows_batch({5}, 4);
  extra.extra_logit_rows = {0};
  EXPECT_FALSE(spec_graph_key(extra, 4, plan).has_value());
  EXPECT_FALSE(spec_graph_key(rows_batch({5}, 17, 16), 17, plan_of(8, 32, 16)).has_value());
  GraphPlanConfig small;
  small.max_bs = 8;
  small.index_topk = 32;
  small.max_ctx_cells = 4 * 4 * 128;  // bs x rows x ctx
  EXPECT_TRUE(spec_graph_key(rows_batch({5, 30, 100}, 4), 4, GraphPlan(small)).has_value());
  small.max_ctx_cells -= 1;
  EXPECT_FALSE(spec_graph_key(rows_batch({5, 30, 100}, 4), 4, GraphPlan(small)).has_value());
  // A batch of another page size than the plan's.
  EXPECT_FALSE(spec_graph_key(rows_batch({5}, 4, 16), 4, plan).has_value());
  // Draft steps: one token per request, the decode buckets.
  k = spec_graph_key(rows_batch({5, 30, 100}, 1), 1, plan);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{4, 128, 1}));
  EXPECT_EQ(*k, *decode_graph_key(rows_batch({5, 30, 100}, 1), plan));
}

TEST(CudaGraphSpecPlan, VerifyPaddingIsWholeRequestsOnTheScratchPage) {
  const int64_t ps = 64, K = 4;
  const ForwardBatch b = rows_batch({5, 70, 130}, K, ps, 10);
  const GraphKey k{4, 256, K};
  const int32_t scratch = 99;
  const ForwardBatch g = graph_batch(b, k, scratch);
  ASSERT_EQ(g.num_requests(), 4);
  EXPECT_TRUE(g.all_decoding()) << "every row a logits row (a verify step)";
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(g.num_new(r), K);
  // The padding request: K tokens 0 at positions 0 .. K - 1 on the scratch page.
  EXPECT_EQ(g.num_new(3), K);
  for (int64_t j = 0; j < K; ++j) {
    EXPECT_EQ(g.input_ids[size_t(3 * K + j)], 0);
    EXPECT_EQ(g.positions[size_t(3 * K + j)], j);
    EXPECT_EQ(g.out_cache_loc[size_t(3 * K + j)], scratch * ps + j);
  }
  const DecodeInputLayout L = decode_input_layout(k, ps);
  EXPECT_EQ(L.size(), 5 * 4 * K + 4 * 4);
  std::vector<int32_t> buf(size_t(L.size()), -7);
  pack_decode_inputs(b, k, scratch, buf);
  EXPECT_EQ(buf[size_t(L.row_len() + 0)], 6);  // request 0's first row sees its 5 cached keys and itself
  EXPECT_EQ(buf[size_t(L.row_len() + 3)], 9);
  EXPECT_EQ(buf[size_t(L.row_len() + 3 * K + K - 1)], K);
  EXPECT_EQ(buf[size_t(L.row_seq() + 3 * K)], 3);
  // The capture batch packs to the same layout; a ragged batch or rows beyond a page are refused.
  const ForwardBatch pad = padding_batch(k, scratch, ps);
  EXPECT_EQ(pad.num_tokens(), 4 * K);
  pad.validate(1024, 100);
  pack_decode_inputs(pad, k, scratch, buf);
  EXPECT_THROW(graph_batch(rows_batch({5}, 3, ps), k, scratch), Error);
  EXPECT_THROW(graph_batch(rows_batch({5}, 17, 16), GraphKey{1, 32, 17}, scratch), Error);
  // A decode graph still needs decoding requests (a one-token prompt chunk is not one).
  ForwardBatch chunk;
  chunk.page_size = ps;
  const int32_t t = 5, p = 3;
  chunk.add_request(std::span<const int32_t>(&t, 1), 10, std::span<const int32_t>(&p, 1), false);
  EXPECT_THROW(graph_batch(chunk, GraphKey{1, 32, 1}, scratch), Error);
}

// The rule with rows per request: the verify rows must take the absorbed form too.
TEST(CudaGraphSpecPlan, VerifyRowsMustTakeTheAbsorbedForm) {
  GraphSupport s;
  s.max_bs = 256;
  s.max_running_requests = 64;
  s.built = true;
  s.device = Device::cuda;
  s.kernel_format_cache = true;
  s.tokens = 6;
  EXPECT_EQ(cuda_graph_max_batch(s), 64);
  s.mha_min_tokens = 6;  // 6 rows would take the MHA form
  EXPECT_EQ(cuda_graph_max_batch(s), 0);
  s.attention = model::AttentionForm::absorbed;
  EXPECT_EQ(cuda_graph_max_batch(s), 64);
  s.tokens = 0;
  EXPECT_EQ(cuda_graph_max_batch(s), 0);
}

// The memory plan counts the verify and draft graphs' pools (and their static outputs) in place of the
// decode graphs' when speculation is on.
TEST(CudaGraphSpecPlan, MemoryPlanCountsTheVerifyAndDraftPools) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const model::ModelConfig c = model::ModelConfig::load(path, R"({"num_hidden_layers": 8})");
  StepLimits lim;
  lim.cuda_graph_max_bs = 64;
  const WorkspaceEstimate dec = estimate_workspace(c, lim);
  lim.speculative_num_steps = 3;
  const WorkspaceEstimate spec = estimate_workspace(c, lim);
  // At least the verify graphs' logits and hidden rows and the draft graphs' (64 requests).
  const int64_t outputs =
      64 * 4 * (c.vocab_size + c.hidden_size) * 4 + 64 * (c.vocab_size + 2 * c.hidden_size) * 4;
  EXPECT_GT(spec.graph_pool_bytes, outputs);
  EXPECT_GT(spec.graph_pool_bytes, dec.graph_pool_bytes);
  std::printf(
      "RESULT glm-5.3 x8 graph pools at batch 64: decode %.2f GiB, verify (4 rows) + draft %.2f GiB\n",
      double(dec.graph_pool_bytes) / double(int64_t(1) << 30),
      double(spec.graph_pool_bytes) / double(int64_t(1) << 30));
  EXPECT_LT(spec.graph_pool_bytes, 8 * (int64_t(1) << 30));
  EXPECT_EQ(spec.step_bytes, dec.step_bytes);
  lim.cuda_graph_max_bs = 0;
  EXPECT_EQ(estimate_workspace(c, lim).graph_pool_bytes, 0);
}

// What the graphs compute, on the CPU: the padded verify batch over the packed inputs (the pre-uploaded
// path of Model::forward at the bucket's capacity) gives the eager verify's logits and hidden rows, bit
// for bit, for its real requests; the same for an MTP draft step with padded hidden rows.
TEST(CudaGraphSpecPlan, PackedPaddedVerifyAndDraftEqualTheEagerPassesOnTheCpu) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = model::Model::load(dir, true);
  ASSERT_GT(m->num_mtp_layers(), 0);
  const model::ModelConfig& c = m->config();
  const int64_t ps = 16, V = c.vocab_size, H = c.hidden_size, K = 3;
  const std::vector<int64_t> cached = {4, 9, 25};  // tiny's index_topk is 12: both sides of it
  const int64_t per_req = 3, R = int64_t(cached.size()), pages = R * per_req + 1;
  const int32_t scratch = int32_t(pages - 1);
  std::vector<std::vector<int32_t>> tables(cached.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < per_req; ++i) tables[size_t(r)].push_back(int32_t(i * R + r));
  auto make = [&] {
    model::KvCache cache = m->make_cache(pages, ps);
    ForwardBatch pre;
    pre.page_size = ps;
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int32_t> ids;
      for (int64_t p = 0; p < cached[size_t(r)]; ++p) ids.push_back(int32_t((r * 31 + p * 7 + 1) % V));
      pre.add_request(ids, 0, tables[size_t(r)]);
    }
    model::ForwardOptions fo;
    fo.all_logits = false;
    (void)m->forward(pre, cache, fo);
    return cache;
  };
  model::KvCache ce = make(), cg = make();
  const GraphPlan gp = plan_of(8, c.index_topk, ps);
  auto expect_rows_equal = [](const Tensor& eager, const Tensor& graph, int64_t rows, const char* what) {
    ASSERT_GE(graph.size(0), rows) << what;
    const std::vector<float> e = eager.to_f32_vector(), g = graph.to_f32_vector();
    const int64_t n = eager.size(1);
    for (int64_t i = 0; i < rows * n; ++i)
      ASSERT_EQ(e[size_t(i)], g[size_t(i)]) << what << " row " << i / n << " col " << i % n;
  };
  // The graphs' path: the padded batch planned at the key's capacity, inputs packed and bound.
  auto graph_pass = [&](const ForwardBatch& b, const GraphKey& k, const Tensor& hidden_rows, bool mtp) {
    const ForwardBatch padded = graph_batch(b, k, scratch);
    model::ForwardOptions go;
    go.all_logits = false;
    go.keep_hidden = true;
    const model::StepCapacity cap = graph_capacity(k, ps);
    const model::StepPlan plan = m->plan_step(padded, go, &cap, mtp);
    const DecodeInputLayout L = decode_input_layout(k, ps);
    EXPECT_EQ(plan.layout, L);
    Tensor buf = Tensor::empty({L.size()}, DType::i32);
    pack_decode_inputs(b, k, scratch, std::span<int32_t>(buf.data<int32_t>(), size_t(L.size())));
    const model::StepInputs in = plan.bind(buf);
    go.plan = &plan;
    go.inputs = &in;
    return mtp ? m->forward_mtp(padded, hidden_rows, cg, go, 0) : m->forward(padded, cg, go);
  };

  // A draft step (one token per request at its last cached position + 1), fed random hidden rows.
  ForwardBatch db;
  db.page_size = ps;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t tok = int32_t(50 + r);
    db.add_request(std::span<const int32_t>(&tok, 1), cached[size_t(r)] - 1, tables[size_t(r)], true);
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> hv(size_t(4 * H));
  for (float& x : hv) x = nd(rng);
  const Tensor hidden4 = Tensor::from_vector(hv, {4, H});  // the static buffer: 3 rows + a padding row
  model::ForwardOptions mo;
  mo.all_logits = true;
  mo.keep_hidden = true;
  const model::ForwardOutput de = m->forward_mtp(db, hidden4.slice(0, 0, R), ce, mo, 0);
  const auto dk = spec_graph_key(db, 1, gp);
  ASSERT_TRUE(dk.has_value());
  EXPECT_EQ(*dk, (GraphKey{4, 32, 1}));
  const model::ForwardOutput dg = graph_pass(db, *dk, hidden4, true);
  ASSERT_EQ(dg.logits.size(0), 4);
  expect_rows_equal(de.logits, dg.logits, R, "draft logits");
  expect_rows_equal(de.hidden, dg.hidden, R, "draft hidden");

  // The verify pass as draft_and_verify builds it: K rows per request after its cached tokens.
  ForwardBatch vb;
  vb.page_size = ps;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<int32_t> ids;
    for (int64_t j = 0; j < K; ++j) ids.push_back(int32_t((60 + r * 5 + j) % V));
    vb.add_request(ids, cached[size_t(r)], tables[size_t(r)], false);
  }
  model::ForwardOptions vo;
  vo.all_logits = true;
  vo.keep_hidden = true;
  const model::ForwardOutput ve = m->forward(vb, ce, vo);
  const auto vk = spec_graph_key(vb, K, gp);
  ASSERT_TRUE(vk.has_value());
  EXPECT_EQ(*vk, (GraphKey{4, 32, K}));
  const model::ForwardOutput vg = graph_pass(vb, *vk, Tensor(), false);
  ASSERT_EQ(vg.logits.size(0), 4 * K);
  ASSERT_EQ(vg.logits.size(1), V);
  expect_rows_equal(ve.logits, vg.logits, R * K, "verify logits");
  expect_rows_equal(ve.hidden, vg.hidden, R * K, "verify hidden");
  // Only the scratch page differs between the two caches (the same KV written at the requests' slots).
  for (size_t l = 0; l < ce.kv.size(); ++l) {
    const std::vector<float> a = ce.kv[l].to_f32_vector(), b = cg.kv[l].to_f32_vector();
    const int64_t row = ce.kv[l].size(1);
    for (int64_t slot = 0; slot < (pages - 1) * ps; ++slot)
      for (int64_t j = 0; j < row; ++j)
        ASSERT_EQ(a[size_t(slot * row + j)], b[size_t(slot * row + j)]) << "layer " << l << " slot " << slot;
  }
}

// The round's seam (SpecGraphs, runtime/spec/spec_round.h) with the graphs' host path on the CPU: each
// draft step and the verify run padded to their bucket, planned at its capacity over packed inputs (what a
// replay runs), and only the real rows come back. The round's verdict (runs, accepted drafts, hidden rows
// for the next round) equals the eager round's, with drafts accepted and rejected (an oracle drafter).
class PackedPasses final : public SpecGraphs {
 public:
  PackedPasses(const model::Model& m, model::KvCache& cache, int32_t scratch, int64_t steps)
      : m_(m), cache_(cache), scratch_(scratch), steps_(steps) {
    GraphPlanConfig cfg;
    cfg.max_bs = 8;
    cfg.index_topk = m.config().index_topk;
    cfg.page_size = cache.page_size;
    plan_ = GraphPlan(cfg);
  }
  std::optional<model::ForwardOutput> draft(const ForwardBatch& mb, const Tensor& hidden) override {
    const auto k = spec_graph_key(mb, 1, plan_);
    if (!k) return std::nullopt;
    ++drafts;
    Tensor h = Tensor::zeros({k->bs, hidden.size(1)}, DType::f32);
    Tensor dst = h.slice(0, 0, hidden.size(0));
    m_.ops().copy_rows(dst, hidden);
    return run(mb, *k, h, true);
  }
  std::optional<model::ForwardOutput> verify(const ForwardBatch& fb) override {
    const auto k = spec_graph_key(fb, steps_ + 1, plan_);
    if (!k) return std::nullopt;
    ++verifies;
    return run(fb, *k, Tensor(), false);
  }
  int64_t drafts = 0, verifies = 0;

 private:
  model::ForwardOutput run(const ForwardBatch& b, const GraphKey& k, const Tensor& hidden, bool mtp) {
    const ForwardBatch padded = graph_batch(b, k, scratch_);
    model::ForwardOptions go;
    go.all_logits = false;
    go.keep_hidden = true;
    const model::StepCapacity cap = graph_capacity(k, b.page_size);
    const model::StepPlan plan = m_.plan_step(padded, go, &cap, mtp);
    const DecodeInputLayout L = decode_input_layout(k, b.page_size);
    Tensor buf = Tensor::empty({L.size()}, DType::i32);
    pack_decode_inputs(b, k, scratch_, std::span<int32_t>(buf.data<int32_t>(), size_t(L.size())));
    const model::StepInputs in = plan.bind(buf);
    go.plan = &plan;
    go.inputs = &in;
    model::ForwardOutput o =
        mtp ? m_.forward_mtp(padded, hidden, cache_, go, 0) : m_.forward(padded, cache_, go);
    const int64_t rows = b.num_tokens();
    o.logits = o.logits.slice(0, 0, rows);
    o.hidden = o.hidden.slice(0, 0, rows);
    return o;
  }
  const model::Model& m_;
  model::KvCache& cache_;
  int32_t scratch_;
  int64_t steps_;
  GraphPlan plan_;
};

TEST(CudaGraphSpecPlan, RoundThroughPackedPassesEqualsTheEagerRoundOnTheCpu) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = model::Model::load(dir, true);
  const int64_t ps = 16, V = m->config().vocab_size, H = m->config().hidden_size, N = 3;
  const std::vector<int64_t> lens = {5, 10, 22};
  const int64_t per_req = 3, R = int64_t(lens.size()), pages = R * per_req + 1;
  std::vector<std::vector<int32_t>> tables(lens.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < per_req; ++i) tables[size_t(r)].push_back(int32_t(i * R + r));
  // Each request's prompt prefilled (target KV) and its last hidden row (the first draft's input).
  auto make = [&](std::vector<Tensor>& hidden) {
    model::KvCache cache = m->make_cache(pages, ps);
    for (int64_t r = 0; r < R; ++r) {
      ForwardBatch pre;
      pre.page_size = ps;
      std::vector<int32_t> ids;
      for (int64_t p = 0; p < lens[size_t(r)]; ++p) ids.push_back(int32_t((r * 31 + p * 7 + 1) % V));
      pre.add_request(ids, 0, tables[size_t(r)]);
      model::ForwardOptions fo;
      fo.all_logits = false;
      fo.keep_hidden = true;
      const model::ForwardOutput o = m->forward(pre, cache, fo);
      hidden.push_back(o.hidden.slice(0, lens[size_t(r)] - 1, lens[size_t(r)]));
    }
    return cache;
  };
  std::vector<Tensor> he, hg;
  model::KvCache ce = make(he), cg = make(hg);
  auto slots_of = [&](const std::vector<Tensor>& hidden) {
    std::vector<SpecSlot> slots;
    for (int64_t r = 0; r < R; ++r)
      slots.push_back({uint64_t(r), int32_t(40 + r), lens[size_t(r)], tables[size_t(r)], hidden[size_t(r)]});
    return slots;
  };
  // The drafter: token 7 (the target rarely agrees), except where planted: the first draft of requests 1
  // and 2 is the target's greedy choice (found by a first eager round; rewriting the same positions is
  // deterministic), so those drafts are accepted and the rest of their runs judged.
  std::map<std::pair<uint64_t, int64_t>, int32_t> plant;
  const DraftHook hook = [&](uint64_t key, int64_t index, int32_t) {
    const auto it = plant.find({key, index});
    return it != plant.end() ? it->second : 7;
  };
  model::ForwardOptions fo;
  fo.all_logits = false;
  const SpecVerdict e0 = draft_and_verify(*m, ce, fo, N, slots_of(he), hook);
  for (int64_t r : {1, 2}) plant[{uint64_t(r), lens[size_t(r)] + 1}] = e0.run[size_t(r)][0];
  const SpecVerdict e = draft_and_verify(*m, ce, fo, N, slots_of(he), hook);
  EXPECT_GE(e.accepted[1], 1);
  EXPECT_GE(e.accepted[2], 1);
  PackedPasses passes(*m, cg, int32_t(pages - 1), N);
  const SpecVerdict g = draft_and_verify(*m, cg, fo, N, slots_of(hg), hook, {}, &passes);
  EXPECT_EQ(passes.drafts, N);
  EXPECT_EQ(passes.verifies, 1);
  EXPECT_EQ(g.run, e.run);
  EXPECT_EQ(g.accepted, e.accepted);
  ASSERT_EQ(g.hidden.size(0), R * (N + 1));
  ASSERT_EQ(g.hidden.size(1), H);
  EXPECT_EQ(g.hidden.to_f32_vector(), e.hidden.to_f32_vector());
  for (size_t r = 0; r < size_t(R); ++r)
    EXPECT_EQ(next_hidden(g, N, r).to_f32_vector(), next_hidden(e, N, r).to_f32_vector());
}

}  // namespace
}  // namespace dsaserve::runtime
