// GLM-4.5 / 4.6 / 4.7 / 5 tool calls:
//   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
// The name streams as soon as it ends (newline or a tag), each argument when its </arg_value> arrives.
#include "chat/tool_parser_util.h"

namespace dsaserve::chat::detail {
namespace {

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

class GlmToolParser : public StreamBase {
 public:
  using StreamBase::StreamBase;

  bool in_call() const override { return state_ != State::kText; }
  bool streaming_value() const override { return streaming_value_; }

 private:
  enum class State { kText, kName, kBetween, kKey, kAfterKey, kValue };

  void malformed(OutputDelta* out) override {
    abandon_call(state_ != State::kName, out);
    streaming_value_ = false;
    state_ = State::kText;
  }

  bool step(OutputDelta* out) override {
    size_t ws = 0;
    switch (state_) {
      case State::kText: {
        if (!text_until(kCallOpen, out)) return false;
        state_ = State::kName;
        return true;
      }
      case State::kName: {
        size_t end = buf_.find('\n');
        for (std::string_view tag : {kKeyOpen, kCallClose}) end = std::min(end, buf_.find(tag));
        if (end == std::string::npos) return false;
        const std::string name = trim(std::string_view(buf_).substr(0, end));
        if (name.empty() || name.find('<') != std::string::npos) {
          malformed(out);
          return true;
        }
        consume(end);
        open_call(name, out);
        args_open_ = false;
        state_ = State::kBetween;
        return true;
      }
      case State::kBetween: {
        const Match key = match_after_whitespace(buf_, kKeyOpen, &ws);
        const Match close = match_after_whitespace(buf_, kCallClose, &ws);
        if (key == Match::kYes) {
          consume(ws + kKeyOpen.size());
          state_ = State::kKey;
          return true;
        }
        if (close == Match::kYes) {
          consume(ws + kCallClose.size());
          close_call(out);
          state_ = State::kText;
          return true;
        }
        if (key == Match::kPartial || close == Match::kPartial) return false;
        malformed(out);
        return true;
      }
      case State::kKey: {
        const size_t at = buf_.find(kKeyClose);
        if (at == std::string::npos) return false;
        key_ = trim(std::string_view(buf_).substr(0, at));
        if (key_.find('<') != std::string::npos) {
          malformed(out);
          return true;
        }
        consume(at + kKeyClose.size());
        state_ = State::kAfterKey;
        return true;
      }
      case State::kAfterKey: {
        const Match m = match_after_whitespace(buf_, kValueOpen, &ws);
        if (m == Match::kPartial) return false;
        if (m == Match::kNo) {
          malformed(out);
          return true;
        }
        consume(ws + kValueOpen.size());
        state_ = State::kValue;
        if (is_string_argument(tools_, current_name_, key_)) {
          // String values stream as they arrive.
          add_argument(key_, "\"", out);
          streaming_value_ = true;
        }
        return true;
      }
      case State::kValue: {
        if (!read_value(kValueClose, key_, streaming_value_, out)) return false;
        streaming_value_ = false;
        state_ = State::kBetween;
        return true;
      }
    }
    return false;
  }

  State state_ = State::kText;
  std::string key_;
  bool streaming_value_ = false;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_glm_tool_parser(const nlohmann::json& tools,
                                                     ToolCallIdGenerator make_id) {
  return std::make_unique<GlmToolParser>(tools, std::move(make_id));
}

}  // namespace dsaserve::chat::detail
