#pragma once
// Output parsers: split generated text into OpenAI `reasoning_content`, `content` and `tool_calls`,
// incrementally. A server keeps one OutputParser per request and feeds it detokenized text chunks; every
// feed returns the delta to stream. Chunk boundaries never change the result: tags split across chunks
// are held back until they are complete (or proven not to be tags).
//
// Tool calls stream as OpenAI deltas: the first delta of a call carries index, id and name; later ones
// carry argument fragments that concatenate to the JSON arguments string. Malformed calls (unclosed tags,
// unparseable arguments) never throw: the text that could not be parsed is returned as content.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace dsaserve::chat {

struct ToolCallDelta {
  int index = 0;
  std::string id;         // only on the first delta of a call
  std::string name;       // only on the first delta of a call
  std::string arguments;  // fragment to append to the call's arguments
};

struct OutputDelta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
  void append(const OutputDelta& other);
};

// A whole parsed message (what the deltas of one request add up to).
struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};
struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ParsedToolCall> tool_calls;

  void apply(const OutputDelta& delta);
};

// Makes the id of tool call `index` of a request ("call_" + 24 random alphanumerics by default).
using ToolCallIdGenerator = std::function<std::string(int index)>;
std::string random_tool_call_id(int index);

// ---- reasoning ----

// Splits `<think>reasoning</think>content`. With start_in_reasoning (the template put the opening tag in
// the prompt, e.g. DeepSeek-R1 or V3.x thinking mode) the text is reasoning until the closing tag;
// otherwise the output may open with the tag (after optional whitespace, GLM-4.5+ style) and is plain
// content when it does not. Whitespace right after the closing tag is dropped. Output that ends inside
// the reasoning (no closing tag) stays reasoning: the model ran out of tokens while thinking.
class ReasoningParser {
 public:
  explicit ReasoningParser(bool start_in_reasoning, std::string open_tag = "<think>",
                           std::string close_tag = "</think>");
  void feed(std::string_view chunk, std::string* reasoning, std::string* content);
  void finish(std::string* reasoning, std::string* content);
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kMaybeOpen, kReasoning, kAfterClose, kContent };
  void step(std::string* reasoning, std::string* content);
  State state_;
  std::string open_, close_, buf_;
};

// True when the prompt leaves the model inside a reasoning block (its last `<think>` is not closed).
bool prompt_opens_reasoning(std::string_view prompt, std::string_view open_tag = "<think>",
                            std::string_view close_tag = "</think>");

// ---- tool calls ----

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // Content text in; content and tool-call deltas out.
  virtual void feed(std::string_view chunk, OutputDelta* out) = 0;
  // End of output: flushes held-back text; an unfinished call degrades to content.
  virtual void finish(OutputDelta* out) = 0;
};

enum class ToolCallFormat {
  kNone,
  kGlm45,  // GLM-4.5/4.6/4.7/5: <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
  kDeepSeekV3,  // V3 / R1 and V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜>...
  kDeepSeekV32,  // V3.2 DSML: <｜DSML｜function_calls><｜DSML｜invoke name=..><｜DSML｜parameter ...>
};

// By name: "glm45" (also "glm47", "glm5"), "deepseek_v3" (also "deepseek_r1", "deepseek_v31"),
// "deepseek_v32", "none". Throws dsaserve::Error for other names.
ToolCallFormat tool_call_format_from_name(std::string_view name);

// `tools`: the request's OpenAI tools list (JSON schemas convert GLM/DSML argument values to JSON types).
std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format, const nlohmann::json& tools,
                                                      ToolCallIdGenerator make_id = random_tool_call_id);

// ---- both ----

struct OutputParserOptions {
  bool reasoning = false;           // split <think>...</think>
  bool start_in_reasoning = false;  // see prompt_opens_reasoning()
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  nlohmann::json tools = nlohmann::json::array();
  ToolCallIdGenerator make_id = random_tool_call_id;
};

// Reasoning first, then tool calls in the content (tool-call syntax inside reasoning stays reasoning).
class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  OutputDelta feed(std::string_view chunk);
  OutputDelta finish();

 private:
  void route(const std::string& reasoning, const std::string& content, OutputDelta* out);
  OutputParserOptions options_;
  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

// Non-streaming: the whole output at once.
ParsedMessage parse_output(std::string_view text, OutputParserOptions options);

}  // namespace dsaserve::chat
