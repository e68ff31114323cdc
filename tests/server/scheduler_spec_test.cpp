// The scheduler's speculative-decoding bookkeeping (issue 17), driven directly: a speculative decode
// reserves KV for the pending token and the drafts, commits them all, and accept_drafts keeps the accepted
// ones (the rest of the pages return to the pool), cuts the run at EOS, and an abort between commit and
// verdict leaks nothing.
#include <gtest/gtest.h>

#include "runtime/kv/kv_pool.h"
#include "runtime/radix/radix_cache.h"
#include "runtime/scheduler/scheduler.h"

namespace dsaserve::runtime {
namespace {

constexpr int64_t kV = 16;

std::vector<float> one_hot(int32_t t) {
  std::vector<float> l(size_t(kV), 0.0f);
  l[size_t(t)] = 1.0f;
  return l;
}

struct Rig {
  KvPool pool;
  RadixCache cache;
  Scheduler sched;
  std::vector<StepOutput> out;
  explicit Rig(int64_t steps)
      : pool([] {
          model::KvCache c;
          c.num_pages = 32;
          c.page_size = 4;
          return c;
        }()),
        cache(pool, true),
        sched(
            [&] {
              SchedulerConfig c;
              c.speculative_num_steps = steps;
              c.eos_token_ids = {1};
              return c;
            }(),
            pool, cache) {}
  int64_t used() const { return pool.num_pages() - pool.free_pages(); }
  // Adds a greedy speculative request and runs its prefill (sampling `first`).
  void start(uint64_t id, std::vector<int32_t> prompt, int32_t first) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->tokens = std::move(prompt);
    r->params.temperature = 0.0f;
    r->params.max_new_tokens = 20;
    r->speculate = true;
    sched.add(std::move(r), out);
    ScheduleBatch b = sched.schedule(out);
    ASSERT_EQ(b.items.size(), 1u);
    EXPECT_EQ(b.items[0].drafts, 0);
    sched.commit(b);
    sched.sampling_request(b, 0)->spec_hidden = Tensor::zeros({1, 4}, DType::f32);
    const auto l = one_hot(first);
    sched.process(b, l, kV, out);
  }
};

TEST(SchedulerSpec, ReserveCommitAcceptRollsBackAndCutsAtEos) {
  Rig g(3);
  g.start(7, {2, 3, 4, 5, 6}, 9);  // 5 prompt tokens + the pending 9
  const Request* r = g.sched.find(7);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->kv.len, 5);
  ScheduleBatch b = g.sched.schedule(g.out);
  ASSERT_EQ(b.items.size(), 1u);
  EXPECT_EQ(b.items[0].drafts, 3);
  EXPECT_EQ(r->kv.reserved, 5 + 4);  // the pending token and 3 drafts: 3 pages of 4
  EXPECT_EQ(g.used(), 3);
  g.sched.commit(b);
  EXPECT_EQ(r->kv.len, 9);
  g.out.clear();
  // One draft accepted + the target's token: the KV keeps the pending token and the draft (7 tokens, 2
  // pages).
  const std::vector<int32_t> run{10, 11};
  g.sched.accept_drafts(b.items[0], run, g.out);
  EXPECT_EQ(r->kv.len, 7);
  EXPECT_EQ(r->kv.reserved, 7);
  EXPECT_EQ(g.used(), 2);
  ASSERT_EQ(g.out.size(), 2u);
  EXPECT_EQ(g.out[0].token, 10);
  EXPECT_EQ(g.out[1].token, 11);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{2, 3, 4, 5, 6, 9, 10, 11}));
  g.sched.check_integrity();
  // Next round: EOS (1) inside the accepted run ends the request there; its pages go to the cache / pool.
  b = g.sched.schedule(g.out);
  ASSERT_EQ(b.items.size(), 1u);
  EXPECT_EQ(b.items[0].drafts, 3);
  g.sched.commit(b);
  g.out.clear();
  const std::vector<int32_t> run2{12, 1, 13, 14};
  g.sched.accept_drafts(b.items[0], run2, g.out);
  ASSERT_EQ(g.out.size(), 2u);
  EXPECT_EQ(g.out[1].token, 1);
  EXPECT_EQ(g.out[1].finish, FinishReason::stop);
  EXPECT_EQ(g.sched.find(7), nullptr);
  g.sched.check_integrity();
  EXPECT_EQ(g.used(), g.cache.cached_pages());
}

TEST(SchedulerSpec, AbortBetweenCommitAndVerdictLeaksNothing) {
  Rig g(5);
  g.start(3, {2, 3, 4, 5, 6, 7, 8}, 9);
  ScheduleBatch b = g.sched.schedule(g.out);
  ASSERT_EQ(b.items.size(), 1u);
  EXPECT_EQ(b.items[0].drafts, 5);
  g.sched.commit(b);
  EXPECT_TRUE(g.sched.abort(3, g.out));
  g.sched.accept_drafts(b.items[0], std::vector<int32_t>{10}, g.out);  // the request is gone: no-op
  g.sched.check_integrity();
  EXPECT_EQ(g.used(), g.cache.cached_pages());
  // Only the prompt's KV (7 tokens + the pending one: 2 full pages) went to the prefix cache, no draft's.
  EXPECT_EQ(g.cache.cached_pages(), 2);
}

TEST(SchedulerSpec, NoRoomForDraftsMeansAPlainDecode) {
  Rig g(3);
  g.start(1, std::vector<int32_t>(125, 2), 9);  // 125 tokens of the pool's 128
  // The pending token fits (126 tokens: 32 pages), the drafts would not (129): one token this step.
  ScheduleBatch b = g.sched.schedule(g.out);
  ASSERT_EQ(b.items.size(), 1u);
  EXPECT_EQ(b.items[0].drafts, 0);
  EXPECT_EQ(b.items[0].num_new, 1);
  EXPECT_EQ(g.sched.num_retractions(), 0);
}

}  // namespace
}  // namespace dsaserve::runtime
