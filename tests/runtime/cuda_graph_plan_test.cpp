// The host side of CUDA-graph decode steps: bucket choice, eligibility, padding and input packing, and
// (on the CPU) that a padded, packed step computes the eager step's logits.
#include "runtime/engine/cuda_graph_plan.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/model.h"
#include "model/step_plan.h"

namespace dsaserve::runtime {
namespace {

using model::ForwardBatch;

// A decode batch: request r has lens[r] - 1 cached tokens and decodes one more; its pages start at
// first_page[r] and are consecutive.
ForwardBatch decode_batch(const std::vector<int64_t>& lens, int64_t ps = 64, int32_t page_base = 10) {
  ForwardBatch b;
  b.page_size = ps;
  int32_t next = page_base;
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t n_pages = (lens[r] + ps - 1) / ps + 1;  // one page reserved ahead
    std::vector<int32_t> pages;
    for (int64_t i = 0; i < n_pages; ++i) pages.push_back(next++);
    const int32_t tok = int32_t(100 + r);
    b.add_request(std::span<const int32_t>(&tok, 1), lens[r] - 1, pages, true);
  }
  return b;
}

TEST(CudaGraphPlan, BatchBuckets) {
  EXPECT_EQ(batch_buckets(256), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256}));
  EXPECT_EQ(batch_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(batch_buckets(48), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 48}));
  EXPECT_TRUE(batch_buckets(0).empty());
  const std::vector<int64_t> b = batch_buckets(256);
  EXPECT_EQ(batch_bucket(1, b), 1);
  EXPECT_EQ(batch_bucket(3, b), 4);
  EXPECT_EQ(batch_bucket(8, b), 8);
  EXPECT_EQ(batch_bucket(33, b), 64);
  EXPECT_EQ(batch_bucket(256, b), 256);
  EXPECT_EQ(batch_bucket(257, b), 0);
  // A plan builds its buckets once, from its max_bs.
  GraphPlanConfig cfg;
  cfg.max_bs = 48;
  const GraphPlan plan(cfg);
  EXPECT_EQ(std::vector<int64_t>(plan.buckets().begin(), plan.buckets().end()), batch_buckets(48));
  EXPECT_EQ(plan.config().max_bs, 48);
  EXPECT_TRUE(GraphPlan(GraphPlanConfig{.max_bs = 0}).buckets().empty());
}

TEST(CudaGraphPlan, ContextBuckets) {
  // With an indexer (top-32): one bucket for every batch that skips it, powers of two above.
  EXPECT_EQ(context_bucket(1, 32, 64), 32);
  EXPECT_EQ(context_bucket(32, 32, 64), 32);
  EXPECT_EQ(context_bucket(33, 32, 64), 64);
  EXPECT_EQ(context_bucket(64, 32, 64), 64);
  EXPECT_EQ(context_bucket(65, 32, 64), 128);
  EXPECT_EQ(context_bucket(2049, 32, 64), 4096);
  // Top-2048 (GLM-5.x): 2048 or less skips the indexer; 2049 needs 4096.
  EXPECT_EQ(context_bucket(2048, 2048, 64), 2048);
  EXPECT_EQ(context_bucket(2049, 2048, 64), 4096);
  // Every bucket above index_topk stays above it (same branch as the eager forward).
  for (int64_t len = 33; len < 5000; ++len) EXPECT_GT(context_bucket(len, 32, 64), 32) << len;
  // No indexer: powers of two of at least a page.
  EXPECT_EQ(context_bucket(1, 0, 64), 64);
  EXPECT_EQ(context_bucket(100, 0, 64), 128);
  EXPECT_EQ(pages_for_ctx(32, 64), 1);
  EXPECT_EQ(pages_for_ctx(4096, 64), 64);
  EXPECT_THROW(context_bucket(0, 32, 64), Error);
}

TEST(CudaGraphPlan, OnlyPureDecodeBatchesReplay) {
  GraphPlanConfig cfg;
  cfg.max_bs = 8;
  cfg.index_topk = 32;
  // Ragged decode of 3 requests on both sides of top-k: bucket 4, context 128 (longest 100).
  auto k = decode_graph_key(decode_batch({5, 32, 100}), GraphPlan(cfg));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{4, 128}));
  k = decode_graph_key(decode_batch({5, 32}), GraphPlan(cfg));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{2, 32}));
  // Too many requests for max_bs 8.
  EXPECT_FALSE(decode_graph_key(decode_batch(std::vector<int64_t>(9, 10)), GraphPlan(cfg)).has_value());
  // A prefill (several new tokens), and a one-token prompt chunk (not decoding): eager.
  ForwardBatch p;
  const std::vector<int32_t> toks = {1, 2, 3}, pages = {0};
  p.add_request(toks, 0, pages);
  EXPECT_FALSE(decode_graph_key(p, GraphPlan(cfg)).has_value());
  ForwardBatch chunk;
  chunk.add_request(std::span<const int32_t>(toks.data(), 1), 5, pages, false);
  EXPECT_FALSE(decode_graph_key(chunk, GraphPlan(cfg)).has_value());
  // A decode mixed with a prefill: eager.
  ForwardBatch mixed = decode_batch({10});
  mixed.add_request(toks, 0, std::vector<int32_t>{1});
  EXPECT_FALSE(decode_graph_key(mixed, GraphPlan(cfg)).has_value());
  // Graphs off, and contexts past the cell limit.
  cfg.max_bs = 0;
  EXPECT_FALSE(decode_graph_key(decode_batch({5}), GraphPlan(cfg)).has_value());
  cfg.max_bs = 8;
  cfg.max_ctx_cells = 4 * 128;
  EXPECT_TRUE(decode_graph_key(decode_batch({5, 32, 100}), GraphPlan(cfg)).has_value());
  EXPECT_FALSE(decode_graph_key(decode_batch({5, 32, 129}), GraphPlan(cfg)).has_value());
}

// The one rule serve, the engine and the runner follow: a CUDA build, the model on CUDA, a kernel-format
// cache and absorbed decode tokens; the largest batch capped by --max-running-requests.
TEST(CudaGraphPlan, OneRuleDecidesWhetherGraphsRun) {
  GraphSupport s;
  s.max_bs = 256;
  s.max_running_requests = 64;
  s.built = true;
  s.device = Device::cuda;
  s.kernel_format_cache = true;
  EXPECT_EQ(cuda_graph_max_batch(s), 64);
  s.max_running_requests = 0;  // no limit
  EXPECT_EQ(cuda_graph_max_batch(s), 256);
  auto off = [&](auto change) {
    GraphSupport t = s;
    change(t);
    return cuda_graph_max_batch(t) == 0;
  };
  EXPECT_TRUE(off([](GraphSupport& t) { t.max_bs = 0; }));
  EXPECT_TRUE(off([](GraphSupport& t) { t.built = false; }));
  EXPECT_TRUE(off([](GraphSupport& t) { t.device = Device::cpu; }));
  EXPECT_TRUE(off([](GraphSupport& t) { t.kernel_format_cache = false; }));
  EXPECT_TRUE(off([](GraphSupport& t) { t.attention = model::AttentionForm::mha; }));
  EXPECT_TRUE(off([](GraphSupport& t) { t.mha_min_tokens = 1; }));
  EXPECT_FALSE(off([](GraphSupport& t) { t.attention = model::AttentionForm::absorbed; }));
  // From a model: a CPU model never replays graphs, whatever its flags.
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = model::Model::load(dir, false);
  const GraphSupport g = graph_support(*m, std::nullopt, model::ForwardOptions{}, 256, 64, true);
  EXPECT_EQ(g.device, Device::cpu);
  EXPECT_FALSE(g.kernel_format_cache);
  EXPECT_EQ(cuda_graph_max_batch(g), 0);
}

TEST(CudaGraphPlan, PacksRequestsThenPadding) {
  const int64_t ps = 64;
  const ForwardBatch b = decode_batch({5, 70, 130}, ps, 10);  // pages 10-11, 12-14, 15-18
  const GraphKey k{4, 256};
  const DecodeInputLayout L = decode_input_layout(k, ps);
  EXPECT_EQ(L.pages, 4);
  EXPECT_EQ(L.size(), 5 * 4 + 4 * 4);
  std::vector<int32_t> buf(size_t(L.size()), -7);
  const int32_t scratch = 99;
  pack_decode_inputs(b, k, scratch, buf);
  auto at = [&](int64_t off, int64_t i) { return buf[size_t(off + i)]; };
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(at(L.ids(), r), b.input_ids[size_t(r)]);
    EXPECT_EQ(at(L.positions(), r), b.positions[size_t(r)]);
    EXPECT_EQ(at(L.slots(), r), b.out_cache_loc[size_t(r)]);
    EXPECT_EQ(at(L.row_seq(), r), r);
  }
  EXPECT_EQ(at(L.row_len(), 0), 5);
  EXPECT_EQ(at(L.row_len(), 1), 70);
  EXPECT_EQ(at(L.row_len(), 2), 130);
  // Used pages, then the last used page repeated (never a page the request does not own).
  EXPECT_EQ(std::vector<int32_t>(buf.begin() + L.page_table(), buf.begin() + L.page_table() + 12),
            (std::vector<int32_t>{10, 10, 10, 10, 12, 13, 13, 13, 15, 16, 17, 17}));
  // The padding row: token 0 at position 0 on the scratch page's first slot, one visible key.
  EXPECT_EQ(at(L.ids(), 3), 0);
  EXPECT_EQ(at(L.positions(), 3), 0);
  EXPECT_EQ(at(L.slots(), 3), scratch * ps);
  EXPECT_EQ(at(L.row_seq(), 3), 3);
  EXPECT_EQ(at(L.row_len(), 3), 1);
  for (int64_t j = 0; j < L.pages; ++j) EXPECT_EQ(at(L.page_table(), 3 * L.pages + j), scratch);
  // The padding batch packs to the same padding rows.
  const ForwardBatch pad = padding_batch(k, scratch, ps);
  EXPECT_EQ(pad.num_requests(), 4);
  EXPECT_TRUE(pad.all_decoding());
  std::vector<int32_t> buf2(size_t(L.size()));
  pack_decode_inputs(pad, k, scratch, buf2);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(buf2[size_t(L.slots() + r)], scratch * ps);
    EXPECT_EQ(buf2[size_t(L.row_len() + r)], 1);
  }
  pad.validate(1024, 100);
  // A request longer than the graph's context, or a buffer too small: errors.
  EXPECT_THROW(pack_decode_inputs(b, GraphKey{4, 128}, scratch, buf), Error);
  std::vector<int32_t> small(4);
  EXPECT_THROW(pack_decode_inputs(b, k, scratch, small), Error);
  EXPECT_THROW(pack_decode_inputs(decode_batch({5, 5, 5, 5, 5}), k, scratch, buf), Error);
}

// What a graph computes, on the CPU: the forward of the padded batch over the packed inputs (the
// pre-uploaded path of Model::forward, context capacity = the bucket) gives the eager step's logits in its
// first B rows, bit for bit, and its padding rows write only the scratch page.
TEST(CudaGraphPlan, PackedPaddedStepEqualsTheEagerStepOnTheCpu) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = model::Model::load(dir, false);
  const model::ModelConfig& c = m->config();
  ASSERT_GT(c.index_topk, 0);
  const int64_t ps = 16, V = c.vocab_size;
  // Three requests on both sides of index_topk (tiny: 12), pages interleaved; the last page is scratch.
  const std::vector<int64_t> cached = {4, 11, 29};
  const int64_t per_req = 3, R = int64_t(cached.size()), pages = R * per_req + 1;
  const int32_t scratch = int32_t(pages - 1);
  model::KvCache cache = m->make_cache(pages, ps);
  std::vector<std::vector<int32_t>> tables(cached.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < per_req; ++i) tables[size_t(r)].push_back(int32_t(i * R + r));
  model::ForwardOptions fo;
  fo.all_logits = false;
  {
    ForwardBatch pre;
    pre.page_size = ps;
    for (int64_t r = 0; r < R; ++r) {
      std::vector<int32_t> ids;
      for (int64_t p = 0; p < cached[size_t(r)]; ++p) ids.push_back(int32_t((r * 31 + p * 7 + 1) % V));
      pre.add_request(ids, 0, tables[size_t(r)]);
    }
    (void)m->forward(pre, cache, fo);
  }
  ForwardBatch b;
  b.page_size = ps;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t tok = int32_t(100 + r);
    b.add_request(std::span<const int32_t>(&tok, 1), cached[size_t(r)], tables[size_t(r)], true);
  }
  const Tensor eager = m->forward(b, cache, fo).logits;  // [3, V]
  GraphPlanConfig cfg;
  cfg.max_bs = 8;
  cfg.index_topk = c.index_topk;
  cfg.page_size = ps;
  const auto k = decode_graph_key(b, GraphPlan(cfg));
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(*k, (GraphKey{4, 32}));
  const DecodeInputLayout L = decode_input_layout(*k, ps);
  Tensor buf = Tensor::empty({L.size()}, DType::i32);
  pack_decode_inputs(b, *k, scratch, std::span<int32_t>(buf.data<int32_t>(), size_t(L.size())));
  // The batch the graph stands for: the requests, then a padding row (what padding_batch holds), planned
  // at the graph's capacity and bound to the packed buffer (the graph's static inputs).
  const ForwardBatch padded = graph_batch(b, *k, scratch);
  EXPECT_EQ(padded.num_requests(), 4);
  const model::StepCapacity cap = graph_capacity(*k, ps);
  const model::StepPlan plan = m->plan_step(padded, fo, &cap);
  EXPECT_EQ(plan.layout, L);
  EXPECT_EQ(plan.max_len, k->ctx);
  EXPECT_EQ(plan.kind, model::StepKind::decode);
  std::vector<int32_t> again(size_t(L.size()));
  plan.pack(again);
  EXPECT_EQ(again, std::vector<int32_t>(buf.data<int32_t>(), buf.data<int32_t>() + L.size()));
  const model::StepInputs in = plan.bind(buf);
  // Other pages must not change: remember one of a request's pages in the first layer's cache.
  const std::vector<float> before = cache.kv[0].to_f32_vector();
  model::ForwardOptions go = fo;
  go.plan = &plan;
  go.inputs = &in;
  const Tensor graph = m->forward(padded, cache, go).logits;  // [4, V]
  ASSERT_EQ(graph.size(0), 4);
  const std::vector<float> e = eager.to_f32_vector(), g = graph.to_f32_vector();
  for (int64_t i = 0; i < R * V; ++i)
    ASSERT_EQ(e[size_t(i)], g[size_t(i)]) << "row " << i / V << " col " << i % V;
  // Only the scratch page changed (the requests' new tokens were rewritten with the same values).
  const std::vector<float> after = cache.kv[0].to_f32_vector();
  const int64_t row = cache.kv[0].size(1);
  for (int64_t slot = 0; slot < (pages - 1) * ps; ++slot) {
    for (int64_t j = 0; j < row; ++j)
      ASSERT_EQ(before[size_t(slot * row + j)], after[size_t(slot * row + j)]) << "slot " << slot;
  }
  // A capacity below the batch's longest request is refused, and so is a plan of another batch.
  const model::StepCapacity small{16, 1};
  EXPECT_THROW((void)m->plan_step(padded, fo, &small), Error);
  EXPECT_THROW((void)m->forward(b, cache, go), Error);
}

}  // namespace
}  // namespace dsaserve::runtime
