// The Engine with speculative decoding (EngineConfig::speculative): greedy outputs equal the engine's
// without speculation, token for token, on the fixture models, 8 concurrent requests, steps 1 / 3 / 5,
// chunked prefill, small pages, with the MTP layer's drafts and with an oracle drafter (so that drafts are
// accepted and rolled back); a prefix-cache hit, retraction on a small pool, aborts mid-run (no page
// leaks, integrity checked every step) and seeded sampled requests (they speculate and reproduce).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "common/fixtures.h"
#include "model/model.h"
#include "runtime/engine/engine.h"

namespace dsaserve::runtime {
namespace {

struct Case {
  std::vector<std::vector<int32_t>> prompts;
  int64_t max_new = 14;
};

Case make_case(int64_t n, int64_t vocab, int64_t max_new = 14) {
  Case c;
  c.max_new = max_new;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> p;
    for (int64_t t = 0; t < 4 + 6 * i; ++t) p.push_back(int32_t((13 * i + 29 * t + 3) % vocab));
    c.prompts.push_back(std::move(p));
  }
  return c;
}

EngineConfig base_config(int64_t kv_pages = 256) {
  EngineConfig ec;
  ec.kv_pages = kv_pages;
  ec.page_size = 4;
  ec.scheduler.chunked_prefill_size = 5;
  ec.check_integrity = true;
  return ec;
}

SpeculativeConfig eagle(int64_t steps) {
  SpeculativeConfig c;
  c.algorithm = "EAGLE";
  c.num_steps = steps;
  return c;
}

// Runs the requests (ids 0..n-1; greedy unless `temperature`) to completion; `abort_after`: aborts the odd
// ids after that many steps. Returns the tokens per id.
std::map<uint64_t, std::vector<int32_t>> run(Engine& engine, const Case& c, float temperature = 0.0f,
                                             int64_t abort_after = -1, bool one_by_one = false) {
  std::map<uint64_t, std::vector<int32_t>> out;
  std::vector<StepOutput> outs;
  auto drain = [&] {
    engine.wait_outputs(outs, std::chrono::milliseconds(0));
    for (const StepOutput& o : outs) {
      EXPECT_NE(o.finish, FinishReason::error) << o.error;
      if (o.token >= 0) out[o.id].push_back(o.token);
    }
    outs.clear();
  };
  for (size_t i = 0; i < c.prompts.size(); ++i) {
    GenerateRequest g;
    g.id = i;
    g.prompt = c.prompts[i];
    g.params.max_new_tokens = c.max_new;
    g.params.ignore_eos = true;
    g.params.temperature = temperature;
    g.params.seed = 100 + i;
    engine.submit(std::move(g));
    if (one_by_one) {
      while (engine.step()) drain();
    }
  }
  for (int64_t steps = 0; engine.step(); ++steps) {
    if (steps == abort_after) {
      for (size_t i = 1; i < c.prompts.size(); i += 2) engine.abort(i);
    }
    drain();
  }
  drain();
  return out;
}

void expect_no_leak(const Engine& e) {
  e.scheduler().check_integrity();
  EXPECT_EQ(e.pool().num_pages() - e.pool().free_pages(), e.cache().cached_pages());
  EXPECT_EQ(e.scheduler().num_running(), 0);
}

TEST(EngineSpec, GreedyEqualsNonSpeculative) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const std::shared_ptr<const model::Model> m = model::Model::load(models / name, true);
    const int64_t V = m->config().vocab_size;
    const Case c = make_case(8, V);
    Engine plain(m, base_config());
    const auto want = run(plain, c);
    for (int64_t steps : {1, 3, 5}) {
      for (bool oracle : {false, true}) {
        EngineConfig ec = base_config();
        ec.speculative = eagle(steps);
        if (oracle) {
          ec.spec_draft_hook = [&](uint64_t id, int64_t index, int32_t proposed) -> int32_t {
            const int64_t o = index - int64_t(c.prompts[id].size());
            const auto& w = want.at(id);
            if (o < 0 || o >= int64_t(w.size())) return proposed;
            return index % 5 == 2 ? int32_t((w[size_t(o)] + 1) % V) : w[size_t(o)];
          };
        }
        Engine spec(m, ec);
        const auto got = run(spec, c);
        EXPECT_EQ(got, want) << name << " steps " << steps << (oracle ? " oracle" : " mtp");
        expect_no_leak(spec);
        const EngineStats st = spec.stats();
        EXPECT_GT(st.spec_rounds, 0);
        EXPECT_EQ(st.spec_drafted_tokens, st.spec_rounds * steps);
        if (oracle && steps > 1) {
          EXPECT_GT(st.spec_accepted_tokens, st.spec_rounds / 2) << name;
        }
        fmt::print("engine accept {} steps={} {}: mean {:.3f} ({} accepted / {} drafted, {} rounds)\n", name,
                   steps, oracle ? "oracle" : "mtp",
                   1.0 + double(st.spec_accepted_tokens) / double(std::max<int64_t>(1, st.spec_rounds)),
                   st.spec_accepted_tokens, st.spec_drafted_tokens, st.spec_rounds);
      }
    }
  }
}

TEST(EngineSpec, PrefixHitRetractionAbortsAndSampling) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  const int64_t V = m->config().vocab_size;
  // A prefix-cache hit: the same prompts again, one after the other (the second run hits the cache).
  Case c = make_case(4, V);
  c.prompts.push_back(c.prompts[3]);
  Engine plain(m, base_config());
  const auto want = run(plain, c, 0.0f, -1, true);
  EngineConfig ec = base_config();
  ec.speculative = eagle(3);
  {
    Engine spec(m, ec);
    EXPECT_EQ(run(spec, c, 0.0f, -1, true), want);
    EXPECT_GT(spec.stats().prefix_hit_tokens, 0);
    expect_no_leak(spec);
  }
  // Retraction: 8 requests of 40 tokens on a pool that cannot hold them all.
  const Case big = make_case(8, V, 40);
  Engine plain_big(m, base_config(256));
  const auto want_big = run(plain_big, big);
  {
    EngineConfig small = base_config(40);
    small.speculative = eagle(3);
    Engine spec(m, small);
    EXPECT_EQ(run(spec, big), want_big);
    EXPECT_GT(spec.stats().retractions, 0);
    expect_no_leak(spec);
  }
  // Aborts while rounds run: the others still match; no page is lost.
  {
    Engine spec(m, ec);
    const auto got = run(spec, big, 0.0f, 3);
    for (size_t i = 0; i < big.prompts.size(); i += 2) EXPECT_EQ(got.at(i), want_big.at(i)) << i;
    for (size_t i = 1; i < big.prompts.size(); i += 2) {
      EXPECT_LT(got.count(i) ? got.at(i).size() : 0, size_t(big.max_new)) << i;
    }
    expect_no_leak(spec);
  }
  // Sampled requests speculate (their distribution: engine_spec_sampling_test.cpp); seeded ones reproduce.
  {
    Engine a(m, ec), b(m, ec);
    const auto got = run(a, c, 1.0f);
    EXPECT_EQ(run(b, c, 1.0f), got);
    EXPECT_GT(a.stats().spec_rounds, 0);
    for (const auto& [id, toks] : got) EXPECT_EQ(toks.size(), size_t(c.max_new)) << id;
    expect_no_leak(a);
  }
}

// Aborts that arrive while a round is in flight (issue 17): the drafter aborts odd requests from inside
// the draft pass (the abort is queued while the round's KV is committed and applied at the next step),
// and, with the engine thread running, another thread aborts requests at random moments while sampled and
// greedy rounds run. Integrity is checked after every step; afterwards every page is free or cached.
TEST(EngineSpec, AbortsMidRoundLeakNoPage) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  const int64_t V = m->config().vocab_size;
  const Case c = make_case(8, V, 30);
  for (float temperature : {0.0f, 1.0f}) {
    EngineConfig ec = base_config(96);
    ec.speculative = eagle(3);
    Engine* self = nullptr;
    int64_t aborted = 0;
    ec.spec_draft_hook = [&](uint64_t id, int64_t index, int32_t proposed) {
      if (id % 2 == 1 && index == int64_t(c.prompts[id].size()) + 6) {
        self->abort(id);
        ++aborted;
      }
      return proposed;
    };
    Engine spec(m, ec);
    self = &spec;
    const auto got = run(spec, c, temperature);
    EXPECT_GT(aborted, 0);
    for (size_t i = 1; i < c.prompts.size(); i += 2) {
      EXPECT_LT(got.count(i) ? got.at(i).size() : 0, size_t(c.max_new)) << i;
    }
    for (size_t i = 0; i < c.prompts.size(); i += 2) EXPECT_EQ(got.at(i).size(), size_t(c.max_new)) << i;
    expect_no_leak(spec);
  }
  // The engine thread: 24 requests, a third of them aborted from this thread while rounds run.
  EngineConfig ec = base_config(96);
  ec.speculative = eagle(3);
  Engine spec(m, ec);
  spec.start();
  const Case many = make_case(24, V, 40);
  for (size_t i = 0; i < many.prompts.size(); ++i) {
    GenerateRequest g;
    g.id = i;
    g.prompt = many.prompts[i];
    g.params.max_new_tokens = many.max_new;
    g.params.ignore_eos = true;
    g.params.temperature = i % 2 == 0 ? 1.0f : 0.0f;
    g.params.seed = i;
    spec.submit(std::move(g));
  }
  std::map<uint64_t, bool> finished;
  std::vector<StepOutput> outs;
  size_t next_abort = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (finished.size() < many.prompts.size() && std::chrono::steady_clock::now() < deadline) {
    spec.wait_outputs(outs, std::chrono::milliseconds(5));
    for (const StepOutput& o : outs) {
      EXPECT_NE(o.finish, FinishReason::error) << o.error;
      if (o.finish != FinishReason::none) finished[o.id] = true;
    }
    outs.clear();
    if (next_abort < many.prompts.size() && spec.stats().spec_rounds > int64_t(4 * next_abort)) {
      spec.abort(next_abort);
      next_abort += 3;
    }
  }
  spec.stop();
  EXPECT_EQ(finished.size(), many.prompts.size());
  EXPECT_GT(spec.stats().spec_rounds, 0);
  expect_no_leak(spec);
}

}  // namespace
}  // namespace dsaserve::runtime
