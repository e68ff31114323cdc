// Job: engine outputs in, OpenAI responses out, with the built-in model and tokenizer (the engine thread is
// not started: the test plays the engine's outputs, so it controls the generated text exactly).
// Reasoning and tool calls are parsed into reasoning_content / tool_calls, streamed and not.
#include "server/generation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "grammar/structural_tag.h"
#include "server/builtin.h"
#include "server/constrained.h"

namespace dsaserve::server {
namespace {

using nlohmann::json;

struct RecordingSink : ResponseSink {
  int status = 0;
  json body;
  std::vector<json> events;
  bool done = false, ended = false;
  void send_json(int s, const json& b) override {
    status = s;
    body = b;
  }
  void send(int s, std::string b, const std::string&) override {
    status = s;
    body = json::parse(b);
  }
  void stream_begin() override {}
  void stream_event(const std::string& d) override {
    if (d == "[DONE]") {
      done = true;
    } else {
      events.push_back(json::parse(d));
    }
  }
  void stream_end() override { ended = true; }
  void job_done() override {}
};

class JobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = std::filesystem::temp_directory_path() / fmt::format("dsaserve-jobtest-{}", ::getpid());
    model_ = new std::shared_ptr<model::Model>(make_builtin_model(dir));
    std::filesystem::remove_all(dir);
    tok_ = new tokenizer::Tokenizer(make_builtin_tokenizer());
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete model_;
  }
  void SetUp() override {
    runtime::EngineConfig ec;
    ec.kv_pages = 8;
    engine_ = std::make_unique<runtime::LocalFront>(*model_, ec);
    ctx_.engine = engine_.get();
    ctx_.tokenizer = tok_;
    ctx_.metrics = &metrics_;
    ctx_.model_name = "builtin";
    ctx_.reasoning = true;
    ctx_.tool_format = chat::ToolCallFormat::kGlm45;
  }
  // Plays `text` as generated tokens (one output per token), then a finish.
  void play(Job& job, uint64_t engine_id, const std::string& text, runtime::FinishReason why) {
    const auto ids = tok_->encode(text, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      runtime::StepOutput o;
      o.id = engine_id;
      o.token = int32_t(ids[i]);
      o.prompt_tokens = 5;
      o.completion_tokens = int64_t(i + 1);
      if (i + 1 == ids.size()) o.finish = why;
      job.on_output(o);
    }
  }
  GenerationSpec spec(bool stream) {
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
    return parse_chat_request({{"messages", json::array({{{"role", "user"}, {"content", "weather?"}}})},
                               {"tools", tools},
                               {"stream", stream}},
                              512);
  }
  static inline std::shared_ptr<model::Model>* model_ = nullptr;
  static inline tokenizer::Tokenizer* tok_ = nullptr;
  std::unique_ptr<runtime::LocalFront> engine_;
  ServerMetrics metrics_;
  ServingContext ctx_;
};

const char* kOutput =
    "<think>The user wants weather.</think>Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n"
    "<arg_value>Paris</arg_value>\n</tool_call>";

TEST_F(JobTest, ReasoningAndToolCallsNonStreamed) {
  auto sink = std::make_shared<RecordingSink>();
  auto job = std::make_shared<Job>(ctx_, spec(false), std::vector<int32_t>{3, 4, 5, 6, 7}, "prompt", sink,
                                   "/v1/chat/completions", Job::Clock::now());
  job->start();
  play(*job, 1, kOutput, runtime::FinishReason::stop);
  ASSERT_EQ(sink->status, 200) << sink->body.dump();
  const json& m = sink->body["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The user wants weather.");
  EXPECT_EQ(m["content"], "Checking.");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(sink->body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(sink->body["usage"]["completion_tokens"], tok_->encode(kOutput, false).size());
}

TEST_F(JobTest, ReasoningAndToolCallsStreamedAsDeltas) {
  auto sink = std::make_shared<RecordingSink>();
  auto job = std::make_shared<Job>(ctx_, spec(true), std::vector<int32_t>{3, 4, 5, 6, 7}, "prompt", sink,
                                   "/v1/chat/completions", Job::Clock::now());
  job->start();
  play(*job, 1, kOutput, runtime::FinishReason::stop);
  EXPECT_TRUE(sink->done);
  EXPECT_TRUE(sink->ended);
  std::string reasoning, content, name, args;
  for (const json& e : sink->events) {
    const json& d = e["choices"][0]["delta"];
    reasoning += d.value("reasoning_content", "");
    content += d.value("content", "");
    if (d.contains("tool_calls")) {
      for (const json& t : d["tool_calls"]) {
        if (t["function"].contains("name")) name += t["function"]["name"].get<std::string>();
        args += t["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(reasoning, "The user wants weather.");
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}}));
  EXPECT_EQ(sink->events.back()["choices"][0]["finish_reason"], "tool_calls");
}

TEST_F(JobTest, StopStringAbortsAndEngineErrorsBecome400) {
  auto sink = std::make_shared<RecordingSink>();
  GenerationSpec s = parse_completion_request({{"prompt", "x"}, {"stop", "lo w"}}, 512);
  auto job = std::make_shared<Job>(ctx_, s, std::vector<int32_t>{9}, "x", sink, "/v1/completions",
                                   Job::Clock::now());
  job->start();
  play(*job, 1, "hello world", runtime::FinishReason::length);
  EXPECT_EQ(sink->body["choices"][0]["text"], "hel");
  EXPECT_EQ(sink->body["choices"][0]["finish_reason"], "stop");

  auto sink2 = std::make_shared<RecordingSink>();
  auto job2 =
      std::make_shared<Job>(ctx_, parse_completion_request({{"prompt", "x"}}, 512), std::vector<int32_t>{9},
                            "x", sink2, "/v1/completions", Job::Clock::now());
  job2->start();
  runtime::StepOutput err;
  err.id = 2;
  err.finish = runtime::FinishReason::error;
  err.error = "the request needs 9 KV pages";
  job2->on_output(err);
  EXPECT_EQ(sink2->status, 400);
  EXPECT_EQ(sink2->body["error"]["message"], "the request needs 9 KV pages");
}

TEST(PriorityField, IsAnIntegerDefaultingToZeroAndNamedInErrors) {
  using nlohmann::json;
  EXPECT_EQ(parse_completion_request({{"prompt", "x"}}, 512).params.priority, 0);
  EXPECT_EQ(parse_completion_request({{"prompt", "x"}, {"priority", -7}}, 512).params.priority, -7);
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(parse_chat_request({{"messages", msgs}, {"priority", 3}}, 512).params.priority, 3);
  for (const json& bad : {json("high"), json(1.5), json(true), json::array({1}), json(int64_t(1) << 40)}) {
    try {
      parse_completion_request({{"prompt", "x"}, {"priority", bad}}, 512);
      ADD_FAILURE() << "accepted priority " << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "priority") << bad.dump();
    }
  }
}

}  // namespace
// Request bodies keep the client's key order, as Python dicts do for SGLang / transformers: the chat template
// renders tools with their properties as sent, and forced calls / JSON output follow the schema's order.
TEST(RequestBody, KeyOrderReachesTheTemplateAndTheGrammar) {
  const auto body = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
               "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}},
               "required": ["zeta", "alpha"]}}}],
    "tool_choice": "required",
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                        "properties": {"zz": {"type": "string"}, "aa": {"type": "string"}}}}}})");
  const GenerationSpec s = parse_chat_request(body, 512);
  const std::string tools = s.chat_request["tools"].dump();
  EXPECT_LT(tools.find("zeta"), tools.find("alpha")) << tools;
  const std::string schema = s.response_schema.dump();
  EXPECT_LT(schema.find("zz"), schema.find("aa")) << schema;
  const std::string call =
      grammar::tool_calls_format(chat::ToolCallFormat::kGlm45, s.chat_request["tools"], "f").dump();
  ASSERT_NE(call.find("alpha"), std::string::npos) << call;
  EXPECT_LT(call.find("zeta"), call.find("alpha")) << call;
  const std::string js = grammar::json_format(s.response_schema).dump();
  EXPECT_LT(js.find("zz"), js.find("aa")) << js;
}

// A forced call's reasoning block: on with a reasoning parser, off when the request turns thinking off or
// the template already closed the block in the prompt (DeepSeek V3.1-style "</think>" default).
TEST(ReasoningPrefix, FollowsTheParserTheKwargsAndThePrompt) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  const GenerationSpec on = parse_chat_request({{"messages", msgs}, {"max_tokens", 100}}, 512);
  EXPECT_TRUE(reasoning_prefix(on, true, "<|user|>hi<|assistant|>").enabled);
  EXPECT_EQ(reasoning_prefix(on, true, "<|user|>hi<|assistant|>").max_tokens, 32);
  EXPECT_FALSE(reasoning_prefix(on, true, "<|user|>hi<|assistant|>").opened_in_prompt);
  EXPECT_TRUE(reasoning_prefix(on, true, "<|user|>hi<|assistant|><think>").opened_in_prompt);
  EXPECT_FALSE(reasoning_prefix(on, false, "<|user|>hi<|assistant|>").enabled);
  EXPECT_FALSE(reasoning_prefix(on, true, "<｜User｜>hi<｜Assistant｜></think>").enabled);
  EXPECT_FALSE(reasoning_prefix(on, true, "<|assistant|><think></think>\n").enabled);
  const GenerationSpec off =
      parse_chat_request({{"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}}, 512);
  EXPECT_FALSE(reasoning_prefix(off, true, "<|user|>hi<|assistant|>").enabled);
}

}  // namespace dsaserve::server
