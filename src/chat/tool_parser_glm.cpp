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

  void feed(std::string_view chunk, OutputDelta* out) override {
    buf_.append(chunk);
    while (step(out)) {
    }
  }

  void finish(OutputDelta* out) override {
    while (step(out)) {
    }
    if (state_ == State::kValue && streaming_value_) {
      add_arguments(json_escape(buf_), out);  // the value was cut off: keep what arrived
      buf_.clear();
    }
    if (state_ != State::kText) malformed(out);
    out->content += buf_;
    buf_.clear();
  }

 private:
  enum class State { kText, kName, kBetween, kKey, kAfterKey, kValue };

  // The call in progress cannot be parsed: close what was streamed, return the rest as content.
  void malformed(OutputDelta* out) {
    if (state_ != State::kName) {
      const std::string raw = std::move(raw_);
      add_arguments(streaming_value_ ? "\"}" : args_open_ ? "}" : "{}", out);
      ++next_index_;
      raw_ = raw;
    }
    out->content += raw_;
    raw_.clear();
    streaming_value_ = false;
    state_ = State::kText;
  }

  // One transition; false when more input is needed.
  bool step(OutputDelta* out) {
    size_t ws = 0;
    switch (state_) {
      case State::kText: {
        bool found = false;
        emit_text_until(kCallOpen, out, &found);
        if (!found) return false;
        consume(kCallOpen.size());
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
          add_arguments(args_open_ ? "}" : "{}", out);
          ++next_index_;
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
          add_arguments(std::string(args_open_ ? ", " : "{") + json_string(key_) + ": \"", out);
          args_open_ = true;
          streaming_value_ = true;
        }
        return true;
      }
      case State::kValue: {
        if (streaming_value_) {
          if (!stream_string_value(kValueClose, out)) return false;
          streaming_value_ = false;
          state_ = State::kBetween;
          return true;
        }
        const size_t at = buf_.find(kValueClose);
        if (at == std::string::npos) return false;
        const std::string value = typed_argument(tools_, current_name_, key_, buf_.substr(0, at));
        consume(at + kValueClose.size());
        add_arguments(std::string(args_open_ ? ", " : "{") + json_string(key_) + ": " + value, out);
        args_open_ = true;
        state_ = State::kBetween;
        return true;
      }
    }
    return false;
  }

  State state_ = State::kText;
  std::string key_;
  bool args_open_ = false;
  bool streaming_value_ = false;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_glm_tool_parser(const nlohmann::json& tools,
                                                     ToolCallIdGenerator make_id) {
  return std::make_unique<GlmToolParser>(tools, std::move(make_id));
}

}  // namespace dsaserve::chat::detail
