// Chat requests' messages and tools, checked as OpenAI checks them (each error a 400 naming the field), and
// turns of tool calls as OpenAI's clients send them (null content, arguments as JSON text) rendered by each
// fixture template exactly as transformers renders the form that template was written for.
#include "server/openai.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/chat_config.h"
#include "chat/chat_template.h"
#include "common/fixtures.h"

namespace dsaserve::server {
namespace {

using json = nlohmann::ordered_json;

// The field a rejected request names, or "" when it is accepted.
std::string rejected_param(const std::string& body) {
  try {
    (void)parse_chat_request(json::parse(body), 512);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(std::string(e.what()).find(e.param), std::string::npos) << e.what();
    return e.param;
  }
  return "";
}

const char* kCall =
    R"({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}})";

std::string with_turns(const std::string& turns) {
  return R"({"messages": [{"role": "user", "content": "hi"}, )" + turns + "]}";
}

TEST(ChatMessages, MalformedMessagesAreRejectedNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": []}]})", "messages[0].content"},
      {R"({"messages": [{"role": "system"}]})", "messages[0].content"},
      {with_turns(R"({"role": "assistant"})"), "messages[1].content"},
      {with_turns(R"({"role": "assistant", "content": null, "tool_calls": []})"), "messages[1].content"},
      {with_turns(R"({"role": "tool", "content": "ok"})"), "messages[1].tool_call_id"},
      {with_turns(R"({"role": "tool", "tool_call_id": 7, "content": "ok"})"), "messages[1].tool_call_id"},
      {with_turns(R"({"role": "tool", "tool_call_id": "c1"})"), "messages[1].content"},
      {with_turns(R"({"role": "assistant", "tool_calls": "zzz"})"), "messages[1].tool_calls"},
      {with_turns(R"({"role": "assistant", "tool_calls": [1, 2]})"), "messages[1].tool_calls[0]"},
      {with_turns(R"({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]})"),
       "messages[1].tool_calls[0].function"},
      {with_turns(R"({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f",
         "arguments": "{}"}}]})"),
       "messages[1].tool_calls[0].id"},
      {with_turns(
           R"({"role": "assistant", "tool_calls": [{"id": "c1", "type": "code", "function": {"name": "f",
         "arguments": "{}"}}]})"),
       "messages[1].tool_calls[0].type"},
      {with_turns(R"({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "",
         "arguments": "{}"}}]})"),
       "messages[1].tool_calls[0].function.name"},
      {with_turns(R"({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]})"),
       "messages[1].tool_calls[0].function.arguments"},
      {with_turns(R"({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f",
         "arguments": 5}}]})"),
       "messages[1].tool_calls[0].function.arguments"},
      {with_turns(std::string(R"({"role": "user", "content": "x", "tool_calls": [)") + kCall + "]}"),
       "messages[1].tool_calls"},
      {with_turns(R"({"role": "user", "content": "x", "name": 3})"), "messages[1].name"},
      {with_turns(R"({"role": "assistant", "content": "x", "reasoning_content": ["r"]})"),
       "messages[1].reasoning_content"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(rejected_param(body), param) << body;
}

TEST(ChatMessages, MalformedToolsAreRejectedNamingTheField) {
  auto tools = [](const std::string& t) {
    return R"({"messages": [{"role": "user", "content": "hi"}], "tools": [)" + t + "]}";
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {tools(R"({"type": "function", "function": {"name": "f", "parameters": "x"}})"),
       "tools[0].function.parameters"},
      {tools(R"({"type": "function", "function": {"name": "f", "parameters": []}})"),
       "tools[0].function.parameters"},
      {tools(R"({"type": "function", "function": {"name": ""}})"), "tools[0].function.name"},
      {tools(R"({"type": "function", "function": {"name": "get weather"}})"), "tools[0].function.name"},
      {tools(R"({"type": "function", "function": {"name": "f<x>"}})"), "tools[0].function.name"},
      {tools(R"({"type": "function", "function": {"name": ")" + std::string(257, 'a') + R"("}})"),
       "tools[0].function.name"},
      {tools(R"({"type": "function", "function": {"name": "f", "description": 4}})"),
       "tools[0].function.description"},
      {tools(R"({"type": "retrieval", "function": {"name": "f"}})"), "tools[0].type"},
      {tools(R"({"type": "function"})"), "tools[0].function"},
      {tools(
           R"({"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}})"),
       "tools[1].function.name"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(rejected_param(body), param) << body;
}

TEST(ChatMessages, TemplateKwargsDoNotReplaceTheRequestsOwnVariables) {
  for (const char* own : {"messages", "tools", "documents", "add_generation_prompt"}) {
    const json body = {{"messages", json::array({json{{"role", "user"}, {"content", "hi"}}})},
                       {"chat_template_kwargs", json{{"enable_thinking", false}, {own, json::array()}}}};
    EXPECT_EQ(rejected_param(body.dump()), "chat_template_kwargs") << own;
  }
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "user", "content": "hi"}],
                               "chat_template_kwargs": {"enable_thinking": false, "bos_token": ""}})"),
            "");
}

TEST(ChatMessages, WhatOpenAIAcceptsIsAccepted) {
  const std::vector<std::string> ok = {
      with_turns(std::string(R"({"role": "assistant", "content": null, "tool_calls": [)") + kCall +
                 R"(]}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"})"),
      with_turns(std::string(R"({"role": "assistant", "tool_calls": [)") + kCall + "]}"),
      with_turns(R"({"role": "assistant", "content": "", "tool_calls": null})"),
      with_turns(R"({"role": "user", "content": "x", "tool_calls": []})"),  // what some clients send
      with_turns(R"({"role": "assistant", "content": [{"type": "text", "text": "a"}], "name": "bot"})"),
      with_turns(R"({"role": "developer", "content": ""})"),
      R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function":
         {"name": "mcp.get_time-v2", "parameters": {"type": "object"}}}, {"function": {"name": "g"}}]})",
  };
  for (const auto& body : ok) EXPECT_EQ(rejected_param(body), "") << body;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Each fixture case with tool calls, sent as an OpenAI client sends it (content null on a turn of calls
// alone, arguments as JSON text, call ids), renders through the server's request path (checks, the template's
// form, the template) exactly as transformers rendered the case (written in the form its template takes).
TEST(ChatMessages, ToolCallTurnsFromOpenAIClientsRenderAsTransformersDoes) {
  DSA_FIXTURE_PATH(cases_path, "text/chat_cases.jsonl");
  DSA_FIXTURE_PATH(tokenizer_dir, "tokenizers/deepseek_v3");
  const chat::ChatConfig config = chat::ChatConfig::load(tokenizer_dir);
  std::ifstream in(cases_path);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const json c = json::parse(line);
    bool has_calls = false;
    json messages = json::array();
    for (json m : c["messages"]) {
      if (m.contains("tool_calls")) {
        has_calls = true;
        if (m["content"] == "") m["content"] = nullptr;
        int k = 0;
        for (json& call : m["tool_calls"]) {
          call["id"] = "call_" + std::to_string(k++);
          json& args = call["function"]["arguments"];
          if (!args.is_string()) args = args.dump();
        }
      }
      if (m["role"] == "tool") m["tool_call_id"] = "call_0";
      messages.push_back(m);
    }
    if (!has_calls) continue;
    ++cases;
    const std::string name = c["template"].get<std::string>();
    const chat::ChatTemplate tmpl(
        read_file(::dsaserve::testing::fixtures_dir() / "templates" / (name + ".jinja")),
        config.special_tokens());
    json body = {{"messages", messages}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    GenerationSpec spec = parse_chat_request(body, 512);
    fit_tool_call_form(spec, chat::probe_tool_call_form(tmpl));
    spec.chat_request["add_generation_prompt"] = c["add_generation_prompt"];
    if (!c["kwargs"].is_null()) spec.chat_request["chat_template_kwargs"] = c["kwargs"];
    EXPECT_EQ(tmpl.render(spec.chat_request), c["rendered"].get<std::string>()) << c["case"];
  }
  EXPECT_GE(cases, 2);  // GLM's (object arguments) and DeepSeek-V3's (text arguments, null content)
}

// continue_final_message (vLLM's and SGLang's extension): the prompt ends right after the final message's
// text, with no generation prompt; GLM's template strips the text (the cut falls after the stripped text),
// DeepSeek-V3's keeps it and closes the turn with its end token (cut off).
TEST(ChatMessages, ContinueFinalMessageEndsThePromptAtItsText) {
  DSA_FIXTURE_PATH(tokenizer_dir, "tokenizers/deepseek_v3");
  const chat::ChatConfig config = chat::ChatConfig::load(tokenizer_dir);
  const json messages = json::parse(R"([{"role": "user", "content": "Name a colour."},
                                        {"role": "assistant", "content": " Sure, the colour is "}])");
  for (const auto& [name, want_end] : std::vector<std::pair<std::string, std::string>>{
           {"glm_4_6", "\nSure, the colour is"}, {"deepseek_v3", "<｜Assistant｜> Sure, the colour is "}}) {
    const chat::ChatTemplate tmpl(
        read_file(::dsaserve::testing::fixtures_dir() / "templates" / (name + ".jinja")),
        config.special_tokens());
    GenerationSpec spec =
        parse_chat_request(json{{"messages", messages}, {"continue_final_message", true}}, 512);
    EXPECT_EQ(spec.chat_request["add_generation_prompt"], false);
    ASSERT_TRUE(spec.continue_final_text.has_value());
    const std::string whole = tmpl.render(spec.chat_request);
    const std::string cut = chat::cut_after_final_message(whole, *spec.continue_final_text);
    EXPECT_EQ(cut, whole.substr(0, cut.size())) << name;
    ASSERT_GE(cut.size(), want_end.size());
    EXPECT_EQ(cut.substr(cut.size() - want_end.size()), want_end) << name << ": " << cut;
    if (name == "deepseek_v3") {
      EXPECT_LT(cut.size(), whole.size());  // the end token is cut off
    }
  }
  // A list of parts continues after its last part's text (as transformers).
  GenerationSpec parts = parse_chat_request(
      json::parse(R"({"messages": [{"role": "assistant", "content": [{"type": "text", "text": "a"},
                     {"type": "text", "text": "b"}]}], "continue_final_message": true})"),
      512);
  EXPECT_EQ(parts.continue_final_text, "b");
  EXPECT_EQ(rejected_param(R"({"messages": [{"role": "assistant", "content": "x"}],
                               "continue_final_message": true, "add_generation_prompt": true})"),
            "continue_final_message");
  json calls_last =
      json::parse(with_turns(std::string(R"({"role": "assistant", "tool_calls": [)") + kCall + "]}"));
  calls_last["continue_final_message"] = true;
  EXPECT_EQ(rejected_param(calls_last.dump()), "continue_final_message");
  GenerationSpec plain = parse_chat_request(
      json::parse(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false})"),
      512);
  EXPECT_EQ(plain.chat_request["add_generation_prompt"], false);
  EXPECT_FALSE(plain.continue_final_text.has_value());
  EXPECT_THROW(chat::cut_after_final_message("<user>hi<assistant>", "something else"), std::exception);
}

TEST(ChatMessages, ArgumentsAreTheTextOfAnObjectWhereTheTemplateWalksThem) {
  const chat::ToolCallForm objects{true, false, true};
  auto fitted = [&](const std::string& args) {
    json call = json::parse(kCall);
    call["function"]["arguments"] = args;
    GenerationSpec spec = parse_chat_request(
        json{{"messages",
              json::array(
                  {json{{"role", "user"}, {"content", "hi"}},
                   json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}}})}},
        512);
    fit_tool_call_form(spec, objects);
    return spec.chat_request["messages"][1];
  };
  const json m = fitted(R"({"b": [1, 2], "a": "x"})");
  EXPECT_EQ(m["content"], "");
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":[1,2],"a":"x"})");  // order kept
  for (const std::string& bad :
       std::vector<std::string>{"[1]", "\"text\"", "{\"a\":", "not json", std::string(100, '[')}) {
    try {
      (void)fitted(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "messages[1].tool_calls[0].function.arguments") << e.what();
    }
  }
  // A template that reads the text keeps it as sent, whatever it is.
  GenerationSpec spec =
      parse_chat_request(json::parse(with_turns(
                             R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c",
                                                  "function": {"name": "f", "arguments": "not json"}}]})")),
                         512);
  fit_tool_call_form(spec, chat::ToolCallForm{true, true, false});
  EXPECT_TRUE(spec.chat_request["messages"][1]["content"].is_null());
  EXPECT_EQ(spec.chat_request["messages"][1]["tool_calls"][0]["function"]["arguments"], "not json");
}

}  // namespace
}  // namespace dsaserve::server
