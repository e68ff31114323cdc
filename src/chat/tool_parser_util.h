#pragma once
// Shared pieces of the streaming tool-call parsers (internal to the chat module).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chat/output_parser.h"
#include "chat/text_util.h"  // json_escape

namespace dsaserve::chat::detail {

// Length of the longest proper prefix of `tag` that `text` ends with (text that must be held back
// because the next chunk may complete the tag).
size_t partial_tag_suffix(std::string_view text, std::string_view tag);

enum class Match { kYes, kPartial, kNo };
// Does `text`, after `*ws` leading whitespace bytes, start with `tag`? kPartial: it could, once more
// text arrives.
Match match_after_whitespace(std::string_view text, std::string_view tag, size_t* ws);

std::string trim(std::string_view s);
std::string json_string(std::string_view s);
// Is the schema type of tool `tool`'s parameter `key` a string?
bool is_string_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key);

// JSON text of argument `key` of tool `tool` from its raw text, typed by the tool's JSON schema:
// string-typed -> JSON string of the raw text; otherwise the JSON the text parses as (Python literals
// True/False/None accepted), else a JSON string.
std::string typed_argument(const nlohmann::json& tools, const std::string& tool, const std::string& key,
                           const std::string& raw);

// State shared by the parsers: unconsumed input and the consumed-but-uncommitted text of the call in
// progress (returned as content if the call turns out malformed). A parser is a state machine: it
// implements step(), malformed() and in_call(), and feed()/finish() drive it.
class StreamBase : public ToolCallParser {
 public:
  StreamBase(nlohmann::json tools, ToolCallIdGenerator make_id)
      : tools_(std::move(tools)), make_id_(std::move(make_id)) {}

  // Appends `chunk` and runs step() until it needs more input.
  void feed(std::string_view chunk, OutputDelta* out) final;
  // Runs the remaining steps; a string value cut off by the end keeps what arrived, a call still in
  // progress goes through malformed(), and the unparsed rest is content.
  void finish(OutputDelta* out) final;

 protected:
  // One transition; false when more input is needed.
  virtual bool step(OutputDelta* out) = 0;
  // The call in progress cannot be parsed: close what was streamed, return the rest as content.
  virtual void malformed(OutputDelta* out) = 0;
  // Is a tool-call block in progress (at the end of the output that makes it malformed)?
  virtual bool in_call() const = 0;
  // Is a string-typed argument value being streamed (its opening quote already emitted)?
  virtual bool streaming_value() const { return false; }

  void consume(size_t n) {
    raw_.append(buf_, 0, n);
    buf_.erase(0, n);
  }
  // Starts call `next_index_` with `name`: the first delta (id and name).
  void open_call(const std::string& name, OutputDelta* out);
  void add_arguments(const std::string& fragment, OutputDelta* out);
  // Emits the text before `tag` in buf_ as content (keeping a possible partial tag) and consumes the
  // tag; false if it has not arrived yet.
  bool text_until(std::string_view tag, OutputDelta* out);
  // Streams a string-typed argument value: the JSON-escaped text before `close_tag` (holding back a
  // possible partial tag and incomplete UTF-8) as argument fragments. True once the tag was consumed
  // (the closing quote emitted).
  bool stream_string_value(std::string_view close_tag, OutputDelta* out);
  // Reads the value of argument `key` up to `close_tag`: streamed as stream_string_value() does when
  // `streaming`, else added whole once the tag arrives, typed by the tool's schema. True when done.
  bool read_value(std::string_view close_tag, const std::string& key, bool streaming, OutputDelta* out);
  // Appends argument `key` with JSON text `value` (or the start of one) to the call in progress,
  // opening its arguments object first.
  void add_argument(const std::string& key, std::string_view value, OutputDelta* out);
  // Closes the arguments object of the call in progress (`{}` if it had none) and ends the call.
  void close_call(OutputDelta* out);
  // For malformed(): ends the call in progress as close_call() does (closing a streamed string value
  // first) but keeps its uncommitted text, then returns that text as content.
  void abandon_call(bool call_started, OutputDelta* out);

  nlohmann::json tools_;
  ToolCallIdGenerator make_id_;
  std::string buf_;
  std::string raw_;
  std::string current_name_;
  int next_index_ = 0;
  bool args_open_ = false;  // the arguments object of the call in progress has been opened
};

}  // namespace dsaserve::chat::detail
