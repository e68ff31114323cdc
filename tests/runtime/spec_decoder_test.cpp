// SpecDecoder (runtime/spec): greedy MTP speculative decoding gives the same ids as the engine's greedy
// decoding, token for token, on the fixture models, for 1 and 8 requests, steps 1 / 3 / 5, with chunked
// prefill and small pages (so rollbacks return pages); every page is back in the pool afterwards, also
// when a round fails mid-way; the flags' validation names the flag.
#include "runtime/spec/spec_decoder.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/model.h"
#include "runtime/engine/engine.h"

namespace dsaserve::runtime {
namespace {

std::vector<SpecRequest> make_requests(int64_t n, int64_t vocab) {
  std::vector<SpecRequest> reqs;
  for (int64_t i = 0; i < n; ++i) {
    SpecRequest r;
    for (int64_t t = 0; t < 3 + 5 * i; ++t) r.prompt.push_back(int32_t((17 * i + 31 * t + 7) % vocab));
    r.max_new_tokens = 12 + 3 * (i % 3);
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// The engine's greedy outputs (no speculation, no prefix cache, no EOS stop).
std::vector<std::vector<int32_t>> engine_greedy(std::shared_ptr<const model::Model> m,
                                                const std::vector<SpecRequest>& reqs) {
  EngineConfig ec;
  ec.kv_pages = 256;
  ec.page_size = 16;
  ec.enable_prefix_cache = false;
  ec.overlap_schedule = false;
  Engine engine(std::move(m), ec);
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerateRequest g;
    g.id = i;
    g.prompt = reqs[i].prompt;
    g.params.max_new_tokens = reqs[i].max_new_tokens;
    g.params.ignore_eos = true;
    g.params.temperature = 0.0f;  // greedy
    engine.submit(std::move(g));
  }
  std::vector<std::vector<int32_t>> out(reqs.size());
  std::vector<StepOutput> outs;
  while (engine.step()) {
    engine.wait_outputs(outs, std::chrono::milliseconds(0));
    for (const StepOutput& o : outs) {
      EXPECT_NE(o.finish, FinishReason::error) << o.error;
      if (o.token >= 0) out[o.id].push_back(o.token);
    }
    outs.clear();
  }
  engine.wait_outputs(outs, std::chrono::milliseconds(0));
  for (const StepOutput& o : outs) {
    if (o.token >= 0) out[o.id].push_back(o.token);
  }
  return out;
}

SpeculativeConfig eagle(int64_t steps) {
  SpeculativeConfig c;
  c.algorithm = "EAGLE";
  c.num_steps = steps;
  return c;
}

TEST(SpecDecoder, GreedyEqualsNonSpeculativeOnFixtures) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const std::shared_ptr<const model::Model> m = model::Model::load(models / name, true);
    ASSERT_EQ(m->num_mtp_layers(), 1) << name;
    for (int64_t n : {1, 8}) {
      const auto reqs = make_requests(n, m->config().vocab_size);
      const auto want = engine_greedy(m, reqs);
      for (int64_t steps : {1, 3, 5}) {
        for (int64_t chunk : {0, 5}) {
          // chunk 5: an oracle drafter (the known continuation, every 4th draft wrong) so that drafts are
          // accepted (the fixtures' random MTP layers almost never agree with their targets).
          const int64_t V = m->config().vocab_size;
          DraftHook oracle = [&](uint64_t key, int64_t index, int32_t proposed) -> int32_t {
            const int64_t o = index - int64_t(reqs[key].prompt.size());
            if (o < 0 || o >= int64_t(want[key].size())) return proposed;
            return index % 4 == 3 ? int32_t((want[key][size_t(o)] + 1) % V) : want[key][size_t(o)];
          };
          KvPool pool(m->make_cache(512, 4));
          SpecDecoder dec(*m, pool, eagle(steps), {}, chunk, chunk > 0 ? oracle : DraftHook());
          const auto got = dec.generate(reqs);
          for (size_t i = 0; i < reqs.size(); ++i) {
            EXPECT_EQ(got[i], want[i])
                << name << " requests " << n << " steps " << steps << " chunk " << chunk << " request " << i;
          }
          pool.check_integrity();
          EXPECT_EQ(pool.free_pages(), pool.num_pages()) << name;
          const SpecStats& st = dec.stats();
          EXPECT_GT(st.rounds, 0);
          EXPECT_EQ(st.drafted, st.rounds * steps);
          EXPECT_GE(st.mean_accept_length(), 1.0);
          EXPECT_LE(st.mean_accept_length(), double(steps + 1));
          if (chunk > 0 && steps > 1) {
            EXPECT_GT(st.mean_accept_length(), 1.5) << name;
          }
          fmt::print("accept {} requests={} steps={} {}: mean {:.3f} ({} accepted / {} drafted, {} rounds)\n",
                     name, n, steps, chunk > 0 ? "oracle" : "mtp", st.mean_accept_length(), st.accepted,
                     st.drafted, st.rounds);
        }
      }
    }
  }
}

TEST(SpecDecoder, FailedRoundReturnsEveryPage) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  auto reqs = make_requests(8, m->config().vocab_size);
  for (SpecRequest& r : reqs) r.max_new_tokens = 200;
  // Room for the prompts and a few rounds only: a draft reservation fails mid-run.
  KvPool pool(m->make_cache(64, 4));
  SpecDecoder dec(*m, pool, eagle(3));
  try {
    dec.generate(reqs);
    FAIL() << "expected the pool to run out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV pool"), std::string::npos) << e.what();
  }
  EXPECT_GT(dec.stats().rounds, 8);  // it failed mid-run, not at the prefill
  pool.check_integrity();
  EXPECT_EQ(pool.free_pages(), pool.num_pages());
}

TEST(SpecConfig, ValidationNamesTheFlag) {
  const auto msg = [](SpeculativeConfig c, int64_t mtp) -> std::string {
    try {
      c.validate(mtp);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(msg(eagle(3), 1), "");
  SpeculativeConfig nextn = eagle(5);
  nextn.algorithm = "NEXTN";
  nextn.num_draft_tokens = 6;
  EXPECT_EQ(msg(nextn, 1), "");
  EXPECT_EQ(eagle(4).resolved().num_draft_tokens, 5);
  SpeculativeConfig c = eagle(3);
  c.algorithm = "MEDUSA";
  EXPECT_NE(msg(c, 1).find("--speculative-algorithm"), std::string::npos);
  EXPECT_NE(msg(eagle(0), 1).find("--speculative-num-steps"), std::string::npos);
  c = eagle(3);
  c.eagle_topk = 4;
  EXPECT_NE(msg(c, 1).find("--speculative-eagle-topk"), std::string::npos);
  c = eagle(3);
  c.num_draft_tokens = 8;
  EXPECT_NE(msg(c, 1).find("--speculative-num-draft-tokens"), std::string::npos);
  EXPECT_NE(msg(eagle(3), 0).find("MTP"), std::string::npos);
  SpeculativeConfig off;
  off.num_steps = 3;
  EXPECT_NE(msg(off, 1).find("--speculative-algorithm"), std::string::npos);
}

}  // namespace
}  // namespace dsaserve::runtime
