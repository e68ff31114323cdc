// DeepSeek tool calls.
// V3 / R1:
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//           ...<｜tool▁calls▁end｜>
// V3.1:
// <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   ARGS is free JSON text, so each call is checked whole and streams as one delta (name, then arguments)
//   when its end token arrives; a call whose arguments are not JSON degrades to content.
// V3.2 (DSML): <｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//           <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n...</｜DSML｜invoke>\n
//           </｜DSML｜function_calls>
//   The name streams when its invoke tag is complete, each parameter when its closing tag arrives.
#include "chat/tool_parser_util.h"

namespace dsaserve::chat::detail {
namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";

class DeepSeekV3ToolParser : public StreamBase {
 public:
  using StreamBase::StreamBase;

  bool in_call() const override { return in_calls_; }

 private:
  void malformed(OutputDelta* out) override {
    out->content += raw_;
    raw_.clear();
    in_calls_ = false;
  }

  // Parses one call body (between begin and end tokens); false if it is not a valid call.
  static bool parse_call(const std::string& body, std::string* name, std::string* args) {
    const size_t sep = body.find(kSep);
    if (sep == std::string::npos) return false;
    const std::string head = trim(std::string_view(body).substr(0, sep));
    std::string rest = body.substr(sep + kSep.size());
    const size_t nl = rest.find('\n');
    const size_t fence = rest.find("```");
    if (head == "function" && nl != std::string::npos && fence != std::string::npos && nl < fence) {
      // V3: NAME\n```json\nARGS\n```
      *name = trim(std::string_view(rest).substr(0, nl));
      std::string_view a = std::string_view(rest).substr(fence + 3);
      if (a.substr(0, 4) == "json") a.remove_prefix(4);
      const size_t close = a.rfind("```");
      if (close == std::string_view::npos) return false;
      *args = trim(a.substr(0, close));
    } else {
      *name = head;
      *args = trim(rest);
    }
    if (name->empty() || name->find('<') != std::string::npos) return false;
    if (args->empty()) *args = "{}";
    return nlohmann::json::accept(*args);
  }

  bool step(OutputDelta* out) override {
    size_t ws = 0;
    if (!in_calls_) {
      // A bare call-begin token (without the calls-begin wrapper) is accepted too.
      const size_t a = buf_.find(kCallsBegin);
      const size_t b = buf_.find(kCallBegin);
      const size_t at = std::min(a, b);
      if (at == std::string::npos) {
        const size_t keep =
            std::max(partial_tag_suffix(buf_, kCallsBegin), partial_tag_suffix(buf_, kCallBegin));
        out->content.append(buf_, 0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return false;
      }
      out->content.append(buf_, 0, at);
      buf_.erase(0, at);
      if (at == a) consume(kCallsBegin.size());
      in_calls_ = true;
      return true;
    }
    const Match call = match_after_whitespace(buf_, kCallBegin, &ws);
    if (call == Match::kYes) {
      const size_t end = buf_.find(kCallEnd, ws + kCallBegin.size());
      if (end == std::string::npos) return false;
      const std::string body = buf_.substr(ws + kCallBegin.size(), end - ws - kCallBegin.size());
      std::string name, args;
      if (!parse_call(body, &name, &args)) {
        consume(end + kCallEnd.size());
        malformed(out);
        return true;
      }
      consume(end + kCallEnd.size());
      open_call(name, out);
      add_arguments(args, out);
      ++next_index_;
      return true;
    }
    const Match close = match_after_whitespace(buf_, kCallsEnd, &ws);
    if (close == Match::kYes) {
      consume(ws + kCallsEnd.size());
      raw_.clear();
      in_calls_ = false;
      return true;
    }
    if (call == Match::kPartial || close == Match::kPartial) return false;
    // Anything else after a call ends the tool-call block; without the end token the block is over.
    malformed(out);
    return true;
  }

  bool in_calls_ = false;
};

constexpr std::string_view kDsmlCalls = "<｜DSML｜function_calls>";
constexpr std::string_view kDsmlCallsEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke";
constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParam = "<｜DSML｜parameter";
constexpr std::string_view kDsmlParamEnd = "</｜DSML｜parameter>";

// Value of attribute `name="..."` inside a tag's text.
bool attribute(std::string_view tag, std::string_view name, std::string* value) {
  const std::string pat = std::string(name) + "=\"";
  size_t at = tag.find(pat);
  while (at != std::string_view::npos && at > 0 && tag[at - 1] != ' ' && tag[at - 1] != '\t' &&
         tag[at - 1] != '\n') {
    at = tag.find(pat, at + 1);
  }
  if (at == std::string_view::npos) return false;
  const size_t b = at + pat.size();
  const size_t e = tag.find('"', b);
  if (e == std::string_view::npos) return false;
  *value = std::string(tag.substr(b, e - b));
  return true;
}

class DeepSeekV32ToolParser : public StreamBase {
 public:
  using StreamBase::StreamBase;

  bool in_call() const override { return state_ != State::kText; }
  bool streaming_value() const override { return state_ == State::kValue && key_is_string_; }

 private:
  enum class State { kText, kCalls, kParams, kValue, kJsonBody };

  void malformed(OutputDelta* out) override {
    abandon_call(state_ == State::kParams || state_ == State::kValue || state_ == State::kJsonBody, out);
    state_ = State::kText;
  }

  bool step(OutputDelta* out) override {
    size_t ws = 0;
    switch (state_) {
      case State::kText: {
        if (!text_until(kDsmlCalls, out)) return false;
        state_ = State::kCalls;
        return true;
      }
      case State::kCalls: {
        const Match inv = match_after_whitespace(buf_, kDsmlInvoke, &ws);
        const Match end = match_after_whitespace(buf_, kDsmlCallsEnd, &ws);
        if (inv == Match::kYes) {
          const size_t gt = buf_.find('>', ws);
          if (gt == std::string::npos) return false;
          std::string name;
          if (!attribute(std::string_view(buf_).substr(ws, gt - ws), "name", &name) || name.empty()) {
            malformed(out);
            return true;
          }
          consume(gt + 1);
          open_call(name, out);
          args_open_ = false;
          state_ = State::kParams;
          return true;
        }
        if (end == Match::kYes) {
          consume(ws + kDsmlCallsEnd.size());
          raw_.clear();
          state_ = State::kText;
          return true;
        }
        if (inv == Match::kPartial || end == Match::kPartial) return false;
        malformed(out);
        return true;
      }
      case State::kParams: {
        const Match param = match_after_whitespace(buf_, kDsmlParam, &ws);
        const Match end = match_after_whitespace(buf_, kDsmlInvokeEnd, &ws);
        if (param == Match::kYes) {
          const size_t gt = buf_.find('>', ws);
          if (gt == std::string::npos) return false;
          const std::string_view tag = std::string_view(buf_).substr(ws, gt - ws);
          std::string is_string = "true";
          if (!attribute(tag, "name", &key_) || key_.empty()) {
            malformed(out);
            return true;
          }
          attribute(tag, "string", &is_string);
          key_is_string_ = is_string != "false";
          consume(gt + 1);
          state_ = State::kValue;
          if (key_is_string_) add_argument(key_, "\"", out);
          return true;
        }
        if (end == Match::kYes) {
          consume(ws + kDsmlInvokeEnd.size());
          close_call(out);
          state_ = State::kCalls;
          return true;
        }
        if (param == Match::kPartial || end == Match::kPartial) return false;
        if (!args_open_ && ws < buf_.size() && buf_[ws] == '{') {
          state_ = State::kJsonBody;
          return true;
        }
        malformed(out);
        return true;
      }
      case State::kValue: {
        if (!read_value(kDsmlParamEnd, key_, key_is_string_, out)) return false;
        state_ = State::kParams;
        return true;
      }
      case State::kJsonBody: {
        const size_t at = buf_.find(kDsmlInvokeEnd);
        if (at == std::string::npos) return false;
        const std::string body = trim(std::string_view(buf_).substr(0, at));
        if (!nlohmann::json::accept(body) || body.empty() || body[0] != '{') {
          malformed(out);
          return true;
        }
        consume(at + kDsmlInvokeEnd.size());
        add_arguments(body, out);
        ++next_index_;
        state_ = State::kCalls;
        return true;
      }
    }
    return false;
  }

  State state_ = State::kText;
  std::string key_;
  bool key_is_string_ = true;
};

}  // namespace

std::unique_ptr<ToolCallParser> make_deepseek_v3_tool_parser(const nlohmann::json& tools,
                                                             ToolCallIdGenerator make_id) {
  return std::make_unique<DeepSeekV3ToolParser>(tools, std::move(make_id));
}

std::unique_ptr<ToolCallParser> make_deepseek_v32_tool_parser(const nlohmann::json& tools,
                                                              ToolCallIdGenerator make_id) {
  return std::make_unique<DeepSeekV32ToolParser>(tools, std::move(make_id));
}

}  // namespace dsaserve::chat::detail
