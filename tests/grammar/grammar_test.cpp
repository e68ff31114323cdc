// Grammar-constrained decoding: forced tool calls (GLM, DeepSeek V3, DeepSeek V3.2 DSML), a bounded
// reasoning block and response_format JSON, decoded from random logits under the mask (seeded sampling at
// temperature 1 and greedy): every sampled token is accepted by the matcher, decoding ends with the stop
// token, and the text parses with the chat module's parsers into the forced function with schema-valid
// arguments. Then the same through the engine on the tiny fixture model, and xgrammar's errors. Prints
// the measured compile and per-step mask times ("RESULT" lines).
#include "grammar/grammar.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "chat/output_parser.h"
#include "common/fixtures.h"
#include "core/error.h"
#include "grammar/structural_tag.h"
#include "runtime/engine/engine.h"
#include "runtime/sampler/sampler.h"
#include "server/builtin.h"

namespace dsaserve::grammar {
namespace {

using chat::ToolCallFormat;
using nlohmann::json;

constexpr int32_t kEos = 1;  // the builtin tokenizer's <|endoftext|> (and the tiny model's eos_token_id)

json tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "New York"]},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7},
                     "metric": {"type": "boolean"}},
      "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"]}}},
    {"type": "function", "function": {"name": "ping"}}])");
}

const tokenizer::Tokenizer& builtin_tokenizer() {
  static const tokenizer::Tokenizer t = server::make_builtin_tokenizer();
  return t;
}

GrammarBackend& builtin_backend() {
  static GrammarBackend b(builtin_tokenizer(), 512, {kEos});
  return b;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The arguments of a call of `name` follow its schema in tools().
void expect_valid_arguments(const std::string& name, const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << name << ": " << arguments;
  if (name == "get_weather") {
    ASSERT_TRUE(a.contains("city") && a.contains("days")) << arguments;
    EXPECT_TRUE(a["city"] == "Paris" || a["city"] == "Tokyo" || a["city"] == "New York") << arguments;
    ASSERT_TRUE(a["days"].is_number_integer()) << arguments;
    EXPECT_GE(a["days"].get<int>(), 1);
    EXPECT_LE(a["days"].get<int>(), 7);
    if (a.contains("metric")) {
      EXPECT_TRUE(a["metric"].is_boolean()) << arguments;
    }
    EXPECT_LE(a.size(), 3u) << arguments;
  } else if (name == "get_time") {
    ASSERT_TRUE(a.contains("zone") && a["zone"].is_string()) << arguments;
    EXPECT_LE(code_points(a["zone"].get<std::string>()), 6u) << arguments;
    EXPECT_EQ(a.size(), 1u) << arguments;
  } else {
    EXPECT_EQ(name, "ping");
    EXPECT_TRUE(a.empty()) << arguments;
  }
}

struct Walk {
  std::vector<int32_t> tokens;
  std::string text;  // decoded without the final stop token
  bool terminated = false;
  double mask_seconds = 0;       // sample() under the mask
  double mask_only_seconds = 0;  // mask_logits() alone (when timed)
  double free_seconds = 0;       // sample() without a constraint (when timed)
  int64_t steps = 0;
};

// Samples up to max_steps tokens from random logits under a fresh matcher of `g`; every token must be
// accepted.
Walk walk(GrammarBackend& backend, const tokenizer::Tokenizer& tok,
          const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, float temperature,
          int max_steps = 4000, bool timed = false) {
  Walk w;
  auto c = backend.make_constraint(g);
  runtime::SamplingParams p;
  p.temperature = temperature;
  runtime::SamplerState st(seed, {}), free_state(seed, {});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(backend.vocab_size())), scratch, masked;
  for (int i = 0; i < max_steps && !c->terminated(); ++i) {
    for (float& l : logits) l = nd(rng);
    if (timed) {  // the mask alone (the matcher's bitmask applied to a copy), a draw without it
      masked = logits;
      auto m0 = std::chrono::steady_clock::now();
      c->mask_logits(masked);
      w.mask_only_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - m0).count();
      m0 = std::chrono::steady_clock::now();
      runtime::sample(logits, p, free_state, scratch);
      w.free_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - m0).count();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const runtime::SampleResult r = runtime::sample(logits, p, st, scratch, c.get());
    w.mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    w.steps += 1;
    EXPECT_TRUE(c->accept(r.token)) << "token " << r.token << " after " << w.tokens.size();
    w.tokens.push_back(r.token);
  }
  w.terminated = c->terminated();
  std::vector<uint32_t> ids(w.tokens.begin(), w.tokens.end());
  if (w.terminated && !ids.empty()) ids.pop_back();
  w.text = tok.decode(ids, /*skip_special_tokens=*/true);
  return w;
}

void add(Walk& total, const Walk& w) {
  total.mask_seconds += w.mask_seconds;
  total.mask_only_seconds += w.mask_only_seconds;
  total.free_seconds += w.free_seconds;
  total.steps += w.steps;
}

std::string per_step(const Walk& w) {
  const double n = double(std::max<int64_t>(1, w.steps)) / 1e6;
  return fmt::format("mask {:.1f} us, sample under the mask {:.1f} us, sample without {:.1f} us ({} steps)",
                     w.mask_only_seconds / n, w.mask_seconds / n, w.free_seconds / n, w.steps);
}

chat::ParsedMessage parse(const std::string& text, ToolCallFormat f, bool reasoning) {
  chat::OutputParserOptions o;
  o.reasoning = reasoning;
  o.tool_format = f;
  o.tools = tools();
  return chat::parse_output(text, o);
}

struct Case {
  ToolCallFormat format;
  std::string choice;
  float temperature;
};

class ForcedCall : public ::testing::TestWithParam<Case> {};

TEST_P(ForcedCall, EverySampleIsAcceptedAndTheTextParsesIntoTheForcedCall) {
  const Case c = GetParam();
  auto g = builtin_backend().compile(structural_tag(tool_calls_format(c.format, tools(), c.choice), {}));
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Walk w = walk(builtin_backend(), builtin_tokenizer(), g, seed, c.temperature);
    ASSERT_TRUE(w.terminated) << "seed " << seed << ", " << w.tokens.size() << " tokens: " << w.text;
    EXPECT_EQ(w.tokens.back(), kEos);
    const chat::ParsedMessage m = parse(w.text, c.format, false);
    ASSERT_FALSE(m.tool_calls.empty()) << "seed " << seed << ": " << w.text;
    EXPECT_EQ(m.content, "") << w.text;
    for (const auto& call : m.tool_calls) {
      if (c.choice != "required") {
        EXPECT_EQ(call.name, c.choice);
      }
      expect_valid_arguments(call.name, call.arguments);
    }
    if (c.temperature == 0) break;  // greedy: one walk is every walk
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, ForcedCall,
                         ::testing::Values(Case{ToolCallFormat::kGlm45, "required", 1.0f},
                                           Case{ToolCallFormat::kGlm45, "get_weather", 1.0f},
                                           Case{ToolCallFormat::kGlm45, "get_time", 0.0f},
                                           Case{ToolCallFormat::kGlm45, "ping", 1.0f},
                                           Case{ToolCallFormat::kDeepSeekV32, "required", 1.0f},
                                           Case{ToolCallFormat::kDeepSeekV32, "get_weather", 0.0f},
                                           Case{ToolCallFormat::kDeepSeekV3, "required", 1.0f},
                                           Case{ToolCallFormat::kDeepSeekV3, "get_weather", 1.0f}));

TEST(GrammarConstraint, OneCallOnlyWithoutParallelToolCalls) {
  auto g = builtin_backend().compile(
      structural_tag(tool_calls_format(ToolCallFormat::kGlm45, tools(), "required", /*parallel=*/false), {}));
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Walk w = walk(builtin_backend(), builtin_tokenizer(), g, seed, 1.0f);
    ASSERT_TRUE(w.terminated) << json(w.text).dump();
    EXPECT_EQ(parse(w.text, ToolCallFormat::kGlm45, false).tool_calls.size(), 1u) << w.text;
  }
}

TEST(GrammarConstraint, ReasoningBlockIsBoundedThenTheCallFollows) {
  for (const bool opened : {false, true}) {
    ReasoningPrefix r;
    r.enabled = true;
    r.opened_in_prompt = opened;
    r.max_tokens = 16;
    auto g = builtin_backend().compile(
        structural_tag(tool_calls_format(ToolCallFormat::kGlm45, tools(), "get_weather"), r));
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const Walk w = walk(builtin_backend(), builtin_tokenizer(), g, seed, 1.0f);
      ASSERT_TRUE(w.terminated) << json(w.text).dump();
      if (!opened) {
        EXPECT_EQ(w.text.rfind("<think>", 0), 0u) << w.text;
      }
      const size_t close = w.text.find("</think>");
      ASSERT_NE(close, std::string::npos) << w.text;
      // The reasoning text: at most 16 tokens (each at most 2 bytes in this vocabulary, an invalid byte
      // decodes to 3 bytes).
      const size_t begin = opened ? 0 : 7;
      EXPECT_LE(close - begin, 48u) << w.text;
      chat::OutputParserOptions o;
      o.reasoning = true;
      o.start_in_reasoning = opened;
      o.tool_format = ToolCallFormat::kGlm45;
      o.tools = tools();
      const chat::ParsedMessage m = chat::parse_output(w.text, o);
      ASSERT_EQ(m.tool_calls.size(), 1u) << w.text;
      EXPECT_EQ(m.tool_calls[0].name, "get_weather");
      expect_valid_arguments("get_weather", m.tool_calls[0].arguments);
      EXPECT_EQ(m.reasoning_content, w.text.substr(begin, close - begin));
    }
  }
}

TEST(GrammarConstraint, ResponseFormatJsonSchemaAndJsonObject) {
  const json schema =
      json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
      "n": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
      "required": ["name", "n", "ok"]})");
  auto g = builtin_backend().compile(structural_tag(json_format(schema), {}));
  auto any = builtin_backend().compile(structural_tag(json_format(nullptr), {}));
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const Walk w = walk(builtin_backend(), builtin_tokenizer(), g, seed, 1.0f);
    ASSERT_TRUE(w.terminated) << json(w.text).dump();
    const json v = json::parse(w.text, nullptr, false);
    ASSERT_TRUE(v.is_object()) << json(w.text).dump();
    ASSERT_TRUE(v["name"].is_string() && v["n"].is_number_integer() && v["ok"].is_boolean()) << w.text;
    EXPECT_LE(code_points(v["name"].get<std::string>()), 8u) << w.text;
    EXPECT_LE(v["n"].get<int>(), 99);
    EXPECT_EQ(v.size(), 3u) << w.text;
    const Walk o = walk(builtin_backend(), builtin_tokenizer(), any, seed, 1.0f, 2000);
    if (o.terminated) {
      EXPECT_TRUE(json::parse(o.text, nullptr, false).is_object()) << o.text;
    }
  }
}

TEST(GrammarConstraint, BadSchemasAndToolsAreErrorsNotCrashes) {
  EXPECT_THROW(builtin_backend().compile(structural_tag(json_format(json{{"type", "nonsense"}}), {})), Error);
  EXPECT_THROW(tool_calls_format(ToolCallFormat::kGlm45, tools(), "no_such_tool"), Error);
  EXPECT_THROW(tool_calls_format(ToolCallFormat::kNone, tools(), "required"), Error);
  EXPECT_THROW(tool_calls_format(ToolCallFormat::kGlm45, json::array(), "required"), Error);
  try {
    builtin_backend().compile(structural_tag(json_format(json{{"type", "nonsense"}}), {}));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find(".cc:"), std::string::npos) << e.what();
  }
  // The stop token is the only choice once the grammar is complete, and a disallowed token is refused.
  auto c = builtin_backend().make_constraint(
      builtin_backend().compile(structural_tag(json_format(json{{"const", 7}}), {})));
  EXPECT_FALSE(c->accept(int32_t(8 + '8')));  // '8' (byte tokens start at id 8)
  EXPECT_TRUE(c->accept(int32_t(8 + '7')));
  std::vector<float> logits(512, 0.0f);
  c->mask_logits(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_EQ(std::isinf(logits[i]), i != size_t(kEos)) << i;
  }
  EXPECT_TRUE(c->accept(kEos));
  EXPECT_TRUE(c->terminated());
}

TEST(GrammarConstraint, CompileAndMaskTimesAtTheTinyVocabulary) {
  auto tag =
      structural_tag(tool_calls_format(ToolCallFormat::kGlm45, tools(), "required"), {true, false, 64});
  GrammarBackend fresh(builtin_tokenizer(), 512, {kEos});
  auto t0 = std::chrono::steady_clock::now();
  auto g = fresh.compile(tag);
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  fresh.compile(tag);
  const double cached = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Walk all;
  for (uint64_t seed = 1; seed <= 3; ++seed)
    add(all, walk(fresh, builtin_tokenizer(), g, seed, 1.0f, 4000, true));
  std::printf("RESULT grammar vocab 512: compile %.2f ms (cached %.3f ms); per step: %s\n", first * 1e3,
              cached * 1e3, per_step(all).c_str());
  EXPECT_GT(all.steps, 0);
}

TEST(GrammarConstraint, DeepSeekTokenizerDsmlCallsAndTimes) {
  DSA_FIXTURE_PATH(path, "tokenizers/deepseek_v3");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_file(path);
  const auto eos = tok.token_to_id("<｜end▁of▁sentence｜>");
  ASSERT_TRUE(eos.has_value());
  const int64_t vocab =
      129280;  // DeepSeek-V3.x's vocab_size (the tokenizer has fewer ids: the rest are never allowed)
  auto t0 = std::chrono::steady_clock::now();
  GrammarBackend backend(tok, vocab, {int32_t(*eos)});
  const double info_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  auto g = backend.compile(
      structural_tag(tool_calls_format(ToolCallFormat::kDeepSeekV32, tools(), "get_weather"), {}));
  const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Walk all;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    const Walk w = walk(backend, tok, g, seed, 1.0f, 4000, true);
    ASSERT_TRUE(w.terminated) << json(w.text).dump();
    EXPECT_EQ(w.tokens.back(), int32_t(*eos));
    for (int32_t t : w.tokens) EXPECT_LT(t, int32_t(tok.vocab_size()));
    const chat::ParsedMessage m = parse(w.text, ToolCallFormat::kDeepSeekV32, false);
    ASSERT_EQ(m.tool_calls.size(), 1u) << w.text;
    EXPECT_EQ(m.tool_calls[0].name, "get_weather");
    expect_valid_arguments("get_weather", m.tool_calls[0].arguments);
    add(all, w);
  }
  std::printf(
      "RESULT grammar vocab %lld (DeepSeek tokenizer): token table %.2f s, compile %.1f ms; per step: %s\n",
      static_cast<long long>(vocab), info_s, compile_s * 1e3, per_step(all).c_str());
}

// Through the engine: the tiny fixture model with the builtin tokenizer's ids, greedy and sampled.
TEST(GrammarConstraint, TinyModelEngineForcedCallsEndWithStop) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  auto model = model::Model::load(dir, false);
  runtime::EngineConfig cfg;
  cfg.kv_pages = 64;
  cfg.page_size = 16;
  cfg.check_integrity = true;
  cfg.scheduler.eos_token_ids = {kEos};
  runtime::Engine e(model, cfg);
  ReasoningPrefix r{true, false, 16};
  auto g = builtin_backend().compile(
      structural_tag(tool_calls_format(ToolCallFormat::kGlm45, tools(), "required", false), r));
  std::vector<uint32_t> prompt_ids =
      builtin_tokenizer().encode("<|begin|><|user|>What is the weather?<|assistant|>");
  const int n = 4;
  for (int i = 0; i < n; ++i) {
    runtime::GenerateRequest req;
    req.id = uint64_t(i + 1);
    req.prompt.assign(prompt_ids.begin(), prompt_ids.end());
    req.params.temperature = i == 0 ? 0.0f : 1.0f;
    req.params.seed = uint64_t(i);
    req.params.max_new_tokens = 400;
    req.params.constraint = builtin_backend().make_constraint(g);
    e.submit(std::move(req));
  }
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, runtime::FinishReason> finish;
  std::vector<runtime::StepOutput> out;
  for (int guard = 0; int(finish.size()) < n && guard < 10000; ++guard) {
    e.step();
    out.clear();
    e.wait_outputs(out, std::chrono::milliseconds(0));
    for (const auto& o : out) {
      if (o.token >= 0) tokens[o.id].push_back(o.token);
      if (o.finish != runtime::FinishReason::none) finish[o.id] = o.finish;
      EXPECT_TRUE(o.error.empty()) << o.error;
    }
  }
  ASSERT_EQ(int(finish.size()), n);
  for (auto& [id, t] : tokens) {
    EXPECT_EQ(finish[id], runtime::FinishReason::stop) << id;
    ASSERT_EQ(t.back(), kEos);
    std::vector<uint32_t> ids(t.begin(), t.end() - 1);
    const std::string text = builtin_tokenizer().decode(ids, true);
    chat::OutputParserOptions o;
    o.reasoning = true;
    o.tool_format = ToolCallFormat::kGlm45;
    o.tools = tools();
    const chat::ParsedMessage m = chat::parse_output(text, o);
    ASSERT_EQ(m.tool_calls.size(), 1u) << text;
    expect_valid_arguments(m.tool_calls[0].name, m.tool_calls[0].arguments);
  }
}

}  // namespace
}  // namespace dsaserve::grammar
