// The scheduler, KV manager and prefix cache driven by the real Engine loop (Engine::step, with and without
// overlap scheduling) over an injected model-free runner: a fake forward that stores each fed token in an
// emulated KV cache (slot -> token) and reads every request's whole sequence back through its page
// table, so page tables, prefix sharing, chunking and retraction are verified, not only counted. The
// "model" predicts a hash of the sequence it read back, so outputs are checkable against a plain loop.
#include "runtime/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>

#include "common/fixtures.h"
#include "core/error.h"
#include "core/parallel.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/memory_plan.h"

namespace dsaserve::runtime {
namespace {

constexpr int64_t kVocab = 97;

int32_t next_token(std::span<const int32_t> seq) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : seq) h = (h ^ uint64_t(t)) * 1099511628211ULL;
  return int32_t(h % uint64_t(kVocab - 2)) + 2;  // never 0/1 (eos is 1)
}

// The fake model's logits at a position whose sequence so far is `seq` (a prompt-logprob row): values
// spread over the vocabulary by a hash of the whole sequence, so that a row computed from wrong or stale KV,
// or reported for the wrong position, shows in the logprobs and their top tokens.
void fake_row(std::span<const int32_t> seq, std::span<float> row) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : seq) h = (h ^ uint64_t(t)) * 1099511628211ULL;
  for (size_t v = 0; v < row.size(); ++v) {
    const uint64_t x = (h ^ (uint64_t(v) * 0x9E3779B97F4A7C15ULL)) * 0xBF58476D1CE4E5B9ULL;
    row[v] = float(x >> 58) / 8.0f;
  }
}

model::KvCache fake_cache(int64_t pages, int64_t page_size) {
  model::KvCache c;
  c.num_pages = pages;
  c.page_size = page_size;
  return c;
}

// What the fake model saw.
struct RunLog {
  int64_t steps = 0;  // forwards launched
  // The largest step seen: tokens, one request's new tokens, requests.
  int64_t max_step_tokens = 0, max_item_tokens = 0, max_step_requests = 0;
  std::vector<std::pair<int64_t, int64_t>> last_batch;  // (start, new tokens) per request of the last step
  int64_t fail_step = -1;  // this forward (0-based) fails: wait() throws, as a device error would
};

// The model-free runner: writes each fed token into its KV slot, reads each request's sequence back
// through its page table (every position must have been written) and returns one-hot logits of
// next_token(that sequence) for each request, then each extra (prompt-logprob) row: fake_row() of the
// sequence up to its position, read back the same way.
class FakeRunner final : public ModelRunner {
 public:
  FakeRunner(RunLog& log, const model::KvCache& cache)
      : log_(log), num_pages_(cache.num_pages), kv_(size_t(cache.num_pages * cache.page_size), -1) {}

  void launch(model::ForwardBatch fb) override {
    fb.validate(kVocab, num_pages_);
    const int64_t R = fb.num_requests(), ps = fb.page_size;
    logits_.assign(size_t((R + int64_t(fb.extra_logit_rows.size())) * kVocab), 0.0f);
    log_.last_batch.clear();
    // Request k's sequence [0, end) as its page table reads it back.
    auto read_back = [&](int64_t k, int64_t end) {
      const std::span<const int32_t> pages = fb.pages(k);
      std::vector<int32_t> seq;
      for (int64_t p = 0; p < end; ++p) {
        seq.push_back(kv_[size_t(int64_t(pages[size_t(p / ps)]) * ps + p % ps)]);
        EXPECT_GE(seq.back(), 0) << "position " << p << " of request " << k << " was never written";
      }
      return seq;
    };
    for (int64_t k = 0; k < R; ++k) {
      for (int64_t t = fb.token_begin[size_t(k)]; t < fb.token_begin[size_t(k) + 1]; ++t) {
        EXPECT_NE(fb.input_ids[size_t(t)], kFutureToken) << "unresolved input, request " << k;
        kv_[size_t(fb.out_cache_loc[size_t(t)])] = fb.input_ids[size_t(t)];
      }
      const std::vector<int32_t> seq = read_back(k, fb.start_pos[size_t(k)] + fb.num_new(k));
      logits_[size_t(k * kVocab + next_token(seq))] = 1.0f;
      log_.last_batch.emplace_back(fb.start_pos[size_t(k)], fb.num_new(k));
      log_.max_item_tokens = std::max(log_.max_item_tokens, fb.num_new(k));
    }
    for (size_t e = 0; e < fb.extra_logit_rows.size(); ++e) {
      const int64_t t = fb.extra_logit_rows[e];
      const auto owner = std::upper_bound(fb.token_begin.begin(), fb.token_begin.end(), t);
      const int64_t k = int64_t(owner - fb.token_begin.begin()) - 1;  // the request whose token row t is
      const std::vector<int32_t> seq =
          read_back(k, fb.start_pos[size_t(k)] + t - fb.token_begin[size_t(k)] + 1);
      fake_row(seq, std::span<float>(logits_).subspan(size_t((R + int64_t(e)) * kVocab), size_t(kVocab)));
    }
    log_.max_step_tokens = std::max(log_.max_step_tokens, fb.num_tokens());
    log_.max_step_requests = std::max(log_.max_step_requests, R);
    rows_ = R + int64_t(fb.extra_logit_rows.size());
    failing_ = log_.steps == log_.fail_step;
    ++log_.steps;
  }
  Tensor wait() override {
    if (failing_) throw Error("fake forward failed");
    return Tensor::from_vector(logits_, {rows_, kVocab});
  }

 private:
  RunLog& log_;
  int64_t num_pages_;
  std::vector<int32_t> kv_;  // slot -> token
  std::vector<float> logits_;
  int64_t rows_ = 0;
  bool failing_ = false;
};

EngineConfig engine_config(SchedulerConfig cfg, bool overlap, bool prefix_cache) {
  EngineConfig ec;
  ec.scheduler = std::move(cfg);
  ec.overlap_schedule = overlap;
  ec.enable_prefix_cache = prefix_cache;
  ec.check_integrity = true;  // Scheduler::check_integrity after every step
  return ec;
}

struct Harness {
  RunLog log;
  Engine engine;
  std::map<uint64_t, std::vector<int32_t>> outputs;
  std::map<uint64_t, StepOutput> finished;
  // Prompt logprob entries in the order reported, each with its prompt position.
  std::map<uint64_t, std::vector<std::pair<int64_t, SampleResult>>> prompt_logprobs;
  int64_t calls = 0;         // step() calls
  float temperature = 0.0f;  // of the requests add() makes (seed = id)

  Harness(int64_t pages, int64_t page_size, SchedulerConfig cfg, bool overlap_schedule,
          bool prefix_cache = true)
      : engine(
            ModelShape{kVocab, 0}, fake_cache(pages, page_size),
            [this](model::KvCache& c) { return std::make_unique<FakeRunner>(log, c); },
            engine_config(std::move(cfg), overlap_schedule, prefix_cache)) {}

  const Scheduler& sched() const { return engine.scheduler(); }
  const KvPool& pool() const { return engine.pool(); }
  const RadixCache& cache() const { return engine.cache(); }

  void submit(uint64_t id, std::vector<int32_t> prompt, SamplingParams params) {
    engine.submit({id, std::move(prompt), std::move(params)});
  }
  void add(uint64_t id, std::vector<int32_t> prompt, int64_t max_new, int64_t priority = 0) {
    SamplingParams p;
    p.priority = priority;
    p.temperature = temperature;
    p.seed = id;
    p.max_new_tokens = max_new;
    p.ignore_eos = true;
    submit(id, std::move(prompt), std::move(p));
  }

  // One Engine::step; false when the engine was idle.
  bool step() {
    const bool worked = engine.step();
    ++calls;
    std::vector<StepOutput> out;
    engine.wait_outputs(out, std::chrono::milliseconds(0));
    for (StepOutput& o : out) {
      if (!o.prompt_logprobs.empty()) {
        EXPECT_TRUE(outputs[o.id].empty()) << "request " << o.id << ": prompt logprobs after a sample";
      }
      for (size_t j = 0; j < o.prompt_logprobs.size(); ++j)
        prompt_logprobs[o.id].emplace_back(o.prompt_logprobs_from + int64_t(j), o.prompt_logprobs[j]);
      if (o.token >= 0) outputs[o.id].push_back(o.token);
      if (o.finish != FinishReason::none) finished[o.id] = o;
    }
    return worked;
  }

  void run(int64_t max_calls = 100000) {
    while (step()) ASSERT_LT(calls, max_calls) << "the engine does not make progress";
  }
};

// The scheduler's parts alone, for tests of its sampling API (no step).
struct Parts {
  KvPool pool;
  RadixCache cache;
  Scheduler sched;
  Parts(int64_t pages, int64_t page_size, SchedulerConfig cfg)
      : pool(fake_cache(pages, page_size)), cache(pool, true), sched(std::move(cfg), pool, cache) {}
  void add(uint64_t id, std::vector<int32_t> prompt, int64_t max_new, float temperature) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->tokens = std::move(prompt);
    r->params.temperature = temperature;
    r->sampler = SamplerState(id, r->tokens);
    r->params.max_new_tokens = max_new;
    r->params.ignore_eos = true;
    std::vector<StepOutput> out;
    sched.add(std::move(r), out);
  }
};

// Every test runs without and with overlap scheduling (the engine's step order, emulated).
class SchedulerTest : public ::testing::TestWithParam<bool> {};

std::vector<int32_t> expected_output(std::vector<int32_t> seq, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back(next_token(seq));
    seq.push_back(out.back());
  }
  return out;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int64_t len) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(int32_t(rng() % uint32_t(kVocab)));
  return p;
}

TEST_P(SchedulerTest, ChunkedPrefillAndDecodeProduceTheReferenceTokens) {
  SchedulerConfig cfg;
  cfg.chunked_prefill_size = 5;
  cfg.max_prefill_tokens = 8;
  Harness h(64, 4, cfg, GetParam());
  std::mt19937 rng(1);
  std::map<uint64_t, std::vector<int32_t>> prompts;
  for (uint64_t id = 1; id <= 6; ++id) {
    prompts[id] = random_prompt(rng, 3 + int64_t(id) * 4);
    h.add(id, prompts[id], 9);
  }
  h.run();
  for (auto& [id, p] : prompts) {
    EXPECT_EQ(h.outputs[id], expected_output(p, 9)) << id;
    EXPECT_EQ(h.finished[id].finish, FinishReason::length);
    EXPECT_EQ(h.finished[id].completion_tokens, 9);
  }
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

// The activation workspace the KV pool is sized around (runtime/engine/memory_plan.h) bounds a step by these
// limits: no step the scheduler makes is larger (tokens, one request's chunk, requests), with long
// prompts, decodes and retraction on a small pool mixed.
TEST_P(SchedulerTest, StepsStayWithinTheWorkspaceEstimatesLimits) {
  DSA_FIXTURE_PATH(glm, "configs/glm-5.3.json");
  for (const int64_t chunk : {int64_t(5), int64_t(0)}) {
    SchedulerConfig cfg;
    cfg.chunked_prefill_size = chunk;
    cfg.max_prefill_tokens = 11;
    cfg.max_running_requests = 4;
    Harness h(40, 4, cfg, GetParam());
    std::mt19937 rng(3);
    for (uint64_t id = 1; id <= 10; ++id) h.add(id, random_prompt(rng, 2 + int64_t(id) * 5), 6);
    h.run();
    StepLimits lim;
    lim.max_running_requests = cfg.max_running_requests;
    lim.max_prefill_tokens = cfg.max_prefill_tokens;
    lim.chunked_prefill_size = cfg.chunked_prefill_size;
    lim.max_context = 64;
    const model::ModelConfig c = model::ModelConfig::from_file(glm);
    const WorkspaceEstimate e = estimate_workspace(c, lim);
    EXPECT_LE(h.log.max_step_tokens, e.step_tokens) << "chunk " << chunk;
    EXPECT_LE(h.log.max_item_tokens, e.chunk_tokens) << "chunk " << chunk;
    EXPECT_LE(h.log.max_step_requests, lim.max_running_requests);
    EXPECT_GE(h.log.max_item_tokens, chunk > 0 ? chunk : 11)
        << "the limit was never reached: the case tests nothing";
    EXPECT_EQ(h.finished.size(), 10u);
  }
}

// process() with results sampled outside the scheduler (the engine's --sampling-device gpu path): the
// same tokens, finishes and page accounting as sampling inside it, greedy and seeded at temperature 1.
// A test of the scheduler's API: its steps in their plainest order (no overlap), the model a hash of the
// request's tokens.
TEST(SchedulerPresampled, PresampledRowsGiveTheSameOutputsAsSamplingInside) {
  for (const float temperature : {0.0f, 1.0f}) {
    std::map<uint64_t, std::vector<int32_t>> outputs[2];
    for (const bool presample : {false, true}) {
      SchedulerConfig cfg;
      cfg.max_prefill_tokens = 48;
      cfg.chunked_prefill_size = 16;
      Parts h(64, 4, cfg);
      std::mt19937 rng(5);
      for (uint64_t id = 1; id <= 6; ++id)
        h.add(id, random_prompt(rng, 1 + int64_t(rng() % 40)), 9, temperature);
      std::map<uint64_t, StepOutput> finished;
      std::vector<float> scratch;
      for (int steps = 0; !h.sched.idle(); ++steps) {
        ASSERT_LT(steps, 1000);
        std::vector<StepOutput> out;
        const ScheduleBatch b = h.sched.schedule(out);
        std::vector<float> logits(b.items.size() * size_t(kVocab), 0.0f);
        for (size_t k = 0; k < b.items.size(); ++k) {
          const ScheduledRequest& it = b.items[k];
          const std::span<const int32_t> seq(it.req->tokens.data(), size_t(it.start + it.num_new));
          logits[k * size_t(kVocab) + size_t(next_token(seq))] = 1.0f;
        }
        h.sched.commit(b);
        if (!presample) {
          h.sched.process(b, logits, kVocab, out);
        } else {
          std::vector<SampleResult> results(b.items.size());
          std::vector<SampleRow> rows(b.items.size());
          for (size_t k = 0; k < b.items.size(); ++k) {
            Request* r = h.sched.sampling_request(b, k);
            if (r == nullptr) continue;
            const std::span<const float> row(logits.data() + k * size_t(kVocab), size_t(kVocab));
            results[k] = sample(row, r->params, r->sampler, scratch);
            rows[k].sampled = &results[k];
          }
          h.sched.process(b, rows, out);
        }
        h.sched.check_integrity();
        for (StepOutput& o : out) {
          if (o.token >= 0) outputs[presample][o.id].push_back(o.token);
          if (o.finish != FinishReason::none) finished[o.id] = o;
        }
      }
      EXPECT_EQ(finished.size(), 6u);
      for (const auto& [id, o] : finished) EXPECT_EQ(o.finish, FinishReason::length) << id;
      EXPECT_EQ(h.pool.num_pages() - h.pool.free_pages(), h.cache.cached_pages()) << "pages leaked";
    }
    EXPECT_EQ(outputs[0], outputs[1]) << "temperature " << temperature;
    if (temperature == 0.0f) {
      for (const auto& [id, toks] : outputs[1]) EXPECT_EQ(toks.size(), 9u) << id;
    }
  }
}

// issue 6: sample_rows() draws the rows in parallel; each token equals a sequential sample() from the
// request's own state, items that do not sample this step get no result.
TEST(SchedulerSampleRows, ParallelRowsEqualSequentialSamples) {
  set_num_threads(4);
  constexpr int64_t kRowVocab = 2048;  // 8 rows per parallel task: 40 rows in 5 tasks
  SchedulerConfig cfg;
  cfg.max_prefill_tokens = 4096;
  cfg.chunked_prefill_size = 8;  // the 20-token prompt is chunked: its first item does not sample
  Parts h(256, 4, cfg);
  std::mt19937 rng(11);
  for (uint64_t id = 1; id <= 40; ++id)
    h.add(id, random_prompt(rng, id == 7 ? 20 : 1 + int64_t(rng() % 6)), 4, 1.0f);
  std::vector<StepOutput> out;
  ScheduleBatch b = h.sched.schedule(out);
  ASSERT_EQ(b.items.size(), 40u);
  h.sched.commit(b);
  std::vector<SamplerState> before;
  for (const ScheduledRequest& s : b.items) before.push_back(h.sched.find(s.id)->sampler);
  std::vector<float> logits(b.items.size() * size_t(kRowVocab));
  std::normal_distribution<float> nd(0.f, 2.f);
  for (float& x : logits) x = nd(rng);
  std::vector<SampleResult> results;
  std::vector<SampleRow> rows;
  h.sched.sample_rows(b, logits, kRowVocab, results, rows);
  ASSERT_EQ(rows.size(), b.items.size());
  std::vector<float> scratch;
  int64_t sampled = 0;
  for (size_t k = 0; k < b.items.size(); ++k) {
    EXPECT_EQ(rows[k].logits.data(), logits.data() + k * size_t(kRowVocab));
    if (!b.items[k].sample) {
      EXPECT_EQ(rows[k].sampled, nullptr) << "item " << k;
      continue;
    }
    ASSERT_EQ(rows[k].sampled, &results[k]);
    const Request& r = *h.sched.find(b.items[k].id);
    const int32_t want = sample(rows[k].logits, r.params, before[k], scratch).token;
    EXPECT_EQ(results[k].token, want) << "item " << k;
    ++sampled;
  }
  EXPECT_EQ(sampled, 39);
  h.sched.process(b, rows, out);
  EXPECT_EQ(int64_t(out.size()), sampled);
}

TEST(SchedulerPresampled, RowCountAndItemIndexAreChecked) {
  Parts h(16, 4, SchedulerConfig{});
  h.add(1, {3, 4, 5}, 4, 0.0f);
  std::vector<StepOutput> out;
  ScheduleBatch b = h.sched.schedule(out);
  ASSERT_EQ(b.items.size(), 1u);
  h.sched.commit(b);
  ASSERT_NE(h.sched.sampling_request(b, 0), nullptr);
  EXPECT_THROW(h.sched.sampling_request(b, 1), Error);
  EXPECT_THROW(h.sched.process(b, std::span<const SampleRow>(), out), Error);
}

TEST_P(SchedulerTest, PrefixCacheHitReportsCachedTokensAndSkipsThem) {
  SchedulerConfig cfg;
  Harness h(64, 4, cfg, GetParam());
  std::mt19937 rng(2);
  const std::vector<int32_t> shared = random_prompt(rng, 21);
  h.add(1, shared, 3);
  h.run();
  std::vector<int32_t> second = shared;
  second.push_back(5);
  second.push_back(6);
  h.add(2, second, 3);
  h.step();
  ASSERT_EQ(h.log.last_batch.size(), 1u);    // request 2 alone
  EXPECT_EQ(h.log.last_batch[0].first, 20);  // 5 whole pages of the first request's prompt
  EXPECT_EQ(h.log.last_batch[0].second, 3);
  h.run();
  EXPECT_EQ(h.outputs[2], expected_output(second, 3));
  EXPECT_EQ(h.finished[2].cached_tokens, 20);
  EXPECT_EQ(h.finished[1].cached_tokens, 0);
}

TEST_P(SchedulerTest, RetractsWhenPagesRunOutAndStillProducesTheReference) {
  SchedulerConfig cfg;
  cfg.chunked_prefill_size = 8;
  cfg.max_running_requests = 16;
  Harness h(24, 4, cfg, GetParam());  // 96 tokens of KV for 8 requests of up to ~40 tokens each
  std::mt19937 rng(3);
  std::map<uint64_t, std::vector<int32_t>> prompts;
  std::map<uint64_t, int64_t> lens;
  for (uint64_t id = 1; id <= 8; ++id) {
    prompts[id] = random_prompt(rng, 4 + int64_t(rng() % 12));
    lens[id] = 10 + int64_t(rng() % 20);
    h.add(id, prompts[id], lens[id]);
  }
  h.run();
  EXPECT_GT(h.sched().num_retractions(), 0);
  for (auto& [id, p] : prompts) EXPECT_EQ(h.outputs[id], expected_output(p, lens[id])) << id;
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

// Prompt logprobs under retraction (a small pool, chunked prefill): a request retracted before all its
// prompt logprobs were reported recomputes its whole prompt (cached tokens have no logits, so it takes no
// prefix from the cache, not even one another request computed) and must report only the positions not
// reported yet; one retracted after them takes its prefix from the cache and reports nothing more. Either
// way each request gets every prompt position 1..len-1 exactly once, in order, with the tokens and logprobs
// of the request run alone on a large pool (the fake model's prompt-logprob rows hash the whole sequence
// read back through the page table), and the same outputs.
TEST_P(SchedulerTest, PromptLogprobsUnderRetractionAreReportedOnceWithTheUnretractedValues) {
  SchedulerConfig cfg;
  cfg.chunked_prefill_size = 4;
  cfg.max_prefill_tokens = 8;
  struct Spec {
    std::vector<int32_t> prompt;
    int64_t max_new = 0;
    int32_t top = -1;    // params.prompt_logprobs
    int64_t arrive = 0;  // submitted before this step() call
  };
  std::mt19937 rng(31);
  std::map<uint64_t, Spec> reqs;
  // On 14 pages of 4: 1 and 2 decode long enough to push 2 (the younger) out after its prefill; 3 and 4
  // are pushed out in the middle of their chunked prefills; 6 (3's prompt, no prompt logprobs, first to
  // arrive) leaves 3's prompt in the prefix cache; 5 only competes for pages.
  reqs[1] = {random_prompt(rng, 6), 30, 2, 0};
  reqs[2] = {random_prompt(rng, 9), 30, 0, 0};
  reqs[3] = {random_prompt(rng, 26), 6, 3, 3};
  reqs[4] = {random_prompt(rng, 15), 10, 1, 5};
  reqs[5] = {random_prompt(rng, 11), 12, -1, 6};
  reqs[6] = {reqs[3].prompt, 12, -1, 0};
  int64_t last_arrival = 0;
  for (auto& [id, s] : reqs) last_arrival = std::max(last_arrival, s.arrive);
  auto params = [](const Spec& s, uint64_t id) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.seed = id;
    p.max_new_tokens = s.max_new;
    p.ignore_eos = true;
    p.prompt_logprobs = s.top;
    return p;
  };
  // The reference: each request alone with room for everything (whose entries are those of fake_row()).
  std::map<uint64_t, std::vector<std::pair<int64_t, SampleResult>>> want;
  for (auto& [id, s] : reqs) {
    Harness alone(256, 4, cfg, GetParam());
    alone.submit(id, s.prompt, params(s, id));
    alone.run();
    EXPECT_EQ(alone.sched().num_retractions(), 0);
    EXPECT_EQ(alone.outputs[id], expected_output(s.prompt, s.max_new)) << id;
    want[id] = alone.prompt_logprobs[id];
    ASSERT_EQ(int64_t(want[id].size()), s.top >= 0 ? int64_t(s.prompt.size()) - 1 : 0) << id;
    std::vector<float> row(static_cast<size_t>(kVocab));
    for (size_t j = 0; j < want[id].size(); ++j) {
      fake_row(std::span<const int32_t>(s.prompt).first(j + 1), row);
      EXPECT_EQ(want[id][j].second.logprob, token_logprobs(row, s.prompt[j + 1], s.top).logprob) << id;
    }
  }

  Harness h(14, 4, cfg, GetParam());
  // Retractions of requests that report prompt logprobs, by the state they left: prefill unfinished (even
  // counting the step in flight) with some entries reported, or every entry reported.
  int64_t mid_prefill = 0, after_prefill = 0;
  struct Seen {
    int32_t retractions = 0;
    int64_t next = 0;  // prompt_logprobs_next
    int64_t kv = 0;
  };
  for (bool worked = true; worked || h.calls <= last_arrival;) {
    ASSERT_LT(h.calls, 2000) << "the engine does not make progress";
    for (auto& [id, s] : reqs) {
      if (s.arrive == h.calls) h.submit(id, s.prompt, params(s, id));
    }
    std::map<uint64_t, Seen> before;
    for (auto& [id, s] : reqs) {
      if (const Request* r = h.sched().find(id))
        before[id] = {r->num_retractions, r->prompt_logprobs_next, r->kv.len};
    }
    worked = h.step();
    for (auto& [id, b] : before) {
      const Request* r = h.sched().find(id);
      if (r == nullptr || r->num_retractions == b.retractions || reqs[id].top < 0) continue;
      if (b.next == r->prompt_len) {
        ++after_prefill;
      } else if (b.next > 1 && b.kv < r->prompt_len) {
        ++mid_prefill;
      }
    }
  }
  EXPECT_GT(mid_prefill, 0) << "no request was retracted mid-prefill with its entries partly reported";
  EXPECT_GT(after_prefill, 0) << "no request was retracted after reporting its prompt logprobs";
  for (auto& [id, s] : reqs) {
    EXPECT_EQ(h.finished[id].finish, FinishReason::length) << id << " " << h.finished[id].error;
    EXPECT_EQ(h.outputs[id], expected_output(s.prompt, s.max_new)) << id;
    const std::vector<std::pair<int64_t, SampleResult>>& got = h.prompt_logprobs[id];
    ASSERT_EQ(got.size(), want[id].size()) << "request " << id << ": entries repeated or skipped";
    for (size_t j = 0; j < got.size(); ++j) {
      const SampleResult &g = got[j].second, &w = want[id][j].second;
      EXPECT_EQ(got[j].first, int64_t(j) + 1) << "request " << id << " entry " << j;
      EXPECT_EQ(g.token, s.prompt[j + 1]) << "request " << id << " entry " << j;
      EXPECT_EQ(g.logprob, w.logprob) << "request " << id << " entry " << j;
      ASSERT_EQ(g.top.size(), size_t(s.top)) << "request " << id << " entry " << j;
      for (size_t t = 0; t < g.top.size(); ++t) {
        EXPECT_EQ(g.top[t].token, w.top[t].token) << "request " << id << " entry " << j << " top " << t;
        EXPECT_EQ(g.top[t].logprob, w.top[t].logprob) << "request " << id << " entry " << j << " top " << t;
      }
    }
  }
  EXPECT_TRUE(h.sched().idle());
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages()) << "pages leaked";
}

TEST_P(SchedulerTest, RequestLargerThanThePoolFailsWithoutBlockingOthers) {
  SchedulerConfig cfg;
  Harness h(4, 4, cfg, GetParam());
  std::mt19937 rng(4);
  h.add(1, random_prompt(rng, 30), 2);  // 31 tokens > 16 slots
  h.add(2, random_prompt(rng, 5), 2);
  h.run(1000);
  EXPECT_EQ(h.finished[1].finish, FinishReason::error);
  EXPECT_NE(h.finished[1].error.find("KV pages"), std::string::npos);
  EXPECT_EQ(h.finished[2].finish, FinishReason::length);
  // A request that grows past the pool while decoding fails too, never loops.
  h.add(3, random_prompt(rng, 10), 50);
  h.run(1000);
  EXPECT_EQ(h.finished[3].finish, FinishReason::error);
}

TEST_P(SchedulerTest, AbortFreesPagesAtOnceAndLimitsHold) {
  SchedulerConfig cfg;
  cfg.max_running_requests = 3;
  cfg.max_prefill_tokens = 64;
  Harness h(64, 4, cfg, GetParam());
  std::mt19937 rng(5);
  for (uint64_t id = 1; id <= 6; ++id) h.add(id, random_prompt(rng, 9), 20);
  h.step();
  EXPECT_EQ(h.sched().num_running(), 3);
  EXPECT_EQ(h.sched().num_waiting(), 3);
  h.engine.abort(2);   // running
  h.engine.abort(5);   // waiting
  h.engine.abort(99);  // unknown: ignored
  h.step();            // applies them (check_integrity runs after every step)
  EXPECT_EQ(h.finished[2].finish, FinishReason::abort);
  EXPECT_EQ(h.finished[5].finish, FinishReason::abort);
  EXPECT_EQ(h.finished.count(99), 0u);
  h.run();
  EXPECT_EQ(h.finished.size(), 6u);
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

TEST_P(SchedulerTest, StopTokensEosAndMaxContext) {
  SchedulerConfig cfg;
  cfg.eos_token_ids = {1};
  cfg.max_context = 12;
  Harness h(32, 4, cfg, GetParam());
  const std::vector<int32_t> prompt = {3, 4, 5};
  const std::vector<int32_t> ref = expected_output(prompt, 20);
  SamplingParams p;
  p.temperature = 0;
  p.max_new_tokens = 20;
  p.stop_token_ids = {ref[2]};
  h.submit(1, prompt, p);
  h.add(2, prompt, 20);  // ends at max_context
  h.run();
  EXPECT_EQ(h.finished[1].finish, FinishReason::stop);
  EXPECT_EQ(h.outputs[1].size(), 3u);
  EXPECT_EQ(h.finished[2].finish, FinishReason::length);
  EXPECT_EQ(h.outputs[2].size(), 9u);
}

TEST_P(SchedulerTest, RandomWorkloadKeepsInvariants) {
  SchedulerConfig cfg;
  cfg.chunked_prefill_size = 16;
  cfg.max_prefill_tokens = 24;
  cfg.max_running_requests = 6;
  Harness h(40, 8, cfg, GetParam());
  std::mt19937 rng(6);
  std::vector<int32_t> common = random_prompt(rng, 24);
  std::map<uint64_t, std::pair<std::vector<int32_t>, int64_t>> reqs;
  uint64_t next = 1;
  for (int round = 0; round < 200; ++round) {
    if (rng() % 3 == 0 && next < 60) {
      std::vector<int32_t> p = rng() % 2 ? common : std::vector<int32_t>{};
      const std::vector<int32_t> tail = random_prompt(rng, 1 + int64_t(rng() % 40));
      p.insert(p.end(), tail.begin(), tail.end());
      const int64_t n = 1 + int64_t(rng() % 30);
      reqs[next] = {p, n};
      h.add(next++, p, n);
    }
    if (rng() % 17 == 0 && next > 1) {
      h.engine.abort(1 + rng() % (next - 1));
    }
    h.step();
  }
  h.run();
  for (auto& [id, pn] : reqs) {
    const StepOutput& f = h.finished.at(id);
    if (f.finish == FinishReason::abort) continue;
    EXPECT_EQ(f.finish, FinishReason::length) << id << " " << f.error;
    EXPECT_EQ(h.outputs[id], expected_output(pn.first, pn.second)) << id;
  }
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

// A forward that fails (the runner's wait() throws) fails the requests of its batch with the error, leaks no
// page (the step's pages are rolled back and released), and the engine goes on serving the others.
TEST_P(SchedulerTest, AFailedStepFailsItsRequestsAndTheEngineServesOn) {
  SchedulerConfig cfg;
  cfg.max_running_requests = 2;
  cfg.chunked_prefill_size = 4;
  Harness h(64, 4, cfg, GetParam());
  h.log.fail_step = 3;
  std::mt19937 rng(21);
  std::map<uint64_t, std::vector<int32_t>> prompts;
  for (uint64_t id = 1; id <= 4; ++id) {
    prompts[id] = random_prompt(rng, 6 + int64_t(id));
    h.add(id, prompts[id], 6);
  }
  h.run();
  int64_t failed = 0;
  for (auto& [id, p] : prompts) {
    const StepOutput& f = h.finished.at(id);
    if (f.finish == FinishReason::error) {
      EXPECT_NE(f.error.find("model step failed: fake forward failed"), std::string::npos) << f.error;
      ++failed;
    } else {
      EXPECT_EQ(f.finish, FinishReason::length) << id;
      EXPECT_EQ(h.outputs[id], expected_output(p, 6)) << id;
    }
  }
  EXPECT_EQ(failed, 2) << "the failed step held the two running requests";
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

// Priority scheduling: with one running slot, requests run one at a time in admission order.
std::vector<uint64_t> completion_order(bool enable, bool low_first, bool overlap) {
  SchedulerConfig cfg;
  cfg.max_running_requests = 1;
  cfg.enable_priority = enable;
  cfg.low_priority_values_first = low_first;
  Harness h(64, 4, cfg, overlap);
  std::mt19937 rng(11);
  // id -> priority; arrival order is the id order.
  const std::vector<std::pair<uint64_t, int64_t>> reqs = {{1, 0}, {2, 5}, {3, -3}, {4, 5}, {5, 0}, {6, 9}};
  std::map<uint64_t, std::vector<int32_t>> prompts;
  for (auto [id, prio] : reqs) {
    prompts[id] = random_prompt(rng, 6);
    h.add(id, prompts[id], 3, prio);
  }
  std::vector<uint64_t> order;
  for (bool worked = true; worked;) {
    EXPECT_LT(h.calls, 1000);
    if (h.calls >= 1000) break;
    const size_t before = h.finished.size();
    std::map<uint64_t, StepOutput> seen = h.finished;
    worked = h.step();
    if (h.finished.size() != before) {
      for (auto& [id, o] : h.finished) {
        if (!seen.count(id)) order.push_back(id);
      }
    }
  }
  for (auto& [id, p] : prompts) EXPECT_EQ(h.outputs[id], expected_output(p, 3)) << id;
  return order;
}

TEST_P(SchedulerTest, PriorityOrdersAdmissionFcfsWithinALevel) {
  // Off (default): pure FCFS whatever the priorities.
  EXPECT_EQ(completion_order(false, false, GetParam()), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  // On: larger first, FCFS within a level (2 before 4, 1 before 5).
  EXPECT_EQ(completion_order(true, false, GetParam()), (std::vector<uint64_t>{6, 2, 4, 1, 5, 3}));
  // Inverted: smaller values first.
  EXPECT_EQ(completion_order(true, true, GetParam()), (std::vector<uint64_t>{3, 1, 5, 2, 4, 6}));
}

TEST_P(SchedulerTest, RetractionTakesTheLowestPriorityThenTheYoungest) {
  SchedulerConfig cfg;
  cfg.max_running_requests = 8;
  cfg.enable_priority = true;
  // 4 requests of 7 prompt tokens each take 2 pages at admission (page size 4); 9 pages: all four fit,
  // then decoding needs more pages than there are and someone must go. The two high ones alone (15
  // tokens, 4 pages each) always fit.
  Harness h(9, 4, cfg, GetParam(), /*prefix_cache=*/false);
  std::mt19937 rng(12);
  std::map<uint64_t, std::vector<int32_t>> prompts;
  // Arrival order 1..4; priorities: 1 low, 2 high, 3 low (younger than 1), 4 high.
  const std::vector<std::pair<uint64_t, int64_t>> reqs = {{1, -1}, {2, 7}, {3, -1}, {4, 7}};
  for (auto [id, prio] : reqs) {
    prompts[id] = random_prompt(rng, 7);
    h.add(id, prompts[id], 8, prio);
  }
  std::vector<uint64_t> victims;
  for (bool worked = true; worked && h.calls < 1000;) {
    std::map<uint64_t, int32_t> before;
    for (uint64_t id = 1; id <= 4; ++id) {
      if (const Request* r = h.sched().find(id)) before[id] = r->num_retractions;
    }
    worked = h.step();
    for (auto [id, n] : before) {
      const Request* r = h.sched().find(id);
      if (r != nullptr && r->num_retractions > n) victims.push_back(id);
    }
  }
  ASSERT_FALSE(victims.empty()) << "the pool was meant to run out";
  EXPECT_EQ(victims.front(), 3u) << "the lowest priority's youngest goes first";
  for (uint64_t v : victims) EXPECT_TRUE(v == 1 || v == 3) << "high-priority request " << v << " retracted";
  for (auto& [id, p] : prompts) EXPECT_EQ(h.outputs[id], expected_output(p, 8)) << id;
  EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
}

TEST_P(SchedulerTest, PriorityRandomWorkloadKeepsInvariants) {
  for (bool low_first : {false, true}) {
    SchedulerConfig cfg;
    cfg.chunked_prefill_size = 8;
    cfg.max_running_requests = 6;
    cfg.max_prefill_tokens = 24;
    cfg.enable_priority = true;
    cfg.low_priority_values_first = low_first;
    Harness h(20, 4, cfg, GetParam());
    std::mt19937 rng(13);
    std::map<uint64_t, std::vector<int32_t>> prompts;
    std::map<uint64_t, int64_t> lens;
    uint64_t id = 1;
    for (int round = 0; round < 6; ++round) {
      for (int k = 0; k < 5; ++k, ++id) {
        prompts[id] = random_prompt(rng, 3 + int64_t(rng() % 14));
        lens[id] = 2 + int64_t(rng() % 14);
        h.add(id, prompts[id], lens[id], int64_t(rng() % 5) - 2);
      }
      for (int s = 0; s < 4; ++s) h.step();  // check_integrity runs each step (queue orders included)
    }
    h.run();
    EXPECT_GT(h.sched().num_retractions(), 0);
    for (auto& [i, p] : prompts) EXPECT_EQ(h.outputs[i], expected_output(p, lens[i])) << i;
    EXPECT_EQ(h.pool().num_pages() - h.pool().free_pages(), h.cache().cached_pages());
  }
}

INSTANTIATE_TEST_SUITE_P(Overlap, SchedulerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "on" : "off"; });

}  // namespace
}  // namespace dsaserve::runtime
