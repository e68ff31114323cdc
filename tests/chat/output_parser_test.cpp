// Reasoning and tool-call parsers: complete outputs, then every split of each sample into two chunks,
// byte-by-byte feeding and random multi-chunk splits must add up to the same message; malformed outputs
// degrade to content without throwing.
#include "chat/output_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace dsaserve::chat {
namespace {

const nlohmann::json kTools = nlohmann::json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"},
    "flag": {"type": "boolean"}, "code": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
])");

struct Sample {
  const char* name;
  std::string text;
  bool reasoning;
  bool start_in_reasoning;
  ToolCallFormat format;
  std::string content;
  std::string reasoning_content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

OutputParserOptions options_for(const Sample& s) {
  OutputParserOptions o;
  o.reasoning = s.reasoning;
  o.start_in_reasoning = s.start_in_reasoning;
  o.tool_format = s.format;
  o.tools = kTools;
  o.make_id = [](int i) { return "call_" + std::to_string(i); };
  return o;
}

void expect_message(const Sample& s, const ParsedMessage& m, const std::string& how) {
  EXPECT_EQ(m.content, s.content) << s.name << " (" << how << ")";
  EXPECT_EQ(m.reasoning_content, s.reasoning_content) << s.name << " (" << how << ")";
  ASSERT_EQ(m.tool_calls.size(), s.calls.size()) << s.name << " (" << how << ")";
  for (size_t i = 0; i < s.calls.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i].id, "call_" + std::to_string(i)) << s.name;
    EXPECT_EQ(m.tool_calls[i].name, s.calls[i].first) << s.name << " (" << how << ")";
    EXPECT_EQ(m.tool_calls[i].arguments, s.calls[i].second) << s.name << " (" << how << ")";
    EXPECT_TRUE(nlohmann::json::accept(m.tool_calls[i].arguments))
        << s.name << ": " << m.tool_calls[i].arguments;
  }
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Feeds the chunks; checks the OpenAI delta rules (id and name exactly on the first delta of a call,
// indices in order) and returns the accumulated message.
ParsedMessage feed_chunks(const Sample& s, const std::vector<std::string_view>& chunks) {
  OutputParser p(options_for(s));
  ParsedMessage m;
  int opened = 0;
  auto check = [&](const OutputDelta& d) {
    for (const ToolCallDelta& t : d.tool_calls) {
      EXPECT_TRUE(valid_utf8(t.arguments)) << s.name << ": fragment splits a UTF-8 character";
      if (t.index == opened) {
        EXPECT_FALSE(t.id.empty()) << s.name;
        EXPECT_FALSE(t.name.empty()) << s.name;
        ++opened;
      } else {
        EXPECT_LT(t.index, opened) << s.name;
        EXPECT_TRUE(t.id.empty() && t.name.empty()) << s.name;
      }
    }
    m.apply(d);
  };
  for (std::string_view c : chunks) check(p.feed(c));
  check(p.finish());
  return m;
}

void check_sample(const Sample& s) {
  expect_message(s, parse_output(s.text, options_for(s)), "whole");
  const std::string_view t = s.text;
  for (size_t i = 0; i <= t.size(); ++i) {
    const ParsedMessage m = feed_chunks(s, {t.substr(0, i), t.substr(i)});
    if (m.content != s.content || m.reasoning_content != s.reasoning_content ||
        m.tool_calls.size() != s.calls.size()) {
      expect_message(s, m, "split at " + std::to_string(i));
      return;
    }
    expect_message(s, m, "split at " + std::to_string(i));
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < t.size(); ++i) bytes.push_back(t.substr(i, 1));
  expect_message(s, feed_chunks(s, bytes), "byte by byte");
  std::mt19937 rng(7);
  for (int r = 0; r < 100; ++r) {
    std::vector<std::string_view> chunks;
    size_t pos = 0;
    while (pos < t.size()) {
      const size_t n = std::min<size_t>(t.size() - pos, 1 + rng() % 12);
      chunks.push_back(t.substr(pos, n));
      pos += n;
    }
    expect_message(s, feed_chunks(s, chunks), "random split " + std::to_string(r));
  }
}

constexpr auto kGlm = ToolCallFormat::kGlm45;
constexpr auto kDs = ToolCallFormat::kDeepSeekV3;
constexpr auto kDsml = ToolCallFormat::kDeepSeekV32;
constexpr auto kNone = ToolCallFormat::kNone;

TEST(ReasoningParser, GlmAndDeepSeekStyles) {
  const std::vector<Sample> samples = {
      {"glm think",
       "<think>Let me think.\nOK.</think>\nThe answer is 4.",
       true,
       false,
       kNone,
       "The answer is 4.",
       "Let me think.\nOK.",
       {}},
      {"glm leading newline", "\n<think>r</think>c", true, false, kNone, "c", "r", {}},
      {"glm no think",
       "Just content <think> later",
       true,
       false,
       kNone,
       "Just content <think> later",
       "",
       {}},
      {"glm empty think", "<think></think>\n\nHi", true, false, kNone, "Hi", "", {}},
      {"r1 opened in prompt",
       "Reasoning here</think>\n\nHello",
       true,
       true,
       kNone,
       "Hello",
       "Reasoning here",
       {}},
      {"r1 truncated reasoning", "still thinking <th", true, true, kNone, "", "still thinking <th", {}},
      {"unicode", "<think>思考 😀</think>答案", true, false, kNone, "答案", "思考 😀", {}},
      {"only whitespace", "  \n", true, false, kNone, "  \n", "", {}},
      {"almost a tag", "<thin>x</think>", true, false, kNone, "<thin>x</think>", "", {}},
  };
  for (const Sample& s : samples) check_sample(s);
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>\n<think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<|assistant|>"));
}

TEST(GlmToolParser, CompleteAndSplit) {
  const std::string call1 =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</"
      "arg_key>\n"
      "<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"C\"}</arg_value>\n"
      "<arg_key>flag</arg_key>\n<arg_value>True</arg_value>\n</tool_call>";
  const std::vector<Sample> samples = {
      {"glm one call",
       "<think>need a tool</think>\nLet me check.\n" + call1,
       true,
       false,
       kGlm,
       "Let me check.\n",
       "need a tool",
       {{"get_weather", R"({"city": "Beijing", "days": 3, "opts": {"unit": "C"}, "flag": true})"}}},
      {"glm two calls",
       call1 + "\n<tool_call>get_time\n</tool_call>",
       true,
       false,
       kGlm,
       "\n",
       "",
       {{"get_weather", R"({"city": "Beijing", "days": 3, "opts": {"unit": "C"}, "flag": true})"},
        {"get_time", "{}"}}},
      {"glm string typed",
       "<tool_call>get_weather<arg_key>city</arg_key><arg_value>42</arg_value><arg_key>code</arg_key>"
       "<arg_value>if a < b:\n  print(\"x\")</arg_value></tool_call>",
       false,
       false,
       kGlm,
       "",
       "",
       {{"get_weather", R"j({"city": "42", "code": "if a < b:\n  print(\"x\")"})j"}}},
      {"glm unicode string value",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京 😀 \"q\"\t</arg_value>\n</tool_call>",
       false,
       false,
       kGlm,
       "",
       "",
       {{"get_weather", R"({"city": "北京 😀 \"q\"\t"})"}}},
      {"glm unknown tool",
       "<tool_call>other\n<arg_key>n</arg_key>\n<arg_value>5</arg_value>\n<arg_key>s</arg_key>\n"
       "<arg_value>text</arg_value>\n</tool_call>",
       false,
       false,
       kGlm,
       "",
       "",
       {{"other", R"({"n": 5, "s": "text"})"}}},
      {"glm tool call inside reasoning stays reasoning",
       "<think><tool_call>x</tool_call></think>ok",
       true,
       false,
       kGlm,
       "ok",
       "<tool_call>x</tool_call>",
       {}},
      {"glm plain text with angle brackets",
       "a < b and <tool> x </tool_call>",
       false,
       false,
       kGlm,
       "a < b and <tool> x </tool_call>",
       "",
       {}},
  };
  for (const Sample& s : samples) check_sample(s);
}

TEST(GlmToolParser, StringValuesStreamBeforeTheirClosingTag) {
  OutputParserOptions o;
  o.tool_format = kGlm;
  o.tools = kTools;
  OutputParser p(o);
  ParsedMessage m;
  // The chunk ends inside the UTF-8 bytes of 北 (e5 8c 97): those are held back.
  m.apply(p.feed("<tool_call>get_weather\n<arg_key>code</arg_key>\n<arg_value>print(\"\xe5\x8c"));
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"code": "print(\")");
  m.apply(p.feed("\x97京\")\n</arg_val"));
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"code": "print(\"北京\")\n)");
  m.apply(p.feed("ue></tool_call>"));
  m.apply(p.finish());
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"code": "print(\"北京\")\n"})");
  EXPECT_EQ(m.content, "");
}

TEST(GlmToolParser, MalformedDegradesToContent) {
  const std::vector<Sample> samples = {
      {"glm unclosed before name",
       "text <tool_call>get_wea",
       false,
       false,
       kGlm,
       "text <tool_call>get_wea",
       "",
       {}},
      {"glm unclosed value",
       "Hi\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
       false,
       false,
       kGlm,
       "Hi\n",
       "",
       {{"get_weather", R"({"city": "Par"})"}}},
      {"glm unclosed typed value",
       "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3",
       false,
       false,
       kGlm,
       "\n<arg_key>days</arg_key>\n<arg_value>3",
       "",
       {{"get_weather", "{}"}}},
      {"glm garbage in call",
       "<tool_call>f\n<bogus>x</tool_call> after",
       false,
       false,
       kGlm,
       "\n<bogus>x</tool_call> after",
       "",
       {{"f", "{}"}}},
      {"glm value without key",
       "<tool_call>f\n<arg_key>k</arg_key>oops<arg_value>1</arg_value></tool_call>",
       false,
       false,
       kGlm,
       "\n<arg_key>k</arg_key>oops<arg_value>1</arg_value></tool_call>",
       "",
       {{"f", "{}"}}},
      {"glm empty name",
       "<tool_call>\n<arg_key>k</arg_key></tool_call>",
       false,
       false,
       kGlm,
       "<tool_call>\n<arg_key>k</arg_key></tool_call>",
       "",
       {}},
      {"glm pair then unclosed",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n<arg_k",
       false,
       false,
       kGlm,
       "\n<arg_k",
       "",
       {{"get_weather", R"({"city": "Rome"})"}}},
      {"glm bad json value",
       "<tool_call>get_weather<arg_key>opts</arg_key><arg_value>{bad</arg_value></tool_call>",
       false,
       false,
       kGlm,
       "",
       "",
       {{"get_weather", R"({"opts": "{bad"})"}}},
  };
  for (const Sample& s : samples) check_sample(s);
}

const std::string kV3Calls =
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
    "\"Paris\"}\n```"
    "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<"
    "｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>";

TEST(DeepSeekToolParser, V3AndV31) {
  const std::vector<Sample> samples = {
      {"v3 two calls",
       "Checking." + kV3Calls,
       false,
       false,
       kDs,
       "Checking.",
       "",
       {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}}},
      {"r1 reasoning then call",
       "I should look it up.</think>\n\n" + kV3Calls + "<｜end▁of▁sentence｜>",
       true,
       true,
       kDs,
       "<｜end▁of▁sentence｜>",
       "I should look it up.",
       {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}}},
      {"v3.1 call",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"巴黎\", \"days\": 2}"
       "<｜tool▁call▁end｜><｜tool▁calls▁end｜>done",
       false,
       false,
       kDs,
       "done",
       "",
       {{"get_weather", R"({"city": "巴黎", "days": 2})"}}},
      {"v3.1 bare call token",
       "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
       false,
       false,
       kDs,
       "",
       "",
       {{"get_time", "{}"}}},
  };
  for (const Sample& s : samples) check_sample(s);
}

TEST(DeepSeekToolParser, MalformedDegradesToContent) {
  const std::string bad =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": Paris}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const std::string unclosed =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\"";
  const std::string good_then_bad =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1,<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const std::vector<Sample> samples = {
      {"ds bad json", "x" + bad, false, false, kDs, "x" + bad, "", {}},
      {"ds unclosed", unclosed, false, false, kDs, unclosed, "", {}},
      {"ds no separator",
       "<｜tool▁call▁begin｜>get_time{}<｜tool▁call▁end｜>",
       false,
       false,
       kDs,
       "<｜tool▁call▁begin｜>get_time{}<｜tool▁call▁end｜>",
       "",
       {}},
      {"ds good then bad",
       good_then_bad,
       false,
       false,
       kDs,
       "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>[1,<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "",
       {{"get_time", "{}"}}},
  };
  for (const Sample& s : samples) check_sample(s);
}

TEST(DeepSeekV32ToolParser, DsmlCalls) {
  const std::string calls =
      "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"unit\": "
      "\"C\"}</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
  const std::vector<Sample> samples = {
      {"dsml two calls",
       "Let me see." + calls,
       false,
       false,
       kDsml,
       "Let me see.",
       "",
       {{"get_weather", R"({"city": "Paris", "days": 3, "opts": {"unit": "C"}})"}, {"get_time", "{}"}}},
      {"v3.2 thinking then dsml",
       "plan</think>" + calls,
       true,
       true,
       kDsml,
       "",
       "plan",
       {{"get_weather", R"({"city": "Paris", "days": 3, "opts": {"unit": "C"}})"}, {"get_time", "{}"}}},
      {"dsml json body",
       "<｜DSML｜function_calls><｜DSML｜invoke name=\"get_weather\">{\"city\": \"Oslo\"}</｜DSML｜invoke>"
       "</｜DSML｜function_calls>",
       false,
       false,
       kDsml,
       "",
       "",
       {{"get_weather", R"({"city": "Oslo"})"}}},
      {"dsml unclosed parameter",
       "<｜DSML｜function_calls><｜DSML｜invoke name=\"get_weather\"><｜DSML｜parameter "
       "name=\"city\" string=\"true\">Par",
       false,
       false,
       kDsml,
       "",
       "",
       {{"get_weather", R"({"city": "Par"})"}}},
      {"dsml invoke without name",
       "<｜DSML｜function_calls><｜DSML｜invoke>x",
       false,
       false,
       kDsml,
       "<｜DSML｜function_calls><｜DSML｜invoke>x",
       "",
       {}},
  };
  for (const Sample& s : samples) check_sample(s);
}

}  // namespace
}  // namespace dsaserve::chat
