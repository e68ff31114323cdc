// Grammar-constrained requests under speculative decoding (xgrammar's matcher with rollback):
// - a round (drafts masked and accepted, rolled back, the emitted run accepted again as the
//   OutputProcessor does) leaves the matcher where token-by-token decoding leaves it: the same mask at
//   every round boundary, the same termination, for JSON schemas, json_object and a forced tool call
//   behind a bounded reasoning block (whose token budget xgrammar enforces through its masks);
// - through the engine on tiny and realdims: greedy constrained output with speculation equals the output
//   without, token for token (several schemas at once, one that completes inside a round, a forced tool
//   call), with the MTP layer's drafts and with an oracle drafter whose planted mistakes the grammar
//   partly refuses; seeded sampled requests with speculation stay schema-valid JSON.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "chat/output_parser.h"
#include "common/fixtures.h"
#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/structural_tag.h"
#include "runtime/engine/engine.h"
#include "runtime/spec/spec_sampling.h"
#include "server/builtin.h"

namespace dsaserve::grammar {
namespace {

using chat::ToolCallFormat;
using nlohmann::json;

constexpr int32_t kEos = 1;  // the builtin tokenizer's <|endoftext|> (the fixtures' eos_token_id)

const tokenizer::Tokenizer& builtin_tokenizer() {
  static const tokenizer::Tokenizer t = server::make_builtin_tokenizer();
  return t;
}

// One backend per vocabulary size (tiny: 512, realdims: 1024; ids past the tokenizer's never allowed).
GrammarBackend& backend(int64_t vocab) {
  static std::map<int64_t, std::unique_ptr<GrammarBackend>> all;
  auto& b = all[vocab];
  if (!b) b = std::make_unique<GrammarBackend>(builtin_tokenizer(), vocab, std::vector<int32_t>{kEos});
  return *b;
}

json tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city", "days"]}}}])");
}

json bounded_schema() {
  return json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
      "n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
      "required": ["name", "n", "ok"]})");
}

struct Grammar {
  std::string name;
  json tag;
};

std::vector<Grammar> grammars() {
  return {
      {"json_schema", structural_tag(json_format(bounded_schema()), {})},
      {"json_object", structural_tag(json_format(nullptr), {})},
      // A few tokens then the stop token: it completes inside the first speculative rounds.
      {"enum", structural_tag(json_format(json{{"enum", {"Paris", "Tokyo", "New York"}}}), {})},
      {"tool_call_reasoning",
       structural_tag(tool_calls_format(ToolCallFormat::kGlm45, tools(), "get_weather"), {true, false, 6})},
  };
}

runtime::TokenMask mask_of(runtime::TokenConstraint& c) {
  runtime::TokenMask m;
  c.fill_mask(m);
  return m;
}

// Random logits with the mass on `favour` when it is >= 0 (so that drafts are accepted often).
void random_row(std::mt19937_64& rng, std::span<float> row, int32_t favour) {
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (float& x : row) x = nd(rng);
  if (favour >= 0) row[size_t(favour)] += 8.0f;
}

TEST(GrammarSpec, RoundsLeaveTheMatcherWhereTokenByTokenDecodingDoes) {
  constexpr int64_t V = 512;
  for (const Grammar& gr : grammars()) {
    const auto g = backend(V).compile(gr.tag);
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const float temperature = seed % 2 == 0 ? 0.0f : 1.0f;
      auto spec = backend(V).make_constraint(g);  // advanced by rounds
      auto ref = backend(V).make_constraint(g);   // mask, accept, token by token
      std::mt19937_64 rng(seed);
      runtime::SamplingParams p;
      p.temperature = temperature;
      p.constraint = spec;
      runtime::SamplerState st(seed, {});
      int64_t tokens = 0, rounds = 0;
      std::vector<int32_t> last_run;
      while (!spec->terminated() && tokens < 300) {
        const int64_t N = 1 + int64_t(rng() % 5);
        std::vector<float> row(size_t(V), 0.0f), rows(size_t((N + 1) * V), 0.0f);
        std::vector<int32_t> drafts;
        {
          runtime::ChainSampler cs(p, st);
          for (int64_t i = 0; i < N; ++i) {
            random_row(rng, row, -1);
            // Every third draft a random token (often one the grammar refuses).
            const bool plant = rng() % 3 == 0;
            const int32_t planted = int32_t(8 + rng() % 492);  // an ordinary token (not special)
            drafts.push_back(cs.propose(row, i, [&](int64_t, int32_t x) { return plant ? planted : x; }));
          }
          for (int64_t i = 0; i <= N; ++i) {
            random_row(rng, std::span<float>(rows).subspan(size_t(i * V), size_t(V)),
                       i < N && rng() % 4 != 0 ? drafts[size_t(i)] : -1);
          }
          const std::vector<runtime::SampleResult> run = cs.judge(rows, V);
          ASSERT_FALSE(run.empty());
          last_run.clear();
          for (const auto& r : run) last_run.push_back(r.token);
        }
        ++rounds;
        // As the OutputProcessor does: accept the run, cut where the grammar completes.
        for (int32_t t : last_run) {
          ASSERT_FALSE(ref->terminated());
          ASSERT_TRUE(mask_of(*ref).allows(t)) << gr.name << " seed " << seed << ": token " << t;
          ASSERT_TRUE(ref->accept(t));
          ASSERT_TRUE(spec->accept(t)) << gr.name << " seed " << seed << ": token " << t;
          ++tokens;
          if (spec->terminated()) break;
        }
        ASSERT_EQ(spec->terminated(), ref->terminated()) << gr.name << " seed " << seed;
        if (ref->terminated()) {
          EXPECT_EQ(last_run.back(), kEos) << "the run ends at the stop token";
          break;
        }
        ASSERT_EQ(mask_of(*spec).words, mask_of(*ref).words)
            << gr.name << " seed " << seed << " after " << tokens << " tokens, " << rounds << " rounds";
      }
      if (gr.name != "json_object") {
        EXPECT_TRUE(spec->terminated()) << gr.name << " seed " << seed << ": " << tokens << " tokens";
      }
    }
  }
}

TEST(GrammarSpec, RollbackRestoresTheMaskAndUndoesTermination) {
  constexpr int64_t V = 512;
  auto c =
      backend(V).make_constraint(backend(V).compile(structural_tag(json_format(json{{"const", 7}}), {})));
  const runtime::TokenMask start = mask_of(*c);
  ASSERT_TRUE(c->accept(int32_t(8 + '7')));  // byte tokens start at id 8
  const runtime::TokenMask after = mask_of(*c);
  ASSERT_TRUE(c->accept(kEos));
  ASSERT_TRUE(c->terminated());
  c->rollback(1);
  EXPECT_FALSE(c->terminated());
  EXPECT_EQ(mask_of(*c).words, after.words);
  c->rollback(1);
  EXPECT_EQ(mask_of(*c).words, start.words);
  EXPECT_THROW(c->rollback(1), Error) << "nothing left to roll back";
  EXPECT_FALSE(c->accept(int32_t(8 + '8')));
  EXPECT_EQ(mask_of(*c).words, start.words) << "a refused token changes nothing";
}

// ---- through the engine ----

struct EngineRun {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, runtime::FinishReason> finish;
  runtime::EngineStats stats;
};

std::vector<int32_t> prompt_ids(const std::string& text) {
  const std::vector<uint32_t> ids = builtin_tokenizer().encode(text);
  return {ids.begin(), ids.end()};
}

// Requests i = 0 .. n-1 of grammar gs[i % gs.size()], all submitted at once, run to completion.
EngineRun run_engine(const std::shared_ptr<const model::Model>& m, const std::vector<Grammar>& gs, int64_t n,
                     float temperature, int64_t steps, runtime::DraftHook hook = {}, int64_t max_new = 40) {
  const int64_t V = m->config().vocab_size;
  runtime::EngineConfig cfg;
  cfg.kv_pages = 512;
  cfg.page_size = 4;
  cfg.check_integrity = true;
  cfg.scheduler.eos_token_ids = {kEos};
  cfg.scheduler.max_running_requests = 64;
  if (steps > 0) {
    cfg.speculative.algorithm = "EAGLE";
    cfg.speculative.num_steps = steps;
    cfg.spec_draft_hook = std::move(hook);
  }
  runtime::Engine e(m, cfg);
  for (int64_t i = 0; i < n; ++i) {
    runtime::GenerateRequest req;
    req.id = uint64_t(i);
    req.prompt = prompt_ids(fmt::format("<|begin|><|user|>Answer {}<|assistant|>", i));
    req.params.temperature = temperature;
    req.params.seed = uint64_t(100 + i);
    req.params.max_new_tokens = max_new;
    req.params.constraint = backend(V).make_constraint(backend(V).compile(gs[size_t(i) % gs.size()].tag));
    e.submit(std::move(req));
  }
  EngineRun r;
  std::vector<runtime::StepOutput> out;
  for (int guard = 0; e.step() && guard < 100000; ++guard) {
    out.clear();
    e.wait_outputs(out, std::chrono::milliseconds(0));
    for (const auto& o : out) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.token >= 0) r.tokens[o.id].push_back(o.token);
      if (o.finish != runtime::FinishReason::none) r.finish[o.id] = o.finish;
    }
  }
  out.clear();
  e.wait_outputs(out, std::chrono::milliseconds(0));
  EXPECT_TRUE(out.empty());
  e.scheduler().check_integrity();
  EXPECT_EQ(e.pool().num_pages() - e.pool().free_pages(), e.cache().cached_pages()) << "pages leaked";
  EXPECT_EQ(int64_t(r.finish.size()), n);
  r.stats = e.stats();
  return r;
}

TEST(GrammarSpec, EngineGreedyWithSpeculationEqualsWithout) {
  DSA_FIXTURE_PATH(models, "models");
  const std::vector<Grammar> gs = grammars();
  const int64_t n = int64_t(gs.size()) * 2;
  for (const char* name : {"tiny", "realdims"}) {
    const std::shared_ptr<const model::Model> m = model::Model::load(models / name, true);
    const int64_t V = m->config().vocab_size;
    const EngineRun want = run_engine(m, gs, n, 0.0f, 0);
    int64_t completed = 0;
    for (const auto& [id, f] : want.finish) completed += f == runtime::FinishReason::stop;
    EXPECT_GE(completed, 2) << name << ": some grammars complete inside max_tokens";
    std::map<uint64_t, size_t> prompt_len;
    for (int64_t i = 0; i < n; ++i)
      prompt_len[uint64_t(i)] = prompt_ids(fmt::format("<|begin|><|user|>Answer {}<|assistant|>", i)).size();
    for (int64_t steps : {1, 3, 5}) {
      for (bool oracle : {false, true}) {
        runtime::DraftHook hook;
        if (oracle) {  // the known continuation, every 4th draft wrong (the grammar refuses many of those)
          hook = [&](uint64_t id, int64_t index, int32_t proposed) -> int32_t {
            const int64_t o = index - int64_t(prompt_len.at(id));
            const auto& w = want.tokens.at(id);
            if (o < 0 || o >= int64_t(w.size())) return proposed;
            return index % 4 == 1 ? int32_t((w[size_t(o)] + 1) % V) : w[size_t(o)];
          };
        }
        const EngineRun got = run_engine(m, gs, n, 0.0f, steps, hook);
        EXPECT_EQ(got.tokens, want.tokens) << name << " steps " << steps << (oracle ? " oracle" : " mtp");
        EXPECT_EQ(got.finish, want.finish) << name << " steps " << steps;
        EXPECT_GT(got.stats.spec_rounds, 0);
        if (oracle && steps > 1) {
          EXPECT_GT(got.stats.spec_accepted_tokens, got.stats.spec_rounds / 2) << name << " steps " << steps;
        }
        fmt::print("grammar spec {} steps={} {}: {} rounds, {} accepted of {} drafted\n", name, steps,
                   oracle ? "oracle" : "mtp", got.stats.spec_rounds, got.stats.spec_accepted_tokens,
                   got.stats.spec_drafted_tokens);
      }
    }
  }
}

TEST(GrammarSpec, SampledWithSpeculationStaysValidJson) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const std::shared_ptr<const model::Model> m = model::Model::load(tiny, true);
  const std::vector<Grammar> gs = {{"json_schema", structural_tag(json_format(bounded_schema()), {})}};
  constexpr int64_t kN = 48;
  const EngineRun r = run_engine(m, gs, kN, 1.0f, 3, {}, 200);
  EXPECT_GT(r.stats.spec_rounds, 0);
  EXPECT_GT(r.stats.spec_accepted_tokens, 0);
  for (int64_t i = 0; i < kN; ++i) {
    const auto& t = r.tokens.at(uint64_t(i));
    ASSERT_EQ(r.finish.at(uint64_t(i)), runtime::FinishReason::stop) << i;
    ASSERT_EQ(t.back(), kEos);
    const std::vector<uint32_t> ids(t.begin(), t.end() - 1);
    const std::string text = builtin_tokenizer().decode(ids, true);
    const json v = json::parse(text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << i << ": " << text;
    EXPECT_EQ(v.size(), 3u) << text;
    ASSERT_TRUE(v["name"].is_string() && v["n"].is_number_integer() && v["ok"].is_boolean()) << text;
    EXPECT_LE(v["n"].get<int>(), 99) << text;
  }
  fmt::print("grammar spec sampled: {} rounds, {} accepted of {} drafted\n", r.stats.spec_rounds,
             r.stats.spec_accepted_tokens, r.stats.spec_drafted_tokens);
}

}  // namespace
}  // namespace dsaserve::grammar
