// Template rendering and streaming-parser runs at a realistic size; they print the measured figures
// (speed targets live in bench/, not in timed tests) and check the results.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "chat/output_parser.h"
#include "common/fixtures.h"
#include "core/error.h"

namespace dsaserve::chat {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(ChatPerf, RenderGlmTemplate) {
  DSA_FIXTURE_PATH(path, "templates/glm_4_6.jinja");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const auto t_parse = std::chrono::steady_clock::now();
  const ChatTemplate t(ss.str(), nlohmann::ordered_json::object());
  const double parse_s = seconds_since(t_parse);
  nlohmann::ordered_json req = {{"add_generation_prompt", true},
                                {"messages", nlohmann::ordered_json::array()}};
  req["tools"] = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (int i = 0; i < 10; ++i) {
    req["messages"].push_back(
        {{"role", "user"}, {"content", "Question number " + std::to_string(i) + " about the weather."}});
    req["messages"].push_back(
        {{"role", "assistant"}, {"content", "<think>thinking</think>Answer " + std::to_string(i)}});
  }
  const int n = 500;
  size_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) bytes += t.render(req).size();
  const double per = seconds_since(t0) / n;
  std::printf("glm_4_6 template: parse %.1f us; render of 20 messages + 1 tool: %.1f us (%zu bytes)\n",
              parse_s * 1e6, per * 1e6, bytes / n);
}

TEST(ChatPerf, StreamingParserThroughput) {
  std::string text = "<think>";
  for (int i = 0; i < 2000; ++i) text += "reasoning step " + std::to_string(i) + " < > </thin ";
  text += "</think>\n";
  for (int i = 0; i < 2000; ++i) text += "content line " + std::to_string(i) + " <tool_ ";
  for (int i = 0; i < 50; ++i) {
    text += "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>" + std::string(200, 'x') +
            "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
  }
  OutputParserOptions o;
  o.reasoning = true;
  o.tool_format = ToolCallFormat::kGlm45;
  o.tools = nlohmann::json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  const auto t0 = std::chrono::steady_clock::now();
  OutputParser p(o);
  ParsedMessage m;
  for (size_t i = 0; i < text.size(); i += 4) m.apply(p.feed(std::string_view(text).substr(i, 4)));
  m.apply(p.finish());
  const double s = seconds_since(t0);
  std::printf("streaming parser: %.1f MB/s in 4-byte chunks (%zu bytes, %zu tool calls)\n",
              text.size() / s / 1e6, text.size(), m.tool_calls.size());
  EXPECT_EQ(m.tool_calls.size(), 50u);
}

TEST(ChatPerf, FormatNames) {
  EXPECT_EQ(tool_call_format_from_name("glm5"), ToolCallFormat::kGlm45);
  EXPECT_EQ(tool_call_format_from_name("deepseek_v31"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(tool_call_format_from_name("deepseek_v32"), ToolCallFormat::kDeepSeekV32);
  EXPECT_THROW(tool_call_format_from_name("llama"), dsaserve::Error);
}

}  // namespace
}  // namespace dsaserve::chat
