#include "chat/output_parser.h"

#include "chat/tool_parser_util.h"
#include "core/error.h"

namespace dsaserve::chat {

namespace detail {
std::unique_ptr<ToolCallParser> make_glm_tool_parser(const nlohmann::json& tools,
                                                     ToolCallIdGenerator make_id);
std::unique_ptr<ToolCallParser> make_deepseek_v3_tool_parser(const nlohmann::json& tools,
                                                             ToolCallIdGenerator make_id);
std::unique_ptr<ToolCallParser> make_deepseek_v32_tool_parser(const nlohmann::json& tools,
                                                              ToolCallIdGenerator make_id);
}  // namespace detail

namespace {
bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
}  // namespace

// ---- reasoning ----

ReasoningParser::ReasoningParser(bool start_in_reasoning, std::string open_tag, std::string close_tag)
    : state_(start_in_reasoning ? State::kReasoning : State::kMaybeOpen),
      open_(std::move(open_tag)),
      close_(std::move(close_tag)) {}

void ReasoningParser::step(std::string* reasoning, std::string* content) {
  while (true) {
    switch (state_) {
      case State::kMaybeOpen: {
        size_t ws = 0;
        const auto m = detail::match_after_whitespace(buf_, open_, &ws);
        if (m == detail::Match::kPartial) return;
        if (m == detail::Match::kYes) {
          buf_.erase(0, ws + open_.size());
          state_ = State::kReasoning;
        } else {
          state_ = State::kContent;
        }
        break;
      }
      case State::kReasoning: {
        const size_t at = buf_.find(close_);
        if (at == std::string::npos) {
          const size_t keep = detail::partial_tag_suffix(buf_, close_);
          reasoning->append(buf_, 0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        reasoning->append(buf_, 0, at);
        buf_.erase(0, at + close_.size());
        state_ = State::kAfterClose;
        break;
      }
      case State::kAfterClose: {
        size_t i = 0;
        while (i < buf_.size() && is_ws(buf_[i])) ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        state_ = State::kContent;
        break;
      }
      case State::kContent:
        content->append(buf_);
        buf_.clear();
        return;
    }
  }
}

void ReasoningParser::feed(std::string_view chunk, std::string* reasoning, std::string* content) {
  buf_.append(chunk);
  step(reasoning, content);
}

void ReasoningParser::finish(std::string* reasoning, std::string* content) {
  step(reasoning, content);
  if (state_ == State::kReasoning) {
    reasoning->append(buf_);
  } else if (state_ != State::kAfterClose) {
    content->append(buf_);
  }
  buf_.clear();
}

bool prompt_opens_reasoning(std::string_view prompt, std::string_view open_tag, std::string_view close_tag) {
  const size_t open = prompt.rfind(open_tag);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(close_tag);
  return close == std::string_view::npos || close < open;
}

// ---- tool calls ----

ToolCallFormat tool_call_format_from_name(std::string_view name) {
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "glm45" || name == "glm47" || name == "glm5") return ToolCallFormat::kGlm45;
  if (name == "deepseek_v3" || name == "deepseek_r1" || name == "deepseek_v31")
    return ToolCallFormat::kDeepSeekV3;
  if (name == "deepseek_v32") return ToolCallFormat::kDeepSeekV32;
  fail(
      "unknown tool-call format '{}' (glm45, glm47, glm5, deepseek_v3, deepseek_r1, deepseek_v31, "
      "deepseek_v32, none)",
      name);
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format, const nlohmann::json& tools,
                                                      ToolCallIdGenerator make_id) {
  switch (format) {
    case ToolCallFormat::kNone: return nullptr;
    case ToolCallFormat::kGlm45: return detail::make_glm_tool_parser(tools, std::move(make_id));
    case ToolCallFormat::kDeepSeekV3: return detail::make_deepseek_v3_tool_parser(tools, std::move(make_id));
    case ToolCallFormat::kDeepSeekV32:
      return detail::make_deepseek_v32_tool_parser(tools, std::move(make_id));
  }
  return nullptr;
}

// ---- both ----

OutputParser::OutputParser(OutputParserOptions options) : options_(std::move(options)) {
  if (options_.reasoning) reasoning_ = std::make_unique<ReasoningParser>(options_.start_in_reasoning);
  tools_ = make_tool_call_parser(options_.tool_format, options_.tools, options_.make_id);
}

void OutputParser::route(const std::string& reasoning, const std::string& content, OutputDelta* out) {
  out->reasoning_content += reasoning;
  if (tools_) {
    if (!content.empty()) tools_->feed(content, out);
  } else {
    out->content += content;
  }
}

OutputDelta OutputParser::feed(std::string_view chunk) {
  OutputDelta out;
  if (reasoning_) {
    std::string reasoning, content;
    reasoning_->feed(chunk, &reasoning, &content);
    route(reasoning, content, &out);
  } else {
    route("", std::string(chunk), &out);
  }
  return out;
}

OutputDelta OutputParser::finish() {
  OutputDelta out;
  if (reasoning_) {
    std::string reasoning, content;
    reasoning_->finish(&reasoning, &content);
    route(reasoning, content, &out);
  }
  if (tools_) tools_->finish(&out);
  return out;
}

ParsedMessage parse_output(std::string_view text, OutputParserOptions options) {
  OutputParser p(std::move(options));
  ParsedMessage m;
  m.apply(p.feed(text));
  m.apply(p.finish());
  return m;
}

}  // namespace dsaserve::chat
