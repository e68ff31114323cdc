// Engine on the tiny fixture model (CPU path): greedy generations equal the fixture's goldens, a request
// alone and inside a batch of 16 others gives the same tokens, chunked prefill with retraction under a
// tiny pool gives the same tokens, a shared prefix is served from the cache, aborts free pages, and
// overlap scheduling gives the same tokens as none.
#include "runtime/engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "common/fixtures.h"
#include "io/safetensors.h"
#include "runtime/engine/device.h"

namespace dsaserve::runtime {
namespace {

std::vector<int32_t> ids_of(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

std::shared_ptr<const model::Model> tiny_model(const std::filesystem::path& dir) {
  static std::shared_ptr<const model::Model> m = model::Model::load(dir, false);
  return m;
}

struct Result {
  std::vector<int32_t> tokens;
  StepOutput last;
};

// Runs the engine (on this thread) until every submitted request finished.
std::map<uint64_t, Result> run_all(Engine& e, size_t n) {
  std::map<uint64_t, Result> res;
  size_t done = 0;
  std::vector<StepOutput> out;
  for (int guard = 0; done < n && guard < 100000; ++guard) {
    e.step();
    out.clear();
    e.wait_outputs(out, std::chrono::milliseconds(0));
    for (StepOutput& o : out) {
      if (o.token >= 0) res[o.id].tokens.push_back(o.token);
      if (o.finish != FinishReason::none) {
        res[o.id].last = o;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, n);
  return res;
}

GenerateRequest greedy(uint64_t id, std::vector<int32_t> prompt, int64_t n) {
  GenerateRequest g;
  g.id = id;
  g.prompt = std::move(prompt);
  g.params.temperature = 0;
  g.params.max_new_tokens = n;
  g.params.ignore_eos = true;
  return g;
}

EngineConfig small_config(int64_t pages, int64_t page_size) {
  EngineConfig c;
  c.kv_pages = pages;
  c.page_size = page_size;
  c.check_integrity = true;
  return c;
}

TEST(Engine, GreedyMatchesGoldensAloneAndInABatch) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  auto gold = io::SafetensorsFile::open(dir / "goldens.safetensors");
  Engine e(tiny_model(dir), small_config(256, 16));
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts, expect;
  for (int j = 0; j < 2; ++j) {
    prompts.push_back(ids_of(gold->get(fmt::format("greedy{}.prompt", j))));
    expect.push_back(ids_of(gold->get(fmt::format("greedy{}.output", j))));
  }
  // Alone.
  for (size_t j = 0; j < prompts.size(); ++j) {
    e.submit(greedy(j + 1, prompts[j], int64_t(expect[j].size())));
    auto r = run_all(e, 1);
    EXPECT_EQ(r[j + 1].tokens, expect[j]) << "greedy" << j << " alone";
  }
  // Inside a batch of 16 others of random lengths (mixed prefill + decode steps).
  std::map<uint64_t, std::vector<int32_t>> others;
  for (uint64_t id = 100; id < 116; ++id) {
    std::vector<int32_t> p;
    for (uint32_t i = 0, n = 1 + rng() % 40; i < n; ++i) p.push_back(int32_t(rng() % 512));
    others[id] = p;
    e.submit(greedy(id, p, 6 + int64_t(rng() % 10)));
  }
  for (size_t j = 0; j < prompts.size(); ++j) e.submit(greedy(10 + j, prompts[j], int64_t(expect[j].size())));
  auto r = run_all(e, 18);
  for (size_t j = 0; j < prompts.size(); ++j)
    EXPECT_EQ(r[10 + j].tokens, expect[j]) << "greedy" << j << " in batch";
  const EngineStats s = e.stats();
  EXPECT_EQ(s.kv_pages_total - s.kv_pages_free, s.prefix_cache_pages) << "pages leaked";
}

TEST(Engine, ChunkingAndRetractionGiveTheSameTokens) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  std::mt19937 rng(12);
  std::vector<GenerateRequest> reqs;
  for (uint64_t id = 1; id <= 8; ++id) {
    std::vector<int32_t> p;
    for (uint32_t i = 0, n = 5 + rng() % 30; i < n; ++i) p.push_back(int32_t(rng() % 512));
    reqs.push_back(greedy(id, p, 12));
  }
  EngineConfig roomy = small_config(128, 16);
  roomy.enable_prefix_cache = false;
  Engine a(tiny_model(dir), roomy);
  for (const auto& g : reqs) a.submit(g);
  auto ra = run_all(a, reqs.size());

  EngineConfig tight = small_config(12, 8);  // 96 slots for 8 requests of up to 46 tokens
  tight.scheduler.chunked_prefill_size = 7;
  tight.scheduler.max_prefill_tokens = 10;
  Engine b(tiny_model(dir), tight);
  for (const auto& g : reqs) b.submit(g);
  auto rb = run_all(b, reqs.size());
  EXPECT_GT(b.scheduler().num_retractions(), 0);
  for (const auto& g : reqs) EXPECT_EQ(rb[g.id].tokens, ra[g.id].tokens) << "request " << g.id;
}

TEST(Engine, SharedPrefixIsCachedAndAbortFreesPages) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  Engine e(tiny_model(dir), small_config(64, 16));
  std::vector<int32_t> prefix;
  for (int32_t i = 0; i < 70; ++i) prefix.push_back((i * 37) % 512);
  e.submit(greedy(1, prefix, 4));
  auto r1 = run_all(e, 1);
  EXPECT_EQ(r1[1].last.cached_tokens, 0);
  std::vector<int32_t> second = prefix;
  second.push_back(9);
  e.submit(greedy(2, second, 4));
  auto r2 = run_all(e, 1);
  EXPECT_EQ(r2[2].last.cached_tokens, 64);  // 4 whole pages of 16
  EXPECT_EQ(r2[2].last.prompt_tokens, 71);
  EXPECT_EQ(e.stats().prefix_hit_tokens, 64);

  e.submit(greedy(3, second, 1000));
  e.step();
  e.step();
  e.abort(3);
  auto r3 = run_all(e, 1);
  EXPECT_EQ(r3[3].last.finish, FinishReason::abort);
  EXPECT_EQ(e.pool().num_pages() - e.pool().free_pages(), e.cache().cached_pages());

  GenerateRequest bad = greedy(4, {1, 600}, 2);
  e.submit(bad);
  auto r4 = run_all(e, 1);
  EXPECT_EQ(r4[4].last.finish, FinishReason::error);
  EXPECT_NE(r4[4].last.error.find("vocabulary"), std::string::npos);
}

// Runs a workload to the end, aborting request `id` right after it delivered abort_after[id] tokens
// (as the server does on a stop string or a disconnect).
std::map<uint64_t, Result> run_aborting(Engine& e, const std::vector<GenerateRequest>& reqs,
                                        const std::map<uint64_t, size_t>& abort_after) {
  for (const auto& g : reqs) e.submit(g);
  std::map<uint64_t, Result> res;
  size_t done = 0;
  std::vector<StepOutput> out;
  for (int guard = 0; done < reqs.size() && guard < 100000; ++guard) {
    e.step();
    out.clear();
    e.wait_outputs(out, std::chrono::milliseconds(0));
    for (StepOutput& o : out) {
      Result& r = res[o.id];
      if (o.token >= 0) {
        r.tokens.push_back(o.token);
        auto it = abort_after.find(o.id);
        if (it != abort_after.end() && r.tokens.size() == it->second && o.finish == FinishReason::none)
          e.abort(o.id);
      }
      if (o.finish != FinishReason::none) {
        r.last = o;
        ++done;
      }
    }
  }
  EXPECT_EQ(done, reqs.size());
  while (e.step()) {
  }
  return res;
}

TEST(Engine, OverlapScheduleGivesTheSameTokens) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  std::mt19937 rng(13);
  std::vector<GenerateRequest> reqs;
  std::map<uint64_t, size_t> abort_after;
  for (uint64_t id = 1; id <= 12; ++id) {
    std::vector<int32_t> p;
    for (uint32_t i = 0, n = 5 + rng() % 30; i < n; ++i) p.push_back(int32_t(rng() % 512));
    GenerateRequest g = greedy(id, p, 8 + int64_t(rng() % 8));
    if (id % 3 == 1) {  // seeded sampling
      g.params.temperature = 1.0f;
      g.params.top_k = 50;
      g.params.seed = 1000 + id;
    }
    if (id % 4 == 2) {  // stop tokens: a sampled request that may stop at any step
      g.params.temperature = 1.0f;
      g.params.seed = 2000 + id;
      for (int32_t t = 0; t < 512; t += 7) g.params.stop_token_ids.push_back(t);
    }
    if (id % 5 == 0) abort_after[id] = 2 + id % 3;
    reqs.push_back(std::move(g));
  }
  EngineConfig roomy = small_config(128, 16);
  roomy.enable_prefix_cache = false;
  roomy.overlap_schedule = false;
  Engine ref(tiny_model(dir), roomy);
  auto want = run_aborting(ref, reqs, abort_after);

  for (const bool overlap : {false, true}) {
    EngineConfig tight = small_config(12, 8);  // 96 slots: retraction; chunks of 7; check_integrity on
    tight.scheduler.chunked_prefill_size = 7;
    tight.scheduler.max_prefill_tokens = 10;
    tight.overlap_schedule = overlap;
    Engine e(tiny_model(dir), tight);
    auto got = run_aborting(e, reqs, abort_after);
    EXPECT_GT(e.scheduler().num_retractions(), 0) << "overlap " << overlap;
    for (const auto& g : reqs) {
      EXPECT_EQ(got[g.id].tokens, want[g.id].tokens) << "request " << g.id << " overlap " << overlap;
      EXPECT_EQ(got[g.id].last.finish, want[g.id].last.finish)
          << "request " << g.id << " overlap " << overlap;
    }
    e.scheduler().check_integrity();
    EXPECT_EQ(e.pool().num_pages() - e.pool().free_pages(), e.cache().cached_pages())
        << "overlap " << overlap;
  }
  // The workload exercised what it should: aborts, stop tokens and length finishes.
  std::map<FinishReason, int> seen;
  for (const auto& [id, r] : want) ++seen[r.last.finish];
  EXPECT_GT(seen[FinishReason::abort], 0);
  EXPECT_GT(seen[FinishReason::stop], 0);
  EXPECT_GT(seen[FinishReason::length], 0);
}

TEST(Engine, OverlapScheduleOnTheEngineThread) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  EngineConfig c = small_config(64, 16);
  std::vector<GenerateRequest> reqs;
  for (uint64_t id = 1; id <= 6; ++id) reqs.push_back(greedy(id, {int32_t(id), 5, 9, 13}, 10));
  std::map<uint64_t, std::vector<int32_t>> by_mode[2];
  for (const bool overlap : {false, true}) {
    c.overlap_schedule = overlap;
    Engine e(tiny_model(dir), c);
    e.start();
    for (const auto& g : reqs) e.submit(g);
    size_t done = 0;
    std::vector<StepOutput> out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (done < reqs.size() && std::chrono::steady_clock::now() < deadline) {
      out.clear();
      e.wait_outputs(out, std::chrono::milliseconds(100));
      for (const StepOutput& o : out) {
        if (o.token >= 0) by_mode[overlap][o.id].push_back(o.token);
        done += o.finish != FinishReason::none;
      }
    }
    e.stop();
    EXPECT_EQ(done, reqs.size());
  }
  EXPECT_EQ(by_mode[0], by_mode[1]);
  for (const auto& g : reqs) EXPECT_EQ(by_mode[1][g.id].size(), 10u);
}

}  // namespace
}  // namespace dsaserve::runtime
